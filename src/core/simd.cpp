// simd_target(): a one-line Highway-dispatched function per target, so the answer is the dispatch itself.
#include "attn/simd.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/core/simd.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attn/check.h"
#include "attn/cpu.h"
#include "hwy_targets.h"  // ATTN_AVX512_TARGET, ATTN_FMA_TARGET

HWY_BEFORE_NAMESPACE();
namespace attn::simd::HWY_NAMESPACE {
int64_t Target() { return HWY_TARGET; }
}  // namespace attn::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace simd {
HWY_EXPORT(Target);
}  // namespace simd

namespace {
int64_t chosen() { return HWY_DYNAMIC_DISPATCH(simd::Target)(); }
}  // namespace

std::string simd_target() { return hwy::TargetName(chosen()); }
int64_t simd_target_bits() { return chosen(); }

std::string simd_compiled() {
  std::string all;
  for (int64_t t : hwy::SupportedAndGeneratedTargets())
    all += std::string(all.empty() ? "" : " ") + hwy::TargetName(t);  // not "" + string: GCC 12's -Wrestrict
  return all;
}

std::string simd_fallback() {
  const int64_t t = chosen();
  const bool avx2_or_better = fma_target(t);
  const bool avx512 = avx512_target(t);
  const CpuInfo& c = cpu_info();
  if (!avx2_or_better && c.avx2 && c.fma)
    return "the CPU has AVX2+FMA, but the kernels run " + simd_target() + " (targets limited)";
  if (!avx2_or_better) return "no AVX2+FMA on this CPU: the kernels run " + simd_target() + ", the portable fallback";
  if (c.avx512 && !avx512) return "the CPU has AVX-512, but the kernels run " + simd_target() + " (targets limited)";
  return "";
}

bool fma_target(int64_t target) { return ATTN_FMA_TARGET(target); }
bool avx512_target(int64_t target) { return ATTN_AVX512_TARGET(target); }
bool simd_portable_bits() { return fma_target(chosen()); }

std::string simd_bits() {
  return simd_portable_bits()
             ? "the same on every AVX2 and AVX-512 CPU (FMA; blocking and caches change no bits)"
             : "other than on AVX2/AVX-512 CPUs: " + simd_target() + " has no FMA (strict mode refuses it)";
}

void check_no_simd_fallback() {
  const std::string f = simd_fallback();
  ATTN_CHECK(f.empty(), "Expected the best SIMD target of this CPU (strict mode allows no fallback), but got a ",
             "fallback instead: ", f);
}

}  // namespace attn
#endif  // HWY_ONCE
