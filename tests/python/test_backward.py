"""attn.scaled_dot_product_attention_backward against PyTorch autograd of F.scaled_dot_product_attention
in float64: masks (bool keep, float additive), causal (both alignments), enable_gqa, dropout (PyTorch given
our keep bits), leading batch dims; zero gradients of fully masked rows; argument errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn

# float64 on O(1) inputs: both sides round at ~1e-16 per operation over O(S + D) terms, so 1e-9 leaves a
# margin of many orders while catching any wrong term.
TOL = 1e-9


def rand(rng, *shape):
    return rng.standard_normal(shape)


def torch_grads(q, k, v, dout, **kw):
    t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*t, **kw)
    out.backward(torch.tensor(dout))
    return [x.grad.numpy() for x in t]


def ours(q, k, v, dout, **kw):
    out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    return attn.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, **kw)


def assert_close(got, want):
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL, err_msg=name)


def keep_mask(rng, *shape):
    m = rng.random(shape) < 0.7
    m[..., 0] = True  # every row keeps a key: PyTorch gives NaN on a fully masked row
    return m


@pytest.mark.parametrize("mask", ["none", "bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S", [(5, 7), (9, 9), (64, 33)])
def test_masks_and_causal_match_torch(mask, causal, L, S):
    rng = np.random.default_rng(L * 100 + S)
    B, H, D, Dv = 2, 3, 8, 5
    q, k, v, dout = rand(rng, B, H, L, D), rand(rng, B, H, S, D), rand(rng, B, H, S, Dv), rand(rng, B, H, L, Dv)
    m = None
    if mask == "bool":
        m = keep_mask(rng, B, 1, L, S)
    elif mask == "float":
        m = rand(rng, H, L, S)
    kw = {"attn_mask": None if m is None else torch.tensor(m), "is_causal": causal}
    if causal and m is not None:  # PyTorch takes no mask with is_causal: give it the causal mask merged in
        tri = np.tril(np.ones((L, S), dtype=bool))  # top-left: key 0 stays visible, so no row is fully masked
        kw = {"attn_mask": torch.tensor(m & tri if m.dtype == bool else np.where(tri, m, -np.inf))}
    assert_close(ours(q, k, v, dout, attn_mask=m, is_causal=causal), torch_grads(q, k, v, dout, **kw))


def test_bottom_right_causal_matches_torch_lower_right_mask():
    rng = np.random.default_rng(1)
    B, H, L, S, D = 1, 2, 6, 11, 4
    q, k, v, dout = rand(rng, B, H, L, D), rand(rng, B, H, S, D), rand(rng, B, H, S, D), rand(rng, B, H, L, D)
    lower_right = np.tril(np.ones((L, S), dtype=bool), k=S - L)  # the last query sees every key
    want = torch_grads(q, k, v, dout, attn_mask=torch.tensor(lower_right))
    got = ours(q, k, v, dout, is_causal=True, causal_alignment="bottom_right")
    assert_close(got, want)


@pytest.mark.parametrize("Hkv", [1, 2, 4])
def test_gqa_matches_torch_enable_gqa(Hkv):
    rng = np.random.default_rng(Hkv)
    B, H, L, S, D = 2, 4, 7, 10, 6
    q, k, v, dout = rand(rng, B, H, L, D), rand(rng, B, Hkv, S, D), rand(rng, B, Hkv, S, D), rand(rng, B, H, L, D)
    m = keep_mask(rng, L, S)
    want = torch_grads(q, k, v, dout, attn_mask=torch.tensor(m), enable_gqa=True)
    got = ours(q, k, v, dout, attn_mask=m, enable_gqa=True)
    assert got[1].shape == (B, Hkv, S, D)
    assert_close(got, want)


def test_dropout_matches_torch_given_our_keep_bits():
    rng = np.random.default_rng(5)
    B, H, L, S, D, p = 1, 2, 8, 9, 4, 0.25
    q, k, v, dout = rand(rng, B, H, L, D), rand(rng, B, H, S, D), rand(rng, B, H, S, D), rand(rng, B, H, L, D)
    _, w = attn.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=9, return_weights=True)
    keep = torch.tensor(w != 0)  # softmax weights are never 0 here, so 0 means dropped
    t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    weights = torch.softmax(t[0] @ t[1].transpose(-1, -2) / np.sqrt(D), dim=-1)
    (weights * keep / (1 - p) @ t[2]).backward(torch.tensor(dout))
    got = ours(q, k, v, dout, dropout_p=p, seed=9)
    assert_close(got, [x.grad.numpy() for x in t])


def test_leading_dims_and_rank3():
    rng = np.random.default_rng(2)
    q, k = rand(rng, 2, 3, 2, 5, 4), rand(rng, 2, 3, 2, 6, 4)
    v, dout = rand(rng, 2, 3, 2, 6, 3), rand(rng, 2, 3, 2, 5, 3)
    assert_close(ours(q, k, v, dout, is_causal=True), torch_grads(q, k, v, dout, is_causal=True))
    assert_close(ours(q[0, 0], k[0, 0], v[0, 0], dout[0, 0]), torch_grads(q[0, 0], k[0, 0], v[0, 0], dout[0, 0]))


def test_fully_masked_row_gives_zero_gradient():
    rng = np.random.default_rng(3)
    q, k, v, dout = rand(rng, 1, 2, 4, 3), rand(rng, 1, 2, 5, 3), rand(rng, 1, 2, 5, 3), rand(rng, 1, 2, 4, 3)
    m = keep_mask(rng, 4, 5)
    m[2] = False
    dq, dk, dv = ours(q, k, v, dout, attn_mask=m)
    assert np.all(dq[:, :, 2] == 0)
    dout[:, :, 2] = 1e3  # that row's dout feeds nothing
    _, dk2, dv2 = ours(q, k, v, dout, attn_mask=m)
    np.testing.assert_array_equal(dk, dk2)
    np.testing.assert_array_equal(dv, dv2)
    assert np.all(np.isfinite(dk)) and np.abs(dk).max() > 0


def test_float32_close_to_torch():
    rng = np.random.default_rng(4)
    q, k, v, dout = (rand(rng, 1, 2, 33, 16).astype(np.float32) for _ in range(4))
    got = ours(q, k, v, dout, is_causal=True)
    want = torch_grads(*(x.astype(np.float64) for x in (q, k, v, dout)), is_causal=True)
    assert got[0].dtype == np.float32
    for g, w in zip(got, want):  # float32 rounding (~6e-8) grown over O(S + D) terms
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_errors_name_both_shapes():
    rng = np.random.default_rng(0)
    q, k, v = rand(rng, 1, 2, 4, 3), rand(rng, 1, 2, 5, 3), rand(rng, 1, 2, 5, 3)
    out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True)
    with pytest.raises(attn.AttnError, match=r"dout of shape .*\(1, 2, 4, 3\).*\(1, 2, 4, 5\)"):
        attn.scaled_dot_product_attention_backward(rand(rng, 1, 2, 4, 5), q, k, v, out, lse)
    with pytest.raises(attn.AttnError, match=r"lse of shape .*\(1, 2, 4\).*\(1, 2, 3\)"):
        attn.scaled_dot_product_attention_backward(out, q, k, v, out, lse[:, :, :3])
