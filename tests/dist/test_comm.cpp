// The communicator itself: world() is MPI_COMM_WORLD under mpirun, and errors become attn::Error.
#include <gtest/gtest.h>

#include <cstdlib>

#include "../test_util.h"
#include "attn/dist.h"

using namespace attn;

TEST(Comm, WorldIsMpirunsWorld) {
  const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_NE(n, nullptr) << "run under mpirun (scripts/mpirun-local)";
  EXPECT_EQ(dist::size(), std::atoi(n));
  int r = dist::rank(), sum = 0;
  MPI_Allreduce(&r, &sum, 1, MPI_INT, MPI_SUM, dist::world());
  EXPECT_EQ(sum, dist::size() * (dist::size() - 1) / 2);
}

TEST(Comm, MpiErrorsBecomeAttnErrors) {
  float x = 0;  // a send to a rank that does not exist
  std::string msg =
      test::error_of([&] { dist::check(MPI_Send(&x, 1, MPI_FLOAT, dist::size() + 7, 0, dist::world()), "MPI_Send"); });
  EXPECT_NE(msg.find("MPI_Send: "), std::string::npos) << msg;
}
