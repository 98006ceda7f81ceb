// The AdamW update, vectorized with Highway. Bit-identical to the scalar loop it replaced (and to
// torch.optim.AdamW's float32 arithmetic): every operation is a separately rounded IEEE mul, add, sub,
// div or sqrt, in torch's order. For that attn is compiled with -ffp-contract=off (CMakeLists.txt):
// GCC would otherwise fuse a Mul and an Add into one FMA, which rounds once and changes the bits.
// The tail runs through a padded buffer with the same vector code, so no element takes another path.
#include "adamw_update.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/train/adamw_update.cpp"  // found through include/
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::adamw::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void Update(int64_t n, float* theta, const float* g, float* m, float* v, const AdamWScalars& s) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V decay = hn::Set(d, s.decay), w1 = hn::Set(d, s.w1), b2 = hn::Set(d, s.b2), w2 = hn::Set(d, s.w2),
          bc2 = hn::Set(d, s.bc2_sqrt), eps = hn::Set(d, s.eps), neg_step = hn::Set(d, -s.step_size),
          scale = hn::Set(d, s.grad_scale);
  // One vector of elements: loads, the update, stores.
  auto one = [&](float* th, const float* gr, float* mm, float* vv) {
    const V gi = hn::Mul(hn::LoadU(d, gr), scale);                        // clip_grad_norm's g *= c
    const V t = hn::Mul(hn::LoadU(d, th), decay);                          // param.mul_(1 - lr·wd)
    V mi = hn::LoadU(d, mm);
    mi = hn::Add(mi, hn::Mul(w1, hn::Sub(gi, mi)));                        // exp_avg.lerp_(g, 1 - β1)
    const V vi = hn::Add(hn::Mul(hn::LoadU(d, vv), b2), hn::Mul(hn::Mul(w2, gi), gi));  // mul_(β2).addcmul_
    const V denom = hn::Add(hn::Div(hn::Sqrt(vi), bc2), eps);              // (sqrt(v) / sqrt(bc2)).add_(eps)
    hn::StoreU(hn::Add(t, hn::Div(hn::Mul(neg_step, mi), denom)), d, th);  // addcdiv_(m, denom, -step_size)
    hn::StoreU(mi, d, mm);
    hn::StoreU(vi, d, vv);
  };
  const int64_t N = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) one(theta + i, g + i, m + i, v + i);
  if (i == n) return;
  HWY_ALIGN float bt[HWY_MAX_BYTES / 4] = {}, bg[HWY_MAX_BYTES / 4] = {}, bm[HWY_MAX_BYTES / 4] = {},
                  bv[HWY_MAX_BYTES / 4] = {};
  for (int64_t j = 0; i + j < n; ++j) bt[j] = theta[i + j], bg[j] = g[i + j], bm[j] = m[i + j], bv[j] = v[i + j];
  one(bt, bg, bm, bv);  // padding lanes compute on zeros (0/eps, no traps) and are dropped
  for (int64_t j = 0; i + j < n; ++j) theta[i + j] = bt[j], m[i + j] = bm[j], v[i + j] = bv[j];
}

}  // namespace attn::adamw::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace adamw {
HWY_EXPORT(Update);
}  // namespace adamw

void adamw_update(int64_t n, float* theta, const float* g, float* m, float* v, const AdamWScalars& s) {
  HWY_DYNAMIC_DISPATCH(adamw::Update)(n, theta, g, m, v, s);
}

}  // namespace attn
#endif
