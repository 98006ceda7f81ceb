// A decoder-only Transformer (GPT, nanoGPT's shape): token + learned position embeddings, pre-norm
// blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> 4x GELU MLP -> residual), a final
// LayerNorm and an output head tied to the token embedding or not. Forward to logits, cross-entropy,
// backward through everything, and incremental decoding with a KV cache. The blocks are nn.h's
// TransformerEncoderLayer (norm_first, batch_first, causal); this file only composes them.
// Not a trainer (train.h) and not a tokenizer (tokenizer.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attn/fields.h"
#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/param.h"
#include "attn/sampling.h"
#include "attn/tensor.h"

namespace attn {

struct GptConfig {
  int64_t vocab_size = 0;   // V
  int64_t block_size = 64;  // longest context (the position table's size)
  int64_t n_layer = 2;
  int64_t n_head = 4;       // H
  int64_t n_kv_head = 0;    // Hkv (GQA when < H); 0 = H
  int64_t n_embd = 64;      // E
  double dropout = 0.0;     // embeddings, attention weights, residual branches and MLP
  bool bias = true;         // in Linear and LayerNorm layers (nanoGPT's `bias`)
  bool tie_weights = true;  // lm_head shares wte's matrix
  // How positions reach the attention: "learned" (wpe, a table of block_size rows: the model sees no
  // longer context), "rope" (rotary, theta 10000, on queries and keys) or "alibi" (BLOOM's slopes, a bias in
  // the kernel); rope and alibi have no table, so the model runs past block_size (`Gpt::forward` at any T).
  std::string position = "learned";
  int64_t window = 0;       // > 0: each query sees itself and the `window` keys before it (a sliding window)
};

// GptConfig's fields, each named once: config.json's "model" object (written, read and type-checked) and
// the Python binding (GPT's keyword arguments, GPT.config, attn.gpt_config) follow this list.
inline constexpr auto kGptConfigFields = std::tuple{
    ATTN_FIELD(GptConfig, vocab_size), ATTN_FIELD(GptConfig, block_size), ATTN_FIELD(GptConfig, n_layer),
    ATTN_FIELD(GptConfig, n_head),     ATTN_FIELD(GptConfig, n_kv_head),  ATTN_FIELD(GptConfig, n_embd),
    ATTN_FIELD(GptConfig, dropout),    ATTN_FIELD(GptConfig, bias),       ATTN_FIELD(GptConfig, tie_weights),
    ATTN_FIELD(GptConfig, position),   ATTN_FIELD(GptConfig, window)};

// Configurations by name, vocab_size left 0: "tiny" (2 layers, 4 heads, E 64, block 64: seconds to
// train), "nanogpt-cpu" (nanoGPT's shakespeare_char CPU run: 4 layers, 4 heads, E 128, block 64, no
// biases), "gpt2-small" (12 layers, 12 heads, E 768, block 1024: for benchmarks). Error for other names.
GptConfig gpt_config(const std::string& name);
std::vector<std::string> gpt_config_names();
// The configuration as Gpt builds it (n_kv_head 0 made n_head), checked before anything is allocated:
// sizes > 0, n_embd divisible by n_head, n_kv_head dividing n_head, dropout in [0, 1), and the parameters
// with their gradients fit in memory. An Error naming the field otherwise.
GptConfig check_gpt_config(GptConfig c);

// What a configuration needs before anything is allocated, in floating point so no size can wrap:
// its parameter count (as Gpt builds it, n_kv_head 0 meaning n_head), and the bytes one training step
// of (B, T) tokens needs: parameters, gradients and AdamW's two moments, plus the activations kept for
// backward (about 20·E floats per token and layer, and the logits with their gradient). Estimates for
// refusing what can't fit (check_fits_in_memory), not an allocator's accounting.
double gpt_parameter_estimate(const GptConfig& c);
double gpt_training_bytes_estimate(const GptConfig& c, double B, double T);

// Mean cross-entropy of logits (N, V) against targets (N) in [0, V), where target -1 is ignored (not
// counted in the mean; PyTorch's ignore_index). If dlogits (N, V) is given it receives dLoss/dlogits
// (0 on ignored rows). Returns 0 when every target is ignored.
float cross_entropy(View<const float> logits, const int64_t* targets, View<float> dlogits = {});
// The tokens a loss is averaged over: how many of targets[0, n) are scored (not -1).
int64_t scored_tokens(const int64_t* targets, int64_t n);
// The same for rows that are a share of a larger batch (data-parallel training): the sum of the row
// losses (not the mean), and dlogits = (softmax - onehot) / count, where count is the number of scored
// targets in the whole batch (0: these rows'), so each share's gradient is its part of the whole batch's.
// cross_entropy is float(cross_entropy_sum(logits, targets, dlogits) / these rows' count).
double cross_entropy_sum(View<const float> logits, const int64_t* targets, View<float> dlogits = {},
                         int64_t count = 0);

// ALiBi's slopes of H heads as BLOOM's build_alibi_tensor makes them (2^(-8(h+1)/H) for a power of two H).
Tensor alibi_slopes(int64_t H);

class Gpt : public Layer {
 public:
  // Weights as nanoGPT initialises them: N(0, 0.02) for matrices and embeddings, N(0, 0.02/sqrt(2·n_layer))
  // for the projections into the residual stream (attention out_proj, MLP linear2), biases 0, LayerNorm 1.
  Gpt(const GptConfig& config, uint64_t seed);

  // idx (B, T) token ids -> logits (B, T, V); T <= block_size with learned positions (any T with rope or
  // alibi). In training mode saves for backward().
  Tensor forward(const int64_t* idx, int64_t B, int64_t T);
  // Adds the gradients of the loss given dlogits (B, T, V) of the last forward.
  void backward(View<const float> dlogits);
  // forward, cross_entropy against targets (B, T) (-1 ignored), backward; returns the loss.
  // Gradients are added (call zero_grad() first, as in PyTorch).
  float forward_backward(const int64_t* idx, const int64_t* targets, int64_t B, int64_t T);
  // The same for B rows that are a share of a larger batch (data-parallel training): returns the sum of
  // the rows' losses, and each gradient is divided by `count`, the scored tokens of the whole batch
  // (cross_entropy_sum). forward_backward is float(this / count) with these rows' count.
  double forward_backward_sum(const int64_t* idx, const int64_t* targets, int64_t B, int64_t T, int64_t count);
  // Eval mode only: the mean loss without saving anything.
  float evaluate(const int64_t* idx, const int64_t* targets, int64_t B, int64_t T);

  // Incremental decoding (eval mode): idx (B, T) new tokens at positions cache.length(0)...; appends
  // their keys/values to `cache` and returns logits (B, T, V). length + T must stay <= block_size.
  Tensor forward_cached(const int64_t* idx, int64_t B, int64_t T, KVCache& cache);
  KVCache new_cache(int64_t B, KvDtype dtype = KvDtype::f32) const;  // n_layer layers of block_size tokens, Hkv heads

  // Per layer, the causal self-attention weights (B, H, T, T) for idx (B, T), computed in eval mode (the
  // mode is restored after).
  std::vector<Tensor> attention_weights(const int64_t* idx, int64_t B, int64_t T);

  // Layer::reseed(seed) sets the dropout seeds for the next forward, derived from `seed` (the trainer
  // passes f(run seed, step), so a resumed run draws the same masks as an uninterrupted one).
  // The next training forwards' rows are rows b0... of a larger batch (this process's share of it in
  // data-parallel training): every dropout draws the masks that the whole batch's forward would draw for
  // those rows. 0 (the default): the rows are the whole batch.
  void set_batch_offset(int64_t b0) override;

  // The parameters in the order backward() finishes their gradients, as groups: the untied lm_head,
  // ln_f, blocks n_layer-1 down to 0, then the embeddings (wte, wpe; a tied head adds into wte's).
  std::vector<std::vector<Param>> grad_groups();
  // If set, backward() calls it with a group's index in grad_groups() as soon as that group's gradients
  // are final: data-parallel training starts summing them across processes while the backward goes on.
  std::function<void(size_t group)> on_grads_final;

  // transformer.wte.weight, transformer.wpe.weight, transformer.h.<i>.<TransformerEncoderLayer names>,
  // transformer.ln_f.{weight,bias}, lm_head.weight (untied only).
  // (the children: wte, wpe, drop, h.<i>, ln_f, and lm_head when untied)
  std::vector<Child> children() override;
  void train(bool on = true) override;
  const GptConfig& config() const { return c_; }
  int64_t num_parameters();  // counting a tied matrix once

  Embedding wte, wpe;
  Dropout drop;
  std::vector<TransformerEncoderLayer> h;
  LayerNorm ln_f;
  Linear lm_head;  // (V, E) without bias; a (1, 1) placeholder, not a parameter, when tied

 private:
  View<const float> head_weight() const { return c_.tie_weights ? wte.weight.view() : lm_head.weight.view(); }
  Tensor embed(const int64_t* idx, int64_t B, int64_t T, int64_t pos0);  // (B, T, E)
  // What the blocks' attention gets from the configuration: the window, ALiBi's slopes, RoPE's rotation.
  AttnVariants variants();
  void rotate(View<float> x, int64_t heads, int64_t first, bool inverse);  // RoPE on (B, T, heads·D)

  GptConfig c_;
  Tensor alibi_slopes_;         // (H), position "alibi"
  std::unique_ptr<Rope> rope_;  // position "rope": its table grows to the longest sequence seen
  int64_t B_ = 0, T_ = 0;  // the last training forward's shape
  Tensor y_;               // (B·T, E): ln_f's output, the head's input
};

// Continues `prompt` (at least one token) one token at a time through the KV cache (sampling.h's loop).
// Once the context fills block_size, the cache is refilled from the last block_size/2 tokens (the position
// table ends there). Switches the model to eval mode. Returns only the new tokens.
std::vector<int64_t> generate(Gpt& model, const std::vector<int64_t>& prompt, const SampleOptions& options);

}  // namespace attn
