// transformers' BartForConditionalGeneration on nn.h's layers: the encoder-decoder's parts for
// PretrainedSeq2Seq (hf_seq2seq.cpp), eval mode: post-norm layers, learned positions (offset 2), the
// embeddings' LayerNorm, lm_head tied to the shared embeddings plus final_logits_bias. The fields older BART
// configs carry for other members of the family (normalize_before: mBART's pre-norm; add_final_layer_norm;
// static_position_embeddings: Marian's) are read and refused unless BART's. Not BART's training and not its
// other heads.
#include <cmath>
#include <filesystem>

#include "attn/hf.h"
#include "hf_config.h"
#include "hf_json.h"

namespace attn {

struct BartModel::Options {
  Seq2SeqConfig c;
  int64_t encoder_ffn = 0, decoder_ffn = 0;
  Activation act = Activation::gelu;
  float embed_scale = 1.0f;
};

namespace {

BartModel::Options read_bart_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const std::string w = cat("'", path, "'");
  hf::check_fields(j, w, "BartForConditionalGeneration",
                   {"vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
                    "activation_function", "scale_embedding", "tie_word_embeddings", "is_decoder",
                    "num_hidden_layers", "normalize_before", "add_final_layer_norm", "add_bias_logits",
                    "normalize_embedding", "static_position_embeddings", "extra_pos_embeddings", "output_past",
                    "force_bos_token_to_be_generated"});
  BartModel::Options o;
  Seq2SeqConfig& c = o.c;
  c.vocab_size = hf::field<int64_t>(j, "vocab_size", w);
  c.hidden_size = hf::field<int64_t>(j, "d_model", w);
  c.encoder_layers = hf::field<int64_t>(j, "encoder_layers", w);
  c.decoder_layers = hf::field<int64_t>(j, "decoder_layers", w);
  c.num_heads = hf::field<int64_t>(j, "encoder_attention_heads", w);
  const int64_t decoder_heads = hf::field<int64_t>(j, "decoder_attention_heads", w);
  o.encoder_ffn = hf::field<int64_t>(j, "encoder_ffn_dim", w);
  o.decoder_ffn = hf::field<int64_t>(j, "decoder_ffn_dim", w);
  c.ffn_size = o.encoder_ffn;
  c.max_positions = hf::field<int64_t>(j, "max_position_embeddings", w);
  ATTN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.encoder_layers > 0 && c.decoder_layers > 0 &&
             c.num_heads > 0 && o.encoder_ffn > 0 && o.decoder_ffn > 0 && c.max_positions > 0,
             "Expected positive sizes in ", w, ", but got vocab_size ", c.vocab_size, ", d_model ", c.hidden_size,
             ", encoder_layers ", c.encoder_layers, ", decoder_layers ", c.decoder_layers, ", encoder_attention_heads ",
             c.num_heads, ", encoder_ffn_dim ", o.encoder_ffn, ", decoder_ffn_dim ", o.decoder_ffn,
             ", max_position_embeddings ", c.max_positions, " instead");
  ATTN_CHECK(decoder_heads == c.num_heads && c.hidden_size % c.num_heads == 0, "Expected decoder_attention_heads ",
             "equal to encoder_attention_heads and dividing d_model in ", w, ", but got ", decoder_heads, ", ",
             c.num_heads, " and ", c.hidden_size, " instead");
  c.head_dim = c.hidden_size / c.num_heads;
  c.norm_eps = 1e-5;  // nn.LayerNorm's default: BART's layer norms take no eps from the config
  const std::string act = hf::field_or<std::string>(j, "activation_function", w, "gelu");
  ATTN_CHECK(act == "gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "relu",
             "Expected \"activation_function\" gelu, gelu_new, gelu_pytorch_tanh or relu in ", w, ", but got \"", act,
             "\" instead");
  o.act = act == "gelu" ? Activation::gelu : act == "relu" ? Activation::relu : Activation::gelu_tanh;
  if (hf::field_or<bool>(j, "scale_embedding", w, false)) o.embed_scale = float(std::sqrt(double(c.hidden_size)));
  // older configs' flags of BART's kin: BART's values only
  ATTN_CHECK(!hf::field_or<bool>(j, "normalize_before", w, false) &&
                 !hf::field_or<bool>(j, "add_final_layer_norm", w, false) &&
                 !hf::field_or<bool>(j, "add_bias_logits", w, false) &&
                 hf::field_or<bool>(j, "normalize_embedding", w, true) &&
                 !hf::field_or<bool>(j, "static_position_embeddings", w, false) &&
                 hf::field_or<int64_t>(j, "extra_pos_embeddings", w, 2) == 2 &&
                 hf::field_or<int64_t>(j, "num_hidden_layers", w, c.encoder_layers) == c.encoder_layers &&
                 hf::field_or<bool>(j, "tie_word_embeddings", w, true) &&
                 !hf::field_or<bool>(j, "is_decoder", w, false),
             "Expected BART's post-norm layers in ", w, " (normalize_before, add_final_layer_norm, add_bias_logits, ",
             "static_position_embeddings, is_decoder false; normalize_embedding, tie_word_embeddings true; ",
             "extra_pos_embeddings 2), but got another member of the family instead");
  c.eos_token_ids = hf::eos_token_ids(dir, j);
  c.decoder_start_token_id = hf::generation_id(dir, j, "decoder_start_token_id", 2);
  c.forced_bos_token_id = hf::generation_id(dir, j, "forced_bos_token_id", -1);
  c.forced_eos_token_id = hf::generation_id(dir, j, "forced_eos_token_id", -1);
  return o;
}

// final_logits_bias (1, V) as a Linear's bias (V).
Tensor flat(Tensor t) {
  t.reshape({t.numel()});
  return t;
}

}  // namespace

BartModel::BartModel(const std::string& dir) : BartModel(read_bart_config(dir), HfWeights(dir)) {}

BartModel::BartModel(const Options& o, const HfWeights& w)
    : PretrainedSeq2Seq(o.c),
      embed_scale_(o.embed_scale),
      shared_(w.get(w.contains("model.shared.weight") ? "model.shared.weight" : "model.encoder.embed_tokens.weight",
                    {c_.vocab_size, c_.hidden_size})),
      encoder_pos_(w.get("model.encoder.embed_positions.weight", {c_.max_positions + 2, c_.hidden_size})),
      decoder_pos_(w.get("model.decoder.embed_positions.weight", {c_.max_positions + 2, c_.hidden_size})),
      encoder_embed_norm_(w.get("model.encoder.layernorm_embedding.weight", {c_.hidden_size}),
                          w.get("model.encoder.layernorm_embedding.bias", {c_.hidden_size}), c_.norm_eps),
      decoder_embed_norm_(w.get("model.decoder.layernorm_embedding.weight", {c_.hidden_size}),
                          w.get("model.decoder.layernorm_embedding.bias", {c_.hidden_size}), c_.norm_eps),
      lm_head_(w.get(w.contains("model.shared.weight") ? "model.shared.weight" : "model.encoder.embed_tokens.weight",
                     {c_.vocab_size, c_.hidden_size}),
               flat(w.get("final_logits_bias", {1, c_.vocab_size}))),
      act_(o.act) {
  const int64_t E = c_.hidden_size;
  auto linear = [&](const std::string& name, int64_t out, int64_t in) { return w.linear(name, out, in); };
  auto norm = [&](const std::string& name) { return w.layer_norm(name, E, c_.norm_eps); };
  auto attention = [&](const std::string& p) {  // p: "model.encoder.layers.0.self_attn"
    return Attention{linear(p + ".q_proj", E, E), linear(p + ".k_proj", E, E), linear(p + ".v_proj", E, E),
                     linear(p + ".out_proj", E, E), norm(p + "_layer_norm")};
  };
  auto layer = [&](const std::string& stack, int64_t i, int64_t F, bool decoder) {
    const std::string p = cat("model.", stack, ".layers.", i, ".");
    Attention self = attention(p + "self_attn");
    std::vector<Attention> cross;
    if (decoder) cross.push_back(attention(p + "encoder_attn"));
    Linear fc1 = linear(p + "fc1", F, E);
    Linear fc2 = linear(p + "fc2", E, F);
    return Layer{std::move(self), std::move(cross), std::move(fc1), std::move(fc2), norm(p + "final_layer_norm")};
  };
  for (int64_t i = 0; i < c_.encoder_layers; ++i) encoder_.push_back(layer("encoder", i, o.encoder_ffn, false));
  for (int64_t i = 0; i < c_.decoder_layers; ++i) decoder_.push_back(layer("decoder", i, o.decoder_ffn, true));
  for (std::vector<Layer>* side : {&encoder_, &decoder_})
    for (Layer& l : *side) {
      std::vector<Attention*> all{&l.self};
      for (Attention& a : l.cross) all.push_back(&a);
      for (Attention* a : all)
        for (attn::Layer* m : std::initializer_list<attn::Layer*>{&a->q, &a->k, &a->v, &a->out, &a->norm}) m->eval();
      for (attn::Layer* m : std::initializer_list<attn::Layer*>{&l.fc1, &l.fc2, &l.final_norm}) m->eval();
    }
  for (attn::Layer* m : std::initializer_list<attn::Layer*>{
           &shared_, &encoder_pos_, &decoder_pos_, &encoder_embed_norm_, &decoder_embed_norm_, &lm_head_, &act_})
    m->eval();
}

Tensor BartModel::embed(const int64_t* tok, const int64_t* pos, int64_t T, bool decoder) {
  // LN(shared(tok)·embed_scale + positions(pos + 2))
  Tensor x = shared_.forward(tok, {T});
  if (embed_scale_ != 1.0f)
    for (int64_t n = 0; n < x.numel(); ++n) x.data()[n] *= embed_scale_;
  std::vector<int64_t> p(pos, pos + T);
  for (int64_t& v : p) v += 2;  // BartLearnedPositionalEmbedding's offset
  Tensor at = (decoder ? decoder_pos_ : encoder_pos_).forward(p.data(), {T});
  return (decoder ? decoder_embed_norm_ : encoder_embed_norm_).forward_add(x, at.view());
}

void BartModel::feed_forward(Layer& l, Tensor& x) {
  // x = LN(x + fc2(act(fc1(x))))
  Tensor f = l.fc2.forward(act_.forward(l.fc1.forward(x.view())).view());
  x = l.final_norm.forward_add(f, x.view());
}

void BartModel::encoder_layer(int64_t i, Tensor& x, const Attend& attend) {
  Layer& l = encoder_[size_t(i)];
  // x = LN(x + out_proj(attn(q, k, v)))
  Tensor q = l.self.q.forward(x.view()), k = l.self.k.forward(x.view()), v = l.self.v.forward(x.view());
  Tensor a = l.self.out.forward(attend(q.view(), k.view(), v.view()).view());
  x = l.self.norm.forward_add(a, x.view());
  feed_forward(l, x);
}

std::pair<Tensor, Tensor> BartModel::cross_kv(int64_t i, View<const float> states) {
  Attention& a = decoder_[size_t(i)].cross[0];
  return {a.k.forward(states), a.v.forward(states)};
}

void BartModel::decoder_layer(int64_t i, Tensor& x, const Attend& self, const CrossAttend& cross) {
  Layer& l = decoder_[size_t(i)];
  Tensor q = l.self.q.forward(x.view()), k = l.self.k.forward(x.view()), v = l.self.v.forward(x.view());
  Tensor a = l.self.out.forward(self(q.view(), k.view(), v.view()).view());
  x = l.self.norm.forward_add(a, x.view());
  // x = LN(x + out_proj(cross(q_proj(x)))), K/V from the encoder
  Attention& c = l.cross[0];
  Tensor b = c.out.forward(cross(c.q.forward(x.view()).view()).view());
  x = c.norm.forward_add(b, x.view());
  feed_forward(l, x);
}

Tensor BartModel::head(View<const float> x) { return lm_head_.forward(x); }

std::vector<Linear*> BartModel::linears() {
  std::vector<Linear*> out{&lm_head_};
  for (std::vector<Layer>* side : {&encoder_, &decoder_})
    for (Layer& l : *side) {
      out.insert(out.end(), {&l.self.q, &l.self.k, &l.self.v, &l.self.out, &l.fc1, &l.fc2});
      for (Attention& a : l.cross) out.insert(out.end(), {&a.q, &a.k, &a.v, &a.out});
    }
  return out;
}

}  // namespace attn
