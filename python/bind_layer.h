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
py::class_<L, Extra...> layer(py::module_& m, const char* name) {
  py::class_<L, Extra...> c(m, name);
  c.def("state_dict",
        [](L& self) {
          py::dict d;  // PyTorch's order
          for (Param& p : self.parameter_list()) d[py::str(p.name)] = to_numpy(Tensor::copy_of(p.value->view()));
          return d;
        })
      .def("grads",
           [](L& self) {
             py::dict d;
             for (Param& p : self.parameter_list()) d[py::str(p.name)] = to_numpy(Tensor::copy_of(p.grad->view()));
             return d;
           })
      .def(
          "load_state_dict",
          [](L& self, const py::dict& d) {
            StateDict sd;
            for (auto [k, v] : d) {
              std::string name = py::str(k);
              py::array a = py::array::ensure(v);
              sd.emplace(name, Tensor::copy_of(view_of<const float>(a, name.c_str())));
            }
            self.load_state_dict(sd);
          },
          py::arg("state_dict"))
      .def("zero_grad", &L::zero_grad)
      .def("train", [](L& self, bool on) { self.train(on); }, py::arg("mode") = true)
      .def("eval", [](L& self) { self.eval(); })
      .def_property_readonly("training", &L::training);
  return c;
}

}  // namespace attn::py_util
