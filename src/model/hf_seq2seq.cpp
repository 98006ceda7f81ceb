// What the encoder-decoders (hf_t5.cpp, hf_bart.cpp) share: the encoder over a packed source (padding costs
// nothing) and the cross-attention K/V projected from its output once, the decoder over a self-attention KV
// cache with its queries cross-attending to their own source's tokens, attention weights of all three kinds,
// and generate() on sampling.h's loop. The architectures supply embed(), the layers, cross_kv() and head().
#include <limits>

#include "attn/hf.h"
#include "attn/sdpa.h"
#include "hf_pack.h"

namespace attn {

PretrainedSeq2Seq::Encoded PretrainedSeq2Seq::encode(const int64_t* ids, int64_t B, int64_t S, const int64_t* mask,
                                                     std::vector<Tensor>* weights) {
  const Autocast autocast(precision);
  const int64_t H = c_.num_heads, D = c_.head_dim;
  ATTN_CHECK(c_.max_positions == 0 || S <= c_.max_positions, "Expected source ids (B, S) with S <= ",
             c_.max_positions, " (the positions ", architecture(), " has), but got (", B, ", ", S, ") instead");
  const hf::PackedBatch p = hf::pack_batch(ids, B, S, mask);
  Encoded e;
  e.B = B, e.S = S, e.off = p.off, e.row_of = p.row_of, e.pos = p.pos;
  const int64_t N = p.rows();
  if (weights) {
    weights->clear();
    for (int64_t i = 0; i < c_.encoder_layers; ++i) weights->emplace_back(Shape{B, H, S, S});
  }
  if (N == 0) return e;  // no source token: every cross-attention row is fully masked (zeros)
  Tensor x = embed(p.tok.data(), p.pos.data(), N, false);  // (N, E): the residual stream
  for (int64_t i = 0; i < c_.encoder_layers; ++i) {
    encoder_layer(i, x, [&](View<const float> q, View<const float> k, View<const float> v) {
      Tensor ctx = Tensor::uninitialized({N, H * D});  // every row written by its sequence's sdpa
      hf::attend_packed(p, q, k, v, H, H, D, Causal::none, ctx.view(), weights ? &(*weights)[size_t(i)] : nullptr,
                        encoder_attention(i));
      return ctx;
    });
  }
  encoder_end(x);
  for (int64_t i = 0; i < c_.decoder_layers; ++i) {
    auto [k, v] = cross_kv(i, x.view());
    e.cross_k.push_back(std::move(k));
    e.cross_v.push_back(std::move(v));
  }
  e.states = std::move(x);
  return e;
}

KVCache PretrainedSeq2Seq::new_cache(int64_t B, int64_t capacity, KvDtype dtype) const {
  ATTN_CHECK(B > 0 && capacity >= 0 && (capacity > 0 || c_.max_positions > 0), "Expected B > 0 and capacity >= 0 ",
             "(> 0 for ", architecture(), ", which has no position limit), but got ", B, " and ", capacity, " instead");
  return KVCache(c_.decoder_layers, B, c_.num_heads, capacity ? capacity : c_.max_positions, c_.head_dim, 0, dtype);
}

Tensor PretrainedSeq2Seq::decode(const Encoded& src, const int64_t* ids, int64_t B, int64_t T, KVCache& cache,
                                 bool last_only, std::vector<Tensor>* self_weights,
                                 std::vector<Tensor>* cross_weights) {
  const Autocast autocast(precision);
  const int64_t H = c_.num_heads, D = c_.head_dim, E = c_.hidden_size, S = src.S;
  ATTN_CHECK(B > 0 && T > 0 && B == src.B, "Expected target ids (B, T) with T > 0 and the source's B = ", src.B,
             ", but got (", B, ", ", T, ") instead");
  ATTN_CHECK(cache.layers() == c_.decoder_layers && cache.heads() == H && cache.head_dim() == D,
             "Expected a KV cache of ", c_.decoder_layers, " layers of ", H, " heads of ", D, ", but got ",
             cache.layers(), " layers of ", cache.heads(), " heads of ", cache.head_dim(), " instead");
  const int64_t S0 = cache.length(0);
  const int64_t most = std::min(cache.max_length(), c_.max_positions ? c_.max_positions : cache.max_length());
  ATTN_CHECK(S0 + T <= most, "Expected at most ", most, " target positions in the KV cache, but got ", S0 + T,
             " instead");
  std::vector<int64_t> pos(size_t(B * T));  // (B, T): rows b-major
  for (int64_t i = 0; i < B * T; ++i) pos[size_t(i)] = S0 + i % T;
  for (std::vector<Tensor>* w : {self_weights, cross_weights})
    if (w) w->clear(), w->resize(size_t(c_.decoder_layers));
  Tensor x = embed(ids, pos.data(), B * T, true);  // (B·T, E)
  for (int64_t i = 0; i < c_.decoder_layers; ++i) {
    const LayerAttention self_variants = decoder_attention(i);
    auto self = [&](View<const float> q, View<const float> k, View<const float> v) {
      Tensor ctx = Tensor::uninitialized({B * T, H * D});  // written by sdpa
      hf::attend_cached(cache, i, q, k, v, B, T, H, H, D, self_variants, ctx.view(),
                        self_weights ? &(*self_weights)[size_t(i)] : nullptr);
      return ctx;
    };
    // Cross-attention: sequence b's T queries over its own source rows [off[b], off[b+1]) of the layer's K/V,
    // scaled as the decoder's self-attention (T5: not at all), no mask, no position bias.
    auto cross = [&](View<const float> q) {
      Tensor ctx({B * T, H * D});  // a sequence without source tokens keeps zeros (a fully masked row)
      Tensor* w = nullptr;
      if (cross_weights) w = &((*cross_weights)[size_t(i)] = Tensor({B, H, T, S}));
      for (int64_t b = 0; b < B; ++b) {
        const int64_t o = src.off[size_t(b)], n = src.off[size_t(b) + 1] - o;
        if (n == 0) continue;
        auto rows = [&](auto m, int64_t r0, int64_t len) {  // rows r0.. of (·, H·D) as (1, H, len, D)
          return decltype(m){m.data + r0 * m.stride(0), {1, H, len, D}, {len * m.stride(0), D, m.stride(0), 1}};
        };
        const Tensor& K = src.cross_k[size_t(i)];
        const Tensor& V = src.cross_v[size_t(i)];
        SdpaArgs<float> args{rows(q, b * T, T), rows(K.view(), o, n), rows(V.view(), o, n)};
        args.scale = self_variants.scale;
        Tensor wb;
        if (w) wb = Tensor::uninitialized({1, H, T, n});
        sdpa(args, SdpaOut<float>{rows(ctx.view(), b * T, T), w ? wb.view() : View<float>{}, {}});
        if (!w) continue;
        const int64_t* at = src.pos.data() + o;  // the source positions of the packed rows
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < n; ++j)
              w->data()[((b * H + h) * T + t) * S + at[j]] = wb.data()[(h * T + t) * n + j];
      }
      return ctx;
    };
    decoder_layer(i, x, self, cross);
  }
  Tensor logits = last_only ? head(View<const float>{x.data() + (T - 1) * E, {B, E}, {T * E, 1}}) : head(x.view());
  logits.reshape({B, last_only ? 1 : T, c_.vocab_size});
  return logits;
}

Tensor PretrainedSeq2Seq::logits(const int64_t* source, int64_t B, int64_t S, const int64_t* source_mask,
                                 const int64_t* target, int64_t T) {
  const Encoded e = encode(source, B, S, source_mask);
  KVCache cache = new_cache(B, T);
  return decode(e, target, B, T, cache);
}

PretrainedSeq2Seq::Weights PretrainedSeq2Seq::all_attention_weights(const int64_t* source, int64_t S,
                                                                     const int64_t* target, int64_t T) {
  Weights w;
  const Encoded e = encode(source, 1, S, nullptr, &w.encoder);
  KVCache cache = new_cache(1, T);
  decode(e, target, 1, T, cache, true, &w.decoder, &w.cross);
  return w;
}

Tensor PretrainedSeq2Seq::forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask) {
  const Encoded e = encode(ids, B, L, mask);
  if (e.states.numel() == 0) return Tensor({B, L, c_.hidden_size});
  Tensor out({B, L, c_.hidden_size});  // padded positions stay 0
  const int64_t E = c_.hidden_size;
  for (int64_t i = 0; i < B * L; ++i)
    if (e.row_of[size_t(i)] >= 0) std::copy_n(e.states.data() + e.row_of[size_t(i)] * E, E, out.data() + i * E);
  return out;
}

std::vector<Tensor> PretrainedSeq2Seq::attention_weights(const int64_t* ids, int64_t B, int64_t L,
                                                         const int64_t* mask) {
  std::vector<Tensor> w;
  encode(ids, B, L, mask, &w);
  return w;
}

std::vector<int64_t> generate(PretrainedSeq2Seq& model, const std::vector<int64_t>& source, const SampleOptions& o) {
  const Seq2SeqConfig& c = model.seq2seq_config();
  ATTN_CHECK(!source.empty(), "Expected a source of at least one token, but got none instead");
  ATTN_CHECK(o.max_new_tokens >= 0, "Expected max_new_tokens >= 0, but got ", o.max_new_tokens, " instead");
  for (int64_t t : source)
    ATTN_CHECK(t >= 0 && t < c.vocab_size, "Expected source tokens in [0, ", c.vocab_size, "), but got ", t,
               " instead");
  const PretrainedSeq2Seq::Encoded e = model.encode(source.data(), 1, int64_t(source.size()));
  const int64_t P = c.max_positions, want = 1 + o.max_new_tokens, V = c.vocab_size;
  KVCache cache = model.new_cache(1, P > 0 ? std::min(P, want) : want, o.kv_dtype);
  Tensor logits;     // (1, 1, V) of the last step
  int64_t step = 0;  // the new token the next logits are for
  // transformers' ForcedBOSTokenLogitsProcessor (the first new token) and ForcedEOSTokenLogitsProcessor (the
  // last one max_new_tokens allows), in that order: every other logit -inf.
  auto force = [&](float* l, int64_t id) {
    for (int64_t v = 0; v < V; ++v) l[v] = v == id ? 0.0f : -std::numeric_limits<float>::infinity();
  };
  return sample_loop({c.decoder_start_token_id}, o, V, P, [&](const int64_t* ids, int64_t n, bool restart) {
    if (restart) cache.clear();
    logits = model.decode(e, ids, 1, n, cache, true);
    if (step == 0 && c.forced_bos_token_id >= 0) force(logits.data(), c.forced_bos_token_id);
    if (step == o.max_new_tokens - 1 && c.forced_eos_token_id >= 0) force(logits.data(), c.forced_eos_token_id);
    ++step;
    return logits.data();
  });
}

}  // namespace attn
