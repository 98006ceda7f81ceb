// fma_peak_gflops(): the fp32 FMA rate this machine gives attn's threads, measured, as the ceiling that
// `attn bench` states each kernel's rate against (the CPU has no counter we can read in a VM, and its
// clock under load is not the label's). Independent vector FMAs on register-resident accumulators, on
// the SIMD target the kernels run (Highway's dispatch), so no memory traffic and no dependency stall.
#include <algorithm>
#include <chrono>
#include <vector>

#include "attn/info.h"
#include "attn/threads.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/fma_peak.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "../core/hwy_targets.h"  // ATTN_AVX512_TARGET

HWY_BEFORE_NAMESPACE();
namespace attn::fma::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Chains: more than FMA latency x FMA ports on any x86 core (4 x 2 on Zen 4/5 and Skylake-X), and few
// enough that the accumulators and the two operands stay in registers (32 with AVX-512, 16 below).
constexpr int kChains = ATTN_AVX512_TARGET(HWY_TARGET) ? 16 : 12;

double Loop(int64_t iters, float a, float b, int64_t* flops) {
  const hn::ScalableTag<float> d;
  const auto va = hn::Set(d, a), vb = hn::Set(d, b);
  hn::Vec<decltype(d)> acc[kChains];
  for (auto& x : acc) x = hn::Zero(d);
  for (int64_t i = 0; i < iters; ++i)
    for (auto& x : acc) x = hn::MulAdd(x, va, vb);
  double sum = 0;
  for (auto& x : acc) sum += double(hn::GetLane(hn::SumOfLanes(d, x)));
  *flops = 2 * int64_t(kChains) * int64_t(hn::Lanes(d)) * iters;
  return sum;
}

}  // namespace attn::fma::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace fma {
HWY_EXPORT(Loop);
}  // namespace fma

double detail::fma_loop(int64_t iters, float a, float b, int64_t* flops) {
  return HWY_DYNAMIC_DISPATCH(fma::Loop)(iters, a, b, flops);
}

double fma_peak_gflops(int reps) {
  const int n = num_threads();
  // 32 chunks per thread, claimed dynamically: a thread that wakes late still gets its share (with one
  // chunk each, the caller could run them all before a worker woke, and the rate would read 1/n).
  constexpr int64_t kChunksPerThread = 32, kIters = 1 << 15;  // ~64 us per chunk at 2·16·16 flops per round
  const int64_t chunks = kChunksPerThread * n;
  std::vector<double> rates;
  for (int r = 0; r <= std::max(1, reps); ++r) {  // round 0 warms the pool up and is not counted
    // flops per worker. The loop's sum is dropped: a call through Highway's dispatch table is not elided.
    std::vector<int64_t> flops(size_t(n), 0);
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(chunks, 1, [&](int64_t b, int64_t e, int w) {
      for (int64_t i = b; i < e; ++i) {
        int64_t f = 0;
        detail::fma_loop(kIters, 0.5f, 1.0f, &f);
        flops[size_t(w)] += f;
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t total = 0;
    for (int64_t f : flops) total += f;
    if (r > 0) rates.push_back(double(total) / s * 1e-9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace attn
#endif
