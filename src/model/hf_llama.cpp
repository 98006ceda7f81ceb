// transformers' LlamaForCausalLM on nn.h's layers (RMSNorm, Rope, Linear): the decoder's parts (embed,
// layer, head) for PretrainedDecoder (hf_decoder.cpp), eval mode. GQA/MQA through num_key_value_heads
// (sdpa maps query head h to key/value head h / (H / Hkv)); RoPE's plain form only (rope_type
// "default": no scaling). Not Llama's training and not its other heads.
#include <cmath>
#include <filesystem>

#include "attn/hf.h"
#include "attn/threads.h"
#include "hf_json.h"

namespace attn {

namespace {

// The config, and rope_theta (transformers 5 keeps it in "rope_parameters", earlier ones at the top).
std::pair<DecoderConfig, double> read_llama_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const std::string w = cat("'", path, "'");
  DecoderConfig c;
  c.vocab_size = hf::field<int64_t>(j, "vocab_size", w);
  c.hidden_size = hf::field<int64_t>(j, "hidden_size", w);
  c.num_layers = hf::field<int64_t>(j, "num_hidden_layers", w);
  c.num_heads = hf::field<int64_t>(j, "num_attention_heads", w);
  c.num_kv_heads = hf::field_or<int64_t>(j, "num_key_value_heads", w, c.num_heads);
  c.intermediate_size = hf::field<int64_t>(j, "intermediate_size", w);
  c.max_positions = hf::field<int64_t>(j, "max_position_embeddings", w);
  c.norm_eps = hf::epsilon(j, "rms_norm_eps", w, 1e-6);
  c.tie_word_embeddings = hf::field_or<bool>(j, "tie_word_embeddings", w, false);
  c.eos_token_ids = hf::eos_token_ids(dir, j);
  ATTN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0 &&
             c.intermediate_size > 0 && c.max_positions > 0, "Expected positive sizes in ", w, ", but got vocab_size ",
             c.vocab_size, ", hidden_size ", c.hidden_size, ", num_hidden_layers ", c.num_layers,
             ", num_attention_heads ", c.num_heads, ", num_key_value_heads ", c.num_kv_heads, ", intermediate_size ",
             c.intermediate_size, ", max_position_embeddings ", c.max_positions, " instead");
  ATTN_CHECK(c.num_heads % c.num_kv_heads == 0, "Expected num_key_value_heads dividing num_attention_heads in ", w,
             ", but got ", c.num_kv_heads, " and ", c.num_heads, " instead");
  c.head_dim = hf::field_or<int64_t>(j, "head_dim", w, c.hidden_size / c.num_heads);
  ATTN_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "Expected an even head_dim > 0 in ", w, ", but got ", c.head_dim,
             " instead");
  hf::product(c.num_heads, c.head_dim, "num_attention_heads * head_dim", w);  // q_proj's rows; k's and v's are fewer
  const std::string act = hf::field_or<std::string>(j, "hidden_act", w, "silu");
  ATTN_CHECK(act == "silu", "Expected \"hidden_act\" \"silu\" in ", w, ", but got \"", act, "\" instead");
  double theta = hf::field_or<double>(j, "rope_theta", w, 10000.0);
  std::string rope_type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    ATTN_CHECK(it->is_object(), "Expected \"", key, "\" in ", w, " to be an object, but got ", hf::brief(*it),
               " instead");
    theta = hf::field_or<double>(*it, "rope_theta", w, theta);
    rope_type = hf::field_or<std::string>(*it, "rope_type", w, hf::field_or<std::string>(*it, "type", w, "default"));
  }
  ATTN_CHECK(rope_type == "default", "Expected rope_type \"default\" (RoPE without scaling) in ", w, ", but got \"",
             rope_type, "\" instead");
  return {c, theta};
}

}  // namespace

LlamaModel::LlamaModel(const std::string& dir) : LlamaModel(read_llama_config(dir), HfWeights(dir)) {}

LlamaModel::LlamaModel(const std::pair<DecoderConfig, double>& cfg, const HfWeights& w)
    : PretrainedDecoder(cfg.first),
      embed_tokens_(w.get("model.embed_tokens.weight", {c_.vocab_size, c_.hidden_size})),
      norm_(w.get("model.norm.weight", {c_.hidden_size}), c_.norm_eps),
      lm_head_(w.get(c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                     {c_.vocab_size, c_.hidden_size}),
               Tensor()),
      rope_(c_.head_dim, cfg.second, c_.max_positions) {
  const std::string path = (std::filesystem::path(w.dir()) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const bool attn_bias = hf::field_or<bool>(j, "attention_bias", path, false);
  const bool mlp_bias = hf::field_or<bool>(j, "mlp_bias", path, false);
  const int64_t E = c_.hidden_size, I = c_.intermediate_size, QD = c_.num_heads * c_.head_dim,
                KD = c_.num_kv_heads * c_.head_dim;  // read_llama_config checked that H·D fits, and Hkv <= H
  w.expect(cat("model.layers.", c_.num_layers - 1, ".input_layernorm.weight"),
           cat("num_hidden_layers ", c_.num_layers, " in config.json"));
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias) {
    Tensor weight = w.get(name + ".weight", {out, in});  // the weight's error first
    return Linear(std::move(weight), bias ? w.get(name + ".bias", {out}) : Tensor());
  };
  auto norm = [&](const std::string& name) { return RMSNorm(w.get(name + ".weight", {E}), c_.norm_eps); };
  layers_.reserve(size_t(c_.num_layers));
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    layers_.push_back(Layer{norm(p + "input_layernorm"), linear(p + "self_attn.q_proj", QD, E, attn_bias),
                            linear(p + "self_attn.k_proj", KD, E, attn_bias),
                            linear(p + "self_attn.v_proj", KD, E, attn_bias),
                            linear(p + "self_attn.o_proj", E, QD, attn_bias), norm(p + "post_attention_layernorm"),
                            linear(p + "mlp.gate_proj", I, E, mlp_bias), linear(p + "mlp.up_proj", I, E, mlp_bias),
                            linear(p + "mlp.down_proj", E, I, mlp_bias)});
  }
  for (Layer& l : layers_)
    for (attn::Layer* m : std::initializer_list<attn::Layer*>{&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj,
                                                              &l.o_proj, &l.post_norm, &l.gate_proj, &l.up_proj,
                                                              &l.down_proj})
      m->eval();
  for (attn::Layer* m : std::initializer_list<attn::Layer*>{&embed_tokens_, &norm_, &lm_head_}) m->eval();
}

Tensor LlamaModel::embed(const int64_t* tok, const int64_t*, int64_t T) { return embed_tokens_.forward(tok, {T}); }

void LlamaModel::layer(int64_t i, Tensor& x, const int64_t* pos, const Attend& attend) {
  Layer& l = layers_[size_t(i)];
  const int64_t T = x.size(0), H = c_.num_heads, Hkv = c_.num_kv_heads, D = c_.head_dim;
  // x += o_proj(attn(rope(q), rope(k), v)) over h = input_layernorm(x)
  Tensor h = l.input_norm.forward(x.view());
  Tensor q = l.q_proj.forward(h.view()), k = l.k_proj.forward(h.view()), v = l.v_proj.forward(h.view());
  rope_.apply(q.data(), T, H * D, H, pos);  // (T, H·D)
  rope_.apply(k.data(), T, Hkv * D, Hkv, pos);  // (T, Hkv·D)
  Tensor a = l.o_proj.forward(attend(q.view(), k.view(), v.view()).view());
  // x += a; x += down_proj(silu(gate_proj(h)) · up_proj(h)) over h = post_attention_layernorm(x)
  h = l.post_norm.forward_add(x, a.view());
  Tensor g = l.gate_proj.forward(h.view()), u = l.up_proj.forward(h.view());  // (T, I)
  float* pg = g.data();
  const float* pu = u.data();
  parallel_for(g.numel(), grain_for(16), [&](int64_t b, int64_t e, int) {
    for (int64_t n = b; n < e; ++n) pg[n] = pg[n] / (1.0f + std::exp(-pg[n])) * pu[n];  // torch's silu: x·sigmoid(x)
  });
  Tensor f = l.down_proj.forward(g.view());
  add_(x.view(), f.view());
}

Tensor LlamaModel::final_norm(View<const float> x) { return norm_.forward(x); }
Tensor LlamaModel::head(View<const float> x) { return lm_head_.forward(final_norm(x).view()); }

std::vector<Linear*> LlamaModel::linears() {
  std::vector<Linear*> l{&lm_head_};
  for (Layer& y : layers_)
    l.insert(l.end(), {&y.q_proj, &y.k_proj, &y.v_proj, &y.o_proj, &y.gate_proj, &y.up_proj, &y.down_proj});
  return l;
}

}  // namespace attn
