// Python binding of MultiheadAttention: numpy float32 in and out, inputs and masks read in place.
// python/attn/layers.py wraps it with PyTorch's signature; this file only converts arguments.
#include <pybind11/stl.h>

#include <sstream>

#include "attn/mha.h"
#include "bind_fields.h"
#include "bind_layer.h"
#include "sdpa_args.h"

namespace py = pybind11;
using namespace attn;
using py_util::layer;
using py_util::to_numpy;
using py_util::view_of;

void bind_mha(py::module_& m) {
  m.attr("MHA_DEFAULTS") = py_util::fields_dict(MhaOptions{}, kMhaOptionsFields);
  auto mha = layer<MultiheadAttention>(m, "MultiheadAttention");
  // torch.nn.MultiheadAttention's arguments, one per MhaOptions field, its defaults
  py_util::FieldsInit<kMhaOptionsFields, 2>::def(mha, [](const MhaOptions& o) { return MultiheadAttention(o); });
  mha.def(
         "forward",
         [](MultiheadAttention& self, py::array& query, py::array& key, py::array& value, py::object& key_padding_mask,
            bool need_weights, py::object& attn_mask, bool average_attn_weights, bool is_causal, bool trace,
            const py::dict& variants) {
           std::ostringstream text;
           py_util::Variants var{variants};
           MhaArgs args{py_util::nn_mask(key_padding_mask, "key_padding_mask"),
                        need_weights,
                        py_util::nn_mask(attn_mask, "attn_mask"),
                        average_attn_weights,
                        is_causal,
                        trace ? &text : nullptr,
                        py_util::layer_variants(var)};
           View<const float> q = view_of<const float>(query, "query"), k = view_of<const float>(key, "key"),
                             v = view_of<const float>(value, "value");
           MhaOutput r = py_util::locked(&self, [&] { return self.forward(q, k, v, args); });
           py::object w = need_weights ? py::object(to_numpy(std::move(r.weights))) : py::none();
           return py::make_tuple(to_numpy(std::move(r.output)), w,
                                 trace ? py::object(py::str(text.str())) : py::none());
         },
         py::arg("query"), py::arg("key"), py::arg("value"), py::arg("key_padding_mask") = py::none(),
         py::arg("need_weights") = true, py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true,
         py::arg("is_causal") = false, py::arg("trace") = false, py::arg("variants") = py::dict(),
         "(output, weights or None, trace text or None); variants: window, alibi_slopes, softcap, document_ids")
      .def(
          "backward",
          [](MultiheadAttention& self, py::array& grad_output) {
            View<const float> d = view_of<const float>(grad_output, "grad_output");
            MhaGrads g = py_util::locked(&self, [&] { return self.backward(d); });
            return py::make_tuple(to_numpy(std::move(g.dquery)), to_numpy(std::move(g.dkey)),
                                  to_numpy(std::move(g.dvalue)));
          },
          py::arg("grad_output"), "(dquery, dkey, dvalue); adds into the parameter gradients")
      .def(
          "save",
          [](MultiheadAttention& self, const std::string& path) { py_util::locked(&self, [&] { self.save(path); }); },
          py::arg("path"))
      .def(
          "load",
          [](MultiheadAttention& self, const std::string& path) { py_util::locked(&self, [&] { self.load(path); }); },
          py::arg("path"))
      .def_property_readonly("embed_dim", [](const MultiheadAttention& s) { return s.options().embed_dim; })
      .def_property_readonly("num_heads", [](const MultiheadAttention& s) { return s.options().num_heads; })
      .def_property_readonly("num_kv_heads", [](const MultiheadAttention& s) { return s.options().num_kv_heads; })
      .def_property_readonly("kdim", [](const MultiheadAttention& s) { return s.options().kdim; })
      .def_property_readonly("vdim", [](const MultiheadAttention& s) { return s.options().vdim; })
      .def_property_readonly("head_dim", &MultiheadAttention::head_dim)
      .def_property_readonly("dropout", [](const MultiheadAttention& s) { return s.options().dropout; })
      .def_property_readonly("batch_first", [](const MultiheadAttention& s) { return s.options().batch_first; });
}
