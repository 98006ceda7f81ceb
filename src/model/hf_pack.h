// A padded batch as packed rows, and attention per packed sequence: what BertModel and the decoders share
// so that padding costs no work. Private to src/model.
#pragma once
#include <cstdint>
#include <vector>

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

// For each sequence of p, sdpa of its rows of q (T, H·D) over its rows of k and v (T, Hkv·D) (strided
// rows, unit column stride) into ctx (T, H·D); head h is columns [h·D, (h+1)·D). weights: null, or
// (B, H, L, L) (zero-filled) that receives each sequence's weights at its own positions.
void attend_packed(const PackedBatch& p, View<const float> q, View<const float> k, View<const float> v, int64_t H,
                   int64_t Hkv, int64_t D, Causal causal, View<float> ctx, Tensor* weights);

// (T, F) packed rows -> (B, L, F) with zeros at padding.
Tensor unpack(const PackedBatch& p, View<const float> x);

}  // namespace attn::hf
