// The flash kernels' 2^x (flash_common.h's Exp2), on every SIMD target this CPU runs, against exp2 in fp64: the
// fp32 kernels' within an ulp, and the bf16 kernels' cheaper one (Exp2<true>) within its derived bound,
// kExp2Bf16Error, over every fractional part the range reduction can leave and over the whole range; both 0
// below -126 and NaN for NaN. Not the softmax around it (test_flash.cpp, test_flash_bf16.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../tests/test_exp2.cpp"  // found through include/, as the kernels find themselves
#include <hwy/foreach_target.h>                     // IWYU pragma: keep
#include <hwy/highway.h>

#include "../src/kernels/flash_common.h"

HWY_BEFORE_NAMESPACE();
namespace attn::test_exp2::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[i] = Exp2<bf16>(x[i]) for i < n, n a multiple of 16 (every target's lanes divide it).
void Exp2Of(const float* x, int64_t n, bool bf16, float* out) {
  const flash::HWY_NAMESPACE::DF d;
  for (int64_t i = 0; i < n; i += hn::Lanes(d)) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(bf16 ? flash::HWY_NAMESPACE::Exp2<true>(d, v) : flash::HWY_NAMESPACE::Exp2<false>(d, v), d, out + i);
  }
}

}  // namespace attn::test_exp2::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace attn::test_exp2 {
HWY_EXPORT(Exp2Of);
namespace {

// x: every fp32 in [-1/2, 1/2] at or above 2^-12 in magnitude with its last 6 mantissa bits clear (a fractional
// part f, 2^x = 2^f), every one of the 2^-12 … 2^-30 ones with its last 13 clear, 0 and -0; then f shifted by
// every whole q in [-126, -1] (2^x = 2^q·2^f, the scaling exact); and a grid over [-130, 0]. A multiple of 16 long.
std::vector<float> arguments() {
  std::vector<float> x;
  for (float sign : {1.f, -1.f})
    for (uint32_t u = 0x30800000u; u <= 0x3F000000u; u += u < 0x39800000u ? 1u << 13 : 1u << 6)
      x.push_back(sign * std::bit_cast<float>(u));
  x.push_back(0.f), x.push_back(-0.f);
  const size_t fractions = x.size();
  for (int q = -126; q <= -1; ++q)
    for (size_t i = 0; i < fractions; i += 97) x.push_back(float(q) + x[i]);
  for (double v = -130; v <= 0; v += 1.0 / 1024) x.push_back(float(v));
  while (x.size() % 16) x.push_back(-1.f);
  return x;
}

// The largest relative error of Exp2<bf16> against exp2 in fp64 where 2^x is a normal fp32 (x >= -126), with
// where it is; and that below -126 it gives 0.
double worst_error(const std::vector<float>& x, bool bf16, std::string* where) {
  std::vector<float> y(x.size());
  HWY_DYNAMIC_DISPATCH(Exp2Of)(x.data(), int64_t(x.size()), bf16, y.data());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] < -126.f) {
      EXPECT_EQ(y[i], 0.f) << "x " << x[i];
      continue;
    }
    const double want = std::exp2(double(x[i])), err = std::abs(double(y[i]) - want) / want;
    if (err > worst) worst = err, *where = "x " + std::to_string(x[i]) + ": " + std::to_string(y[i]);
  }
  return worst;
}

TEST(Exp2, TheBf16KernelsOneIsWithinItsBoundAndTheFp32OneWithinAnUlpOnEveryTarget) {
  const std::vector<float> x = arguments();
  ASSERT_GT(x.size(), 1000000u);
  int targets = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::string where;
    const double bf16 = worst_error(x, true, &where);
    EXPECT_LE(bf16, flash::kExp2Bf16Error) << where;
    EXPECT_GE(bf16, 0.9 * 7.48e-5) << "the polynomial's minimax error, reached at its extrema: " << where;
    EXPECT_LE(worst_error(x, false, &where), std::numeric_limits<float>::epsilon()) << where;  // 8.2e-8 seen
    ++targets;
  }
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(targets, 1);
}

TEST(Exp2, NanStaysNanAndInfinityOrALargeNegativeArgumentGivesZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {nan, -inf, -1e30f, -126.5f, -127.f, -200.f, 0.f, -0.f};
  x.resize(16, -1.f);
  for (bool bf16 : {false, true}) {
    std::vector<float> y(x.size());
    HWY_DYNAMIC_DISPATCH(Exp2Of)(x.data(), int64_t(x.size()), bf16, y.data());
    EXPECT_TRUE(std::isnan(y[0])) << bf16;
    for (int i = 1; i < 6; ++i) EXPECT_EQ(y[size_t(i)], 0.f) << "x " << x[size_t(i)] << ", bf16 " << bf16;
    EXPECT_NEAR(y[6], 1.f, bf16 ? flash::kExp2Bf16Error : 0.0) << bf16;  // 2^0
    EXPECT_EQ(y[7], y[6]) << bf16;
  }
}

}  // namespace
}  // namespace attn::test_exp2
#endif  // HWY_ONCE
