// The target-independent part of the flash kernels' building blocks: the log2-domain constants and
// the packing of K (as Kᵀ panels) and V rows, in fp32 or as bf16 pairs (pairs.h). Plain C++, included by flash_common.h (the SIMD part)
// and by mask.h. Not SIMD, not a kernel.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "pairs.h"

namespace attn::flash {

inline constexpr float kLog2e = 1.44269504088896340736f;  // scores live in the log2 domain: exp(x) = exp2(x·log2 e)
inline constexpr float kLn2 = 0.69314718055994530942f;

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

// Row s of a (n, cols) matrix with strides (rs, cs), contiguous: in place where cs = 1, else gathered to tmp.
inline const float* contiguous_row(const float* src, int64_t rs, int64_t cs, int64_t s, int64_t cols, float* tmp) {
  const float* row = src + s * rs;
  if (cs == 1) return row;
  for (int64_t e = 0; e < cols; ++e) tmp[e] = row[e * cs];
  return tmp;
}

// bf16 Kᵀ pair panels of rows [0, n) of a (n, D) matrix with strides (rs, cs): ceil(n/N) panels of (D2, N)
// words, D2 = ceil(D/2); word (q, j) holds key j's elements 2q and 2q + 1 (pairs.h; a D past the end 0),
// keys past n are 0.
inline void pack_pair_panels(const float* src, int64_t rs, int64_t cs, int64_t n, int64_t D, int64_t N, uint32_t* dst) {
  const int64_t D2 = (D + 1) / 2;
  std::vector<float> tmp(size_t(cs == 1 ? 0 : D));
  std::vector<uint32_t> words(static_cast<size_t>(D2));
  for (int64_t s0 = 0; s0 < n; s0 += N, dst += D2 * N)
    for (int64_t j = 0; j < N; ++j) {
      if (s0 + j < n) pairs::PairsAlongRow(contiguous_row(src, rs, cs, s0 + j, D, tmp.data()), D2, D, words.data());
      else std::fill(words.begin(), words.end(), 0u);
      for (int64_t q = 0; q < D2; ++q) dst[q * N + j] = words[size_t(q)];
    }
}

// bf16 pair rows of rows [0, n) of a (n, cols) matrix with strides (rs, cs): ceil(n/2) rows of ld words;
// word (q, e) holds rows 2q and 2q + 1 of column e (a row past n 0), zero past cols.
inline void pack_pair_rows(const float* src, int64_t rs, int64_t cs, int64_t n, int64_t cols, int64_t ld, uint32_t* dst) {
  std::vector<float> lo(size_t(cs == 1 ? 0 : cols)), hi(lo.size());
  for (int64_t q = 0; 2 * q < n; ++q, dst += ld) {
    const float* a = contiguous_row(src, rs, cs, 2 * q, cols, lo.data());
    const float* b = 2 * q + 1 < n ? contiguous_row(src, rs, cs, 2 * q + 1, cols, hi.data()) : nullptr;
    pairs::PairsAcrossRows(a, b, cols, dst);
    std::fill(dst + cols, dst + ld, 0u);
  }
}

}  // namespace attn::flash
