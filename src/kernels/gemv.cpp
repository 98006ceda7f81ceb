// linear_rows (gemv.h): few-row projections that stream the weight once, vectorized with Highway (one copy
// per target, chosen when the program runs). Columns (in_out) or output rows (out_in) are split over
// threads; no summed dimension is ever split. Not the packed GEMM (gemm.cpp).
#include "attn/gemv.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "attn/check.h"
#include "attn/threads.h"

#ifndef ATTN_GEMV_ONCE
#define ATTN_GEMV_ONCE
namespace attn::gemv_detail {
// One product: x (M, K) rows ldx apart, the weight, bias (N) or null, y (M, N) rows ldy apart.
struct Args {
  const float* x;
  int64_t ldx;
  const void* w;  // float, or bf16 bits (uint16_t) where w16
  bool w16;
  const float* bias;
  float* y;
  int64_t ldy;
  int64_t M, K, N;
};

}  // namespace attn::gemv_detail
#endif  // ATTN_GEMV_ONCE

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/gemv.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "flash_common.h"  // SumLanes, kSumVecs: the fixed 16-lane sum

HWY_BEFORE_NAMESPACE();
namespace attn::gemv_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace fl = attn::flash::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// A vector of W's elements as fp32: as stored, or bf16 widened (exact: its bits in the high half).
HWY_INLINE hn::Vec<DF> LoadW(DF d, const float* p) { return hn::LoadU(d, p); }
HWY_INLINE hn::Vec<DF> LoadW(DF d, const uint16_t* p) {
  const hn::RebindToUnsigned<DF> du;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint16_t, DF>(), p))));
}
inline float WidenW(float w) { return w; }
inline float WidenW(uint16_t w) {
  const uint32_t u = uint32_t(w) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// in_out: columns [j0, j1) of y (M, N) = x (M, K) · W (K, N): y = bias; for k in order: y = fma(x_k, W_k, y).
// KB rows of W at a time (KB streams, each a contiguous segment of its row; y's segment loaded and stored
// once per KB terms, in L1), the terms of each element still added k = 0, 1, ... in order.
template <int KB, typename W>
HWY_INLINE void RowsBlock(const Args& g, int64_t k0, int64_t j0, int64_t j1) {
  const DF d;
  const hn::CappedTag<float, 1> d1;  // the tail, one lane at a time: still an FMA
  const int64_t NL = int64_t(hn::Lanes(d)), full = j0 + (j1 - j0) / NL * NL;
  const W* w = static_cast<const W*>(g.w) + k0 * g.N;
  for (int64_t m = 0; m < g.M; ++m) {
    float* y = g.y + m * g.ldy;
    const float* x = g.x + m * g.ldx + k0;
    hn::Vec<decltype(d)> a[KB];
#pragma GCC unroll 16
    for (int i = 0; i < KB; ++i) a[i] = hn::Set(d, x[i]);
    int64_t j = j0;
    for (; j < full; j += NL) {
      auto acc = hn::LoadU(d, y + j);
#pragma GCC unroll 16
      for (int i = 0; i < KB; ++i) acc = hn::MulAdd(a[i], LoadW(d, w + i * g.N + j), acc);
      hn::StoreU(acc, d, y + j);
    }
    for (; j < j1; ++j) {
      auto acc = hn::LoadU(d1, y + j);
      for (int i = 0; i < KB; ++i) acc = hn::MulAdd(hn::Set(d1, x[i]), hn::Set(d1, WidenW(w[i * g.N + j])), acc);
      hn::StoreU(acc, d1, y + j);
    }
  }
}

template <typename W>
void ColumnsInOutOf(const Args& g, int64_t j0, int64_t j1) {
  for (int64_t m = 0; m < g.M; ++m) {
    float* y = g.y + m * g.ldy;
    for (int64_t j = j0; j < j1; ++j) y[j] = g.bias ? g.bias[j] : 0.0f;
  }
  constexpr int kKB = 8;
  int64_t k = 0;
  for (; k + kKB <= g.K; k += kKB) RowsBlock<kKB, W>(g, k, j0, j1);
  for (; k < g.K; ++k) RowsBlock<1, W>(g, k, j0, j1);
}
void ColumnsInOut(const Args& g, int64_t j0, int64_t j1) {
  g.w16 ? ColumnsInOutOf<uint16_t>(g, j0, j1) : ColumnsInOutOf<float>(g, j0, j1);
}

// out_in: outputs [n0, n1): y[m, n] = bias[n] + Σ_k x[m, k]·W[n, k] over the 16 virtual lanes.
template <typename W>
void RowsOutInOf(const Args& g, int64_t n0, int64_t n1) {
  const DF d;
  const int64_t NL = int64_t(hn::Lanes(d)), full = g.K / fl::kSumLanes * fl::kSumLanes;
  for (int64_t n = n0; n < n1; ++n) {
    const W* wn = static_cast<const W*>(g.w) + n * g.K;
    for (int64_t m = 0; m < g.M; ++m) {
      const float* x = g.x + m * g.ldx;
      hn::Vec<decltype(d)> acc[fl::kSumVecs];
      for (int64_t v = 0; v < fl::kSumVecs; ++v) acc[v] = hn::Zero(d);
      for (int64_t k = 0; k < full; k += fl::kSumLanes)
#pragma GCC unroll 16
        for (int64_t v = 0; v < fl::kSumVecs; ++v)
          acc[v] = hn::MulAdd(hn::LoadU(d, x + k + v * NL), LoadW(d, wn + k + v * NL), acc[v]);
      if (full < g.K) {  // the tail into its lanes k % 16, zero-padded
        HWY_ALIGN float xs[fl::kSumLanes] = {}, ws[fl::kSumLanes] = {};
        std::copy(x + full, x + g.K, xs);
        for (int64_t k = full; k < g.K; ++k) ws[k - full] = WidenW(wn[k]);
        for (int64_t v = 0; v < fl::kSumVecs; ++v)
          acc[v] = hn::MulAdd(hn::Load(d, xs + v * NL), hn::Load(d, ws + v * NL), acc[v]);
      }
      const float dot = fl::SumLanes(acc);
      g.y[m * g.ldy + n] = g.bias ? g.bias[n] + dot : dot;
    }
  }
}
void RowsOutIn(const Args& g, int64_t n0, int64_t n1) {
  g.w16 ? RowsOutInOf<uint16_t>(g, n0, n1) : RowsOutInOf<float>(g, n0, n1);
}

}  // namespace attn::gemv_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace gemv_detail {
HWY_EXPORT(ColumnsInOut);
HWY_EXPORT(RowsOutIn);
}  // namespace gemv_detail

namespace {
template <typename W>
void rows_of(View<const float> x, View<const W> w, WeightLayout layout, View<const float> bias, View<float> y) {
  const bool io = layout == WeightLayout::in_out;
  ATTN_CHECK(x.rank() == 2 && w.rank() == 2, "Expected x (M, in) and a weight of rank 2, but got ", to_string(x.shape),
             " and ", to_string(w.shape), " instead");
  const int64_t M = x.size(0), K = x.size(1), N = io ? w.size(1) : w.size(0);
  ATTN_CHECK((io ? w.size(0) : w.size(1)) == K, "Expected weight of shape ",
             io ? to_string({K, N}) + " (in, out)" : to_string({N, K}) + " (out, in)", " for input ",
             to_string(x.shape), ", but got ", to_string(w.shape), " instead");
  ATTN_CHECK(y.rank() == 2 && y.size(0) == M && y.size(1) == N, "Expected output of shape ", to_string({M, N}),
             ", but got ", to_string(y.shape), " instead");
  ATTN_CHECK(bias.empty() || (bias.shape == Shape{N} && bias.is_contiguous()), "Expected bias of shape ",
             to_string({N}), ", but got ", to_string(bias.shape), " instead");
  ATTN_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && w.is_contiguous(),
             "Expected unit column strides and a contiguous weight for linear_rows, but got input strides ",
             to_string(x.strides), " and output strides ", to_string(y.strides), " instead");
  if (M == 0 || N == 0) return;
  const gemv_detail::Args g{x.data, x.stride(0), w.data, std::is_same_v<W, uint16_t>,
                            bias.empty() ? nullptr : bias.data, y.data, y.stride(0), M, K, N};
  if (io) {
    // column chunks of 1024 (4 KiB of each weight row, streamed): the chunks only decide who computes
    constexpr int64_t kChunk = 1024;
    parallel_for((N + kChunk - 1) / kChunk, grain_for(kChunk * K * M), [&](int64_t b, int64_t e, int) {
      HWY_DYNAMIC_DISPATCH(gemv_detail::ColumnsInOut)(g, b * kChunk, std::min(N, e * kChunk));
    });
  } else {
    parallel_for(N, grain_for(K * M), [&](int64_t b, int64_t e, int) {
      HWY_DYNAMIC_DISPATCH(gemv_detail::RowsOutIn)(g, b, e);
    });
  }
}

}  // namespace

void linear_rows(View<const float> x, View<const float> w, WeightLayout layout, View<const float> bias,
                 View<float> y) {
  rows_of(x, w, layout, bias, y);
}
void linear_rows(View<const float> x, View<const uint16_t> w, WeightLayout layout, View<const float> bias,
                 View<float> y) {
  rows_of(x, w, layout, bias, y);
}

}  // namespace attn
#endif  // HWY_ONCE
