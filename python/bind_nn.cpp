// Python binding of the nn layers: numpy float32 in and out, forward, backward, parameters and gradients
// by PyTorch's names. python/attn/layers.py wraps them with PyTorch's signatures; this file only converts.
#include <pybind11/stl.h>

#include "attn/nn.h"
#include "bind_fields.h"
#include "bind_layer.h"
#include "sdpa_args.h"

namespace py = pybind11;

// Activation in Python: its name, "relu", "gelu" or "gelu_tanh" (parse_activation refuses others by name).
namespace pybind11::detail {
template <>
struct type_caster<attn::Activation> {
  PYBIND11_TYPE_CASTER(attn::Activation, const_name("str"));
  bool load(handle src, bool) {
    if (!isinstance<str>(src)) return false;
    value = attn::parse_activation(src.cast<std::string>());
    return true;
  }
  static handle cast(attn::Activation a, return_value_policy, handle) { return str(attn::to_string(a)).release(); }
};
}  // namespace pybind11::detail

using namespace attn;
using py_util::layer;
using py_util::nn_mask;
using py_util::run;
using py_util::to_numpy;
using py_util::view_of;

namespace {

View<const float> in(py::array& a, const char* arg) { return view_of<const float>(a, arg); }

// forward(x) -> y and backward(dout) -> dx for one-input layers.
template <class L>
void unary(py::class_<L>& c) {
  c.def("forward", [](L& self, py::array& x) {
     View<const float> v = in(x, "input");
     return run(&self, [&] { return self.forward(v); });
   }, py::arg("input"))
      .def("backward", [](L& self, py::array& d) {
        View<const float> v = in(d, "grad_output");
        return run(&self, [&] { return self.backward(v); });
      }, py::arg("grad_output"));
}

// A Transformer layer's constructor: torch.nn's arguments, one per TransformerOptions field, its defaults.
template <class L>
void transformer_init(py::class_<L>& c) {
  py_util::FieldsInit<kTransformerOptionsFields, 2>::def(
      c, [](const TransformerOptions& o) { return std::make_unique<L>(o); });
}

}  // namespace

void bind_nn(py::module_& m) {
  m.attr("TRANSFORMER_DEFAULTS") = py_util::fields_dict(TransformerOptions{}, kTransformerOptionsFields);
  auto lin = layer<Linear>(m, "Linear");
  lin.def(py::init<int64_t, int64_t, bool, uint64_t>(), py::arg("in_features"), py::arg("out_features"),
          py::arg("bias") = true, py::arg("seed") = 0);
  unary(lin);

  auto ln = layer<LayerNorm>(m, "LayerNorm");
  ln.def(py::init<int64_t, double, bool, bool>(), py::arg("normalized_shape"), py::arg("eps") = 1e-5,
         py::arg("elementwise_affine") = true, py::arg("bias") = true);
  unary(ln);

  auto drop = layer<Dropout>(m, "Dropout");
  drop.def(py::init<double, uint64_t>(), py::arg("p") = 0.5, py::arg("seed") = 0);
  unary(drop);

  auto act = layer<ActivationLayer>(m, "Activation");
  act.def(py::init([](const std::string& kind) { return ActivationLayer(parse_activation(kind)); }), py::arg("kind"));
  unary(act);

  auto emb = layer<Embedding>(m, "Embedding");
  emb.def(py::init<int64_t, int64_t, uint64_t>(), py::arg("num_embeddings"), py::arg("embedding_dim"),
          py::arg("seed") = 0)
      .def("forward",
           [](Embedding& self, const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& ids) {
             return run(&self, [&] { return self.forward(ids.data(), Shape(ids.shape(), ids.shape() + ids.ndim())); });
           }, py::arg("input"))
      .def("backward", [](Embedding& self, py::array& d) {
             View<const float> v = in(d, "grad_output");
             py_util::locked(&self, [&] { self.backward(v); });
           }, py::arg("grad_output"));

  auto ff = layer<FeedForward>(m, "FeedForward");
  ff.def(py::init([](int64_t d_model, int64_t dim_feedforward, const std::string& activation, double dropout,
                     bool bias, uint64_t seed) {
           return FeedForward(d_model, dim_feedforward, parse_activation(activation), dropout, bias, seed);
         }),
         py::arg("d_model"), py::arg("dim_feedforward"), py::arg("activation") = "relu", py::arg("dropout") = 0.1,
         py::arg("bias") = true, py::arg("seed") = 0);
  unary(ff);

  auto encoder = layer<TransformerEncoderLayer>(m, "TransformerEncoderLayer");
  transformer_init(encoder);
  encoder.def(
          "forward",
          [](TransformerEncoderLayer& self, py::array& src, py::object& src_mask,
             py::object& src_key_padding_mask, bool is_causal, const py::dict& variants) {
            py_util::Variants var{variants};
            EncoderArgs a{nn_mask(src_mask, "src_mask"), nn_mask(src_key_padding_mask, "src_key_padding_mask"),
                          is_causal, py_util::layer_variants(var)};
            View<const float> x = in(src, "src");
            return run(&self, [&] { return self.forward(x, a); });
          },
          py::arg("src"), py::arg("src_mask") = py::none(), py::arg("src_key_padding_mask") = py::none(),
          py::arg("is_causal") = false, py::arg("variants") = py::dict())
      .def("backward", [](TransformerEncoderLayer& self, py::array& d) {
        View<const float> v = in(d, "grad_output");
        return run(&self, [&] { return self.backward(v); });
      }, py::arg("grad_output"));

  auto decoder = layer<TransformerDecoderLayer>(m, "TransformerDecoderLayer");
  transformer_init(decoder);
  decoder.def(
          "forward",
          [](TransformerDecoderLayer& self, py::array& tgt, py::array& memory, py::object& tgt_mask,
             py::object& memory_mask, py::object& tgt_key_padding_mask,
             py::object& memory_key_padding_mask, bool tgt_is_causal, bool memory_is_causal) {
            DecoderArgs a{nn_mask(tgt_mask, "tgt_mask"), nn_mask(memory_mask, "memory_mask"),
                          nn_mask(tgt_key_padding_mask, "tgt_key_padding_mask"),
                          nn_mask(memory_key_padding_mask, "memory_key_padding_mask"), tgt_is_causal, memory_is_causal};
            View<const float> t = in(tgt, "tgt"), mem = in(memory, "memory");
            return run(&self, [&] { return self.forward(t, mem, a); });
          },
          py::arg("tgt"), py::arg("memory"), py::arg("tgt_mask") = py::none(), py::arg("memory_mask") = py::none(),
          py::arg("tgt_key_padding_mask") = py::none(), py::arg("memory_key_padding_mask") = py::none(),
          py::arg("tgt_is_causal") = false, py::arg("memory_is_causal") = false)
      .def("backward", [](TransformerDecoderLayer& self, py::array& d) {
        View<const float> v = in(d, "grad_output");
        DecoderGrads g = py_util::locked(&self, [&] { return self.backward(v); });
        return py::make_tuple(to_numpy(std::move(g.dtgt)), to_numpy(std::move(g.dmemory)));
      }, py::arg("grad_output"), "(grad tgt, grad memory)");
}
