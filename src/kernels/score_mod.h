// The score modifications of the flash kernels (forward, backward, decode) on rows of log2-domain scores:
// softcap, then ALiBi and T5's relative bias, then the masks, then -inf outside the keys the query sees,
// SdpaProblem's order (attn/kernels/problem.h, whose score_row is the plain form of the same arithmetic:
// the position biases here add the same float products, so the backward's strided columns, which call
// AddPositionBias, get the forward's bits). Internal to src/kernels; not the masks alone (mask.h) and not
// which tiles are computed (each kernel's loops).
//
// Per-target SIMD part: include after <hwy/highway.h> and flash_common.h in a translation unit that
// re-includes itself through <hwy/foreach_target.h>; it defines attn::flash::HWY_NAMESPACE functions.
#if defined(ATTN_SCORE_MOD_TOGGLE) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_SCORE_MOD_TOGGLE
#undef ATTN_SCORE_MOD_TOGGLE
#else
#define ATTN_SCORE_MOD_TOGGLE
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "attn/kernels/problem.h"
#include "flash_pack.h"
#include "mask.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x[0, n) = f(vector of x[j, j + N), j) a vector at a time; the tail through a padded vector, so every
// element gets the same arithmetic wherever it lies.
template <class F>
HWY_INLINE void ForVectors(float* HWY_RESTRICT x, int64_t n, F&& f) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= n; j += N) hn::StoreU(f(hn::LoadU(d, x + j), j), d, x + j);
  if (j < n) {
    HWY_ALIGN float tail[hn::MaxLanes(d)] = {};
    std::copy(x + j, x + n, tail);
    hn::Store(f(hn::Load(d, tail), j), d, tail);
    std::copy(tail, tail + (n - j), x + j);
  }
}

// x = c·tanh(x/c) on x[0, n), c = softcap·log2(e) (the log2 domain): Highway's Tanh, the same on every FMA target.
HWY_INLINE void SoftcapRow(float* HWY_RESTRICT x, int64_t n, float c) {
  const hn::ScalableTag<float> d;
  const auto vc = hn::Set(d, c);
  ForVectors(x, n, [&](auto v, int64_t) { return hn::Mul(vc, hn::Tanh(d, hn::Div(v, vc))); });
}

// The softcap's derivative beside it: x = c·tanh(x/c) and g = 1 − tanh² (the backward's dScores factor).
HWY_INLINE void SoftcapRowGrad(float* HWY_RESTRICT x, float* HWY_RESTRICT g, int64_t n, float c) {
  const hn::ScalableTag<float> d;
  const auto vc = hn::Set(d, c), one = hn::Set(d, 1.f);
  ForVectors(x, n, [&](auto v, int64_t j) {
    const auto t = hn::Tanh(d, hn::Div(v, vc));
    HWY_ALIGN float gt[hn::MaxLanes(d)];
    hn::Store(hn::NegMulAdd(t, t, one), d, gt);
    std::copy(gt, gt + std::min<int64_t>(hn::Lanes(d), n - j), g + j);
    return hn::Mul(vc, t);
  });
}

// ALiBi's log2-domain factor of head (b, h): -slope·log2(e), rounded once.
inline float AlibiFactor(const SdpaProblem<float>& p, int64_t b, int64_t h) { return -p.alibi_slope(b, h) * kLog2e; }

// x[j] += position bias of keys s0 + j, j < n, of query (b, h, l), all keys of its document: ALiBi's
// c·|d| (d = s - l - (S' - L'), exact as a float) and log2(e)·relative(d).
HWY_INLINE void AddPositionBiasRow(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n,
                                   float* HWY_RESTRICT x) {
  const hn::ScalableTag<float> d;
  const int64_t d0 = p.distance(b, l, s0);
  if (p.alibi) {
    const auto c = hn::Set(d, AlibiFactor(p, b, h));
    ForVectors(x, n, [&](auto v, int64_t j) {
      const auto dist = hn::Add(hn::Iota(d, 0.f), hn::Set(d, float(d0 + j)));  // exact below 2^24
      return hn::Add(v, hn::Mul(c, hn::Abs(dist)));
    });
  }
  if (const float* rel = p.relative_row(h)) {
    const float* r = rel + d0 + p.S - 1;
    const auto log2e = hn::Set(d, kLog2e);
    ForVectors(x, n, [&](auto v, int64_t j) {
      HWY_ALIGN float t[hn::MaxLanes(d)] = {};
      std::copy(r + j, r + std::min<int64_t>(n, j + hn::Lanes(d)), t);
      return hn::Add(v, hn::Mul(log2e, hn::Load(d, t)));
    });
  }
}

// The plain form of AddPositionBiasRow for one element (the backward's strided columns): the same products,
// added in the same order.
inline void AddPositionBias(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, int64_t s, float& x) {
  const int64_t dist = p.distance(b, l, s);
  if (p.alibi) x += AlibiFactor(p, b, h) * float(dist < 0 ? -dist : dist);
  if (const float* rel = p.relative_row(h)) x += kLog2e * rel[dist + p.S - 1];
}

// Row (b, h, l) of raw log2-domain scores (scale·log2(e)·q·k) over keys [s0, s0 + n), padded to npad, to its
// scores: softcapped, position biases and masks added, -inf outside the keys the query sees and on [n, npad).
// Returns whether any entry is not -inf.
HWY_INLINE bool ModScoreRow(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n,
                            int64_t npad, float* HWY_RESTRICT row) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const Range r = VisibleKeys(p, b, l, s0, n);
  std::fill(row, row + r.begin, -kInf);
  std::fill(row + r.end, row + npad, -kInf);
  if (r.end == r.begin) return false;
  float* x = row + r.begin;
  const int64_t m = r.end - r.begin;
  if (p.has_softcap()) SoftcapRow(x, m, float(p.args.softcap) * kLog2e);
  if (p.has_position_bias()) AddPositionBiasRow(p, b, h, l, s0 + r.begin, m, x);
  AddMaskRow(p, b, h, l, s0 + r.begin, m, x, 1);
  return true;
}

}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_SCORE_MOD_TOGGLE
