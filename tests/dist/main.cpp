// main() of the distributed GoogleTest programs (tests/dist/test_*.cpp), run by ctest under
// scripts/mpirun-local with 2, 3 and 4 ranks. Every rank runs every test; rank 0 alone prints; the
// program fails on every rank when a test failed on any.
#include <gtest/gtest.h>

#include "attn/dist.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MPI_Comm comm = attn::dist::world();
  if (attn::dist::rank(comm) != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS() != 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm);
  return any;
}
