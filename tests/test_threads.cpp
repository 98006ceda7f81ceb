// Tests of attn's thread pool (threads.h) and of what it promises the rest of the library: every item
// once, chunk boundaries that do not depend on the thread count, one chunk at a time per worker, nested
// loops, exceptions, concurrent callers, loops on the caller alone while it is preempted (and the rule for when
// the workers are used again); and the same bits for 1, 2 and 3 threads through a GPT training step
// (every layer forward and backward, flash attention, cross-entropy, clipping, AdamW) and through KV-cache
// generation. gemm's own thread tests are in test_gemm.cpp, the kernels' in test_flash.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "attn/gpt.h"
#include "attn/threads.h"
#include "attn/train.h"
#include "test_util.h"

namespace attn {
namespace {

using test::error_of;

// Restores the thread count a test changed.
struct ThreadsGuard {
  int before = num_threads();
  ~ThreadsGuard() { set_num_threads(before); }
};

TEST(Pool, EveryItemOnceInChunksThatDoNotDependOnTheThreadCount) {
  ThreadsGuard guard;
  for (int64_t n : {0, 1, 7, 1000, 100003})
    for (int64_t grain : {1, 3, 64, 1 << 20}) {
      std::set<std::pair<int64_t, int64_t>> first;
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(testing::Message() << "n " << n << ", grain " << grain << ", threads " << threads);
        set_num_threads(threads);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mu;
        std::set<std::pair<int64_t, int64_t>> chunks;
        parallel_for(n, grain, [&](int64_t b, int64_t e, int worker) {
          ASSERT_GE(worker, 0);
          ASSERT_LT(worker, threads);
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
          std::lock_guard<std::mutex> lock(mu);
          chunks.insert({b, e});
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "item " << i;
        if (threads == 1) first = chunks;
        EXPECT_EQ(chunks, first);
      }
    }
}

TEST(Pool, OneChunkAtATimePerWorkerSoPerWorkerScratchIsSafe) {
  ThreadsGuard guard;
  set_num_threads(3);
  std::vector<std::atomic<int>> busy(3);
  std::atomic<int> overlaps{0};
  PerWorker<std::vector<int64_t>> scratch;
  std::atomic<int64_t> total{0};
  parallel_items(2000, int64_t(1) << 20, [&](int64_t i, int worker) {
    if (busy[size_t(worker)]++ != 0) overlaps++;
    std::vector<int64_t>& s = scratch.get(worker, size_t(16), int64_t(0));
    s.assign(16, i);
    int64_t sum = 0;
    for (int64_t x : s) sum += x;
    total += sum / 16;
    busy[size_t(worker)]--;
  });
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(total.load(), 1999 * 2000 / 2);
}

TEST(Pool, NestedLoopsRunSeriallyOnTheirWorker) {
  ThreadsGuard guard;
  set_num_threads(2);
  std::vector<std::atomic<int>> hits(64 * 50);
  parallel_items(64, int64_t(1) << 20, [&](int64_t i, int outer) {
    parallel_items(50, int64_t(1) << 20, [&](int64_t j, int inner) {
      EXPECT_EQ(inner, outer);
      hits[size_t(i * 50 + j)]++;
    });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(Pool, AnExceptionInABodyReachesTheCallerAndThePoolKeepsWorking) {
  ThreadsGuard guard;
  set_num_threads(2);
  EXPECT_EQ(error_of([] {
              parallel_items(100, int64_t(1) << 20,
                             [](int64_t i, int) { ATTN_CHECK(i != 57, "Expected no item 57, but got it instead"); });
            }),
            "Expected no item 57, but got it instead");
  std::atomic<int64_t> sum{0};
  parallel_items(100, int64_t(1) << 20, [&](int64_t i, int) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

// Parallel loops of 64 short chunks, back to back, for `d`: how many ran with the workers at rest (as the pool
// said after each: the rule is updated only at the start of a loop, by its caller), and how many of those still
// ran a chunk on a thread other than the caller.
struct Loops {
  int resting = 0, resting_elsewhere = 0;
};
Loops loops_for(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  const auto caller = std::this_thread::get_id();
  std::atomic<int64_t> sink{0};
  Loops loops;
  while (std::chrono::steady_clock::now() < until) {
    std::atomic<bool> elsewhere{false};
    parallel_for(64, 1, [&](int64_t b, int64_t, int) {
      uint64_t x = uint64_t(b);  // unsigned: the LCG wraps by definition
      for (int i = 0; i < 2000; ++i) x = x * 6364136223846793005u + 1;
      sink += x & 1;
      if (std::this_thread::get_id() != caller) elsewhere = true;
    });
    if (!workers_active()) ++loops.resting, loops.resting_elsewhere += elsewhere;
  }
  return loops;
}

TEST(Pool, WhileTheCallerIsPreemptedLoopsRunOnItAlone) {
  ThreadsGuard guard;
  set_num_threads(2);
  // twice as many busy threads as CPUs: the caller is preempted at every slice, hundreds of times a second
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  for (unsigned i = 0; i < 2 * std::thread::hardware_concurrency(); ++i)
    hogs.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  const Loops loops = loops_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : hogs) t.join();
  EXPECT_GT(loops.resting, 0) << "the workers were in use throughout while busy threads outnumbered the CPUs";
  EXPECT_EQ(loops.resting_elsewhere, 0) << "loops ran chunks on the workers while they were to rest";
}

// The rule itself, on made-up clocks and counts (whether the workers are used again depends on the machine
// being quiet).
TEST(Pool, ShareRuleRestsTheWorkersForAPauseThatDoublesWhileUsingThemFindsTheCoreSharedAndStartsOverWhenNot) {
  using detail::ShareRule;
  using ms = std::chrono::milliseconds;
  ShareRule rule;
  ShareRule::Clock::time_point t{};
  long preempted = 100;
  const auto check = [&](int elapsed_ms, long more) { return t += ms(elapsed_ms), rule.update(t, preempted += more); };
  EXPECT_TRUE(rule.due(t));      // a new rule is due at once, then after 15 ms, then every 50 ms
  EXPECT_TRUE(check(0, 0));     // the first call only records
  EXPECT_FALSE(rule.due(t + ms(14)));
  EXPECT_TRUE(rule.due(t + ms(15)));
  EXPECT_TRUE(check(15, 1));    // 67 a second: not shared
  EXPECT_FALSE(rule.due(t + ms(49)));
  EXPECT_TRUE(rule.due(t + ms(50)));
  EXPECT_TRUE(check(50, 3));    // 60 a second: not shared
  EXPECT_FALSE(check(50, 4));   // 80 a second: shared, a pause of 50 ms
  EXPECT_FALSE(check(25, 0));   // quiet, but within the pause
  EXPECT_TRUE(check(25, 0));    // the pause is over: the workers are used again
  EXPECT_FALSE(check(50, 10));  // shared while in use again: 100 ms
  EXPECT_FALSE(check(50, 0));
  EXPECT_FALSE(check(40, 9));   // shared while resting (a heavier neighbour): the pause starts again, not doubled
  EXPECT_FALSE(check(90, 0));
  EXPECT_TRUE(check(10, 0));    // 100 ms after it started
  for (int off : {200, 400, 800, 1000, 1000}) {  // shared each time they are used again: doubled up to 1 s
    EXPECT_FALSE(check(50, 20)) << off;
    EXPECT_FALSE(check(off - 1, 0)) << off;
    EXPECT_TRUE(check(1, 0)) << off;
  }
  EXPECT_TRUE(check(50, 0));    // a whole check in use, unshared: the doubling starts over
  EXPECT_FALSE(check(50, 4));
  EXPECT_TRUE(check(50, 0));    // a pause of 50 ms again
}

TEST(Pool, CallersOnSeveralThreadsEachGetTheirLoopDone) {
  ThreadsGuard guard;
  set_num_threads(2);
  std::vector<int64_t> sums(4, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 50; ++rep) {
        std::vector<int64_t> part(size_t(num_threads()), 0);
        parallel_for(10000, 100, [&](int64_t b, int64_t e, int w) {
          for (int64_t i = b; i < e; ++i) part[size_t(w)] += i;
        });
        for (int64_t p : part) sums[size_t(c)] += p;
      }
    });
  for (auto& t : callers) t.join();
  for (int64_t s : sums) EXPECT_EQ(s, int64_t(50) * (9999 * 10000 / 2));
}

TEST(Pool, ThreadCountsOutsideTheRangeAreNamed) {
  ThreadsGuard guard;
  EXPECT_EQ(error_of([] { set_num_threads(-1); }),
            "Expected num_threads in [0, 256] (0: the CPUs this process may use), but got -1 instead");
  EXPECT_EQ(error_of([] { set_num_threads(max_threads() + 1); }),
            "Expected num_threads in [0, 256] (0: the CPUs this process may use), but got 257 instead");
  set_num_threads(0);
  EXPECT_EQ(num_threads(), int(std::thread::hardware_concurrency()));  // no affinity mask set in the tests
}

// ---- The library through the pool: the same bits for 1, 2 and 3 threads ----

std::vector<float> bits_of_run(int threads) {
  TrainOptions o = synthetic_defaults();
  o.threads = threads;
  o.dropout = 0.1;   // the dropout streams too
  o.n_kv_head = 2;   // GQA in the attention
  Trainer t(o, Dataset::reverse_task());
  std::vector<float> out;
  for (int i = 0; i < 4; ++i) {
    const StepStats s = t.step();
    out.push_back(s.loss);
    out.push_back(float(s.grad_norm));
  }
  for (const Param& p : t.model().parameter_list()) {
    out.insert(out.end(), p.value->data(), p.value->data() + p.value->numel());
    out.insert(out.end(), p.grad->data(), p.grad->data() + p.grad->numel());
  }
  SampleOptions s;
  s.max_new_tokens = 40;  // past block_size: the cache is refilled too
  s.temperature = 0.8;
  s.top_k = 5;
  s.seed = 7;
  for (int64_t tok : generate(t.model(), {1, 2, 3}, s)) out.push_back(float(tok));
  return out;
}

TEST(SameBits, GptTrainingStepsAdamWAndGenerationForOneTwoAndThreeThreads) {
  ThreadsGuard guard;
  const std::vector<float> one = bits_of_run(1);
  for (int threads : {2, 3}) {
    SCOPED_TRACE(testing::Message() << threads << " threads");
    const std::vector<float> other = bits_of_run(threads);
    ASSERT_EQ(one.size(), other.size());
    for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], other[i]) << "element " << i;
  }
}

}  // namespace
}  // namespace attn
