"""The nn layers against PyTorch 2.13 with copied weights: forward outputs, and backward (input and every
parameter gradient) against torch autograd, for Linear, LayerNorm, GELU/ReLU, the feed-forward block and
torch.nn.TransformerEncoderLayer / TransformerDecoderLayer (norm_first both ways, relu and gelu,
batch_first both ways, unbatched, bias=False, bool and float masks, key padding, causal).

Tolerance, derived as in docs/ARCHITECTURE.md's numerical policy: torch's float64 autograd is the oracle.
Our float32 result may err against it by at most twice what PyTorch's own float32 computation errs, plus
a floor of 32 float32 ulps of the result's scale (max(|oracle|, 1) · 2^-19 ≈ 2e-6): the rounding of one float32
dot product over the
~32 unit-scale terms these shapes sum, for tensors where torch's float32 happens to be nearly exact. For
unit-scale inputs both sides err by ~1e-6 (measured: 1e-7 .. 1.5e-6), so this is the "1e-5-ish" bound,
derived per tensor; a wrong term (a missed residual, a transposed weight, a mask off by one) errs by O(0.1).
"""
import zlib

import numpy as np
import pytest
import torch

import attn

torch.set_num_threads(1)
# torch warns when a bool key padding mask meets a float attn_mask; we test that mix on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")


def check(name, ours, torch32, oracle, report=None):
    ours, torch32, oracle = (np.asarray(x, dtype=np.float64) for x in (ours, torch32, oracle))
    assert ours.shape == oracle.shape, f"{name}: shape {ours.shape} != {oracle.shape}"
    err_ours = np.abs(ours - oracle).max(initial=0.0)
    err_torch = np.abs(torch32 - oracle).max(initial=0.0)
    floor = 32 * 2.0 ** -24 * max(np.abs(oracle).max(initial=0.0), 1.0)
    tol = 2 * err_torch + floor
    if report is not None:
        report.append((name, err_ours, err_torch))
    assert err_ours <= tol, f"{name}: max abs error {err_ours:.3g} > {tol:.3g} (torch float32 errs {err_torch:.3g})"


def to_np(t):
    return t.detach().numpy()


def run_torch(module, inputs, dout, forward):
    """(output, input grads, parameter grads by name) of `module` (float32 or float64) under autograd."""
    dtype = next(module.parameters()).dtype
    ts = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in inputs]
    out = forward(module, *ts)
    out.backward(torch.tensor(dout, dtype=dtype))
    return to_np(out), [to_np(t.grad) for t in ts], {n: to_np(p.grad) for n, p in module.named_parameters()}


def compare(ours_layer, module, inputs, forward_torch, forward_ours):
    """Forward and backward of our layer vs the float32 and float64 copies of a torch module."""
    ours_layer.load_state_dict({k: to_np(v) for k, v in module.state_dict().items()})
    module64 = _double_copy(module)
    rng = np.random.default_rng(123)
    y = forward_ours(ours_layer, *inputs)
    dout = rng.standard_normal(y.shape).astype(np.float32)
    y32, din32, dp32 = run_torch(module, inputs, dout, forward_torch)
    y64, din64, dp64 = run_torch(module64, inputs, dout, forward_torch)
    report = []
    check("output", y, y32, y64, report)
    din = ours_layer.backward(dout)
    din = list(din) if isinstance(din, tuple) else [din]
    for i, (g, g32, g64) in enumerate(zip(din, din32, din64)):
        check(f"grad input {i}", g, g32, g64, report)
    grads = ours_layer.grads()
    assert list(grads) == list(dp64), "parameter names and order differ from torch's named_parameters()"
    for name in dp64:
        check(f"grad {name}", grads[name], dp32[name], dp64[name], report)
    return report


def _double_copy(module):
    import copy
    return copy.deepcopy(module).double()


def _seed(*case):
    """A seed per test case that is the same in every run (hash() of a str is salted per process)."""
    return zlib.crc32(repr(case).encode())


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- Elementary layers ----

@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    m = torch.nn.Linear(13, 7, bias=bias)
    compare(attn.Linear(13, 7, bias=bias), m, [randn(rng, 2, 5, 13)], lambda mod, x: mod(x), lambda l, x: l(x))


# F = 24 (three 8-lane blocks), and odd sizes for the SIMD kernel's tails: 1 (var = 0), 7, 17 (not a
# multiple of 16 or 8), 130; shape (1, 1, F) is a single row.
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("F,shape", [(24, (3, 4)), (1, (3, 4)), (7, (1, 1)), (17, (5, 3)), (130, (2, 7))])
def test_layer_norm(affine, bias, F, shape):
    rng = np.random.default_rng(2)
    torch.manual_seed(2)
    m = torch.nn.LayerNorm(F, eps=1e-5, elementwise_affine=affine, bias=bias)
    with torch.no_grad():  # non-trivial affine parameters
        for p in m.parameters():
            p.copy_(torch.randn_like(p))
    x = randn(rng, *shape, F) * 3 + 1  # not already normalised
    ours = attn.LayerNorm(F, eps=1e-5, elementwise_affine=affine, bias=bias)
    if not affine:  # no parameters to copy; still compare output and input gradient
        ours.load_state_dict({})
    compare(ours, m if affine else _WithDummy(m), [x], lambda mod, x: mod(x), lambda l, x: l(x))


class _WithDummy(torch.nn.Module):
    """A parameterless module for compare(), which reads the dtype from a parameter."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.register_buffer("dtype_probe", torch.zeros(1))

    def parameters(self, recurse=True):
        yield self.dtype_probe

    def named_parameters(self, *a, **k):
        return iter(())

    def state_dict(self, *a, **k):
        return {}

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    rng = np.random.default_rng(3)
    x = randn(rng, 4, 33) * 3
    compare(attn.GELU(approximate), _WithDummy(torch.nn.GELU(approximate=approximate)), [x],
            lambda mod, x: mod(x), lambda l, x: l(x))


def test_relu():
    rng = np.random.default_rng(4)
    compare(attn.ReLU(), _WithDummy(torch.nn.ReLU()), [randn(rng, 4, 33)], lambda mod, x: mod(x), lambda l, x: l(x))


class _TorchFFN(torch.nn.Module):
    """torch's _ff_block of TransformerEncoderLayer, with the same names."""

    def __init__(self, d, f, activation):
        super().__init__()
        self.linear1 = torch.nn.Linear(d, f)
        self.dropout = torch.nn.Dropout(0.0)
        self.linear2 = torch.nn.Linear(f, d)
        self.activation = torch.nn.functional.relu if activation == "relu" else torch.nn.functional.gelu

    def forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


# linear1's bias gradient is summed in the activation's backward (128-column groups): odd widths (hidden
# 65, 1) and a single row, beside the 16 -> 40 block.
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("d,f,shape", [(16, 40, (2, 7)), (17, 65, (1, 1)), (9, 1, (3, 5))])
def test_feed_forward(activation, d, f, shape):
    rng = np.random.default_rng(5)
    torch.manual_seed(5)
    compare(attn.FeedForward(d, f, activation=activation, dropout=0.0), _TorchFFN(d, f, activation),
            [randn(rng, *shape, d)], lambda mod, x: mod(x), lambda l, x: l(x))


def test_embedding_matches_torch():
    torch.manual_seed(6)
    m = torch.nn.Embedding(11, 5)
    ours = attn.Embedding(11, 5)
    ours.load_state_dict({k: to_np(v) for k, v in m.state_dict().items()})
    ids = np.array([[1, 4, 1], [10, 0, 4]])
    y = m(torch.tensor(ids))
    np.testing.assert_array_equal(ours(ids), to_np(y))
    dout = np.random.default_rng(6).standard_normal((2, 3, 5)).astype(np.float32)
    y.backward(torch.tensor(dout))
    ours.backward(dout)
    np.testing.assert_allclose(ours.grads()["weight"], to_np(m.weight.grad), rtol=0, atol=1e-6)


def test_gradients_accumulate_and_zero():
    rng = np.random.default_rng(7)
    layer = attn.Linear(4, 3)
    x, d = randn(rng, 5, 4), randn(rng, 5, 3)
    layer(x)
    layer.backward(d)
    once = layer.grads()
    layer(x)
    layer.backward(d)
    for k, v in layer.grads().items():
        np.testing.assert_allclose(v, 2 * once[k], rtol=1e-6, atol=1e-6)
    layer.zero_grad()
    assert all(not v.any() for v in layer.grads().values())


# ---- Transformer layers ----

L, S, N, E, NHEAD, FF = 6, 5, 2, 16, 4, 24


def _layout(x, batch_first):
    """(N, T, E) data in the layer's layout."""
    return np.ascontiguousarray(x if batch_first else x.transpose(1, 0, 2))


def _masks(rng, kind, rows, cols):
    """An attn_mask (rows, cols): bool True = masked (key 0 always visible) or float."""
    if kind == "bool":
        m = rng.random((rows, cols)) < 0.3
        m[:, 0] = False
        return m
    if kind == "float":
        return randn(rng, rows, cols)
    return None


def _padding(cols):
    """(N, cols) key padding: the last key of batch 1 is padding (every query keeps key 0)."""
    p = np.zeros((N, cols), dtype=bool)
    p[1, -1] = True
    return p


ENCODER_CASES = [
    # norm_first, activation, batch_first, mask, padding, causal, bias
    (False, "relu", False, None, False, False, True),
    (True, "gelu", True, None, False, False, True),
    (False, "gelu", True, "bool", True, False, True),
    (True, "relu", False, "float", True, False, True),
    (True, "gelu", True, None, True, True, True),
    (False, "relu", True, None, False, True, True),
    (True, "gelu", False, "bool", False, False, False),
]


@pytest.mark.parametrize("norm_first,activation,batch_first,mask,padding,causal,bias", ENCODER_CASES)
def test_encoder_layer(norm_first, activation, batch_first, mask, padding, causal, bias):
    rng = np.random.default_rng(_seed(norm_first, activation, batch_first, mask, padding, causal))
    torch.manual_seed(8)
    kw = dict(d_model=E, nhead=NHEAD, dim_feedforward=FF, dropout=0.0, activation=activation,
              batch_first=batch_first, norm_first=norm_first, bias=bias)
    m = torch.nn.TransformerEncoderLayer(**kw)
    _randomize_biases(m)
    src = _layout(randn(rng, N, L, E), batch_first)
    src_mask = _masks(rng, mask, L, L)
    kpm = _padding(L) if padding else None
    ours = attn.TransformerEncoderLayer(**kw)

    def torch_mask():
        if not causal:
            return None if src_mask is None else torch.tensor(src_mask)
        tri = np.triu(np.ones((L, L), dtype=bool), 1)  # torch takes the causal mask itself with is_causal
        return torch.tensor(tri)

    def fwd_torch(mod, x):
        return mod(x, src_mask=torch_mask(), src_key_padding_mask=None if kpm is None else torch.tensor(kpm),
                   is_causal=causal)

    report = compare(ours, m, [src], fwd_torch,
                     lambda l, x: l(x, src_mask=src_mask, src_key_padding_mask=kpm, is_causal=causal))
    assert len(report) == 2 + len(list(m.parameters()))


def test_encoder_layer_unbatched():
    rng = np.random.default_rng(9)
    torch.manual_seed(9)
    kw = dict(d_model=E, nhead=NHEAD, dim_feedforward=FF, dropout=0.0, activation="gelu", norm_first=True)
    m = torch.nn.TransformerEncoderLayer(**kw)
    compare(attn.TransformerEncoderLayer(**kw), m, [randn(rng, L, E)], lambda mod, x: mod(x), lambda l, x: l(x))


def test_encoder_layer_eval_forward_matches_torch_fast_path():
    rng = np.random.default_rng(10)
    torch.manual_seed(10)
    kw = dict(d_model=E, nhead=NHEAD, dim_feedforward=FF, dropout=0.1, batch_first=True)
    m = torch.nn.TransformerEncoderLayer(**kw).eval()
    ours = attn.TransformerEncoderLayer(**kw).eval()
    ours.load_state_dict({k: to_np(v) for k, v in m.state_dict().items()})
    x = randn(rng, N, L, E)
    with torch.no_grad():
        want = m(torch.tensor(x)).numpy()
    # torch's fused fast path in float32: a few float32 roundings of unit-scale values apart from ours.
    np.testing.assert_allclose(ours(x), want, rtol=0, atol=2e-5)


DECODER_CASES = [
    # norm_first, activation, batch_first, tgt_mask, memory_mask, padding, tgt_causal
    (False, "relu", False, None, None, False, False),
    (True, "gelu", True, None, None, False, True),
    (False, "gelu", True, "bool", "float", True, False),
    (True, "relu", False, "float", "bool", True, True),
]


@pytest.mark.parametrize("norm_first,activation,batch_first,tgt_mask,memory_mask,padding,causal", DECODER_CASES)
def test_decoder_layer(norm_first, activation, batch_first, tgt_mask, memory_mask, padding, causal):
    rng = np.random.default_rng(_seed(norm_first, activation, batch_first, tgt_mask, memory_mask, padding, causal))
    torch.manual_seed(11)
    kw = dict(d_model=E, nhead=NHEAD, dim_feedforward=FF, dropout=0.0, activation=activation,
              batch_first=batch_first, norm_first=norm_first)
    m = torch.nn.TransformerDecoderLayer(**kw)
    _randomize_biases(m)
    tgt = _layout(randn(rng, N, L, E), batch_first)
    memory = _layout(randn(rng, N, S, E), batch_first)
    tm, mm = _masks(rng, tgt_mask, L, L), _masks(rng, memory_mask, L, S)
    tkpm, mkpm = (_padding(L), _padding(S)) if padding else (None, None)
    ours = attn.TransformerDecoderLayer(**kw)
    t = lambda a: None if a is None else torch.tensor(a)  # noqa: E731

    def tgt_mask_torch():
        if not causal:
            return t(tm)
        tri = np.triu(np.ones((L, L), dtype=bool), 1)
        if tm is None:
            return torch.tensor(tri)
        return torch.tensor(tm | tri if tm.dtype == bool else np.where(tri, -np.inf, tm).astype(np.float32))

    def fwd_torch(mod, x, mem):
        # is_causal is only a hint in torch (it needs the mask); ours applies it on top of tgt_mask.
        return mod(x, mem, tgt_mask=tgt_mask_torch(), memory_mask=t(mm), tgt_key_padding_mask=t(tkpm),
                   memory_key_padding_mask=t(mkpm), tgt_is_causal=causal and tm is None)

    report = compare(ours, m, [tgt, memory], fwd_torch,
                     lambda l, x, mem: l(x, mem, tgt_mask=tm, memory_mask=mm, tgt_key_padding_mask=tkpm,
                                         memory_key_padding_mask=mkpm, tgt_is_causal=causal))
    assert len(report) == 3 + len(list(m.parameters()))


def _randomize_biases(m):
    """torch initialises the attention biases to 0; nonzero ones test their gradients' slices."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "bias" in name:
                p.copy_(0.1 * torch.randn_like(p))


def test_state_dict_names_match_torch():
    for cls, tcls in ((attn.TransformerEncoderLayer, torch.nn.TransformerEncoderLayer),
                      (attn.TransformerDecoderLayer, torch.nn.TransformerDecoderLayer)):
        for bias in (True, False):
            ours = cls(d_model=8, nhead=2, dim_feedforward=12, bias=bias)
            want = tcls(d_model=8, nhead=2, dim_feedforward=12, bias=bias).state_dict()
            sd = ours.state_dict()
            assert list(sd) == list(want)
            assert all(sd[k].shape == tuple(want[k].shape) for k in want)


def test_errors():
    layer = attn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=12)
    with pytest.raises(attn.AttnError, match="Expected"):
        layer(np.zeros((3, 2, 7), np.float32))  # wrong E
    layer.eval()
    layer(np.zeros((3, 2, 8), np.float32))
    with pytest.raises(attn.AttnError, match="training mode"):
        layer.backward(np.zeros((3, 2, 8), np.float32))
    with pytest.raises(attn.AttnError, match="activation"):
        attn.TransformerEncoderLayer(d_model=8, nhead=2, activation="swish")
    with pytest.raises(attn.AttnError, match="divisible"):
        attn.TransformerEncoderLayer(d_model=8, nhead=3)
