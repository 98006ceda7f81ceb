// transformers' LlamaForCausalLM and its kin (MistralForCausalLM, Qwen2ForCausalLM, Gemma2ForCausalLM) on
// nn.h's layers (RMSNorm, Rope, Linear): the decoder's parts (embed, layer, head) and each layer's attention
// variants for PretrainedDecoder (hf_decoder.cpp), eval mode. One reader for the four configs: what differs
// is a LlamaVariant (biases, gate activation, Gemma 2's norms and scales, per-layer windows and softcap).
// GQA/MQA through num_key_value_heads (sdpa maps query head h to key/value head h / (H / Hkv)); RoPE's plain
// form only (rope_type "default": no scaling). Not their training and not their other heads.
#include <cmath>
#include <filesystem>

#include "attn/hf.h"
#include "attn/threads.h"
#include "hf_config.h"
#include "hf_json.h"

namespace attn {

namespace {

// The config as DecoderConfig and LlamaVariant; every field the four architectures' configs may hold is
// read and either implemented or refused by name. The weights are asked for the last layer before anything
// is sized by num_hidden_layers (2^40 of them is an error naming the field, not a bad_alloc).
std::pair<DecoderConfig, LlamaVariant> read_llama_config(const std::string& dir, const HfWeights& weights) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const std::string w = cat("'", path, "'");
  LlamaVariant v;
  v.architecture = (*j.find("architectures"))[0].get<std::string>();  // load_pretrained's choice
  const bool llama = v.architecture == "LlamaForCausalLM", mistral = v.architecture == "MistralForCausalLM",
             qwen2 = v.architecture == "Qwen2ForCausalLM", gemma = v.architecture == "Gemma2ForCausalLM";
  hf::check_fields(j, w, v.architecture,
                   {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "intermediate_size", "max_position_embeddings", "rms_norm_eps",
                    "tie_word_embeddings", "hidden_act", "rope_theta", "rope_parameters", "rope_scaling",
                    "attention_bias", "mlp_bias", "pretraining_tp", "sliding_window", "use_sliding_window",
                    "max_window_layers", "layer_types", "hidden_activation", "query_pre_attn_scalar",
                    "attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention"});
  // Fields of another member of the family are not this one's: refused by name as any unknown field.
  auto only = [&](bool mine, std::initializer_list<const char*> keys) {
    for (const char* k : keys)
      ATTN_CHECK(mine || !j.contains(k), "Expected only the config.json fields attn implements for ",
                 v.architecture, " in ", w, ", but got \"", k, "\" (", hf::brief(j[k]), ") instead");
  };
  only(llama, {"mlp_bias", "pretraining_tp"});
  only(llama || gemma, {"attention_bias"});
  only(mistral || qwen2 || gemma, {"sliding_window"});
  only(qwen2, {"use_sliding_window", "max_window_layers"});
  only(qwen2 || gemma, {"layer_types"});
  only(gemma, {"hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
               "use_bidirectional_attention"});
  DecoderConfig c;
  c.vocab_size = hf::field<int64_t>(j, "vocab_size", w);
  c.hidden_size = hf::field<int64_t>(j, "hidden_size", w);
  c.num_layers = hf::field<int64_t>(j, "num_hidden_layers", w);
  c.num_heads = hf::field<int64_t>(j, "num_attention_heads", w);
  c.num_kv_heads = hf::field_or<int64_t>(j, "num_key_value_heads", w, c.num_heads);
  c.intermediate_size = hf::field<int64_t>(j, "intermediate_size", w);
  c.max_positions = hf::field<int64_t>(j, "max_position_embeddings", w);
  c.norm_eps = hf::epsilon(j, "rms_norm_eps", w, 1e-6);
  c.tie_word_embeddings = hf::field_or<bool>(j, "tie_word_embeddings", w, gemma);
  c.eos_token_ids = hf::eos_token_ids(dir, j);
  ATTN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0 &&
             c.intermediate_size > 0 && c.max_positions > 0, "Expected positive sizes in ", w, ", but got vocab_size ",
             c.vocab_size, ", hidden_size ", c.hidden_size, ", num_hidden_layers ", c.num_layers,
             ", num_attention_heads ", c.num_heads, ", num_key_value_heads ", c.num_kv_heads, ", intermediate_size ",
             c.intermediate_size, ", max_position_embeddings ", c.max_positions, " instead");
  weights.expect(cat("model.layers.", c.num_layers - 1, ".input_layernorm.weight"),
                 cat("num_hidden_layers ", c.num_layers, " in config.json"));
  ATTN_CHECK(c.num_heads % c.num_kv_heads == 0, "Expected num_key_value_heads dividing num_attention_heads in ", w,
             ", but got ", c.num_kv_heads, " and ", c.num_heads, " instead");
  c.head_dim = hf::field_or<int64_t>(j, "head_dim", w, c.hidden_size / c.num_heads);
  ATTN_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "Expected an even head_dim > 0 in ", w, ", but got ", c.head_dim,
             " instead");
  hf::product(c.num_heads, c.head_dim, "num_attention_heads * head_dim", w);  // q_proj's rows; k's and v's are fewer
  ATTN_CHECK(hf::field_or<int64_t>(j, "pretraining_tp", w, 1) == 1, "Expected \"pretraining_tp\" 1 for ",
             v.architecture, " in ", w, " (the sliced projections of pretraining_tp > 1 are not implemented), but got ",
             hf::brief(j.at("pretraining_tp")), " instead");
  // the gate's activation: silu, or Gemma 2's tanh GELU
  const char* act_key = gemma && j.contains("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string act = hf::field_or<std::string>(j, act_key, w, gemma ? "gelu_pytorch_tanh" : "silu");
  v.silu = act == "silu";
  ATTN_CHECK(v.silu || act == "gelu_pytorch_tanh" || act == "gelu_new", "Expected \"", act_key,
             "\" \"silu\", \"gelu_pytorch_tanh\" or \"gelu_new\" in ", w, ", but got \"", act, "\" instead");
  // RoPE: rope_theta (transformers 5 keeps it in "rope_parameters", earlier ones at the top)
  v.rope_theta = hf::field_or<double>(j, "rope_theta", w, 10000.0);
  std::string rope_type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    ATTN_CHECK(it->is_object(), "Expected \"", key, "\" in ", w, " to be an object, but got ", hf::brief(*it),
               " instead");
    v.rope_theta = hf::field_or<double>(*it, "rope_theta", w, v.rope_theta);
    rope_type = hf::field_or<std::string>(*it, "rope_type", w, hf::field_or<std::string>(*it, "type", w, "default"));
  }
  ATTN_CHECK(rope_type == "default", "Expected rope_type \"default\" (RoPE without scaling) in ", w, ", but got \"",
             rope_type, "\" instead");
  // biases: Llama's and Gemma 2's attention_bias (all four projections), Qwen2's q/k/v
  const bool attention_bias = hf::field_or<bool>(j, "attention_bias", w, false);
  v.qkv_bias = attention_bias || qwen2;
  v.o_bias = attention_bias;
  v.mlp_bias = hf::field_or<bool>(j, "mlp_bias", w, false);
  // per layer: sliding windows (Mistral: every layer; Qwen2 and Gemma 2: the layers layer_types names)
  const int64_t window = j.contains("sliding_window") ? hf::field_or<int64_t>(j, "sliding_window", w, 0) : 0;
  ATTN_CHECK(window >= 0, "Expected \"sliding_window\" >= 1 or null in ", w, ", but got ", window, " instead");
  std::vector<bool> sliding(size_t(c.num_layers), mistral && window > 0);
  if (auto lt = j.find("layer_types"); lt != j.end() && !lt->is_null()) {
    ATTN_CHECK(lt->is_array() && int64_t(lt->size()) == c.num_layers, "Expected \"layer_types\" in ", w,
               " to list num_hidden_layers (", c.num_layers, ") layer types, but got ", hf::brief(*lt), " instead");
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const hf::json& t = (*lt)[size_t(i)];
      ATTN_CHECK(t == "full_attention" || t == "sliding_attention", "Expected \"layer_types\" of \"full_attention\" ",
                 "or \"sliding_attention\" in ", w, ", but got ", hf::brief(t), " for layer ", i, " instead");
      sliding[size_t(i)] = t == "sliding_attention";
    }
  } else if (qwen2) {  // Qwen2Config: sliding from max_window_layers on, when use_sliding_window
    const bool use = hf::field_or<bool>(j, "use_sliding_window", w, false);
    const int64_t from = hf::field_or<int64_t>(j, "max_window_layers", w, 28);
    for (int64_t i = 0; i < c.num_layers; ++i) sliding[size_t(i)] = use && window > 0 && i >= from;
  } else if (gemma) {  // Gemma2Config: even layers slide
    for (int64_t i = 0; i < c.num_layers; ++i) sliding[size_t(i)] = (i + 1) % 2 == 1;
  }
  if (qwen2 && !hf::field_or<bool>(j, "use_sliding_window", w, false))
    sliding.assign(sliding.size(), false);  // Qwen2Config sets sliding_window to None then
  v.attention.resize(size_t(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    ATTN_CHECK(!sliding[size_t(i)] || window > 0, "Expected \"sliding_window\" >= 1 in ", w, " for its sliding layer ",
               i, ", but got ", j.contains("sliding_window") ? hf::brief(j["sliding_window"]) : "none", " instead");
    if (sliding[size_t(i)]) v.attention[size_t(i)].sliding_window = window;
  }
  if (gemma) {
    v.gemma = true;
    v.gate_act = Activation::gelu_tanh;
    v.embed_scale = float(std::sqrt(double(c.hidden_size)));  // torch.tensor(hidden_size**0.5): float32
    const double scalar = hf::field_or<double>(j, "query_pre_attn_scalar", w, 256);
    const double softcap = hf::field_or<double>(j, "attn_logit_softcapping", w, 0.0);
    v.final_softcap = hf::field_or<double>(j, "final_logit_softcapping", w, 0.0);
    ATTN_CHECK(scalar > 0 && softcap >= 0 && v.final_softcap >= 0, "Expected query_pre_attn_scalar > 0 and ",
               "softcappings >= 0 or null in ", w, ", but got ", scalar, ", ", softcap, " and ", v.final_softcap,
               " instead");
    ATTN_CHECK(!hf::field_or<bool>(j, "use_bidirectional_attention", w, false), "Expected ",
               "\"use_bidirectional_attention\" false or null in ", w, " (a causal decoder), but got true instead");
    for (LayerAttention& a : v.attention) a.scale = std::pow(scalar, -0.5), a.softcap = softcap;
  }
  return {c, v};
}

// An RMSNorm over `name`.weight (E); Gemma 2's multiplies by (1 + weight): that sum, once, in float32 as
// transformers computes it.
RMSNorm rms_norm(const HfWeights& w, const std::string& name, int64_t E, double eps, bool gemma) {
  Tensor weight = w.get(name + ".weight", {E});
  if (!gemma) return RMSNorm(std::move(weight), eps);
  Tensor one_plus({E});
  for (int64_t e = 0; e < E; ++e) one_plus.data()[e] = 1.0f + weight.data()[e];
  return RMSNorm(std::move(one_plus), eps);
}

}  // namespace

LlamaModel::LlamaModel(const std::string& dir) : LlamaModel(dir, HfWeights(dir)) {}

LlamaModel::LlamaModel(const std::string& dir, const HfWeights& w) : LlamaModel(read_llama_config(dir, w), w) {}

LlamaModel::LlamaModel(const std::pair<DecoderConfig, LlamaVariant>& cfg, const HfWeights& w)
    : PretrainedDecoder(cfg.first),
      v_(cfg.second),
      embed_tokens_(w.get("model.embed_tokens.weight", {c_.vocab_size, c_.hidden_size})),
      norm_(rms_norm(w, "model.norm", c_.hidden_size, c_.norm_eps, v_.gemma)),
      lm_head_(w.get(c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                     {c_.vocab_size, c_.hidden_size}),
               Tensor()),
      rope_(c_.head_dim, v_.rope_theta, c_.max_positions),
      act_(v_.gate_act) {
  const int64_t E = c_.hidden_size, I = c_.intermediate_size, QD = c_.num_heads * c_.head_dim,
                KD = c_.num_kv_heads * c_.head_dim;  // read_llama_config checked that H·D fits, and Hkv <= H
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    return w.linear(name, out, in, bias);
  };
  auto norm = [&](const std::string& name) { return rms_norm(w, name, E, c_.norm_eps, v_.gemma); };
  layers_.reserve(size_t(c_.num_layers));
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    Layer l{norm(p + "input_layernorm"), linear(p + "self_attn.q_proj", QD, E, v_.qkv_bias),
            linear(p + "self_attn.k_proj", KD, E, v_.qkv_bias), linear(p + "self_attn.v_proj", KD, E, v_.qkv_bias),
            linear(p + "self_attn.o_proj", E, QD, v_.o_bias), norm(p + "post_attention_layernorm"),
            linear(p + "mlp.gate_proj", I, E, v_.mlp_bias), linear(p + "mlp.up_proj", I, E, v_.mlp_bias),
            linear(p + "mlp.down_proj", E, I, v_.mlp_bias), {}};
    if (v_.gemma) {
      l.ff_norms.push_back(norm(p + "pre_feedforward_layernorm"));
      l.ff_norms.push_back(norm(p + "post_feedforward_layernorm"));
    }
    layers_.push_back(std::move(l));
  }
  for (Layer& l : layers_) {
    for (attn::Layer* m : std::initializer_list<attn::Layer*>{&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj,
                                                              &l.o_proj, &l.post_norm, &l.gate_proj, &l.up_proj,
                                                              &l.down_proj})
      m->eval();
    for (RMSNorm& n : l.ff_norms) n.eval();
  }
  for (attn::Layer* m : std::initializer_list<attn::Layer*>{&embed_tokens_, &norm_, &lm_head_, &act_}) m->eval();
}

Tensor LlamaModel::embed(const int64_t* tok, const int64_t*, int64_t T) {
  Tensor x = embed_tokens_.forward(tok, {T});
  if (v_.embed_scale != 1.0f)
    for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] *= v_.embed_scale;  // Gemma 2: times float32(sqrt(E))
  return x;
}

void LlamaModel::layer(int64_t i, Tensor& x, const int64_t* pos, const Attend& attend) {
  Layer& l = layers_[size_t(i)];
  const int64_t T = x.size(0), H = c_.num_heads, Hkv = c_.num_kv_heads, D = c_.head_dim;
  // a = o_proj(attn(rope(q), rope(k), v)) over h = input_layernorm(x)
  Tensor h = l.input_norm.forward(x.view());
  Tensor q = l.q_proj.forward(h.view()), k = l.k_proj.forward(h.view()), v = l.v_proj.forward(h.view());
  rope_.apply(q.data(), T, H * D, H, pos);  // (T, H·D)
  rope_.apply(k.data(), T, Hkv * D, Hkv, pos);  // (T, Hkv·D)
  Tensor a = l.o_proj.forward(attend(q.view(), k.view(), v.view()).view());
  // Llama: x += a; h = post_attention_layernorm(x). Gemma 2: x += post_attention_layernorm(a);
  // h = pre_feedforward_layernorm(x)
  if (v_.gemma) {
    add_(x.view(), l.post_norm.forward(a.view()).view());
    h = l.ff_norms[0].forward(x.view());
  } else {
    h = l.post_norm.forward_add(x, a.view());
  }
  // f = down_proj(act(gate_proj(h)) · up_proj(h)): silu (torch's x·sigmoid(x)) or the tanh GELU
  Tensor g = l.gate_proj.forward(h.view()), u = l.up_proj.forward(h.view());  // (T, I)
  if (!v_.silu) g = act_.forward(g.view());
  float* pg = g.data();
  const float* pu = u.data();
  const bool silu = v_.silu;
  parallel_for(g.numel(), grain_for(16), [&](int64_t b, int64_t e, int) {
    for (int64_t n = b; n < e; ++n) pg[n] = (silu ? pg[n] / (1.0f + std::exp(-pg[n])) : pg[n]) * pu[n];
  });
  Tensor f = l.down_proj.forward(g.view());
  // x += f (Gemma 2: x += post_feedforward_layernorm(f))
  add_(x.view(), v_.gemma ? l.ff_norms[1].forward(f.view()).view() : f.view());
}

Tensor LlamaModel::final_norm(View<const float> x) { return norm_.forward(x); }

Tensor LlamaModel::head(View<const float> x) {
  Tensor logits = lm_head_.forward(final_norm(x).view());
  if (v_.final_softcap > 0) {  // Gemma 2: logits = cap·tanh(logits / cap), float32 as torch's
    const float cap = float(v_.final_softcap);
    float* p = logits.data();
    parallel_for(logits.numel(), grain_for(16), [&](int64_t b, int64_t e, int) {
      for (int64_t n = b; n < e; ++n) p[n] = std::tanh(p[n] / cap) * cap;
    });
  }
  return logits;
}

std::vector<Linear*> LlamaModel::linears() {
  std::vector<Linear*> l{&lm_head_};
  for (Layer& y : layers_)
    l.insert(l.end(), {&y.q_proj, &y.k_proj, &y.v_proj, &y.o_proj, &y.gate_proj, &y.up_proj, &y.down_proj});
  return l;
}

}  // namespace attn
