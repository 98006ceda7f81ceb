// Dense matrix products, row-major, for projections (Linear, MHA in/out projections, the LM head):
// attn's own packed GEMM, its SIMD target chosen from the CPU when the program runs, the same bits for
// any thread count. Not for the attention inner loops: those use the flash kernel's own microkernels.
#pragma once
#include <cstdint>
#include <string>

#include "attn/tensor.h"

namespace attn {

// C (M, N) = alpha · op(A) (M, K) · op(B) (K, N) + beta · C, row-major with leading dimensions; op =
// transpose if set. beta == 0: C is not read (it may hold NaN). Bitwise the same for any thread count.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// Which GEMM runs, for `attn info`: "attn packed GEMM, AVX3 6x64 (float), 6x32 (double), max KC ...".
// Changes with the SIMD target Highway chooses.
std::string gemm_kernel();

// y (N, out) = x (N, in) · Wᵀ (in, out) + bias (out): torch.nn.functional.linear. x and y may have
// any row stride (a column slice of a wider matrix) but unit column stride; bias may be empty.
template <typename T>
void linear(View<const T> x, View<const T> weight, View<const T> bias, View<T> y);

// Backward of linear: dx (N, in) = dy · W (overwritten; skipped if empty), dw (out, in) += dyᵀ · x,
// db (out) += column sums of dy (skipped if empty). Rows of x, dy and dx may be strided.
void linear_backward(View<const float> x, View<const float> weight, View<const float> dy, View<float> dx,
                     View<float> dw, View<float> db);

}  // namespace attn
