// Tests of attn's GEMM (src/kernels/gemm.cpp): against an fp64 triple loop with a derived tolerance, against
// OpenBLAS (the second implementation, linked to the tests only), bitwise the same for 1, 2 and 3 threads,
// on odd shapes, both transposes, strided leading dimensions, alpha/beta; and on every SIMD target.
// Not a benchmark (bench/gemm_candidates.cpp is) and not linear's layer semantics (test_nn.cpp).
#include <cblas.h>
#include <gtest/gtest.h>
#include <hwy/targets.h>  // with the library's HWY_DISABLED_TARGETS (CMakeLists.txt): its targets, no more

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attn/gemm.h"
#include "attn/threads.h"
#include "gemm_harness.h"
#include "test_util.h"

namespace attn {
namespace {

using test::expect_close_to_fp64;
using test::GemmCase;
using test::max_err;
using test::GemmOperands;

const int64_t kOdd[] = {1, 7, 63, 64, 65, 129, 513};  // docs/ARCHITECTURE.md's odd sizes

TEST(Gemm, CloseToFp64OnOddShapes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t x : kOdd) {  // each dimension through the odd sizes, the others at 65 and 7
        expect_close_to_fp64({x, 65, 7, ta, tb});
        expect_close_to_fp64({7, x, 65, ta, tb});
        expect_close_to_fp64({65, 7, x, ta, tb, 3, -0.5, 2});
      }
}

TEST(Gemm, CloseToFp64StridedAlphaBeta) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      expect_close_to_fp64({129, 130, 513, ta, tb, 5, 1.5, 0.25});
      expect_close_to_fp64({64, 513, 129, ta, tb, 1, -1, 1});
      expect_close_to_fp64({513, 63, 1100, ta, tb, 0, 0.5, 0});  // K past two K blocks
    }
}

TEST(Gemm, BetaZeroIgnoresNanInC) {
  GemmOperands<float> p({9, 70, 5, false, true});
  for (float& x : p.c) x = std::numeric_limits<float>::quiet_NaN();
  for (float x : p.run()) EXPECT_FALSE(std::isnan(x));
}

TEST(Gemm, NothingToMultiplyScalesC) {  // K = 0 and alpha = 0: C = beta·C, zeros for beta = 0
  for (double alpha : {1.0, 0.0}) {
    GemmOperands<float> p({3, 4, alpha == 0 ? 5 : 0, false, false, 0, alpha, 0.5});
    const std::vector<float> got = p.run();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], 0.5f * p.c[i]);
    p.s.beta = 0;
    for (float x : p.run()) EXPECT_EQ(x, 0.f);
  }
}

TEST(Gemm, DoubleCloseToLongDouble) {
  // Same rule one precision up: the fp64 gemm against a long double loop (the fp64 reference paths'
  // oracle), at most 2x the plain fp64 loop's error plus 4 fp64 ulps of the magnitude.
  for (const GemmCase& s : {GemmCase{65, 129, 513, false, true, 2, 1, 0}, GemmCase{7, 513, 64, true, false, 0, -2, 0.5},
                          GemmCase{513, 1, 1100, true, true, 1, 1, 1}}) {
    const GemmOperands<double> p(s);
    const std::vector<long double> ref = p.loop<long double>();
    const double loop_err = max_err(p.loop<double>(), ref, s, p.ldc);
    const double atol = 4 * std::numeric_limits<double>::epsilon() * p.magnitude();
    EXPECT_LE(max_err(p.run(), ref, s, p.ldc), 2 * loop_err + atol) << s.M << "x" << s.N << "x" << s.K;
  }
}

TEST(Gemm, CloseToOpenBlas) {
  // The second implementation: OpenBLAS's sgemm and attn's both within the fp64 rule above of the same
  // product, so their difference is at most the sum of the two bounds.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const GemmCase s{200, 300, 700, ta, tb, 3, 0.75, -1};
      const GemmOperands<float> p(s);
      std::vector<float> blas = p.c;
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K,
                  static_cast<float>(s.alpha), p.a.data(), p.lda, p.b.data(), p.ldb, static_cast<float>(s.beta),
                  blas.data(), p.ldc);
      const std::vector<double> ref = p.loop<double>();
      const double bound = 2 * max_err(p.loop<float>(), ref, s, p.ldc) +
                           4 * std::numeric_limits<float>::epsilon() * p.magnitude();
      EXPECT_LE(max_err(p.run(), blas, s, p.ldc), 2 * bound) << "ta=" << ta << " tb=" << tb;
    }
}

// docs/ARCHITECTURE.md: the same bits for any thread count. The tiles (and so who computes what) change with the thread
// count; each element's sum must not.
void expect_same_bits_for_1_2_3_threads(const GemmCase& s) {
  const GemmOperands<float> p(s, 7);
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    runs.push_back(p.run());
  }
  set_num_threads(1);
  for (int t = 1; t < 3; ++t)
    ASSERT_TRUE(test::same_bits(runs[0], runs[t])) << t + 1 << " threads, " << test::describe(s);
}

TEST(Gemm, SameBitsFor1And2And3Threads) {
  const int saved = num_threads();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      for (int64_t x : kOdd) {
        expect_same_bits_for_1_2_3_threads({x, 129, 65, ta, tb, 1, 1, 0});
        expect_same_bits_for_1_2_3_threads({65, x, 129, ta, tb, 0, -0.5, 1});
        expect_same_bits_for_1_2_3_threads({129, 63, x, ta, tb, 2, 2, 0.5});
      }
      expect_same_bits_for_1_2_3_threads({513, 513, 1100, ta, tb, 3, 1, 1});
    }
  set_num_threads(saved);
}

TEST(Gemm, EverySimdTargetCompiledIn) {
  // Each target Highway compiled and this CPU runs: the result still passes the fp64 rule, and
  // gemm_kernel() names that target (so `attn info` can never report one kernel while another runs).
  std::vector<std::string> names;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = gemm_kernel();
    EXPECT_NE(name.find(std::string(" ") + hwy::TargetName(target) + " "), std::string::npos) << name;
    names.push_back(name);
    std::printf("%s\n", name.c_str());
    expect_close_to_fp64({70, 100, 300, false, true, 1, 1, 0.5});
    expect_close_to_fp64({65, 33, 129, true, false, 0, -1, 0});
  }
  hwy::SetSupportedTargetsForTest(0);
  ASSERT_GE(names.size(), 2u) << "expected at least a SIMD target and the scalar one";
  for (size_t i = 1; i < names.size(); ++i) EXPECT_NE(names[i], names[0]);
  EXPECT_EQ(gemm_kernel(), names[0]);  // the best target again once the mock is off
}

}  // namespace
}  // namespace attn
