"""attn.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention (and against
softmax / logsumexp written with torch ops for the weights and LSE PyTorch does not return): random shapes
of query rank 2 to 5, bool and float masks with broadcast shapes, scale, is_causal in both alignments, GQA,
fully masked rows (our zeros), float32, errors, non-contiguous inputs. Not a test of dropout (see
tests/test_reference.cpp) or of the backward (test_backward.py)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attn

torch.set_num_threads(1)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# float64 on O(1) inputs with S, D <= 17: each output rounds O(S + D) times at 1.1e-16, so errors stay
# below 1e-13; 1e-10 is the brief's bound and still catches any wrong term.
TOL64 = 1e-10


def visible(L, S, alignment):
    """(L, S) bool: may query l see key s under causal `alignment` ("top_left" or "bottom_right")."""
    return np.tril(np.ones((L, S), dtype=bool), k=0 if alignment == "top_left" else S - L)


def as_additive(mask, dtype=np.float64):
    """A bool keep-mask as the additive mask it means (0 or -inf); a float mask as is."""
    if mask is None or mask.dtype != np.bool_:
        return mask
    return np.where(mask, 0.0, -np.inf).astype(dtype)


def merge(mask, vis):
    """attn_mask and a causal (L, S) visibility merged into one mask of the same kind (PyTorch takes only one)."""
    if mask is None:
        return vis
    return mask & vis if mask.dtype == np.bool_ else mask + np.where(vis, 0.0, -np.inf).astype(mask.dtype)


def torch_sdpa(q, k, v, mask=None, **kw):
    t = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    return F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(mask), **kw).numpy()


def torch_scores(q, k, mask, scale):
    """q·kᵀ·scale + mask in float64 torch ops, K heads repeated for GQA: (..., H, L, S)."""
    tq, tk = torch.from_numpy(np.asarray(q, np.float64)), torch.from_numpy(np.asarray(k, np.float64))
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        tk = tk.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    x = tq @ tk.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    return x if mask is None else x + torch.from_numpy(as_additive(mask))


@st.composite
def problems(draw):
    """A random problem in the shapes F.scaled_dot_product_attention takes: (..., H, L, D) etc."""
    rank = draw(st.sampled_from([2, 3, 4, 5]))
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=max(rank - 3, 0), max_size=max(rank - 3, 0))))
    gqa = rank >= 3 and draw(st.booleans())
    hkv = draw(st.integers(1, 2))
    H = hkv * (draw(st.sampled_from([1, 2, 4, 8])) if gqa else 1)
    heads, kv_heads = ((H,), (hkv,)) if rank >= 3 else ((), ())
    sizes = st.sampled_from([1, 2, 5, 7, 16, 17])
    L, S, D, Dv = draw(sizes), draw(sizes), draw(st.sampled_from([1, 3, 8, 16])), draw(st.sampled_from([1, 4, 9]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal(lead + heads + (L, D))
    k = rng.standard_normal(lead + kv_heads + (S, D))
    v = rng.standard_normal(lead + kv_heads + (S, Dv))
    mask = None
    kind = draw(st.sampled_from(["none", "bool", "float"]))
    if kind != "none":  # a broadcast shape: a suffix of the full (..., H, L, S), any dim may be 1
        full = lead + heads + (L, S)
        suffix = full[draw(st.integers(0, len(full) - 2)):]  # rank >= 2, as PyTorch needs
        shape = tuple(d if draw(st.booleans()) else 1 for d in suffix)
        if kind == "bool":
            mask = rng.random(shape) < draw(st.sampled_from([0.3, 0.8, 1.0]))
        else:
            mask = np.where(rng.random(shape) < 0.15, -np.inf, rng.standard_normal(shape))
    return dict(q=q, k=k, v=v, mask=mask, gqa=gqa,
                causal=draw(st.sampled_from([None, "top_left", "bottom_right"])),
                scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))))


def reference_and_zero_rows(p):
    """What PyTorch computes for problem p (causal merged into the mask by hand), and the rows that see no key."""
    q, k, v, mask, causal = p["q"], p["k"], p["v"], p["mask"], p["causal"]
    L, S = q.shape[-2], k.shape[-2]
    if causal == "top_left" and mask is None:  # PyTorch's own is_causal
        want = torch_sdpa(q, k, v, is_causal=True, scale=p["scale"], enable_gqa=p["gqa"])
        merged = visible(L, S, "top_left")
    else:
        merged = mask if causal is None else merge(mask, visible(L, S, causal))
        want = torch_sdpa(q, k, v, merged, scale=p["scale"], enable_gqa=p["gqa"])
    allowed = np.ones((L, S), bool) if merged is None else (merged if merged.dtype == np.bool_ else merged > -np.inf)
    zero = ~np.broadcast_to(allowed, want.shape[:-1] + (S,)).any(-1)  # (..., H, L)
    return want, merged, zero


def ours(p, **kw):
    return attn.scaled_dot_product_attention(p["q"], p["k"], p["v"], p["mask"], is_causal=p["causal"] is not None,
                                             causal_alignment=p["causal"] or "top_left", scale=p["scale"],
                                             enable_gqa=p["gqa"], **kw)


def check_rows(got, want, zero, tol):
    """got == want within tol, except on fully masked rows: ours 0 there, PyTorch's NaN (or 0)."""
    assert got.shape == want.shape
    assert np.all(got[zero] == 0), "a fully masked row must be zero"
    assert np.all(np.isnan(want[zero]) | (want[zero] == 0)), "PyTorch gave something else on a fully masked row"
    err = np.abs(got[~zero] - want[~zero])
    assert not np.isnan(err).any()
    assert err.max(initial=0) <= tol, f"max abs error {err.max()} > {tol}"


@SETTINGS
@given(problems())
def test_matches_torch_float64(p):
    want, _, zero = reference_and_zero_rows(p)
    got = ours(p)
    assert got.dtype == np.float64
    check_rows(got, want, zero, TOL64)


@SETTINGS
@given(problems())
def test_weights_and_lse_match_torch_ops(p):
    want, merged, zero = reference_and_zero_rows(p)
    out, w, lse = ours(p, return_weights=True, return_lse=True)
    x = torch_scores(p["q"], p["k"], merged, p["scale"])  # (..., H, L, S)
    assert w.shape == tuple(x.shape) and lse.shape == tuple(x.shape[:-1])
    check_rows(out, want, zero, TOL64)
    check_rows(w, torch.softmax(x, -1).numpy(), zero, TOL64)
    want_lse = torch.logsumexp(x, -1).numpy()
    assert np.all(lse[zero] == -np.inf) and np.all(want_lse[zero] == -np.inf)
    assert np.abs(lse[~zero] - want_lse[~zero]).max(initial=0) <= TOL64
    np.testing.assert_allclose(w.sum(-1)[~zero], 1.0, atol=TOL64)


def f32_tolerance(p, merged):
    """A first-order worst-case bound of float32 rounding (u = 2^-24), as in tests/test_reference.cpp:
    scores carry δx = u·((D + 1)·scale·Σ|q·k| + 3·max|x|) (dot product γ_D, the scale, the mask add and the
    max subtraction); weights a relative 4δx + (S + 2)·u (exp, a sum of S terms, the division); out adds
    γ_S·max|v|. Doubled for second-order terms. With flash (auto backend) blocks only shorten the sums,
    and folding scale·log2(e) into q adds O(u·|x|), which the 3·max|x| term already exceeds."""
    q, k, v = p["q"], p["k"], p["v"]
    u, D, S = 2.0**-24, q.shape[-1], k.shape[-2]
    scale = p["scale"] if p["scale"] is not None else D**-0.5
    dot_abs = torch_scores(np.abs(q), np.abs(k), None, abs(scale)).numpy().max()
    x = torch_scores(q, k, merged, scale).numpy()
    x_abs = np.abs(x[np.isfinite(x)]).max(initial=0)
    dx = u * ((D + 1) * dot_abs + 3 * x_abs)
    return 2 * np.abs(v).max() * (4 * dx + (S + 2) * u + S * u)


@SETTINGS
@given(problems(), st.sampled_from(["auto", "reference"]))
def test_float32_within_derived_tolerance(p, backend):
    f32 = lambda x: x if x is None or x.dtype == np.bool_ else x.astype(np.float32)  # noqa: E731
    p = dict(p, q=f32(p["q"]), k=f32(p["k"]), v=f32(p["v"]), mask=f32(p["mask"]))
    got = ours(p, backend=backend)
    assert got.dtype == np.float32
    f64 = lambda x: x if x is None or x.dtype == np.bool_ else x.astype(np.float64)  # noqa: E731
    p64 = dict(p, q=f64(p["q"]), k=f64(p["k"]), v=f64(p["v"]), mask=f64(p["mask"]))  # the same values in float64
    want, merged, zero = reference_and_zero_rows(p64)
    check_rows(got.astype(np.float64), want, zero, f32_tolerance(p64, merged))


def test_causal_alignments_against_explicit_masks():
    """Both alignments with L < S, L = S, L > S; rows that see no key (bottom_right, L > S) are zero."""
    rng = np.random.default_rng(1)
    for L, S in [(3, 7), (6, 6), (7, 3), (1, 5), (5, 1)]:
        q, k, v = (rng.standard_normal((2, 3, n, d)) for n, d in ((L, 8), (S, 8), (S, 4)))
        top = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
        np.testing.assert_allclose(top, torch_sdpa(q, k, v, is_causal=True), atol=TOL64, rtol=0)
        np.testing.assert_allclose(top, torch_sdpa(q, k, v, visible(L, S, "top_left")), atol=TOL64, rtol=0)
        bottom = attn.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right")
        blind = max(L - S, 0)  # the first L - S queries see nothing
        assert np.all(bottom[..., :blind, :] == 0)
        want = torch_sdpa(q, k, v, visible(L, S, "bottom_right"))
        np.testing.assert_allclose(bottom[..., blind:, :], want[..., blind:, :], atol=TOL64, rtol=0)
        assert np.all(np.isnan(want[..., :blind, :]) | (want[..., :blind, :] == 0))
        if L != S:  # the two alignments differ
            assert np.abs(top - bottom).max() > 1e-3


def test_gqa_ratios():
    """enable_gqa with H / Hkv = 1, 2, 4, 8 on rank 3, 4 and 5 inputs, each ratio for sure (hypothesis may skip one)."""
    rng = np.random.default_rng(5)
    for ratio in (1, 2, 4, 8):
        for lead in ((), (2,), (2, 3)):
            q = rng.standard_normal(lead + (2 * ratio, 5, 8))
            k, v = rng.standard_normal(lead + (2, 7, 8)), rng.standard_normal(lead + (2, 7, 3))
            got = attn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            np.testing.assert_allclose(got, torch_sdpa(q, k, v, is_causal=True, enable_gqa=True), atol=TOL64, rtol=0)


def test_fully_masked_rows_are_zero_where_torch_gives_nan():
    """Bool and float masks that hide every key of some rows: out 0, weights 0, LSE -inf (PyTorch: NaN or 0)."""
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 2, 4, 8)), rng.standard_normal((2, 2, 6, 8)), rng.standard_normal((2, 2, 6, 3))
    keep = np.ones((2, 1, 4, 6), bool)
    keep[0, :, 1] = False
    keep[1, :, 3] = False
    for mask in (keep, as_additive(keep)):
        out, w, lse = attn.scaled_dot_product_attention(q, k, v, mask, return_weights=True, return_lse=True)
        want = torch_sdpa(q, k, v, mask)
        zero = np.broadcast_to(~keep.any(-1), out.shape[:-1])
        assert zero.sum() == 4
        check_rows(out, want, zero, TOL64)
        assert np.all(w[zero] == 0) and np.all(lse[zero] == -np.inf) and np.isfinite(lse[~zero]).all()


def test_non_contiguous_inputs():
    """Transposed views ((B, L, H, D) buffers read as (B, H, L, D)), a reversed view and a transposed mask
    give exactly the contiguous result, and PyTorch's."""
    rng = np.random.default_rng(3)
    B, H, L, S, D = 2, 4, 5, 7, 8
    q = rng.standard_normal((B, L, H, D)).swapaxes(1, 2)
    k = rng.standard_normal((B, S, 2, D)).swapaxes(1, 2)
    v = rng.standard_normal((B, 2, S, 2 * D))[..., ::-2]  # negative, non-unit last-dim stride
    mask = (rng.random((S, L)) < 0.8).T
    mask[:, 0] = True
    assert not any(x.flags.c_contiguous for x in (q, k, v, mask))
    got = attn.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
    c = [np.ascontiguousarray(x) for x in (q, k, v, mask)]
    np.testing.assert_array_equal(got, attn.scaled_dot_product_attention(*c, enable_gqa=True))
    np.testing.assert_allclose(got, torch_sdpa(q, k, v, mask, enable_gqa=True), atol=TOL64, rtol=0)
    # float32 (the flash path under backend="auto") reads the same strided views
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))  # astype keeps the strides
    assert not q32.flags.c_contiguous
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(q32, k32, v32, enable_gqa=True),
                                  attn.scaled_dot_product_attention(*(np.ascontiguousarray(x) for x in (q32, k32, v32)),
                                                                    enable_gqa=True))


def test_torch_tensors_and_dropout_seed():
    """CPU torch tensors work as inputs and come back as torch tensors; dropout is a pure function of the seed."""
    rng = np.random.default_rng(4)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 5, 8))) for _ in range(3))
    np.testing.assert_allclose(attn.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               atol=TOL64, rtol=0)
    a = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=1)
    np.testing.assert_array_equal(a, attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=1))
    assert np.abs(a - attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=2)).max() > 1e-3
    assert isinstance(a, torch.Tensor) and a.dtype == torch.float64
    assert bool((attn.scaled_dot_product_attention(q, k, v, dropout_p=1.0) == 0).all())


def r(*shape, dtype=np.float64):
    return np.zeros(shape, dtype)


# (arguments, keyword arguments, parts the message must name)
ERRORS = [
    ((r(5), r(5), r(5)), {}, ["query", "(5,)"]),
    ((r(2, 3, 4), r(2, 5, 4, 1), r(2, 5, 4)), {}, ["(2, 3, 4)", "(2, 5, 4, 1)"]),
    ((r(2, 4, 3, 8), r(2, 2, 5, 8), r(2, 2, 5, 6)), {}, ["key", "(2, 4)", "(2, 2)", "enable_gqa"]),
    ((r(2, 4, 3, 8), r(2, 4, 5, 7), r(2, 4, 5, 6)), {}, ["key", "(2, 4, 5, 8)", "(2, 4, 5, 7)"]),
    ((r(2, 4, 3, 8), r(2, 4, 5, 8), r(2, 4, 6, 6)), {}, ["value", "(2, 4, 5, 6)", "(2, 4, 6, 6)"]),
    ((r(2, 4, 3, 8), r(2, 3, 5, 8), r(2, 3, 5, 6)), {"enable_gqa": True}, ["H = 4", "Hkv = 3"]),
    ((r(2, 4, 3, 8), r(2, 4, 5, 8), r(2, 4, 5, 6), r(3, 6, dtype=bool)), {}, ["attn_mask", "(2, 4, 3, 5)", "(3, 6)"]),
    ((r(2, 4, 3, 8), r(2, 4, 5, 8), r(2, 4, 5, 6), r(3, 4, 3, 5)), {}, ["attn_mask", "(3, 4, 3, 5)"]),
    ((r(2, 2, 2, 3, 8), r(2, 2, 2, 5, 8), r(2, 2, 2, 5, 6), r(4, 5, dtype=bool)), {}, ["attn_mask", "(4, 5)"]),
    # leading dims of rank-5 inputs must match; folding them into B would hide the mismatch
    ((r(2, 3, 4, 3, 8), r(3, 2, 2, 5, 8), r(3, 2, 2, 5, 6)), {"enable_gqa": True}, ["key", "(2, 3", "(3, 2"]),
    ((r(2, 3, 4, 3, 8), r(2, 3, 4, 5, 8), r(3, 2, 4, 5, 6)), {}, ["value", "(2, 3, 4, 5", "(3, 2, 4, 5"]),
    # dtypes: one float dtype for query, key, value; a bool or float mask
    ((r(1, 3, 8), r(1, 5, 8, dtype=np.float32), r(1, 5, 6)), {}, ["key", "float64", "float32"]),
    ((r(1, 3, 8, dtype=np.int64), r(1, 5, 8, dtype=np.int64), r(1, 5, 6, dtype=np.int64)), {}, ["query", "int64"]),
    ((r(1, 3, 8), r(1, 5, 8), r(1, 5, 6), r(3, 5, dtype=np.int64)), {}, ["attn_mask", "int64"]),
    ((r(1, 3, 8), r(1, 5, 8), r(1, 5, 6)), {"dropout_p": 1.5}, ["dropout_p", "1.5"]),
    ((r(1, 3, 8), r(1, 5, 8), r(1, 5, 6)), {"scale": float("inf")}, ["scale", "inf"]),
    ((r(1, 3, 8), r(1, 5, 8), r(1, 5, 6)), {"is_causal": True, "causal_alignment": "middle"}, ["causal", "middle"]),
]


@pytest.mark.parametrize("args,kwargs,parts", ERRORS)
def test_errors_name_argument_and_shapes(args, kwargs, parts):
    with pytest.raises(attn.AttnError) as e:
        attn.scaled_dot_product_attention(*args, **kwargs)
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert msg.startswith("Expected ") and msg.endswith(" instead"), msg
    for part in parts:
        assert part in msg, f"{part!r} not in: {msg}"


def test_explain_says_which_backend_runs_and_strict_refuses_a_fallback():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32) for _ in range(3))
    assert attn.scaled_dot_product_attention(q, k, v, explain=True)[0] == "flash"
    backend, reason = attn.scaled_dot_product_attention(q, k, v, return_weights=True, explain=True)
    assert backend == "flash" and "weights from the LSE" in reason
    backend, reason = attn.scaled_dot_product_attention(*(x.astype(np.float64) for x in (q, k, v)), explain=True)
    assert backend == "reference" and "fp64" in reason
    with pytest.raises(attn.AttnError, match="strict"):
        attn.scaled_dot_product_attention(*(x.astype(np.float64) for x in (q, k, v)), strict=True)
    with pytest.raises(attn.AttnError, match="flash"):
        attn.scaled_dot_product_attention(*(x.astype(np.float64) for x in (q, k, v)), backend="flash")
    # explain runs nothing but checks everything: a bad shape is the same error as a real call's
    with pytest.raises(attn.AttnError, match="value"):
        attn.scaled_dot_product_attention(q, k, v[..., :3, :], explain=True)
