// Dropout of the flash kernels: the one function, DropRow, by which the flash forward and the flash
// backward zero the dropped weights, so both see the same mask on every element. Internal to
// src/kernels. The keep bit of (b, h, l, s) and the keep scale are SdpaProblem's (attn/kernels/problem.h),
// which the reference kernels call too. Not the keep scale's application: the forward folds it into
// the final normalisation, the backward multiplies P and dP by keep·keep_scale.
#pragma once
#include <cstdint>

#include "attn/kernels/problem.h"

namespace attn::flash {

// Weights (b, h, l, s0 + j), j < n, in x[j·stride]: zero the dropped ones. Forward: P rows, stride 1.
// Backward: a query column of the transposed keep tile (keys, queries).
inline void DropRow(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n,
                    int64_t stride, float* x) {
  for (int64_t j = 0; j < n; ++j)
    if (!p.kept(b, h, l, s0 + j)) x[j * stride] = 0.f;
}

}  // namespace attn::flash
