// numpy arrays as attn Views, without copies: the array's own pointer and strides.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>

#include "attn/mask.h"
#include "attn/param.h"
#include "attn/safetensors.h"
#include "attn/tensor.h"

namespace attn::py_util {
namespace py = pybind11;

inline std::string dtype_name(py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else return "bool";
}

// A view of `a` (which must hold T); `arg` names it in the error. The one place numpy arrays are viewed,
// so the one place their layout is made safe for the kernels, which load T through aligned pointers
// (UBSan: misaligned loads in LoadQ and the reference kernel):
// - an array at an address or with strides that are not whole, aligned elements of T (a frombuffer of
//   a bytearray at offset 1) is copied once into aligned, C-contiguous storage, and `a` is replaced by
//   the copy so it lives as long as the caller's array does; read-only views only (a writable view
//   must be the caller's memory);
// - an empty array's strides are meaningless (numpy gives 0s): the view gets contiguous ones.
template <typename T>
View<T> view_of(py::array& a, const char* arg) {
  bool ok = std::is_same_v<std::remove_const_t<T>, uint8_t>
                ? a.dtype().kind() == 'b' || a.dtype().is(py::dtype::of<uint8_t>())
                : a.dtype().is(py::dtype::of<std::remove_const_t<T>>());
  ATTN_CHECK(ok, "Expected ", arg, " of dtype ", type_name<std::remove_const_t<T>>(), ", but got ",
             dtype_name(a), " instead");
  auto aligned = [](const py::array& x) {
    bool whole = reinterpret_cast<uintptr_t>(x.data()) % alignof(T) == 0;
    for (int i = 0; i < x.ndim(); ++i) whole = whole && x.strides(i) % static_cast<py::ssize_t>(sizeof(T)) == 0;
    return whole;
  };
  if (!aligned(a)) {
    ATTN_CHECK(std::is_const_v<T>, "Expected ", arg, " at an address and with strides that are whole ",
               type_name<std::remove_const_t<T>>(), " elements, but got a misaligned array instead");
    a = a.attr("copy")();  // C order, in numpy's aligned allocation
  }
  Shape shape(a.shape(), a.shape() + a.ndim()), strides(a.ndim());
  for (int i = 0; i < a.ndim(); ++i) strides[i] = a.strides(i) / static_cast<py::ssize_t>(sizeof(T));
  if (a.size() == 0) strides = contiguous_strides(shape);
  T* data = static_cast<T*>(const_cast<void*>(a.data()));
  if constexpr (!std::is_const_v<T>) {
    ATTN_CHECK(a.writeable(), "Expected ", arg, " to be writeable, but got a read-only array instead");
  }
  return View<T>(data, shape, strides);
}

// Hands a Tensor to numpy without a copy: the array's base capsule owns it.
inline py::array to_numpy(Tensor&& t) {
  auto* owned = new Tensor(std::move(t));
  py::capsule base(owned, [](void* p) { delete static_cast<Tensor*>(p); });
  const Shape& s = owned->shape();
  return py::array_t<float>(std::vector<py::ssize_t>(s.begin(), s.end()), owned->data(), base);
}

// ---- {name: numpy array} <-> tensors by name: the one conversion of every binding's dicts ----
// (state_dict, grads, load_state_dict, AdamW's params, grads and state, safetensors files)

// Float32 arrays by name, moved in (no copy).
inline py::dict to_numpy(StateDict sd) {
  py::dict d;
  for (auto& [name, t] : sd) d[py::str(name)] = to_numpy(std::move(t));
  return d;
}
// Copies of each parameter's value (&Param::value) or gradient (&Param::grad), in the parameters' order
// (PyTorch's).
inline py::dict to_numpy(const std::vector<Param>& params, Tensor* Param::*which) {
  py::dict d;
  for (const Param& p : params) d[py::str(p.name)] = to_numpy(Tensor::copy_of((p.*which)->view()));
  return d;
}
// The one dtype rule for tensors handed in by name: a float array of any precision (float16, 32, 64) is
// stored as float32 (a C-order copy, so any strides or alignment do); anything else (integers, bools,
// objects) is an Error naming the tensor and what it got. Names must be str.
// The UTF-8 of a str (a lone surrogate, which UTF-8 can't hold, is an Error naming `what`, not pybind's
// "Unable to cast ... to C++ type '?'").
inline std::string utf8_of(py::handle s, const char* what) {
  ATTN_CHECK(py::isinstance<py::str>(s), "Expected ", what, " that are str, but got ", std::string(py::repr(s)),
             " instead");
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (!p) {
    PyErr_Clear();
    throw Error(cat("Expected ", what, " that UTF-8 can encode, but got ", std::string(py::repr(s)),
                    " (a lone surrogate) instead"));
  }
  return std::string(p, size_t(n));
}

inline StateDict state_dict_of(const py::dict& d) {
  StateDict sd;
  for (auto [k, v] : d) {
    const std::string name = utf8_of(k, "tensor names");
    py::array a = py::array::ensure(v);
    ATTN_CHECK(a && a.dtype().kind() == 'f', "Expected tensor '", name, "' to be a float array, but got ",
               a ? dtype_name(a) : std::string(py::str(py::type::of(v))), " instead");
    auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
    Tensor t(Shape(f.shape(), f.shape() + f.ndim()));
    if (t.numel()) std::memcpy(t.data(), f.data(), size_t(t.numel()) * sizeof(float));
    sd.emplace(name, std::move(t));
  }
  return sd;
}

// A torch.nn-style mask (nn.MultiheadAttention, Transformer layers): bool True = masked out
// (Mask::drop), float32 = added to the scores; None = no mask. Read in place (or from the aligned copy
// view_of makes, which `m` then holds).
inline Mask<float> nn_mask(py::object& m, const char* arg) {
  if (m.is_none()) return {};
  // A view must not outlive its array: take the caller's array itself, never a converted temporary.
  ATTN_CHECK(py::isinstance<py::array>(m), "Expected ", arg, " to be a numpy array, but got ",
             std::string(py::str(py::type::of(m))), " instead");
  py::array a = m.cast<py::array>();
  Mask<float> mask = a.dtype().kind() == 'b' ? Mask<float>::drop(view_of<const uint8_t>(a, arg))
                                             : Mask<float>::additive(view_of<const float>(a, arg));
  m = a;  // the caller's object now holds what the view reads (an aligned copy, if one was made)
  return mask;
}

// A new C-contiguous numpy array and a view of it.
template <typename T>
std::pair<py::array_t<T>, View<T>> new_array(const Shape& shape) {
  py::array_t<T> a(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  return {a, View<T>(a.mutable_data(), shape)};
}

}  // namespace attn::py_util
