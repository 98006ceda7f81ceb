// Golden training runs: 20 optimizer steps of fixed seeds, for 1 and 2 threads. A faster step must give the
// same bits: the 20 losses and a hash of every parameter afterwards. Not a test of learning (test_train.cpp).
// First recorded on OpenBLAS before the training-speed work of issue #9 (which matched them bit for bit);
// recorded again with attn's own GEMM on an AMD EPYC (Zen 5, AVX3, L1d 48 KiB) when that GEMM landed, and
// once more when attn was compiled with -ffp-contract=off (no FMA the source does not write), since when a
// Release and a RelWithDebInfo or sanitizer build give the same bits (they did not: flash_backward).
//
// The bits depend on the GEMM kernel: its SIMD target and its K blocking, which comes from the L1d size.
// So each thread count has its goldens beside a fingerprint of one GEMM product; where the fingerprint
// differs (another CPU) the test skips and says so. With attn's GEMM both thread counts give one set of
// bits. To record again from a known-good commit: ATTN_PRINT_GOLDEN=1 build/test_golden.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attn/gemm.h"
#include "attn/threads.h"
#include "attn/train.h"

namespace attn {
namespace {

// FNV-1a of one product (65, 67) = (65, 129) · (129, 67)ᵀ of fixed inputs: which GEMM kernel ran.
uint64_t gemm_fingerprint() {
  const int64_t M = 65, N = 67, K = 129;
  std::vector<float> a(size_t(M * K)), b(size_t(N * K)), c(size_t(M * N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int64_t(i * 7919 % 1000) - 500) / 337.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int64_t(i * 104729 % 1000) - 500) / 291.0f;
  gemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
  return fnv1a64(c.data(), c.size() * sizeof(float));
}

// An in-memory text (no data file needed): a fixed pseudo-random string over 40 characters.
std::string golden_text() {
  std::string s;
  uint64_t x = 12345;
  for (int i = 0; i < 20000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += char('a' + (x >> 33) % 26);
    if ((x >> 20) % 7 == 0) s += ' ';
    if ((x >> 24) % 61 == 0) s += '\n';
  }
  return s;
}

struct Golden {
  uint64_t losses;  // FNV-1a of the 20 float losses
  uint64_t params;  // FNV-1a of every parameter's float bits, in state_dict order
};

Golden run(const TrainOptions& o, Dataset d) {
  Trainer t(o, std::move(d));
  std::vector<float> losses;
  for (int i = 0; i < 20; ++i) losses.push_back(t.step().loss);
  uint64_t h = fnv1a64(nullptr, 0);
  for (const Param& p : t.model().parameter_list()) h = fnv1a64(p.value->data(), size_t(p.value->numel()) * 4, h);
  return {fnv1a64(losses.data(), losses.size() * sizeof(float)), h};
}

// The tiny model on the reversal task with dropout 0.1 (biases, dropout streams, ignored targets).
TrainOptions tiny_options(int threads) {
  TrainOptions o = synthetic_defaults();
  o.dropout = 0.1;
  o.threads = threads;
  return o;
}

// nanoGPT's CPU shape (no biases, dropout 0, E 128) on a short block and batch.
TrainOptions nanogpt_options(int threads) {
  TrainOptions o;
  o.config = "nanogpt-cpu";
  o.block_size = 32;
  o.batch = 4;
  o.steps = 20;
  o.warmup = 5;
  o.threads = threads;
  return o;
}

// Recorded on 2026-12-01 from commit 605068c (before issue #9), OpenBLAS on the build machine; [0] for
// 1 thread, [1] for 2.
constexpr uint64_t kGemmFingerprint[2] = {0xaef4679334da3d85ull, 0xaef4679334da3d85ull};
constexpr Golden kTiny[2] = {{0xa76e1c45d9328c70ull, 0xd490a89379ee93e6ull}, {0xa76e1c45d9328c70ull, 0xd490a89379ee93e6ull}};
constexpr Golden kNanogpt[2] = {{0x7311a3b4136a24feull, 0x41f65ddfb939d057ull}, {0x7311a3b4136a24feull, 0x41f65ddfb939d057ull}};

void expect_golden(const char* name, const Golden& got, const Golden& want) {
  if (std::getenv("ATTN_PRINT_GOLDEN"))
    std::printf("%s = {0x%016llxull, 0x%016llxull}\n", name, (unsigned long long)got.losses,
                (unsigned long long)got.params);
  EXPECT_EQ(got.losses, want.losses) << name << ": the 20 losses changed";
  EXPECT_EQ(got.params, want.params) << name << ": the parameters after 20 steps changed";
}

class GoldenRun : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() > max_threads()) GTEST_SKIP() << "needs " << GetParam() << " threads";
    set_num_threads(GetParam());
    const uint64_t f = gemm_fingerprint();
    if (std::getenv("ATTN_PRINT_GOLDEN"))
      std::printf("kGemmFingerprint[%d] = 0x%016llxull\n", GetParam() - 1, (unsigned long long)f);
    if (f != kGemmFingerprint[GetParam() - 1] && !recording())
      GTEST_SKIP() << "the GEMM kernel differs from the one the goldens were recorded with (fingerprint 0x" << std::hex
                   << f << "): record them again from a known-good commit";
  }
  void TearDown() override { set_num_threads(max_threads()); }

  // Recording mode: run even where the fingerprint differs, so the new values can be printed.
  static bool recording() { return std::getenv("ATTN_PRINT_GOLDEN") != nullptr; }
};

TEST_P(GoldenRun, TinyReverseTaskWithDropout) {
  expect_golden("kTiny", run(tiny_options(GetParam()), Dataset::reverse_task()), kTiny[GetParam() - 1]);
}

TEST_P(GoldenRun, NanogptCpuShapeOnText) {
  expect_golden("kNanogpt", run(nanogpt_options(GetParam()), Dataset::text(golden_text())),
                kNanogpt[GetParam() - 1]);
}

// Named by the thread count (GoldenRun.X/2_threads), not gtest's index (GoldenRun.X/1 was 2 threads).
INSTANTIATE_TEST_SUITE_P(Threads, GoldenRun, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "_threads"; });

}  // namespace
}  // namespace attn
