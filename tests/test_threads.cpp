// Tests of attn's thread pool (threads.h) and of what it promises the rest of the library: every item
// once, chunk boundaries that do not depend on the thread count, one chunk at a time per worker, nested
// loops, exceptions, concurrent callers, idle workers that stop spinning while the caller is preempted; and
// the same bits for 1, 2 and 3 threads through a GPT training step (every layer forward and backward, flash
// attention, cross-entropy, clipping, AdamW) and through KV-cache generation. gemm's own thread tests are in
// test_gemm.cpp, the kernels' in test_flash.cpp.
#include <gtest/gtest.h>

#include <sys/resource.h>

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

// Parallel loops of 64 short chunks, back to back, for `d`.
void loops_for(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  std::atomic<int64_t> sink{0};
  while (std::chrono::steady_clock::now() < until)
    parallel_for(64, 1, [&](int64_t b, int64_t, int) {
      int64_t x = b;
      for (int i = 0; i < 2000; ++i) x = x * 6364136223846793005 + 1;
      sink += x & 1;
    });
}

long involuntary_switches() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_nivcsw;
}

TEST(Pool, IdleWorkersStopSpinningWhileTheCallerIsPreemptedAndSpinAgainWhenItIsNot) {
  ThreadsGuard guard;
  set_num_threads(2);
  {  // more busy threads than CPUs: the caller is preempted at every slice, hundreds of times a second
    std::atomic<bool> stop{false};
    std::vector<std::thread> hogs;
    for (unsigned i = 0; i <= std::thread::hardware_concurrency(); ++i)
      hogs.emplace_back([&] {
        while (!stop.load(std::memory_order_relaxed)) {
        }
      });
    loops_for(std::chrono::milliseconds(300));
    const bool spun = workers_spin();
    stop = true;
    for (auto& t : hogs) t.join();
    EXPECT_FALSE(spun) << "workers spun while busy threads outnumbered the CPUs";
  }
  // after the longest pause of spinning (1 s), 120 ms of loops with at most 3 preemptions (counted as the pool
  // counts them) span two checks at least 50 ms apart, the last of which then saw at most 60 a second
  loops_for(std::chrono::milliseconds(1100));
  for (int tries = 0; tries < 50; ++tries) {
    const long before = involuntary_switches();
    loops_for(std::chrono::milliseconds(120));
    if (involuntary_switches() - before > 3) continue;
    EXPECT_TRUE(workers_spin()) << "workers still sleep at once after 120 ms with at most 3 preemptions";
    return;
  }
  GTEST_SKIP() << "this machine never ran the caller 120 ms with at most 3 preemptions in 50 tries";
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
