// Options of the CLI subcommands, shared by tools/attn.cpp (parsing) and each subcommand's file.
#pragma once
#include <cstdint>
#include <vector>

namespace attn {

int run_demo();

struct BenchOptions {
  int threads = 2;
  int repeats = 5;
  std::vector<int64_t> lengths = {512, 1024, 2048, 4096, 8192, 16384};
  int64_t reference_max = 2048;  // the reference is O(L·S) time per head: skip it past this L
};
int run_bench(const BenchOptions& opt);

}  // namespace attn
