// The thread pool behind parallel_for: n-1 workers plus the calling thread, one job at a time.
// A job is a count of chunks; every thread claims the next chunk with one atomic add until none is left.
// Waiting: a worker spins for kSpin after its last chunk (back-to-back loops of a training step find it
// awake), then sleeps on a futex; the caller spins, then yields its core.
#include "attn/threads.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "attn/check.h"

namespace attn {
namespace {

constexpr int kMaxThreads = 256;
constexpr auto kSpin = std::chrono::microseconds(100);  // bounded: ~one short serial gap of a training step

thread_local int tl_worker = -1;  // this thread's worker index inside a job; -1 outside

struct Job {
  detail::ChunkFn fn;
  void* ctx;
  int64_t n, grain, chunks;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex err_mu;
  std::exception_ptr err;

  void run(int worker) {
    tl_worker = worker;
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      try {
        fn(ctx, c * grain, std::min(n, (c + 1) * grain), worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (!err) err = std::current_exception();
      }
      done.fetch_add(1, std::memory_order_release);
    }
    tl_worker = -1;
  }
};

// futex(2) on a 32-bit counter: sleep while it still reads `seen`; wake every sleeper. (Not
// std::atomic::wait: GCC 12's notify can miss a sleeper that is about to wait.)
void futex_wait(std::atomic<uint32_t>& word, uint32_t seen) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// Spins until pred() or kSpin has passed; returns pred().
template <typename Pred>
bool spin_until(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    _mm_pause();
    if ((i & 255) == 255 && std::chrono::steady_clock::now() > until) return pred();
  }
}

int default_threads() {
  if (const char* env = std::getenv("ATTN_NUM_THREADS"); env && std::atoi(env) >= 1)
    return std::min(std::atoi(env), kMaxThreads);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::clamp(CPU_COUNT(&set), 1, kMaxThreads);
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxThreads);
}

class Pool {
 public:
  Pool() { resize(default_threads()); }
  ~Pool() { stop_workers(); }

  int threads() const { return threads_; }

  void resize(int n) {
    std::lock_guard<std::mutex> lock(call_mu_);
    stop_workers();
    threads_ = 1;
    stop_ = false;
    try {
      const uint32_t now = epoch_.load();  // read here: a thread that starts late must still see a stop
      for (int w = 1; w < n; ++w) workers_.emplace_back([this, w, now] { work(w, now); });
    } catch (const std::system_error& e) {
      stop_workers();
      throw Error(cat("Expected to start ", n, " threads, but thread ", workers_.size() + 1,
                      " could not be started (", e.what(), ") instead"));
    }
    threads_ = n;
  }

  void run(int64_t n, int64_t grain, detail::ChunkFn fn, void* ctx) {
    grain = std::max<int64_t>(grain, 1);
    const int64_t chunks = (n + grain - 1) / grain;
    std::unique_lock<std::mutex> lock(call_mu_, std::defer_lock);
    if (chunks <= 1 || threads_ == 1 || tl_worker >= 0 || !lock.try_lock()) {
      // serial, same chunks: nested in a job (keep this worker's index), one thread, or the pool is busy
      const int worker = tl_worker >= 0 ? tl_worker : 0;
      for (int64_t c = 0; c < chunks; ++c) fn(ctx, c * grain, std::min(n, (c + 1) * grain), worker);
      return;
    }
    Job job{fn, ctx, n, grain, chunks};
    job_.store(&job);
    epoch_.fetch_add(1);
    if (sleeping_.load() > 0) futex_wake_all(epoch_);
    job.run(0);
    if (!spin_until([&] { return job.done.load(std::memory_order_acquire) == chunks; }))
      while (job.done.load(std::memory_order_acquire) != chunks) std::this_thread::yield();
    // No worker may still hold &job: it registers in active_ before reading job_ (both seq_cst).
    job_.store(nullptr);
    while (active_.load() != 0) _mm_pause();
    if (job.err) std::rethrow_exception(job.err);
  }

 private:
  void work(int w, uint32_t seen) {
    for (;;) {
      if (!spin_until([&] { return epoch_.load(std::memory_order_acquire) != seen; })) {
        sleeping_.fetch_add(1);
        while (epoch_.load() == seen) futex_wait(epoch_, seen);  // returns at once if it moved on
        sleeping_.fetch_sub(1);
      }
      seen = epoch_.load();
      if (stop_.load()) return;
      active_.fetch_add(1);
      if (Job* job = job_.load()) job->run(w);
      active_.fetch_sub(1);
    }
  }

  void stop_workers() {
    stop_ = true;
    epoch_.fetch_add(1);
    futex_wake_all(epoch_);
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::mutex call_mu_;  // one job at a time; a second caller runs its loop serially
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> epoch_{0};  // bumped for each job (and to stop)
  std::atomic<Job*> job_{nullptr};
  std::atomic<int> active_{0};      // workers between registering and leaving a job
  std::atomic<int> sleeping_{0};    // workers in (or about to enter) futex_wait: a job must wake them
  std::atomic<bool> stop_{false};
  int threads_ = 1;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_num_threads(int n) {
  ATTN_CHECK(n >= 1 && n <= kMaxThreads, "Expected num_threads in [1, ", kMaxThreads, "], but got ", n, " instead");
  if (n != pool().threads()) pool().resize(n);
}

int num_threads() { return pool().threads(); }
int max_threads() { return kMaxThreads; }

std::string wait_policy() {
  return cat("attn pool: chunks claimed dynamically; idle threads spin ",
             std::chrono::duration_cast<std::chrono::microseconds>(kSpin).count(), " us, then sleep (futex)");
}

namespace detail {
void run_parallel(int64_t n, int64_t grain, ChunkFn fn, void* ctx) {
  if (n > 0) pool().run(n, grain, fn, ctx);
}
}  // namespace detail

}  // namespace attn
