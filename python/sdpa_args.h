// The Python-side spelling of SDPA arguments (causal, backend, mask kind) parsed into attn's types, for
// every binding that takes them. Not the checks of shapes: make_problem does those.
#pragma once
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "attn/sdpa.h"
#include "numpy_view.h"

namespace attn::py_util {

inline Causal parse_causal(const std::string& s) {
  if (s == "none") return Causal::none;
  if (s == "top_left") return Causal::top_left;
  if (s == "bottom_right") return Causal::bottom_right;
  throw Error(cat("Expected causal in {none, top_left, bottom_right}, but got '", s, "' instead"));
}

inline Backend parse_backend(const std::string& s) {
  if (s == "auto") return Backend::automatic;
  if (s == "reference") return Backend::reference;
  if (s == "flash") return Backend::flash;
  throw Error(cat("Expected backend in {auto, reference, flash}, but got '", s, "' instead"));
}

// kind: "keep" (bool, True = attend), "drop" (bool, True = masked out) or "additive" (float).
template <typename T>
Mask<T> make_mask(const std::optional<py::array>& m, const std::string& kind, const char* arg) {
  if (!m) return {};
  if (kind == "additive") return Mask<T>::additive(view_of<const T>(*m, arg));
  if (kind == "keep") return Mask<T>::keep(view_of<const uint8_t>(*m, arg));
  if (kind == "drop") return Mask<T>::drop(view_of<const uint8_t>(*m, arg));
  throw Error(cat("Expected a mask kind in {keep, drop, additive} for ", arg, ", but got '", kind, "' instead"));
}

}  // namespace attn::py_util
