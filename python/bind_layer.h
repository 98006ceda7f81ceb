// What every bound layer shares (nn layers, MultiheadAttention): parameters and gradients by PyTorch's
// names as numpy dicts, state_dict loading, the training flag; and running C++ work without the GIL.
#pragma once
#include <pybind11/stl.h>

#include "attn/param.h"
#include "attn/safetensors.h"
#include "numpy_view.h"

namespace attn::py_util {

// Runs f() without the GIL and hands its Tensor to numpy.
template <class F>
py::array run(F f) {
  Tensor t;
  {
    py::gil_scoped_release nogil;
    t = f();
  }
  return to_numpy(std::move(t));
}

// What every layer has: parameters, gradients, state_dict I/O, the training flag.
template <class L, class... Extra>
py::class_<L, Extra...> layer(py::module_& m, const char* name, const char* doc = "") {
  py::class_<L, Extra...> c(m, name, doc);
  c.def("state_dict", [](L& self) { return to_numpy(self.parameter_list(), &Param::value); },
        "{name: float32 array} in PyTorch's order (copies).")
      .def("grads", [](L& self) { return to_numpy(self.parameter_list(), &Param::grad); },
           "Gradients by parameter name, as state_dict() (copies).")
      .def("load_state_dict", [](L& self, const py::dict& d) { self.load_state_dict(state_dict_of(d)); },
           py::arg("state_dict"), "Float arrays of any precision by name (stored as float32); every name, each shape.")
      .def("zero_grad", &L::zero_grad)
      .def("train", [](L& self, bool on) { self.train(on); }, py::arg("mode") = true)
      .def("eval", [](L& self) { self.eval(); })
      .def_property_readonly("training", &L::training);
  return c;
}

}  // namespace attn::py_util
