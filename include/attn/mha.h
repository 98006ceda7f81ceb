// MultiheadAttention with torch.nn.MultiheadAttention's semantics: the same parameters under the same
// state_dict names, the same shapes, masks, add_bias_kv, add_zero_attn and dropout on the weights, plus
// grouped-query attention (num_kv_heads). A training layer with nn.h's contract: forward() in training
// mode saves what backward() needs (the flash kernel's LSE among it), backward() adds into the parameter
// gradients and returns the input gradients. forward_cached() decodes incrementally over a KVCache.
//
// Where we differ from PyTorch, on purpose:
// - A fully masked row (a query that may attend to no key, in some head) gives weights 0 and context 0
//   in that head, so when every head is masked the output row is out_proj.bias. PyTorch gives NaN there
//   (need_weights=True, or its fast path) or zeros (its need_weights=False path).
// - is_causal is a top-left causal mask of its own (query l sees keys s <= l) that combines with
//   attn_mask and key_padding_mask; PyTorch requires attn_mask with is_causal and takes it as a hint that
//   attn_mask is causal. The columns add_bias_kv / add_zero_attn append stay visible to every query, as
//   they are under PyTorch's padded causal attn_mask.
// - Initialisation and dropout draw from attn::Rng / the dropout hash of rng.h: PyTorch's distributions,
//   other numbers.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "attn/fields.h"
#include "attn/kernels/problem.h"
#include "attn/kv_cache.h"
#include "attn/mask.h"
#include "attn/param.h"
#include "attn/safetensors.h"
#include "attn/tensor.h"

namespace attn {

// The constructor arguments of torch.nn.MultiheadAttention (0 = PyTorch's None), plus ours.
struct MhaOptions {
  int64_t embed_dim = 0;      // E
  int64_t num_heads = 1;      // H; head dim D = E / H
  double dropout = 0.0;       // on the attention weights, in training mode only
  bool bias = true;           // in_proj_bias and out_proj.bias
  bool add_bias_kv = false;   // append the learned key/value bias_k, bias_v as one more key
  bool add_zero_attn = false; // append a zero key/value
  int64_t kdim = 0;           // key features; 0 = E
  int64_t vdim = 0;           // value features; 0 = E
  bool batch_first = false;   // (N, L, E) instead of (L, N, E)
  int64_t num_kv_heads = 0;   // Hkv; 0 = H. GQA when < H, MQA at 1
  uint64_t seed = 0;          // initialisation, and the first dropout seed
};

// MhaOptions' fields in order, named as torch.nn.MultiheadAttention's arguments: the Python constructor
// and its defaults are made from this list (python/bind_mha.cpp).
inline constexpr auto kMhaOptionsFields = std::tuple{
    ATTN_FIELD(MhaOptions, embed_dim),   ATTN_FIELD(MhaOptions, num_heads),     ATTN_FIELD(MhaOptions, dropout),
    ATTN_FIELD(MhaOptions, bias),        ATTN_FIELD(MhaOptions, add_bias_kv),   ATTN_FIELD(MhaOptions, add_zero_attn),
    ATTN_FIELD(MhaOptions, kdim),        ATTN_FIELD(MhaOptions, vdim),          ATTN_FIELD(MhaOptions, batch_first),
    ATTN_FIELD(MhaOptions, num_kv_heads), ATTN_FIELD(MhaOptions, seed)};

// The attention variants a layer passes on to sdpa as they are (SdpaArgs' fields, attn/kernels/problem.h):
// a sliding window, ALiBi slopes (H) or (N, H), softcap, documents of self-attention (N, L). Not T5's
// relative bias: a learned table belongs to the model that owns it.
struct AttnVariants {
  Window window = {};
  View<const float> alibi_slopes = {};
  double softcap = 0;
  View<const int64_t> document_ids = {};
  bool given() const { return window.given() || !alibi_slopes.empty() || softcap != 0 || !document_ids.empty(); }
};

// forward()'s optional arguments, named and defaulted as in PyTorch. Masks are views (no copy is made
// unless add_bias_kv / add_zero_attn need a padded column). PyTorch's bool masks are Mask::drop
// (True = ignore / not allowed); float masks are Mask::additive; Mask::keep works too.
struct MhaArgs {
  Mask<float> key_padding_mask = {};  // (N, S), unbatched (S,)
  bool need_weights = true;           // also return the attention weights (forces the reference backend)
  Mask<float> attn_mask = {};         // (L, S) or (N·H, L, S), unbatched (L, S) or (H, L, S)
  bool average_attn_weights = true;   // weights averaged over heads, else per head
  bool is_causal = false;             // top-left causal; combines with both masks
  std::ostream* trace = nullptr;      // if set, prints the shape at every stage
  // Variants in the kernel; not with add_bias_kv / add_zero_attn (their extra key has no position). Copied
  // for backward.
  AttnVariants variants = {};
};

// S' = S + add_bias_kv + add_zero_attn: the keys actually attended to.
struct MhaOutput {
  Tensor output;   // (L, N, E), (N, L, E) with batch_first, (L, E) unbatched
  Tensor weights;  // empty unless need_weights: (N, L, S') averaged or (N, H, L, S'); unbatched (L, S') / (H, L, S')
};

// Gradients of forward()'s inputs, each of its input's shape. For self-attention (one tensor given as
// query, key and value) its gradient is the sum of the three.
struct MhaGrads {
  Tensor dquery, dkey, dvalue;
};

class MultiheadAttention : public Layer {
 public:
  // Throws attn::Error for embed_dim % num_heads != 0, num_heads % num_kv_heads != 0 and other bad options.
  explicit MultiheadAttention(const MhaOptions& options);

  // query (L, N, E) / (N, L, E) / (L, E); key (S, N, kdim), value (S, N, vdim) in the same layout.
  // Any strides with a unit last stride are read in place; other inputs are copied once.
  MhaOutput forward(View<const float> query, View<const float> key, View<const float> value,
                    const MhaArgs& args = {});
  // Self-attention forward(x, x, x, args) on a temporary: when training, x's buffer is kept as the saved
  // input instead of a copy.
  MhaOutput forward_self(Tensor&& x, const MhaArgs& args = {});

  // PyTorch's names and order: in_proj_weight (3E, E) when kdim == vdim == E and Hkv == H, else
  // q_proj_weight (E, E), k_proj_weight (Hkv·D, kdim), v_proj_weight (Hkv·D, vdim); in_proj_bias
  // (E + 2·Hkv·D); bias_k, bias_v (1, 1, Hkv·D); out_proj.weight (E, E), out_proj.bias (E).
  StateDict state_dict() const;
  // Every expected name with its shape; unknown or missing names are errors. Nothing changes on error.
  void load_state_dict(const StateDict& sd);
  void save(const std::string& path) const;  // safetensors
  void load(const std::string& path);

  // dout (the output's shape) -> gradients of query, key and value; adds into the parameter gradients.
  // Needs a training-mode forward; the attention runs sdpa_backward (flash for float32) from its LSE.
  MhaGrads backward(View<const float> dout);

  // Eval-mode incremental self-attention: x holds T new tokens ((T, N, E), (N, T, E) with batch_first, or
  // (T, E)); their K and V are appended to cache layer `layer` (B, Hkv, S_max, D), and each new token
  // attends to every cached token up to itself (bottom-right causal; one token takes the flash decode
  // path). Returns x's shape. Not with add_bias_kv, add_zero_attn, or kdim / vdim != E.
  Tensor forward_cached(View<const float> x, KVCache& cache, int64_t layer);

  // The dropout stream on the attention weights: the next forwards draw from `seed` (as Dropout::reseed).
  void reseed(uint64_t seed) override;
  // The next forwards' batches are batches b0... of a larger one: the dropout on the weights draws that
  // batch's mask for them (SdpaArgs::dropout_batch_offset; data-parallel training).
  void set_batch_offset(int64_t b0) override { dropout_batch_offset_ = b0; }

  const MhaOptions& options() const { return o_; }  // kdim, vdim, num_kv_heads resolved
  int64_t head_dim() const { return o_.embed_dim / o_.num_heads; }
  // The parameters and their gradients under their state_dict names, in PyTorch's order (nn.h).
  void parameters(std::vector<Param>& out, const std::string& prefix = "") override;

 private:
  // What a training forward keeps for backward(): the inputs and the forward's buffers.
  struct Saved {
    bool valid = false;
    bool seq_first = false;                  // buffers stored (T, B, C), else (B, T, C)
    Shape query_shape, key_shape, value_shape;
    Tensor xq, xk, xv;                       // the inputs, contiguous; xk / xv empty when given query's view
    Tensor q, k, v;                          // projections (B, L, E), (B, S', Hkv·D) ×2, in the input's layout
    Tensor ctx;                              // context (B, L, E), in the input's layout
    Tensor lse;                              // (B, H, L)
    SdpaArgs<float> args;                    // the forward's sdpa arguments: views of q, k, v and of the masks below
    Precision precision = Precision::f32;    // the forward's sdpa precision, the backward's too
    Tensor mask_bias, padding_bias;          // additive (or padded) mask copies
    TensorT<uint8_t> mask_bools, padding_bools;
    Tensor alibi_slopes;                     // copies of the variants' arrays, which args views
    std::vector<int64_t> document_ids;
  };

  MhaOptions o_;
  uint64_t dropout_seed_;       // advanced by every forward that applies dropout
  int64_t dropout_batch_offset_ = 0;
  Saved saved_;
  Tensor* owner_ = nullptr;  // during forward_self: the tensor query views, to keep instead of a copy
  Tensor in_proj_weight_;       // (3E, E) packed, or empty
  Tensor q_proj_weight_;        // (E, E)          } when not packed
  Tensor k_proj_weight_;        // (Hkv·D, kdim)   }
  Tensor v_proj_weight_;        // (Hkv·D, vdim)   }
  Tensor in_proj_bias_;         // (E + 2·Hkv·D), if bias
  Tensor out_proj_weight_;      // (E, E)
  Tensor out_proj_bias_;        // (E), if bias
  Tensor bias_k_, bias_v_;      // (1, 1, Hkv·D), if add_bias_kv
  // The gradients, same shapes (empty where the parameter is).
  Tensor in_proj_weight_grad_, q_proj_weight_grad_, k_proj_weight_grad_, v_proj_weight_grad_, in_proj_bias_grad_,
      out_proj_weight_grad_, out_proj_bias_grad_, bias_k_grad_, bias_v_grad_;
};

}  // namespace attn
