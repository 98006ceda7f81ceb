// The processor as read when the program runs: its name, the instruction-set features attn's kernels
// choose from, and the cache sizes that blocking is derived from. Never a table of model numbers.
#pragma once
#include <cstdint>
#include <string>

namespace attn {

struct CpuInfo {
  std::string name;      // "AMD EPYC", "Intel(R) Xeon(R) Platinum 8488C", ... (CPUID brand string)
  std::string features;  // the ones that matter here, space-separated: "sse4.2 avx2 fma f16c avx512f ..."
  bool avx2 = false, fma = false, f16c = false, avx512 = false;  // avx512: F + BW + DQ + VL (Highway's AVX3)
  bool bf16 = false;  // avx512 + AVX512_BF16 (VDPBF16PS): the bf16 products' instruction without AMX
  bool amx = false;   // avx512 + AMX-BF16 + AMX-TILE, and the OS lets this process use tiles: TDPBF16PS, the
                      // bf16 GEMM's and flash tiles' instruction (else VDPBF16PS, else the emulation: the same bits)
  bool amx_emulated = false;  // amx set by emulate_cpu_amx: the AMX paths with their tiles in software (tests)
  int64_t l1d = 0, l2 = 0, l3 = 0;  // bytes per core's L1d/L2 and the shared L3, as the OS reports them
  bool caches_read = false;         // false: the OS said nothing and the sizes below are assumed
  bool caches_forced = false;       // true: set by ATTN_CPU_CACHES or set_cpu_caches, not as read
};

// Read once, on first use. Caches come from /sys/devices/system/cpu/cpu0/cache (sysconf as a fallback);
// where neither reports them, 32 KiB / 1 MiB / 8 MiB are assumed and caches_read is false.
// ATTN_CPU_CACHES="l1d=32K,l2=512K" (any of l1d, l2, l3; K or M suffix) replaces what was read: to see
// another CPU's blocking here. A malformed value is reported on stderr once and ignored.
const CpuInfo& cpu_info();

// Tests and benchmarks: pretend the L1d and L2 are these sizes (bytes; 0 keeps the current one), so the
// blocking derived from them changes; the bits must not. Passing the sizes read (or ATTN_CPU_CACHES's)
// restores them. Not thread-safe: call it while no kernel runs.
void set_cpu_caches(int64_t l1d, int64_t l2);
// Tests and benchmarks: pretend the CPU lacks AVX512_BF16 (false), so bf16 products run their emulation;
// true restores what was read (never more). Not thread-safe, as set_cpu_caches.
void set_cpu_bf16(bool on);
// Tests and benchmarks: pretend the CPU lacks AMX (false); true restores what was read. As set_cpu_bf16.
void set_cpu_amx(bool on);
// Tests: run the AMX paths (their packing, tile layouts, edges and blocking) on a CPU with AVX512_BF16, AMX's
// tile products computed in software by TDPBF16PS's definition (amx.h), even where the CPU has AMX; slow.
// set_cpu_amx ends it. As set_cpu_bf16.
void emulate_cpu_amx();

}  // namespace attn
