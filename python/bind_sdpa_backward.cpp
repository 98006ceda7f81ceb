// Python binding of sdpa_backward(): numpy in, (dq, dk, dv) numpy out, float32 or float64, no copies of
// the inputs. Takes the same argument spelling as _attn.sdpa, plus the forward's out and lse and dout;
// mask_grad=True adds dmask (B, H, L, S), the gradient of an additive mask, unreduced.
#include <pybind11/stl.h>

#include "attn/sdpa.h"
#include "numpy_view.h"
#include "sdpa_args.h"

namespace py = pybind11;
using namespace attn;
using py_util::new_array;
using py_util::view_of;
using py_util::make_args;

namespace {

template <typename T>
py::tuple run(py::array& q, py::array& k, py::array& v, py::array& out,
              py::array& lse, py::array& dout, std::optional<py::array>& mask,
              const std::string& mask_kind, std::optional<py::array>& key_padding,
              const std::string& padding_kind, const std::string& causal, std::optional<double> scale,
              double dropout_p, uint64_t seed, const SdpaOptions& opt, bool mask_grad, py_util::Variants& var) {
  SdpaArgs<T> a = make_args<T>(q, k, v, mask, mask_kind, key_padding, padding_kind, causal, scale, dropout_p, seed);
  var.apply(a);
  // The gradients have the shapes of their inputs; sdpa_backward checks everything else.
  auto shape = [](const View<const T>& x) { return x.shape; };
  auto [dq, dq_v] = new_array<T>(shape(a.q));
  auto [dk, dk_v] = new_array<T>(shape(a.k));
  auto [dv, dv_v] = new_array<T>(shape(a.v));
  SdpaGrads<T> grads{dq_v, dk_v, dv_v};
  py::object dmask = py::none();
  if (mask_grad) {
    auto [m, m_v] = new_array<T>({a.q.size(0), a.q.size(1), a.q.size(2), a.k.size(2)});
    dmask = m;
    grads.dmask = m_v;
  }
  py::object drel = py::none();
  if (a.relative_bias.given()) {
    auto [r, r_v] = new_array<T>(a.relative_bias.table.shape);
    drel = r;
    grads.drelative_bias = r_v;
  }
  View<const T> out_v = view_of<const T>(out, "out"), lse_v = view_of<const T>(lse, "lse"),
                dout_v = view_of<const T>(dout, "dout");
  {
    py::gil_scoped_release nogil;
    sdpa_backward(a, out_v, lse_v, dout_v, grads, opt);
  }
  if (a.relative_bias.given()) return py::tuple(py::make_tuple(dq, dk, dv, dmask, drel));
  if (mask_grad) return py::tuple(py::make_tuple(dq, dk, dv, dmask));
  return py::tuple(py::make_tuple(dq, dk, dv));
}

}  // namespace

void bind_sdpa_backward(py::module_& m) {
  m.def(
      "sdpa_backward",
      [](py::array& q, py::array& k, py::array& v, py::array& out, py::array& lse,
         py::array& dout, std::optional<py::array>& mask, const std::string& mask_kind,
         std::optional<py::array>& key_padding, const std::string& padding_kind, const std::string& causal,
         std::optional<double> scale, double dropout_p, uint64_t seed, const std::string& backend, bool strict,
         bool mask_grad, const std::string& dtype, const py::dict& variants) {
        SdpaOptions opt{parse_backend(backend), strict, parse_precision(dtype)};
        py_util::Variants var{variants};
        auto call = [&]<typename T>(T) {
          return run<T>(q, k, v, out, lse, dout, mask, mask_kind, key_padding, padding_kind, causal, scale,
                        dropout_p, seed, opt, mask_grad, var);
        };
        return q.dtype().is(py::dtype::of<double>()) ? call(0.0) : call(0.0f);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("out"), py::arg("lse"), py::arg("dout"),
      py::arg("mask") = py::none(), py::arg("mask_kind") = "keep", py::arg("key_padding") = py::none(),
      py::arg("padding_kind") = "drop", py::arg("causal") = "none", py::arg("scale") = py::none(),
      py::arg("dropout_p") = 0.0, py::arg("seed") = 0, py::arg("backend") = "auto", py::arg("strict") = false,
      py::arg("mask_grad") = false, py::arg("dtype") = "f32", py::arg("variants") = py::dict(),
      "Gradients of rank-4 SDPA on numpy arrays, given the forward's out and lse and dout: returns (dq, dk, dv), "
      "and dmask (B, H, L, S), the additive mask's gradient, with mask_grad=True. dtype: what the flash backward "
      "multiplies in, f32 or bf16 (that of the forward which gave out and lse). variants: as _attn.sdpa's; with a\n"
      "relative_bias the result is (dq, dk, dv, dmask or None, drelative_bias).");
}
