// The step profile (profile.h): nested parts sum their calls and time, a disabled profile records nothing,
// and the printed table names every part. Not a timing test: only structure and counts are checked.
#include <gtest/gtest.h>

#include <sstream>

#include "attn/profile.h"

namespace attn {
namespace {

TEST(Profile, NestsCountsAndPrints) {
  profile::reset();
  profile::enable(true);
  for (int i = 0; i < 3; ++i) {
    profile::Scope step("test step");
    { profile::Scope a("part a"); }
    for (int j = 0; j < 2; ++j) {
      profile::Scope b(profile::part_name("part b"));
      profile::Scope c("part c");
    }
  }
  profile::enable(false);
  { profile::Scope ignored("ignored"); }  // disabled: not recorded
  std::vector<profile::Part> ps = profile::parts();
  auto find = [&](const std::string& name) -> const profile::Part* {
    for (const auto& p : ps)
      if (p.name == name) return &p;
    return nullptr;
  };
  ASSERT_TRUE(find("test step") && find("part a") && find("part b") && find("part c"));
  EXPECT_EQ(find("ignored"), nullptr);
  EXPECT_EQ(find("test step")->calls, 3);
  EXPECT_EQ(find("part b")->calls, 6);
  EXPECT_EQ(find("part c")->depth, 2);
  EXPECT_GE(find("test step")->seconds, find("part b")->seconds);
  std::ostringstream out;
  profile::print(out);
  EXPECT_NE(out.str().find("    part c"), std::string::npos) << out.str();  // indented under part b
  EXPECT_NE(out.str().find("100.0%"), std::string::npos) << out.str();
  profile::reset();
  for (const auto& p : profile::parts()) EXPECT_EQ(p.calls, 0);
}

}  // namespace
}  // namespace attn
