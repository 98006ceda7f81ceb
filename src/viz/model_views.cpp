// A model's attention on a text as files (the HTML page and one PNG per layer) and as one number (mean row
// entropy). The model runs here, once, through Gpt::attention_weights or PretrainedModel::attention_weights;
// the drawing is heatmap.cpp's and html.cpp's. Not a checkpoint reader and not a command line (tools/viz.cpp).
#include <cmath>
#include <filesystem>

#include "attn/check.h"
#include "attn/file.h"
#include "attn/viz.h"
#include "attn/viz_model.h"

namespace attn::viz {
namespace {

// A few characters of the vocabulary for an error message, whitespace visible: "a b c … z |".
std::string vocab_sample(const CharTokenizer& tokenizer, size_t head = 12, size_t tail = 2) {
  const std::u32string& v = tokenizer.vocab();
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == head && v.size() > head + tail) {
      out += " \u2026";  // …
      i = v.size() - tail;
    }
    if (!out.empty()) out += ' ';  // (not "" or " " + the token: GCC 12's -Wrestrict misreads that)
    out += display_token(utf8_encode(std::u32string(1, v[i])));
  }
  return out;
}

}  // namespace

std::vector<int64_t> model_tokens(const Gpt& model, const CharTokenizer& tokenizer, const std::string& text) {
  const std::u32string chars = utf8_decode(text);  // invalid UTF-8: its own error, naming the byte offset
  const int64_t T = int64_t(chars.size()), block = model.config().block_size;
  ATTN_CHECK(T > 0, "Expected a text of at least one character, but got an empty one instead");
  ATTN_CHECK(T <= block, "Expected a text of at most the model's block_size = ", block, " characters, but got ", T,
             " characters instead");
  ATTN_CHECK(tokenizer.vocab_size() == model.config().vocab_size, "Expected a tokenizer of the model's vocab_size = ",
             model.config().vocab_size, ", but got ", tokenizer.vocab_size(), " instead");
  std::vector<int32_t> ids;
  try {
    ids = tokenizer.encode(text);
  } catch (const Error& e) {  // a character the model never saw: say which ones it knows
    throw Error(cat(e.what(), ". The model knows ", tokenizer.vocab_size(), " characters: ", vocab_sample(tokenizer)));
  }
  return {ids.begin(), ids.end()};
}

namespace {

// Every layer's weights (1, H, T, T) and the T token labels -> DIR/attention.html and DIR/layer<i>.png.
ModelViews write_views(const std::string& dir, std::vector<Tensor> weights, std::vector<std::string> tokens,
                       const std::string& text, const ModelViewOptions& options) {
  check_path(dir, "the output directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ATTN_CHECK(!ec, "Expected to create the output directory '", dir, "', but got '", ec.message(), "' instead");

  ModelViews out;
  out.weights = std::move(weights);
  out.tokens = std::move(tokens);
  AttentionRecord record{out.tokens, {}, {}, {}};
  for (size_t l = 0; l < out.weights.size(); ++l) {
    const View<const float> w = out.weights[l].view().select(0, 0);  // (H, T, T)
    record.layers.push_back(w);
    const std::string title = cat("layer ", l, " \u00b7 ", w.size(0), " heads \u00b7 \"", display_token(text, 40), "\"",
                                  options.source.empty() ? "" : " \u00b7 ", options.source);
    out.pngs.push_back((std::filesystem::path(dir) / ("layer" + std::to_string(l) + ".png")).string());
    write_heads_png(out.pngs.back(), w, out.tokens, {},
                    {.title = title, .vmax = options.scale == "absolute" ? 1.f : 0.f, .max_px = options.png_max_px});
  }
  out.html = (std::filesystem::path(dir) / "attention.html").string();
  // the text cut as the PNG titles cut it: the page lists every token, its title need not repeat them
  write_html(out.html, record,
             {.title = options.title.empty() ? "attention on \"" + display_token(text, 40) + "\"" : options.title,
              .top_k = options.top_k, .scale = options.scale});
  return out;
}

}  // namespace

ModelViews write_model_views(const std::string& dir, Gpt& model, const CharTokenizer& tokenizer,
                             const std::string& text, const ModelViewOptions& options) {
  const std::vector<int64_t> idx = model_tokens(model, tokenizer, text);  // (1, T)
  std::vector<std::string> tokens;  // T: one character each
  for (char32_t c : utf8_decode(text)) tokens.push_back(utf8_encode(std::u32string(1, c)));
  return write_views(dir, model.attention_weights(idx.data(), 1, int64_t(idx.size())), std::move(tokens), text,
                     options);
}

ModelViews write_pretrained_views(const std::string& dir, Pretrained& model, const std::string& text,
                                  const ModelViewOptions& options) {
  const Encoding enc = model.tokenizer.encode(text, true, 0);  // (1, T): special tokens in, no truncation
  const int64_t T = int64_t(enc.ids.size()), most = model.model->max_positions();
  ATTN_CHECK(T > 0, "Expected a text of at least one token, but got none instead");
  ATTN_CHECK(most == 0 || T <= most, "Expected a text of at most the model's ", most, " positions, but got ", T,
             " tokens instead");
  ModelViewOptions o = options;
  if (o.source.empty()) o.source = model.model->architecture();
  return write_views(dir, model.model->attention_weights(enc.ids.data(), 1, T), enc.tokens, text, o);
}

double mean_row_entropy(View<const float> w, int64_t min_keys) {
  ATTN_CHECK(w.rank() == 4 && w.size(2) == w.size(3),
             "Expected causal self-attention weights of shape (B, H, T, T), but got ", to_string(w.shape), " instead");
  ATTN_CHECK(min_keys >= 2, "Expected min_keys >= 2 (one key has no entropy to normalise), but got ", min_keys,
             " instead");
  ATTN_CHECK(w.size(3) >= min_keys, "Expected T >= min_keys = ", min_keys, " so that some row qualifies, but got ",
             to_string(w.shape), " instead");
  const int64_t B = w.size(0), H = w.size(1), T = w.size(2);
  double sum = 0;
  int64_t rows = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = min_keys - 1; t < T; ++t) {
        const float* row = w.data + b * w.strides[0] + h * w.strides[1] + t * w.strides[2];
        double e = 0;  // -sum p log p over the t + 1 visible keys; p = 0 adds nothing (the limit of p log p)
        for (int64_t s = 0; s <= t; ++s) {
          const double p = row[s * w.strides[3]];
          if (p > 0) e -= p * std::log(p);
        }
        sum += e / std::log(double(t + 1));
        ++rows;
      }
  return sum / double(rows);
}

}  // namespace attn::viz
