// Python binding of sdpa(): numpy in, numpy out, float32 or float64, no copies of the inputs; products in
// fp32 or bf16 (dtype).
#include <pybind11/stl.h>

#include "attn/sdpa.h"
#include "sdpa_args.h"

namespace py = pybind11;
using namespace attn;
using py_util::new_array;
using py_util::make_args;

namespace {

template <typename T>
py::tuple run(const SdpaArgs<T>& a, bool want_weights, bool want_lse, const SdpaOptions& opt, bool explain_only) {
  const auto& q = a.q;
  ATTN_CHECK(q.rank() == 4 && a.k.rank() == 4 && a.v.rank() == 4,
             "Expected query, key and value of rank 4, but got ", to_string(q.shape), ", ",
             to_string(a.k.shape), " and ", to_string(a.v.shape), " instead");
  auto [out, out_v] = new_array<T>({q.size(0), q.size(1), q.size(2), a.v.size(3)});
  auto [w, w_v] = new_array<T>(want_weights ? Shape{q.size(0), q.size(1), q.size(2), a.k.size(2)} : Shape{0});
  auto [lse, lse_v] = new_array<T>(want_lse ? Shape{q.size(0), q.size(1), q.size(2)} : Shape{0});
  SdpaOut<T> o{out_v, want_weights ? w_v : View<T>{}, want_lse ? lse_v : View<T>{}};
  if (explain_only) {
    BackendChoice c = explain(a, o, opt);
    return py::make_tuple(to_string(c.backend), c.reason);
  }
  {
    py::gil_scoped_release nogil;
    sdpa(a, o, opt);
  }
  return py::make_tuple(out, want_weights ? py::object(w) : py::none(), want_lse ? py::object(lse) : py::none());
}

}  // namespace

void bind_sdpa(py::module_& m) {
  m.def(
      "sdpa",
      [](py::array& q, py::array& k, py::array& v, std::optional<py::array>& mask,
         const std::string& mask_kind, std::optional<py::array>& key_padding,
         const std::string& padding_kind, const std::string& causal, std::optional<double> scale,
         double dropout_p, uint64_t seed, bool want_weights, bool want_lse, const std::string& backend,
         bool strict, bool explain_only, const std::string& dtype, const py::dict& variants) {
        SdpaOptions opt{parse_backend(backend), strict, parse_precision(dtype)};
        py_util::Variants var{variants};
        auto call = [&]<typename T>(T) {
          SdpaArgs<T> a =
              make_args<T>(q, k, v, mask, mask_kind, key_padding, padding_kind, causal, scale, dropout_p, seed);
          var.apply(a);
          return run(a, want_weights, want_lse, opt, explain_only);
        };
        return q.dtype().is(py::dtype::of<double>()) ? call(0.0) : call(0.0f);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("mask") = py::none(),
      py::arg("mask_kind") = "keep", py::arg("key_padding") = py::none(), py::arg("padding_kind") = "drop",
      py::arg("causal") = "none", py::arg("scale") = py::none(), py::arg("dropout_p") = 0.0,
      py::arg("seed") = 0, py::arg("want_weights") = false, py::arg("want_lse") = false,
      py::arg("backend") = "auto", py::arg("strict") = false, py::arg("explain_only") = false,
      py::arg("dtype") = "f32", py::arg("variants") = py::dict(),
      "Rank-4 SDPA on numpy arrays: returns (out, weights or None, lse or None), or with explain_only the\n"
      "(backend, reason) it would run. dtype: what the flash forward multiplies in, f32 or bf16. variants: a dict\n"
      "of window, alibi_slopes, softcap, relative_bias (+ relative_bidirectional, relative_max_distance),\n"
      "document_ids, cu_seqlens_q, cu_seqlens_k.");
}
