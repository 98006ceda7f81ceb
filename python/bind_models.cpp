// Python binding of pretrained Hugging Face models (attn/hf.h) and their tokenizers (attn/hf_tokenizer.h):
// numpy in, numpy out; token ids are int64 arrays or lists. Only argument conversion here; the package's
// python/attn/models.py is what users call.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>

#include "attn/hf.h"
#include "attn/hf_tokenizer.h"
#include "bind_layer.h"

namespace py = pybind11;
using namespace attn;
using py_util::to_numpy;

namespace {

using py_util::Ids;

// (ids, attention_mask or None) checked against each other; mask may be None.
std::pair<Ids, Ids> ids_and_mask(const py::object& ids, const py::object& mask) {
  Ids x = py_util::int_array_2d(ids, "ids", "(B, L)");
  Ids m;
  if (!mask.is_none()) {
    m = py_util::int_array_2d(mask, "attention_mask", "(B, L)", /*mask01=*/true);
    ATTN_CHECK(m.shape(0) == x.shape(0) && m.shape(1) == x.shape(1), "Expected attention_mask of ids' shape (",
               x.shape(0), ", ", x.shape(1), "), but got (", m.shape(0), ", ", m.shape(1), ") instead");
  }
  return {x, m};
}

}  // namespace

void bind_models(py::module_& m) {
  py::class_<HfTokenizer>(m, "HfTokenizer",
                          "A tokenizer.json pipeline (WordPiece or byte-level BPE): the ids `tokenizers` gives.")
      .def_static("from_file", &HfTokenizer::from_file, py::arg("path"))
      .def("encode", [](const HfTokenizer& t, const std::string& text, bool special,
                        int64_t max_length) { return t.encode(text, special, max_length).ids; },
           py::arg("text"), py::arg("add_special_tokens") = true, py::arg("max_length") = -1,
           "Token ids as the `tokenizers` library gives them (max_length -1: the file's truncation, 0: none).")
      .def("tokenize", [](const HfTokenizer& t, const std::string& text, bool special) {
             return t.encode(text, special).tokens;
           }, py::arg("text"), py::arg("add_special_tokens") = true, "The token strings of encode().")
      .def("decode", &HfTokenizer::decode, py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def("token_to_id", [](const HfTokenizer& t, const std::string& s) -> py::object {
             const int64_t id = t.token_to_id(s);
             return id < 0 ? py::object(py::none()) : py::object(py::int_(id));
           }, py::arg("token"))
      .def("id_to_token", &HfTokenizer::id_to_token, py::arg("id"))
      .def_property_readonly("vocab_size", &HfTokenizer::vocab_size)
      .def_property_readonly("pad_id", &HfTokenizer::pad_id)
      .def_property_readonly("max_length", &HfTokenizer::max_length);

  py::class_<Pretrained>(
      m, "Pretrained",
      (std::string("A Hugging Face model directory: model, tokenizer, pooling.") + py_util::kThreadsDoc).c_str())
      .def(py::init([](const std::string& dir, const std::string& dtype) {
             return Pretrained::load(dir, parse_precision(dtype));
           }),
           py::arg("dir"), py::arg("dtype") = "float32")
      .def_property_readonly("dtype", [](const Pretrained& p) { return to_string(p.model->precision); })
      .def_property_readonly("architecture", [](const Pretrained& p) { return p.model->architecture(); })
      .def_property_readonly("hidden_size", [](const Pretrained& p) { return p.model->hidden_size(); })
      .def_property_readonly("num_layers", [](const Pretrained& p) { return p.model->num_layers(); })
      .def_property_readonly("num_heads", [](const Pretrained& p) { return p.model->num_heads(); })
      .def_property_readonly("vocab_size", [](const Pretrained& p) { return p.model->vocab_size(); })
      .def_property_readonly("max_tokens", &Pretrained::max_tokens)
      .def_property_readonly(
          "tokenizer", [](Pretrained& p) -> HfTokenizer& { return p.tokenizer; },
          py::return_value_policy::reference_internal)
      .def(
          "forward",
          [](Pretrained& p, const py::object& ids, const py::object& mask) {
            auto [x, mk] = ids_and_mask(ids, mask);
            return py_util::run(&p, [&] {
              return p.model->forward(x.data(), x.shape(0), x.shape(1), mask.is_none() ? nullptr : mk.data());
            });
          },
          py::arg("ids"), py::arg("attention_mask") = py::none())
      .def(
          "attention_weights",
          [](Pretrained& p, const py::object& ids, const py::object& mask) {
            auto [x, mk] = ids_and_mask(ids, mask);
            std::vector<Tensor> w = py_util::locked(&p, [&] {
              return p.model->attention_weights(x.data(), x.shape(0), x.shape(1), mask.is_none() ? nullptr : mk.data());
            });
            py::list out;
            for (Tensor& t : w) out.append(to_numpy(std::move(t)));
            return out;
          },
          py::arg("ids"), py::arg("attention_mask") = py::none())
      .def_property_readonly("is_decoder", [](const Pretrained& p) { return p.decoder() != nullptr; })
      .def_property_readonly("is_seq2seq", [](const Pretrained& p) { return p.seq2seq() != nullptr; })
      .def_property_readonly("eos_token_ids",
                             [](const Pretrained& p) {
                               return p.decoder()   ? p.decoder()->decoder_config().eos_token_ids
                                      : p.seq2seq() ? p.seq2seq()->seq2seq_config().eos_token_ids
                                                    : std::vector<int64_t>{};
                             })
      .def_property_readonly("decoder_start_token_id",
                             [](const Pretrained& p) -> py::object {
                               if (!p.seq2seq()) return py::none();
                               return py::int_(p.seq2seq()->seq2seq_config().decoder_start_token_id);
                             })
      .def(
          "generate",
          [](Pretrained& p, const std::vector<int64_t>& prompt, int64_t max_new_tokens, double temperature,
             int64_t top_k, uint64_t seed, const std::string& kv_dtype,
             const std::optional<std::vector<int64_t>>& eos) {
            PretrainedDecoder* d = p.decoder();
            PretrainedSeq2Seq* s = p.seq2seq();
            ATTN_CHECK(d || s, "Expected a decoder or an encoder-decoder for generate, but got ",
                       p.model->architecture(), " instead");
            SampleOptions o;
            o.max_new_tokens = max_new_tokens;
            o.temperature = temperature;
            o.top_k = top_k;
            o.seed = seed;
            o.kv_dtype = parse_kv_dtype(kv_dtype.c_str());
            o.eos_token_ids = eos ? *eos : d ? d->decoder_config().eos_token_ids : s->seq2seq_config().eos_token_ids;
            return py_util::locked(&p, [&] { return d ? generate(*d, prompt, o) : generate(*s, prompt, o); });
          },
          py::arg("prompt"), py::arg("max_new_tokens") = SampleOptions{}.max_new_tokens,
          py::arg("temperature") = SampleOptions{}.temperature, py::arg("top_k") = SampleOptions{}.top_k,
          py::arg("seed") = SampleOptions{}.seed, py::arg("kv_dtype") = "f32", py::arg("eos_token_ids") = py::none())
      .def(
          "seq2seq_logits",
          [](Pretrained& p, const py::object& source, const py::object& target, const py::object& mask) {
            PretrainedSeq2Seq* s = p.seq2seq();
            ATTN_CHECK(s, "Expected an encoder-decoder for logits(source, target), but got ",
                       p.model->architecture(), " instead");
            auto [x, mk] = ids_and_mask(source, mask);
            py_util::Ids y = py_util::int_array_2d(target, "target", "(B, T)");
            ATTN_CHECK(y.shape(0) == x.shape(0), "Expected target ids of the source's batch ", x.shape(0),
                       ", but got ", y.shape(0), " instead");
            return py_util::run(&p, [&] {
              return s->logits(x.data(), x.shape(0), x.shape(1), mask.is_none() ? nullptr : mk.data(), y.data(),
                               y.shape(1));
            });
          },
          py::arg("source"), py::arg("target"), py::arg("attention_mask") = py::none())
      .def(
          "seq2seq_attention_weights",
          [](Pretrained& p, const std::vector<int64_t>& source, const std::vector<int64_t>& target) {
            PretrainedSeq2Seq* s = p.seq2seq();
            ATTN_CHECK(s, "Expected an encoder-decoder for its attention weights, but got ",
                       p.model->architecture(), " instead");
            ATTN_CHECK(!source.empty() && !target.empty(), "Expected a source and a target of at least one token, ",
                       "but got ", source.size(), " and ", target.size(), " instead");
            PretrainedSeq2Seq::Weights w = py_util::locked(&p, [&] {
              return s->all_attention_weights(source.data(), int64_t(source.size()), target.data(),
                                              int64_t(target.size()));
            });
            py::dict out;
            for (auto [name, list] : {std::pair{"encoder", &w.encoder}, std::pair{"decoder", &w.decoder},
                                      std::pair{"cross", &w.cross}}) {
              py::list l;
              for (Tensor& t : *list) l.append(to_numpy(std::move(t)));
              out[name] = l;
            }
            return out;
          },
          py::arg("source"), py::arg("target"))
      .def(
          "embed",
          [](Pretrained& p, const std::vector<std::string>& texts, int64_t batch, int64_t max_length) {
            return py_util::run(&p, [&] { return p.embed(texts, batch, max_length); });
          },
          py::arg("texts"), py::arg("batch_size") = 32, py::arg("max_length") = 0);
}
