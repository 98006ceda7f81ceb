// The `_attn` extension module; python/attn/ is the package users import.
#include <pybind11/pybind11.h>

#include "attn/check.h"
#include "attn/threads.h"
#include "attn/version.h"

namespace py = pybind11;

void bind_sdpa(py::module_& m);
void bind_sdpa_backward(py::module_& m);
void bind_io(py::module_& m);
void bind_mha(py::module_& m);
void bind_viz(py::module_& m);
void bind_nn(py::module_& m);
void bind_gpt(py::module_& m);

PYBIND11_MODULE(_attn, m) {
  m.doc() = "attn: multi-head attention in C++ (native core)";
  m.attr("__version__") = ATTN_VERSION;
  py::register_exception<attn::Error>(m, "AttnError", PyExc_ValueError);
  m.def("set_num_threads", &attn::set_num_threads, py::arg("n"), "Threads for attn kernels and OpenBLAS.");
  m.def("get_num_threads", &attn::num_threads);
  bind_sdpa(m);
  bind_sdpa_backward(m);
  bind_io(m);
  bind_mha(m);
  bind_viz(m);
  bind_nn(m);
  bind_gpt(m);
}
