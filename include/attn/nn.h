// The nn layer: Linear, LayerNorm, Dropout, ReLU/GELU, Embedding, the feed-forward block and
// torch.nn.TransformerEncoderLayer / TransformerDecoderLayer, each with forward() and an explicit
// backward() (no autograd engine, as llm.c). PyTorch's constructor arguments, semantics and state_dict
// names. Not an optimizer, a loss or a model: those live in model/ and train/.
//
// The training contract, for every layer:
// - forward(x) in training mode (the default) saves what backward needs (a copy of x, per-row stats,
//   the dropout seed); in eval mode it saves nothing and applies no dropout.
// - backward(dout) takes dLoss/dOutput (the output's shape), ADDS the parameter gradients into the
//   Param::grad tensors (so several backward calls accumulate, as PyTorch's .grad does; zero_grad()
//   clears them) and returns dLoss/dInput, from the last training forward's saved state.
// - parameters(out, prefix) appends {name, value, grad} under PyTorch's state_dict names, in PyTorch's
//   order, so the optimizer and the safetensors checkpoint iterate one list (param.h).
//
// Shapes: x (..., F): any leading dims; a layer works on rows of its last dim. Inputs are read in place
// when contiguous, else copied once. Outputs are new contiguous tensors of the input's leading shape.
// A layer that saves its input for backward also takes it as a Tensor&& (a temporary nobody else reads):
// then it keeps that buffer instead of a copy. Outputs and gradients are allocated without a zero fill
// where every element is written.
// MultiheadAttention (mha.h) has the same contract: backward(dout) -> {dquery, dkey, dvalue}.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn/fields.h"
#include "attn/gemm.h"
#include "attn/gemv.h"
#include "attn/kv_cache.h"
#include "attn/mask.h"
#include "attn/mha.h"
#include "attn/param.h"
#include "attn/tensor.h"

namespace attn {

// ---- Shared math ----

// linear() and linear_backward() (gemm.h) are the projections' math, also for weight tying (an lm_head
// that reuses the embedding matrix).

// y += x, elementwise over equal shapes (a residual connection; its backward passes dy to both sides).
void add_(View<float> y, View<const float> x);

// ---- Layers ----

class Linear : public Layer {
 public:
  // torch.nn.Linear: weight (out, in) and bias (out) ~ U(-1/sqrt(in), 1/sqrt(in)).
  Linear(int64_t in_features, int64_t out_features, bool bias = true, uint64_t seed = 0);
  // Over given (pretrained) weights, possibly borrowed from a mapped file: weight (out, in), or (in, out)
  // with WeightLayout::in_out (GPT-2's Conv1D, read in place), bias (out) or empty. For inference: the
  // gradient buffers stay empty, and inputs of up to kGemvRows rows (a decode step) take linear_rows()
  // (gemv.h), which streams the weight once instead of packing it.
  Linear(Tensor weight, Tensor bias, WeightLayout layout = WeightLayout::out_in);
  Tensor forward(View<const float> x);      // (..., in) -> (..., out)
  Tensor forward(Tensor&& x);               // the same; when training, keeps x's buffer as the saved input
  Tensor backward(View<const float> dout);  // (..., out) -> (..., in)
  // add_bias_grad = false: bias_grad left alone, the caller has added it (ActivationLayer::backward_before).
  Tensor backward(View<const float> dout, bool add_bias_grad);
  void parameters(std::vector<Param>& out, const std::string& prefix = "") override;  // weight, bias
  // A bf16 copy of the weight (rounded once, to nearest even), which forward reads instead while a bf16
  // Autocast is alive: the same bits as rounding it in every product, half the bytes (a decode step's
  // linear_rows reads it too). For inference over weights that no longer change. A packed weight
  // (pack_weight) is packed again from the bf16 copy, its fp32 panels dropped.
  void use_bf16_weights();
  // Packs the weight (out, in) once as the GEMM's B panels (gemm.h PackedB; after use_bf16_weights, the bf16
  // copy's as gemm_bf16's, PackedB16), which products of more than kGemvRows rows read instead of packing it on
  // every call: one sentence's few rows spent most of their time there. The same bits, another copy of the
  // weight in memory. For an encoder's weights, which no longer change.
  void pack_weight();

  Tensor weight, bias;            // (out, in) (or (in, out): layout), (out) or empty
  Tensor weight_grad, bias_grad;  // same shapes
  WeightLayout layout = WeightLayout::out_in;

 private:
  Tensor run(View<const float> x, Tensor* owner);
  Tensor x_;  // (N, in): the saved input
  bool given_ = false;  // over given weights (inference): few rows take linear_rows()
  std::vector<uint16_t> weight16_;  // use_bf16_weights(): the weight's shape, or empty
  PackedB packed_;                   // pack_weight() of the fp32 weight, or empty
  PackedB16 packed16_;               // pack_weight() of weight16_, or empty
};

class LayerNorm : public Layer {
 public:
  // torch.nn.LayerNorm over the last dim: y = (x - mean) / sqrt(var + eps) · weight + bias, biased var.
  LayerNorm(int64_t normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  // Over given weights (F) and bias (F) or empty, for inference as Linear's.
  LayerNorm(Tensor weight, Tensor bias, double eps);
  Tensor forward(View<const float> x);      // (..., F) -> (..., F)
  Tensor backward(View<const float> dout);  // (..., F) -> (..., F)
  // The residual add before a norm and the gradient add after its backward, fused into the row passes
  // (the bits of add_ then forward / backward then add_):
  //   forward_add: x += residual (x contiguous, residual of x's shape), returns norm(x)
  //   backward_add: dx += backward(dout)
  Tensor forward_add(Tensor& x, View<const float> residual);
  void backward_add(View<const float> dout, Tensor& dx);
  void parameters(std::vector<Param>& out, const std::string& prefix = "") override;  // weight, bias

  Tensor weight, bias;            // (F) ones / zeros, or empty
  Tensor weight_grad, bias_grad;
  double eps;

 protected:
  bool rms_ = false;  // RMSNorm's forward

 private:
  Tensor run(View<const float> x, View<const float> add);
  void run_backward(View<const float> dout, float* dx, bool accumulate);
  Tensor xhat_;  // (N, F): (x - mean) · rstd
  Tensor rstd_;  // (N)
};

// RMSNorm over the last dim (transformers' LlamaRMSNorm, torch.nn.RMSNorm): y = x / sqrt(mean(x²) + eps)
// · weight, LayerNorm's row passes without the mean. Over given (pretrained) weights (F), for inference:
// backward is an Error.
class RMSNorm : public LayerNorm {
 public:
  RMSNorm(Tensor weight, double eps);
};

// Rotary position embedding (RoFormer) in transformers' rotate-half convention: a head vector x (D) at
// position p becomes x·cos(p·f) + rotate_half(x)·sin(p·f), rotate_half(x) = (-x[D/2:], x[:D/2]), with
// f_i = theta^(-2i/D) for i < D/2 repeated over both halves. The cos/sin tables are float32, computed as
// transformers computes them (float32 frequencies and angles), for the positions used so far: a table
// grows (doubling, at most to max_positions) when a call reaches past it, so a model that allows 2^26
// positions costs what its inputs use, not 4 GB before the first token. Not the scaled variants
// (rope_scaling).
class Rope {
 public:
  Rope(int64_t head_dim, double theta, int64_t max_positions);  // computes nothing yet
  // Rotates in place the heads of T rows: row t's head h is x[t·row_stride + h·D ... + D), at position
  // pos[t] in [0, max_positions). inverse: the transposed rotation (by -angle), which takes a gradient with
  // respect to rotated vectors back to the vectors before it (the rotation is orthogonal). Thread-safe (calls
  // that grow the table take its lock alone).
  void apply(float* x, int64_t T, int64_t row_stride, int64_t heads, const int64_t* pos, bool inverse = false) const;
  int64_t head_dim() const { return D_; }
  int64_t max_positions() const { return P_; }

 private:
  int64_t D_, P_;
  double theta_;
  struct Table;
  std::shared_ptr<Table> table_;  // cos and sin (rows, D/2), rows <= P
};

// Zeroes each element with probability p in training mode and scales the rest by 1/(1 - p), as
// torch.nn.Dropout; the keep bit of element i is rng.h's dropout_keep(seed, i), and each training
// forward takes the next seed, so backward recomputes the mask instead of storing it.
class Dropout : public Layer {
 public:
  explicit Dropout(double p = 0.5, uint64_t seed = 0);
  // The next forward draws as a fresh Dropout(p, seed) would (per-step streams for a bit-exact resume).
  void reseed(uint64_t seed) override;
  // The next forwards' inputs are rows b0... (along dim 0) of a larger batch: element i draws the keep bit
  // of element b0·(numel / size(0)) + i of the whole, so a share of a batch gets the whole batch's mask.
  void set_batch_offset(int64_t b0) override { batch_offset_ = b0; }
  Tensor forward(View<const float> x);      // a new tensor, also when it is a copy (eval mode, p = 0)
  Tensor backward(View<const float> dout);
  // Inside a composite layer: x itself (no copy) where dropout is the identity (p = 0 or eval mode),
  // else forward(x); and dout itself where p = 0, else backward(dout).
  Tensor apply(Tensor&& x);
  Tensor apply_backward(Tensor&& dout);
  void parameters(std::vector<Param>&, const std::string& = "") override {}
  double p;

 private:
  uint64_t seed_;       // the next forward's seed
  uint64_t last_seed_;  // the last training forward's seed
  int64_t batch_offset_ = 0;
  uint64_t last_index0_ = 0;  // the last training forward's first element index
  bool saved_ = false;
};

enum class Activation { relu, gelu, gelu_tanh };  // gelu is the exact erf form (PyTorch's default)
// "relu", "gelu" or "gelu_tanh" (also "tanh" for the approximation); anything else is an Error.
Activation parse_activation(const std::string& name);
const char* to_string(Activation a);

// ReLU / GELU as a layer: saves its input when training.
class ActivationLayer : public Layer {
 public:
  explicit ActivationLayer(Activation kind) : kind(kind) {}
  Tensor forward(View<const float> x);
  Tensor forward(Tensor&& x);  // training: keeps x's buffer as the saved input; eval: writes y over it
  Tensor backward(View<const float> dout);
  Tensor backward(Tensor&& dout);  // writes dx over dout's buffer (elementwise, so in place is exact)
  // backward(dout) for an activation after `linear` (which has a bias): also adds linear's bias gradient,
  // the column sums of the result, in the same pass; then linear.backward(result, false) has the bits
  // of linear.backward(result).
  Tensor backward_before(Linear& linear, Tensor&& dout);
  void parameters(std::vector<Param>&, const std::string& = "") override {}
  Activation kind;

 private:
  Tensor run(View<const float> x, Tensor* owner);
  Tensor run_backward(View<const float> dout, Tensor* owner, float* bias_grad = nullptr);
  Tensor x_;
};
struct ReLU : ActivationLayer {
  ReLU() : ActivationLayer(Activation::relu) {}
};
struct GELU : ActivationLayer {  // approximate: "none" (erf) or "tanh", as torch.nn.GELU
  explicit GELU(const std::string& approximate = "none");
};

// torch.nn.Embedding: weight (num_embeddings, embedding_dim) ~ N(0, 1).
class Embedding : public Layer {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, uint64_t seed = 0);
  explicit Embedding(Tensor weight);  // over a given (V, E) table, for inference as Linear's
  // ids: `shape`'s numel indices in [0, num_embeddings), contiguous -> (shape..., embedding_dim).
  Tensor forward(const int64_t* ids, const Shape& shape);
  // dout (shape..., embedding_dim): scatter-adds into weight_grad. The ids have no gradient.
  void backward(View<const float> dout);
  void parameters(std::vector<Param>& out, const std::string& prefix = "") override;  // weight

  Tensor weight, weight_grad;  // (num_embeddings, embedding_dim)

 private:
  std::vector<int64_t> ids_;  // the last training forward's indices
  Shape saved_shape_;         // its output shape (shape..., embedding_dim)
};

// The Transformer's feed-forward block: linear1 -> activation -> dropout -> linear2, with PyTorch's
// names (linear1.weight, ... directly under the prefix, as in TransformerEncoderLayer).
class FeedForward : public Layer {
 public:
  FeedForward(int64_t d_model, int64_t dim_feedforward, Activation activation = Activation::relu,
              double dropout = 0.1, bool bias = true, uint64_t seed = 0);
  Tensor forward(View<const float> x);      // (..., d_model) -> (..., d_model)
  Tensor backward(View<const float> dout);
  std::vector<Child> children() override;  // linear1, linear2, activation, dropout (stream 0)

  Linear linear1, linear2;
  ActivationLayer activation;
  Dropout dropout;
};

// ---- Transformer layers ----

// torch.nn.TransformerEncoderLayer / TransformerDecoderLayer's constructor arguments, plus ours.
struct TransformerOptions {
  int64_t d_model = 0;
  int64_t nhead = 1;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;                     // residual dropouts, the FFN's, and the attention weights'
  Activation activation = Activation::relu;
  double layer_norm_eps = 1e-5;
  bool batch_first = false;                 // (N, L, E) instead of (L, N, E)
  bool norm_first = false;                  // pre-LN: x + f(norm(x)); else post-LN: norm(x + f(x))
  bool bias = true;                         // Linear, LayerNorm and MHA biases
  int64_t num_kv_heads = 0;                 // GQA for the attention; 0 = nhead
  uint64_t seed = 0;                        // initialisation and dropout
};

// TransformerOptions' fields in order, named as torch.nn.TransformerEncoderLayer's arguments: the Python
// constructors and their defaults are made from this list (python/bind_nn.cpp).
inline constexpr auto kTransformerOptionsFields = std::tuple{
    ATTN_FIELD(TransformerOptions, d_model),        ATTN_FIELD(TransformerOptions, nhead),
    ATTN_FIELD(TransformerOptions, dim_feedforward), ATTN_FIELD(TransformerOptions, dropout),
    ATTN_FIELD(TransformerOptions, activation),     ATTN_FIELD(TransformerOptions, layer_norm_eps),
    ATTN_FIELD(TransformerOptions, batch_first),    ATTN_FIELD(TransformerOptions, norm_first),
    ATTN_FIELD(TransformerOptions, bias),           ATTN_FIELD(TransformerOptions, num_kv_heads),
    ATTN_FIELD(TransformerOptions, seed)};

// Masks as in torch: bool True = masked out (Mask::drop), float = added. They are copied when training.
struct EncoderArgs {
  Mask<float> src_mask;              // (L, L) or (N·nhead, L, L)
  Mask<float> src_key_padding_mask;  // (N, L)
  bool is_causal = false;            // top-left causal, on its own or with src_mask
  AttnVariants variants = {};        // window, ALiBi, softcap, documents (mha.h), for the self-attention
};

struct DecoderArgs {
  Mask<float> tgt_mask;                 // (L, L) or (N·nhead, L, L)
  Mask<float> memory_mask;              // (L, S) or (N·nhead, L, S)
  Mask<float> tgt_key_padding_mask;     // (N, L)
  Mask<float> memory_key_padding_mask;  // (N, S)
  bool tgt_is_causal = false;
  bool memory_is_causal = false;
};

class TransformerEncoderLayer : public Layer {
 public:
  explicit TransformerEncoderLayer(const TransformerOptions& options);
  // src (L, N, E), (N, L, E) with batch_first, or unbatched (L, E) -> same shape.
  Tensor forward(View<const float> src, const EncoderArgs& args = {});
  Tensor backward(View<const float> dout);  // -> dsrc
  Tensor backward(Tensor&& dout);           // the same; pre-LN accumulates dsrc over dout's buffer
  // Eval-mode incremental decoding: x holds the T new tokens (layout as forward), attending to
  // themselves and every token already in cache layer `layer` (bottom-right causal); appends their K/V.
  Tensor forward_cached(View<const float> x, KVCache& cache, int64_t layer, const AttnVariants& variants = {});
  // Eval mode: the self-attention's weights per head on src (after norm1 when pre-LN), (N, H, L, L)
  // (unbatched: (H, L, L)), with forward()'s masks.
  Tensor attention_weights(View<const float> src, const EncoderArgs& args = {});
  // self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*; reseed streams: dropout1 2, dropout2 3, the
  // FeedForward's dropout 4, the attention's 5 (the GPT's since its first checkpoints)
  std::vector<Child> children() override;

  TransformerOptions options;
  MultiheadAttention self_attn;
  FeedForward ff;  // linear1, activation, dropout, linear2
  LayerNorm norm1, norm2;
  Dropout dropout1, dropout2;

 private:
  Tensor run_backward(View<const float> dout, Tensor* owner);
};

struct DecoderGrads {
  Tensor dtgt;     // tgt's shape
  Tensor dmemory;  // memory's shape
};

class TransformerDecoderLayer : public Layer {
 public:
  explicit TransformerDecoderLayer(const TransformerOptions& options);
  // tgt (L, N, E), memory (S, N, E) (batch_first: (N, ., E); unbatched: (., E)) -> tgt's shape.
  Tensor forward(View<const float> tgt, View<const float> memory, const DecoderArgs& args = {});
  DecoderGrads backward(View<const float> dout);
  // self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1.*, norm2.*, norm3.*
  std::vector<Child> children() override;

  TransformerOptions options;
  MultiheadAttention self_attn, multihead_attn;
  FeedForward ff;
  LayerNorm norm1, norm2, norm3;
  Dropout dropout1, dropout2, dropout3;
};

}  // namespace attn
