// bf16 pairs: the operand layout of AMX's TDPBF16PS and AVX512_BF16's VDPBF16PS, shared by the bf16 GEMM
// (gemm_bf16.cpp) and the bf16 flash kernels. A 32-bit word holds two bf16 of consecutive k: k = 2q in
// the low half, 2q + 1 in the high half (VDPBF16PS's chain words: ChainRows). fp32 is rounded to bf16 by
// to_half (half_kv.h: round to nearest even, the rounding of every fp32 -> bf16 conversion in attn).
// Plain C++, not SIMD: register_block.h's GroupBlock and amx.h multiply the pairs.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attn/kernels/half_kv.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>  // _mm_getcsr / _mm_setcsr: DAZ and FTZ for the emulation
#endif

namespace attn::pairs {

// MXCSR with DAZ (bit 6) and FTZ (bit 15) set while alive, where asked: fp32 arithmetic then flushes as
// VDPBF16PS does (its emulations need it). Per thread: set inside each parallel body.
class FlushSubnormals {
 public:
  explicit FlushSubnormals(bool on) {
#if defined(__x86_64__) || defined(__i386__)
    if (on) saved_ = _mm_getcsr(), _mm_setcsr(saved_ | 0x8040u), on_ = true;
#else
    (void)on;
#endif
  }
  ~FlushSubnormals() {
#if defined(__x86_64__) || defined(__i386__)
    if (on_) _mm_setcsr(saved_);
#endif
  }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_ = 0;
  bool on_ = false;
};

// n elements of a row as bf16 bits: fp32 rounded, bf16 copied.
inline void Row16(const float* src, int64_t n, uint16_t* dst) { to_half(KvDtype::bf16, src, n, dst); }
inline void Row16(const uint16_t* src, int64_t n, uint16_t* dst) { std::memcpy(dst, src, size_t(n) * 2); }

inline constexpr int64_t kRun = 512;  // elements converted at a time (a stack buffer)

// The pair words of a row where k runs along it: `pairs` words from src's first min(2·pairs, valid)
// elements, a k past `valid` zero: out[q] = bf16(src[2q]) | bf16(src[2q + 1]) << 16. Any length.
template <typename S>
inline void PairsAlongRow(const S* src, int64_t pairs, int64_t valid, uint32_t* out) {
  uint16_t halves[kRun];
  for (int64_t q0 = 0; q0 < pairs; q0 += kRun / 2, src += kRun, valid -= kRun, out += kRun / 2) {
    const int64_t qn = std::min(kRun / 2, pairs - q0), n = std::clamp<int64_t>(valid, 0, 2 * qn);
    Row16(src, n, halves);
    std::fill(halves + n, halves + 2 * qn, uint16_t(0));
    std::memcpy(out, halves, size_t(qn) * sizeof(uint32_t));  // little-endian: element 2q is word q's low half
  }
}

// Pair rows 2s and 2s + 1 (n words each, `stride` apart) as CHAIN words (register_block.h's GroupBlock on
// VDPBF16PS): row 2s the even k's (k = 4s in the high half, 4s + 2 in the low), row 2s + 1 the odd k's, so
// VDPBF16PS, which adds the high product first, steps one chain through both. With stride 1 and n 1, the
// words along a row. An odd last row stays as it is (the caller pads to whole groups).
inline void ChainRows(uint32_t* __restrict p, int64_t rows, int64_t stride, int64_t n) {
  for (int64_t s = 0; s + 1 < rows; s += 2) {
    uint32_t* __restrict r0 = p + s * stride;
    uint32_t* __restrict r1 = r0 + stride;
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t w0 = r0[j], w1 = r1[j];
      r0[j] = (w0 << 16) | (w1 & 0xFFFFu);
      r1[j] = (w0 & 0xFFFF0000u) | (w1 >> 16);
    }
  }
}

}  // namespace attn::pairs
