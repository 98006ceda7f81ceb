// The GEMM tests' one harness (as sdpa_harness.h is the SDPA family's): a case (shape, transposes, padding
// of the leading dimensions, alpha, beta), its stored operands with the plain triple loop in any precision
// (the oracle), the error against it and docs/ARCHITECTURE.md's tolerance rule. Used by test_gemm.cpp (fp32,
// fp64) and test_gemm_bf16.cpp (the shapes; its oracle is the bf16 arithmetic's own). Not a benchmark.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/gemm.h"

namespace attn::test {

struct GemmCase {
  int64_t M, N, K;
  bool ta, tb;
  int64_t pad = 0;  // extra elements per row of A, B and C: leading dimensions > the row length
  double alpha = 1, beta = 0;
};

// Stored operands of one product: A is (M, K) or, transposed, (K, M); B is (K, N) or (N, K); C (M, N);
// each row `pad` elements longer than it needs. Entries uniform in [-1, 1].
template <typename T>
struct GemmOperands {
  GemmCase s;
  int64_t lda, ldb, ldc;
  std::vector<T> a, b, c;
  explicit GemmOperands(const GemmCase& sh, uint32_t seed = 1) : s(sh) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> u(-1, 1);
    lda = (s.ta ? s.M : s.K) + s.pad, ldb = (s.tb ? s.K : s.N) + s.pad, ldc = s.N + s.pad;
    a.resize((s.ta ? s.K : s.M) * lda), b.resize((s.tb ? s.N : s.K) * ldb), c.resize(s.M * ldc);
    for (auto* v : {&a, &b, &c})
      for (T& x : *v) x = static_cast<T>(u(gen));
  }
  T A(int64_t i, int64_t k) const { return s.ta ? a[k * lda + i] : a[i * lda + k]; }
  T B(int64_t k, int64_t j) const { return s.tb ? b[j * ldb + k] : b[k * ldb + j]; }
  std::vector<T> run() const {  // attn's gemm on a copy of C
    std::vector<T> out = c;
    gemm(s.ta, s.tb, s.M, s.N, s.K, static_cast<T>(s.alpha), a.data(), lda, b.data(), ldb, static_cast<T>(s.beta),
         out.data(), ldc);
    return out;
  }
  // The plain triple loop in accumulator type Acc: Σ_k in order, then alpha·Σ + beta·C.
  template <typename Acc>
  std::vector<Acc> loop() const {
    std::vector<Acc> out(c.begin(), c.end());
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j) {
        Acc sum = 0;
        for (int64_t k = 0; k < s.K; ++k) sum += static_cast<Acc>(A(i, k)) * static_cast<Acc>(B(k, j));
        Acc& o = out[i * ldc + j];
        o = static_cast<Acc>(s.alpha) * sum + (s.beta == 0 ? Acc(0) : static_cast<Acc>(s.beta) * o);
      }
    return out;
  }
  // |alpha|·Σ_k |A(i,k)·B(k,j)| + |beta·C(i,j)|, the largest over C: the scale rounding errors scale with.
  double magnitude() const {
    double m = 0;
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < s.K; ++k) sum += std::abs(static_cast<double>(A(i, k)) * B(k, j));
        m = std::max(m, std::abs(s.alpha) * sum + std::abs(s.beta * c[i * ldc + j]));
      }
    return m;
  }
};

// Largest |x - ref| over the M x N elements (the padding is compared separately).
template <typename X, typename R>
inline double max_err(const std::vector<X>& x, const std::vector<R>& ref, const GemmCase& s, int64_t ldc) {
  double e = 0;
  for (int64_t i = 0; i < s.M; ++i)
    for (int64_t j = 0; j < s.N; ++j)
      e = std::max(e, std::abs(static_cast<double>(x[i * ldc + j]) - static_cast<double>(ref[i * ldc + j])));
  return e;
}

// Where a case is in a failure message: "M=65 N=7 K=513 ta=1 tb=0 pad=3 alpha=-0.5 beta=2".
inline std::string describe(const GemmCase& s) {
  return "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
         " ta=" + std::to_string(s.ta) + " tb=" + std::to_string(s.tb) + " pad=" + std::to_string(s.pad) +
         " alpha=" + std::to_string(s.alpha) + " beta=" + std::to_string(s.beta);
}

// docs/ARCHITECTURE.md's tolerance rule: the error of attn's fp32 gemm against fp64 at most 2x that of the plain
// fp32 triple loop, plus atol = 4 fp32 ulps of the magnitude: the few roundings of the epilogue (alpha·Σ, beta·C)
// that a short sum (K of 1 or 7) can make the whole error of either side, where 2x of a tiny loop error is 0.
inline void expect_close_to_fp64(const GemmCase& s) {
  const GemmOperands<float> p(s);
  const std::vector<float> got = p.run();
  const std::vector<double> ref = p.loop<double>();
  const double loop_err = max_err(p.loop<float>(), ref, s, p.ldc);
  const double atol = 4 * std::numeric_limits<float>::epsilon() * p.magnitude();
  EXPECT_LE(max_err(got, ref, s, p.ldc), 2 * loop_err + atol)
      << describe(s) << " loop error " << loop_err;
  for (int64_t i = 0; i < s.M; ++i)  // the padding past N in each row of C is never written
    for (int64_t j = s.N; j < p.ldc; ++j) ASSERT_EQ(got[i * p.ldc + j], p.c[i * p.ldc + j]) << i << "," << j;
}

}  // namespace attn::test
