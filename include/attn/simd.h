// Which SIMD target attn's kernels run. Every Highway-dispatched kernel (flash forward and backward,
// GELU, the GEMM) is compiled for the same target list and dispatched through Highway's one global
// choice, so one answer holds for all of them.
#pragma once
#include <string>

namespace attn {

std::string simd_target();      // the target dispatch picks now: "AVX3", "AVX2", "SSE4", or the fallback,
                                // "SCALAR" (GCC < 12.3) or "EMU128"
std::string simd_compiled();    // the targets this CPU supports that attn was compiled for, best first
// Empty when the kernels run the best vector instructions this CPU has; otherwise, in words, the fallback
// (no AVX2 at all, or AVX-512 present but not used). strict paths refuse to run on a fallback.
std::string simd_fallback();
// Throws attn::Error naming the fallback, if any (strict paths: sdpa's strict, `attn info --strict`).
void check_no_simd_fallback();

}  // namespace attn
