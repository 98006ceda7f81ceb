// What attn runs on this machine, as `attn info` and attn.info() report it: the CPU as read, the SIMD
// target of the kernels, the GEMM kernel, the threads and how they wait. Every benchmark prints it.
#pragma once
#include <cstdint>
#include <string>

namespace attn {

struct RuntimeInfo {
  std::string cpu, features;
  int64_t l1d = 0, l2 = 0, l3 = 0;  // bytes
  bool caches_read = false;         // false: the OS reported no sizes and defaults are assumed
  bool caches_forced = false;       // true: ATTN_CPU_CACHES or set_cpu_caches replaced them
  std::string simd_target, simd_compiled, simd_fallback;  // fallback: empty, or why it is one
  std::string bits;                 // simd_bits(): whether results are those of every AVX2/AVX-512 CPU
  std::string gemm;                 // backend, target and blocking of the matrix products
  std::string gemm_bf16;            // the bf16 products: AMX, VDPBF16PS or their emulation, target, register block
  std::string tuning;               // tuning_summary(): measured blocking (attn tune) or derived
  int threads = 1, max_threads = 1;
  std::string wait_policy;
};

RuntimeInfo runtime_info();
std::string to_string(const RuntimeInfo& info);  // the multi-line header benchmarks print

// The fp32 FMA rate of all num_threads() threads together, GFLOP/s (an FMA counts 2), measured: each
// thread runs independent vector FMAs in registers on the kernels' SIMD target; median of `reps` runs.
// The ceiling `attn bench` states each kernel against (sgemm is the other).
double fma_peak_gflops(int reps = 5);

namespace detail {
// iters rounds of 12-16 independent vector FMAs x = x·a + b from x = 0; returns the sum of every lane of
// every chain and sets *flops to the flops done (a = b = 1: the sum is *flops / 2 exactly, below 2^24).
double fma_loop(int64_t iters, float a, float b, int64_t* flops);
}  // namespace detail

}  // namespace attn
