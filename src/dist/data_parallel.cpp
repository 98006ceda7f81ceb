// Data-parallel gradient sums over MPI (attn/data_parallel.h): buckets, a reduce-scatter added in rank
// order and an all-gather, each started as early as the backward allows and moved on whenever it hands
// over a group. Only the calling thread talks to MPI (MPI_THREAD_FUNNELED); the adding uses the pool.
#include "attn/data_parallel.h"

#include <sched.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "attn/check.h"
#include "attn/launch.h"
#include "attn/profile.h"
#include "attn/threads.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// MPI_Wait, yielding the CPU between polls: on a machine with more runnable threads than cores, a peer
// that the scheduler put aside runs sooner than beside a process spinning in MPI_Wait (3.2 MB summed by
// 2 processes on 2 busy vCPUs after 30 ms of compute: 15 ms median spinning, 3.5-6 ms yielding); alone
// on its core, a yield returns at once.
void wait(MPI_Request& r, const char* what) {
  for (;;) {
    int done = 0;
    dist::check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    sched_yield();
  }
}

}  // namespace

struct DataParallel::Bucket {
  std::vector<Tensor*> grads;
  size_t last_group = 0;            // the group whose end makes the bucket final
  int64_t n = 0;                    // floats
  std::vector<float> packed;        // (n): this rank's gradients, then the sum
  std::vector<float> parts;         // (N, counts[rank]): every rank's contribution to this rank's slice
  std::vector<int> counts, displs;  // slice j: packed[displs[j], displs[j] + counts[j])
  std::vector<int> part_counts, part_displs, zeros;
  MPI_Request request = MPI_REQUEST_NULL;
  int phase = 0;  // 0: gradients not final; 1: reduce-scatter in flight; 2: all-gather in flight; 3: summed
};

DataParallel::DataParallel(MPI_Comm comm, const DataParallelOptions& options) : o_(options) {
  ATTN_CHECK(o_.bucket_bytes > 0, "Expected bucket_bytes > 0, but got ", o_.bucket_bytes, " instead");
  dist::check(MPI_Comm_dup(comm, &scatter_), "MPI_Comm_dup");
  dist::check(MPI_Comm_dup(comm, &gather_), "MPI_Comm_dup");
  dist::check(MPI_Comm_dup(comm, &small_), "MPI_Comm_dup");
  rank_ = dist::rank(small_);
  size_ = dist::size(small_);
  MPI_Comm local = MPI_COMM_NULL;
  dist::check(MPI_Comm_split_type(small_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  local_size_ = dist::size(local);
  MPI_Comm_free(&local);
}

DataParallel::~DataParallel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&scatter_, &gather_, &small_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

void DataParallel::attach(const std::vector<std::vector<Param>>& groups) {
  ATTN_CHECK(buckets_.empty(), "Expected DataParallel::attach once, but got a second call instead");
  ATTN_CHECK(!groups.empty(), "Expected gradient groups to sum, but got none instead");
  std::unique_ptr<Bucket> cur;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!cur) cur = std::make_unique<Bucket>();
    for (const Param& p : groups[g]) {
      cur->grads.push_back(p.grad);
      cur->n += p.grad->numel();
    }
    if (cur->n * int64_t(sizeof(float)) >= o_.bucket_bytes || g + 1 == groups.size()) {
      ATTN_CHECK(cur->n < INT_MAX, "Expected gradient buckets of fewer than 2^31 floats (MPI counts), but got ",
                 cur->n, " instead");
      Bucket& b = *cur;
      b.last_group = g;
      b.packed.resize(size_t(b.n));
      const int N = size_;
      b.counts.resize(size_t(N)), b.displs.resize(size_t(N));
      for (int j = 0; j < N; ++j) {
        b.displs[size_t(j)] = int(b.n * j / N);
        b.counts[size_t(j)] = int(b.n * (j + 1) / N) - b.displs[size_t(j)];
      }
      const int mine = b.counts[size_t(rank_)];
      b.parts.resize(size_t(mine) * size_t(N));
      b.part_counts.assign(size_t(N), mine);
      b.part_displs.resize(size_t(N));
      for (int j = 0; j < N; ++j) b.part_displs[size_t(j)] = j * mine;
      stats_.bytes += double(b.n) * sizeof(float);
      buckets_.push_back(std::move(cur));
    }
  }
  stats_.buckets = int(buckets_.size());
}

std::vector<int64_t> DataParallel::bucket_sizes() const {
  std::vector<int64_t> n;
  for (const auto& b : buckets_) n.push_back(b->n);
  return n;
}

void DataParallel::start(Bucket& b) {
  float* out = b.packed.data();
  for (Tensor* g : b.grads) out = std::copy_n(g->data(), g->numel(), out);
  dist::check(MPI_Ialltoallv(b.packed.data(), b.counts.data(), b.displs.data(), MPI_FLOAT, b.parts.data(),
                             b.part_counts.data(), b.part_displs.data(), MPI_FLOAT, scatter_, &b.request),
              "MPI_Ialltoallv (gradient reduce-scatter)");
  b.phase = 1;
}

void DataParallel::reduce(Bucket& b) {
  const int64_t n = b.counts[size_t(rank_)], N = size_;
  const float* parts = b.parts.data();
  float* out = b.packed.data() + b.displs[size_t(rank_)];
  // Rank order, element by element: the same bits for any thread count.
  parallel_for(n, grain_for(N), [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      float s = parts[i];
      for (int64_t j = 1; j < N; ++j) s += parts[j * n + i];
      out[i] = s;
    }
  });
  dist::check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.packed.data(), b.counts.data(), b.displs.data(),
                              MPI_FLOAT, gather_, &b.request),
              "MPI_Iallgatherv (gradient all-gather)");
  b.phase = 2;
}

void DataParallel::unpack(Bucket& b) {
  const float* in = b.packed.data();
  for (Tensor* g : b.grads) {
    std::copy_n(in, g->numel(), g->data());
    in += g->numel();
  }
  b.phase = 3;
}

void DataParallel::progress() {
  // All-gathers start in bucket order on every rank (collectives on one communicator must be started in
  // the same order everywhere): the first bucket whose reduce-scatter is still in flight stops the rest.
  while (reduced_ < started_) {
    Bucket& b = *buckets_[reduced_];
    int done = 0;
    dist::check(MPI_Test(&b.request, &done, MPI_STATUS_IGNORE), "MPI_Test (gradient reduce-scatter)");
    if (!done) break;
    reduce(b);
    ++reduced_;
  }
  for (size_t k = 0; k < reduced_; ++k) {
    Bucket& b = *buckets_[k];
    if (b.phase != 2) continue;
    int done = 0;
    dist::check(MPI_Test(&b.request, &done, MPI_STATUS_IGNORE), "MPI_Test (gradient all-gather)");
    if (done) unpack(b);
  }
}

void DataParallel::grads_final(size_t group) {
  ATTN_CHECK(!buckets_.empty(), "Expected DataParallel::attach before the first backward, but got none instead");
  if (!o_.overlap || started_ == buckets_.size()) return;
  const auto t0 = Clock::now();
  profile::Scope p("all-reduce");
  Bucket& next = *buckets_[started_];
  if (group >= next.last_group) {
    ATTN_CHECK(group == next.last_group, "Expected gradient group ", next.last_group,
               " to end the next bucket, but got ", group, " instead");
    start(next);
    ++started_;
  }
  progress();
  stats_.busy_seconds += since(t0);
}

void DataParallel::finish() {
  ATTN_CHECK(!buckets_.empty(), "Expected DataParallel::attach before the first backward, but got none instead");
  const auto t0 = Clock::now();
  {
    profile::Scope p("all-reduce wait");
    MPI_Request arrived = MPI_REQUEST_NULL;  // completes once every process is here: the lag, measured apart
    dist::check(MPI_Ibarrier(small_, &arrived), "MPI_Ibarrier");
    while (started_ < buckets_.size()) start(*buckets_[started_++]);
    wait(arrived, "MPI_Wait (barrier)");
    stats_.lag_seconds += since(t0);
    for (; reduced_ < started_; ++reduced_) {
      Bucket& b = *buckets_[reduced_];
      wait(b.request, "MPI_Wait (gradient reduce-scatter)");
      reduce(b);
    }
    for (auto& b : buckets_) {
      if (b->phase == 2) {
        wait(b->request, "MPI_Wait (gradient all-gather)");
        unpack(*b);
      }
      b->phase = 0;
    }
  }
  started_ = reduced_ = 0;
  const double s = since(t0);
  stats_.wait_seconds += s;
  stats_.busy_seconds += s;
  ++stats_.steps;
}

void DataParallel::sum(double* values, size_t n) {
  if (n == 0) return;
  ATTN_CHECK(n < size_t(INT_MAX) / size_t(size_), "Expected fewer values to sum, but got ", n, " instead");
  std::vector<double> all(n * size_t(size_));
  dist::check(MPI_Allgather(values, int(n), MPI_DOUBLE, all.data(), int(n), MPI_DOUBLE, small_), "MPI_Allgather (sum)");
  for (size_t i = 0; i < n; ++i) {
    double s = all[i];
    for (size_t j = 1; j < size_t(size_); ++j) s += all[j * n + i];
    values[i] = s;
  }
}

bool DataParallel::same_everywhere(uint64_t value) {
  std::vector<uint64_t> all(static_cast<size_t>(size_));
  dist::check(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, small_), "MPI_Allgather (compare)");
  for (uint64_t v : all)
    if (v != all[0]) return false;
  return true;
}

std::string DataParallel::first_error(const std::string& error) {
  int mine = int(std::min<size_t>(error.size(), 1 << 16));
  std::vector<int> len(static_cast<size_t>(size_));
  dist::check(MPI_Allgather(&mine, 1, MPI_INT, len.data(), 1, MPI_INT, small_), "MPI_Allgather (errors)");
  for (int j = 0; j < size_; ++j) {
    if (len[size_t(j)] == 0) continue;
    std::string msg = j == rank_ ? error.substr(0, size_t(mine)) : std::string(size_t(len[size_t(j)]), ' ');
    dist::check(MPI_Bcast(msg.data(), len[size_t(j)], MPI_CHAR, j, small_), "MPI_Bcast (error)");
    return msg;
  }
  return "";
}

SyncStats DataParallel::stats() const { return stats_; }

std::shared_ptr<DataParallel> data_parallel_if_launched(const DataParallelOptions& options) {
  if (launched_world_size() <= 1) return nullptr;
  return std::make_shared<DataParallel>(dist::world(), options);
}

void abort_job(const std::string& message, int code) {
  int r = -1, n = 0, ready = 0;
  MPI_Initialized(&ready);
  if (ready) {
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
  }
  std::fprintf(stderr, "error: rank %d of %d: %s\n", r, n, message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  if (ready) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace attn
