// Python binding of the safetensors reader and writer: numpy in, numpy out, always float32 on the C++
// side. Not a general converter: integer and bool arrays are rejected rather than cast silently.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "attn/safetensors.h"
#include "numpy_view.h"

namespace py = pybind11;
using namespace attn;
using py_util::to_numpy;

namespace {

Tensor from_numpy(const std::string& name, const py::handle& value) {
  py::array a = py::array::ensure(value);
  ATTN_CHECK(a && a.dtype().kind() == 'f', "Expected tensor '", name, "' to be a float array, but got ",
             a ? py::str(a.dtype()).cast<std::string>() : std::string(py::str(py::type::of(value))), " instead");
  auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);  // any float -> F32
  Tensor t(Shape(f.shape(), f.shape() + f.ndim()));
  if (t.numel()) std::memcpy(t.data(), f.data(), size_t(t.numel()) * sizeof(float));
  return t;
}

}  // namespace

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
        py::dict tensors;
        for (auto& [name, t] : sd) tensors[py::str(name)] = to_numpy(std::move(t));
        return py::make_tuple(tensors, meta);
      },
      py::arg("path"), "Reads a safetensors file: (dict of float32 arrays, metadata dict).");
  m.def(
      "save_safetensors",
      [](const std::string& path, const py::dict& tensors, const std::optional<py::dict>& metadata) {
        StateDict sd;
        for (auto [k, v] : tensors) {
          ATTN_CHECK(py::isinstance<py::str>(k), "Expected tensor names that are str, but got ",
                     std::string(py::repr(k)), " instead");
          std::string name = k.cast<std::string>();
          sd.emplace(name, from_numpy(name, v));
        }
        std::map<std::string, std::string> meta;
        if (metadata)
          for (auto [k, v] : *metadata) {
            ATTN_CHECK(py::isinstance<py::str>(k) && py::isinstance<py::str>(v),
                       "Expected metadata of str keys and str values, but got ", std::string(py::repr(k)), ": ",
                       std::string(py::repr(v)), " instead");
            meta[k.cast<std::string>()] = v.cast<std::string>();
          }
        py::gil_scoped_release nogil;
        save_safetensors(path, sd, meta);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata") = py::none(),
      "Writes float arrays as F32 into a safetensors file, atomically.");
}
