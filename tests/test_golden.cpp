// Golden training runs: 20 optimizer steps of fixed seeds. A faster step must give the same bits: the 20
// losses and a hash of every parameter afterwards. Not a test of learning (test_train.cpp).
// The bits depend on nothing the machine decides (gemm.cpp and flash_common.h say how: one FMA chain per
// GEMM element, key tiles and virtual lanes fixed by the algorithm), so one set of goldens holds on every
// AVX2 and AVX-512 CPU, for any thread count, SIMD target with FMA or cache size: each run below is
// repeated with the AVX2 target forced and with other caches (set_cpu_caches), and never skips.
// Recorded on 2026-12-01 on an AMD EPYC (Zen 5, AVX3, L1d 48 KiB) when the GEMM became one FMA chain per
// element (issue 18; the nanoGPT run kept its earlier bits). To record again from a known-good commit:
// ATTN_PRINT_GOLDEN=1 build/test_golden.
#include <gtest/gtest.h>
#include <hwy/targets.h>  // with the library's HWY_DISABLED_TARGETS (CMakeLists.txt)

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/threads.h"
#include "attn/train.h"
#include "test_util.h"

namespace attn {
namespace {

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

constexpr Golden kTiny = {0x07f8242cc6fed5b8ull, 0xadbbe8fe3e6cb0b5ull};
constexpr Golden kNanogpt = {0x7311a3b4136a24feull, 0x41f65ddfb939d057ull};

void expect_golden(const char* name, const Golden& got, const Golden& want) {
  if (std::getenv("ATTN_PRINT_GOLDEN"))
    std::printf("%s = {0x%016llxull, 0x%016llxull}\n", name, (unsigned long long)got.losses,
                (unsigned long long)got.params);
  EXPECT_EQ(got.losses, want.losses) << name << ": the 20 losses changed";
  EXPECT_EQ(got.params, want.params) << name << ": the parameters after 20 steps changed";
}

// How the machine is made to look: threads, the SIMD target (0: the best one), the caches (0: as read).
struct Machine {
  int threads;
  int64_t target, l1d, l2;
};

std::string name_of(const testing::TestParamInfo<Machine>& i) {
  const Machine& m = i.param;
  return std::to_string(m.threads) + "threads" + (m.target ? std::string("_") + hwy::TargetName(m.target) : "") +
         (m.l1d ? "_L1d" + std::to_string(m.l1d >> 10) + "K_L2" + std::to_string(m.l2 >> 10) + "K" : "");
}

class GoldenRun : public ::testing::TestWithParam<Machine> {
 protected:
  void SetUp() override {
    const Machine& m = GetParam();
    if (m.threads > max_threads()) GTEST_SKIP() << "needs " << m.threads << " threads";
    if (m.target && (hwy::SupportedTargets() & m.target) == 0)  // e.g. AVX2 on a CPU without it: no FMA
      GTEST_SKIP() << hwy::TargetName(m.target) << " is not supported by this CPU";
    as_.emplace(m.target, m.l1d, m.l2, m.threads);
  }
  void TearDown() override { as_.reset(); }
  std::optional<test::PretendMachine> as_;
};

TEST_P(GoldenRun, TinyReverseTaskWithDropout) {
  expect_golden("kTiny", run(tiny_options(GetParam().threads), Dataset::reverse_task()), kTiny);
}

TEST_P(GoldenRun, NanogptCpuShapeOnText) {
  expect_golden("kNanogpt", run(nanogpt_options(GetParam().threads), Dataset::text(golden_text())), kNanogpt);
}

// The machine as it is, 1 and 2 threads; AVX2 forced (on an AVX-512 CPU: the other FMA target); caches of
// a Zen 4 (L1d 32 KiB) and of a 2 MiB-L2 Xeon, which change the GEMM's K block and tiles.
INSTANTIATE_TEST_SUITE_P(Machines, GoldenRun,
                         ::testing::Values(Machine{1, 0, 0, 0}, Machine{2, 0, 0, 0}, Machine{2, HWY_AVX2, 0, 0},
                                           Machine{1, 0, 32 << 10, 512 << 10}, Machine{2, HWY_AVX2, 48 << 10, 2 << 20}),
                         name_of);

}  // namespace
}  // namespace attn
