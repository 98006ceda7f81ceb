// Tests of what attn says about its runtime (info.h, simd.h, cpu.h): the CPU and caches as read, the SIMD
// target the kernels run, and the fallback rule — forced through Highway's SetSupportedTargetsForTest,
// under which `info` must name the lower target, strict sdpa must refuse it, and results stay right.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "attn/cpu.h"
#include "attn/info.h"
#include "attn/param.h"
#include "attn/rng.h"
#include "attn/sdpa.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "test_util.h"

namespace attn {
namespace {

TEST(Info, ReportsTheCpuCachesTargetGemmAndThreads) {
  const RuntimeInfo i = runtime_info();
  EXPECT_FALSE(i.cpu.empty());
  EXPECT_GT(i.l1d, 0);
  EXPECT_GT(i.l2, i.l1d);  // every x86-64 CPU this runs on has a larger L2 than L1d
  EXPECT_NE(i.simd_compiled.find(i.simd_target), std::string::npos) << i.simd_compiled;
  EXPECT_FALSE(i.gemm.empty());
  EXPECT_EQ(i.threads, num_threads());
  const std::string text = to_string(i);
  EXPECT_NE(text.find("simd      " + i.simd_target), std::string::npos) << text;
  EXPECT_NE(text.find("gemm      " + i.gemm), std::string::npos) << text;
  // The features line agrees with the flags the kernels decide by.
  const CpuInfo& c = cpu_info();
  EXPECT_EQ(c.avx2, i.features.find("avx2") != std::string::npos);
  EXPECT_EQ(c.avx512, i.features.find("avx512f") != std::string::npos &&
                          i.features.find("avx512vl") != std::string::npos);
}

TEST(Info, TheBestTargetIsNoFallbackOnThisCpu) {
  hwy::SetSupportedTargetsForTest(0);
  const CpuInfo& c = cpu_info();
  if (!(c.avx2 && c.fma)) GTEST_SKIP() << "this CPU has no AVX2+FMA: the fallback is real here";
  EXPECT_EQ(simd_fallback(), "");
  EXPECT_NO_THROW(check_no_simd_fallback());
  EXPECT_EQ(simd_target(), c.avx512 ? "AVX3" : "AVX2");
}

// A small SDPA case; out must match the fp64 reference on every target.
double sdpa_error(bool strict) {
  const int64_t B = 1, H = 2, L = 37, S = 41, D = 24;
  Rng rng(5);
  Tensor q = init::randn({B, H, L, D}, rng), k = init::randn({B, H, S, D}, rng), v = init::randn({B, H, S, D}, rng);
  Tensor out({B, H, L, D});
  auto as_double = [](const Tensor& x) {
    TensorD d(x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) d.data()[i] = x.data()[i];
    return d;
  };
  sdpa(SdpaArgs<float>{q.view(), k.view(), v.view()}, SdpaOut<float>{out.view(), {}, {}},
       SdpaOptions{Backend::automatic, strict});
  TensorD qd = as_double(q), kd = as_double(k), vd = as_double(v);
  TensorD ref({B, H, L, D});
  sdpa(SdpaArgs<double>{qd.view(), kd.view(), vd.view()}, SdpaOut<double>{ref.view(), {}, {}});
  double err = 0;
  for (int64_t i = 0; i < out.numel(); ++i) err = std::max(err, std::abs(double(out.data()[i]) - ref.data()[i]));
  return err;
}

TEST(Info, ForcedLowerTargetsAreReportedRefusedByStrictAndStillRight) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();  // best first
  for (size_t t = 0; t < targets.size(); ++t) {
    SCOPED_TRACE(hwy::TargetName(targets[t]));
    hwy::SetSupportedTargetsForTest(targets[t]);
    EXPECT_EQ(simd_target(), hwy::TargetName(targets[t]));
    EXPECT_EQ(runtime_info().simd_target, hwy::TargetName(targets[t]));
    // 1e-5: outputs are weighted means of N(0,1) values; fp32 flash vs fp64 is ~1e-7 on these sizes
    EXPECT_LT(sdpa_error(false), 1e-5);
    const bool fallback = !avx512_target(targets[t]) && !(targets[t] == HWY_AVX2 && !cpu_info().avx512);
    EXPECT_EQ(simd_fallback().empty(), !fallback) << simd_fallback();
    // the bits: those of every AVX2/AVX-512 CPU exactly where the target has FMA (test_bits.cpp checks them)
    const bool fma = fma_target(targets[t]);
    EXPECT_EQ(simd_portable_bits(), fma);
    EXPECT_NE(to_string(runtime_info()).find("bits      " + simd_bits()), std::string::npos);
    EXPECT_NE(simd_bits().find(fma ? "the same on every AVX2 and AVX-512 CPU" : "has no FMA"), std::string::npos)
        << simd_bits();
    if (!fallback) continue;
    EXPECT_NE(simd_fallback(), "");
    EXPECT_NE(to_string(runtime_info()).find("FALLBACK  " + simd_fallback()), std::string::npos);
    const std::string e = test::error_of([] { sdpa_error(true); });
    EXPECT_NE(e.find("strict mode allows no fallback"), std::string::npos) << e;
    EXPECT_NE(e.find(hwy::TargetName(targets[t])), std::string::npos) << e;
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The FMA-peak loop does the work it counts, on every target: with x = x·1 + 1 every lane of every chain
// ends at iters exactly, so the sum is half the flops (a skipped round or a miscounted lane breaks it).
TEST(Info, FmaPeakLoopDoesTheFlopsItCounts) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    int64_t flops = 0;
    const double sum = detail::fma_loop(1000, 1.0f, 1.0f, &flops);
    EXPECT_EQ(sum, double(flops) / 2);
    EXPECT_GE(flops, 2 * 1000 * 12);  // at least 12 chains of one lane
    int64_t none = -1;
    EXPECT_EQ(detail::fma_loop(0, 1.0f, 1.0f, &none), 0.0);
    EXPECT_EQ(none, 0);
  }
  hwy::SetSupportedTargetsForTest(0);
  const double peak = fma_peak_gflops(1);
  EXPECT_TRUE(std::isfinite(peak) && peak > 0) << peak;
}

}  // namespace
}  // namespace attn
