// GELU forward and backward, vectorized with Highway (AVX-512, AVX2, SSE4 or scalar, chosen when the
// program runs). Exact form: gelu(x) = x·Φ(x) with Φ(x) = erfc(-x/√2)/2 and erfc(z) = t·exp(-z² + P(t)),
// t = 1/(1 + z/2), z >= 0 (Numerical Recipes' erfcc: fractional error < 1.2e-7 for every z, so Φ keeps
// float accuracy in both tails, where 1 + erf(x) would cancel). Not a general math library. Highway's Exp and
// Tanh inline (their Call* wrappers are calls per vector, which spill the live vectors around each: a tenth of
// a nanoGPT training step was the exp's; inlined, GELU forward+backward ran 1.30x faster, the same bits).
#include "gelu.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/nn/gelu.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::gelu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr float kSqrt1_2 = 0.70710678118654752f;     // 1/√2
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/√(2π)
constexpr float kSqrt2OverPi = 0.79788456080286536f; // √(2/π)
constexpr float kTanhCoef = 0.044715f;

// Φ(x), the standard normal CDF.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Phi(D d, V x) {
  const V z = hn::Abs(hn::Mul(x, hn::Set(d, kSqrt1_2)));
  const V t = hn::Div(hn::Set(d, 1.0f), hn::MulAdd(z, hn::Set(d, 0.5f), hn::Set(d, 1.0f)));
  // P(t) by Horner, innermost coefficient first.
  const float c[] = {0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
                     -0.18628806f, 0.09678418f, 0.37409196f, 1.00002368f, -1.26551223f};
  V p = hn::Set(d, c[0]);
  for (int i = 1; i < 10; ++i) p = hn::MulAdd(p, t, hn::Set(d, c[i]));
  const V half_erfc = hn::Mul(hn::Set(d, 0.5f), hn::Mul(t, hn::Exp(d, hn::NegMulAdd(z, z, p))));  // erfc(|x|/√2)/2
  // x < 0: Φ = erfc(|x|/√2)/2; else Φ = 1 - erfc(|x|/√2)/2
  return hn::IfThenElse(hn::Lt(x, hn::Zero(d)), half_erfc, hn::Sub(hn::Set(d, 1.0f), half_erfc));
}

// tanh(√(2/π)·(x + 0.044715·x³))
template <class D, class V = hn::Vec<D>>
HWY_INLINE V TanhArg(D d, V x) {
  const V x3 = hn::Mul(hn::Mul(x, x), x);
  return hn::Tanh(d, hn::Mul(hn::Set(d, kSqrt2OverPi), hn::MulAdd(hn::Set(d, kTanhCoef), x3, x)));
}

// f(d, x) on full vectors, then on the tail through a zero-padded buffer.
template <class F>
HWY_INLINE void ForEach(int64_t n, const float* a, const float* b, float* out, F f) {
  const hn::ScalableTag<float> d;
  const int64_t N = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(f(d, hn::LoadU(d, a + i), b ? hn::LoadU(d, b + i) : hn::Zero(d)), d, out + i);
  if (i == n) return;
  HWY_ALIGN float ta[HWY_MAX_BYTES / 4], tb[HWY_MAX_BYTES / 4], to[HWY_MAX_BYTES / 4];
  for (int64_t j = 0; j < N; ++j) ta[j] = i + j < n ? a[i + j] : 0.0f, tb[j] = b && i + j < n ? b[i + j] : 0.0f;
  hn::Store(f(d, hn::Load(d, ta), hn::Load(d, tb)), d, to);
  for (int64_t j = 0; i + j < n; ++j) out[i + j] = to[j];
}

void Forward(const float* x, float* y, int64_t n, bool approx_tanh) {
  if (approx_tanh)  // 0.5·x·(1 + tanh(...))
    ForEach(n, x, nullptr, y, [](auto d, auto v, auto) {
      return hn::Mul(hn::Mul(hn::Set(d, 0.5f), v), hn::Add(hn::Set(d, 1.0f), TanhArg(d, v)));
    });
  else  // x·Φ(x)
    ForEach(n, x, nullptr, y, [](auto d, auto v, auto) { return hn::Mul(v, Phi(d, v)); });
}

void Backward(const float* x, const float* dy, float* dx, int64_t n, bool approx_tanh) {
  if (approx_tanh)  // 0.5·(1 + t) + 0.5·x·(1 - t²)·√(2/π)·(1 + 3·0.044715·x²)
    ForEach(n, x, dy, dx, [](auto d, auto v, auto g) {
      const auto t = TanhArg(d, v), half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f);
      const auto inner = hn::Mul(hn::Set(d, kSqrt2OverPi), hn::MulAdd(hn::Set(d, 3 * kTanhCoef), hn::Mul(v, v), one));
      const auto dt = hn::Mul(hn::Mul(half, v), hn::Mul(hn::NegMulAdd(t, t, one), inner));
      return hn::Mul(g, hn::Add(hn::Mul(half, hn::Add(one, t)), dt));
    });
  else  // Φ(x) + x·φ(x), φ(x) = exp(-x²/2)/√(2π)
    ForEach(n, x, dy, dx, [](auto d, auto v, auto g) {
      const auto pdf = hn::Mul(hn::Set(d, kInvSqrt2Pi), hn::Exp(d, hn::Mul(hn::Set(d, -0.5f), hn::Mul(v, v))));
      return hn::Mul(g, hn::MulAdd(v, pdf, Phi(d, v)));
    });
}

}  // namespace attn::gelu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace gelu {
HWY_EXPORT(Forward);
HWY_EXPORT(Backward);
}  // namespace gelu

void gelu_forward(const float* x, float* y, int64_t n, bool approx_tanh) {
  HWY_DYNAMIC_DISPATCH(gelu::Forward)(x, y, n, approx_tanh);
}
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool approx_tanh) {
  HWY_DYNAMIC_DISPATCH(gelu::Backward)(x, dy, dx, n, approx_tanh);
}

}  // namespace attn
#endif
