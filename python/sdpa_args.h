// The Python-side spelling of SDPA arguments (causal, mask kind) parsed into attn's types, for every
// binding that takes them (the backend's is attn::parse_backend, sdpa.h). Not the checks of shapes:
// make_problem does those.
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

// kind: "keep" (bool, True = attend), "drop" (bool, True = masked out) or "additive" (float).
template <typename T>
Mask<T> make_mask(std::optional<py::array>& m, const std::string& kind, const char* arg) {
  if (!m) return {};
  if (kind == "additive") return Mask<T>::additive(view_of<const T>(*m, arg));
  if (kind == "keep") return Mask<T>::keep(view_of<const uint8_t>(*m, arg));
  if (kind == "drop") return Mask<T>::drop(view_of<const uint8_t>(*m, arg));
  throw Error(cat("Expected a mask kind in {keep, drop, additive} for ", arg, ", but got '", kind, "' instead"));
}

// SdpaArgs over numpy arrays (read in place) and the Python spelling of the options.
template <typename T>
SdpaArgs<T> make_args(py::array& q, py::array& k, py::array& v,
                      std::optional<py::array>& mask, const std::string& mask_kind,
                      std::optional<py::array>& key_padding, const std::string& padding_kind,
                      const std::string& causal, std::optional<double> scale, double dropout_p, uint64_t seed) {
  SdpaArgs<T> a;
  a.q = view_of<const T>(q, "query");
  a.k = view_of<const T>(k, "key");
  a.v = view_of<const T>(v, "value");
  a.attn_mask = make_mask<T>(mask, mask_kind, "attn_mask");
  a.key_padding = make_mask<T>(key_padding, padding_kind, "key_padding_mask");
  a.causal = parse_causal(causal);
  a.scale = scale;
  a.dropout_p = dropout_p;
  a.seed = seed;
  return a;
}

}  // namespace attn::py_util
