// The `_attn` extension module; python/attn/ is the package users import.
#include <pybind11/pybind11.h>

#include "attn/check.h"

namespace py = pybind11;

void bind_sdpa(py::module_& m);

PYBIND11_MODULE(_attn, m) {
  m.doc() = "attn: multi-head attention in C++ (native core)";
  py::register_exception<attn::Error>(m, "AttnError", PyExc_ValueError);
  bind_sdpa(m);
}
