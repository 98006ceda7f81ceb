"""attn.gemm and attn.gemm_bf16 from Python: results against torch, the operand dtypes gemm_bf16 takes
(float32, or bf16 bits as torch's bfloat16 viewed as int16/uint16) giving the same bits, and errors that
name the shapes. The kernels' own bits are tests/test_gemm.cpp's and tests/test_gemm_bf16.cpp's."""
import numpy as np
import pytest
import torch

import attn


def test_gemm_matches_torch_mm_with_transposes_and_beta():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 20), dtype=np.float32)  # op(a) = aᵀ: (20, 37)
    b = rng.standard_normal((11, 37), dtype=np.float32)  # op(b) = bᵀ: (37, 11)
    c = rng.standard_normal((20, 11), dtype=np.float32)
    want = 0.5 * torch.from_numpy(a).t() @ torch.from_numpy(b).t() + 2.0 * torch.from_numpy(c)
    attn.gemm(a, b, c, trans_a=True, trans_b=True, alpha=0.5, beta=2.0)
    np.testing.assert_allclose(c, want.numpy(), rtol=1e-5, atol=1e-5)


def test_gemm_bf16_takes_torch_bfloat16_bits_and_float32_alike():
    rng = np.random.default_rng(1)
    a = torch.from_numpy(rng.standard_normal((33, 70), dtype=np.float32))
    b = torch.from_numpy(rng.standard_normal((70, 45), dtype=np.float32))
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)  # torch rounds to nearest even, as attn packs
    out = {}
    for name, (x, y) in {"bits": (a16.view(torch.int16).numpy(), b16.view(torch.int16).numpy()),
                         "uint16": (a16.view(torch.int16).numpy().view(np.uint16), b16.view(torch.int16).numpy()),
                         "float32": (a.numpy(), b.numpy()),
                         "mixed": (a.numpy(), b16.view(torch.int16).numpy())}.items():
        out[name] = np.empty((33, 45), np.float32)
        attn.gemm_bf16(x, y, out[name])
    for name in out:
        assert out[name].tobytes() == out["bits"].tobytes(), name
    # fp32 sums of exact bf16 products: within K·2^-24 of the fp64 product of the rounded operands
    exact = a16.double() @ b16.double()
    bound = 70 * 2.0**-24 * (a16.double().abs() @ b16.double().abs())
    assert (torch.from_numpy(out["bits"]).double() - exact).abs().le(bound * 1.01).all()


def test_gemm_bf16_errors_name_the_shapes_and_the_dtypes():
    a = np.zeros((4, 5), np.float32)
    with pytest.raises(attn.AttnError, match=r"op\(a\) \(M, K\).*\(4, 5\).*\(6, 3\).*\(4, 3\)"):
        attn.gemm_bf16(a, np.zeros((6, 3), np.float32), np.zeros((4, 3), np.float32))
    with pytest.raises(attn.AttnError, match="a bf16 and b float32"):
        attn.gemm_bf16(a.view(np.int32).astype(np.int16), np.zeros((5, 3), np.float32), np.zeros((4, 3), np.float32))
    with pytest.raises(attn.AttnError, match="dtype float32"):
        attn.gemm_bf16(a, np.zeros((5, 3), np.float32), np.zeros((4, 3), np.float64))
    with pytest.raises(attn.AttnError, match="bf16 c, but got a float32 a"):
        attn.gemm_bf16(a, np.zeros((5, 3), np.float32), np.zeros((4, 3), np.int16))


def test_gemm_bf16_with_a_bf16_c_rounds_the_fp32_result_once_and_tracks_torch_mm():
    rng = np.random.default_rng(2)
    a16 = torch.from_numpy(rng.standard_normal((40, 96), dtype=np.float32)).to(torch.bfloat16)
    b16 = torch.from_numpy(rng.standard_normal((50, 96), dtype=np.float32)).to(torch.bfloat16)  # op(b) = bᵀ
    c16 = torch.from_numpy(rng.standard_normal((40, 50), dtype=np.float32)).to(torch.bfloat16)
    bits = lambda t: t.view(torch.int16).numpy()
    out16 = bits(c16).copy()
    attn.gemm_bf16(bits(a16), bits(b16), out16, trans_b=True, beta=0.5)
    out32 = c16.float().numpy().copy()  # the same product into fp32 C, from C widened
    attn.gemm_bf16(bits(a16), bits(b16), out32, trans_b=True, beta=0.5)
    assert out16.tobytes() == bits(torch.from_numpy(out32).to(torch.bfloat16)).tobytes()
    # torch.mm on bfloat16 tensors (its own summation order): within a bf16 rounding of each other
    want = (a16 @ b16.t() + 0.5 * c16).float()
    got = torch.from_numpy(out16).view(torch.bfloat16).float()
    assert (got - want).abs().le(2.0**-7 * want.abs() + 1e-2).all()
