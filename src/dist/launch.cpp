// launched_world_size() and check_trains_alone() (launch.h): the environment mpirun leaves, read
// without MPI. Built with or without MPI (CMakeLists.txt), unlike the rest of src/dist.
#include "attn/launch.h"

#include <cstdlib>

#include "attn/check.h"

namespace attn {

int launched_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(var);
    if (v && std::atoi(v) > 0) return std::atoi(v);
  }
  return 1;
}

void check_trains_alone() {
#ifndef ATTN_HAVE_MPI
  const int n = launched_world_size();
  ATTN_CHECK(n <= 1, "Expected one process (this attn was built without MPI: under mpirun -np ", n,
             " each process would train a model of its own), but got ", n,
             " instead: build with MPI (libopenmpi-dev) for data-parallel training");
#endif
}

}  // namespace attn
