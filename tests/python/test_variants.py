"""The attention variants (issue 37) from Python against PyTorch 2.13: the forward against
torch.nn.attention.flex_attention built with the same score_mod / mask_mod (eager, CPU), the backward (which
FlexAttention lacks on the CPU) against a plain float64 PyTorch formula under autograd, T5's bias against
transformers' own T5Attention.compute_bias, varlen against one F.scaled_dot_product_attention per sequence,
and explain / torch.compile. Not the kernels' bits or tolerance rule (tests/test_variants.cpp).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn
import attn.torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

torch.manual_seed(0)
# eager flex_attention materializes its scores on the CPU (it says so once): fine for a reference
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def alibi_slopes(H):
    """BLOOM's geometric slopes, 2^(-8(h + 1)/H)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])


def t5_bucket(d, bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention
    return T5Attention._relative_position_bucket(d, bidirectional, num_buckets, max_distance)


def formula(q, k, v, *, causal=None, window=None, slopes=None, softcap=0.0, table=None, bidirectional=True,
            max_distance=128, docs=None, scale=None):
    """Dense PyTorch: scores, softcap, ALiBi and T5 biases, then -inf where the query does not see the key
    (FlashAttention 2's definitions, bottom-right aligned), softmax, @ V. GQA by repeating K/V."""
    B, H, L, D = q.shape
    S = k.shape[-2]
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else D ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    ql, ks = torch.arange(L)[:, None], torch.arange(S)[None, :]
    dist = ks - ql - (S - L)
    if slopes is not None:
        s = s - slopes.to(s.dtype)[..., None, None] * dist.abs()
    if table is not None:
        s = s + table[t5_bucket(dist, bidirectional, table.shape[0], max_distance)].permute(2, 0, 1).to(s.dtype)
    keep = torch.ones(L, S, dtype=torch.bool)
    if causal == "top_left":
        keep &= ks <= ql
    if causal == "bottom_right":
        keep &= ks <= ql + S - L
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= ks >= ql + S - L - left
        if right >= 0:
            keep &= ks <= ql + S - L + right
    keep = keep.expand(B, 1, L, S)
    if docs is not None:
        keep = keep & (docs[:, None, :, None] == docs[:, None, None, :])
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # a fully masked row gives zeros (attn's rule)
    return p @ v


def inputs(B=2, H=4, Hkv=2, L=70, S=70, D=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(B, H, L, D, generator=g, dtype=dtype), torch.randn(B, Hkv, S, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, S, D, generator=g, dtype=dtype))


CASES = {
    "window": dict(causal="bottom_right", window=(16, 0)),
    "window both sides": dict(window=(9, 5)),
    "alibi": dict(causal="bottom_right", slopes=alibi_slopes(4)),
    "softcap": dict(softcap=1.5),
    "t5 bidirectional": dict(table=torch.randn(32, 4), bidirectional=True, max_distance=40),
    "t5 causal": dict(causal="bottom_right", table=torch.randn(16, 4), bidirectional=False, max_distance=40),
    "documents": dict(docs=torch.tensor([[0] * 20 + [1] * 30 + [2] * 20, [0] * 5 + [1] * 65])),
    "documents causal": dict(causal="top_left", docs=torch.tensor([[0] * 20 + [1] * 30 + [2] * 20] * 2)),
    "everything": dict(causal="bottom_right", window=(24, 0), slopes=alibi_slopes(4), softcap=2.0,
                       table=torch.randn(16, 4), bidirectional=False, max_distance=30,
                       docs=torch.tensor([[0] * 35 + [1] * 35] * 2)),
}


def attn_kwargs(c):
    return dict(is_causal=c.get("causal") is not None, causal_alignment=c.get("causal") or "top_left",
                window=c.get("window"), alibi_slopes=c.get("slopes"), softcap=c.get("softcap", 0.0),
                relative_bias=c.get("table"), relative_bias_bidirectional=c.get("bidirectional", True),
                relative_bias_max_distance=c.get("max_distance", 128), document_ids=c.get("docs"))


def flex_mods(c, L, S):
    """The case as flex_attention's score_mod and mask_mod."""
    def score_mod(score, b, h, qi, kv):
        if c.get("softcap"):
            score = c["softcap"] * torch.tanh(score / c["softcap"])
        d = kv - qi - (S - L)
        if c.get("slopes") is not None:
            score = score - c["slopes"][h] * d.abs()
        if c.get("table") is not None:
            score = score + c["table"][t5_bucket(d, c["bidirectional"], c["table"].shape[0], c["max_distance"]), h]
        return score

    def mask_mod(b, h, qi, kv):
        keep = qi >= 0
        if c.get("causal") == "top_left":
            keep = keep & (kv <= qi)
        if c.get("causal") == "bottom_right":
            keep = keep & (kv <= qi + S - L)
        if c.get("window") is not None:
            left, right = c["window"]
            if left >= 0:
                keep = keep & (kv >= qi + S - L - left)
            if right >= 0:
                keep = keep & (kv <= qi + S - L + right)
        if c.get("docs") is not None:
            keep = keep & (c["docs"][b, qi] == c["docs"][b, kv])
        return keep
    return score_mod, mask_mod


@pytest.mark.parametrize("name", CASES)
def test_forward_equals_flex_attention(name):
    c = CASES[name]
    q, k, v = inputs()
    L, S = q.shape[-2], k.shape[-2]
    score_mod, mask_mod = flex_mods(c, L, S)
    block_mask = create_block_mask(mask_mod, q.shape[0], None, L, S, device="cpu")
    want = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True)
    got = attn.scaled_dot_product_attention(q, k, v, enable_gqa=True, **attn_kwargs(c))
    # fp32 both; the same formula in float64 decides which is nearer (each within a few fp32 ulps of it)
    truth = formula(*(x.double() for x in (q, k, v)), **{**c, **({"slopes": c["slopes"].double()}
                                                                if c.get("slopes") is not None else {})})
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    err, err_flex = (got.double() - truth).abs().max(), (want.double() - truth).abs().max()
    assert err <= 2 * err_flex + 2e-6, (err, err_flex)


@pytest.mark.parametrize("name", CASES)
def test_backward_equals_the_formula_under_autograd(name):
    c = CASES[name]
    q, k, v = (x.requires_grad_() for x in inputs(L=50, S=70))
    if c.get("docs") is not None:
        q, k, v = (x.requires_grad_() for x in inputs(L=70, S=70))
    table = c["table"].clone().requires_grad_() if c.get("table") is not None else None
    kw = attn_kwargs(c)
    kw["relative_bias"] = table
    out = attn.torch.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, [q, k, v] + ([table] if table is not None else []), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    t64 = table.detach().double().requires_grad_() if table is not None else None
    ref = formula(q64, k64, v64, **{**c, "table": t64,
                                    **({"slopes": c["slopes"].double()} if c.get("slopes") is not None else {})})
    want = torch.autograd.grad(ref, [q64, k64, v64] + ([t64] if t64 is not None else []), dout.double())
    for g, w, n in zip(grads, want, ("dq", "dk", "dv", "drelative_bias")):
        torch.testing.assert_close(g.double(), w, atol=2e-5 * (1 + w.abs().max().item()), rtol=1e-4, msg=n)


def test_relative_bias_is_transformers_t5_compute_bias():
    # zero queries: the weights are softmax of the bias alone, as T5Attention.compute_bias gives it
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention
    for is_decoder in (False, True):
        cfg = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=32,
                       relative_attention_max_distance=128, is_decoder=is_decoder)
        t5 = T5Attention(cfg, has_relative_attention_bias=True)
        L = S = 300
        bias = t5.compute_bias(L, S).detach()[0]  # (H, L, S)
        table = t5.relative_attention_bias.weight.detach()  # (num_buckets, H)
        q = torch.zeros(1, 4, L, 8)
        _, w = attn.scaled_dot_product_attention(q, q, q, relative_bias=table,
                                                 relative_bias_bidirectional=not is_decoder,
                                                 relative_bias_max_distance=128, return_weights=True)
        torch.testing.assert_close(w[0], torch.softmax(bias, -1), atol=1e-6, rtol=1e-5)


def test_varlen_equals_one_sdpa_per_sequence():
    H, Hkv, D = 4, 2, 16
    lq, lk = [5, 0, 40, 17], [9, 3, 40, 30]
    cq, ck = np.cumsum([0] + lq), np.cumsum([0] + lk)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(cq[-1], H, D, generator=g)
    k, v = torch.randn(ck[-1], Hkv, D, generator=g), torch.randn(ck[-1], Hkv, D, generator=g)
    for causal in (False, True):
        out = attn.varlen_attention(q.numpy(), k.numpy(), v.numpy(), cq, ck, causal=causal)
        assert out.shape == (cq[-1], H, D)
        for i in range(len(lq)):
            if lq[i] == 0:
                continue
            qi, ki, vi = (x[a:b].transpose(0, 1)[None] for x, a, b in ((q, cq[i], cq[i + 1]), (k, ck[i], ck[i + 1]),
                                                                        (v, ck[i], ck[i + 1])))
            mask = torch.ones(lq[i], lk[i], dtype=torch.bool).tril(lk[i] - lq[i]) if causal else None  # bottom-right
            want = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
            np.testing.assert_allclose(out[cq[i]:cq[i + 1]], want.numpy(), atol=2e-6, rtol=1e-5)
    # the torch entry point: the same numbers, and gradients through the packed layout
    qt, kt, vt = (x.clone().requires_grad_() for x in (q, k, v))
    o = attn.torch.varlen_attention(qt, kt, vt, torch.tensor(cq), torch.tensor(ck), causal=True)
    np.testing.assert_array_equal(o.detach().numpy(), attn.varlen_attention(q.numpy(), k.numpy(), v.numpy(), cq, ck,
                                                                           causal=True))
    o.square().sum().backward()
    dq = torch.zeros_like(q)
    for i in range(len(lq)):  # per sequence through torch's SDPA
        if lq[i] == 0:
            continue
        qi = q[cq[i]:cq[i + 1]].clone().requires_grad_()
        ki, vi = k[ck[i]:ck[i + 1]], v[ck[i]:ck[i + 1]]
        mask = torch.ones(lq[i], lk[i], dtype=torch.bool).tril(lk[i] - lq[i])
        oi = F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None],
                                            vi.transpose(0, 1)[None], attn_mask=mask, enable_gqa=True)
        oi.square().sum().backward()
        dq[cq[i]:cq[i + 1]] = qi.grad
    torch.testing.assert_close(qt.grad, dq, atol=1e-5, rtol=1e-4)


def test_explain_names_the_variants_and_the_tiles_never_computed():
    q = np.zeros((1, 2, 4096, 64), np.float32)
    backend, reason = attn.scaled_dot_product_attention(q, q, q, is_causal=True, window=(255, 0), explain=True)
    assert backend == "flash"
    assert "window (255, 0)" in reason and "never computed" in reason, reason
    full = attn.scaled_dot_product_attention(q, q, q, is_causal=True, explain=True)[1]
    assert "never computed" not in full  # the plain problem names no variant
    ids = np.repeat(np.arange(8), 512)[None]
    reason = attn.scaled_dot_product_attention(q, q, q, document_ids=ids, explain=True)[1]
    assert "8 documents" in reason, reason


def test_bad_variants_are_refused_by_name():
    q = np.zeros((2, 4, 6, 8), np.float32)
    with pytest.raises(attn.AttnError, match=r"alibi_slopes of shape \(H\) = \(4,\)"):
        attn.scaled_dot_product_attention(q, q, q, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(attn.AttnError, match="document_ids of an integer dtype"):
        attn.scaled_dot_product_attention(q, q, q, document_ids=np.zeros((2, 6), np.float32))
    with pytest.raises(attn.AttnError, match="one run of positions"):
        attn.scaled_dot_product_attention(q, q, q, document_ids=np.array([[0, 0, 1, 1, 0, 0]] * 2))


def test_compiles_with_variants_fullgraph():
    q, k, v = inputs(L=40, S=40)
    table = torch.randn(16, 4, requires_grad=True)
    f = lambda q, k, v, t: attn.torch.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, enable_gqa=True, window=(8, 0), softcap=3.0, relative_bias=t,
        relative_bias_bidirectional=False)
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, table), f(q, k, v, table))
    compiled(q, k, v, table).sum().backward()
    assert table.grad is not None and table.grad.abs().sum() > 0


def test_layers_pass_the_variants_to_their_attention():
    # MultiheadAttention and TransformerEncoderLayer: a window or ALiBi in the kernel equals the same visibility or
    # bias given as a mask (PyTorch's bool True = masked out, float = added), forward and MHA's backward.
    rng = np.random.default_rng(5)
    N, L, E, H = 2, 40, 32, 4
    x = rng.standard_normal((N, L, E), dtype=np.float32)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    hidden = ~((j <= i) & (j >= i - 8))
    slopes = alibi_slopes(H).numpy().astype(np.float32)
    bias = np.where(j <= i, -slopes[:, None, None] * np.abs(i - j), -np.inf).astype(np.float32)  # (H, L, L)
    mha = attn.MultiheadAttention(E, H, batch_first=True, seed=1)
    mha.train()
    got, _ = mha(x, x, x, is_causal=True, window=(8, 0), need_weights=False)
    dgot = mha.backward(np.ones_like(got))
    want, _ = mha(x, x, x, attn_mask=hidden, need_weights=False)
    dwant = mha.backward(np.ones_like(want))
    np.testing.assert_allclose(got, want, atol=2e-6)
    for a, b in zip(dgot, dwant):
        np.testing.assert_allclose(a, b, atol=2e-5)
    got, w = mha(x, x, x, is_causal=True, alibi_slopes=slopes, average_attn_weights=False)
    want, w2 = mha(x, x, x, attn_mask=np.tile(bias, (N, 1, 1)), average_attn_weights=False)
    np.testing.assert_allclose(got, want, atol=2e-6)
    np.testing.assert_allclose(w, w2, atol=1e-6)  # weights too (the reference or flash's LSE, with the bias)
    enc = attn.TransformerEncoderLayer(E, H, dim_feedforward=64, batch_first=True, norm_first=True)
    enc.eval()
    np.testing.assert_allclose(enc(x, is_causal=True, window=(8, 0)), enc(x, src_mask=hidden), atol=2e-5)
    with pytest.raises(attn.AttnError, match="relative_bias"):
        mha._native.forward(x, x, x, None, False, None, True, False, False,
                            {"relative_bias": np.ones((4, H), np.float32)})
