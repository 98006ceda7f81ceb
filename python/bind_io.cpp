// Python binding of the safetensors reader and writer: numpy in, numpy out, always float32 on the C++
// side (numpy_view.h's one dtype rule: integer and bool arrays are rejected rather than cast silently).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "attn/safetensors.h"
#include "numpy_view.h"

namespace py = pybind11;
using namespace attn;
using py_util::state_dict_of;
using py_util::to_numpy;

void bind_io(py::module_& m) {
  m.def(
      "load_safetensors",
      [](const std::string& path) {
        std::map<std::string, std::string> meta;
        StateDict sd;
        {
          py::gil_scoped_release nogil;
          sd = load_safetensors(path, &meta);
        }
        return py::make_tuple(to_numpy(std::move(sd)), meta);
      },
      py::arg("path"), "Reads a safetensors file: (dict of float32 arrays, metadata dict).");
  m.def(
      "save_safetensors",
      [](const std::string& path, const py::dict& tensors, const std::optional<py::dict>& metadata) {
        StateDict sd = state_dict_of(tensors);
        std::map<std::string, std::string> meta;
        if (metadata)
          for (auto [k, v] : *metadata) {
            ATTN_CHECK(py::isinstance<py::str>(k) && py::isinstance<py::str>(v),
                       "Expected metadata of str keys and str values, but got ", std::string(py::repr(k)), ": ",
                       std::string(py::repr(v)), " instead");
            meta[py_util::utf8_of(k, "metadata keys")] = py_util::utf8_of(v, "metadata values");
          }
        py::gil_scoped_release nogil;
        save_safetensors(path, sd, meta);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata") = py::none(),
      "Writes float arrays as F32 into a safetensors file, atomically.");
}
