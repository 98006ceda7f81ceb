// attn's threads: one small pool of its own for every parallel loop in the library (GEMM, attention
// kernels, layers). Not OpenMP: work is split into chunks that attn chooses from the loop's size alone,
// claimed dynamically, so (1) results never depend on the thread count — a chunk is computed the same
// whichever thread takes it, and nothing is summed across chunks in a thread-dependent order — and
// (2) a thread that the OS takes away (a busy neighbour) delays only the one chunk it holds.
// Idle threads spin for a bounded time, then sleep in the kernel: no core is burnt between calls.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace attn {

void set_num_threads(int n);  // 1 <= n <= max_threads(), or 0: the default, the CPUs this process may use
int num_threads();
int max_threads();            // the largest accepted thread count
// The default thread count (this process's CPUs) divided among `processes` sharing this machine, at
// least 1, set; returns the CPUs the default had. For ranks of an MPI job on one machine.
int share_threads(int processes);
std::string wait_policy();    // how idle threads wait, in words (for `attn info`)
// Whether parallel loops use the workers now (idle ones spin before sleeping): not for a while (50 ms to 1 s)
// after the thread that runs parallel loops was preempted 80 times a second or more (its cores shared with
// another busy task); meanwhile loops run on the calling thread alone, as with one thread.
bool workers_active();

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end, int worker);
void run_parallel(int64_t n, int64_t grain, ChunkFn fn, void* ctx);

// workers_active()'s rule, fed with the calling thread's involuntary context switches so far, 15 ms after its
// first call and every 50 ms or more after that: at 80 a second or more since the last call, the workers rest for
// 50 ms, doubled while using them again finds it so, up to 1 s; else they are used again once that time is over,
// and a call that finds them in use starts the doubling over. Returns whether they are used. (threads.cpp's pool;
// its own test.)
class ShareRule {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kFirstCheck = std::chrono::milliseconds(15);  // a short run decides early
  static constexpr auto kCheck = std::chrono::milliseconds(50);
  static constexpr double kShared = 80;
  static constexpr auto kMaxOff = std::chrono::seconds(1);
  bool due(Clock::time_point now) const {  // time to update
    return updates_ == 0 || now - checked_ >= (updates_ == 1 ? kFirstCheck : kCheck);
  }
  bool update(Clock::time_point now, long preempted);

 private:
  bool on_ = true;
  int updates_ = 0;  // 0, 1, or 2 for more
  Clock::time_point checked_{}, off_until_{};
  long preempted_ = 0;
  Clock::duration off_{};
};
}  // namespace detail

// body(begin, end, worker) for consecutive chunks [begin, end) of [0, n), each `grain` items long (the
// last may be shorter); the chunk boundaries depend on n and grain only. worker is in [0, num_threads())
// and no two chunks run on one worker at once: index per-worker scratch with it. Choose grain so that
// a chunk is worth >= ~10 µs of work; a loop with one chunk runs on the calling thread. A parallel_for
// inside a body runs serially on its worker.
template <typename Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  auto call = [](void* ctx, int64_t b, int64_t e, int w) {
    (*static_cast<std::remove_reference_t<Body>*>(ctx))(b, e, w);
  };
  detail::run_parallel(n, grain, call, const_cast<void*>(static_cast<const void*>(&body)));
}

// Items per chunk for a loop whose items cost `per_item` element operations each: chunks of ~32k
// element operations (~10 µs), below which waking a thread costs more than it saves (PyTorch's
// at::parallel_for uses the same grain).
inline int64_t grain_for(int64_t per_item) {
  constexpr int64_t kGrain = 1 << 15;
  return per_item >= kGrain ? 1 : kGrain / (per_item < 1 ? 1 : per_item);
}

// Item by item: body(i, worker) for i in [0, n) (tiles, heads, rows of heavy work). cost_per_item, in
// element operations (multiply-adds, exp2s), sets the grain: a loop of small items is not worth a
// thread, and runs in few chunks or on the calling thread alone. State the cost; never guess 1.
template <typename Body>
void parallel_items(int64_t n, int64_t cost_per_item, Body&& body) {
  parallel_for(n, grain_for(cost_per_item), [&](int64_t b, int64_t e, int w) {
    for (int64_t i = b; i < e; ++i) body(i, w);
  });
}

// Scratch for parallel_for bodies: one T per worker, constructed on that worker's first use.
template <typename T>
class PerWorker {
 public:
  PerWorker() : items_(static_cast<size_t>(num_threads())) {}
  template <typename... Args>
  T& get(int worker, Args&&... args) {
    auto& item = items_[static_cast<size_t>(worker)];
    if (!item) item.emplace(std::forward<Args>(args)...);
    return *item;
  }

 private:
  std::vector<std::optional<T>> items_;
};

}  // namespace attn
