// Thread count: OpenMP for our kernels, OpenBLAS for the projections, kept in step.
#include "attn/threads.h"

#include <omp.h>

#include "attn/check.h"

extern "C" void openblas_set_num_threads(int);

namespace attn {

void set_num_threads(int n) {
  ATTN_CHECK(n >= 1, "Expected num_threads >= 1, but got ", n, " instead");
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace attn
