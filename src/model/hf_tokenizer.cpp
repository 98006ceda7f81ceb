// tokenizer.json pipelines (see attn/hf_tokenizer.h), following the `tokenizers` library's Rust code step
// by step: AddedVocabulary's split of the raw text, BertNormalizer, BertPreTokenizer, WordPiece, the
// TemplateProcessing / BertProcessing post-processors, truncation, and the WordPiece decoder. Unicode
// properties (general categories, NFD, lower case) come from utf8proc. Not a trainer.
#include "attn/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>

#include "attn/check.h"
#include "attn/tokenizer.h"
#include "hf_json.h"

namespace attn {

namespace {

using hf::json;

// ---- Unicode properties, as Rust's char methods and the unicode_categories crate define them ----

utf8proc_category_t category(char32_t c) { return utf8proc_category(utf8proc_int32_t(c)); }

// char::is_whitespace: the White_Space property, which is Zs, Zl, Zp and the controls \t \n \v \f \r U+0085.
bool is_whitespace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x85) return true;
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

// BertNormalizer's is_control: the categories Cc, Cf, Co, Cs, except \t \n \r (whitespace there). Its
// source names Cn (unassigned) too, but the library keeps unassigned code points (U+0378 stays and
// makes a word [UNK]), so they are kept here.
// Code points assigned after the library's Unicode tables (its crates' version, older than utf8proc's
// Unicode 15) can differ: U+1ABF (a combining mark since Unicode 14) is kept there, stripped here.
bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO ||
         k == UTF8PROC_CATEGORY_CS;
}

// BertPreTokenizer's is_bert_punc: ASCII punctuation, or a P* category.
bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_PC || k == UTF8PROC_CATEGORY_PD || k == UTF8PROC_CATEGORY_PS ||
         k == UTF8PROC_CATEGORY_PE || k == UTF8PROC_CATEGORY_PI || k == UTF8PROC_CATEGORY_PF ||
         k == UTF8PROC_CATEGORY_PO;
}

// BertNormalizer's is_chinese_char: the CJK Unified Ideographs blocks it lists.
bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool is_word_char(char32_t c) {  // for an added token's single_word: alphanumeric or '_'
  const auto k = category(c);
  return c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
         (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

// Canonical decomposition (NFD) of a code point sequence.
std::u32string nfd(const std::u32string& s) {
  if (s.empty()) return s;
  std::u32string out;
  utf8proc_int32_t tmp[32];
  int last_boundclass = 0;
  for (char32_t c : s) {
    const utf8proc_ssize_t n = utf8proc_decompose_char(utf8proc_int32_t(c), tmp, 32, UTF8PROC_DECOMPOSE, &last_boundclass);
    ATTN_CHECK(n >= 0 && n <= 32, "Expected a decomposable code point, but got U+", std::hex, uint32_t(c), " instead");
    for (utf8proc_ssize_t i = 0; i < n; ++i) out.push_back(char32_t(tmp[i]));
  }
  // canonical ordering: stable sort of each run of non-starters by combining class
  auto ccc = [](char32_t c) { return utf8proc_get_property(utf8proc_int32_t(c))->combining_class; };
  for (size_t i = 0; i < out.size();) {
    if (ccc(out[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < out.size() && ccc(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + i, out.begin() + j, [&](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  return out;
}

// char::to_lowercase: the full mapping, which is the simple one except for U+0130 (İ -> i + U+0307).
void push_lower(char32_t c, std::u32string& out) {
  if (c == 0x130) {
    out += U"i\u0307";
    return;
  }
  out.push_back(char32_t(utf8proc_tolower(utf8proc_int32_t(c))));
}

struct AddedToken {
  std::u32string content;
  int64_t id;
  bool special, single_word, lstrip, rstrip;
};

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  // normalizer: BertNormalizer or none
  bool normalize = false, clean_text = true, chinese = true, strip_accents = true, lowercase = true;
  // pre-tokenizer: BertPreTokenizer or none
  bool bert_pre = false;
  // model: WordPiece
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> tokens;  // id -> token (model's and added)
  std::string unk;
  int64_t unk_id = -1, max_chars = 100;
  std::string prefix = "##";
  std::vector<AddedToken> added;  // longest first
  std::unordered_map<int64_t, size_t> added_of;  // id -> index in added
  // post-processor, single sequence: the special tokens before and after it
  std::vector<std::pair<std::string, int64_t>> before, after;
  int64_t max_length = 0;
  bool truncate_left = false;
  int64_t pad = -1;
  // decoder: WordPiece or none
  bool wordpiece_decoder = false, cleanup = true;
  std::string decoder_prefix = "##";

  void words(const std::u32string& text, std::vector<std::u32string>& out) const;
  void wordpiece(const std::u32string& word, Encoding& enc) const;
  void push(int64_t id, Encoding& enc) const {
    enc.ids.push_back(id);
    enc.tokens.push_back(tokens[size_t(id)]);
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
  auto type_of = [&](const json& part, const char* name) -> std::string {
    if (part.is_null()) return "";
    ATTN_CHECK(part.is_object() && part.contains("type") && part["type"].is_string(), "Expected \"", name,
               "\" in ", where, " to be an object with a \"type\", but got ", hf::brief(part), " instead");
    return part["type"].get<std::string>();
  };
  auto part = [&](const char* name) -> const json& {
    static const json none;
    auto it = j.find(name);
    return it == j.end() ? none : *it;
  };

  // model
  const json& model = part("model");
  const std::string mtype = type_of(model, "model");
  ATTN_CHECK(mtype == "WordPiece", "Expected a \"model\" of type WordPiece in ", where, ", but got \"", mtype,
             "\" instead");
  const std::string mw = cat("the model of ", where);
  ATTN_CHECK(model.contains("vocab") && model["vocab"].is_object(), "Expected \"vocab\" (token -> id) in ", mw,
             ", but got none instead");
  for (const auto& [tok, id] : model["vocab"].items()) {
    ATTN_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "Expected the id of '", tok, "' in ", mw,
               " to be an integer >= 0, but got ", hf::brief(id), " instead");
    t->vocab[tok] = id.get<int64_t>();
  }
  t->unk = hf::field<std::string>(model, "unk_token", mw);
  t->prefix = hf::field_or<std::string>(model, "continuing_subword_prefix", mw, "##");
  t->max_chars = hf::field_or<int64_t>(model, "max_input_chars_per_word", mw, 100);

  // added tokens (their ids may extend the vocabulary)
  int64_t size = 0;
  for (const auto& [tok, id] : t->vocab) size = std::max(size, id + 1);
  if (auto a = j.find("added_tokens"); a != j.end() && a->is_array()) {
    for (const json& x : *a) {
      const std::string aw = cat("an added token of ", where);
      AddedToken at{utf8_decode(hf::field<std::string>(x, "content", aw)), hf::field<int64_t>(x, "id", aw),
                    hf::field_or<bool>(x, "special", aw, false), hf::field_or<bool>(x, "single_word", aw, false),
                    hf::field_or<bool>(x, "lstrip", aw, false), hf::field_or<bool>(x, "rstrip", aw, false)};
      ATTN_CHECK(at.id >= 0 && !at.content.empty(), "Expected an added token with content and an id >= 0 in ", where,
                 ", but got ", hf::brief(x), " instead");
      size = std::max(size, at.id + 1);
      t->added.push_back(std::move(at));
    }
  }
  t->tokens.assign(size_t(size), "");
  for (const auto& [tok, id] : t->vocab) t->tokens[size_t(id)] = tok;
  std::stable_sort(t->added.begin(), t->added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < t->added.size(); ++i) {
    t->tokens[size_t(t->added[i].id)] = utf8_encode(t->added[i].content);
    t->added_of[t->added[i].id] = i;
  }
  auto unk = t->vocab.find(t->unk);
  ATTN_CHECK(unk != t->vocab.end(), "Expected the unk_token '", t->unk, "' in the vocabulary of ", mw,
             ", but got none instead");
  t->unk_id = unk->second;

  // normalizer
  const json& norm = part("normalizer");
  const std::string ntype = type_of(norm, "normalizer");
  ATTN_CHECK(ntype.empty() || ntype == "BertNormalizer", "Expected a \"normalizer\" BertNormalizer or none in ",
             where, ", but got \"", ntype, "\" instead");
  if (ntype == "BertNormalizer") {
    const std::string nw = cat("the normalizer of ", where);
    t->normalize = true;
    t->clean_text = hf::field_or<bool>(norm, "clean_text", nw, true);
    t->chinese = hf::field_or<bool>(norm, "handle_chinese_chars", nw, true);
    t->lowercase = hf::field_or<bool>(norm, "lowercase", nw, true);
    t->strip_accents = hf::field_or<bool>(norm, "strip_accents", nw, t->lowercase);  // null: as lowercase
  }

  // pre-tokenizer
  const std::string ptype = type_of(part("pre_tokenizer"), "pre_tokenizer");
  ATTN_CHECK(ptype == "BertPreTokenizer", "Expected a \"pre_tokenizer\" BertPreTokenizer in ", where, ", but got \"",
             ptype, "\" instead");
  t->bert_pre = true;

  // post-processor
  const json& post = part("post_processor");
  const std::string post_type = type_of(post, "post_processor");
  if (post_type == "BertProcessing") {
    for (const char* k : {"cls", "sep"}) {
      const json& p = post[k];
      ATTN_CHECK(p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_number_integer(), "Expected \"", k,
                 "\" [token, id] in the post-processor of ", where, ", but got ", hf::brief(p), " instead");
      (std::string(k) == "cls" ? t->before : t->after).emplace_back(p[0].get<std::string>(), p[1].get<int64_t>());
    }
  } else if (post_type == "TemplateProcessing") {
    const json& single = post["single"];
    ATTN_CHECK(single.is_array(), "Expected \"single\" in the post-processor of ", where, ", but got ",
               hf::brief(single), " instead");
    bool seen = false;
    for (const json& item : single) {
      if (item.contains("Sequence")) {
        seen = true;
        continue;
      }
      ATTN_CHECK(item.contains("SpecialToken") && item["SpecialToken"].contains("id"),
                 "Expected Sequence or SpecialToken items in the post-processor of ", where, ", but got ",
                 hf::brief(item), " instead");
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      const json& st = post["special_tokens"][name];
      ATTN_CHECK(st.is_object() && st["ids"].is_array() && st["tokens"].is_array() && st["ids"].size() == st["tokens"].size(),
                 "Expected special_tokens[\"", name, "\"] with ids and tokens in the post-processor of ", where,
                 ", but got ", hf::brief(st), " instead");
      for (size_t i = 0; i < st["ids"].size(); ++i)
        (seen ? t->after : t->before).emplace_back(st["tokens"][i].get<std::string>(), st["ids"][i].get<int64_t>());
    }
  } else {
    ATTN_CHECK(post_type.empty(), "Expected a \"post_processor\" BertProcessing, TemplateProcessing or none in ",
               where, ", but got \"", post_type, "\" instead");
  }
  for (const auto& [tok, id] : t->before) ATTN_CHECK(id >= 0 && id < size, "Expected the id of '", tok, "' in [0, ", size, "), but got ", id, " instead");
  for (const auto& [tok, id] : t->after) ATTN_CHECK(id >= 0 && id < size, "Expected the id of '", tok, "' in [0, ", size, "), but got ", id, " instead");

  // truncation and padding
  if (const json& tr = part("truncation"); tr.is_object()) {
    const std::string tw = cat("the truncation of ", where);
    t->max_length = hf::field<int64_t>(tr, "max_length", tw);
    t->truncate_left = hf::field_or<std::string>(tr, "direction", tw, "Right") == "Left";
  }
  if (const json& pd = part("padding"); pd.is_object()) t->pad = hf::field_or<int64_t>(pd, "pad_id", where, 0);
  if (t->pad < 0) {
    auto p = t->vocab.find("[PAD]");
    t->pad = p == t->vocab.end() ? 0 : p->second;
  }

  // decoder
  const json& dec = part("decoder");
  const std::string dtype = type_of(dec, "decoder");
  ATTN_CHECK(dtype.empty() || dtype == "WordPiece", "Expected a \"decoder\" WordPiece or none in ", where,
             ", but got \"", dtype, "\" instead");
  if (dtype == "WordPiece") {
    t->wordpiece_decoder = true;
    t->decoder_prefix = hf::field_or<std::string>(dec, "prefix", where, "##");
    t->cleanup = hf::field_or<bool>(dec, "cleanup", where, true);
  }
  return HfTokenizer(std::move(t));
}

// BertNormalizer, then BertPreTokenizer: the words of one stretch of text between added tokens.
void HfTokenizer::Impl::words(const std::u32string& text, std::vector<std::u32string>& out) const {
  std::u32string s;
  if (normalize) {
    std::u32string a;
    for (char32_t c : text) {  // clean_text: drop NUL, U+FFFD and controls; whitespace -> ' '
      if (clean_text && (c == 0 || c == 0xFFFD || is_control(c))) continue;
      if (chinese && is_chinese(c)) {
        a += U' ';
        a += c;
        a += U' ';
        continue;
      }
      a += clean_text && is_whitespace(c) ? U' ' : c;
    }
    if (strip_accents) {  // NFD, then drop the nonspacing marks (Mn)
      std::u32string b;
      for (char32_t c : nfd(a))
        if (category(c) != UTF8PROC_CATEGORY_MN) b += c;
      a = std::move(b);
    }
    if (lowercase) {
      for (char32_t c : a) push_lower(c, s);
    } else {
      s = std::move(a);
    }
  } else {
    s = text;
  }
  // split on whitespace (removed) and punctuation (each its own word)
  std::u32string w;
  for (char32_t c : s) {
    if (is_whitespace(c) || is_punctuation(c)) {
      if (!w.empty()) out.push_back(std::move(w));
      w.clear();
      if (!is_whitespace(c)) out.push_back(std::u32string(1, c));
      continue;
    }
    w += c;
  }
  if (!w.empty()) out.push_back(std::move(w));
}

// WordPiece: greedy longest match first from the start of the word; any part without a match makes the
// whole word [UNK], and so does a word longer than max_input_chars_per_word.
void HfTokenizer::Impl::wordpiece(const std::u32string& word, Encoding& enc) const {
  if (int64_t(word.size()) > max_chars) return push(unk_id, enc);
  std::vector<int64_t> pieces;
  for (size_t start = 0; start < word.size();) {
    int64_t found = -1;
    size_t end = word.size();
    for (; end > start; --end) {
      const std::string sub = (start > 0 ? prefix : "") + utf8_encode(word.substr(start, end - start));
      auto it = vocab.find(sub);
      if (it != vocab.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) return push(unk_id, enc);
    pieces.push_back(found);
    start = end;
  }
  for (int64_t id : pieces) push(id, enc);
}

Encoding HfTokenizer::encode(std::string_view text, bool add_special_tokens, int64_t max_length) const {
  const Impl& t = *impl_;
  const std::u32string s = utf8_decode(text);
  Encoding body;
  std::vector<std::u32string> words;
  auto run = [&](size_t a, size_t b) {  // the model on s[a, b)
    if (a >= b) return;
    words.clear();
    t.words(s.substr(a, b - a), words);
    for (const std::u32string& w : words) t.wordpiece(w, body);
  };
  // AddedVocabulary: the leftmost, then longest, added token; lstrip/rstrip take the whitespace beside it.
  size_t done = 0;
  for (size_t i = 0; i < s.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : t.added) {
      if (s.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word && ((i > 0 && is_word_char(s[i - 1])) ||
                            (i + a.content.size() < s.size() && is_word_char(s[i + a.content.size()]))))
        continue;
      hit = &a;
      break;  // longest first
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t a = i, b = i + hit->content.size();
    if (hit->lstrip)
      while (a > done && is_whitespace(s[a - 1])) --a;
    if (hit->rstrip)
      while (b < s.size() && is_whitespace(s[b])) ++b;
    run(done, a);
    t.push(hit->id, body);
    done = i = b;
  }
  run(done, s.size());

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
  Encoding out;
  for (const auto& [tok, id] : t.before) out.ids.push_back(id), out.tokens.push_back(tok);
  out.ids.insert(out.ids.end(), body.ids.begin(), body.ids.end());
  out.tokens.insert(out.tokens.end(), body.tokens.begin(), body.tokens.end());
  for (const auto& [tok, id] : t.after) out.ids.push_back(id), out.tokens.push_back(tok);
  return out;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  for (int64_t id : ids) {
    auto a = t.added_of.find(id);
    if (a != t.added_of.end() && skip_special_tokens && t.added[a->second].special) continue;
    toks.push_back(id_to_token(id));
  }
  std::string out;
  for (size_t i = 0; i < toks.size(); ++i) {
    std::string tok = toks[i];
    if (!t.wordpiece_decoder) {
      out += (i ? " " : "") + tok;
      continue;
    }
    if (i != 0) {
      if (tok.starts_with(t.decoder_prefix)) tok.erase(0, t.decoder_prefix.size());
      else tok = " " + tok;
    }
    if (t.cleanup) {  // the library's cleanup(), on each token with its leading space
      static const std::pair<const char*, const char*> kRules[] = {
          {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
          {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
      for (const auto& [from, to] : kRules) {
        const std::string f = from, r = to;
        for (size_t p = tok.find(f); p != std::string::npos; p = tok.find(f, p + r.size())) tok.replace(p, f.size(), r);
      }
    }
    out += tok;
  }
  return out;
}

int64_t HfTokenizer::vocab_size() const { return int64_t(impl_->tokens.size()); }

int64_t HfTokenizer::token_to_id(const std::string& token) const {
  for (const AddedToken& a : impl_->added)
    if (utf8_encode(a.content) == token) return a.id;
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

std::string HfTokenizer::id_to_token(int64_t id) const {
  ATTN_CHECK(id >= 0 && id < vocab_size() && (impl_->added_of.count(id) || !impl_->tokens[size_t(id)].empty()),
             "Expected a token id in the vocabulary of '", impl_->path, "' (", vocab_size(), " ids), but got ", id,
             " instead");
  return impl_->tokens[size_t(id)];
}

int64_t HfTokenizer::pad_id() const { return impl_->pad; }
int64_t HfTokenizer::max_length() const { return impl_->max_length; }

}  // namespace attn
