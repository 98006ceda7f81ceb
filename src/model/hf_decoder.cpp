// What the pretrained decoders (hf_gpt2.cpp, hf_llama.cpp, hf_bloom.cpp) share: forward over a packed batch,
// the KV cache path (a sliding layer's cache rolling), attention weights, eos ids, and generate() on
// sampling.h's loop. The architectures supply embed(), layer(), head() and each layer's attention variants;
// the attention between their projections is sdpa(), run here (hf_model.cpp's attend_packed, attend_cached).
#include <filesystem>
#include <limits>

#include "attn/hf.h"
#include "attn/sdpa.h"
#include "hf_json.h"
#include "hf_pack.h"

namespace attn {

namespace hf {

std::vector<int64_t> eos_token_ids(const std::string& dir, const json& config) {
  const std::filesystem::path gen = std::filesystem::path(dir) / "generation_config.json";
  json g;
  if (std::filesystem::exists(gen)) g = read_json(gen.string(), "generation_config.json");
  const json& j = g.contains("eos_token_id") ? g : config;
  const std::string where = &j == &g ? gen.string() : (std::filesystem::path(dir) / "config.json").string();
  auto it = j.find("eos_token_id");
  std::vector<int64_t> out;
  if (it == j.end() || it->is_null()) return out;
  auto one = [&](const json& v) {
    ATTN_CHECK(v.is_number_integer(), "Expected \"eos_token_id\" in '", where,
               "' to be an integer or a list of integers, but got ", brief(*it), " instead");
    out.push_back(v.get<int64_t>());
  };
  if (it->is_array())
    for (const json& v : *it) one(v);
  else
    one(*it);
  return out;
}

}  // namespace hf

Tensor PretrainedDecoder::forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask) {
  return run(ids, B, L, mask, nullptr);
}

Tensor PretrainedDecoder::hidden_states(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask) {
  return run(ids, B, L, mask, nullptr, /*hidden=*/true);
}

std::vector<Tensor> PretrainedDecoder::attention_weights(const int64_t* ids, int64_t B, int64_t L,
                                                         const int64_t* mask) {
  std::vector<Tensor> w;
  run(ids, B, L, mask, &w);
  return w;
}

Tensor PretrainedDecoder::run(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask,
                              std::vector<Tensor>* weights, bool hidden) {
  const Autocast autocast(precision);
  const int64_t H = c_.num_heads, Hkv = c_.num_kv_heads, D = c_.head_dim;
  ATTN_CHECK(c_.max_positions == 0 || L <= c_.max_positions, "Expected ids (B, L) with L <= ", c_.max_positions,
             " (the positions ", architecture(), " has), but got (", B, ", ", L, ") instead");
  const hf::PackedBatch p = hf::pack_batch(ids, B, L, mask);
  const int64_t T = p.rows();
  if (weights) {
    weights->clear();
    for (int64_t i = 0; i < c_.num_layers; ++i) weights->emplace_back(Shape{B, H, L, L});
  }
  if (T == 0) return Tensor({B, L, hidden ? c_.hidden_size : c_.vocab_size});
  Tensor x = embed(p.tok.data(), p.pos.data(), T);  // (T, E): the residual stream
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    // each sequence over its own rows, causal (kept tokens in order: their positions' order)
    layer(i, x, p.pos.data(), [&](View<const float> q, View<const float> k, View<const float> v) {
      Tensor ctx = Tensor::uninitialized({T, H * D});  // every row written by its sequence's sdpa
      hf::attend_packed(p, q, k, v, H, Hkv, D, Causal::top_left, ctx.view(),
                        weights ? &(*weights)[size_t(i)] : nullptr, attention(i));
      return ctx;
    });
  }
  if (weights) return Tensor();
  Tensor out = hidden ? final_norm(x.view()) : head(x.view());  // (T, E) or (T, V)
  return hf::unpack(p, out.view());
}

KVCache PretrainedDecoder::new_cache(int64_t B, int64_t capacity, KvDtype dtype) const {
  ATTN_CHECK(B > 0 && capacity >= 0 && (capacity > 0 || c_.max_positions > 0), "Expected B > 0 and capacity >= 0 ",
             "(> 0 for ", architecture(), ", which has no position limit), but got ", B, " and ", capacity, " instead");
  std::vector<int64_t> windows(size_t(c_.num_layers));
  for (int64_t i = 0; i < c_.num_layers; ++i) windows[size_t(i)] = attention(i).sliding_window;
  return KVCache(c_.num_layers, B, c_.num_kv_heads, capacity ? capacity : c_.max_positions, c_.head_dim, 0, dtype,
                 windows);
}

Tensor PretrainedDecoder::forward_cached(const int64_t* ids, int64_t B, int64_t T, KVCache& cache, bool last_only) {
  const Autocast autocast(precision);
  const int64_t H = c_.num_heads, Hkv = c_.num_kv_heads, D = c_.head_dim, E = c_.hidden_size;
  ATTN_CHECK(B > 0 && T > 0, "Expected ids (B, T) with B, T > 0, but got (", B, ", ", T, ") instead");
  ATTN_CHECK(cache.layers() == c_.num_layers && cache.heads() == Hkv && cache.head_dim() == D,
             "Expected a KV cache of ", c_.num_layers, " layers of ", Hkv, " heads of ", D, ", but got ",
             cache.layers(), " layers of ", cache.heads(), " heads of ", cache.head_dim(), " instead");
  const int64_t S0 = cache.length(0);
  const int64_t most = std::min(cache.max_length(), c_.max_positions ? c_.max_positions : cache.max_length());
  ATTN_CHECK(S0 + T <= most, "Expected at most ", most, " positions in the KV cache, but got ", S0 + T, " instead");
  std::vector<int64_t> pos(size_t(B * T));  // (B, T): rows b-major
  for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = S0 + i % T;
  Tensor x = embed(ids, pos.data(), B * T);  // (B·T, E)
  for (int64_t i = 0; i < c_.num_layers; ++i) {
    layer(i, x, pos.data(), [&](View<const float> q, View<const float> k, View<const float> v) {
      Tensor ctx = Tensor::uninitialized({B * T, H * D});  // written by sdpa
      hf::attend_cached(cache, i, q, k, v, B, T, H, Hkv, D, attention(i), ctx.view());
      return ctx;
    });
  }
  // every token, or the last of each sequence: rows T-1, 2T-1, ...
  Tensor logits = last_only ? head(View<const float>{x.data() + (T - 1) * E, {B, E}, {T * E, 1}}) : head(x.view());
  logits.reshape({B, last_only ? 1 : T, c_.vocab_size});
  return logits;
}

std::vector<int64_t> generate(PretrainedDecoder& model, const std::vector<int64_t>& prompt, const SampleOptions& o) {
  const int64_t V = model.vocab_size(), P = model.max_positions();
  ATTN_CHECK(o.max_new_tokens >= 0, "Expected max_new_tokens >= 0, but got ", o.max_new_tokens, " instead");
  // The cache holds prompt + max_new_tokens positions, at most P (saturating: -n 2^63-1 made a capacity of
  // -2^63; P = 0, ALiBi's, is no limit), allocated as they are reached: the prompt and kGrow more first,
  // then doubling (a model that allows 2^62 positions asked for all of them at once).
  constexpr int64_t kGrow = 256;
  const int64_t np = int64_t(prompt.size()), limit = P > 0 ? P : std::numeric_limits<int64_t>::max();
  const int64_t most = std::max<int64_t>(1, o.max_new_tokens >= limit - np ? limit : np + o.max_new_tokens);
  int64_t widest = 0;  // a sliding layer's cache rolls (keeps W tokens) only when it is longer than W
  for (int64_t i = 0; i < model.num_layers(); ++i) widest = std::max(widest, model.attention(i).sliding_window);
  KVCache cache = model.new_cache(1, std::min(most, std::max(np + kGrow, widest + 1)), o.kv_dtype);
  Tensor logits;  // (1, 1, V) of the last step
  return sample_loop(prompt, o, V, P, [&](const int64_t* ids, int64_t n, bool restart) {
    if (restart) cache.clear();
    const int64_t need = cache.length(0) + n;
    if (need > cache.capacity()) cache.grow(std::min(most, std::max(need, 2 * cache.capacity())));
    logits = model.forward_cached(ids, 1, n, cache, true);
    return logits.data();
  });
}

}  // namespace attn
