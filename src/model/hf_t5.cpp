// transformers' T5ForConditionalGeneration on nn.h's layers: the encoder-decoder's parts for
// PretrainedSeq2Seq (hf_seq2seq.cpp), eval mode. T5's relative position bias is the kernels' relative_bias:
// layer 0's table of each side serves all its layers (bidirectional in the encoder, causal in the decoder), and
// scores are not scaled (T5 folds the scale into its weights). T5LayerNorm is RMSNorm. Feed-forward: relu
// (T5), or gated-gelu (v1.1: gelu_new(wi_0(h)) · wi_1(h)). Not T5's training and not its other heads.
#include <cmath>
#include <filesystem>

#include "attn/hf.h"
#include "hf_config.h"
#include "hf_json.h"

namespace attn {

struct T5Model::Options {
  Seq2SeqConfig c;
  int64_t num_buckets = 32, max_distance = 128;
  Activation act = Activation::relu;
  bool gated = false, scale_output = true, tie = true;
};

namespace {

T5Model::Options read_t5_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const std::string w = cat("'", path, "'");
  // n_positions and output_past: fields of older T5 configs that transformers does not read.
  hf::check_fields(j, w, "T5ForConditionalGeneration",
                   {"vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers", "num_heads",
                    "relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon",
                    "feed_forward_proj", "dense_act_fn", "is_gated_act", "tie_word_embeddings",
                    "scale_decoder_outputs", "is_decoder", "n_positions", "output_past"});
  T5Model::Options o;
  Seq2SeqConfig& c = o.c;
  c.vocab_size = hf::field<int64_t>(j, "vocab_size", w);
  c.hidden_size = hf::field<int64_t>(j, "d_model", w);
  c.head_dim = hf::field<int64_t>(j, "d_kv", w);
  c.ffn_size = hf::field<int64_t>(j, "d_ff", w);
  c.encoder_layers = hf::field<int64_t>(j, "num_layers", w);
  c.decoder_layers = hf::field_or<int64_t>(j, "num_decoder_layers", w, c.encoder_layers);
  c.num_heads = hf::field<int64_t>(j, "num_heads", w);
  c.norm_eps = hf::field_or<double>(j, "layer_norm_epsilon", w, 1e-6);
  c.max_positions = 0;  // relative positions: no table
  o.num_buckets = hf::field_or<int64_t>(j, "relative_attention_num_buckets", w, 32);
  o.max_distance = hf::field_or<int64_t>(j, "relative_attention_max_distance", w, 128);
  ATTN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.head_dim > 0 && c.ffn_size > 0 && c.encoder_layers > 0 &&
             c.decoder_layers > 0 && c.num_heads > 0 && o.num_buckets > 0 && o.max_distance > 0,
             "Expected positive sizes in ", w, ", but got vocab_size ", c.vocab_size, ", d_model ", c.hidden_size,
             ", d_kv ", c.head_dim, ", d_ff ", c.ffn_size, ", num_layers ", c.encoder_layers, ", num_decoder_layers ",
             c.decoder_layers, ", num_heads ", c.num_heads, ", relative_attention_num_buckets ", o.num_buckets,
             ", relative_attention_max_distance ", o.max_distance, " instead");
  ATTN_CHECK(!hf::field_or<bool>(j, "is_decoder", w, false), "Expected \"is_decoder\" false in ", w,
             " (T5ForConditionalGeneration's stacks set it themselves), but got true instead");
  // feed_forward_proj "ACT" or "gated-ACT"; transformers' gated-gelu is gelu_new
  const std::string ff = hf::field_or<std::string>(j, "feed_forward_proj", w, "relu");
  o.gated = ff.rfind("gated-", 0) == 0;
  const std::string act = o.gated ? ff.substr(6) : ff;
  ATTN_CHECK(act == "relu" || act == "gelu" || act == "gelu_new", "Expected \"feed_forward_proj\" relu, gelu, ",
             "gelu_new, gated-relu, gated-gelu or gated-gelu_new in ", w, ", but got \"", ff, "\" instead");
  o.act = act == "relu" ? Activation::relu : (act == "gelu" && !o.gated) ? Activation::gelu : Activation::gelu_tanh;
  if (j.contains("dense_act_fn")) {  // what transformers derived from feed_forward_proj, when saved: the same
    const std::string d = hf::field<std::string>(j, "dense_act_fn", w);
    ATTN_CHECK(d == (o.act == Activation::relu ? "relu" : o.act == Activation::gelu ? "gelu" : "gelu_new"),
               "Expected \"dense_act_fn\" in ", w, " to be what \"feed_forward_proj\" \"", ff, "\" makes, but got \"",
               d, "\" instead");
  }
  ATTN_CHECK(hf::field_or<bool>(j, "is_gated_act", w, o.gated) == o.gated, "Expected \"is_gated_act\" in ", w,
             " to be what \"feed_forward_proj\" \"", ff, "\" makes, but got ", hf::brief(j.at("is_gated_act")),
             " instead");
  // transformers 5: the head is tied to shared; the decoder's output is scaled by d_model^-1/2 unless
  // scale_decoder_outputs is false (derived from tie_word_embeddings false by older configs)
  o.tie = hf::field_or<bool>(j, "tie_word_embeddings", w, true);
  o.scale_output = hf::field_or<bool>(j, "scale_decoder_outputs", w, o.tie);
  c.eos_token_ids = hf::eos_token_ids(dir, j);
  c.decoder_start_token_id = hf::generation_id(dir, j, "decoder_start_token_id",
                                               hf::generation_id(dir, j, "pad_token_id", 0));
  c.forced_bos_token_id = hf::generation_id(dir, j, "forced_bos_token_id", -1);
  c.forced_eos_token_id = hf::generation_id(dir, j, "forced_eos_token_id", -1);
  return o;
}

}  // namespace

T5Model::T5Model(const std::string& dir) : T5Model(read_t5_config(dir), HfWeights(dir)) {}

T5Model::T5Model(const Options& o, const HfWeights& w)
    : PretrainedSeq2Seq(o.c),
      num_buckets_(o.num_buckets),
      max_distance_(o.max_distance),
      act_kind_(o.act),
      gated_(o.gated),
      scale_output_(o.scale_output),
      shared_(w.get("shared.weight", {c_.vocab_size, c_.hidden_size})),
      encoder_table_(w.get("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                           {o.num_buckets, c_.num_heads})),
      decoder_table_(w.get("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                           {o.num_buckets, c_.num_heads})),
      encoder_norm_(w.get("encoder.final_layer_norm.weight", {c_.hidden_size}), c_.norm_eps),
      decoder_norm_(w.get("decoder.final_layer_norm.weight", {c_.hidden_size}), c_.norm_eps),
      lm_head_(w.get(!o.tie && w.contains("lm_head.weight") ? "lm_head.weight" : "shared.weight",
                     {c_.vocab_size, c_.hidden_size}),
               Tensor()),
      act_(o.act) {
  const int64_t E = c_.hidden_size, F = c_.ffn_size, HD = c_.num_heads * c_.head_dim;
  auto linear = [&](const std::string& name, int64_t out, int64_t in) { return w.linear(name, out, in, false); };
  auto norm = [&](const std::string& name) { return RMSNorm(w.get(name + ".weight", {E}), c_.norm_eps); };
  auto attention = [&](const std::string& layer, const std::string& module) {  // layer_norm, then q, k, v, o
    const std::string m = layer + module + ".";
    return Attention{norm(layer + "layer_norm"), linear(m + "q", HD, E), linear(m + "k", HD, E),
                     linear(m + "v", HD, E), linear(m + "o", E, HD)};
  };
  // stack.block.i.layer.0: self-attention; decoder: layer.1 cross-attention; then the feed-forward layer
  auto block = [&](const std::string& stack, int64_t i, bool decoder) {
    const std::string p = cat(stack, ".block.", i, ".layer.");
    Attention self = attention(p + "0.", "SelfAttention");
    std::vector<Attention> cross;
    if (decoder) cross.push_back(attention(p + "1.", "EncDecAttention"));
    const std::string f = cat(p, decoder ? 2 : 1, ".");
    RMSNorm ff_norm = norm(f + "layer_norm");
    std::vector<Linear> wi;
    if (gated_)
      wi.push_back(linear(f + "DenseReluDense.wi_0", F, E)), wi.push_back(linear(f + "DenseReluDense.wi_1", F, E));
    else wi.push_back(linear(f + "DenseReluDense.wi", F, E));
    return Layer{std::move(self), std::move(cross), std::move(ff_norm), std::move(wi),
                 linear(f + "DenseReluDense.wo", E, F)};
  };
  for (int64_t i = 0; i < c_.encoder_layers; ++i) encoder_.push_back(block("encoder", i, false));
  for (int64_t i = 0; i < c_.decoder_layers; ++i) decoder_.push_back(block("decoder", i, true));
  for (std::vector<Layer>* side : {&encoder_, &decoder_})
    for (Layer& l : *side) {
      std::vector<Attention*> all{&l.self};
      for (Attention& a : l.cross) all.push_back(&a);
      for (Attention* a : all)
        for (attn::Layer* m : std::initializer_list<attn::Layer*>{&a->norm, &a->q, &a->k, &a->v, &a->o}) m->eval();
      l.ff_norm.eval();
      for (Linear& x : l.wi) x.eval();
      l.wo.eval();
    }
  for (attn::Layer* m : std::initializer_list<attn::Layer*>{&shared_, &encoder_norm_, &decoder_norm_, &lm_head_, &act_})
    m->eval();
}

LayerAttention T5Model::encoder_attention(int64_t) const {
  LayerAttention a;
  a.scale = 1.0;  // T5 does not scale the scores
  a.relative_bias = RelativeBias<float>{encoder_table_.view(), true, max_distance_};
  return a;
}

LayerAttention T5Model::decoder_attention(int64_t) const {
  LayerAttention a;
  a.scale = 1.0;
  a.relative_bias = RelativeBias<float>{decoder_table_.view(), false, max_distance_};
  return a;
}

Tensor T5Model::embed(const int64_t* tok, const int64_t*, int64_t T, bool) { return shared_.forward(tok, {T}); }

void T5Model::feed_forward(Layer& l, Tensor& x) {
  // x += wo(act(wi(h))) or wo(act(wi_0(h)) · wi_1(h)) over h = layer_norm(x)
  Tensor h = l.ff_norm.forward(x.view());
  Tensor g = act_.forward(l.wi[0].forward(h.view()).view());
  if (gated_) {
    Tensor u = l.wi[1].forward(h.view());
    for (int64_t n = 0; n < g.numel(); ++n) g.data()[n] *= u.data()[n];
  }
  add_(x.view(), l.wo.forward(g.view()).view());
}

void T5Model::encoder_layer(int64_t i, Tensor& x, const Attend& attend) {
  Layer& l = encoder_[size_t(i)];
  // x += o(attn(q, k, v)) over h = layer_norm(x)
  Tensor h = l.self.norm.forward(x.view());
  Tensor q = l.self.q.forward(h.view()), k = l.self.k.forward(h.view()), v = l.self.v.forward(h.view());
  add_(x.view(), l.self.o.forward(attend(q.view(), k.view(), v.view()).view()).view());
  feed_forward(l, x);
}

void T5Model::encoder_end(Tensor& x) { x = encoder_norm_.forward(x.view()); }

std::pair<Tensor, Tensor> T5Model::cross_kv(int64_t i, View<const float> states) {
  Attention& a = decoder_[size_t(i)].cross[0];
  return {a.k.forward(states), a.v.forward(states)};
}

void T5Model::decoder_layer(int64_t i, Tensor& x, const Attend& self, const CrossAttend& cross) {
  Layer& l = decoder_[size_t(i)];
  Tensor h = l.self.norm.forward(x.view());
  Tensor q = l.self.q.forward(h.view()), k = l.self.k.forward(h.view()), v = l.self.v.forward(h.view());
  add_(x.view(), l.self.o.forward(self(q.view(), k.view(), v.view()).view()).view());
  // x += o(cross(q)) over h = layer_norm(x), K/V from the encoder
  Attention& c = l.cross[0];
  h = c.norm.forward(x.view());
  add_(x.view(), c.o.forward(cross(c.q.forward(h.view()).view()).view()).view());
  feed_forward(l, x);
}

Tensor T5Model::head(View<const float> x) {
  Tensor h = decoder_norm_.forward(x);
  if (scale_output_) {  // sequence_output * d_model^-0.5, the float32 product of torch's
    const float s = float(std::pow(double(c_.hidden_size), -0.5));
    for (int64_t n = 0; n < h.numel(); ++n) h.data()[n] *= s;
  }
  return lm_head_.forward(h.view());
}

std::vector<Linear*> T5Model::linears() {
  std::vector<Linear*> out{&lm_head_};
  for (std::vector<Layer>* side : {&encoder_, &decoder_})
    for (Layer& l : *side) {
      out.insert(out.end(), {&l.self.q, &l.self.k, &l.self.v, &l.self.o, &l.wo});
      for (Attention& a : l.cross) out.insert(out.end(), {&a.q, &a.k, &a.v, &a.o});
      for (Linear& x : l.wi) out.push_back(&x);
    }
  return out;
}

}  // namespace attn
