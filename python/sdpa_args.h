// The Python-side spelling of SDPA arguments (causal, mask kind) parsed into attn's types, for every
// binding that takes them (the backend's is attn::parse_backend, sdpa.h). Not the checks of shapes:
// make_problem does those.
#pragma once
#include <pybind11/stl.h>

#include <optional>
#include <set>
#include <utility>
#include <vector>
#include <string>

#include "attn/mha.h"
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

// The variants as the Python side passes them, a dict of keyword arguments (python/attn/functional.py):
// window (left, right), alibi_slopes, softcap, relative_bias (num_buckets, H) with relative_bidirectional
// and relative_max_distance, document_ids (B, L) int64, cu_seqlens_q / cu_seqlens_k int64. Holds the
// arrays its views read (view_of may replace one by an aligned copy) for as long as it lives.
struct Variants {
  py::dict d;
  std::vector<py::array> arrays;

  template <typename T>
  void apply(SdpaArgs<T>& a) {
    static const std::set<std::string> known = {"window", "alibi_slopes", "softcap", "relative_bias",
                                                "relative_bidirectional", "relative_max_distance",
                                                "document_ids", "cu_seqlens_q", "cu_seqlens_k"};
    for (const auto& [k, v] : d)
      ATTN_CHECK(known.count(py::str(k).cast<std::string>()), "Expected a variant in {window, alibi_slopes, softcap, ",
                 "relative_bias, relative_bidirectional, relative_max_distance, document_ids, cu_seqlens_q, ",
                 "cu_seqlens_k}, but got '", py::str(k).cast<std::string>(), "' instead");
    arrays.reserve(8);  // views point into these: no reallocation
    const auto array = [&]<typename E>(const char* name, E) -> View<const E> {
      if (!d.contains(name) || d[name].is_none()) return {};
      arrays.push_back(py::array::ensure(d[name]));
      ATTN_CHECK(arrays.back(), "Expected ", name, " to be an array, but got ",
                 py::str(py::type::handle_of(d[name])).cast<std::string>(), " instead");
      return view_of<const E>(arrays.back(), name);
    };
    if (d.contains("window") && !d["window"].is_none()) {
      const auto w = d["window"].cast<std::pair<int64_t, int64_t>>();
      a.window = {w.first, w.second};
    }
    a.alibi_slopes = array("alibi_slopes", T());
    if (d.contains("softcap")) a.softcap = d["softcap"].cast<double>();
    a.relative_bias.table = array("relative_bias", T());
    if (d.contains("relative_bidirectional")) a.relative_bias.bidirectional = d["relative_bidirectional"].cast<bool>();
    if (d.contains("relative_max_distance")) a.relative_bias.max_distance = d["relative_max_distance"].cast<int64_t>();
    a.documents.ids = array("document_ids", int64_t());
    a.documents.cu_seqlens_q = array("cu_seqlens_q", int64_t());
    a.documents.cu_seqlens_k = array("cu_seqlens_k", int64_t());
  }
};

// The variants a layer passes on (mha.h AttnVariants), from the same dict; a relative bias or cu_seqlens (which
// a layer does not take) is refused by name.
inline AttnVariants layer_variants(Variants& var) {
  SdpaArgs<float> a;
  var.apply(a);
  ATTN_CHECK(!a.relative_bias.given() && a.documents.cu_seqlens_q.empty() && a.documents.cu_seqlens_k.empty(),
             "Expected window, alibi_slopes, softcap or document_ids for a layer's attention, but got ",
             a.relative_bias.given() ? "relative_bias" : "cu_seqlens",
             " instead (scaled_dot_product_attention takes it)");
  return {a.window, a.alibi_slopes, a.softcap, a.documents.ids};
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
