// KV cache for incremental decoding: per layer, K (B, Hkv, S_max, D) and V (B, Hkv, S_max, Dv) buffers,
// filled a few tokens at a time; views of the first S tokens go straight to sdpa() with bottom-right
// causal alignment. GQA-aware: only the Hkv key/value heads are stored, never repeated to H.
// Not a paged or sliding-window cache: when S_max is reached, append() throws (clear() and re-prefill).
#pragma once
#include <cstdint>
#include <vector>

#include "attn/tensor.h"

namespace attn {

class KVCache {
 public:
  // Dv = 0 means Dv = D. Zero-filled; memory 4·layers·B·Hkv·S_max·(D + Dv) bytes.
  KVCache(int64_t layers, int64_t B, int64_t Hkv, int64_t S_max, int64_t D, int64_t Dv = 0);

  // Appends T tokens to `layer`: k (B, Hkv, T, D), v (B, Hkv, T, Dv), any strides.
  void append(int64_t layer, View<const float> k, View<const float> v);
  // The first length(layer) tokens: (B, Hkv, S, D) and (B, Hkv, S, Dv), strided views of the buffers.
  View<const float> keys(int64_t layer) const;
  View<const float> values(int64_t layer) const;
  int64_t length(int64_t layer) const;
  int64_t capacity() const { return S_max_; }
  int64_t layers() const { return int64_t(k_.size()); }
  void clear();  // every layer back to length 0

 private:
  int64_t B_, Hkv_, S_max_, D_, Dv_;
  std::vector<Tensor> k_, v_;   // per layer (B, Hkv, S_max, D) and (B, Hkv, S_max, Dv)
  std::vector<int64_t> len_;    // per layer
};

}  // namespace attn
