// `attn bench`: attention time, GFLOP/s, fraction of this run's sgemm rate, and peak memory, for the
// reference and flash backends over growing L. A measurement tool, not a test: numbers go to BENCHMARKS.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "attn/gemm.h"
#include "attn/info.h"
#include "attn/memstat.h"
#include "attn/param.h"
#include "attn/rng.h"
#include "attn/sdpa.h"
#include "attn/threads.h"
#include "cli.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;

// Median wall time of `reps` runs of f, in seconds, after one warm-up run.
template <typename F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double sgemm_gflops(int reps) {
  const int64_t n = 2048;
  Tensor a = init::randn({n, n}, 1), b = init::randn({n, n}, 2), c({n, n});
  double s = median_seconds(reps, [&] { gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); });
  return 2.0 * n * n * n / s * 1e-9;
}

struct Case {
  const char* name;
  int64_t B, H, Hkv, L, S, D;
  Causal causal;
};

void run_case(const Case& c, Backend backend, double peak, int reps) {
  Tensor q = init::randn({c.B, c.H, c.L, c.D}, 3), k = init::randn({c.B, c.Hkv, c.S, c.D}, 4),
         v = init::randn({c.B, c.Hkv, c.S, c.D}, 5), out({c.B, c.H, c.L, c.D});
  SdpaArgs<float> args{q, k, v};
  args.causal = c.causal;
  SdpaOut<float> o{out};
  const int64_t base = rss_bytes();
  reset_peak_rss();
  double s = median_seconds(reps, [&] { sdpa(args, o, {backend, false}); });
  double extra_mb = double(std::max<int64_t>(0, peak_rss_bytes() - base)) / 1e6;
  // FLOPs: 4·B·H·L·S·D, half when causal (the visible triangle)
  double flops = 4.0 * c.B * c.H * c.L * c.S * c.D * (c.causal == Causal::none ? 1.0 : 0.5);
  double gf = flops / s * 1e-9;
  std::printf("%-10s %6lld %6lld %3lld/%-3lld %4lld  %-9s %10.2f %8.1f %6.0f%% %9.1f\n", c.name,
              (long long)c.L, (long long)c.S, (long long)c.H, (long long)c.Hkv, (long long)c.D,
              to_string(backend), s * 1e3, gf, 100 * gf / peak, extra_mb);
  std::fflush(stdout);
}

// Time to read K and V once (the floor for a decode step): a plain sum over the same bytes.
double read_kv_seconds(const Case& c, int reps) {
  Tensor k = init::randn({c.B, c.Hkv, c.S, c.D}, 4), v = init::randn({c.B, c.Hkv, c.S, c.D}, 5);
  volatile float sink = 0;
  return median_seconds(reps, [&] {
    const int64_t n = k.numel();
    std::vector<float> acc(size_t(num_threads()), 0.f);
    parallel_for(n, grain_for(2), [&](int64_t b, int64_t e, int w) {
      float x = 0;
      for (int64_t i = b; i < e; ++i) x += k.data()[i] + v.data()[i];
      acc[size_t(w)] += x;
    });
    sink = acc[0];
  });
}

}  // namespace

int run_bench(const BenchOptions& opt) {
  // Every length is checked before the first timing: Q, K, V and out of (1, 8, L, 64), and the reference's
  // (L, L) scores per head up to --reference-max.
  for (int64_t L : opt.lengths) {
    const double inputs = 4.0 * 8 * double(L) * 64 * 4, scores = L <= opt.reference_max ? 8.0 * double(L) * double(L) * 4 : 0;
    check_fits_in_memory(inputs + scores, cat("--lengths ", L, " (Q, K, V, out of (1, 8, L, 64)",
                                              scores > 0 ? " and the reference's scores" : "", ")"));
  }
  set_num_threads(opt.threads);
  std::fputs(to_string(runtime_info()).c_str(), stdout);
  double peak = sgemm_gflops(opt.repeats);
  std::printf("threads %d; attn gemm 2048^3: %.1f GFLOP/s (the peak below)\n", num_threads(), peak);
  std::printf("%-10s %6s %6s %7s %4s  %-9s %10s %8s %7s %9s\n", "case", "L", "S", "H/Hkv", "D", "backend",
              "time ms", "GFLOP/s", "%sgemm", "extra MB");
  for (int64_t L : opt.lengths) {
    for (Causal causal : {Causal::none, Causal::top_left}) {
      Case c{causal == Causal::none ? "mha" : "causal", 1, 8, 8, L, L, 64, causal};
      if (L <= opt.reference_max) run_case(c, Backend::reference, peak, opt.repeats);
      run_case(c, Backend::flash, peak, opt.repeats);
    }
  }
  Case gqa{"gqa", 1, 32, 8, 4096, 4096, 128, Causal::none};
  run_case(gqa, Backend::flash, peak, opt.repeats);
  Case decode{"decode", 1, 32, 8, 1, 16384, 128, Causal::none};
  run_case(decode, Backend::reference, peak, opt.repeats);
  run_case(decode, Backend::flash, peak, opt.repeats);
  double floor = read_kv_seconds(decode, opt.repeats);
  std::printf("decode floor: reading K and V once (%.0f MB) takes %.3f ms\n",
              2.0 * decode.Hkv * decode.S * decode.D * 4 / 1e6, floor * 1e3);
  return 0;
}

}  // namespace attn
