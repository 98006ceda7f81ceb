// transformers' BloomForCausalLM on nn.h's layers: the decoder's parts (embed, layer, head) for
// PretrainedDecoder (hf_decoder.cpp), eval mode, with ALiBi as the kernels' alibi_slopes (no position
// embeddings: no position limit). The fused query_key_value weight holds heads of (q, k, v) triples; its rows
// are regrouped once at load into q | k | v blocks (GPT-2's layout), so the projections and attention read
// plain column blocks. Not BLOOM's training and not its other heads.
#include <cmath>
#include <filesystem>

#include "attn/hf.h"
#include "hf_config.h"
#include "hf_json.h"

namespace attn {

namespace {

std::pair<DecoderConfig, bool> read_bloom_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const std::string w = cat("'", path, "'");
  // The Megatron training flags of BLOOM's released configs change nothing transformers computes.
  hf::check_fields(j, w, "BloomForCausalLM",
                   {"vocab_size", "hidden_size", "n_embed", "n_layer", "n_head", "layer_norm_epsilon",
                    "apply_residual_connection_post_layernorm", "pretraining_tp", "slow_but_exact",
                    "tie_word_embeddings", "n_inner", "attention_softmax_in_fp32", "bias_dropout_fusion",
                    "masked_softmax_fusion", "offset_alibi", "skip_bias_add", "skip_bias_add_qkv", "seq_length"});
  DecoderConfig c;
  c.vocab_size = hf::field<int64_t>(j, "vocab_size", w);
  c.hidden_size = j.contains("n_embed") ? hf::field<int64_t>(j, "n_embed", w) : hf::field<int64_t>(j, "hidden_size", w);
  c.num_layers = hf::field<int64_t>(j, "n_layer", w);
  c.num_heads = c.num_kv_heads = hf::field<int64_t>(j, "n_head", w);
  c.intermediate_size = 4 * c.hidden_size;
  c.max_positions = 0;  // ALiBi: no table
  c.norm_eps = hf::field_or<double>(j, "layer_norm_epsilon", w, 1e-5);
  c.tie_word_embeddings = hf::field_or<bool>(j, "tie_word_embeddings", w, true);
  c.eos_token_ids = hf::eos_token_ids(dir, j);
  ATTN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0,
             "Expected positive sizes in ", w, ", but got vocab_size ", c.vocab_size, ", hidden_size ", c.hidden_size,
             ", n_layer ", c.num_layers, ", n_head ", c.num_heads, " instead");
  ATTN_CHECK(c.hidden_size % c.num_heads == 0, "Expected hidden_size divisible by n_head in ", w, ", but got ",
             c.hidden_size, " and ", c.num_heads, " instead");
  c.head_dim = c.hidden_size / c.num_heads;
  ATTN_CHECK(!j.contains("n_inner") || j["n_inner"].is_null(), "Expected \"n_inner\" null in ", w,
             " (BLOOM's MLP is 4·hidden_size wide), but got ", hf::brief(j.at("n_inner")), " instead");
  // slow_but_exact with pretraining_tp > 1 sums the projections in slices: another function's rounding
  ATTN_CHECK(
      !(hf::field_or<bool>(j, "slow_but_exact", w, false) && hf::field_or<int64_t>(j, "pretraining_tp", w, 1) > 1),
      "Expected \"slow_but_exact\" false or \"pretraining_tp\" 1 in ", w,
      " (the sliced projections are not implemented), but got both set instead");
  return {c, hf::field_or<bool>(j, "apply_residual_connection_post_layernorm", w, false)};
}

// transformers' _get_alibi_slopes: powers of 2^(-8/n) for the n = 2^floor(log2 H) first heads, then the odd
// powers of 2^(-4/n) for the rest; float32 bases as torch.full makes them.
std::vector<float> alibi_slopes(int64_t H) {
  const int64_t p2 = int64_t(1) << int64_t(std::floor(std::log2(double(H))));
  auto base = [](int64_t n) { return float(std::pow(2.0, -std::pow(2.0, -(std::log2(double(n)) - 3)))); };
  std::vector<float> s;
  for (int64_t i = 1; i <= p2; ++i) s.push_back(float(std::pow(double(base(p2)), double(i))));
  for (int64_t i = 1; int64_t(s.size()) < H; i += 2) s.push_back(float(std::pow(double(base(2 * p2)), double(i))));
  return s;
}

// query_key_value's rows (and bias) from heads of (q, k, v) triples, (H, 3, D), to blocks (3, H, D).
Tensor regroup_qkv(const Tensor& t, int64_t H, int64_t D) {
  const int64_t cols = t.shape().size() == 2 ? t.size(1) : 1;
  Tensor out(t.shape());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t part = 0; part < 3; ++part)
      std::copy_n(t.data() + ((h * 3 + part) * D) * cols, D * cols, out.data() + ((part * H + h) * D) * cols);
  return out;
}

}  // namespace

BloomModel::BloomModel(const std::string& dir) : BloomModel(read_bloom_config(dir), HfWeights(dir)) {}

BloomModel::BloomModel(const std::pair<DecoderConfig, bool>& cfg, const HfWeights& w)
    : PretrainedDecoder(cfg.first),
      residual_post_ln_(cfg.second),
      word_(w.get("transformer.word_embeddings.weight", {c_.vocab_size, c_.hidden_size})),
      embed_norm_(w.get("transformer.word_embeddings_layernorm.weight", {c_.hidden_size}),
                  w.get("transformer.word_embeddings_layernorm.bias", {c_.hidden_size}), c_.norm_eps),
      ln_f_(w.get("transformer.ln_f.weight", {c_.hidden_size}), w.get("transformer.ln_f.bias", {c_.hidden_size}),
            c_.norm_eps),
      lm_head_(w.get(c_.tie_word_embeddings ? "transformer.word_embeddings.weight" : "lm_head.weight",
                     {c_.vocab_size, c_.hidden_size}),
               Tensor()),
      slopes_(alibi_slopes(c_.num_heads)) {
  const int64_t E = c_.hidden_size, H = c_.num_heads, D = c_.head_dim;
  auto linear = [&](const std::string& name, int64_t out, int64_t in) { return w.linear(name, out, in); };
  auto norm = [&](const std::string& name) { return w.layer_norm(name, E, c_.norm_eps); };
  layers_.reserve(size_t(c_.num_layers));
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    const std::string p = cat("transformer.h.", i, ".");
    Tensor qkv_w = w.get(p + "self_attention.query_key_value.weight", {3 * E, E});
    Tensor qkv_b = w.get(p + "self_attention.query_key_value.bias", {3 * E});
    layers_.push_back(Layer{norm(p + "input_layernorm"),
                            Linear(regroup_qkv(qkv_w, H, D), regroup_qkv(qkv_b, H, D)),
                            linear(p + "self_attention.dense", E, E), norm(p + "post_attention_layernorm"),
                            linear(p + "mlp.dense_h_to_4h", 4 * E, E), linear(p + "mlp.dense_4h_to_h", E, 4 * E)});
  }
  for (Layer& l : layers_)
    for (attn::Layer* m : std::initializer_list<attn::Layer*>{&l.input_norm, &l.qkv, &l.dense, &l.post_norm,
                                                              &l.dense_h_to_4h, &l.dense_4h_to_h})
      m->eval();
  for (attn::Layer* m : std::initializer_list<attn::Layer*>{&word_, &embed_norm_, &ln_f_, &lm_head_, &act_}) m->eval();
}

LayerAttention BloomModel::attention(int64_t) const {
  LayerAttention a;
  a.alibi_slopes = View<const float>(slopes_.data(), {c_.num_heads}, {1});
  return a;
}

Tensor BloomModel::embed(const int64_t* tok, const int64_t*, int64_t T) {
  Tensor x = word_.forward(tok, {T});
  return embed_norm_.forward(x.view());
}

void BloomModel::layer(int64_t i, Tensor& x, const int64_t*, const Attend& attend) {
  Layer& l = layers_[size_t(i)];
  const int64_t E = c_.hidden_size, T = x.size(0);
  // a = dense(attn(input_layernorm(x))) + residual; the qkv columns are q | k | v blocks (regrouped)
  Tensor h = l.input_norm.forward(x.view());
  Tensor qkv = l.qkv.forward(h.view());
  const float* p = qkv.data();
  Tensor ctx = attend({p, {T, E}, {3 * E, 1}}, {p + E, {T, E}, {3 * E, 1}}, {p + 2 * E, {T, E}, {3 * E, 1}});
  Tensor a = l.dense.forward(ctx.view());
  add_(a.view(), residual_post_ln_ ? h.view() : x.view());
  // x = mlp(post_attention_layernorm(a)) + residual (that norm's output, or a)
  Tensor h2 = l.post_norm.forward(a.view());
  x = l.dense_4h_to_h.forward(act_.forward(l.dense_h_to_4h.forward(h2.view())).view());
  add_(x.view(), residual_post_ln_ ? h2.view() : a.view());
}

Tensor BloomModel::final_norm(View<const float> x) { return ln_f_.forward(x); }
Tensor BloomModel::head(View<const float> x) { return lm_head_.forward(final_norm(x).view()); }

std::vector<Linear*> BloomModel::linears() {
  std::vector<Linear*> l{&lm_head_};
  for (Layer& y : layers_) l.insert(l.end(), {&y.qkv, &y.dense, &y.dense_h_to_4h, &y.dense_4h_to_h});
  return l;
}

}  // namespace attn
