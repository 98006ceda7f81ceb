// KV cache for incremental decoding: per layer, K (B, Hkv, S_max, D) and V (B, Hkv, S_max, Dv) buffers,
// filled a few tokens at a time; views of the first S tokens go straight to sdpa() with bottom-right
// causal alignment. GQA-aware: only the Hkv key/value heads are stored, never repeated to H.
// Storage in fp32 (default) or in 16 bits (fp16, bf16: half the bytes a decode step reads; appended
// tokens are rounded once, see attn/kernels/half_kv.h for the error).
// A layer may keep only the last W tokens (a sliding window's, Mistral's): a rolling buffer of W slots
// in which every token is written twice (slot p % W and p % W + W of 2W), so that the last W tokens are
// always one ordered strided view: a decode step reads W keys, not the whole context, and the context
// may grow past S_max. Not a paged cache: when a layer that keeps every token reaches S_max, append()
// throws (grow(), or clear() and re-prefill).
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/kernels/half_kv.h"
#include "attn/tensor.h"

namespace attn {

class KVCache {
 public:
  // Dv = 0 means Dv = D. Zero-filled. windows: empty (every layer keeps every token), or one per layer:
  // 0 keeps every token (S_max slots), W > 0 keeps the last W (2·W slots when W < S_max; W >= S_max is a
  // layer that keeps every token, since no token it is given ever leaves the window).
  // Memory: B·Hkv·slots·(D + Dv)·(4 or 2) bytes per layer.
  KVCache(int64_t layers, int64_t B, int64_t Hkv, int64_t S_max, int64_t D, int64_t Dv = 0,
          KvDtype dtype = KvDtype::f32, std::vector<int64_t> windows = {});

  // Appends T tokens to `layer`: k (B, Hkv, T, D), v (B, Hkv, T, Dv), any strides; rounded to dtype().
  void append(int64_t layer, View<const float> k, View<const float> v);
  // f32 cache: the tokens `layer` holds in position order, (B, Hkv, S, D) and (B, Hkv, S, Dv) strided
  // views, S = stored(layer) (its last tokens for a rolling layer).
  View<const float> keys(int64_t layer) const;
  View<const float> values(int64_t layer) const;
  // f16/bf16 cache: the same views of the 16-bit buffers, with their dtype.
  HalfKV half(int64_t layer) const;
  KvDtype dtype() const { return dtype_; }
  // Tokens appended to `layer` since clear(): the position the next one takes.
  int64_t length(int64_t layer) const;
  // Tokens `layer` holds: length(layer), or at most its window for a rolling layer.
  int64_t stored(int64_t layer) const;
  // The window of a rolling layer (it keeps the last window(layer) tokens), 0 for a layer keeping every token.
  int64_t window(int64_t layer) const { return rolling_.at(size_t(layer)); }
  int64_t capacity() const { return S_max_; }
  // The longest length() a layer may reach: S_max, or no limit when every layer is rolling.
  int64_t max_length() const;
  int64_t layers() const { return int64_t(len_.size()); }
  int64_t heads() const { return Hkv_; }
  int64_t head_dim() const { return D_; }
  void clear();  // every layer back to length 0
  // S_max becomes `capacity` (>= S_max): the buffers are reallocated and the cached tokens copied over.
  void grow(int64_t capacity);

 private:
  int64_t B_, Hkv_, S_max_, D_, Dv_;
  KvDtype dtype_;
  std::vector<Tensor> k_, v_;                      // f32: per layer (B, Hkv, slots, D) and (B, Hkv, slots, Dv)
  std::vector<std::vector<uint16_t>> k16_, v16_;   // f16/bf16: likewise
  std::vector<int64_t> len_;                       // per layer
  std::vector<int64_t> rolling_;                   // per layer: W of a rolling layer, else 0
  int64_t slots(size_t layer) const { return rolling_[layer] ? 2 * rolling_[layer] : S_max_; }
  Shape strides(size_t layer, int64_t d) const { return {Hkv_ * slots(layer) * d, slots(layer) * d, d, 1}; }
  // The slot of the oldest token held and the count held.
  int64_t first_slot(size_t layer) const;
};

}  // namespace attn
