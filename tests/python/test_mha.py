"""attn.MultiheadAttention against torch.nn.MultiheadAttention (eval mode, weights copied from torch) over
layouts, kdim/vdim, bias, add_bias_kv, add_zero_attn, every mask kind, causal, need_weights and
average_attn_weights; rows PyTorch fills with NaN checked against our zero policy; state_dict names and
shapes; GQA against torch with repeated K/V rows; dropout; the trace; safetensors files; errors."""
import warnings

import numpy as np
import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attn

# Both sides compute in float32 on unit-scale inputs (E <= 24, S <= 9): errors are ~1e-7; 1e-5 (the
# brief's bound) is far below what any semantic slip (a mask, a head, a bias slice) would cause.
TOL = 1e-5
E, H = 16, 4

MASKS = [None, "bool", "float"]
ATTN_MASKS = [None, "bool2", "float2", "bool3", "float3"]


def make_pair(seed, bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
              dropout=0.0):
    """A torch module with random biases (PyTorch zeroes them; nonzero ones test the slices) and ours
    loaded from its state_dict exactly as the brief spells it."""
    torch.manual_seed(seed)
    t = torch.nn.MultiheadAttention(E, H, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
                                    add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim, batch_first=batch_first)
    with torch.no_grad():
        for name, p in t.named_parameters():
            if name in ("in_proj_bias", "out_proj.bias"):
                p.normal_(0, 0.5)
    t.eval()
    ours = attn.MultiheadAttention(E, H, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
                                   add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim, batch_first=batch_first, seed=0)
    ours.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    return t, ours.eval()


def random_mask(rng, kind, shape):
    if kind == "bool":
        return rng.random(shape) < 0.25  # True = masked out
    x = rng.standard_normal(shape).astype(np.float32)
    x[rng.random(shape) < 0.1] = -np.inf
    return x


def causal_like(kind, L, S):
    """The (L, S) top-left causal mask in PyTorch's MHA convention, bool or float."""
    upper = np.triu(np.ones((L, S), dtype=bool), 1)
    return upper if kind == "bool" else np.where(upper, -np.inf, 0).astype(np.float32)


def merge(user, causal):
    """user attn_mask combined with the causal one, as one PyTorch attn_mask."""
    if user.dtype == np.bool_:
        return user | causal if causal.dtype == np.bool_ else np.where(user, -np.inf, 0).astype(np.float32) + causal
    return user + (np.where(causal, -np.inf, 0).astype(np.float32) if causal.dtype == np.bool_ else causal)


def run_case(seed, layout="cross", batch_first=False, kvdims=False, bias=True, add_bias_kv=False,
             add_zero_attn=False, kpm=None, am=None, causal=False, need_weights=True, average=True,
             N=2, L=4, S=5):
    rng = np.random.default_rng(seed)
    kdim, vdim = (6, 10) if kvdims else (None, None)
    t, ours = make_pair(seed, bias, add_bias_kv, add_zero_attn, kdim, vdim, batch_first)
    unbatched = layout == "unbatched"
    if layout == "self":
        S = L
    batch = () if unbatched else (N,)

    def x(T, C):  # PyTorch's layout
        a = rng.standard_normal((T,) + batch + (C,)).astype(np.float32)
        return a.swapaxes(0, 1).copy() if batch_first and not unbatched else a

    q = x(L, E)
    k = q if layout == "self" else x(S, kdim or E)
    v = q if layout == "self" else x(S, vdim or E)
    n = 1 if unbatched else N
    kpm_a = None if kpm is None else random_mask(rng, kpm, (S,) if unbatched else (N, S))
    am_a = None
    if am is not None:
        shape = (L, S) if am.endswith("2") else ((H,) if unbatched else (n * H,)) + (L, S)
        am_a = random_mask(rng, am[:-1], shape)

    # What torch gets: causal merged into attn_mask. is_causal=True only where the mask is exactly causal
    # and torch's own causal path agrees with it: without extra columns when need_weights=False and no
    # key_padding_mask, torch drops attn_mask and runs SDPA's causal, which would hide bias_k / zero-attn.
    t_mask, t_causal = am_a, False
    if causal:
        c = causal_like(kpm or "bool", L, S)
        t_mask = c if am_a is None else merge(am_a, c)
        t_causal = am_a is None and not ((add_bias_kv or add_zero_attn) and not need_weights and kpm is None)

    T = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    tq, tk, tv = T(q), T(k), T(v)
    if layout == "self":
        tk = tv = tq  # the same tensor: torch may take its fast path, which we match too

    def torch_run(need_w, avg, kv_copy=False):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mixed bool/float masks: PyTorch's deprecation warning
            k_, v_ = (tk.clone(), tv.clone()) if kv_copy else (tk, tv)
            o, w = t(tq, k_, v_, key_padding_mask=T(kpm_a), need_weights=need_w, attn_mask=T(t_mask),
                     average_attn_weights=avg, is_causal=t_causal)
        return o.numpy(), None if w is None else w.numpy()

    out, w = ours(q, k, v, key_padding_mask=kpm_a, need_weights=need_weights, attn_mask=am_a,
                  average_attn_weights=average, is_causal=causal)
    want_out, want_w = torch_run(need_weights, average)

    # Zero policy. PyTorch's slow need_weights=False path (q is not k) already gives a fully masked row
    # zero context in each head, so where PyTorch put NaN its output there is what ours must be.
    assert out.shape == want_out.shape
    nan_rows = np.isnan(want_out).any(axis=-1)
    if nan_rows.any():
        zero_policy, _ = torch_run(False, True, kv_copy=True)
        assert np.isfinite(zero_policy).all()
        want_out = np.where(nan_rows[..., None], zero_policy, want_out)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=TOL)
    if not need_weights:
        assert w is None
        return nan_rows.any()
    per_head = torch_run(True, False)[1]  # (N, H, L, S'): NaN rows are the fully masked ones
    masked = np.isnan(per_head).all(axis=-1)
    per_head = np.nan_to_num(per_head, nan=0.0)
    assert w.shape == want_w.shape
    want_w = np.where(np.isnan(want_w), per_head.mean(axis=-3), want_w) if average else per_head
    np.testing.assert_allclose(w, want_w, rtol=0, atol=TOL)
    if not average:
        assert (w[masked] == 0).all()  # exactly zero, not just small
    return nan_rows.any()


@pytest.mark.parametrize("layout", ["self", "cross", "unbatched"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kvdims", [False, True])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_layouts(layout, batch_first, kvdims, need_weights, average):
    if layout == "self" and kvdims:
        pytest.skip("self-attention needs kdim == vdim == E")
    run_case(1, layout=layout, batch_first=batch_first, kvdims=kvdims, need_weights=need_weights, average=average)


@pytest.mark.parametrize("kpm", MASKS)
@pytest.mark.parametrize("am", ATTN_MASKS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
def test_masks(kpm, am, causal, need_weights):
    for seed in range(3):
        run_case(seed, kpm=kpm, am=am, causal=causal, need_weights=need_weights, average=False)


@pytest.mark.parametrize("add_bias_kv,add_zero_attn", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
def test_extra_columns(add_bias_kv, add_zero_attn, bias, causal, need_weights):
    run_case(2, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn, bias=bias, causal=causal,
             kpm="bool", am="float3", need_weights=need_weights, average=False)


def test_fully_masked_rows_are_zeros_where_torch_gives_nan():
    """PyTorch: NaN output and weights. Ours: weights 0 and zero context, so the output is out_proj.bias."""
    t, ours = make_pair(3, batch_first=True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, E)).astype(np.float32)
    kpm = np.zeros((2, 4), dtype=bool)
    kpm[1] = True  # every key of batch 1
    with torch.no_grad():
        o_t, w_t = t(*[torch.from_numpy(x)] * 3, key_padding_mask=torch.from_numpy(kpm))
    assert np.isnan(o_t[1].numpy()).all() and np.isnan(w_t[1].numpy()).all()
    out, w = ours(x, x, x, key_padding_mask=kpm)
    np.testing.assert_array_equal(w[1], 0)
    np.testing.assert_allclose(out[1], np.broadcast_to(ours.state_dict()["out_proj.bias"], (4, E)), atol=TOL)
    np.testing.assert_allclose(out[0], o_t[0].numpy(), atol=TOL)
    # the sweep meets such rows too: count that it did
    assert any(run_case(s, kpm="bool", am="bool3", L=6, S=3) for s in range(10))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(layout=st.sampled_from(["self", "cross", "unbatched"]), batch_first=st.booleans(), kvdims=st.booleans(),
       bias=st.booleans(), add_bias_kv=st.booleans(), add_zero_attn=st.booleans(), kpm=st.sampled_from(MASKS),
       am=st.sampled_from(ATTN_MASKS), causal=st.booleans(), need_weights=st.booleans(), average=st.booleans(),
       N=st.integers(1, 3), L=st.integers(1, 7), S=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_sweep(layout, batch_first, kvdims, bias, add_bias_kv, add_zero_attn, kpm, am, causal, need_weights,
               average, N, L, S, seed):
    if layout == "self":
        kvdims = False
    run_case(seed, layout, batch_first, kvdims, bias, add_bias_kv, add_zero_attn, kpm, am, causal, need_weights,
             average, N, L, S)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("add_bias_kv", [True, False])
@pytest.mark.parametrize("kvdims", [None, (E, E), (6, 10)])
def test_state_dict_names_and_shapes(bias, add_bias_kv, kvdims):
    kdim, vdim = kvdims or (None, None)
    t = torch.nn.MultiheadAttention(E, H, bias=bias, add_bias_kv=add_bias_kv, kdim=kdim, vdim=vdim)
    ours = attn.MultiheadAttention(E, H, bias=bias, add_bias_kv=add_bias_kv, kdim=kdim, vdim=vdim, seed=1)
    want = [(k, tuple(v.shape)) for k, v in t.state_dict().items()]
    got = [(k, v.shape) for k, v in ours.state_dict().items()]
    assert got == want
    assert all(v.dtype == np.float32 for v in ours.state_dict().values())


def test_state_dict_errors():
    ours = attn.MultiheadAttention(E, H, seed=1)
    sd = ours.state_dict()
    with pytest.raises(attn.AttnError, match="unknown name 'bias_k'"):
        ours.load_state_dict({**sd, "bias_k": np.zeros((1, 1, E), np.float32)})
    with pytest.raises(attn.AttnError, match="out_proj.bias"):
        ours.load_state_dict({k: v for k, v in sd.items() if k != "out_proj.bias"})
    with pytest.raises(attn.AttnError, match=r"\(48, 16\)"):
        ours.load_state_dict({**sd, "in_proj_weight": np.zeros((48, 15), np.float32)})


def test_gqa_equals_torch_with_repeated_kv_rows():
    for hkv in (1, 2):
        ours = attn.MultiheadAttention(E, H, num_kv_heads=hkv, batch_first=True, seed=5).eval()
        sd = ours.state_dict()
        D, rep = E // H, H // hkv
        assert sd["k_proj_weight"].shape == (hkv * D, E) and sd["in_proj_bias"].shape == (E + 2 * hkv * D,)
        bq, bk, bv = np.split(sd["in_proj_bias"] + 0.1, [E, E + hkv * D])
        ours.load_state_dict({**sd, "in_proj_bias": np.concatenate([bq, bk, bv])})
        repeat = lambda a: np.repeat(a.reshape(hkv, D, -1), rep, axis=0).reshape(E, -1)  # noqa: E731
        t = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
        t.load_state_dict({
            "in_proj_weight": torch.from_numpy(np.concatenate(
                [sd["q_proj_weight"], repeat(sd["k_proj_weight"]), repeat(sd["v_proj_weight"])])),
            "in_proj_bias": torch.from_numpy(
                np.concatenate([bq, repeat(bk[:, None])[:, 0], repeat(bv[:, None])[:, 0]])),
            "out_proj.weight": torch.from_numpy(sd["out_proj.weight"]),
            "out_proj.bias": torch.from_numpy(sd["out_proj.bias"])})
        rng = np.random.default_rng(hkv)
        q, kv = rng.standard_normal((2, 3, E), np.float32), rng.standard_normal((2, 7, E), np.float32)
        with torch.no_grad():
            o_t, w_t = t(torch.from_numpy(q), torch.from_numpy(kv), torch.from_numpy(kv), average_attn_weights=False)
        out, w = ours(q, kv, kv, average_attn_weights=False)
        np.testing.assert_allclose(out, o_t.numpy(), atol=TOL)
        np.testing.assert_allclose(w, w_t.numpy(), atol=TOL)


def test_dropout():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, E)).astype(np.float32)
    t, _ = make_pair(4, dropout=0.5)
    sd = {k: v.numpy() for k, v in t.state_dict().items()}

    def fresh(seed):
        m = attn.MultiheadAttention(E, H, dropout=0.5, seed=seed)
        m.load_state_dict(sd)
        return m

    a, b = fresh(7), fresh(7)
    assert a.training  # like a new torch module
    a1, a2 = a(x, x, x)[0], a(x, x, x)[0]
    b1, b2 = b(x, x, x)[0], b(x, x, x)[0]
    np.testing.assert_array_equal(a1, b1)  # same seed, same calls: same drops
    np.testing.assert_array_equal(a2, b2)
    assert np.abs(a1 - a2).max() > 1e-3  # the seed advances with each call
    e1, e2 = a.eval()(x, x, x)[0], a(x, x, x)[0]
    assert np.abs(a1 - e1).max() > 1e-3  # training differs from eval
    np.testing.assert_array_equal(e1, e2)
    with torch.no_grad():
        o_t = t(*[torch.from_numpy(x)] * 3)[0].numpy()
    np.testing.assert_allclose(e1, o_t, atol=TOL)  # eval ignores dropout, as torch's eval does
    w = fresh(8)(x, x, x, average_attn_weights=False)[1]
    _, w_eval = a(x, x, x, average_attn_weights=False)
    kept = w != 0
    assert 0.3 < kept.mean() < 0.7  # p = 0.5 over 200 weights
    np.testing.assert_allclose(w[kept], w_eval[kept] * 2, rtol=1e-6)  # kept weights scaled by 1/(1-p)


def test_trace(capsys):
    m = attn.MultiheadAttention(64, 4, batch_first=True, seed=0)
    x = np.zeros((1, 6, 64), np.float32)
    m(x, x, x, trace=True)
    text = capsys.readouterr().out
    for line in ["Q after projection (B, L, E): (1, 6, 64)", "Q after head split (B, H, L, D): (1, 4, 6, 16)",
                 "scores (B, H, L, S): (1, 4, 6, 6)", "context (B, H, L, Dv): (1, 4, 6, 16)",
                 "context after concat (B, L, E): (1, 6, 64)", "output (N, L, E): (1, 6, 64)"]:
        assert line in text, text
    m(x, x, x)
    assert capsys.readouterr().out == ""


def test_save_load_interop(tmp_path):
    t, ours = make_pair(6, add_bias_kv=True, kdim=6, vdim=10)
    path = tmp_path / "mha.safetensors"
    ours.save(path)
    t2 = torch.nn.MultiheadAttention(E, H, add_bias_kv=True, kdim=6, vdim=10).eval()
    t2.load_state_dict(safetensors.torch.load_file(str(path)))  # the file is a torch state_dict
    for k, v in t.state_dict().items():
        torch.testing.assert_close(t2.state_dict()[k], v, rtol=0, atol=0)
    again = attn.MultiheadAttention(E, H, add_bias_kv=True, kdim=6, vdim=10, seed=9)
    again.load(path)
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[k], v)


def test_errors():
    with pytest.raises(attn.AttnError, match="embed_dim = 10 and num_heads = 3"):
        attn.MultiheadAttention(10, 3)
    with pytest.raises(attn.AttnError, match="num_heads = 6 and num_kv_heads = 4"):
        attn.MultiheadAttention(12, 6, num_kv_heads=4)
    m = attn.MultiheadAttention(E, H, seed=0)
    x = np.zeros((3, 2, E), np.float32)
    with pytest.raises(attn.AttnError, match="key_padding_mask of dtype bool or float"):
        m(x, x, x, key_padding_mask=np.zeros((2, 3), np.int64))
    with pytest.raises(attn.AttnError, match=r"attn_mask of shape \(L, S\) = \(3, 3\)"):
        m(x, x, x, attn_mask=np.zeros((2, 3), bool))


@pytest.mark.parametrize("batch_first,kdim,causal", [(True, None, False), (False, None, True), (True, 12, False)])
def test_backward_matches_torch_autograd(batch_first, kdim, causal):
    """Input and parameter gradients of a training-mode forward (flash forward and backward inside) against
    torch autograd in float64 with the same float32 weights. Tolerance: float32 round-off through two
    projections and attention on unit-scale data is ~1e-6; 1e-4 still catches any wrong term."""
    t, ours = make_pair(3, kdim=kdim, vdim=kdim, batch_first=batch_first)
    ours.train()
    rng = np.random.default_rng(5)
    L, S, N = 6, 7 if kdim else 6, 2
    shape = lambda T, C: (N, T, C) if batch_first else (T, N, C)
    q = rng.standard_normal(shape(L, E)).astype(np.float32)
    k = rng.standard_normal(shape(S, kdim or E)).astype(np.float32)
    v = rng.standard_normal(shape(S, kdim or E)).astype(np.float32)
    if not kdim:
        k = v = q  # self-attention: the input gradient is the sum of the three
    mask = causal_like("bool", L, S) if causal else None
    out, _ = ours(q, k, v, need_weights=False, is_causal=causal)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = ours.backward(dout)

    t64 = t.double().train()
    tq, tk, tv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    if not kdim:
        tk = tv = tq
    ref, _ = t64(tq, tk, tv, need_weights=False, attn_mask=None if mask is None else torch.tensor(mask),
                 is_causal=causal)
    ref.backward(torch.tensor(dout, dtype=torch.float64))
    np.testing.assert_allclose(out, ref.detach().numpy(), atol=1e-5)
    if kdim:
        for ours_g, x in ((dq, tq), (dk, tk), (dv, tv)):
            np.testing.assert_allclose(ours_g, x.grad.numpy(), atol=1e-4)
    else:
        np.testing.assert_allclose(dq + dk + dv, tq.grad.numpy(), atol=1e-4)
    grads = ours.grads()
    for name, p in t64.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), atol=1e-4, err_msg=name)
