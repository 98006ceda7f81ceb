// Hugging Face model directories (config.json + model.safetensors, or shards listed in
// model.safetensors.index.json) loaded onto attn's own layers (nn.h) and attention (sdpa.h), for
// inference. Float32 weights are used in place from the mapped files (safetensors.h's MappedSafetensors);
// other dtypes are converted once. Architectures: BertModel (BERT, MiniLM: post-LN encoder); the decoders
// GPT2LMHeadModel (hf_gpt2.cpp), LlamaForCausalLM and its kin MistralForCausalLM, Qwen2ForCausalLM,
// Gemma2ForCausalLM (RMSNorm, RoPE, gated MLP, GQA, sliding windows, softcaps: hf_llama.cpp) and
// BloomForCausalLM (ALiBi, hf_bloom.cpp), each with a KV cache and generate(); the encoder-decoders
// T5ForConditionalGeneration (hf_t5.cpp) and BartForConditionalGeneration (hf_bart.cpp) on what they share
// (hf_seq2seq.cpp: the encoder once, cross-attention K/V once, the decoder's KV cache). Attention variants
// (windows, softcaps, ALiBi, T5's relative bias) run in the kernels (LayerAttention). A config.json field the
// new loaders do not implement is refused by name.
// Not a trainer (no backward here), not a hub client (a local directory only), and not a tokenizer
// (hf_tokenizer.h).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/hf_tokenizer.h"
#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/sampling.h"
#include "attn/safetensors.h"
#include "attn/tensor.h"

namespace attn {

// The safetensors files of a model directory, mapped, and their tensors by name. A directory holds
// model.safetensors, or model.safetensors.index.json whose "weight_map" names a shard per tensor.
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  bool contains(const std::string& name) const;
  // An Error unless a tensor `name` is here; `because` says what asks for it (a config field and its file),
  // before anything is sized by that field.
  void expect(const std::string& name, const std::string& because) const;
  // The tensor `name` with shape `want` (a view of the file when F32), or an Error naming the tensor and
  // both shapes, or the missing tensor and the file(s) searched.
  Tensor get(const std::string& name, const Shape& want) const;
  // The Linear `name`: `name`.weight (out, in) (or (in, out) as `layout` says) and, with `bias`, `name`.bias
  // (out); a wrong weight is the error named first.
  Linear linear(const std::string& name, int64_t out, int64_t in, bool bias = true,
                WeightLayout layout = WeightLayout::out_in) const;
  // The LayerNorm `name`: `name`.weight and `name`.bias, both (E).
  LayerNorm layer_norm(const std::string& name, int64_t E, double eps) const;
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<MappedSafetensors> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

struct BertConfig {
  int64_t vocab_size = 0;               // V
  int64_t hidden_size = 0;              // E
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;      // H
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t type_vocab_size = 0;
  double layer_norm_eps = 1e-12;
  int64_t pad_token_id = 0;
};

// A loaded model. forward's ids are (B, L) token ids; attention_mask (B, L) is 1 for a token and 0 for
// padding (null: all tokens), any pattern, as in transformers. Padding costs no work: the tokens of all
// sequences are packed into one (T, E) matrix for every row-wise layer, attention runs per sequence over
// its own tokens, and padded positions of the result are 0 (transformers computes values there that
// nothing should read).
class PretrainedModel {
 public:
  virtual ~PretrainedModel() = default;
  // What its matmuls multiply in (gemm.h Precision: an Autocast around each forward: every Linear of either
  // weight layout, and sdpa's flash products); sums, attention weights, norms and the softmax stay fp32.
  // Loaded in bf16, each Linear's weight is rounded to bf16 once (Linear::use_bf16_weights): the GEMMs'
  // bits are unchanged by it, and the few-row products of a decode step (gemv.h's linear_rows, fp32 FMAs
  // over the widened weight) read half the bytes.
  Precision precision = Precision::f32;
  virtual std::string architecture() const = 0;
  virtual int64_t hidden_size() const = 0;  // E
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_layers() const = 0;
  virtual int64_t num_heads() const = 0;    // H
  // The longest sequence the position embeddings allow (0: no limit).
  virtual int64_t max_positions() const = 0;
  // An encoder's last hidden state (B, L, E); a decoder's logits (B, L, V).
  virtual Tensor forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) = 0;
  // The last hidden state (B, L, E), what sentence embeddings pool: an encoder's forward; a decoder's
  // final norm before its lm_head (transformers' GPT2Model and LlamaModel give it as last_hidden_state).
  virtual Tensor hidden_states(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) = 0;
  // Per layer, the attention weights (B, H, L, L) of the same forward (0 on padded rows and columns).
  virtual std::vector<Tensor> attention_weights(const int64_t* ids, int64_t B, int64_t L,
                                                const int64_t* attention_mask = nullptr) = 0;
  // Every Linear it holds (Pretrained::load in bf16 gives each bf16 weights: Linear::use_bf16_weights).
  virtual std::vector<Linear*> linears() = 0;
};

// BERT's encoder (transformers' BertModel, without the pooler): word + absolute position + token type
// embeddings and LayerNorm, then per layer x = LN(x + attn(x)); x = LN(x + W2·gelu(W1·x)), exact GELU.
class BertModel : public PretrainedModel {
 public:
  // Reads config.json and the weights of `dir`; names may carry transformers' "bert." prefix.
  explicit BertModel(const std::string& dir);
  BertModel(const BertConfig& config, const HfWeights& weights);
  std::string architecture() const override { return "BertModel"; }
  int64_t hidden_size() const override { return c_.hidden_size; }
  int64_t vocab_size() const override { return c_.vocab_size; }
  int64_t num_layers() const override { return c_.num_hidden_layers; }
  int64_t num_heads() const override { return c_.num_attention_heads; }
  int64_t max_positions() const override { return c_.max_position_embeddings; }
  const BertConfig& config() const { return c_; }
  Tensor forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) override;
  Tensor hidden_states(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) override {
    return forward(ids, B, L, attention_mask);
  }
  std::vector<Tensor> attention_weights(const int64_t* ids, int64_t B, int64_t L,
                                        const int64_t* attention_mask = nullptr) override;
  // The same with token type ids (B, L) (null: all 0).
  Tensor forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask,
                 const int64_t* token_type_ids);

  struct Layer {
    Linear query, key, value, attn_out;  // (E, E) each
    LayerNorm attn_norm;
    Linear intermediate, output;         // (I, E), (E, I)
    LayerNorm out_norm;
  };
  std::vector<Linear*> linears() override;

 private:
  Tensor run(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask, const int64_t* types,
             std::vector<Tensor>* weights);
  BertConfig c_;
  Embedding word_, position_, token_type_;
  LayerNorm embed_norm_;
  ActivationLayer act_{Activation::gelu};
  std::vector<Layer> layers_;
};

// How one layer's attention differs from plain softmax(q·kᵀ/sqrt(D))·v, as the architecture's config says:
// the SdpaArgs variants it sets (attn/kernels/problem.h), run inside the flash kernels, never as dense masks.
struct LayerAttention {
  std::optional<double> scale;        // default 1/sqrt(D); T5: 1; Gemma 2: query_pre_attn_scalar^-1/2
  int64_t sliding_window = 0;         // > 0: a query sees its last sliding_window keys, itself included
                                      // (Mistral's, Qwen2's, Gemma 2's sliding layers); the KV cache keeps those
  double softcap = 0;                 // > 0: scores softcap·tanh(x/softcap) (Gemma 2's attn_logit_softcapping)
  View<const float> alibi_slopes;     // (H): BLOOM's ALiBi
  RelativeBias<float> relative_bias;  // T5's table (num_buckets, H)
};

// What every decoder's config.json gives (the names differ per architecture).
struct DecoderConfig {
  int64_t vocab_size = 0;    // V
  int64_t hidden_size = 0;   // E
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // H
  int64_t num_kv_heads = 0;  // Hkv (GQA when < H, MQA when 1)
  int64_t head_dim = 0;      // D
  int64_t intermediate_size = 0;
  int64_t max_positions = 0;  // the position table (GPT-2), max_position_embeddings (RoPE), 0: none (ALiBi)
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  std::vector<int64_t> eos_token_ids;  // generation_config.json's, else config.json's (none: no stop)
};

// A decoder-only language model on attn's layers: forward() gives logits; forward_cached() continues a
// KV cache (prefill, then a token per step), each layer's K/V appended and attended with bottom-right
// causal alignment. With an attention_mask, forward packs the kept tokens as BertModel does (padding costs
// nothing, its logits are 0); a kept token sees the kept tokens at or before its position, and positions
// are 0..L-1 by index (transformers' default position ids). The architecture supplies the parts below,
// and each layer's attention variants (attention()): a sliding layer's cache keeps its last W tokens only.
class PretrainedDecoder : public PretrainedModel {
 public:
  int64_t hidden_size() const override { return c_.hidden_size; }
  int64_t vocab_size() const override { return c_.vocab_size; }
  int64_t num_layers() const override { return c_.num_layers; }
  int64_t num_heads() const override { return c_.num_heads; }
  int64_t max_positions() const override { return c_.max_positions; }
  const DecoderConfig& decoder_config() const { return c_; }
  // logits (B, L, V)
  Tensor forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) override;
  // final_norm's output (B, L, E), 0 at padded positions
  Tensor hidden_states(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) override;
  // Per layer (B, H, L, L), causal; 0 on padded rows and columns.
  std::vector<Tensor> attention_weights(const int64_t* ids, int64_t B, int64_t L,
                                        const int64_t* attention_mask = nullptr) override;
  // ids (B, T) at positions cache.length(0)...: appends their K/V to `cache` and returns their logits
  // (B, T, V), or only the last token's (B, 1, V) when last_only (a prefill's lm_head on one row).
  Tensor forward_cached(const int64_t* ids, int64_t B, int64_t T, KVCache& cache, bool last_only = false);
  // num_layers layers of `capacity` tokens (0: max_positions, which must then be given), Hkv heads of D;
  // a sliding layer keeps only its window (so a model whose every layer slides decodes past `capacity`).
  KVCache new_cache(int64_t B, int64_t capacity = 0, KvDtype dtype = KvDtype::f32) const;
  // Layer i's attention variants.
  virtual LayerAttention attention(int64_t layer) const { return {}; }

  // Attention of a layer's queries q (T, H·D) over keys k and values v (T, Hkv·D), rows of strided
  // matrices (unit column stride) -> ctx (T, H·D) contiguous. The decoder runs it per packed sequence or
  // over a KV cache; the architecture's layer() calls it between its projections.
  using Attend = std::function<Tensor(View<const float> q, View<const float> k, View<const float> v)>;

 protected:
  explicit PretrainedDecoder(const DecoderConfig& c) : c_(c) {}
  // Token + position embeddings of T rows (token tok[t] at position pos[t]) -> (T, E).
  virtual Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T) = 0;
  // Layer i over the residual stream x (T, E), updated in place; pos (T) as embed's.
  virtual void layer(int64_t i, Tensor& x, const int64_t* pos, const Attend& attend) = 0;
  // The final norm: x (N, E) -> (N, E).
  virtual Tensor final_norm(View<const float> x) = 0;
  // The final norm and the lm_head: x (N, E) -> logits (N, V).
  virtual Tensor head(View<const float> x) = 0;
  DecoderConfig c_;

 private:
  // logits, or with hidden the final norm's output, or (weights) each layer's attention weights
  Tensor run(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask, std::vector<Tensor>* weights,
             bool hidden = false);
};

// transformers' GPT2LMHeadModel: wte + learned wpe, per layer x += attn(ln_1(x)); x += mlp(ln_2(x)) with
// Conv1D weights read in place in their (in, out) layout, gelu_new (tanh GELU); ln_f; lm_head tied to wte.
class Gpt2Model : public PretrainedDecoder {
 public:
  explicit Gpt2Model(const std::string& dir);
  std::string architecture() const override { return "GPT2LMHeadModel"; }

  struct Layer {
    LayerNorm ln_1;
    Linear c_attn, c_proj;  // (E, 3E), (E, E): in, out
    LayerNorm ln_2;
    Linear c_fc, mlp_proj;  // (E, I), (I, E): in, out
  };
  std::vector<Linear*> linears() override;

 protected:
  Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T) override;
  void layer(int64_t i, Tensor& x, const int64_t* pos, const Attend& attend) override;
  Tensor final_norm(View<const float> x) override;
  Tensor head(View<const float> x) override;

 private:
  Gpt2Model(const std::pair<DecoderConfig, Activation>& c, const HfWeights& w);
  Embedding wte_, wpe_;
  std::vector<Layer> layers_;
  LayerNorm ln_f_;
  ActivationLayer act_;
  Linear lm_head_;  // over wte (V, E), or lm_head.weight when untied
};

// What distinguishes the Llama family's members (read from config.json by hf_llama.cpp).
struct LlamaVariant {
  std::string architecture = "LlamaForCausalLM";
  double rope_theta = 10000.0;
  bool qkv_bias = false, o_bias = false, mlp_bias = false;  // Qwen2: q/k/v biases; Llama: attention_bias, mlp_bias
  Activation gate_act = Activation::gelu_tanh;  // Gemma 2's; silu (the others) when silu is true
  bool silu = true;
  bool gemma = false;          // Gemma 2: RMSNorm (1 + weight), post-attention and pre/post-feedforward norms
  float embed_scale = 1.0f;    // Gemma 2: the embeddings times float32(sqrt(E))
  double final_softcap = 0;    // Gemma 2's final_logit_softcapping of the logits
  std::vector<LayerAttention> attention;  // per layer: scale, sliding window, softcap
};

// transformers' LlamaForCausalLM and the decoders built like it: embed_tokens, per layer
// x += o_proj(attn(rope(q), rope(k), v)) over input_layernorm(x) (RMSNorm), x += down_proj(act(gate_proj(h)) ·
// up_proj(h)) over post_attention_layernorm(x); norm; lm_head (untied unless tie_word_embeddings). GQA through
// num_key_value_heads; RoPE with rope_theta (rope_type "default" only). The members:
// - MistralForCausalLM: every layer a sliding window of sliding_window keys (its KV cache keeps only those);
// - Qwen2ForCausalLM: q/k/v biases; sliding windows on the layers layer_types (or use_sliding_window and
//   max_window_layers) name;
// - Gemma2ForCausalLM: RMSNorm times (1 + weight), the attention output and the MLP each normed before the
//   residual (post_attention_layernorm, pre_/post_feedforward_layernorm), GeGLU (gelu_pytorch_tanh), the
//   embeddings scaled by sqrt(E), scores scaled by query_pre_attn_scalar^-1/2 and softcapped
//   (attn_logit_softcapping), alternating sliding/global layers (layer_types), logits softcapped
//   (final_logit_softcapping); head tied.
// A config.json field outside what the loader reads and the fields no architecture's function depends on
// (ids, dtype, dropout rates) is refused by name.
class LlamaModel : public PretrainedDecoder {
 public:
  explicit LlamaModel(const std::string& dir);
  std::string architecture() const override { return v_.architecture; }
  LayerAttention attention(int64_t layer) const override { return v_.attention.at(size_t(layer)); }
  const LlamaVariant& variant() const { return v_; }

  struct Layer {
    RMSNorm input_norm;
    Linear q_proj, k_proj, v_proj, o_proj;  // (H·D, E), (Hkv·D, E) x2, (E, H·D)
    RMSNorm post_norm;                      // Gemma 2: post_attention_layernorm is after attention, before the add
    Linear gate_proj, up_proj, down_proj;   // (I, E) x2, (E, I)
    std::vector<RMSNorm> ff_norms;          // Gemma 2: pre_feedforward_layernorm, post_feedforward_layernorm
  };
  std::vector<Linear*> linears() override;

 protected:
  Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T) override;
  void layer(int64_t i, Tensor& x, const int64_t* pos, const Attend& attend) override;
  Tensor final_norm(View<const float> x) override;
  Tensor head(View<const float> x) override;

 private:
  LlamaModel(const std::string& dir, const HfWeights& w);
  LlamaModel(const std::pair<DecoderConfig, LlamaVariant>& c, const HfWeights& w);
  LlamaVariant v_;
  Embedding embed_tokens_;
  std::vector<Layer> layers_;
  RMSNorm norm_;
  Linear lm_head_;
  Rope rope_;
  ActivationLayer act_;
};

// transformers' BloomForCausalLM: word_embeddings and word_embeddings_layernorm, per layer the fused
// query_key_value projection (heads of (q, k, v) triples), ALiBi (the slopes of _get_alibi_slopes, no
// position embeddings, so no position limit), x += dense(attn(input_layernorm(x))), x += mlp(post_attention_
// layernorm(x)) with BLOOM's tanh GELU (or the layer norms' outputs as the residuals when
// apply_residual_connection_post_layernorm); ln_f; lm_head tied to word_embeddings.
class BloomModel : public PretrainedDecoder {
 public:
  explicit BloomModel(const std::string& dir);
  std::string architecture() const override { return "BloomForCausalLM"; }
  LayerAttention attention(int64_t) const override;

  struct Layer {
    LayerNorm input_norm;
    Linear qkv, dense;                     // (3E, E), (E, E)
    LayerNorm post_norm;
    Linear dense_h_to_4h, dense_4h_to_h;   // (4E, E), (E, 4E)
  };
  std::vector<Linear*> linears() override;

 protected:
  Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T) override;
  void layer(int64_t i, Tensor& x, const int64_t* pos, const Attend& attend) override;
  Tensor final_norm(View<const float> x) override;
  Tensor head(View<const float> x) override;

 private:
  BloomModel(const std::pair<DecoderConfig, bool>& c, const HfWeights& w);
  bool residual_post_ln_;
  Embedding word_;
  LayerNorm embed_norm_;
  std::vector<Layer> layers_;
  LayerNorm ln_f_;
  Linear lm_head_;
  ActivationLayer act_{Activation::gelu_tanh};
  std::vector<float> slopes_;  // (H)
};

// Continues `prompt` through the decoder's KV cache with sampling.h's loop (a cache of prompt +
// max_new_tokens tokens, at most max_positions). It stops at options.eos_token_ids: pass the model's
// decoder_config().eos_token_ids to stop as transformers does. Returns only the new tokens.
std::vector<int64_t> generate(PretrainedDecoder& model, const std::vector<int64_t>& prompt,
                              const SampleOptions& options);

// What an encoder-decoder's config.json (and generation_config.json) give.
struct Seq2SeqConfig {
  int64_t vocab_size = 0;       // V
  int64_t hidden_size = 0;      // E
  int64_t encoder_layers = 0, decoder_layers = 0;
  int64_t num_heads = 0;        // H (both sides; Hkv = H)
  int64_t head_dim = 0;         // D (T5's d_kv; H·D need not be E)
  int64_t ffn_size = 0;
  int64_t max_positions = 0;    // BART's position table; 0: none (T5's relative positions)
  double norm_eps = 1e-5;
  int64_t decoder_start_token_id = 0;  // the target's first token
  std::vector<int64_t> eos_token_ids;
  int64_t forced_bos_token_id = -1;    // generate: the first new token, when >= 0 (BART's)
  int64_t forced_eos_token_id = -1;    // generate: the last new token at max_new_tokens, when >= 0 (BART's)
};

// An encoder-decoder (sequence-to-sequence) model on attn's layers: the encoder runs once over the source
// (packed: padding costs nothing), each decoder layer's cross-attention K/V are projected from its output
// once (encode()), and the decoder continues a self-attention KV cache over them a token at a time
// (decode()), its queries cross-attending to their own source's tokens. forward() is the encoder's last
// hidden state (B, S, E), attention_weights() its self-attention.
class PretrainedSeq2Seq : public PretrainedModel {
 public:
  int64_t hidden_size() const override { return c_.hidden_size; }
  int64_t vocab_size() const override { return c_.vocab_size; }
  int64_t num_layers() const override { return c_.encoder_layers; }
  int64_t num_heads() const override { return c_.num_heads; }
  int64_t max_positions() const override { return c_.max_positions; }
  const Seq2SeqConfig& seq2seq_config() const { return c_; }

  // The source once: its packing, the encoder's output and every decoder layer's cross-attention K/V.
  struct Encoded {
    int64_t B = 0, S = 0;
    std::vector<int64_t> off;               // (B + 1): source b is packed rows [off[b], off[b+1])
    std::vector<int64_t> row_of;            // (B·S): the packed row of (b, s), or -1 (padding)
    std::vector<int64_t> pos;               // (N): the source position of each packed row
    Tensor states;                          // (N, E): the encoder's last hidden state, packed
    std::vector<Tensor> cross_k, cross_v;   // per decoder layer (N, H·D)
  };
  // ids (B, S) and attention_mask (B, S) (null: every token).
  Encoded encode(const int64_t* ids, int64_t B, int64_t S, const int64_t* attention_mask = nullptr,
                 std::vector<Tensor>* weights = nullptr);
  // Target ids (B, T) at positions cache.length(0)... after the encoded source: appends their self-attention
  // K/V to `cache` and returns their logits (B, T, V) (last_only: (B, 1, V)). weights: null, or per decoder
  // layer the self-attention (B, H, T, S_cache) and cross-attention (B, H, T, S) weights of this call.
  Tensor decode(const Encoded& source, const int64_t* ids, int64_t B, int64_t T, KVCache& cache,
                bool last_only = false, std::vector<Tensor>* self_weights = nullptr,
                std::vector<Tensor>* cross_weights = nullptr);
  // decoder_layers layers of `capacity` tokens (0: max_positions).
  KVCache new_cache(int64_t B, int64_t capacity, KvDtype dtype = KvDtype::f32) const;
  // Teacher-forced logits (B, T, V) of target ids (B, T) after source ids (B, S) (mask: null, every token).
  Tensor logits(const int64_t* source, int64_t B, int64_t S, const int64_t* source_mask, const int64_t* target,
                int64_t T);
  // The three kinds of weights of one source (B = 1 of S tokens) and target (T tokens), per layer:
  // encoder self (1, H, S, S), decoder self (1, H, T, T), cross (1, H, T, S).
  struct Weights {
    std::vector<Tensor> encoder, decoder, cross;
  };
  Weights all_attention_weights(const int64_t* source, int64_t S, const int64_t* target, int64_t T);

  Tensor forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) override;
  // The encoder's last hidden state: forward's.
  Tensor hidden_states(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) override {
    return forward(ids, B, L, attention_mask);
  }
  std::vector<Tensor> attention_weights(const int64_t* ids, int64_t B, int64_t L,
                                        const int64_t* attention_mask = nullptr) override;
  // Layer i's self-attention variants on each side (cross-attention: scale only, as the decoder's).
  virtual LayerAttention encoder_attention(int64_t) const { return {}; }
  virtual LayerAttention decoder_attention(int64_t) const { return {}; }

  // Cross-attention of queries q (T, H·D) over the encoded source: ctx (T, H·D).
  using CrossAttend = std::function<Tensor(View<const float> q)>;
  using Attend = PretrainedDecoder::Attend;

 protected:
  explicit PretrainedSeq2Seq(const Seq2SeqConfig& c) : c_(c) {}
  // Source or target embeddings (with positions where the architecture has them) -> (T, E).
  virtual Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T, bool decoder) = 0;
  virtual void encoder_layer(int64_t i, Tensor& x, const Attend& attend) = 0;
  // The encoder's final norm over its last layer's output (in place).
  virtual void encoder_end(Tensor& x) = 0;
  // Decoder layer i's cross-attention K and V (N, H·D) from the encoder's output (N, E).
  virtual std::pair<Tensor, Tensor> cross_kv(int64_t i, View<const float> states) = 0;
  virtual void decoder_layer(int64_t i, Tensor& x, const Attend& self, const CrossAttend& cross) = 0;
  // The decoder's final norm and the lm_head: x (N, E) -> logits (N, V).
  virtual Tensor head(View<const float> x) = 0;
  Seq2SeqConfig c_;
};

// transformers' T5ForConditionalGeneration: shared embeddings; per layer (pre-norm, T5LayerNorm = RMSNorm
// without mean) x += o(attn(layer_norm(x))) with scores not scaled and the relative position bias of
// layer 0's table on its side (bidirectional in the encoder, causal in the decoder: relative_bias in the
// kernels), the decoder's x += o(cross(layer_norm(x))), x += wo(act(wi(h))) or (gated-gelu, v1.1)
// wo(gelu_new(wi_0(h)) · wi_1(h)); final_layer_norm; the decoder's output times d_model^-1/2 when
// scale_decoder_outputs (tied head), lm_head.
class T5Model : public PretrainedSeq2Seq {
 public:
  explicit T5Model(const std::string& dir);
  struct Options;  // what config.json says beyond Seq2SeqConfig (hf_t5.cpp)
  std::string architecture() const override { return "T5ForConditionalGeneration"; }
  LayerAttention encoder_attention(int64_t) const override;
  LayerAttention decoder_attention(int64_t) const override;
  std::vector<Linear*> linears() override;

  struct Attention {
    RMSNorm norm;
    Linear q, k, v, o;  // (H·D, E) x3, (E, H·D)
  };
  struct Layer {
    Attention self;
    std::vector<Attention> cross;  // the decoder's (one)
    RMSNorm ff_norm;
    std::vector<Linear> wi;        // wi, or wi_0 and wi_1 (gated)
    Linear wo;
  };

 protected:
  Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T, bool decoder) override;
  void encoder_layer(int64_t i, Tensor& x, const Attend& attend) override;
  void encoder_end(Tensor& x) override;
  std::pair<Tensor, Tensor> cross_kv(int64_t i, View<const float> states) override;
  void decoder_layer(int64_t i, Tensor& x, const Attend& self, const CrossAttend& cross) override;
  Tensor head(View<const float> x) override;

 private:
  T5Model(const Options& o, const HfWeights& w);
  void feed_forward(Layer& l, Tensor& x);
  int64_t num_buckets_, max_distance_;
  Activation act_kind_;
  bool gated_, scale_output_;
  Embedding shared_;
  std::vector<Layer> encoder_, decoder_;
  Tensor encoder_table_, decoder_table_;  // (num_buckets, H): layer 0's relative_attention_bias
  RMSNorm encoder_norm_, decoder_norm_;
  Linear lm_head_;
  ActivationLayer act_;
};

// transformers' BartForConditionalGeneration: shared embeddings times sqrt(E) when scale_embedding, learned
// positions (offset 2), layernorm_embedding; post-norm layers x = LN(x + out_proj(attn(x))), the decoder's
// x = LN(x + out_proj(cross(x))), x = LN(x + fc2(act(fc1(x)))); lm_head tied to shared, plus final_logits_bias.
class BartModel : public PretrainedSeq2Seq {
 public:
  explicit BartModel(const std::string& dir);
  struct Options;  // what config.json says beyond Seq2SeqConfig (hf_bart.cpp)
  std::string architecture() const override { return "BartForConditionalGeneration"; }
  std::vector<Linear*> linears() override;

  struct Attention {
    Linear q, k, v, out;  // (E, E) each, biased
    LayerNorm norm;       // after the residual add
  };
  struct Layer {
    Attention self;
    std::vector<Attention> cross;  // the decoder's (one)
    Linear fc1, fc2;
    LayerNorm final_norm;
  };

 protected:
  Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T, bool decoder) override;
  void encoder_layer(int64_t i, Tensor& x, const Attend& attend) override;
  void encoder_end(Tensor&) override {}
  std::pair<Tensor, Tensor> cross_kv(int64_t i, View<const float> states) override;
  void decoder_layer(int64_t i, Tensor& x, const Attend& self, const CrossAttend& cross) override;
  Tensor head(View<const float> x) override;

 private:
  BartModel(const Options& o, const HfWeights& w);
  void feed_forward(Layer& l, Tensor& x);
  float embed_scale_;
  Embedding shared_, encoder_pos_, decoder_pos_;
  LayerNorm encoder_embed_norm_, decoder_embed_norm_;
  std::vector<Layer> encoder_, decoder_;
  Linear lm_head_;  // shared (V, E) with final_logits_bias (V)
  ActivationLayer act_;
};

// Translates: the target tokens after decoder_start_token_id for a source (B = 1), through the decoder's KV
// cache with sampling.h's loop (greedy at temperature 0), the source encoded once. Stops at
// options.eos_token_ids (pass the model's seq2seq_config().eos_token_ids to stop as transformers does);
// forced_bos/eos_token_id as transformers' generate applies them. Returns only the new tokens.
std::vector<int64_t> generate(PretrainedSeq2Seq& model, const std::vector<int64_t>& source,
                              const SampleOptions& options);
// Reads `dir`/config.json and builds the model its "architectures" names; an Error for any other.
std::unique_ptr<PretrainedModel> load_pretrained(const std::string& dir);

// Sentence-transformers' pooling (modules.json, 1_Pooling/config.json): how token states become one
// vector per text, and whether it is L2-normalized after (a Normalize module).
struct Pooling {
  enum class Mode { mean, cls, max };
  Mode mode = Mode::mean;
  bool normalize = false;
  int64_t max_seq_length = 0;  // sentence_bert_config.json's (0: none given)
  bool configured = false;     // a Pooling module of modules.json gave the mode (else: the default, mean)
};
// What `dir`'s sentence-transformers files say; mean pooling without normalization if there are none (as
// sentence-transformers itself falls back for a plain transformers directory).
Pooling read_pooling(const std::string& dir);
// "mean pooling, L2-normalized" and the like.
std::string to_string(const Pooling& pooling);
// hidden (B, L, E) and attention_mask (B, L) (1 = token) -> (B, E).
Tensor pool(View<const float> hidden, const int64_t* attention_mask, const Pooling& pooling);

// A model directory as a user runs it: the model, its tokenizer (tokenizer.json) and its pooling.
struct Pretrained {
  std::unique_ptr<PretrainedModel> model;
  HfTokenizer tokenizer;
  Pooling pooling;

  // The model as a decoder, or null for an encoder.
  PretrainedDecoder* decoder() const { return dynamic_cast<PretrainedDecoder*>(model.get()); }
  // The model as an encoder-decoder, or null.
  PretrainedSeq2Seq* seq2seq() const { return dynamic_cast<PretrainedSeq2Seq*>(model.get()); }
  static Pretrained load(const std::string& dir, Precision precision = Precision::f32);
  // The longest token sequence embed() feeds the model: max_seq_length, else the tokenizer's truncation,
  // each capped by the position table.
  int64_t max_tokens() const;
  // Sentence embeddings (N, E) of texts: tokenized with special tokens and truncated to max_length tokens
  // (0: max_tokens()), sorted by length into batches of at most `batch` (padded to their longest, which
  // costs no work), run and pooled; rows in the order of `texts`. progress(done, total) after each batch.
  Tensor embed(const std::vector<std::string>& texts, int64_t batch = 32, int64_t max_length = 0,
               const std::function<void(int64_t done, int64_t total)>& progress = {});
};

}  // namespace attn
