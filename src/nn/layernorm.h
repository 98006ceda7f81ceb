// LayerNorm's row kernels (SIMD, one copy per Highway target): forward and backward of rows of F floats,
// optionally fused with the residual add around them. Private to src/nn; layers.cpp splits rows (or, for
// the parameter gradients, features) over threads and calls these.
//
// Numerics, the same on every SIMD target: mean, variance and the backward's two row sums are double
// sums in 8 fixed lanes (element i of a row in lane i % 8, the lanes added 0..7 at the end), so no target
// and no thread count changes a bit; every other operation is the scalar code's, rounded as it was.
#pragma once
#include <cstdint>

namespace attn {

// Rows [r0, r1) of x (N, F) -> y, and xhat / rstd when not null (training). w, b: (F) or null (1, 0).
// add: null, or (N, F) added to x first, the sum written back over x (x = x + add; y = norm(x)).
// rms: RMSNorm instead (mean 0, variance = mean(x²): y = x·rstd·w + b), the same lanes.
void layernorm_forward(int64_t r0, int64_t r1, int64_t F, float* x, const float* add, double eps, const float* w,
                       const float* b, float* y, float* xhat, float* rstd, bool rms = false);
// Rows [r0, r1): dx = rstd · (g - mean(g) - xhat · mean(g · xhat)), g = dy · w, written to dx, or added
// to dx when accumulate (a residual's gradient: dx += that).
void layernorm_backward(int64_t r0, int64_t r1, int64_t F, const float* dy, const float* xhat, const float* rstd,
                        const float* w, float* dx, bool accumulate);
// Features [f0, f1) of the parameter gradients over all N rows, rows in order: dw += Σ dy · xhat (dw not
// null), db += Σ dy (db not null).
void layernorm_param_grads(int64_t f0, int64_t f1, int64_t N, int64_t F, const float* dy, const float* xhat,
                           float* dw, float* db);

}  // namespace attn
