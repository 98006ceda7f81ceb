// One thread count for everything attn runs: our OpenMP kernels and OpenBLAS alike.
#pragma once

namespace attn {

void set_num_threads(int n);  // n >= 1
int num_threads();

}  // namespace attn
