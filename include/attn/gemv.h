// Projections of a few rows (decoding: one token per step): y (M, N) = x (M, K) · W + bias with the
// weight streamed from memory once for all M rows and never packed or copied, where the packed GEMM
// (gemm.h) would copy and transpose the whole weight on every call. Not for many rows: linear() is faster
// there (its panels reuse each weight load across rows).
#pragma once
#include <cstdint>

#include "attn/tensor.h"

namespace attn {

// How a weight matrix is stored: torch.nn.Linear's (out, in), or (in, out) (GPT-2's Conv1D).
enum class WeightLayout { out_in, in_out };

// Rows up to which a pretrained Linear takes linear_rows() instead of the packed GEMM.
inline constexpr int64_t kGemvRows = 4;

// y (M, out) = x (M, in) · op(W) + bias (out, or empty), W (out, in) or (in, out) as `layout` says,
// contiguous; x and y rows may be strided (unit column stride). Deterministic for any thread count and
// on every FMA target:
// - in_out: each element is one FMA chain over k in order, from the bias (or 0): the bits of gemm().
// - out_in: each element is bias + a dot product over 16 virtual lanes (element k in lane k % 16, the
//   lanes added by flash_common.h's fixed tree): other bits than gemm(), the same on every CPU.
void linear_rows(View<const float> x, View<const float> weight, WeightLayout layout, View<const float> bias,
                 View<float> y);
// The same over a weight of bf16 bits (a bf16 model's), widened exactly: the bits of the overload above on
// the widened weight, read at half the bytes.
void linear_rows(View<const float> x, View<const uint16_t> weight, WeightLayout layout, View<const float> bias,
                 View<float> y);

}  // namespace attn
