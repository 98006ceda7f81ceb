// What every bound layer shares (nn layers, MultiheadAttention): parameters and gradients by PyTorch's
// names as numpy dicts, state_dict loading, the training flag; running C++ work without the GIL; and the
// per-object lock that makes an object shared across Python threads safe.
#pragma once
#include <pybind11/stl.h>

#include <cstdint>
#include <mutex>

#include "attn/param.h"
#include "attn/safetensors.h"
#include "numpy_view.h"

namespace attn::py_util {

// ---- Objects shared across Python threads ----
// A layer, GPT, Trainer or AdamW keeps saved activations, scratch and parameters in itself, and its calls
// run without the GIL: two threads in one object at once would share them (use-after-free, wrong logits).
// So every call on such an object holds the object's lock: calls on one object run one at a time, calls
// on different objects in parallel. The locks are striped by address (two objects share one in 1/64 of
// cases, which only serialises them); each call holds one lock, and takes it with the GIL released, so a
// waiting thread never blocks Python and no two threads can wait on each other.
inline std::mutex& object_lock(const void* self) {
  static std::mutex locks[64];
  return locks[(reinterpret_cast<uintptr_t>(self) >> 4) % 64];
}
inline constexpr const char* kThreadsDoc =
    " Safe to share across threads: calls on one object run one at a time (a per-object lock); a forward and "
    "the backward that follows are two calls, so for training use one object per thread.";

// Holds self's lock for its scope, with the GIL (taken without it, then the GIL taken back).
class ObjectGuard {
 public:
  explicit ObjectGuard(const void* self) : m_(object_lock(self)) {
    py::gil_scoped_release nogil;
    m_.lock();
  }
  ~ObjectGuard() { m_.unlock(); }
  ObjectGuard(const ObjectGuard&) = delete;
  ObjectGuard& operator=(const ObjectGuard&) = delete;

 private:
  std::mutex& m_;
};

// Runs f() without the GIL, holding self's lock.
template <class F>
auto locked(const void* self, F f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> hold(object_lock(self));
  return f();
}

// Runs f() without the GIL, holding self's lock, and hands its Tensor to numpy.
template <class F>
py::array run(const void* self, F f) {
  Tensor t = locked(self, f);
  return to_numpy(std::move(t));
}

// What every layer has: parameters, gradients, state_dict I/O, the training flag.
template <class L, class... Extra>
py::class_<L, Extra...> layer(py::module_& m, const char* name, const char* doc = "") {
  py::class_<L, Extra...> c(m, name, (std::string(doc) + kThreadsDoc).c_str());
  c.def("state_dict", [](L& self) { ObjectGuard g(&self); return to_numpy(self.parameter_list(), &Param::value); },
        "{name: float32 array} in PyTorch's order (copies).")
      .def("grads", [](L& self) { ObjectGuard g(&self); return to_numpy(self.parameter_list(), &Param::grad); },
           "Gradients by parameter name, as state_dict() (copies).")
      .def("load_state_dict", [](L& self, const py::dict& d) {
             StateDict sd = state_dict_of(d);
             locked(&self, [&] { self.load_state_dict(sd); });
           },
           py::arg("state_dict"), "Float arrays of any precision by name (stored as float32); every name, each shape.")
      .def("zero_grad", [](L& self) { locked(&self, [&] { self.zero_grad(); }); })
      .def("train", [](L& self, bool on) { locked(&self, [&] { self.train(on); }); }, py::arg("mode") = true)
      .def("eval", [](L& self) { locked(&self, [&] { self.eval(); }); })
      .def_property_readonly("training", [](L& self) { return locked(&self, [&] { return self.training(); }); });
  return c;
}

}  // namespace attn::py_util
