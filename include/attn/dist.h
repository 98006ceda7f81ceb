// Distributed attn over MPI (Open MPI from Debian): the communicator every multi-process feature uses.
// Present only when attn was built with MPI (ATTN_HAVE_MPI defined; CMake option ATTN_WITH_MPI, on when
// MPI is found). Without mpirun a process is a world of one, and everything here still works.
#pragma once
#ifndef ATTN_HAVE_MPI
#error "attn/dist.h needs attn built with MPI (ATTN_WITH_MPI=ON and libopenmpi-dev installed)"
#endif
#include <mpi.h>

#include <string>

namespace attn::dist {

// MPI_COMM_WORLD, with MPI initialised on the first call (MPI_THREAD_FUNNELED: only the calling thread
// talks to MPI; attn's pool workers never do) and finalised at exit. A program that called MPI_Init itself
// keeps its own initialisation.
MPI_Comm world();
int rank(MPI_Comm comm = world());
int size(MPI_Comm comm = world());

// Throws attn::Error "<what>: <MPI's message>" unless rc is MPI_SUCCESS.
void check(int rc, const std::string& what);

}  // namespace attn::dist
