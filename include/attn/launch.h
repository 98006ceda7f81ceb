// How this process was started: among how many processes mpirun launched it. The part of dist (src/dist)
// that needs no MPI, so that a build without MPI can still refuse to train N separate models where one
// was meant. Reads the environment only; not the communicator (dist.h).
#pragma once

namespace attn {

// The number of processes mpirun started this one among (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_SIZE),
// 1 when it was not started by mpirun.
int launched_world_size();
// In a build without MPI, an Error when mpirun started this process among several (each would train a
// model of its own, where one was meant); nothing otherwise. With MPI, the caller distributes instead.
void check_trains_alone();

}  // namespace attn
