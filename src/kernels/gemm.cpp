// gemm and linear over OpenBLAS's cblas interface.
#include "attn/gemm.h"

#include <cblas.h>


namespace attn {

std::string gemm_kernel() {
  return std::string("OpenBLAS, core ") + openblas_get_corename() + " (" + openblas_get_config() + ")";
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
}

template <typename T>
void linear(View<const T> x, View<const T> w, View<const T> bias, View<T> y) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  ATTN_CHECK(x.rank() == 2 && w.rank() == 2 && w.size(1) == in, "Expected weight of shape (out, ", in,
             ") for input ", to_string(x.shape), ", but got ", to_string(w.shape), " instead");
  ATTN_CHECK(y.rank() == 2 && y.size(0) == n && y.size(1) == out, "Expected output of shape ",
             to_string({n, out}), ", but got ", to_string(y.shape), " instead");
  ATTN_CHECK(bias.empty() || bias.shape == Shape{out}, "Expected bias of shape ", to_string({out}),
             ", but got ", to_string(bias.shape), " instead");
  ATTN_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && w.is_contiguous(),
             "Expected unit column stride for linear, but got input strides ", to_string(x.strides),
             " and output strides ", to_string(y.strides), " instead");
  if (n == 0) return;
  T beta = 0;
  if (!bias.empty()) {
    const int64_t ys = y.stride(0), bs = bias.stride(0);  // hoisted: stride() is an out-of-line call
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < out; ++c) y.data[r * ys + c] = bias.data[c * bs];
    beta = 1;
  }
  gemm(false, true, n, out, in, T(1), x.data, x.stride(0), w.data, in, beta, y.data, y.stride(0));
}

void linear_backward(View<const float> x, View<const float> w, View<const float> dy, View<float> dx,
                     View<float> dw, View<float> db) {
  const int64_t N = x.size(0), in = x.size(1), out = w.size(0);
  ATTN_CHECK(dy.rank() == 2 && dy.size(0) == N && dy.size(1) == out, "Expected dy of shape ", to_string({N, out}),
             " for input ", to_string(x.shape), " and weight ", to_string(w.shape), ", but got ", to_string(dy.shape),
             " instead");
  ATTN_CHECK(x.stride(1) == 1 && dy.stride(1) == 1 && w.is_contiguous() && (dx.empty() || dx.stride(1) == 1),
             "Expected unit column strides for linear_backward, but got x strides ", to_string(x.strides),
             " and dy strides ", to_string(dy.strides), " instead");
  if (!dx.empty()) {  // dx (N, in) = dy (N, out) · W (out, in)
    ATTN_CHECK(dx.shape == Shape({N, in}), "Expected dx of shape ", to_string({N, in}), ", but got ",
               to_string(dx.shape), " instead");
    if (N > 0) gemm(false, false, N, in, out, 1.0f, dy.data, dy.stride(0), w.data, in, 0.0f, dx.data, dx.stride(0));
  }
  if (N == 0) return;
  ATTN_CHECK(dw.shape == w.shape && dw.is_contiguous(), "Expected dw of the weight's shape ", to_string(w.shape),
             ", contiguous, but got ", to_string(dw.shape), " instead");
  gemm(true, false, out, in, N, 1.0f, dy.data, dy.stride(0), x.data, x.stride(0), 1.0f, dw.data, in);  // dW += dyᵀ·x
  if (!db.empty())
    for (int64_t r = 0; r < N; ++r) {  // db += Σ_rows dy, rows in order
      const float* g = dy.data + r * dy.stride(0);
      for (int64_t c = 0; c < out; ++c) db.data[c] += g[c];
    }
}

template void linear(View<const float>, View<const float>, View<const float>, View<float>);
template void linear(View<const double>, View<const double>, View<const double>, View<double>);

}  // namespace attn
