// runtime_info(): gathers what core (CPU, threads, SIMD) and the kernels (GEMM) say about themselves.
#include "attn/info.h"

#include "attn/check.h"
#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "attn/tune.h"

namespace attn {

RuntimeInfo runtime_info() {
  const CpuInfo& c = cpu_info();
  return {c.name,           c.features,       c.l1d,          c.l2,          c.l3,
          c.caches_read,    c.caches_forced,  simd_target(),  simd_compiled(), simd_fallback(),
          simd_bits(),      gemm_kernel(),    gemm_bf16_kernel(), tuning_summary(), num_threads(),
          max_threads(),    wait_policy()};
}

std::string to_string(const RuntimeInfo& i) {
  auto kib = [](int64_t b) { return std::to_string(b >> 10) + " KiB"; };
  return cat("cpu       ", i.cpu, "\n",                                     //
             "features  ", i.features.empty() ? "(none of interest)" : i.features, "\n",  //
             "caches    L1d ", kib(i.l1d), ", L2 ", kib(i.l2), ", L3 ", kib(i.l3),
             i.caches_forced ? " (forced: ATTN_CPU_CACHES or set_cpu_caches)"
             : i.caches_read ? " (as the OS reports them)" : " (assumed: the OS reports none)", "\n",  //
             "simd      ", i.simd_target, " (compiled and supported: ", i.simd_compiled, ")",
             i.simd_fallback.empty() ? "" : "\nFALLBACK  " + i.simd_fallback, "\n",  //
             "bits      ", i.bits, "\n",                                             //
             "gemm      ", i.gemm, "\n",                                             //
             "gemm bf16 ", i.gemm_bf16, "\n",                                        //
             "tuning    ", i.tuning, "\n",                                             //
             "threads   ", i.threads, " (at most ", i.max_threads, "); ", i.wait_policy, "\n");
}

}  // namespace attn
