// Data-parallel training (attn/data_parallel.h, Trainer::distribute) on the 2, 3 and 4 ranks ctest runs
// this with: every rank also trains the one-process run itself (no MPI in it) and compares. Losses within
// 1e-5 relative per step of one process on the same global batch (GQA, dropout, an untied head and a
// batch that N does not divide included), identical bits when repeated and for any bucketing, the same
// parameters on every rank, checkpoints that resume on any N (written by N, resumed by 1 and by N; written
// by 2 ranks, resumed by 3 and 4), and errors that reach every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "attn/data_parallel.h"
#include "attn/train.h"

using namespace attn;
using test::error_of;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 20;

std::string shakespeare_like() {  // 5.4k characters of varied text: windows differ from row to row
  const char* words[] = {"to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler",
                         "in", "mind", "suffer", "slings", "and", "arrows", "of", "outrageous", "fortune,"};
  std::string s;
  uint64_t x = 7;
  for (int i = 0; i < 900; ++i) {
    x = mix64(x);
    s += words[x % 20];
    s += (x >> 8) % 11 == 0 ? ".\n" : " ";
  }
  return s;
}

struct Case {
  std::string name;
  TrainOptions o;
  bool text;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  TrainOptions task = synthetic_defaults();  // the reversal task, tiny model, batch 32
  task.steps = kSteps, task.threads = 1, task.eval_iters = 2;
  c.push_back({"task", task, false});
  TrainOptions text;  // nanoGPT-like: GQA, dropout on every layer, an untied head, batch 7 (N does not divide it)
  text.config = "tiny", text.block_size = 16, text.n_kv_head = 2, text.tie_weights = false, text.dropout = 0.1;
  text.batch = 7, text.steps = kSteps, text.warmup = 2, text.lr = 3e-3, text.eval_iters = 2, text.threads = 1;
  c.push_back({"text_gqa_dropout_untied", text, true});
  return c;
}

Dataset data_of(const Case& c) { return c.text ? Dataset::text(shakespeare_like()) : Dataset::reverse_task(); }

uint64_t params_hash(Trainer& t) {
  uint64_t h = fnv1a64(nullptr, 0);
  for (const Param& p : t.model().parameter_list()) h = fnv1a64(p.value->data(), size_t(p.value->numel()) * 4, h);
  return h;
}

std::vector<StepStats> run(Trainer& t, int64_t until) {
  std::vector<StepStats> s;
  while (t.step_count() < until) s.push_back(t.step());
  return s;
}

void expect_close(const std::vector<StepStats>& got, const std::vector<StepStats>& want, int64_t first_step,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i].loss, want[i].loss, 1e-5 * std::abs(want[i].loss))
        << what << ", step " << first_step + int64_t(i) << " of " << dist::size() << " ranks";
    EXPECT_NEAR(got[i].grad_norm, want[i].grad_norm, 1e-4 * want[i].grad_norm) << what << ", step " << i;
  }
}

// A folder every rank sees (rank 0's mkdtemp), removed at the end of the scope.
struct SharedDir {
  std::string dir;
  SharedDir() {
    char path[256] = {};
    if (dist::rank() == 0) {
      std::string tmpl = (fs::temp_directory_path() / "attn_dp_XXXXXX").string();
      std::strncpy(path, ::mkdtemp(tmpl.data()), sizeof path - 1);
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, dist::world());
    dir = path;
  }
  ~SharedDir() {
    MPI_Barrier(dist::world());
    if (dist::rank() == 0) fs::remove_all(dir);
  }
  std::string operator/(const std::string& name) const { return dir + "/" + name; }
};

}  // namespace

TEST(DataParallel, LossesFollowOneProcessOnTheSameGlobalBatch) {
  for (const Case& c : cases()) {
    Trainer one(c.o, data_of(c));
    const std::vector<StepStats> want = run(one, kSteps);
    const EvalStats want_eval = one.evaluate();

    Trainer dp(c.o, data_of(c));
    dp.distribute(std::make_shared<DataParallel>());
    const std::vector<StepStats> got = run(dp, kSteps);
    expect_close(got, want, 0, c.name);
    EXPECT_LT(got.back().loss, got.front().loss) << c.name;  // it trains
    const EvalStats eval = dp.evaluate();  // each rank evaluates its rows of every batch
    EXPECT_NEAR(eval.train_loss, want_eval.train_loss, 1e-5 * want_eval.train_loss) << c.name;
    EXPECT_NEAR(eval.val_loss, want_eval.val_loss, 1e-5 * want_eval.val_loss) << c.name;
    EXPECT_TRUE(dp.sync()->same_everywhere(params_hash(dp))) << c.name << ": ranks hold different parameters";

    const SyncStats st = dp.sync()->stats();
    EXPECT_EQ(st.steps, kSteps);
    EXPECT_EQ(st.bytes, 4.0 * double(dp.model().num_parameters()));
    EXPECT_GE(st.buckets, 1);
    EXPECT_GE(st.busy_seconds, st.wait_seconds);
  }
}

TEST(DataParallel, RepeatedRunsAndAnyBucketingGiveTheSameBits) {
  // Every element is summed in rank order whatever the buckets and slices, so bucketing and overlap
  // change no bit; nor does the thread count.
  for (const Case& c : cases()) {
    std::vector<std::vector<StepStats>> runs;
    std::vector<uint64_t> hashes;
    const DataParallelOptions variants[] = {{}, {}, {1, true}, {int64_t(1) << 30, true}, {4096, false}};
    int i = 0;
    for (const DataParallelOptions& v : variants) {
      TrainOptions o = c.o;
      o.threads = i++ == 1 ? 2 : 1;
      Trainer t(o, data_of(c));
      auto dp = std::make_shared<DataParallel>(dist::world(), v);
      t.distribute(dp);
      runs.push_back(run(t, kSteps));
      hashes.push_back(params_hash(t));
      if (v.bucket_bytes == 1) {
        EXPECT_EQ(size_t(dp->stats().buckets), t.model().grad_groups().size());
      } else if (v.bucket_bytes == int64_t(1) << 30) {
        EXPECT_EQ(dp->stats().buckets, 1);
      }
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      EXPECT_EQ(hashes[r], hashes[0]) << c.name << ", variant " << r;
      for (size_t s = 0; s < runs[0].size(); ++s) {
        EXPECT_EQ(runs[r][s].loss, runs[0][s].loss) << c.name << ", variant " << r << ", step " << s;
        EXPECT_EQ(runs[r][s].grad_norm, runs[0][s].grad_norm) << c.name << ", variant " << r << ", step " << s;
      }
    }
  }
}

TEST(DataParallel, CheckpointResumesAloneOrOnAllRanksOnTheSameTrajectory) {
  SharedDir tmp;
  for (const Case& c : cases()) {
    Trainer one(c.o, data_of(c));
    const std::vector<StepStats> want = run(one, kSteps);
    const std::vector<StepStats> want_rest(want.begin() + kSteps / 2, want.end());

    Trainer dp(c.o, data_of(c));
    dp.distribute(std::make_shared<DataParallel>());
    run(dp, kSteps / 2);
    dp.save(tmp / c.name);  // rank 0 writes; every rank returns once it is there
    ASSERT_TRUE(fs::is_regular_file(tmp / c.name + "/config.json")) << "rank " << dist::rank();

    // One process alone (as -np 1 would), on every rank at once: reading is shared.
    auto alone = Trainer::resume(tmp / c.name, std::make_unique<Dataset>(data_of(c)));
    expect_close(run(*alone, kSteps), want_rest, kSteps / 2, c.name + " resumed by one process");

    auto again = Trainer::resume(tmp / c.name, std::make_unique<Dataset>(data_of(c)));
    again->distribute(std::make_shared<DataParallel>());
    expect_close(run(*again, kSteps), want_rest, kSteps / 2, c.name + " resumed on all ranks");

    // Written by 2 processes (ranks 0 and 1 alone), resumed by all of them: N = 2 -> 3 and 4.
    if (dist::size() < 3) continue;
    MPI_Comm two = MPI_COMM_NULL;
    MPI_Comm_split(dist::world(), dist::rank() < 2 ? 0 : MPI_UNDEFINED, dist::rank(), &two);
    if (two != MPI_COMM_NULL) {
      Trainer pair(c.o, data_of(c));
      pair.distribute(std::make_shared<DataParallel>(two));
      run(pair, kSteps / 2);
      pair.save(tmp / (c.name + "_by_2"));
      MPI_Comm_free(&two);
    }
    MPI_Barrier(dist::world());
    auto wider = Trainer::resume(tmp / (c.name + "_by_2"), std::make_unique<Dataset>(data_of(c)));
    wider->distribute(std::make_shared<DataParallel>());
    expect_close(run(*wider, kSteps), want_rest, kSteps / 2, c.name + " written by 2 ranks, resumed on all");
  }
}

TEST(DataParallel, ErrorsReachEveryRank) {
  const Case c = cases()[0];
  // A failed save on rank 0 is every rank's error.
  SharedDir tmp;
  if (dist::rank() == 0) std::ofstream(tmp / "file") << "x";
  MPI_Barrier(dist::world());
  Trainer t(c.o, data_of(c));
  t.distribute(std::make_shared<DataParallel>());
  t.step();
  std::string msg = error_of([&] { t.save(tmp / "file/ck"); });
  EXPECT_NE(msg, "") << "rank " << dist::rank();
  EXPECT_TRUE(t.sync()->same_everywhere(fnv1a64(msg.data(), msg.size()))) << msg;

  // Processes that hold different runs are refused before the first step.
  TrainOptions o = c.o;
  o.seed += uint64_t(dist::rank());
  Trainer mixed(o, data_of(c));
  msg = error_of([&] { mixed.distribute(std::make_shared<DataParallel>()); });
  EXPECT_NE(msg.find("Expected the same model, options, data and step on all"), std::string::npos) << msg;

  // A batch smaller than the number of processes leaves some without rows.
  o = c.o;
  o.batch = dist::size() - 1;
  Trainer small(o, data_of(c));
  msg = error_of([&] { small.distribute(std::make_shared<DataParallel>()); });
  EXPECT_NE(msg.find("Expected batch >= " + std::to_string(dist::size())), std::string::npos) << msg;
}

TEST(DataParallel, SumsAddInRankOrder) {
  auto dp = std::make_shared<DataParallel>();
  // 1e16 + 1 - 1e16 ...: a different order would give another value on some rank count.
  double v[2] = {dist::rank() == 0 ? 1e16 : (dist::rank() == 1 ? 1.0 : -1e16 / (dist::size() - 2)),
                 double(dist::rank())};
  dp->sum(v, 2);
  double want = 1e16;
  for (int r = 1; r < dist::size(); ++r) want += r == 1 ? 1.0 : -1e16 / (dist::size() - 2);
  EXPECT_EQ(v[0], want);
  EXPECT_EQ(v[1], dist::size() * (dist::size() - 1) / 2);
  EXPECT_EQ(dp->first_error(""), "");
  EXPECT_EQ(dp->first_error(dist::rank() >= 1 ? "rank " + std::to_string(dist::rank()) : ""), "rank 1");
}
