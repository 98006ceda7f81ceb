// Google Benchmark of the attention kernels: the flash forward and backward (and the reference where it is
// quick) in GFLOP/s and as a percentage of attn's sgemm at 2048³, measured first in the same program as
// the practical peak. A measurement program, not a test; numbers go to BENCHMARKS.md.
//
//   build-x/bench_kernels [--threads N] [--memory] [google-benchmark flags, e.g. --benchmark_repetitions=5]
//
// --memory adds the L = S = 65536, H = 8, D = 64 run (about a minute) that reports the kernel's peak
// memory above its inputs and output. FLOPs = 4·B·H·L·S·D, half when causal.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/memstat.h"
#include "attn/param.h"
#include "attn/rng.h"
#include "attn/sdpa.h"
#include "attn/threads.h"

using namespace attn;

namespace {

double g_sgemm_gflops = 0;         // median of BM_Sgemm2048's runs so far; it runs first
std::vector<double> g_sgemm_runs;  // GFLOP/s of each run (one per repetition)

// Runs f once per benchmark iteration, timing it with a steady clock; sets GFLOP/s and %sgemm.
template <typename F>
void time_flops(benchmark::State& state, double flops, F&& f) {
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gflops = flops * double(state.iterations()) / seconds * 1e-9;
  state.counters["GFLOP/s"] = gflops;
  if (g_sgemm_gflops > 0) state.counters["%sgemm"] = 100 * gflops / g_sgemm_gflops;
}

void BM_Sgemm2048(benchmark::State& state) {
  const int64_t n = 2048;
  Tensor a = init::randn({n, n}, 1), b = init::randn({n, n}, 2), c({n, n});
  time_flops(state, 2.0 * n * n * n,
             [&] { gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); });
  g_sgemm_runs.push_back(state.counters["GFLOP/s"]);
  std::vector<double> r = g_sgemm_runs;
  std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
  g_sgemm_gflops = r[r.size() / 2];
  state.counters.erase("%sgemm");
}

// One attention problem, D = Dv, contiguous (B, H, L, D) inputs; B = 1 unless given.
struct Attn {
  Tensor q, k, v, out, lse;
  SdpaArgs<float> args;
  Attn(int64_t H, int64_t Hkv, int64_t L, int64_t S, int64_t D, Causal causal, int64_t B = 1)
      : q(init::randn({B, H, L, D}, 3)), k(init::randn({B, Hkv, S, D}, 4)), v(init::randn({B, Hkv, S, D}, 5)),
        out({B, H, L, D}), lse({B, H, L}) {
    args.q = q, args.k = k, args.v = v;
    args.causal = causal;
  }
  double flops() const {
    return sdpa_forward_flops(q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), args.causal);
  }
  // with_lse: the forward keeps its LSE, as training does (the backward reads it)
  SdpaProblem<float> problem(bool with_lse = false) {
    return make_problem(args, SdpaOut<float>{out, {}, with_lse ? View<float>(lse) : View<float>()});
  }
};

// args: L (= S), causal. H = 8, D = 64.
void BM_Flash(benchmark::State& state) {
  Attn a(8, 8, state.range(0), state.range(0), 64, state.range(1) ? Causal::top_left : Causal::none);
  const SdpaProblem<float> p = a.problem();
  time_flops(state, a.flops(), [&] { flash_forward(p); });
}

// The bf16 flash forward (Q·Kᵀ and P·V over bf16 pairs); args: L (= S), causal, D, query rows per tile
// (0: flash_tiles()'s), the instructions: AMX (2), VDPBF16PS (1), as far as the CPU has them, or their
// emulation (0). H = 8.
void BM_FlashBf16(benchmark::State& state) {
  Attn a(8, 8, state.range(0), state.range(0), state.range(2), state.range(1) ? Causal::top_left : Causal::none);
  const SdpaProblem<float> p = a.problem();
  set_flash_tiles({0, state.range(3)});
  set_cpu_bf16(state.range(4) >= 1), set_cpu_amx(state.range(4) == 2);
  time_flops(state, a.flops(), [&] { flash_forward(p, Precision::bf16); });
  set_cpu_bf16(true), set_cpu_amx(true);
  set_flash_tiles({});
}

void BM_Reference(benchmark::State& state) {
  Attn a(8, 8, state.range(0), state.range(0), 64, state.range(1) ? Causal::top_left : Causal::none);
  const SdpaProblem<float> p = a.problem();
  time_flops(state, a.flops(), [&] { reference_forward(p); });
}

// GQA prefill: H = 32 query heads over Hkv = 8, D = 128, L = S = arg.
void BM_FlashGqa(benchmark::State& state) {
  Attn a(32, 8, state.range(0), state.range(0), 128, Causal::none);
  const SdpaProblem<float> p = a.problem();
  time_flops(state, a.flops(), [&] { flash_forward(p); });
}

// Decoding one token: L = 1, S = arg, H = 32 over Hkv = 8, D = 128. Bound by reading K and V once:
// also reports that rate in GB/s.
void BM_FlashDecode(benchmark::State& state) {
  Attn a(32, 8, 1, state.range(0), 128, Causal::none);
  const SdpaProblem<float> p = a.problem();
  time_flops(state, a.flops(), [&] { flash_forward(p); });
  const double bytes = 2.0 * double(a.k.numel()) * sizeof(float);
  state.counters["KV_GB/s"] = bytes * state.counters["GFLOP/s"] / a.flops();
}

// The decode step: L = 1, S = 16384, H = 32 over Hkv = 8, D = 128, K/V stored as arg 0 (f32,
// f16, bf16). Reports the time, the K/V bytes read per step and their rate. BM_ReadKV is the floor: the
// time to read the same bytes once (a vectorizable sum over them, split like the decode, 2 threads).
constexpr int64_t kDecS = 16384, kDecH = 32, kDecHkv = 8, kDecD = 128;
void BM_DecodeStep(benchmark::State& state) {
  const KvDtype t = KvDtype(state.range(0));
  Attn a(kDecH, kDecHkv, 1, kDecS, kDecD, Causal::bottom_right);
  std::vector<uint16_t> k16(size_t(a.k.numel())), v16(size_t(a.v.numel()));
  if (t != KvDtype::f32) {
    to_half(t, a.k.data(), a.k.numel(), k16.data());
    to_half(t, a.v.data(), a.v.numel(), v16.data());
  }
  const Shape shape = {1, kDecHkv, kDecS, kDecD};
  HalfKV kv{t, View<const uint16_t>(k16.data(), shape), View<const uint16_t>(v16.data(), shape)};
  SdpaArgs<float> half_args = a.args;
  half_args.k = {}, half_args.v = {};
  const SdpaOut<float> out{a.out, {}, {}};
  time_flops(state, a.flops(), [&] {
    if (t == KvDtype::f32) sdpa(a.args, out);
    else sdpa(half_args, kv, out);
  });
  const double bytes = 2.0 * double(a.k.numel()) * (t == KvDtype::f32 ? 4 : 2);
  state.counters["KV_MB"] = bytes * 1e-6;
  state.counters["KV_GB/s"] = bytes * state.counters["GFLOP/s"] / a.flops();
  state.SetLabel(to_string(t));
}

// Reading arg 0's bytes of K/V once (f32: 4 bytes an element, else 2), summed as 32-bit words.
void BM_ReadKV(benchmark::State& state) {
  const int64_t elements = 2 * kDecHkv * kDecS * kDecD;  // K and V
  const int64_t n = state.range(0) == int(KvDtype::f32) ? elements : elements / 2;  // 32-bit words
  std::vector<uint32_t> buf(size_t(n), 1u);
  std::vector<uint32_t> sums(64);
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t chunk = 1 << 16;
    parallel_items((n + chunk - 1) / chunk, chunk, [&](int64_t c, int worker) {
      uint32_t acc = 0;
      const uint32_t* x = buf.data() + c * chunk;
      for (int64_t i = 0, e = std::min(chunk, n - c * chunk); i < e; ++i) acc += x[i];
      sums[size_t(worker)] += acc;
    });
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["KV_MB"] = double(n) * 4e-6;
  state.counters["KV_GB/s"] = double(n) * 4 * double(state.iterations()) / seconds * 1e-9;
  state.SetLabel(to_string(KvDtype(state.range(0))));
}

// The flash backward, FLOPs 2.5x the forward's (five products instead of two). args: B, H, L (= S), D,
// causal; Q, K, V, dO (B, H, L, D) random, out and LSE from one flash forward.
// The problem of BM_FlashBackward's and BM_FlashForward's args (B, H, L, D, causal, bf16), LSE kept.
Attn training_case(const benchmark::State& state) {
  return Attn(state.range(1), state.range(1), state.range(2), state.range(2), state.range(3),
              state.range(4) ? Causal::top_left : Causal::none, state.range(0));
}
Precision precision_of(const benchmark::State& state) { return state.range(5) ? Precision::bf16 : Precision::f32; }

void BM_FlashBackward(benchmark::State& state) {
  Attn a = training_case(state);
  const Shape shape = a.q.shape();
  Tensor dout = init::randn(shape, 6), dq(shape), dk(shape), dv(shape);
  const SdpaProblem<float> p = a.problem(true);
  const Precision prec = precision_of(state);
  flash_forward(p, prec);
  const SdpaGrads<float> g{dq, dk, dv};
  time_flops(state, sdpa_backward_flops(shape[0], shape[1], shape[2], shape[2], shape[3], a.args.causal),
             [&] { flash_backward(p, dout, g, prec); });
}

// The forward at the shapes of BM_FlashBackward, LSE kept as training keeps it.
void BM_FlashForward(benchmark::State& state) {
  Attn a = training_case(state);
  const SdpaProblem<float> p = a.problem(true);
  const Precision prec = precision_of(state);
  time_flops(state, a.flops(), [&] { flash_forward(p, prec); });
}

// Peak memory of one flash run above its inputs and output (VmHWM growth after clear_refs resets it).
void BM_FlashMemory(benchmark::State& state) {
  Attn a(8, 8, state.range(0), state.range(0), 64, Causal::top_left);
  const SdpaProblem<float> p = a.problem();
  const int64_t base = rss_bytes();
  reset_peak_rss();
  time_flops(state, a.flops(), [&] { flash_forward(p); });
  state.counters["extra_MB"] = double(peak_rss_bytes() - base) / 1e6;
}

}  // namespace

BENCHMARK(BM_Sgemm2048)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_Flash)->ArgsProduct({{1024, 4096}, {0, 1}})->ArgNames({"L", "causal"})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FlashBf16)->ArgsProduct({{4096}, {0, 1}, {64, 128}, {0, 48, 96}, {2}})
    ->Args({4096, 0, 64, 0, 1})->Args({4096, 0, 64, 0, 0})->ArgNames({"L", "causal", "D", "rows", "isa"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Reference)->Args({1024, 0})->ArgNames({"L", "causal"})->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_FlashGqa)->Arg(2048)->ArgName("L")->Unit(benchmark::kMillisecond);
// nanoGPT's CPU training shape (B 12, H 4, T 64, D 32, causal) and bench/train_torch.py's (B 32, T 128), then
// L = 1024 causal and 4096 at D 64, 128 (bf16 1: the products over bf16 pairs)
BENCHMARK(BM_FlashBackward)
    ->ArgsProduct({{12}, {4}, {64}, {32}, {1}, {0, 1}})
    ->ArgsProduct({{32}, {4}, {128}, {32}, {1}, {0, 1}})
    ->ArgsProduct({{1}, {8}, {1024}, {64}, {1}, {0, 1}})
    ->ArgsProduct({{1}, {8}, {4096}, {64, 128}, {0}, {0, 1}})
    ->ArgNames({"B", "H", "L", "D", "causal", "bf16"})
    ->Unit(benchmark::kMillisecond);
// the training shapes: nanoGPT's CPU run (B 12, T 64) and bench/train_torch.py's (B 32, T 128)
BENCHMARK(BM_FlashForward)
    ->ArgsProduct({{12}, {4}, {64}, {32}, {1}, {0, 1}})
    ->ArgsProduct({{32}, {4}, {128}, {32}, {1}, {0, 1}})
    ->ArgNames({"B", "H", "L", "D", "causal", "bf16"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FlashDecode)->Arg(4096)->Arg(32768)->ArgName("S")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ReadKV)->Arg(int(KvDtype::f32))->Arg(int(KvDtype::f16))->ArgName("kv")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeStep)
    ->Arg(int(KvDtype::f32))
    ->Arg(int(KvDtype::f16))
    ->Arg(int(KvDtype::bf16))
    ->ArgName("kv")
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  int threads = 2;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--memory") == 0)
      benchmark::RegisterBenchmark("BM_FlashMemory", BM_FlashMemory)
          ->Arg(65536)
          ->ArgName("L")
          ->Iterations(1)
          ->Unit(benchmark::kSecond);
    else rest.push_back(argv[i]);
  }
  set_num_threads(threads);
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::AddCustomContext("threads", std::to_string(threads));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
