// The MPI communicator: initialise once, finalise at exit, MPI errors as attn::Error.
#include <cstdlib>
#include <mutex>

#include "attn/check.h"
#include "attn/dist.h"

namespace attn::dist {

MPI_Comm world() {
  static std::once_flag once;
  std::call_once(once, [] {
    int ready = 0;
    MPI_Initialized(&ready);
    if (ready) return;  // the program initialised MPI: it finalises too
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    // Errors come back as codes (check() turns them into attn::Error) instead of aborting inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit([] {
      int done = 0;
      MPI_Finalized(&done);
      if (!done) MPI_Finalize();
    });
  });
  return MPI_COMM_WORLD;
}

int rank(MPI_Comm comm) {
  int r = 0;
  check(MPI_Comm_rank(comm, &r), "MPI_Comm_rank");
  return r;
}

int size(MPI_Comm comm) {
  int n = 1;
  check(MPI_Comm_size(comm, &n), "MPI_Comm_size");
  return n;
}

void check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(cat(what, ": ", std::string(msg, len)));
}

}  // namespace attn::dist
