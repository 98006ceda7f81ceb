// KV cache for incremental decoding: per layer, K (B, Hkv, S_max, D) and V (B, Hkv, S_max, Dv) buffers,
// filled a few tokens at a time; views of the first S tokens go straight to sdpa() with bottom-right
// causal alignment. GQA-aware: only the Hkv key/value heads are stored, never repeated to H.
// Storage in fp32 (default) or in 16 bits (fp16, bf16: half the bytes a decode step reads; appended
// tokens are rounded once, see attn/kernels/half_kv.h for the error).
// Not a paged or sliding-window cache: when S_max is reached, append() throws (grow(), or clear() and
// re-prefill).
#pragma once
#include <cstdint>
#include <vector>

#include "attn/kernels/half_kv.h"
#include "attn/tensor.h"

namespace attn {

class KVCache {
 public:
  // Dv = 0 means Dv = D. Zero-filled; memory layers·B·Hkv·S_max·(D + Dv)·(4 or 2) bytes.
  KVCache(int64_t layers, int64_t B, int64_t Hkv, int64_t S_max, int64_t D, int64_t Dv = 0,
          KvDtype dtype = KvDtype::f32);

  // Appends T tokens to `layer`: k (B, Hkv, T, D), v (B, Hkv, T, Dv), any strides; rounded to dtype().
  void append(int64_t layer, View<const float> k, View<const float> v);
  // f32 cache: the first length(layer) tokens, (B, Hkv, S, D) and (B, Hkv, S, Dv) strided views.
  View<const float> keys(int64_t layer) const;
  View<const float> values(int64_t layer) const;
  // f16/bf16 cache: the same views of the 16-bit buffers, with their dtype.
  HalfKV half(int64_t layer) const;
  KvDtype dtype() const { return dtype_; }
  int64_t length(int64_t layer) const;
  int64_t capacity() const { return S_max_; }
  int64_t layers() const { return int64_t(len_.size()); }
  int64_t heads() const { return Hkv_; }
  int64_t head_dim() const { return D_; }
  void clear();  // every layer back to length 0
  // S_max becomes `capacity` (>= S_max): the buffers are reallocated and the cached tokens copied over.
  void grow(int64_t capacity);

 private:
  int64_t B_, Hkv_, S_max_, D_, Dv_;
  KvDtype dtype_;
  std::vector<Tensor> k_, v_;                      // f32: per layer (B, Hkv, S_max, D) and (B, Hkv, S_max, Dv)
  std::vector<std::vector<uint16_t>> k16_, v16_;   // f16/bf16: likewise
  std::vector<int64_t> len_;                       // per layer
  Shape strides(int64_t d) const { return {Hkv_ * S_max_ * d, S_max_ * d, d, 1}; }
};

}  // namespace attn
