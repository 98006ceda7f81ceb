// Data-parallel training from Python: an attn.Trainer made in a process that mpirun started among
// several trains with the others (Trainer::distribute over MPI_COMM_WORLD), and an uncaught exception on
// one process ends the whole job instead of leaving the others waiting. Without MPI in the build, or
// without mpirun, a Trainer trains alone.
#include <pybind11/pybind11.h>

#include "attn/check.h"
#include "attn/train.h"
#ifdef ATTN_HAVE_MPI
#include "attn/data_parallel.h"
#endif

namespace py = pybind11;
using namespace attn;

namespace {

#ifdef ATTN_HAVE_MPI
// sys.excepthook prints the traceback, then every process of the job ends (exit code 1).
void abort_job_on_uncaught_exception() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  py::module_ sys = py::module_::import("sys");
  py::object previous = sys.attr("excepthook");
  sys.attr("excepthook") = py::cpp_function([previous](py::object type, py::object value, py::object tb) {
    previous(type, value, tb);
    py::module_::import("sys").attr("stderr").attr("flush")();
    abort_job("an uncaught Python exception (above) on this process ends the data-parallel job", 1);
  });
}
#endif

}  // namespace

// Called on every Trainer the module makes (bind_gpt.cpp).
void distribute_if_launched(Trainer& t) {
#ifdef ATTN_HAVE_MPI
  if (launched_world_size() <= 1) return;
  auto dp = std::make_shared<DataParallel>();
  {
    py::gil_scoped_release nogil;  // collective: waits for the other processes
    t.distribute(dp);
  }
  abort_job_on_uncaught_exception();
#else
  (void)t;
  check_trains_alone();
#endif
}

void bind_dist(py::module_& m) {
  auto trainer = py::reinterpret_borrow<py::class_<Trainer>>(m.attr("Trainer"));
  trainer
      .def_property_readonly("rank", [](const Trainer& t) { return t.sync() ? t.sync()->rank() : 0; },
                             "this process's rank in data-parallel training (0 alone)")
      .def_property_readonly("world_size", [](const Trainer& t) { return t.sync() ? t.sync()->size() : 1; },
                             "processes training this model (under mpirun; 1 alone)")
      .def_property_readonly(
          "allreduce",
          [](const Trainer& t) -> py::object {
            if (!t.sync()) return py::none();
            const SyncStats s = t.sync()->stats();
            py::dict d;
            d["steps"] = s.steps, d["buckets"] = s.buckets, d["bytes_per_step"] = s.bytes;
            d["wait_seconds"] = s.wait_seconds, d["busy_seconds"] = s.busy_seconds, d["lag_seconds"] = s.lag_seconds;
            return d;
          },
          "the gradient sums' statistics in data-parallel training (None alone): steps, buckets, bytes_per_step, "
          "wait_seconds (after the backward), lag_seconds (of it, waiting for the slowest process), busy_seconds (all "
          "their work, the wait included)");
  m.attr("HAVE_MPI") =
#ifdef ATTN_HAVE_MPI
      true;
#else
      false;
#endif
}
