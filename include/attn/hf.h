// Hugging Face model directories (config.json + model.safetensors, or shards listed in
// model.safetensors.index.json) loaded onto attn's own layers (nn.h) and attention (sdpa.h), for
// inference. Float32 weights are used in place from the mapped files (safetensors.h's MappedSafetensors);
// other dtypes are converted once. Architectures: BertModel (BERT, MiniLM: post-LN encoder).
// Not a trainer (no backward here), not a hub client (a local directory only), and not a tokenizer
// (hf_tokenizer.h).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/hf_tokenizer.h"
#include "attn/nn.h"
#include "attn/safetensors.h"
#include "attn/tensor.h"

namespace attn {

// The safetensors files of a model directory, mapped, and their tensors by name. A directory holds
// model.safetensors, or model.safetensors.index.json whose "weight_map" names a shard per tensor.
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  bool contains(const std::string& name) const;
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
  // What its matmuls multiply in (gemm.h Precision: an Autocast around each forward); sums, weights,
  // norms and attention stay fp32.
  Precision precision = Precision::f32;
  virtual std::string architecture() const = 0;
  virtual int64_t hidden_size() const = 0;  // E
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_layers() const = 0;
  virtual int64_t num_heads() const = 0;    // H
  // The longest sequence the position embeddings allow (0: no limit).
  virtual int64_t max_positions() const = 0;
  // An encoder's last hidden state (B, L, E).
  virtual Tensor forward(const int64_t* ids, int64_t B, int64_t L, const int64_t* attention_mask = nullptr) = 0;
  // Per layer, the attention weights (B, H, L, L) of the same forward (0 on padded rows and columns).
  virtual std::vector<Tensor> attention_weights(const int64_t* ids, int64_t B, int64_t L,
                                                const int64_t* attention_mask = nullptr) = 0;
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

 private:
  Tensor run(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask, const int64_t* types,
             std::vector<Tensor>* weights);
  BertConfig c_;
  Embedding word_, position_, token_type_;
  LayerNorm embed_norm_;
  ActivationLayer act_{Activation::gelu};
  std::vector<Layer> layers_;
};

// Reads `dir`/config.json and builds the model its "architectures" names; an Error for any other.
std::unique_ptr<PretrainedModel> load_pretrained(const std::string& dir);

// Sentence-transformers' pooling (modules.json, 1_Pooling/config.json): how token states become one
// vector per text, and whether it is L2-normalized after (a Normalize module).
struct Pooling {
  enum class Mode { mean, cls, max };
  Mode mode = Mode::mean;
  bool normalize = false;
  int64_t max_seq_length = 0;  // sentence_bert_config.json's (0: none given)
};
// What `dir`'s sentence-transformers files say; mean pooling without normalization if there are none.
Pooling read_pooling(const std::string& dir);
// hidden (B, L, E) and attention_mask (B, L) (1 = token) -> (B, E).
Tensor pool(View<const float> hidden, const int64_t* attention_mask, const Pooling& pooling);

// A model directory as a user runs it: the model, its tokenizer (tokenizer.json) and its pooling.
struct Pretrained {
  std::unique_ptr<PretrainedModel> model;
  HfTokenizer tokenizer;
  Pooling pooling;

  static Pretrained load(const std::string& dir, Precision precision = Precision::f32);
  // The longest token sequence embed() feeds the model: max_seq_length, else the tokenizer's truncation,
  // each capped by the position table.
  int64_t max_tokens() const;
  // Sentence embeddings (N, E) of texts: tokenized with special tokens and truncated to max_length tokens
  // (0: max_tokens()), sorted by length into batches of at most `batch` (padded to their longest, which
  // costs no work), run and pooled; rows in the order of `texts`.
  Tensor embed(const std::vector<std::string>& texts, int64_t batch = 32, int64_t max_length = 0);
};

}  // namespace attn
