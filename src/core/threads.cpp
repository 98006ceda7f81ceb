// The thread pool behind parallel_for: n-1 workers plus the calling thread, one job at a time.
// A job is a count of chunks. Every thread claims the next chunk with a compare-and-swap on one 64-bit
// word (job id << 32 | next chunk), so a claim can only succeed for the job that is live, and the caller
// waits for claimed chunks only: a worker that is slow to wake, or descheduled by a busy neighbour before
// it claimed anything, delays nobody (the caller runs the chunks itself).
// Waiting: a worker spins for kSpin after its last chunk (back-to-back loops of a training step find it
// awake), then sleeps on a futex; the caller spins, then yields its core to whoever holds a chunk.
// The workers are used only while the cores are ours: a worker takes a share of a core from the caller, whose
// loops and the serial code between them are the critical path, and a worker preempted while it holds a chunk
// makes the caller wait a time slice for it. Beside a busy process on 2 cores, 2 threads trained at 0.82x and
// generated at 0.60x the speed of 1 with spinning workers; with sleeping ones, 0.88-1.07x and 0.81-0.84x (3000
// characters); with the loops on the caller alone, 0.94-0.99x and 0.94-0.99x (bench/busy_neighbour.py and
// interleaved runs of the CLI, Zen 4, 2026-12-07). So every 50 ms (the first time after 15 ms) the caller reads its
// own involuntary context switches: when other tasks took its core 80 times a second or more, loops run on the
// caller alone and the workers sleep, for 50 ms, doubling (up to 1 s) each time using them again finds the core
// shared (threads.h's ShareRule). (The caller alone keeps its core, so without the doubling the check alternated:
// shared while the workers ran, free while not.)
#include "attn/threads.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
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
constexpr int64_t kMaxChunks = int64_t(1) << 31;        // chunk indices live in the low 32 bits of a claim
constexpr uint64_t kClosed = 0xffffffffu;               // a claim word no chunk count reaches: nothing to claim

thread_local int tl_worker = -1;  // this thread's worker index while it runs a chunk; -1 outside

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
  // A default count (ATTN_NUM_THREADS, or the CPUs) that can't start leaves one thread, and every parallel
  // call says why until set_num_threads() picks a count that starts (it used to fail too, even with 1).
  Pool() {
    try {
      resize(default_threads());
    } catch (const Error& e) {
      startup_error_ = cat(e.what(), " for the default thread count (ATTN_NUM_THREADS or the CPUs): call "
                           "set_num_threads (attn: --threads) with fewer");
      failed_start_.store(true);
    }
  }
  void clear_startup_error() { failed_start_.store(false); }
  ~Pool() { stop_workers(); }

  int threads() const { return threads_; }
  bool active() const { return active_.load(std::memory_order_relaxed); }

  void resize(int n) {
    std::lock_guard<std::mutex> lock(call_mu_);
    stop_workers();
    threads_ = 1;
    stop_ = false;
    try {
      const uint32_t now = wake_.load();  // read here: a thread that starts late must still see a stop
      for (int w = 1; w < n; ++w) workers_.emplace_back([this, w, now] { work(w, now); });
    } catch (const std::system_error& e) {
      const size_t started = workers_.size() + 1;  // the caller is one of the n
      stop_workers();
      throw Error(cat("Expected to start ", n, " threads, but only ", started, " could be started (", e.what(),
                      ") instead"));
    }
    threads_ = n;
  }

  void run(int64_t n, int64_t grain, detail::ChunkFn fn, void* ctx) {
    if (failed_start_.load(std::memory_order_relaxed)) throw Error(startup_error_);
    grain = std::max<int64_t>({grain, 1, (n + kMaxChunks - 1) / kMaxChunks});
    const int64_t chunks = (n + grain - 1) / grain;
    std::unique_lock<std::mutex> lock(call_mu_, std::defer_lock);
    if (chunks <= 1 || threads_ == 1 || tl_worker >= 0 || !lock.try_lock() || !use_workers()) {
      // serial, same chunks: nested in a chunk (keep this worker's index), one thread, the pool is busy, or
      // the cores are shared
      const int worker = tl_worker >= 0 ? tl_worker : 0;
      for (int64_t c = 0; c < chunks; ++c) fn(ctx, c * grain, std::min(n, (c + 1) * grain), worker);
      return;
    }
    // Publish: close the claim word first, so that a late worker holding the last job's word can no
    // longer claim with it once it sees any new field (release/acquire on every field); then the fields;
    // then the claim word that makes them live.
    claim_.store(kClosed);
    fn_.store(fn, std::memory_order_release), ctx_.store(ctx, std::memory_order_release);
    n_.store(n, std::memory_order_release), grain_.store(grain, std::memory_order_release);
    chunks_.store(uint32_t(chunks), std::memory_order_release);
    done_.store(0, std::memory_order_relaxed);
    err_ = nullptr;
    const uint64_t id = ++job_id_ & 0xffffffffu;
    claim_.store(id << 32, std::memory_order_release);
    wake_.fetch_add(1);
    if (sleeping_.load() > 0) futex_wake_all(wake_);
    drain(0);
    const auto all_done = [&] { return done_.load(std::memory_order_acquire) == uint32_t(chunks); };
    if (!spin_until(all_done))
      while (!all_done()) sched_yield();  // a chunk is held by a thread the OS took away: let it run
    if (err_) std::rethrow_exception(err_);
  }

 private:
  // Claims and runs chunks of the live job until none is left. Fields read before a successful claim
  // belong to the job the claim names: a finished job's word has no chunk left, and once a worker sees
  // one field of the next job it also sees the word closed (kClosed, stored before the fields), so its
  // claim with the old word fails. (Without the close, a late worker paired a finished job's word with
  // the next job's chunk count, ran a chunk twice and counted it: the caller then waited forever.)
  void drain(int worker) {
    for (;;) {
      uint64_t word = claim_.load(std::memory_order_acquire);
      const detail::ChunkFn fn = fn_.load(std::memory_order_acquire);
      void* ctx = ctx_.load(std::memory_order_acquire);
      const int64_t n = n_.load(std::memory_order_acquire), grain = grain_.load(std::memory_order_acquire);
      const uint32_t chunks = chunks_.load(std::memory_order_acquire), c = uint32_t(word);
      if (c >= chunks) return;
      if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) continue;
      tl_worker = worker;
      try {
        fn(ctx, int64_t(c) * grain, std::min(n, (int64_t(c) + 1) * grain), worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu_);
        if (!err_) err_ = std::current_exception();
      }
      tl_worker = -1;
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  // Under call_mu_: whether loops use the workers now. When the rule is due, it gets the calling thread's
  // involuntary context switches (a thread other than the last one to check starts the rule over: the counts
  // are per thread).
  bool use_workers() {
    const auto now = std::chrono::steady_clock::now();
    rusage u;
    if (!rule_.due(now) || getrusage(RUSAGE_THREAD, &u) != 0) return active_.load(std::memory_order_relaxed);
    if (checker_ != std::this_thread::get_id()) rule_ = {}, checker_ = std::this_thread::get_id();
    const bool on = rule_.update(now, u.ru_nivcsw);
    active_.store(on, std::memory_order_relaxed);
    return on;
  }

  void work(int w, uint32_t seen) {
    for (;;) {
      // kSpin for the next job (none comes while the workers rest), then sleep
      if (!spin_until([&] { return wake_.load(std::memory_order_acquire) != seen; })) {
        sleeping_.fetch_add(1);
        while (wake_.load() == seen) futex_wait(wake_, seen);  // returns at once if it moved on
        sleeping_.fetch_sub(1);
      }
      seen = wake_.load();
      if (stop_.load()) return;
      drain(w);
    }
  }

  void stop_workers() {
    stop_ = true;
    wake_.fetch_add(1);
    futex_wake_all(wake_);
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::mutex call_mu_;  // one job at a time; a second caller runs its loop serially
  std::vector<std::thread> workers_;
  // The live job (atomics: a late worker may read them while the next job is written; its claim fails).
  std::atomic<detail::ChunkFn> fn_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<int64_t> n_{0}, grain_{1};
  std::atomic<uint32_t> chunks_{0};
  std::atomic<uint64_t> claim_{0};   // (job id << 32) | next chunk to claim
  std::atomic<uint32_t> done_{0};    // chunks of the live job finished
  uint64_t job_id_ = 0;
  std::mutex err_mu_;
  std::exception_ptr err_;           // the first exception of the live job
  std::atomic<uint32_t> wake_{0};    // futex word: bumped for each job (and to stop)
  std::atomic<int> sleeping_{0};     // workers in (or about to enter) futex_wait: a job must wake them
  std::atomic<bool> stop_{false};
  std::atomic<bool> active_{true};   // loops use the workers (use_workers; read by workers_active)
  detail::ShareRule rule_;           // use_workers's, under call_mu_, and the last thread that checked
  std::thread::id checker_{};
  int threads_ = 1;
  std::string startup_error_;             // written once, in the constructor
  std::atomic<bool> failed_start_{false};
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_num_threads(int n) {
  ATTN_CHECK(n >= 0 && n <= kMaxThreads, "Expected num_threads in [0, ", kMaxThreads,
             "] (0: the CPUs this process may use), but got ", n, " instead");
  if (n == 0) n = default_threads();
  if (n != pool().threads()) pool().resize(n);
  pool().clear_startup_error();
}

int num_threads() { return pool().threads(); }
bool workers_active() { return pool().active(); }
int max_threads() { return kMaxThreads; }

int share_threads(int processes) {
  set_num_threads(0);
  const int cpus = num_threads();
  set_num_threads(std::max(1, cpus / std::max(1, processes)));
  return cpus;
}

std::string wait_policy() {
  return cat("attn pool: chunks claimed dynamically; idle threads spin ",
             std::chrono::duration_cast<std::chrono::microseconds>(kSpin).count(),
             " us, then sleep (futex); loops run on the calling thread alone while the cores are shared");
}

namespace detail {
void run_parallel(int64_t n, int64_t grain, ChunkFn fn, void* ctx) {
  if (n > 0) pool().run(n, grain, fn, ctx);
}

// The rates: training on 2 cores, 2 threads, the main thread was preempted ~4 times a second on a quiet machine
// (at most 3 in 50 ms), 9 times or more in most 50 ms beside a busy process (`yes`). A 50 ms probe a second at
// most costs < 5% while the cores stay shared. The first check comes after 15 ms: a 400-character generation
// (0.2 s) beside `yes` spent a quarter of its time in a first window of 50 ms (0.87x `--threads 1`, 0.93x with 15
// ms); quiet, 1 run in 20 rested the workers either way.
bool ShareRule::update(Clock::time_point now, long preempted) {
  if (updates_ > 0) {
    const std::chrono::duration<double> since = now - checked_;
    if (double(preempted - preempted_) >= kShared * since.count()) {
      off_ = std::clamp<Clock::duration>(on_ ? 2 * off_ : off_, kCheck, kMaxOff);
      off_until_ = now + off_, on_ = false;
    } else if (now >= off_until_) {
      if (on_) off_ = {};  // a whole check with the workers, unshared: the doubling starts over
      on_ = true;
    }
  }
  updates_ = std::min(updates_ + 1, 2), checked_ = now, preempted_ = preempted;
  return on_;
}
}  // namespace detail

}  // namespace attn
