// transformers' BertModel (BERT, MiniLM, ...) on nn.h's layers and sdpa(): the encoder only (no pooler,
// no heads), eval mode. Padding costs no work: the tokens the attention mask keeps are packed into one
// (T, E) matrix for the embeddings, projections, norms and MLP, and each sequence attends over its own
// tokens with one sdpa() call. Not BERT's training (no backward, no dropout).
#include <filesystem>

#include "attn/hf.h"
#include "hf_json.h"
#include "hf_pack.h"

namespace attn {

namespace {

BertConfig read_bert_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const hf::json j = hf::read_json(path, "config.json");
  const std::string w = cat("'", path, "'");
  BertConfig c;
  c.vocab_size = hf::field<int64_t>(j, "vocab_size", w);
  c.hidden_size = hf::field<int64_t>(j, "hidden_size", w);
  c.num_hidden_layers = hf::field<int64_t>(j, "num_hidden_layers", w);
  c.num_attention_heads = hf::field<int64_t>(j, "num_attention_heads", w);
  c.intermediate_size = hf::field<int64_t>(j, "intermediate_size", w);
  c.max_position_embeddings = hf::field<int64_t>(j, "max_position_embeddings", w);
  c.type_vocab_size = hf::field_or<int64_t>(j, "type_vocab_size", w, 2);
  c.layer_norm_eps = hf::epsilon(j, "layer_norm_eps", w, 1e-12);
  c.pad_token_id = hf::field_or<int64_t>(j, "pad_token_id", w, 0);
  const std::string act = hf::field_or<std::string>(j, "hidden_act", w, "gelu");
  ATTN_CHECK(act == "gelu", "Expected \"hidden_act\" \"gelu\" (the exact erf form) in ", w, ", but got \"", act,
             "\" instead");
  const std::string pos = hf::field_or<std::string>(j, "position_embedding_type", w, "absolute");
  ATTN_CHECK(pos == "absolute", "Expected \"position_embedding_type\" \"absolute\" in ", w, ", but got \"", pos,
             "\" instead");
  ATTN_CHECK(!hf::field_or<bool>(j, "is_decoder", w, false) && !hf::field_or<bool>(j, "add_cross_attention", w, false),
             "Expected an encoder (is_decoder and add_cross_attention false) in ", w, ", but got a decoder instead");
  ATTN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0 &&
             c.intermediate_size > 0 && c.max_position_embeddings > 0 && c.type_vocab_size > 0,
             "Expected positive sizes in ", w, ", but got vocab_size ", c.vocab_size, ", hidden_size ", c.hidden_size,
             ", num_hidden_layers ", c.num_hidden_layers, ", num_attention_heads ", c.num_attention_heads,
             ", intermediate_size ", c.intermediate_size, ", max_position_embeddings ", c.max_position_embeddings,
             ", type_vocab_size ", c.type_vocab_size, " instead");
  ATTN_CHECK(c.hidden_size % c.num_attention_heads == 0, "Expected hidden_size divisible by num_attention_heads in ",
             w, ", but got ", c.hidden_size, " and ", c.num_attention_heads, " instead");
  return c;
}

// transformers saves BertModel's tensors without a prefix and BertFor*'s under "bert.".
std::string prefix_of(const HfWeights& w) {
  return w.contains("embeddings.word_embeddings.weight") || !w.contains("bert.embeddings.word_embeddings.weight")
             ? ""
             : "bert.";
}

}  // namespace

BertModel::BertModel(const std::string& dir) : BertModel(read_bert_config(dir), HfWeights(dir)) {}

BertModel::BertModel(const BertConfig& c, const HfWeights& w)
    : c_(c),
      word_(w.get(prefix_of(w) + "embeddings.word_embeddings.weight", {c.vocab_size, c.hidden_size})),
      position_(
          w.get(prefix_of(w) + "embeddings.position_embeddings.weight", {c.max_position_embeddings, c.hidden_size})),
      token_type_(w.get(prefix_of(w) + "embeddings.token_type_embeddings.weight", {c.type_vocab_size, c.hidden_size})),
      embed_norm_(w.get(prefix_of(w) + "embeddings.LayerNorm.weight", {c.hidden_size}),
                  w.get(prefix_of(w) + "embeddings.LayerNorm.bias", {c.hidden_size}), c.layer_norm_eps) {
  const int64_t E = c.hidden_size, I = c.intermediate_size;
  w.expect(cat(prefix_of(w), "encoder.layer.", c.num_hidden_layers - 1, ".attention.self.query.weight"),
           cat("num_hidden_layers ", c.num_hidden_layers, " in config.json"));
  auto linear = [&](const std::string& name, int64_t out, int64_t in) { return w.linear(name, out, in); };
  auto norm = [&](const std::string& name) { return w.layer_norm(name, E, c.layer_norm_eps); };
  layers_.reserve(size_t(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = cat(prefix_of(w), "encoder.layer.", i, ".");
    layers_.push_back(Layer{linear(p + "attention.self.query", E, E), linear(p + "attention.self.key", E, E),
                            linear(p + "attention.self.value", E, E), linear(p + "attention.output.dense", E, E),
                            norm(p + "attention.output.LayerNorm"), linear(p + "intermediate.dense", I, E),
                            linear(p + "output.dense", E, I), norm(p + "output.LayerNorm")});
  }
  for (Layer& l : layers_)
    for (attn::Layer* m : std::initializer_list<attn::Layer*>{&l.query, &l.key, &l.value, &l.attn_out, &l.attn_norm,
                                                              &l.intermediate, &l.output, &l.out_norm})
      m->eval();
  for (Linear* l : linears()) l->pack_weight();  // a sentence's products read W's panels, never pack W
  for (attn::Layer* m : std::initializer_list<attn::Layer*>{&word_, &position_, &token_type_, &embed_norm_, &act_})
    m->eval();
}

Tensor BertModel::forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask) {
  return run(ids, B, L, mask, nullptr, nullptr);
}

Tensor BertModel::forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask, const int64_t* types) {
  return run(ids, B, L, mask, types, nullptr);
}

std::vector<Linear*> BertModel::linears() {
  std::vector<Linear*> l;
  for (Layer& y : layers_)
    l.insert(l.end(), {&y.query, &y.key, &y.value, &y.attn_out, &y.intermediate, &y.output});
  return l;
}

std::vector<Tensor> BertModel::attention_weights(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask) {
  std::vector<Tensor> w;
  run(ids, B, L, mask, nullptr, &w);
  return w;
}

Tensor BertModel::run(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask, const int64_t* types,
                      std::vector<Tensor>* weights) {
  const Autocast autocast(precision);
  const int64_t E = c_.hidden_size, H = c_.num_attention_heads, D = E / H;
  ATTN_CHECK(L <= c_.max_position_embeddings, "Expected ids (B, L) with L <= max_position_embeddings ",
             c_.max_position_embeddings, ", but got (", B, ", ", L, ") instead");
  const hf::PackedBatch p = hf::pack_batch(ids, B, L, mask);
  std::vector<int64_t> typ(p.tok.size(), 0);  // (T)
  for (int64_t i = 0; i < B * L && types; ++i) {
    if (p.row_of[size_t(i)] < 0) continue;
    ATTN_CHECK(types[i] >= 0 && types[i] < c_.type_vocab_size, "Expected token_type_ids in [0, ", c_.type_vocab_size,
               "), but got ", types[i], " at (", i / L, ", ", i % L, ") instead");
    typ[size_t(p.row_of[size_t(i)])] = types[i];
  }
  const int64_t T = p.rows();
  if (weights) {
    weights->clear();
    for (int64_t i = 0; i < c_.num_hidden_layers; ++i) weights->emplace_back(Shape{B, H, L, L});
  }
  if (T == 0) return Tensor({B, L, E});

  // x = LN(word[ids] + position[pos] + token_type[types])   (T, E)
  Tensor x = word_.forward(p.tok.data(), {T});
  add_(x.view(), position_.forward(p.pos.data(), {T}).view());
  Tensor tt = token_type_.forward(typ.data(), {T});
  x = embed_norm_.forward_add(x, tt.view());

  Tensor ctx = Tensor::uninitialized({T, E});  // every sequence's rows written by its sdpa
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& ly = layers_[li];
    Tensor q = ly.query.forward(x.view()), k = ly.key.forward(x.view()), v = ly.value.forward(x.view());  // (T, E)
    hf::attend_packed(p, q.view(), k.view(), v.view(), H, H, D, Causal::none, ctx.view(),
                      weights ? &(*weights)[li] : nullptr);
    // x = LN(x + Wo·ctx); x = LN(x + W2·gelu(W1·x))
    Tensor a = ly.attn_out.forward(ctx.view());
    Tensor h1 = ly.attn_norm.forward_add(a, x.view());
    Tensor f = ly.output.forward(act_.forward(ly.intermediate.forward(h1.view())).view());
    x = ly.out_norm.forward_add(f, h1.view());
  }
  return hf::unpack(p, x.view());
}

}  // namespace attn
