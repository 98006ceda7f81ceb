// transformers' GPT2LMHeadModel on nn.h's layers: the decoder's parts (embed, layer, head) for
// PretrainedDecoder (hf_decoder.cpp), eval mode. Conv1D weights are stored (in, out) and used so, in place
// from the mapped file (Linear with WeightLayout::in_out); the head reads wte itself (tied). Not GPT-2's
// training (no backward, no dropout) and not its other heads (double heads, classification).
#include <filesystem>

#include "attn/hf.h"
#include "hf_json.h"

namespace attn {

namespace {

std::pair<DecoderConfig, Activation> read_gpt2_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const std::string w = cat("'", path, "'");
  DecoderConfig c;
  c.vocab_size = hf::field<int64_t>(j, "vocab_size", w);
  c.hidden_size = hf::field<int64_t>(j, "n_embd", w);
  c.num_layers = hf::field<int64_t>(j, "n_layer", w);
  c.num_heads = c.num_kv_heads = hf::field<int64_t>(j, "n_head", w);
  c.max_positions = hf::field<int64_t>(j, "n_positions", w);
  c.intermediate_size = hf::field_or<int64_t>(j, "n_inner", w, hf::product(4, c.hidden_size, "4 * n_embd", w));
  c.norm_eps = hf::epsilon(j, "layer_norm_epsilon", w, 1e-5);
  c.tie_word_embeddings = hf::field_or<bool>(j, "tie_word_embeddings", w, true);
  c.eos_token_ids = hf::eos_token_ids(dir, j);
  ATTN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.max_positions > 0 &&
             c.intermediate_size > 0, "Expected positive sizes in ", w, ", but got vocab_size ", c.vocab_size,
             ", n_embd ", c.hidden_size, ", n_layer ", c.num_layers, ", n_head ", c.num_heads, ", n_positions ",
             c.max_positions, ", n_inner ", c.intermediate_size, " instead");
  ATTN_CHECK(c.hidden_size % c.num_heads == 0, "Expected n_embd divisible by n_head in ", w, ", but got ",
             c.hidden_size, " and ", c.num_heads, " instead");
  c.head_dim = c.hidden_size / c.num_heads;
  const std::string act = hf::field_or<std::string>(j, "activation_function", w, "gelu_new");
  ATTN_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu" || act == "relu",
             "Expected \"activation_function\" gelu_new, gelu_pytorch_tanh, gelu or relu in ", w, ", but got \"", act,
             "\" instead");
  // the attention variants attn does not implement
  ATTN_CHECK(hf::field_or<bool>(j, "scale_attn_weights", w, true) &&
             !hf::field_or<bool>(j, "scale_attn_by_inverse_layer_idx", w, false) &&
             !hf::field_or<bool>(j, "reorder_and_upcast_attn", w, false) &&
             !hf::field_or<bool>(j, "add_cross_attention", w, false),
             "Expected GPT-2's plain attention (scale_attn_weights true; scale_attn_by_inverse_layer_idx, "
             "reorder_and_upcast_attn and add_cross_attention false) in ", w, ", but got another instead");
  hf::product(3, c.hidden_size, "3 * n_embd (c_attn's q, k and v)", w);
  const Activation a = act == "gelu" ? Activation::gelu : act == "relu" ? Activation::relu : Activation::gelu_tanh;
  return {c, a};
}

}  // namespace

Gpt2Model::Gpt2Model(const std::string& dir) : Gpt2Model(read_gpt2_config(dir), HfWeights(dir)) {}

Gpt2Model::Gpt2Model(const std::pair<DecoderConfig, Activation>& cfg, const HfWeights& w)
    : PretrainedDecoder(cfg.first),
      wte_(w.get("transformer.wte.weight", {c_.vocab_size, c_.hidden_size})),
      wpe_(w.get("transformer.wpe.weight", {c_.max_positions, c_.hidden_size})),
      ln_f_(w.get("transformer.ln_f.weight", {c_.hidden_size}), w.get("transformer.ln_f.bias", {c_.hidden_size}),
            c_.norm_eps),
      act_(cfg.second),
      lm_head_(c_.tie_word_embeddings
                   ? w.get("transformer.wte.weight", {c_.vocab_size, c_.hidden_size})
                   : w.get("lm_head.weight", {c_.vocab_size, c_.hidden_size}),
               Tensor()) {
  const int64_t E = c_.hidden_size, I = c_.intermediate_size;
  w.expect(cat("transformer.h.", c_.num_layers - 1, ".ln_1.weight"), cat("n_layer ", c_.num_layers, " in config.json"));
  // Conv1D: weight (in, out), bias (out)
  auto conv1d = [&](const std::string& name, int64_t in, int64_t out) {
    return w.linear(name, out, in, true, WeightLayout::in_out);
  };
  auto norm = [&](const std::string& name) { return w.layer_norm(name, E, c_.norm_eps); };
  layers_.reserve(size_t(c_.num_layers));
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    const std::string p = cat("transformer.h.", i, ".");
    layers_.push_back(Layer{norm(p + "ln_1"), conv1d(p + "attn.c_attn", E, 3 * E), conv1d(p + "attn.c_proj", E, E),
                            norm(p + "ln_2"), conv1d(p + "mlp.c_fc", E, I), conv1d(p + "mlp.c_proj", I, E)});
  }
  for (Layer& l : layers_)
    for (attn::Layer* m : std::initializer_list<attn::Layer*>{&l.ln_1, &l.c_attn, &l.c_proj, &l.ln_2, &l.c_fc,
                                                              &l.mlp_proj})
      m->eval();
  for (attn::Layer* m : std::initializer_list<attn::Layer*>{&wte_, &wpe_, &ln_f_, &act_, &lm_head_}) m->eval();
}

Tensor Gpt2Model::embed(const int64_t* tok, const int64_t* pos, int64_t T) {
  Tensor x = wte_.forward(tok, {T});  // (T, E) = wte[tok] + wpe[pos]
  add_(x.view(), wpe_.forward(pos, {T}).view());
  return x;
}

void Gpt2Model::layer(int64_t i, Tensor& x, const int64_t*, const Attend& attend) {
  Layer& l = layers_[size_t(i)];
  const int64_t E = c_.hidden_size, T = x.size(0);
  // x += c_proj(attn(ln_1(x))): c_attn's (T, 3E) columns are q, k, v, each heads of D
  Tensor qkv = l.c_attn.forward(l.ln_1.forward(x.view()).view());
  const float* p = qkv.data();
  Tensor ctx = attend({p, {T, E}, {3 * E, 1}}, {p + E, {T, E}, {3 * E, 1}}, {p + 2 * E, {T, E}, {3 * E, 1}});
  Tensor a = l.c_proj.forward(ctx.view());
  // x += a; x += mlp.c_proj(act(c_fc(ln_2(x))))
  Tensor h = l.ln_2.forward_add(x, a.view());
  Tensor f = l.mlp_proj.forward(act_.forward(l.c_fc.forward(h.view())).view());
  add_(x.view(), f.view());
}

Tensor Gpt2Model::final_norm(View<const float> x) { return ln_f_.forward(x); }
Tensor Gpt2Model::head(View<const float> x) { return lm_head_.forward(final_norm(x).view()); }

std::vector<Linear*> Gpt2Model::linears() {
  std::vector<Linear*> l{&lm_head_};
  for (Layer& y : layers_) l.insert(l.end(), {&y.c_attn, &y.c_proj, &y.c_fc, &y.mlp_proj});
  return l;
}

}  // namespace attn
