// Data-parallel training over MPI: the GradientSync (attn/train.h) that sums each step's gradients
// across the processes mpirun started, bucketed and overlapped with the backward as PyTorch's DDP does,
// in a fixed order. Present only when attn was built with MPI (ATTN_HAVE_MPI). How a run is split and
// what every process computes is Trainer::distribute's (train.h); this file moves and adds the numbers.
//
// The sum of one bucket (a few consecutive gradient groups, Gpt::grad_groups(), of at least
// bucket_bytes): its N·n floats are cut into N slices; a reduce-scatter (MPI_Ialltoallv) hands rank j
// slice j of every rank's bucket, rank j adds the N contributions in rank order 0, 1, ..., N-1, and an
// all-gather (MPI_Iallgatherv) hands every rank the summed slices. MPI_Allreduce's own order depends on
// its algorithm (and may change with N, the message size or the Open MPI version); this one does not,
// so a run repeated with the same N gives the same bits, and every rank gets the same gradient. Each rank
// sends 2·(N-1)/N of its gradient per step, as a ring all-reduce does.
//
// A bucket's sum starts as soon as its last group is final during the backward (the last block first)
// and progresses whenever the backward hands over the next group; finish() waits for the rest.
#pragma once
#ifndef ATTN_HAVE_MPI
#error "attn/data_parallel.h needs attn built with MPI (ATTN_WITH_MPI=ON and libopenmpi-dev installed)"
#endif
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn/dist.h"
#include "attn/train.h"

namespace attn {

struct DataParallelOptions {
  int64_t bucket_bytes = 1 << 20;  // consecutive groups are merged until a bucket holds at least this many
  bool overlap = true;             // sum buckets during the backward (false: all of them in finish())
};

class DataParallel final : public GradientSync {
 public:
  // The processes of `comm` (duplicated: the sums never match another library's messages).
  explicit DataParallel(MPI_Comm comm = dist::world(), const DataParallelOptions& options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  void attach(const std::vector<std::vector<Param>>& groups) override;
  void grads_final(size_t group) override;
  void finish() override;
  void sum(double* values, size_t n) override;
  bool same_everywhere(uint64_t value) override;
  std::string first_error(const std::string& error) override;
  SyncStats stats() const override;

  // The gradient floats of each bucket, in the order they are summed.
  std::vector<int64_t> bucket_sizes() const;

 private:
  struct Bucket;
  void start(Bucket& b);
  void reduce(Bucket& b);  // the reduce-scatter arrived: add in rank order, start the all-gather
  void unpack(Bucket& b);
  void progress();         // what has arrived moves on, without waiting

  DataParallelOptions o_;
  MPI_Comm scatter_ = MPI_COMM_NULL, gather_ = MPI_COMM_NULL, small_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_size_ = 1;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  size_t started_ = 0, reduced_ = 0;  // this step: buckets started, buckets whose all-gather started
  SyncStats stats_;
};

// A DataParallel over dist::world() when this process is one of several that mpirun started, else
// nullptr (one process trains alone; MPI is not initialised).
std::shared_ptr<DataParallel> data_parallel_if_launched(const DataParallelOptions& options = {});

// Prints "error: rank R of N: <message>" to stderr and ends every process of the job (MPI_Abort): for
// an error that only some processes met, which would leave the others waiting forever.
[[noreturn]] void abort_job(const std::string& message, int code = 2);

}  // namespace attn
