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

// One page's worth: every layer's weights (1, H, L, S), the labels of the L queries and (cross-attention) of the
// S keys, and how the files and layers are named.
struct Views {
  std::vector<Tensor> weights;
  std::vector<std::string> queries, keys;  // keys empty: self-attention
  std::vector<std::string> names;          // per layer, or empty: "layer l"
  std::string file = "attention", png = "layer";
};

void create_dir(const std::string& dir) {
  check_path(dir, "the output directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ATTN_CHECK(!ec, "Expected to create the output directory '", dir, "', but got '", ec.message(), "' instead");
}

// DIR/<file>.html and DIR/<png><i>.png of v; the page's path. links: other pages of the same text, by file name.
std::string write_page(const std::string& dir, const Views& v, const std::string& text, const ModelViewOptions& options,
                       std::vector<std::string>& pngs, const std::vector<std::string>& links = {}) {
  AttentionRecord record{v.queries, v.keys, {}, v.names};
  for (size_t l = 0; l < v.weights.size(); ++l) {
    const View<const float> w = v.weights[l].view().select(0, 0);  // (H, L, S)
    record.layers.push_back(w);
    const std::string name = v.names.empty() ? cat("layer ", l) : v.names[l];
    const std::string title = cat(name, " \u00b7 ", w.size(0), " heads \u00b7 \"", display_token(text, 40), "\"",
                                  options.source.empty() ? "" : " \u00b7 ", options.source);
    pngs.push_back((std::filesystem::path(dir) / (v.png + std::to_string(l) + ".png")).string());
    write_heads_png(pngs.back(), w, v.queries, v.keys,
                    {.title = title, .vmax = options.scale == "absolute" ? 1.f : 0.f, .max_px = options.png_max_px});
  }
  const std::string path = (std::filesystem::path(dir) / (v.file + ".html")).string();
  // the text cut as the PNG titles cut it: the page lists every token, its title need not repeat them
  const std::string title =
      options.title.empty() ? "attention on \"" + display_token(text, 40) + "\"" : options.title;
  std::string html = render_html(record, {.title = links.empty() ? title : cat(title, " \u00b7 ", v.file),
                                          .top_k = options.top_k, .scale = options.scale});
  if (!links.empty()) {  // a line of links to the other pages, first in the body
    std::string nav = "<p style=\"font:14px sans-serif;margin:8px\">";
    for (const std::string& l : links) nav += cat("<a href=\"", l, ".html\">", l, "</a> ");
    nav += "</p>";
    const size_t body = html.find("<body");
    const size_t at = body == std::string::npos ? std::string::npos : html.find('>', body);
    if (at != std::string::npos) html.insert(at + 1, nav);
  }
  check_path(path, "the HTML path");
  write_file_atomic(path, "the HTML page", html);
  return path;
}

// Every layer's weights (1, H, T, T) and the T token labels -> DIR/attention.html and DIR/layer<i>.png.
ModelViews write_views(const std::string& dir, std::vector<Tensor> weights, std::vector<std::string> tokens,
                       const std::string& text, const ModelViewOptions& options,
                       std::vector<std::string> names = {}) {
  create_dir(dir);
  ModelViews out;
  Views v{std::move(weights), std::move(tokens), {}, std::move(names)};
  out.html = write_page(dir, v, text, options, out.pngs);
  out.weights = std::move(v.weights);
  out.tokens = std::move(v.queries);
  return out;
}

// An encoder-decoder's three pages: the cross-attention (attention.html) and each side's self-attention.
ModelViews write_seq2seq_views(const std::string& dir, Pretrained& model, PretrainedSeq2Seq& s, const Encoding& source,
                               const std::string& text, const ModelViewOptions& options) {
  std::vector<int64_t> target{s.seq2seq_config().decoder_start_token_id};
  if (options.target.empty()) {
    SampleOptions greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = options.max_target;
    greedy.eos_token_ids = s.seq2seq_config().eos_token_ids;
    for (int64_t t : generate(s, source.ids, greedy)) target.push_back(t);
  } else {
    for (int64_t t : model.tokenizer.encode(options.target, false, 0).ids) target.push_back(t);
  }
  std::vector<std::string> target_tokens;
  for (int64_t t : target) target_tokens.push_back(model.tokenizer.id_to_token(t));
  PretrainedSeq2Seq::Weights w =
      s.all_attention_weights(source.ids.data(), int64_t(source.ids.size()), target.data(), int64_t(target.size()));
  auto named = [](const char* side, size_t n, const char* what) {  // "decoder 1 · cross"
    std::vector<std::string> names;
    for (size_t l = 0; l < n; ++l) names.push_back(cat(side, " ", l, what));
    return names;
  };
  create_dir(dir);
  ModelViews out;
  const size_t E = w.encoder.size(), D = w.decoder.size();
  Views cross{std::move(w.cross), target_tokens, source.tokens, named("decoder", D, " \u00b7 cross"), "attention",
              "cross_layer"};
  Views enc{std::move(w.encoder), source.tokens, {}, named("encoder", E, ""), "encoder", "encoder_layer"};
  Views dec{std::move(w.decoder), target_tokens, {}, named("decoder", D, " \u00b7 self"), "decoder", "decoder_layer"};
  out.html = write_page(dir, cross, text, options, out.pngs, {"encoder", "decoder"});
  out.more_html.push_back(write_page(dir, enc, text, options, out.pngs, {"attention", "decoder"}));
  out.more_html.push_back(write_page(dir, dec, text, options, out.pngs, {"attention", "encoder"}));
  out.weights = std::move(cross.weights);
  out.tokens = std::move(target_tokens);
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
  if (PretrainedSeq2Seq* s = model.seq2seq()) return write_seq2seq_views(dir, model, *s, enc, text, o);
  std::vector<std::string> names;  // a sliding layer says its window
  if (PretrainedDecoder* d = model.decoder())
    for (int64_t l = 0; l < d->num_layers(); ++l)
      names.push_back(d->attention(l).sliding_window > 0
                          ? cat("layer ", l, " \u00b7 window ", d->attention(l).sliding_window)
                          : cat("layer ", l));
  return write_views(dir, model.model->attention_weights(enc.ids.data(), 1, T), enc.tokens, text, o, std::move(names));
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
