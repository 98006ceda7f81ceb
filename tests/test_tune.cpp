// Tests of blocking by measurement (attn/tune.h, src/kernels/tune.cpp): attn tune writes the per-user file
// atomically and keeps other CPUs' entries, the kernels then use what was chosen (gemm_kernel and
// tuning_summary say so), a tuned blocking gives the same bits as the derived one, and a malformed file or
// forced caches fall back to the derived blocking without a crash. Not the speed of any choice.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/sdpa.h"
#include "attn/simd.h"
#include "attn/tune.h"
#include "test_util.h"

namespace attn {
namespace {

// The tuning file at a temporary path for the test's scope.
struct TuneFile {
  test::TempDir dir;
  std::string path = dir / "tune.json";
  TuneFile() {
    ::setenv("ATTN_TUNE_FILE", path.c_str(), 1);
    reload_tuning();
  }
  ~TuneFile() {
    ::unsetenv("ATTN_TUNE_FILE");
    reload_tuning();
  }
  void write(const std::string& text) const {
    std::ofstream(path) << text;
    reload_tuning();
  }
};

std::vector<float> gemm_result(int64_t M, int64_t N, int64_t K, bool ta = false) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t(M * K)), b(size_t(K * N)), c(size_t(M * N));
  for (float& x : a) x = u(gen);
  for (float& x : b) x = u(gen);
  gemm(ta, false, M, N, K, 1.f, a.data(), ta ? M : K, b.data(), N, 0.f, c.data(), N);
  return c;
}

std::vector<float> flash_result() {
  const int64_t H = 4, L = 300, D = 32;
  std::mt19937 gen(6);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> q(size_t(H * L * D)), o(q.size());
  for (float& x : q) x = u(gen);
  const SdpaArgs<float> a{{q.data(), {1, H, L, D}}, {q.data(), {1, H, L, D}}, {q.data(), {1, H, L, D}}};
  sdpa(a, SdpaOut<float>{{o.data(), {1, H, L, D}}, {}, {}}, {Backend::flash, false});
  return o;
}

TEST(Tune, SavesTheFastestAndTheKernelsUseIt) {
  TuneFile f;
  f.write(R"({"version": 1, "entries": {"another CPU|avx2|L1d 32K|AVX2": {"gemm_kc": 256}}})");
  EXPECT_EQ(tuned_for(simd_target_bits()), nullptr);
  EXPECT_NE(tuning_summary().find("run `attn tune`"), std::string::npos) << tuning_summary();
  const TuneReport r = tune({0.3, true});
  EXPECT_EQ(r.path, f.path);
  EXPECT_EQ(r.key, tuning_key());
  // the target's register blocks, 2 loop orders, 8 + 5 + 4 + 5 + 4 blockings, and 4 flash tiles
  EXPECT_EQ(r.rows.size(), gemm_register_blocks().size() + 32u);
  EXPECT_EQ(r.budget, 0.3);
  int chosen = 0;
  for (const TuneRow& row : r.rows) {
    chosen += row.chosen;
    EXPECT_GT(row.score, 0) << row.kernel;
    EXPECT_LE(row.lo, row.score * (1 + 1e-12)) << row.kernel;  // the median round lies within the range
    EXPECT_GE(row.hi, row.score * (1 - 1e-12)) << row.kernel;
    EXPECT_EQ(row.gflops.size(), (row.kernel == "gemm" ? r.gemm_shapes : r.flash_shapes).size());
  }
  EXPECT_EQ(chosen, 2);  // one GEMM row and one flash row
  const std::string text = to_string(r);
  EXPECT_NE(text.find("<- chosen"), std::string::npos) << text;

  const nlohmann::json j = nlohmann::json::parse(std::ifstream(f.path));
  ASSERT_TRUE(j["entries"].contains(tuning_key())) << j.dump();
  EXPECT_TRUE(j["entries"].contains("another CPU|avx2|L1d 32K|AVX2")) << "other CPUs' entries are kept";
  EXPECT_EQ(j["entries"][tuning_key()]["gemm_kc"], r.chosen.gemm_kc);
  const Tuning* t = tuned_for(simd_target_bits());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->gemm_kc, r.chosen.gemm_kc);
  EXPECT_EQ(t->flash_rows, r.chosen.flash_rows);
  EXPECT_FALSE(t->measured.empty());
  EXPECT_NE(tuning_summary().find("measured"), std::string::npos) << tuning_summary();
  EXPECT_NE(gemm_kernel().find("(tuned)"), std::string::npos) << gemm_kernel();
  EXPECT_EQ(flash_tiles().rows, t->flash_rows ? t->flash_rows : 256);
}

// The choice rule on the numbers of a real run: 53.1 and 57.0 GFLOP/s for one configuration in two stages.
TEST(Tune, ChoosesOnlyBeyondTheMeasuredSpread) {
  const auto row = [](double lo, double score, double hi) {
    return TuneRow{"gemm", {}, {score}, score, lo, hi, false};
  };
  const TuneRow kept = row(53.1, 55.0, 57.0);
  EXPECT_FALSE(clearly_faster(row(56.0, 57.5, 59.0), kept)) << "a higher median within the noise";
  EXPECT_FALSE(clearly_faster(row(57.0, 58.0, 59.0), kept)) << "touching ranges";
  EXPECT_TRUE(clearly_faster(row(57.2, 58.0, 59.0), kept));
  EXPECT_FALSE(clearly_faster(kept, kept));
}

// The plan fits the budget: every candidate's warm-up and minimum rounds on the shapes it takes, the
// cheapest first, and the flash forward at the longest L that fits what is left.
TEST(Tune, PlanFitsTheBudget) {
  const std::vector<double> cost = {0.002, 0.011, 0.002, 0.011, 0.043, 0.043};  // seconds per run, as measured here
  constexpr double kRuns = 1 + kTuneMinRounds;
  for (double budget : {0.5, 2.0, 3.0, 10.0, 30.0}) {
    const TunePlan p = plan_tune(cost, 0.012, budget);
    ASSERT_GE(p.gemm_shapes, 1u);
    double round = 0;
    for (size_t i = 0; i < p.gemm_shapes; ++i) round += cost[i];
    const double flash = 0.012 * double(p.flash_length * p.flash_length) / (512.0 * 512) * kTuneFlashCandidates * kRuns;
    EXPECT_NEAR(p.seconds, round * kTuneGemmCandidates * kRuns + flash, 1e-12);
    EXPECT_LE(p.seconds, budget) << budget << " s: " << p.gemm_shapes << " shapes, flash L " << p.flash_length;
    if (p.gemm_shapes < cost.size()) {  // the next shape would not have fitted
      const double gemm_share = budget * kTuneGemmCandidates / (kTuneGemmCandidates + kTuneFlashCandidates);
      EXPECT_GT((round + cost[p.gemm_shapes]) * kTuneGemmCandidates * kRuns, gemm_share) << budget;
    }
  }
  EXPECT_EQ(plan_tune(cost, 0.012, 3.0).gemm_shapes, 3u);  // the budget the README gives: the training shapes
  EXPECT_EQ(plan_tune(cost, 0.012, 30.0).gemm_shapes, 6u);
  EXPECT_EQ(plan_tune(cost, 0.012, 30.0).flash_length, 1024);
  EXPECT_EQ(plan_tune({1.0}, 1.0, 0.5).gemm_shapes, 1u) << "one shape however small the budget";
  EXPECT_EQ(plan_tune({1.0}, 1.0, 0.5).flash_length, 64);
}

TEST(Tune, BlockingChangesNoBits) {
  TuneFile f;
  const std::vector<float> g = gemm_result(70, 130, 1000), gt = gemm_result(70, 130, 1000, true), fl = flash_result();
  const Tuning ts[] = {
      {.gemm_kc = 16, .gemm_mc = 6, .gemm_nt = 64, .gemm_pack_a = 1, .gemm_pack_at = 1 << 30, .flash_rows = 64},
      {.gemm_keep_b = 1, .gemm_kc = 200, .gemm_mc = 384, .gemm_nt = 4096, .gemm_pack_a = 1 << 30, .gemm_pack_at = 1,
       .flash_rows = 512},
      {.gemm_keep_b = 1, .gemm_kc = 1000, .gemm_mc = 12, .gemm_nt = 16, .gemm_pack_a = 2, .gemm_pack_at = 2,
       .flash_rows = 7}};
  const std::vector<RegisterBlock> blocks = gemm_register_blocks();
  ASSERT_GE(blocks.size(), 2u) << "a target with one register block: nothing for attn tune to choose";
  for (size_t i = 0; i < std::size(ts); ++i) {
    Tuning t = ts[i];
    const RegisterBlock rb = blocks[(i + 1) % blocks.size()];  // another block than the derived one first
    t.gemm_mr = rb.rows;
    force_tuning(t);
    const std::string block = std::to_string(rb.rows) + "x" + std::to_string(rb.cols) + " (float)";
    EXPECT_NE(gemm_kernel().find(block), std::string::npos) << gemm_kernel() << " runs, not " << block;
    EXPECT_EQ(gemm_result(70, 130, 1000), g) << "block " << block << " keep_b " << t.gemm_keep_b << " kc "
                                             << t.gemm_kc << " mc " << t.gemm_mc << " nt " << t.gemm_nt << " pack_a "
                                             << t.gemm_pack_a;
    EXPECT_EQ(gemm_result(70, 130, 1000, true), gt) << "kc " << t.gemm_kc << " mc " << t.gemm_mc << " nt "
                                                      << t.gemm_nt << " pack_at " << t.gemm_pack_at;
    EXPECT_EQ(flash_result(), fl) << "rows " << t.flash_rows;
  }
  clear_forced_tuning();
}

TEST(Tune, MalformedFileOrForcedCachesFallBackToDerived) {
  TuneFile f;
  for (const char* bad : {"{not json", "[1, 2]", R"({"version": 2, "entries": {}})"}) {
    f.write(bad);
    EXPECT_EQ(tuned_for(simd_target_bits()), nullptr) << bad;
    EXPECT_NE(gemm_kernel().find("(derived)"), std::string::npos) << bad;
  }
  nlohmann::json j = {{"version", 1}, {"entries", {{tuning_key(), {{"gemm_kc", -5}}}}}};
  f.write(j.dump());
  EXPECT_EQ(tuned_for(simd_target_bits()), nullptr) << "an out-of-range entry is ignored";
  j["entries"][tuning_key()] = {{"gemm_kc", 128}, {"measured", "then"}};
  f.write(j.dump());
  ASSERT_NE(tuned_for(simd_target_bits()), nullptr);
  EXPECT_EQ(tuned_for(simd_target_bits())->gemm_kc, 128);
  const int64_t l1d = cpu_info().l1d, l2 = cpu_info().l2;
  set_cpu_caches(2 * l1d, 2 * l2);  // another CPU's caches: its blocking is derived, not this one's tuning
  EXPECT_EQ(tuned_for(simd_target_bits()), nullptr);
  set_cpu_caches(l1d, l2);
}

}  // namespace
}  // namespace attn
