// Which SIMD target attn's kernels run. Every Highway-dispatched kernel (flash forward and backward,
// GELU, the GEMM) is compiled for the same target list and dispatched through Highway's one global
// choice, so one answer holds for all of them.
#pragma once
#include <cstdint>
#include <string>

namespace attn {

std::string simd_target();      // the target dispatch picks now: "AVX3", "AVX2", "SSE4", or the fallback,
                                // "SCALAR" (GCC < 12.3) or "EMU128"
int64_t simd_target_bits();     // the same as Highway's target bit (HWY_AVX3, HWY_AVX2, ...)
std::string simd_compiled();    // the targets this CPU supports that attn was compiled for, best first
// Empty when the kernels run the best vector instructions this CPU has; otherwise, in words, the fallback
// (no AVX2 at all, or AVX-512 present but not used). strict paths refuse to run on a fallback.
std::string simd_fallback();
// Whether results have the bits every AVX2/AVX-512 CPU gives (every sum one FMA chain in a fixed order, on
// fixed virtual lanes): in words, for `attn info`. Targets without FMA (SSE4, SCALAR or EMU128) give other bits.
bool simd_portable_bits();
bool fma_target(int64_t target);     // a Highway target with FMA (AVX2, AVX-512): the targets of those bits
bool avx512_target(int64_t target);  // a Highway target with AVX-512 (AVX3, AVX3_DL, ...)
std::string simd_bits();
// Throws attn::Error naming the fallback, if any (strict paths: sdpa's strict, `attn info --strict`).
void check_no_simd_fallback();

}  // namespace attn
