// LayerNorm's row kernels, vectorized with Highway (AVX-512, AVX2, SSE4 or scalar, chosen when the program
// runs): forward (with the residual add before it fused in), backward (with the residual's gradient add
// fused in) and the parameter gradients. The double sums run in 8 fixed lanes (layernorm.h), so the bits
// are the same on every target; everything else is the scalar loop's arithmetic, operation for operation
// (attn is built with -ffp-contract=off: no Mul and Add is fused into an FMA). Not the layer: layers.cpp.
#include "layernorm.h"

#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/nn/layernorm.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::layernorm::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D64 = hn::CappedTag<double, 8>;  // up to 8 double lanes
using DH = hn::Rebind<float, D64>;     // as many float lanes, promoted to D64
constexpr int64_t kL = int64_t(hn::MaxLanes(D64()));  // fixed per x86 target: 8, 4, 2 or 1
constexpr int64_t kK = 8 / kL;                        // vectors that make up the 8 lanes

// S row sums at once, each as 8 fixed lanes: element i goes to lane i % 8 (vectors for i < F/8·8, then
// the scalar tail), the lanes added 0..7 at the end. vt(i, t): the S terms of elements [i, i + kL) as
// vectors; st(i, t): those of element i as doubles, the same operations.
template <int S, class VecTerms, class ScalarTerms>
HWY_INLINE void RowSums(int64_t F, VecTerms vt, ScalarTerms st, double* out) {
  const D64 d;
  hn::Vec<D64> acc[S][kK];
  for (int s = 0; s < S; ++s)
    for (int64_t k = 0; k < kK; ++k) acc[s][k] = hn::Zero(d);
  int64_t i = 0;
  for (; i + 8 <= F; i += 8)
    for (int64_t k = 0; k < kK; ++k) {
      hn::Vec<D64> t[S];
      vt(i + k * kL, t);
      for (int s = 0; s < S; ++s) acc[s][k] = hn::Add(acc[s][k], t[s]);
    }
  HWY_ALIGN double lane[S][8];
  for (int s = 0; s < S; ++s)
    for (int64_t k = 0; k < kK; ++k) hn::Store(acc[s][k], d, lane[s] + k * kL);
  for (; i < F; ++i) {
    double t[S];
    st(i, t);
    for (int s = 0; s < S; ++s) lane[s][i % 8] += t[s];
  }
  for (int s = 0; s < S; ++s) {
    out[s] = 0;
    for (double l : lane[s]) out[s] += l;
  }
}

void Forward(int64_t r0, int64_t r1, int64_t F, float* x, const float* add, double eps, const float* w,
             const float* b, float* y, float* xhat, float* rstd_out, bool rms) {
  const D64 d;
  const DH dh;
  const hn::ScalableTag<float> df;
  const int64_t NF = int64_t(hn::Lanes(df));
  for (int64_t r = r0; r < r1; ++r) {
    float* xr = x + r * F;
    const float* ar = add ? add + r * F : nullptr;
    float* yr = y + r * F;
    float* hr = xhat ? xhat + r * F : nullptr;
    // Two passes in double: mean (x = x + add on the way), then the biased variance of (x - mean), as
    // PyTorch computes it. RMSNorm: one pass, the mean of x² (mean 0, so h = (x - 0)·rstd = x·rstd).
    double mean = 0, var;
    RowSums<1>(
        F,
        [&](int64_t i, hn::Vec<D64>* t) {
          auto v = hn::LoadU(dh, xr + i);
          if (ar) {
            v = hn::Add(v, hn::LoadU(dh, ar + i));
            hn::StoreU(v, dh, xr + i);
          }
          t[0] = hn::PromoteTo(d, v);
          if (rms) t[0] = hn::Mul(t[0], t[0]);
        },
        [&](int64_t i, double* t) {
          if (ar) xr[i] += ar[i];
          t[0] = rms ? double(xr[i]) * xr[i] : xr[i];
        },
        rms ? &var : &mean);
    if (!rms) {
      mean /= double(F);
      const auto vmean = hn::Set(d, mean);
      RowSums<1>(
          F,
          [&](int64_t i, hn::Vec<D64>* t) {
            const auto c = hn::Sub(hn::PromoteTo(d, hn::LoadU(dh, xr + i)), vmean);
            t[0] = hn::Mul(c, c);
          },
          [&](int64_t i, double* t) { t[0] = (xr[i] - mean) * (xr[i] - mean); }, &var);
    }
    const float rstd = float(1.0 / std::sqrt(var / double(F) + eps)), m = float(mean);
    if (rstd_out) rstd_out[r] = rstd;
    // h = (x - m)·rstd; y = h·w + b, w = 1 and b = 0 when absent (h·1 + 0, as the scalar loop rounded it)
    const auto vm = hn::Set(df, m), vr = hn::Set(df, rstd), one = hn::Set(df, 1.0f), zero = hn::Zero(df);
    int64_t i = 0;
    for (; i + NF <= F; i += NF) {
      const auto h = hn::Mul(hn::Sub(hn::LoadU(df, xr + i), vm), vr);
      if (hr) hn::StoreU(h, df, hr + i);
      hn::StoreU(hn::Add(hn::Mul(h, w ? hn::LoadU(df, w + i) : one), b ? hn::LoadU(df, b + i) : zero), df, yr + i);
    }
    for (; i < F; ++i) {
      const float h = (xr[i] - m) * rstd;
      if (hr) hr[i] = h;
      yr[i] = h * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
  }
}

void Backward(int64_t r0, int64_t r1, int64_t F, const float* dy, const float* xhat, const float* rstd,
              const float* w, float* dx, bool accumulate) {
  const D64 d;
  const DH dh;
  for (int64_t r = r0; r < r1; ++r) {
    const float* g = dy + r * F;
    const float* h = xhat + r * F;
    float* dxr = dx + r * F;
    // mg = mean(g·w), mgh = mean(g·w·xhat); g·w in double (exact: a product of two floats)
    double sums[2];
    RowSums<2>(
        F,
        [&](int64_t i, hn::Vec<D64>* t) {
          auto gi = hn::PromoteTo(d, hn::LoadU(dh, g + i));
          if (w) gi = hn::Mul(gi, hn::PromoteTo(d, hn::LoadU(dh, w + i)));
          t[0] = gi;
          t[1] = hn::Mul(gi, hn::PromoteTo(d, hn::LoadU(dh, h + i)));
        },
        [&](int64_t i, double* t) {
          const double gi = double(g[i]) * (w ? w[i] : 1.0f);
          t[0] = gi;
          t[1] = gi * h[i];
        },
        sums);
    const double mg = sums[0] / double(F), mgh = sums[1] / double(F);
    const float rs = rstd[r];
    // dx = rstd · float(float(g·w) - mg - xhat·mgh): the float product, the rest in double
    const auto vmg = hn::Set(d, mg), vmgh = hn::Set(d, mgh);
    const auto vrs = hn::Set(dh, rs);
    int64_t i = 0;
    for (; i + kL <= F; i += kL) {
      auto gw = hn::LoadU(dh, g + i);
      if (w) gw = hn::Mul(gw, hn::LoadU(dh, w + i));
      const auto t = hn::Sub(hn::Sub(hn::PromoteTo(d, gw), vmg), hn::Mul(hn::PromoteTo(d, hn::LoadU(dh, h + i)), vmgh));
      auto o = hn::Mul(vrs, hn::DemoteTo(dh, t));
      if (accumulate) o = hn::Add(hn::LoadU(dh, dxr + i), o);
      hn::StoreU(o, dh, dxr + i);
    }
    for (; i < F; ++i) {
      const float o = rs * float(g[i] * (w ? w[i] : 1.0f) - mg - h[i] * mgh);
      dxr[i] = accumulate ? dxr[i] + o : o;
    }
  }
}

void ParamGrads(int64_t f0, int64_t f1, int64_t N, int64_t F, const float* dy, const float* xhat, float* dw,
                float* db) {
  const hn::ScalableTag<float> df;
  const int64_t NF = int64_t(hn::Lanes(df));
  int64_t f = f0;
  for (; f + NF <= f1; f += NF) {  // a vector of features, its sums in registers over the rows in order
    auto aw = dw ? hn::LoadU(df, dw + f) : hn::Zero(df), ab = db ? hn::LoadU(df, db + f) : hn::Zero(df);
    for (int64_t r = 0; r < N; ++r) {
      const auto g = hn::LoadU(df, dy + r * F + f);
      if (dw) aw = hn::Add(aw, hn::Mul(g, hn::LoadU(df, xhat + r * F + f)));
      if (db) ab = hn::Add(ab, g);
    }
    if (dw) hn::StoreU(aw, df, dw + f);
    if (db) hn::StoreU(ab, df, db + f);
  }
  for (; f < f1; ++f)
    for (int64_t r = 0; r < N; ++r) {
      if (dw) dw[f] += dy[r * F + f] * xhat[r * F + f];
      if (db) db[f] += dy[r * F + f];
    }
}

}  // namespace attn::layernorm::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace layernorm {
HWY_EXPORT(Forward);
HWY_EXPORT(Backward);
HWY_EXPORT(ParamGrads);
}  // namespace layernorm

void layernorm_forward(int64_t r0, int64_t r1, int64_t F, float* x, const float* add, double eps, const float* w,
                       const float* b, float* y, float* xhat, float* rstd, bool rms) {
  HWY_DYNAMIC_DISPATCH(layernorm::Forward)(r0, r1, F, x, add, eps, w, b, y, xhat, rstd, rms);
}
void layernorm_backward(int64_t r0, int64_t r1, int64_t F, const float* dy, const float* xhat, const float* rstd,
                        const float* w, float* dx, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(layernorm::Backward)(r0, r1, F, dy, xhat, rstd, w, dx, accumulate);
}
void layernorm_param_grads(int64_t f0, int64_t f1, int64_t N, int64_t F, const float* dy, const float* xhat,
                           float* dw, float* db) {
  HWY_DYNAMIC_DISPATCH(layernorm::ParamGrads)(f0, f1, N, F, dy, xhat, dw, db);
}

}  // namespace attn
#endif
