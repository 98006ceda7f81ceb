// tokenizer.json pipelines (see attn/hf_tokenizer.h), following the `tokenizers` library's Rust code step
// by step: AddedVocabulary's two splits (raw text, then normalized text), then the stages, each in its
// own file (hf_pipeline.h): the normalizers, the pre-tokenizers, the model (WordPiece, or BPE in
// hf_bpe.cpp), the post-processors, truncation here, and the decoders. This file reads the file into
// them and runs them in order. Not a trainer, and no offsets (attn needs ids and token strings only).
#include "attn/hf_tokenizer.h"

#include <algorithm>

#include "attn/check.h"
#include "attn/tokenizer.h"
#include "hf_pipeline.h"

namespace attn {

namespace {

using hf::is_whitespace;
using hf::json;

bool is_word_char(char32_t c) {  // for an added token's single_word: alphanumeric or '_'
  const auto k = hf::category(c);
  return c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
         (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

struct AddedToken {
  std::u32string content;  // as the text holds it: normalized tokens hold their normalized content here
  int64_t id;
  bool special, single_word, lstrip, rstrip, normalized;
};

// AddedVocabulary::find_matches over `s`: the leftmost, then longest, token of `set` (sorted longest
// first); a single_word token inside a word is skipped; lstrip/rstrip take the whitespace beside it.
// text(a, b) for each stretch between tokens, token(t) for each token, in order.
template <typename Text, typename Token>
void split_added(const std::u32string& s, const std::vector<AddedToken>& set, Text text, Token token) {
  size_t done = 0;
  std::u32string firsts;  // the tokens' first characters: most positions start none
  for (const AddedToken& a : set)
    if (firsts.find(a.content[0]) == std::u32string::npos) firsts += a.content[0];
  for (size_t i = 0; !set.empty() && i < s.size();) {
    const AddedToken* hit = nullptr;
    for (size_t j = i; j < s.size() && !hit; ++j) {
      if (firsts.find(s[j]) == std::u32string::npos) continue;
      for (const AddedToken& a : set)
        if (s.compare(j, a.content.size(), a.content) == 0) {
          hit = &a, i = j;
          break;  // longest first
        }
    }
    if (!hit) break;
    const size_t end = i + hit->content.size();
    size_t a = i, b = end;
    i = end;  // the search goes on after the match, whether or not it is taken
    if (hit->single_word && ((a > 0 && is_word_char(s[a - 1])) || (b < s.size() && is_word_char(s[b])))) continue;
    if (hit->lstrip) {
      while (a > 0 && is_whitespace(s[a - 1])) --a;
      a = std::max(a, done);
    }
    if (hit->rstrip)
      while (b < s.size() && is_whitespace(s[b])) ++b;
    if (done < a) text(done, a);
    token(*hit);
    done = b;
  }
  if (done < s.size()) text(done, s.size());
}

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  std::vector<hf::Normalizer> normalizers;       // in order (a Sequence flattened)
  std::vector<hf::PreTokenizer> pre_tokenizers;  // in order
  hf::Model model;                               // WordPiece or BPE
  // id -> token (the model's and the added ones): a map, as the library's, so that a file whose ids are
  // sparse (one id of 10^8 among three) costs what it holds, not a table of 10^8 strings
  std::unordered_map<int64_t, std::string> tokens;
  int64_t size = 0;  // the largest id + 1
  std::vector<AddedToken> added_raw, added_normalized;  // longest first
  std::unordered_map<int64_t, bool> special_of;         // added token id -> special
  // post-processor, single sequence: the special tokens before and after it
  hf::Specials before, after;
  int64_t max_length = 0;
  bool truncate_left = false;
  int64_t pad = -1;
  std::vector<hf::Decoder> decoders;  // none: the tokens joined by spaces

  void push(int64_t id, Encoding& enc) const {
    enc.ids.push_back(id);
    enc.tokens.push_back(tokens.at(id));
  }
  // The model's ids of one pre-tokenized word, and their tokens, appended to enc.
  void model_word(const std::string& word, Encoding& enc) const {
    const size_t from = enc.ids.size();
    model.tokenize(word, enc.ids);
    for (size_t i = from; i < enc.ids.size(); ++i) enc.tokens.push_back(tokens.at(enc.ids[i]));
  }
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

HfTokenizer HfTokenizer::from_file(const std::string& path) {
  auto t = std::make_unique<Impl>();
  t->path = path;
  const json j = hf::read_json(path, "tokenizer.json");
  const std::string where = cat("'", path, "'");
  auto part = [&](const char* name) -> const json& {
    static const json none;
    auto it = j.find(name);
    return it == j.end() ? none : *it;
  };

  t->model = hf::Model::read(part("model"), where);

  // normalizer, pre-tokenizer, post-processor, decoder
  if (!part("normalizer").is_null())
    hf::add_components(part("normalizer"), "normalizer", "normalizers", where, t->normalizers, hf::normalizer_of);
  if (!part("pre_tokenizer").is_null())
    hf::add_components(part("pre_tokenizer"), "pre_tokenizer", "pretokenizers", where, t->pre_tokenizers,
                       hf::pre_tokenizer_of);
  hf::add_post_processor(part("post_processor"), where, t->before, t->after);
  if (!part("decoder").is_null())
    hf::add_components(part("decoder"), "decoder", "decoders", where, t->decoders, hf::decoder_of);

  // added tokens (their ids may extend the vocabulary); a normalized one is matched in normalized text
  int64_t& size = t->size;  // ids are at most kMaxTokenId: no + 1 overflows
  for (const auto& [tok, id] : t->model.vocab) size = std::max(size, id + 1);
  std::vector<std::pair<std::string, int64_t>> added_text;  // content as written, id
  const json& added = part("added_tokens");
  ATTN_CHECK(added.is_null() || added.is_array(), "Expected \"added_tokens\" (a list) in ", where, ", but got ",
             hf::brief(added), " instead");
  if (added.is_array()) {
    for (const json& x : added) {
      const std::string aw = cat("an added token of ", where);
      const std::string content = hf::field<std::string>(x, "content", aw);
      AddedToken at{utf8_decode(content), hf::field<uint32_t>(x, "id", aw), hf::field_or<bool>(x, "special", aw, false),
                    hf::field_or<bool>(x, "single_word", aw, false), hf::field_or<bool>(x, "lstrip", aw, false),
                    hf::field_or<bool>(x, "rstrip", aw, false), hf::field_or<bool>(x, "normalized", aw, true)};
      ATTN_CHECK(!at.content.empty(), "Expected an added token with content in ", where, ", but got ", hf::brief(x),
                 " instead");
      size = std::max(size, at.id + 1);
      added_text.emplace_back(content, at.id);
      t->special_of[at.id] = at.special;
      if (at.normalized) {
        hf::RegexBudget budget(content.size());
        at.content = utf8_decode(hf::normalize(t->normalizers, content, budget));
        if (at.content.empty()) continue;  // normalized to nothing: never matches
      }
      (at.normalized ? t->added_normalized : t->added_raw).push_back(std::move(at));
    }
  }
  for (const auto& [tok, id] : t->model.vocab) t->tokens[id] = tok;
  for (const auto& [content, id] : added_text) t->tokens[id] = content;
  for (auto* set : {&t->added_raw, &t->added_normalized})
    std::stable_sort(set->begin(), set->end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (const auto& [tok, id] : t->before)
    ATTN_CHECK(id >= 0 && id < size, "Expected the id of '", tok, "' in [0, ", size, "), but got ", id, " instead");
  for (const auto& [tok, id] : t->after)
    ATTN_CHECK(id >= 0 && id < size, "Expected the id of '", tok, "' in [0, ", size, "), but got ", id, " instead");

  // truncation and padding
  if (const json& tr = part("truncation"); tr.is_object()) {
    const std::string tw = cat("the truncation of ", where);
    t->max_length = hf::field<int64_t>(tr, "max_length", tw);
    t->truncate_left = hf::field_or<std::string>(tr, "direction", tw, "Right") == "Left";
  }
  if (const json& pd = part("padding"); pd.is_object()) t->pad = hf::field_or<int64_t>(pd, "pad_id", where, 0);
  if (t->pad < 0) {
    auto p = t->model.vocab.find("[PAD]");
    t->pad = p == t->model.vocab.end() ? 0 : p->second;
  }
  return HfTokenizer(std::move(t));
}

Encoding HfTokenizer::encode(std::string_view text, bool add_special_tokens, int64_t max_length) const {
  const Impl& t = *impl_;
  const std::u32string s = utf8_decode(text);  // invalid UTF-8: an Error naming the byte offset
  Encoding body;
  std::vector<hf::Split> splits;
  hf::RegexBudget budget(text.size());  // the patterns' work on this text, all of them together
  // a stretch between raw added tokens: normalized, split by the normalized added tokens, pre-tokenized
  auto run = [&](size_t a, size_t b) {
    const std::u32string n =
        utf8_decode(hf::normalize(t.normalizers, utf8_encode(std::u32string_view(s).substr(a, b - a)), budget));
    split_added(
        n, t.added_normalized,
        [&](size_t c, size_t d) {
          splits.assign(1, {utf8_encode(std::u32string_view(n).substr(c, d - c)), a == 0 && c == 0});
          hf::pre_tokenize(t.pre_tokenizers, splits, budget);
          for (const hf::Split& w : splits) t.model_word(w.text, body);
        },
        [&](const AddedToken& tok) { t.push(tok.id, body); });
  };
  split_added(s, t.added_raw, run, [&](const AddedToken& tok) { t.push(tok.id, body); });

  const size_t extra = add_special_tokens ? t.before.size() + t.after.size() : 0;
  if (max_length < 0) max_length = t.max_length;
  if (max_length > 0) {
    const size_t keep = size_t(std::max<int64_t>(0, max_length - int64_t(extra)));
    if (body.ids.size() > keep) {
      const size_t from = t.truncate_left ? body.ids.size() - keep : 0;
      body.ids = std::vector<int64_t>(body.ids.begin() + from, body.ids.begin() + from + keep);
      body.tokens = std::vector<std::string>(body.tokens.begin() + from, body.tokens.begin() + from + keep);
    }
  }
  if (!add_special_tokens) return body;
  return hf::post_process(t.before, t.after, body);
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  for (int64_t id : ids) {
    auto a = t.special_of.find(id);
    if (a != t.special_of.end() && skip_special_tokens && a->second) continue;
    toks.push_back(id_to_token(id));
  }
  return hf::decode_tokens(t.decoders, std::move(toks));
}

int64_t HfTokenizer::vocab_size() const { return impl_->size; }

int64_t HfTokenizer::token_to_id(const std::string& token) const {
  for (const auto* set : {&impl_->added_raw, &impl_->added_normalized})
    for (const AddedToken& a : *set)
      if (impl_->tokens.at(a.id) == token) return a.id;
  auto it = impl_->model.vocab.find(token);
  return it == impl_->model.vocab.end() ? -1 : it->second;
}

std::string HfTokenizer::id_to_token(int64_t id) const {
  auto it = impl_->tokens.find(id);
  ATTN_CHECK(it != impl_->tokens.end(), "Expected a token id in the vocabulary of '", impl_->path, "' (ids below ",
             vocab_size(), "), but got ", id, " instead");
  return it->second;
}

int64_t HfTokenizer::pad_id() const { return impl_->pad; }
int64_t HfTokenizer::max_length() const { return impl_->max_length; }

}  // namespace attn
