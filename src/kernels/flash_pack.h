// The target-independent part of the flash kernels' building blocks: the log2-domain constants and
// the packing of K (as Kᵀ panels) and V rows, in fp32 (the bf16 pairs are made from these by
// flash_common.h's PairRowsOf). Plain C++, included by flash_common.h (the SIMD part)
// and by mask.h. Not SIMD, not a kernel.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace attn::flash {

inline constexpr float kLog2e = 1.44269504088896340736f;  // scores live in the log2 domain: exp(x) = exp2(x·log2 e)
inline constexpr float kLn2 = 0.69314718055994530942f;
// The relative error of the bf16 kernels' 2^x (flash_common.h's Exp2<true>): its polynomial's minimax error on
// |f| <= 1/2, 7.48e-5, plus three fp32 roundings of a value below 1.42 (3·2^-24·1.42 < 2.6e-7), rounded up.
inline constexpr double kExp2Bf16Error = 7.6e-5;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Kᵀ panels of rows [0, n) of a (n, D) matrix with strides (rs, cs): ceil(n/N) panels of (D, N).
// Used for K (and, for the backward, V as Vᵀ).
inline void pack_panels(const float* src, int64_t rs, int64_t cs, int64_t n, int64_t D, int64_t N, float* dst) {
  for (int64_t s0 = 0; s0 < n; s0 += N, dst += D * N) {
    const int64_t w = n - s0 < N ? n - s0 : N;
    for (int64_t j = 0; j < w; ++j) {
      const float* row = src + (s0 + j) * rs;
      for (int64_t d = 0; d < D; ++d) dst[d * N + j] = row[d * cs];
    }
    for (int64_t j = w; j < N; ++j)
      for (int64_t d = 0; d < D; ++d) dst[d * N + j] = 0.f;
  }
}

// Rows [0, n) of a (n, cols) matrix with strides (rs, cs) into (n, ld) rows, zero past cols.
inline void pack_rows(const float* src, int64_t rs, int64_t cs, int64_t n, int64_t cols, int64_t ld, float* dst) {
  for (int64_t s = 0; s < n; ++s, dst += ld) {
    const float* row = src + s * rs;
    if (cs == 1)
      std::copy(row, row + cols, dst);
    else
      for (int64_t e = 0; e < cols; ++e) dst[e] = row[e * cs];
    for (int64_t e = cols; e < ld; ++e) dst[e] = 0.f;
  }
}

}  // namespace attn::flash
