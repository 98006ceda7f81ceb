// Hugging Face model directories (config.json + model.safetensors, or shards listed in
// model.safetensors.index.json) loaded onto attn's own layers (nn.h) and attention (sdpa.h), for
// inference. Float32 weights are used in place from the mapped files (safetensors.h's MappedSafetensors);
// other dtypes are converted once. Architectures: BertModel (BERT, MiniLM: post-LN encoder),
// GPT2LMHeadModel (pre-LN decoder, hf_gpt2.cpp) and LlamaForCausalLM (RMSNorm, RoPE, SwiGLU, GQA,
// hf_llama.cpp), the decoders with a KV cache and generate().
// Not a trainer (no backward here), not a hub client (a local directory only), and not a tokenizer
// (hf_tokenizer.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
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

// What every decoder's config.json gives (the names differ per architecture).
struct DecoderConfig {
  int64_t vocab_size = 0;    // V
  int64_t hidden_size = 0;   // E
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // H
  int64_t num_kv_heads = 0;  // Hkv (GQA when < H, MQA when 1)
  int64_t head_dim = 0;      // D
  int64_t intermediate_size = 0;
  int64_t max_positions = 0;  // the position table (GPT-2) or max_position_embeddings (Llama)
  double norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  std::vector<int64_t> eos_token_ids;  // generation_config.json's, else config.json's (none: no stop)
};

// A decoder-only language model on attn's layers: forward() gives logits; forward_cached() continues a
// KV cache (prefill, then a token per step), each layer's K/V appended and attended with bottom-right
// causal alignment. With an attention_mask, forward packs the kept tokens as BertModel does (padding costs
// nothing, its logits are 0); a kept token sees the kept tokens at or before its position, and positions
// are 0..L-1 by index (transformers' default position ids). The architecture supplies the parts below.
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
  // num_layers layers of `capacity` tokens (0: max_positions), Hkv heads of D.
  KVCache new_cache(int64_t B, int64_t capacity = 0, KvDtype dtype = KvDtype::f32) const;

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

// transformers' LlamaForCausalLM: embed_tokens, per layer x += o_proj(attn(rope(q), rope(k), v)) over
// input_layernorm(x) (RMSNorm), x += down_proj(silu(gate_proj(h)) · up_proj(h)) over
// post_attention_layernorm(x); norm; lm_head (untied unless tie_word_embeddings). GQA through
// num_key_value_heads; RoPE with rope_theta (rope_type "default" only).
class LlamaModel : public PretrainedDecoder {
 public:
  explicit LlamaModel(const std::string& dir);
  std::string architecture() const override { return "LlamaForCausalLM"; }

  struct Layer {
    RMSNorm input_norm;
    Linear q_proj, k_proj, v_proj, o_proj;  // (H·D, E), (Hkv·D, E) x2, (E, H·D)
    RMSNorm post_norm;
    Linear gate_proj, up_proj, down_proj;   // (I, E) x2, (E, I)
  };
  std::vector<Linear*> linears() override;

 protected:
  Tensor embed(const int64_t* tok, const int64_t* pos, int64_t T) override;
  void layer(int64_t i, Tensor& x, const int64_t* pos, const Attend& attend) override;
  Tensor final_norm(View<const float> x) override;
  Tensor head(View<const float> x) override;

 private:
  LlamaModel(const std::pair<DecoderConfig, double>& c, const HfWeights& w);
  Embedding embed_tokens_;
  std::vector<Layer> layers_;
  RMSNorm norm_;
  Linear lm_head_;
  Rope rope_;
};

// Continues `prompt` through the decoder's KV cache with sampling.h's loop (a cache of prompt +
// max_new_tokens tokens, at most max_positions). It stops at options.eos_token_ids: pass the model's
// decoder_config().eos_token_ids to stop as transformers does. Returns only the new tokens.
std::vector<int64_t> generate(PretrainedDecoder& model, const std::vector<int64_t>& prompt,
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
