// A model's attention on a text, made visible: attn's own GPT (the text's characters ->
// Gpt::attention_weights) or a pretrained Hugging Face model (its tokenizer's tokens ->
// PretrainedModel::attention_weights) -> one HTML page (every layer and head) and one PNG per layer (its
// heads in a grid); and the mean row entropy, one number for how sharply the heads attend. Not a trainer
// or a checkpoint reader (the caller brings the model and its tokenizer) and not the drawing (viz.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/hf.h"
#include "attn/tokenizer.h"

namespace attn::viz {

// Token ids of `text` for `model`: every character must be in `tokenizer`'s vocabulary (the error names
// the first one that is not and lists some that are) and the text must fit in the model's block_size.
std::vector<int64_t> model_tokens(const Gpt& model, const CharTokenizer& tokenizer, const std::string& text);

struct ModelViewOptions {
  std::string title;      // of the HTML page; empty: the text, quoted, cut to 40 characters
  std::string source;     // the model, as the PNG titles name it (the checkpoint directory); empty: unnamed
  int top_k = -1;         // weights kept per query row in the HTML (HtmlOptions::top_k: -1 auto, 0 all)
  std::string scale = "row";  // the colour scale (HtmlOptions::scale); "absolute": the PNGs too, 0 to 1
  int png_max_px = 1024;  // longest side of one head's matrix in the PNGs (HeatmapOptions::max_px)
  // An encoder-decoder's target text (its tokens after decoder_start_token_id); empty: the model's greedy
  // translation of the text, at most max_target tokens.
  std::string target;
  int64_t max_target = 24;
};

struct ModelViews {
  std::vector<Tensor> weights;    // per layer (1, H, T, T), as attention_weights gives them
  std::vector<std::string> tokens;  // T: the labels, as the tokenizer spells them
  std::string html;               // DIR/attention.html
  std::vector<std::string> pngs;  // DIR/layer<i>.png, one per layer
  // An encoder-decoder's: attention.html is the cross-attention (target tokens x source tokens); these are
  // DIR/encoder.html and DIR/decoder.html, each side's self-attention (each page links the other two).
  std::vector<std::string> more_html;
};

// Computes every layer's attention for `text` and writes DIR/attention.html and DIR/layer<i>.png
// (DIR and its parents are created). Token labels are the characters, whitespace drawn visible. A PNG's
// title names what it shows: `layer 0 · 4 heads · "the text" · source` (the text cut to 40 characters).
ModelViews write_model_views(const std::string& dir, Gpt& model, const CharTokenizer& tokenizer,
                             const std::string& text, const ModelViewOptions& options = {});

// The same files for a pretrained model (Pretrained::load): `text` tokenized as its tokenizer does, special
// tokens included ([CLS] ... [SEP] for BERT), at most max_positions() tokens; the labels are the tokens as
// the vocabulary spells them ("##ing", "Ġthe"), as bertviz shows them. The PNG titles name the source, or
// the model's architecture when it is empty; a sliding-window layer's name says its window ("layer 0 ·
// window 4096"), outside which its weights are 0. An encoder-decoder (T5, BART): `text` is the source and
// options.target the target; attention.html and DIR/cross_layer<i>.png show the cross-attention (target x
// source), DIR/encoder.html, DIR/decoder.html and encoder_layer<i>.png, decoder_layer<i>.png each side's
// self-attention.
ModelViews write_pretrained_views(const std::string& dir, Pretrained& model, const std::string& text,
                                  const ModelViewOptions& options = {});

// Causal self-attention weights (B, H, T, T) -> the mean, over batches, heads and the query rows that see
// at least `min_keys` keys (row t sees keys 0..t), of the row's entropy divided by log(#keys):
// 1 = uniform over the visible keys (an untrained head), 0 = all weight on one key.
double mean_row_entropy(View<const float> weights, int64_t min_keys = 4);

}  // namespace attn::viz
