// A padded batch as packed rows, attention per packed sequence, and attention over a KV cache: what
// BertModel, the decoders and the encoder-decoders share so that padding costs no work and a layer's
// variants (LayerAttention) reach the kernels. Private to src/model.
#pragma once
#include <cstdint>
#include <vector>

#include "attn/hf.h"
#include "attn/kernels/problem.h"
#include "attn/tensor.h"

namespace attn::hf {

// The tokens an attention mask keeps (B, L), packed: token t of the batch is ids at (b, l) with l = pos[t]
// (transformers' position ids are 0..L-1 whatever the mask); sequence b is rows [off[b], off[b+1]).
struct PackedBatch {
  int64_t B = 0, L = 0;
  std::vector<int64_t> tok, pos;  // (T) each
  std::vector<int64_t> row_of;    // (B·L): the packed row of (b, l), or -1 (padding)
  std::vector<int64_t> off;       // (B + 1)
  int64_t rows() const { return int64_t(tok.size()); }
};
// mask null: every token. An Error for a mask value other than 0 or 1, or an empty batch.
PackedBatch pack_batch(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask);

// args' variants as a layer's LayerAttention gives them: scale, softcap, ALiBi, T5's table, and a sliding
// window of W keys as FlashAttention's window (W - 1, -1) beside args.causal.
void set_variants(SdpaArgs<float>& args, const LayerAttention& a);

// For each sequence of p, sdpa of its rows of q (T, H·D) over its rows of k and v (T, Hkv·D) (strided
// rows, unit column stride) into ctx (T, H·D); head h is columns [h·D, (h+1)·D). weights: null, or
// (B, H, L, L) (zero-filled) that receives each sequence's weights at its own positions.
void attend_packed(const PackedBatch& p, View<const float> q, View<const float> k, View<const float> v, int64_t H,
                   int64_t Hkv, int64_t D, Causal causal, View<float> ctx, Tensor* weights,
                   const LayerAttention& a = {});

// One layer over a KV cache: q (B·T, H·D), k and v (B·T, Hkv·D), rows b-major (T new tokens of each of B
// sequences, strided rows), into ctx (B·T, H·D). The new K/V join cache layer `layer`; query t sees the
// cached keys and the new ones up to itself (bottom-right causal), within a's sliding window. A rolling
// layer (KVCache::window) holds only the last W tokens: one new token attends to them as they are; several
// after cached ones attend to the cached window and themselves, joined, before they are appended.
// weights: null, or receives (B, H, T, S) over the S keys attended (an f32 cache only).
void attend_cached(KVCache& cache, int64_t layer, View<const float> q, View<const float> k, View<const float> v,
                   int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, const LayerAttention& a, View<float> ctx,
                   Tensor* weights = nullptr);

// (T, F) packed rows -> (B, L, F) with zeros at padding.
Tensor unpack(const PackedBatch& p, View<const float> x);

}  // namespace attn::hf
