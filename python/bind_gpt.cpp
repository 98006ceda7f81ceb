// Python binding of the GPT layer: the model (forward, loss + backward, gradients, generation, save and
// load), AdamW, the trainer (a training step, evaluation, checkpoints, resume) and the character
// tokenizer. numpy in, numpy out; token ids are int64 arrays or lists. Only argument conversion here.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "attn/gpt.h"
#include "attn/optim.h"
#include "attn/train.h"
#include "bind_fields.h"
#include "bind_layer.h"

namespace py = pybind11;
using namespace attn;
using py_util::fields_dict;
using py_util::layer;
using py_util::locked;
using py_util::ObjectGuard;
using py_util::state_dict_of;
using py_util::to_numpy;

void distribute_if_launched(Trainer& t);  // bind_dist.cpp: under mpirun, data-parallel training

namespace {

// Token ids (B, T) as a contiguous int64 array (copied only if needed).
py_util::Ids ids_of(const py::object& x, const char* arg) { return py_util::int_array_2d(x, arg, "(B, T)"); }

// Token ids and their targets, both (B, T).
auto ids_and_targets(const py::object& idx, const py::object& targets) {
  auto a = ids_of(idx, "idx"), t = ids_of(targets, "targets");
  ATTN_CHECK(a.shape(0) == t.shape(0) && a.shape(1) == t.shape(1), "Expected targets of idx's shape (", a.shape(0),
             ", ", a.shape(1), "), but got (", t.shape(0), ", ", t.shape(1), ") instead");
  return std::pair{std::move(a), std::move(t)};
}

// AdamW over parameters it owns (a dict of arrays) or over a GPT's (its gradients).
struct PyAdamW {
  std::vector<std::string> names;
  std::vector<Tensor> values, grads;  // owned when built from a dict
  std::unique_ptr<AdamW> opt;
  const void* lock_key = this;  // the GPT whose parameters it updates, else itself (py_util::object_lock)
};

// AdamW over float32 copies of `params`, which it owns; every name decays except those in no_decay.
std::unique_ptr<PyAdamW> adamw_over_arrays(const py::dict& params, double lr, std::pair<double, double> betas,
                                           double eps, double weight_decay, const std::vector<std::string>& no_decay) {
  auto o = std::make_unique<PyAdamW>();
  StateDict sd = state_dict_of(params);
  o->values.reserve(sd.size());
  o->grads.reserve(sd.size());
  for (auto& [name, t] : sd) {
    o->names.push_back(name);
    o->grads.emplace_back(t.shape());
    o->values.push_back(std::move(t));
  }
  std::vector<Param> ps;
  for (size_t i = 0; i < o->names.size(); ++i) ps.push_back({o->names[i], &o->values[i], &o->grads[i]});
  o->opt = std::make_unique<AdamW>(ps, AdamWOptions{lr, betas.first, betas.second, eps, weight_decay},
                                   [no_decay](const Param& p) {
                                     return std::find(no_decay.begin(), no_decay.end(), p.name) == no_decay.end();
                                   });
  return o;
}

py::dict stats(const StepStats& s) {
  py::dict d;
  d["loss"] = s.loss, d["lr"] = s.lr, d["grad_norm"] = s.grad_norm;
  return d;
}

void bind_tokenizer(py::module_& m) {
  py::class_<CharTokenizer>(m, "CharTokenizer", "One token per Unicode code point; the vocabulary sorted.")
      .def(py::init([](const std::string& text) { return CharTokenizer::from_text(text); }), py::arg("text"),
           "The vocabulary of `text`'s characters.")
      .def("encode", &CharTokenizer::encode, py::arg("text"))
      .def("decode", py::overload_cast<const std::vector<int32_t>&>(&CharTokenizer::decode, py::const_), py::arg("ids"))
      .def_property_readonly("vocab", [](const CharTokenizer& t) { return utf8_encode(t.vocab()); })
      .def_property_readonly("vocab_size", &CharTokenizer::vocab_size);
}

// GPT and gpt_config: the model's methods, its constructor from GptConfig's fields.
void bind_gpt_model(py::module_& m) {
  m.def("gpt_config", [](const std::string& name) { return fields_dict(gpt_config(name), kGptConfigFields); },
        py::arg("name"),
        "The named configuration (tiny, nanogpt-cpu, gpt2-small) as a dict of GPT's arguments, vocab_size 0.");

  // GPT(vocab_size=..., <every GptConfig field>, seed=0), with GptConfig{}'s defaults
  auto gpt = layer<Gpt>(m, "GPT", "Decoder-only Transformer (nanoGPT's shape) with explicit backward.");
  py_util::FieldsInit<kGptConfigFields>::def<uint64_t>(
      gpt, [](const GptConfig& config, uint64_t seed) { return std::make_unique<Gpt>(config, seed); },
      py::arg("seed") = 0);
  gpt.def_static(
         "load",
         [](const std::string& dir) {
           LoadedModel lm = load_model(dir);
           return py::make_tuple(py::cast(std::move(lm.model)), py::cast(std::move(lm.tokenizer)));
         },
         py::arg("dir"), "(GPT, CharTokenizer) from a checkpoint directory (attn train --out, or save()).")
      .def(
          "save",
          [](Gpt& g, const std::string& dir, const CharTokenizer& t) { locked(&g, [&] { save_model(dir, g, t); }); },
          py::arg("dir"), py::arg("tokenizer"), "A model-only checkpoint: DIR/model.safetensors + DIR/config.json.")
      .def(
          "forward",
          [](Gpt& g, const py::object& idx) {
            auto a = ids_of(idx, "idx");
            return py_util::run(&g, [&] { return g.forward(a.data(), a.shape(0), a.shape(1)); });
          },
          py::arg("idx"), "logits (B, T, V) for token ids (B, T); saves activations in training mode")
      .def(
          "forward_backward",
          [](Gpt& g, const py::object& idx, const py::object& targets) {
            auto [a, t] = ids_and_targets(idx, targets);
            return locked(&g, [&] { return g.forward_backward(a.data(), t.data(), a.shape(0), a.shape(1)); });
          },
          py::arg("idx"), py::arg("targets"),
          "Mean cross-entropy (targets -1 ignored); adds the gradients (call zero_grad first). Training mode.")
      .def(
          "evaluate",
          [](Gpt& g, const py::object& idx, const py::object& targets) {
            auto [a, t] = ids_and_targets(idx, targets);
            return locked(&g, [&] { return g.evaluate(a.data(), t.data(), a.shape(0), a.shape(1)); });
          },
          py::arg("idx"), py::arg("targets"), "Mean cross-entropy in eval mode, nothing saved.")
      .def_property_readonly("config", [](const Gpt& g) { return fields_dict(g.config(), kGptConfigFields); })
      .def_property_readonly("num_parameters", &Gpt::num_parameters)
      .def(
          "generate",
          [](Gpt& g, const std::vector<int64_t>& prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
             uint64_t seed) {
            return locked(&g, [&] { return generate(g, prompt, {max_new_tokens, temperature, top_k, seed, {}}); });
          },
          py::arg("prompt"), py::arg("max_new_tokens") = SampleOptions{}.max_new_tokens,
          py::arg("temperature") = SampleOptions{}.temperature, py::arg("top_k") = SampleOptions{}.top_k,
          py::arg("seed") = SampleOptions{}.seed,
          "New token ids after `prompt`, one at a time through the KV cache (eval mode).")
      .def(
          "attention_weights",
          [](Gpt& g, const py::object& idx) {
            auto a = ids_of(idx, "idx");
            std::vector<Tensor> w = locked(&g, [&] { return g.attention_weights(a.data(), a.shape(0), a.shape(1)); });
            py::list out;
            for (Tensor& t : w) out.append(to_numpy(std::move(t)));
            return out;
          },
          py::arg("idx"), "Per layer, the attention weights (B, H, T, T); eval mode.");
}

void bind_adamw(py::module_& m) {
  py::class_<PyAdamW>(
      m, "AdamW",
      (std::string("torch.optim.AdamW's update on float32 arrays or on a GPT's parameters.") + py_util::kThreadsDoc)
          .c_str())
      .def(py::init(&adamw_over_arrays), py::arg("params"), py::arg("lr") = 1e-3,
           py::arg("betas") = std::pair{0.9, 0.999}, py::arg("eps") = 1e-8, py::arg("weight_decay") = 1e-2,
           py::arg("no_decay") = std::vector<std::string>{},
           "Owns float32 copies of `params`; every name decays except those in no_decay.")
      .def(py::init([](Gpt& g, double lr, std::pair<double, double> betas, double eps, double weight_decay) {
             auto o = std::make_unique<PyAdamW>();
             o->opt = std::make_unique<AdamW>(g.parameter_list(),
                                              AdamWOptions{lr, betas.first, betas.second, eps, weight_decay});
             o->lock_key = &g;
             return o;
           }),
           py::arg("model"), py::arg("lr") = 1e-3, py::arg("betas") = std::pair{0.9, 0.999}, py::arg("eps") = 1e-8,
           py::arg("weight_decay") = 1e-2, py::keep_alive<1, 2>(),
           "Over a GPT's parameters and gradients; nanoGPT's groups (matrices and embeddings decay).")
      .def(
          "step",
          [](PyAdamW& o, const std::optional<py::dict>& grads, std::optional<double> lr) {
            StateDict g = grads ? state_dict_of(*grads) : StateDict{};
            locked(o.lock_key, [&] {
              if (grads) {
                for (const Param& p : o.opt->params()) {
                  const Tensor& t = expect_tensor(g, p.name, p.value->shape());
                  std::memcpy(p.grad->data(), t.data(), size_t(t.numel()) * sizeof(float));
                }
              }
              o.opt->step(lr.value_or(o.opt->options().lr));
            });
          },
          py::arg("grads") = py::none(), py::arg("lr") = py::none(),
          "One update; grads by name (every parameter) unless the optimizer is over a GPT.")
      .def("zero_grad", [](PyAdamW& o) { locked(o.lock_key, [&] { o.opt->zero_grad(); }); })
      .def_property_readonly("params",
                             [](PyAdamW& o) {
                               ObjectGuard hold(o.lock_key);
                               return to_numpy(o.opt->params(), &Param::value);
                             })
      .def(
          "state",
          [](PyAdamW& o) {
            StateDict s;
            locked(o.lock_key, [&] { o.opt->save_state(s, ""); });
            return to_numpy(std::move(s));
          },
          "exp_avg.<name> and exp_avg_sq.<name>")
      .def_property_readonly("steps", [](PyAdamW& o) { return o.opt->steps(); });
}

// TrainOptions (its fields from kTrainOptionsFields) and the Trainer.
void bind_trainer(py::module_& m) {
  py::class_<TrainOptions> opts(m, "TrainOptions", "attn train's options (see include/attn/train.h).");
  opts.def(py::init<>()).def_static("synthetic", &synthetic_defaults);
  std::apply([&](const auto&... f) { (opts.def_readwrite(f.name, f.member), ...); }, kTrainOptionsFields);

  py::class_<Trainer>(
      m, "Trainer",
      (std::string("The training loop's parts: step(), evaluate(), save(), resume().") + py_util::kThreadsDoc).c_str())
      .def(py::init([](const std::optional<std::string>& data, const std::optional<std::string>& text,
                       const py::kwargs& kw) {
             ATTN_CHECK(!(data && text), "Expected data (a path) or text, not both, but got both instead");
             py::object o = py::cast(data || text ? TrainOptions{} : synthetic_defaults());
             for (auto [k, v] : kw) {
               const std::string name = py::str(k);
               ATTN_CHECK(py::hasattr(o, name.c_str()), "Expected a TrainOptions field, but got '", name, "' instead");
               py::setattr(o, name.c_str(), v);
             }
             Dataset d = data ? Dataset::text_file(*data) : text ? Dataset::text(*text) : Dataset::reverse_task();
             auto t = std::make_unique<Trainer>(o.cast<TrainOptions>(), std::move(d));
             distribute_if_launched(*t);
             return t;
           }),
           py::arg("data") = py::none(), py::arg("text") = py::none(),
           "Trainer(data=path | text=str | neither: the reversal task, **TrainOptions fields)")
      .def_static(
          "resume",
          [](const std::string& dir, int64_t steps, const std::optional<std::string>& data,
             const std::optional<std::string>& text) {
            std::unique_ptr<Dataset> d;
            if (data) d = std::make_unique<Dataset>(Dataset::text_file(*data));
            if (text) d = std::make_unique<Dataset>(Dataset::text(*text));
            auto t = Trainer::resume(dir, std::move(d), steps);
            distribute_if_launched(*t);
            return t;
          },
          py::arg("dir"), py::arg("steps") = 0, py::arg("data") = py::none(), py::arg("text") = py::none(),
          "Continues a saved run; data/text only if it was not trained on the file its checkpoint names.")
      // Its calls hold the lock of its model (trainer.model's calls take the same one).
      .def("step", [](Trainer& t) { return stats(locked(&t.model(), [&] { return t.step(); })); })
      .def(
          "evaluate",
          [](Trainer& t) {
            const EvalStats e = locked(&t.model(), [&] { return t.evaluate(); });
            return py::make_tuple(e.train_loss, e.val_loss);
          },
          "(train loss, val loss)")
      .def(
          "save", [](Trainer& t, const std::string& dir) { locked(&t.model(), [&] { t.save(dir); }); }, py::arg("dir"))
      .def_property_readonly("model", &Trainer::model, py::return_value_policy::reference_internal)
      .def_property_readonly("tokenizer", [](const Trainer& t) { return t.data().tokenizer(); })
      .def_property_readonly("options", &Trainer::options)
      .def_property_readonly("step_count", &Trainer::step_count)
      .def_property_readonly("seq_len", &Trainer::seq_len)
      .def_property_readonly("tokens_per_step", &Trainer::tokens_per_step);
}

}  // namespace

void bind_gpt(py::module_& m) {
  bind_tokenizer(m);
  bind_gpt_model(m);
  bind_adamw(m);
  bind_trainer(m);
}
