// numpy arrays as attn Views, without copies: the array's own pointer and strides.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "attn/mask.h"
#include "attn/tensor.h"

namespace attn::py_util {
namespace py = pybind11;

inline std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else return "bool";
}

// A view of `a` (which must hold T); `arg` names it in the error.
template <typename T>
View<T> view_of(const py::array& a, const char* arg) {
  bool ok = std::is_same_v<std::remove_const_t<T>, uint8_t>
                ? a.dtype().kind() == 'b' || a.dtype().is(py::dtype::of<uint8_t>())
                : a.dtype().is(py::dtype::of<std::remove_const_t<T>>());
  ATTN_CHECK(ok, "Expected ", arg, " of dtype ", type_name<std::remove_const_t<T>>(), ", but got ",
             dtype_name(a), " instead");
  Shape shape(a.shape(), a.shape() + a.ndim()), strides(a.ndim());
  for (int i = 0; i < a.ndim(); ++i) {
    ATTN_CHECK(a.strides(i) % static_cast<py::ssize_t>(sizeof(T)) == 0, "Expected ", arg,
               " strides that are whole elements, but got ", a.strides(i), " bytes instead");
    strides[i] = a.strides(i) / static_cast<py::ssize_t>(sizeof(T));
  }
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

// A torch.nn-style mask (nn.MultiheadAttention, Transformer layers): bool True = masked out
// (Mask::drop), float32 = added to the scores; None = no mask. Read in place.
inline Mask<float> nn_mask(const py::object& m, const char* arg) {
  if (m.is_none()) return {};
  // A view must not outlive its array: take the caller's array itself, never a converted temporary.
  ATTN_CHECK(py::isinstance<py::array>(m), "Expected ", arg, " to be a numpy array, but got ",
             std::string(py::str(py::type::of(m))), " instead");
  py::array a = m.cast<py::array>();
  if (a.dtype().kind() == 'b') return Mask<float>::drop(view_of<const uint8_t>(a, arg));
  return Mask<float>::additive(view_of<const float>(a, arg));
}

// A new C-contiguous numpy array and a view of it.
template <typename T>
std::pair<py::array_t<T>, View<T>> new_array(const Shape& shape) {
  py::array_t<T> a(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  return {a, View<T>(a.mutable_data(), shape)};
}

}  // namespace attn::py_util
