// 16 x 16 transposes of 32-bit elements in AVX-512 registers: the backward's Qᵀ and dOᵀ panels and dS's
// rows for AMX (flash_backward.cpp), a transposed A's AMX tiles (gemm_bf16.cpp), a transposed B's panels
// (gemm.cpp); 8 x 8 in AVX2's for the last. Per-target header: include it after <hwy/highway.h> in a
// translation unit that re-includes itself through <hwy/foreach_target.h>; it defines
// attn::transpose::HWY_NAMESPACE, empty on targets without AVX-512 or AVX2.
#include "../core/hwy_targets.h"  // ATTN_AVX512_TARGET

#if defined(ATTN_TRANSPOSE16_TOGGLE) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_TRANSPOSE16_TOGGLE
#undef ATTN_TRANSPOSE16_TOGGLE
#else
#define ATTN_TRANSPOSE16_TOGGLE
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::transpose::HWY_NAMESPACE {

#if ATTN_AVX512_TARGET(HWY_TARGET)
// (16, wc) floats at src (rows rs apart; rows past nr read as 0) transposed into rows [0, wc) of a (16, 16)
// block at dst (rows ld apart: a panel's 16), times mul: unpack pairs, then quads, then 128-bit lanes twice.
// With mul 1 the bits move unchanged (pair words too).
HWY_INLINE void Transpose16(const float* src, int64_t rs, int64_t nr, int64_t wc, float mul, float* dst,
                            int64_t ld = 16) {
  const __mmask16 cols = static_cast<__mmask16>((1u << wc) - 1);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = i < nr ? _mm512_maskz_loadu_ps(cols, src + i * rs) : _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  auto lo = [](__m512 x, __m512 y) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
  };
  auto hi = [](__m512 x, __m512 y) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
  };
  for (int i = 0; i < 4; ++i) {  // r[4i + k], lane L: rows 4i..4i+3 of column 4L + k
    r[4 * i] = lo(t[4 * i], t[4 * i + 2]), r[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]), r[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
  }
  const __m512 m = _mm512_set1_ps(mul);
  for (int k = 0; k < 4; ++k) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x44), u1 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x44);
    const __m512 u2 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xEE), u3 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xEE);
    const __m512 col[4] = {_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD),
                           _mm512_shuffle_f32x4(u2, u3, 0x88), _mm512_shuffle_f32x4(u2, u3, 0xDD)};
    for (int L = 0; L < 4; ++L)
      if (4 * L + k < wc) _mm512_storeu_ps(dst + (4 * L + k) * ld, mul == 1.f ? col[L] : _mm512_mul_ps(col[L], m));
  }
}
#endif

#if HWY_TARGET == HWY_AVX2
// (8, 8) floats at src (rows rs apart) transposed into (8, 8) at dst (rows ld apart): pairs, then quads
// interleaved within the 128-bit halves, then the halves.
HWY_INLINE void Transpose8(const float* src, int64_t rs, float* dst, int64_t ld) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::Full256<float> d;
  const hn::Repartition<double, decltype(d)> d64;
  using V = hn::Vec<decltype(d)>;
  V r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = hn::LoadU(d, src + i * rs);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = hn::InterleaveLower(d, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = hn::InterleaveUpper(d, r[2 * i], r[2 * i + 1]);
  }
  const auto lo = [&](V x, V y) {
    return hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, x), hn::BitCast(d64, y)));
  };
  const auto hi = [&](V x, V y) {
    return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, x), hn::BitCast(d64, y)));
  };
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3: r[4h + c] holds column c | column c + 4 of them
    const V* u = t + 4 * h;
    r[4 * h] = lo(u[0], u[2]), r[4 * h + 1] = hi(u[0], u[2]);
    r[4 * h + 2] = lo(u[1], u[3]), r[4 * h + 3] = hi(u[1], u[3]);
  }
  for (int c = 0; c < 4; ++c) {
    hn::StoreU(hn::ConcatLowerLower(d, r[4 + c], r[c]), d, dst + c * ld);
    hn::StoreU(hn::ConcatUpperUpper(d, r[4 + c], r[c]), d, dst + (c + 4) * ld);
  }
}
#endif

}  // namespace attn::transpose::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_TRANSPOSE16_TOGGLE
