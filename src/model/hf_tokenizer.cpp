// tokenizer.json pipelines (see attn/hf_tokenizer.h), following the `tokenizers` library's Rust code step
// by step: AddedVocabulary's two splits (raw text, then normalized text), the normalizers, the
// pre-tokenizers (each cuts every piece further, as PreTokenizedString::split does, empty pieces dropped),
// the model (WordPiece here, BPE in hf_bpe.cpp), the post-processors, truncation, and the decoders (a
// chain of token lists, joined at the end). Unicode properties (general categories, normalization forms,
// lower case) come from utf8proc, regular expressions from PCRE2 (hf_regex.cpp). Not a trainer, and no
// offsets (attn needs ids and token strings only).
#include "attn/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <optional>

#include "attn/check.h"
#include "attn/tokenizer.h"
#include "hf_bpe.h"
#include "hf_json.h"
#include "hf_regex.h"

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

// BertPreTokenizer's is_bert_punc, also the Punctuation pre-tokenizer's: ASCII punctuation, or a P* category
// in the library's tables (the unicode_categories crate: Unicode 9). utf8proc's are Unicode 15, so the P*
// code points assigned since are not punctuation to the library (kNewerPunct), and two it sees as
// punctuation have had other categories since (U+166D So, U+111C9 Mn). The lists: every code point through
// tokenizers 0.23.3's Punctuation pre-tokenizer against utf8proc 2.8's categories (tests/python/test_bpe.py
// checks all of them).
bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  if (c == 0x166D || c == 0x111C9) return true;
  static constexpr char32_t kNewerPunct[][2] = {
      {0x61D, 0x61D},     {0x9FD, 0x9FD},     {0xA76, 0xA76},     {0xC77, 0xC77},     {0xC84, 0xC84},
      {0x1B7D, 0x1B7E},   {0x2E43, 0x2E4F},   {0x2E52, 0x2E5D},   {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59},
      {0x10F86, 0x10F89}, {0x1144B, 0x1144F}, {0x1145A, 0x1145B}, {0x1145D, 0x1145D}, {0x11660, 0x1166C},
      {0x116B9, 0x116B9}, {0x1183B, 0x1183B}, {0x11944, 0x11946}, {0x119E2, 0x119E2}, {0x11A3F, 0x11A46},
      {0x11A9A, 0x11A9C}, {0x11A9E, 0x11AA2}, {0x11B00, 0x11B09}, {0x11C41, 0x11C45}, {0x11C70, 0x11C71},
      {0x11EF7, 0x11EF8}, {0x11F43, 0x11F4F}, {0x11FFF, 0x11FFF}, {0x12FF1, 0x12FF2}, {0x16E97, 0x16E9A},
      {0x16FE2, 0x16FE2}, {0x1E95E, 0x1E95F}};
  for (const auto& r : kNewerPunct)
    if (c >= r[0] && c <= r[1]) return false;
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

// ---- UTF-8 helpers on std::string --------------------------------------------------------------

template <typename F>  // f(char32_t) -> bool: keep
std::string filter_chars(const std::string& s, F keep) {
  std::u32string out;
  for (char32_t c : utf8_decode(s))
    if (keep(c)) out += c;
  return utf8_encode(out);
}

std::string lower(const std::string& s) {
  std::u32string out;
  for (char32_t c : utf8_decode(s)) push_lower(c, out);
  return utf8_encode(out);
}

// A normalization form through utf8proc: NFC, NFD, NFKC or NFKD.
std::string normalization_form(const std::string& s, utf8proc_option_t form) {
  if (s.empty()) return s;
  utf8proc_uint8_t* out = nullptr;
  const auto* in = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  const utf8proc_ssize_t n =
      utf8proc_map(in, utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(UTF8PROC_STABLE | form));
  ATTN_CHECK(n >= 0, "Expected text utf8proc can normalize, but got its error '", utf8proc_errmsg(n), "' instead");
  std::string r(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return r;
}

// ---- the pieces of the pipeline, as tokenizer.json names them ------------------------------------

// SplitDelimiterBehavior: what NormalizedString::split does with the pieces that matched.
enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

// NormalizedString::split: the [begin, end) ranges to keep of a string cut into `m` (covering it).
std::vector<std::pair<size_t, size_t>> split_ranges(const std::vector<hf::Piece>& m, Behavior b) {
  std::vector<std::pair<size_t, size_t>> out;
  bool prev = false;
  switch (b) {
    case Behavior::isolated:
      for (const hf::Piece& p : m) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::removed:
      for (const hf::Piece& p : m)
        if (!p.match) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::contiguous:  // runs of matches, and of non-matches, each one piece
      for (const hf::Piece& p : m) {
        if (p.match == prev && !out.empty()) out.back().second = p.end;
        else out.emplace_back(p.begin, p.end);
        prev = p.match;
      }
      break;
    case Behavior::merged_with_previous:  // a match joins the piece before it
      for (const hf::Piece& p : m) {
        if (p.match && !prev && !out.empty()) out.back().second = p.end;
        else out.emplace_back(p.begin, p.end);
        prev = p.match;
      }
      break;
    case Behavior::merged_with_next:  // a match joins the piece after it (the same fold, from the end)
      for (size_t i = m.size(); i-- > 0;) {
        const hf::Piece& p = m[i];
        if (p.match && !prev && !out.empty()) out.back().first = p.begin;
        else out.emplace_back(p.begin, p.end);
        prev = p.match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  return out;
}

// Pattern for a char predicate: every character of s (valid UTF-8) that is(c) its own match, the
// stretches between them not.
template <typename Is>
std::vector<hf::Piece> char_matches(const std::string& s, Is is) {
  if (s.empty()) return {{0, 0, false}};
  std::vector<hf::Piece> out;
  size_t last = 0;
  for (size_t at = 0; at < s.size();) {
    size_t n = 1;  // the UTF-8 length from the lead byte
    const auto b = static_cast<unsigned char>(s[at]);
    if (b >= 0xF0) n = 4;
    else if (b >= 0xE0) n = 3;
    else if (b >= 0xC0) n = 2;
    if (is(utf8_decode(std::string_view(s).substr(at, n))[0])) {
      if (last < at) out.push_back({last, at, false});
      out.push_back({at, at + n, true});
      last = at + n;
    }
    at += n;
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
  return out;
}

// Rust's char::is_numeric: the number categories Nd, Nl, No.
bool is_numeric(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

// A "pattern" of Split and Replace: {"String": s} (matched as it is) or {"Regex": r}.
hf::Regex pattern_of(const json& part, const std::string& where) {
  const json& p = part.contains("pattern") ? part["pattern"] : json();
  const bool literal = p.is_object() && p.contains("String") && p["String"].is_string();
  ATTN_CHECK(literal || (p.is_object() && p.contains("Regex") && p["Regex"].is_string()),
             "Expected \"pattern\" {\"String\": ...} or {\"Regex\": ...} in ", where, ", but got ", hf::brief(p),
             " instead");
  return hf::Regex(p[literal ? "String" : "Regex"].get<std::string>(), literal, where);
}

// The replacement of every match of `re` in s by `content` (NormalizedString::replace, Replace's decoder).
std::string replace_all(const hf::Regex& re, const std::string& s, const std::string& content) {
  std::string out;
  for (const hf::Piece& p : re.find_matches(s)) out += p.match ? content : s.substr(p.begin, p.end - p.begin);
  return out;
}

// The Whitespace pre-tokenizer's \w+|[^\w\s]+, with Rust's regex crate's \w (Alphabetic, marks, decimal
// digits, connector punctuation, joiners) and \s (White_Space) spelled out: PCRE2's \w is letters and
// numbers only.
const hf::Regex& whitespace_pattern() {
  static const hf::Regex re(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+)"
                            R"(|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)", false,
                            "Whitespace's pattern");
  return re;
}

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
const hf::Regex& gpt2_pattern() {
  static const hf::Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", false,
                            "ByteLevel's pattern");
  return re;
}

std::string byte_level(const std::string& s) {
  std::string out;
  for (unsigned char b : s) out += hf::byte_char(b);
  return out;
}

struct Normalizer {
  enum class Kind { bert, nfc, nfd, nfkc, nfkd, lowercase, strip_accents, strip, prepend, replace, byte_level };
  Kind kind;
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;  // BertNormalizer
  bool left = true, right = true;                                                 // Strip
  std::string content;                                                            // Prepend, Replace
  hf::Regex pattern;                                                              // Replace
};

enum class PrependScheme { always, first, never };

struct PreTokenizer {
  enum class Kind { bert, byte_level, split, metaspace, whitespace, whitespace_split, digits, punctuation, delimiter };
  Kind kind;
  bool add_prefix_space = true, use_regex = true;  // ByteLevel
  hf::Regex pattern;                               // Split
  Behavior behavior = Behavior::isolated;          // Split, Punctuation
  bool individual_digits = false;                  // Digits
  char32_t delimiter = U' ';                       // CharDelimiterSplit
  bool invert = false;
  std::string replacement = "\u2581";  // Metaspace: ▁
  PrependScheme prepend = PrependScheme::always;
  bool split = true;
};

struct Decoder {
  enum class Kind { wordpiece, byte_level, metaspace, byte_fallback, fuse, strip, replace, bpe };
  Kind kind;
  std::string prefix = "##";  // WordPiece
  bool cleanup = true;
  char32_t content = U' ';    // Strip
  size_t start = 0, stop = 0;
  hf::Regex pattern;          // Replace
  std::string text;           // Replace's content, BPEDecoder's suffix, Metaspace's replacement
  bool prepend_never = false;  // Metaspace
};

// A piece of text on its way through the pre-tokenizers; at_start: it begins where the input began
// (Metaspace's prepend_scheme "first" asks).
struct Split {
  std::string text;
  bool at_start;
};

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
  std::vector<Normalizer> normalizers;       // in order (a Sequence flattened)
  std::vector<PreTokenizer> pre_tokenizers;  // in order
  // model: WordPiece or BPE
  hf::Vocab vocab;
  std::vector<std::string> tokens;  // id -> token (model's and added)
  std::optional<hf::Bpe> bpe;       // none: WordPiece
  std::string unk;
  int64_t unk_id = -1, max_chars = 100;
  std::string prefix = "##";
  std::vector<AddedToken> added_raw, added_normalized;  // longest first
  std::unordered_map<int64_t, bool> special_of;         // added token id -> special
  // post-processor, single sequence: the special tokens before and after it
  std::vector<std::pair<std::string, int64_t>> before, after;
  int64_t max_length = 0;
  bool truncate_left = false;
  int64_t pad = -1;
  std::vector<Decoder> decoders;  // none: the tokens joined by spaces

  std::string normalize(std::string s) const;
  void pre_tokenize(std::vector<Split>& splits) const;
  void model(const std::string& word, Encoding& enc) const;
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

namespace {

std::string type_of(const json& part, const std::string& name, const std::string& where) {
  if (part.is_null()) return "";
  ATTN_CHECK(part.is_object() && part.contains("type") && part["type"].is_string(), "Expected ", name, " in ", where,
             " to be an object with a \"type\", but got ", hf::brief(part), " instead");
  return part["type"].get<std::string>();
}

// The items of a Sequence's `key` list.
const json& items_of(const json& part, const char* key, const std::string& where) {
  ATTN_CHECK(part.contains(key) && part[key].is_array(), "Expected \"", key, "\" (a list) in ", where, ", but got ",
             hf::brief(part), " instead");
  return part[key];
}

// The components `part` names (one, or a Sequence's `list` of them, nested ones flattened), each read by
// one(part, type, where it is) into `out`; the Sequence of a tokenizer.json component is its list in order.
template <typename T, typename F>
void add_components(const json& part, const char* what, const char* list, const std::string& where,
                    std::vector<T>& out, F one) {
  const std::string type = type_of(part, cat("a \"", what, "\""), where);
  if (type == "Sequence") {
    for (const json& item : items_of(part, list, cat("the Sequence ", what, " of ", where)))
      add_components(item, what, list, where, out, one);
    return;
  }
  out.push_back(one(part, type, cat("the \"", type, "\" ", what, " of ", where)));
}

Normalizer normalizer_of(const json& n, const std::string& type, const std::string& nw) {
  using K = Normalizer::Kind;
  static const std::pair<const char*, K> kPlain[] = {{"NFC", K::nfc}, {"NFD", K::nfd}, {"NFKC", K::nfkc},
      {"NFKD", K::nfkd}, {"Lowercase", K::lowercase}, {"StripAccents", K::strip_accents}, {"ByteLevel", K::byte_level}};
  for (const auto& [name, kind] : kPlain)  // the ones without options
    if (type == name) return {kind};
  Normalizer x{K::bert};
  if (type == "BertNormalizer") {
    x.clean_text = hf::field_or<bool>(n, "clean_text", nw, true);
    x.chinese = hf::field_or<bool>(n, "handle_chinese_chars", nw, true);
    x.lowercase = hf::field_or<bool>(n, "lowercase", nw, true);
    x.strip_accents = hf::field_or<bool>(n, "strip_accents", nw, x.lowercase);  // null: as lowercase
  } else if (type == "Strip") {
    x.kind = K::strip;
    x.left = hf::field_or<bool>(n, "strip_left", nw, true);
    x.right = hf::field_or<bool>(n, "strip_right", nw, true);
  } else if (type == "Prepend") {
    x.kind = K::prepend;
    x.content = hf::field<std::string>(n, "prepend", nw);
  } else if (type == "Replace") {
    x.kind = K::replace;
    x.pattern = pattern_of(n, nw);
    x.content = hf::field<std::string>(n, "content", nw);
  } else {
    throw Error(cat("Expected a \"normalizer\" BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, "
                    "Prepend, Replace, ByteLevel, Sequence or none, but got ", nw, " instead"));
  }
  return x;
}

Behavior behavior_of(const json& p, const std::string& where) {
  const std::string b = hf::field<std::string>(p, "behavior", where);
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  throw Error(cat("Expected \"behavior\" Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous in ",
                  where, ", but got \"", b, "\" instead"));
}

PrependScheme metaspace_scheme(const json& p, const std::string& where) {
  // prepend_scheme (default "always"); files written before it have add_prefix_space, false meaning never
  const std::string s = hf::field_or<std::string>(p, "prepend_scheme", where, "always");
  ATTN_CHECK(s == "first" || s == "never" || s == "always", "Expected \"prepend_scheme\" first, always or never in ",
             where, ", but got \"", s, "\" instead");
  PrependScheme scheme = s == "first"   ? PrependScheme::first
                         : s == "never" ? PrependScheme::never
                                        : PrependScheme::always;
  if (!hf::field_or<bool>(p, "add_prefix_space", where, true)) {
    ATTN_CHECK(scheme == PrependScheme::never || !p.contains("prepend_scheme"), "Expected add_prefix_space false to "
               "come with prepend_scheme never in ", where, ", but got \"", s, "\" instead");
    scheme = PrependScheme::never;
  }
  return scheme;
}

std::string one_char(const json& p, const char* key, const std::string& where, const char* fallback) {
  const std::string s = hf::field_or<std::string>(p, key, where, fallback);
  ATTN_CHECK(utf8_decode(s).size() == 1, "Expected \"", key, "\" in ", where, " to be one character, but got '", s,
             "' instead");
  return s;
}

PreTokenizer pre_tokenizer_of(const json& p, const std::string& type, const std::string& pw) {
  using K = PreTokenizer::Kind;
  if (type == "Whitespace") return {K::whitespace};
  if (type == "WhitespaceSplit") return {K::whitespace_split};
  PreTokenizer x{K::bert};
  if (type == "BertPreTokenizer") {
  } else if (type == "ByteLevel") {
    x.kind = K::byte_level;
    x.add_prefix_space = hf::field_or<bool>(p, "add_prefix_space", pw, true);
    x.use_regex = hf::field_or<bool>(p, "use_regex", pw, true);
  } else if (type == "Split") {
    x.kind = K::split;
    x.pattern = pattern_of(p, pw);
    x.behavior = behavior_of(p, pw);
    x.invert = hf::field_or<bool>(p, "invert", pw, false);
  } else if (type == "Metaspace") {
    x.kind = K::metaspace;
    x.replacement = one_char(p, "replacement", pw, "\u2581");
    x.prepend = metaspace_scheme(p, pw);
    x.split = hf::field_or<bool>(p, "split", pw, true);
  } else if (type == "Digits") {
    x.kind = K::digits;
    x.individual_digits = hf::field_or<bool>(p, "individual_digits", pw, false);
  } else if (type == "Punctuation") {
    x.kind = K::punctuation;
    x.behavior = p.contains("behavior") ? behavior_of(p, pw) : Behavior::isolated;
  } else if (type == "CharDelimiterSplit") {
    x.kind = K::delimiter;
    x.delimiter = utf8_decode(one_char(p, "delimiter", pw, " "))[0];
  } else {
    throw Error(cat("Expected a \"pre_tokenizer\" BertPreTokenizer, ByteLevel, Split, Metaspace, Whitespace, "
                    "WhitespaceSplit, Digits, Punctuation, CharDelimiterSplit, Sequence or none, but got ", pw,
                    " instead"));
  }
  return x;
}

Decoder decoder_of(const json& d, const std::string& type, const std::string& dw) {
  using K = Decoder::Kind;
  static const std::pair<const char*, K> kPlain[] = {
      {"ByteLevel", K::byte_level}, {"ByteFallback", K::byte_fallback}, {"Fuse", K::fuse}};
  for (const auto& [name, kind] : kPlain)  // the ones without options
    if (type == name) return {kind};
  Decoder x{K::wordpiece};
  if (type == "WordPiece") {
    x.prefix = hf::field_or<std::string>(d, "prefix", dw, "##");
    x.cleanup = hf::field_or<bool>(d, "cleanup", dw, true);
  } else if (type == "Metaspace") {
    x.kind = K::metaspace;
    x.text = one_char(d, "replacement", dw, "\u2581");
    x.prepend_never = metaspace_scheme(d, dw) == PrependScheme::never;
  } else if (type == "Strip") {
    x.kind = K::strip;
    x.content = utf8_decode(one_char(d, "content", dw, " "))[0];
    x.start = size_t(std::max<int64_t>(0, hf::field_or<int64_t>(d, "start", dw, 0)));
    x.stop = size_t(std::max<int64_t>(0, hf::field_or<int64_t>(d, "stop", dw, 0)));
  } else if (type == "Replace") {
    x.kind = K::replace;
    x.pattern = pattern_of(d, dw);
    x.text = hf::field<std::string>(d, "content", dw);
  } else if (type == "BPEDecoder") {
    x.kind = K::bpe;
    x.text = hf::field_or<std::string>(d, "suffix", dw, "</w>");
  } else {
    throw Error(cat("Expected a \"decoder\" WordPiece, ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
                    "BPEDecoder, Sequence or none, but got ", dw, " instead"));
  }
  return x;
}

using Specials = std::vector<std::pair<std::string, int64_t>>;

// A post-processor's special tokens around a single sequence, added to `before` and `after` (a Sequence
// of processors wraps them in order: the later ones outside).
void add_post_processor(const json& post, const std::string& where, Specials& before, Specials& after) {
  const std::string type = type_of(post, "a \"post_processor\"", where);
  Specials b, a;
  if (type.empty() || type == "ByteLevel") {  // ByteLevel trims offsets only, which attn does not keep
    return;
  } else if (type == "Sequence") {
    for (const json& item : items_of(post, "processors", where)) add_post_processor(item, where, before, after);
    return;
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* k : {"cls", "sep"}) {
      const json& p = post.contains(k) ? post[k] : json();
      ATTN_CHECK(p.is_array() && p.size() == 2 && p[0].is_string() && p[1].is_number_integer(), "Expected \"", k,
                 "\" [token, id] in the post-processor of ", where, ", but got ", hf::brief(p), " instead");
      (std::string(k) == "cls" ? b : a).emplace_back(p[0].get<std::string>(), p[1].get<int64_t>());
    }
  } else if (type == "TemplateProcessing") {
    const json& single = post.contains("single") ? post["single"] : json();
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
      ATTN_CHECK(st.is_object() && st["ids"].is_array() && st["tokens"].is_array() &&
                     st["ids"].size() == st["tokens"].size(),
                 "Expected special_tokens[\"", name, "\"] with ids and tokens in the post-processor of ", where,
                 ", but got ", hf::brief(st), " instead");
      for (size_t i = 0; i < st["ids"].size(); ++i)
        (seen ? a : b).emplace_back(st["tokens"][i].get<std::string>(), st["ids"][i].get<int64_t>());
    }
  } else {
    throw Error(cat("Expected a \"post_processor\" BertProcessing, RobertaProcessing, TemplateProcessing, ByteLevel, "
                    "Sequence or none in ", where, ", but got \"", type, "\" instead"));
  }
  before.insert(before.begin(), b.begin(), b.end());
  after.insert(after.end(), a.begin(), a.end());
}

}  // namespace

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

  // model
  const json& model = part("model");
  const std::string mtype = type_of(model, "\"model\"", where);
  ATTN_CHECK(mtype == "WordPiece" || mtype == "BPE", "Expected a \"model\" of type WordPiece or BPE in ", where,
             ", but got \"", mtype, "\" instead");
  const std::string mw = cat("the ", mtype, " model of ", where);
  ATTN_CHECK(model.contains("vocab") && model["vocab"].is_object(), "Expected \"vocab\" (token -> id) in ", mw,
             ", but got none instead");
  for (const auto& [tok, id] : model["vocab"].items()) {
    ATTN_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "Expected the id of '", tok, "' in ", mw,
               " to be an integer >= 0, but got ", hf::brief(id), " instead");
    t->vocab[tok] = id.get<int64_t>();
  }
  if (mtype == "BPE") {
    t->bpe.emplace(model, t->vocab, mw);
  } else {
    t->unk = hf::field<std::string>(model, "unk_token", mw);
    t->prefix = hf::field_or<std::string>(model, "continuing_subword_prefix", mw, "##");
    t->max_chars = hf::field_or<int64_t>(model, "max_input_chars_per_word", mw, 100);
    auto unk = t->vocab.find(t->unk);
    ATTN_CHECK(unk != t->vocab.end(), "Expected the unk_token '", t->unk, "' in the vocabulary of ", mw,
               ", but got none instead");
    t->unk_id = unk->second;
  }

  // normalizer, pre-tokenizer, post-processor, decoder
  if (!part("normalizer").is_null())
    add_components(part("normalizer"), "normalizer", "normalizers", where, t->normalizers, normalizer_of);
  if (!part("pre_tokenizer").is_null())
    add_components(part("pre_tokenizer"), "pre_tokenizer", "pretokenizers", where, t->pre_tokenizers, pre_tokenizer_of);
  add_post_processor(part("post_processor"), where, t->before, t->after);
  if (!part("decoder").is_null()) add_components(part("decoder"), "decoder", "decoders", where, t->decoders, decoder_of);

  // added tokens (their ids may extend the vocabulary); a normalized one is matched in normalized text
  int64_t size = 0;
  for (const auto& [tok, id] : t->vocab) size = std::max(size, id + 1);
  std::vector<std::pair<std::string, int64_t>> added_text;  // content as written, id
  if (auto a = j.find("added_tokens"); a != j.end() && a->is_array()) {
    for (const json& x : *a) {
      const std::string aw = cat("an added token of ", where);
      const std::string content = hf::field<std::string>(x, "content", aw);
      AddedToken at{utf8_decode(content), hf::field<int64_t>(x, "id", aw), hf::field_or<bool>(x, "special", aw, false),
                    hf::field_or<bool>(x, "single_word", aw, false), hf::field_or<bool>(x, "lstrip", aw, false),
                    hf::field_or<bool>(x, "rstrip", aw, false), hf::field_or<bool>(x, "normalized", aw, true)};
      ATTN_CHECK(at.id >= 0 && !at.content.empty(), "Expected an added token with content and an id >= 0 in ", where,
                 ", but got ", hf::brief(x), " instead");
      size = std::max(size, at.id + 1);
      added_text.emplace_back(content, at.id);
      t->special_of[at.id] = at.special;
      if (at.normalized) {
        at.content = utf8_decode(t->normalize(content));
        if (at.content.empty()) continue;  // normalized to nothing: never matches
      }
      (at.normalized ? t->added_normalized : t->added_raw).push_back(std::move(at));
    }
  }
  t->tokens.assign(size_t(size), "");
  for (const auto& [tok, id] : t->vocab) t->tokens[size_t(id)] = tok;
  for (const auto& [content, id] : added_text) t->tokens[size_t(id)] = content;
  for (auto* set : {&t->added_raw, &t->added_normalized})
    std::stable_sort(set->begin(), set->end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
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
  return HfTokenizer(std::move(t));
}

std::string HfTokenizer::Impl::normalize(std::string s) const {
  using K = Normalizer::Kind;
  for (const Normalizer& n : normalizers) {
    switch (n.kind) {
      case K::bert: {
        std::u32string a, out;
        for (char32_t c : utf8_decode(s)) {  // clean_text: drop NUL, U+FFFD and controls; whitespace -> ' '
          if (n.clean_text && (c == 0 || c == 0xFFFD || is_control(c))) continue;
          if (n.chinese && is_chinese(c)) {
            a += U' ';
            a += c;
            a += U' ';
            continue;
          }
          a += n.clean_text && is_whitespace(c) ? U' ' : c;
        }
        if (n.strip_accents) {  // NFD, then drop the nonspacing marks (Mn)
          std::u32string b;
          for (char32_t c : nfd(a))
            if (category(c) != UTF8PROC_CATEGORY_MN) b += c;
          a = std::move(b);
        }
        if (n.lowercase) {
          for (char32_t c : a) push_lower(c, out);
        } else {
          out = std::move(a);
        }
        s = utf8_encode(out);
        break;
      }
      case K::nfc: s = normalization_form(s, UTF8PROC_COMPOSE); break;
      case K::nfd: s = normalization_form(s, UTF8PROC_DECOMPOSE); break;
      case K::nfkc: s = normalization_form(s, utf8proc_option_t(UTF8PROC_COMPOSE | UTF8PROC_COMPAT)); break;
      case K::nfkd: s = normalization_form(s, utf8proc_option_t(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT)); break;
      case K::lowercase: s = lower(s); break;
      case K::strip_accents: {  // the combining marks (M*) out
        s = filter_chars(s, [](char32_t c) {
          const auto k = category(c);
          return k != UTF8PROC_CATEGORY_MN && k != UTF8PROC_CATEGORY_MC && k != UTF8PROC_CATEGORY_ME;
        });
        break;
      }
      case K::strip: {
        std::u32string u = utf8_decode(s);
        size_t a = 0, b = u.size();
        if (n.left)
          while (a < b && is_whitespace(u[a])) ++a;
        if (n.right)
          while (b > a && is_whitespace(u[b - 1])) --b;
        s = utf8_encode(std::u32string_view(u).substr(a, b - a));
        break;
      }
      case K::prepend:
        if (!s.empty()) s = n.content + s;
        break;
      case K::replace: s = replace_all(n.pattern, s, n.content); break;
      case K::byte_level: s = byte_level(s); break;
    }
  }
  return s;
}

void HfTokenizer::Impl::pre_tokenize(std::vector<Split>& splits) const {
  using K = PreTokenizer::Kind;
  std::vector<Split> next;
  // the ranges `keep` of s become pieces; empty ones are dropped (PreTokenizedString::split)
  auto emit = [&](const Split& from, const std::string& s, const std::vector<std::pair<size_t, size_t>>& keep) {
    for (const auto& [a, b] : keep)
      if (b > a) next.push_back({s.substr(a, b - a), from.at_start && a == 0});
  };
  for (const PreTokenizer& p : pre_tokenizers) {
    next.clear();
    for (Split& sp : splits) {
      switch (p.kind) {
        case K::bert: {  // split on whitespace (removed) and punctuation (each its own piece)
          std::u32string w;
          bool first = sp.at_start;
          auto flush = [&] {
            if (!w.empty()) next.push_back({utf8_encode(w), first});
            w.clear();
            first = false;
          };
          for (char32_t c : utf8_decode(sp.text)) {
            if (is_whitespace(c) || is_punctuation(c)) {
              flush();
              if (!is_whitespace(c)) next.push_back({utf8_encode(std::u32string(1, c)), first});
              first = false;
              continue;
            }
            w += c;
          }
          flush();
          break;
        }
        case K::byte_level: {
          std::string s = sp.text;
          if (p.add_prefix_space && !s.starts_with(' ')) s = " " + s;
          if (!p.use_regex) {
            next.push_back({byte_level(s), sp.at_start});
            break;
          }
          const size_t from = next.size();
          emit(sp, s, split_ranges(gpt2_pattern().find_matches(s), Behavior::isolated));
          for (size_t i = from; i < next.size(); ++i) next[i].text = byte_level(next[i].text);
          break;
        }
        case K::split: {
          std::vector<hf::Piece> m = p.pattern.find_matches(sp.text);
          if (p.invert)
            for (hf::Piece& x : m) x.match = !x.match;
          emit(sp, sp.text, split_ranges(m, p.behavior));
          break;
        }
        case K::metaspace: {
          std::string s;
          for (char c : sp.text) c == ' ' ? s += p.replacement : s += c;
          const bool prepend = p.prepend == PrependScheme::always || (p.prepend == PrependScheme::first && sp.at_start);
          if (prepend && !s.starts_with(p.replacement)) s = p.replacement + s;
          const char32_t rep = utf8_decode(p.replacement)[0];
          if (p.split) emit(sp, s, split_ranges(char_matches(s, [&](char32_t c) { return c == rep; }),
                                                Behavior::merged_with_next));
          else emit(sp, s, {{0, s.size()}});
          break;
        }
        case K::whitespace: {  // the pattern's matches kept, the whitespace between them removed
          std::vector<hf::Piece> m = whitespace_pattern().find_matches(sp.text);
          for (hf::Piece& x : m) x.match = !x.match;
          emit(sp, sp.text, split_ranges(m, Behavior::removed));
          break;
        }
        case K::whitespace_split:
          emit(sp, sp.text, split_ranges(char_matches(sp.text, is_whitespace), Behavior::removed));
          break;
        case K::digits:
          emit(sp, sp.text, split_ranges(char_matches(sp.text, is_numeric),
                                         p.individual_digits ? Behavior::isolated : Behavior::contiguous));
          break;
        case K::punctuation:
          emit(sp, sp.text, split_ranges(char_matches(sp.text, is_punctuation), p.behavior));
          break;
        case K::delimiter:
          emit(sp, sp.text, split_ranges(char_matches(sp.text, [&](char32_t c) { return c == p.delimiter; }),
                                         Behavior::removed));
          break;
      }
    }
    std::swap(splits, next);
  }
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

void HfTokenizer::Impl::model(const std::string& word, Encoding& enc) const {
  if (!bpe) return wordpiece(utf8_decode(word), enc);
  const size_t from = enc.ids.size();
  bpe->tokenize(word, vocab, enc.ids);
  for (size_t i = from; i < enc.ids.size(); ++i) enc.tokens.push_back(tokens[size_t(enc.ids[i])]);
}

Encoding HfTokenizer::encode(std::string_view text, bool add_special_tokens, int64_t max_length) const {
  const Impl& t = *impl_;
  const std::u32string s = utf8_decode(text);  // invalid UTF-8: an Error naming the byte offset
  Encoding body;
  std::vector<Split> splits;
  // a stretch between raw added tokens: normalized, split by the normalized added tokens, pre-tokenized
  auto run = [&](size_t a, size_t b) {
    const std::u32string n = utf8_decode(t.normalize(utf8_encode(std::u32string_view(s).substr(a, b - a))));
    split_added(
        n, t.added_normalized,
        [&](size_t c, size_t d) {
          splits.assign(1, {utf8_encode(std::u32string_view(n).substr(c, d - c)), a == 0 && c == 0});
          t.pre_tokenize(splits);
          for (const Split& w : splits) t.model(w.text, body);
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
  Encoding out;
  for (const auto& [tok, id] : t.before) out.ids.push_back(id), out.tokens.push_back(tok);
  out.ids.insert(out.ids.end(), body.ids.begin(), body.ids.end());
  out.tokens.insert(out.tokens.end(), body.tokens.begin(), body.tokens.end());
  for (const auto& [tok, id] : t.after) out.ids.push_back(id), out.tokens.push_back(tok);
  return out;
}

namespace {

// One decoder's decode_chain: tokens in, tokens out.
std::vector<std::string> decode_chain(const Decoder& d, std::vector<std::string> toks) {
  using K = Decoder::Kind;
  switch (d.kind) {
    case K::wordpiece:
      for (size_t i = 0; i < toks.size(); ++i) {
        std::string& tok = toks[i];
        if (i != 0) {
          if (tok.starts_with(d.prefix)) tok.erase(0, d.prefix.size());
          else tok = " " + tok;
        }
        if (d.cleanup) {  // the library's cleanup(), on each token with its leading space
          static const std::pair<const char*, const char*> kRules[] = {
              {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
              {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
          for (const auto& [from, to] : kRules) {
            const std::string f = from, r = to;
            for (size_t p = tok.find(f); p != std::string::npos; p = tok.find(f, p + r.size()))
              tok.replace(p, f.size(), r);
          }
        }
      }
      return toks;
    case K::byte_level: {  // each token's characters back to bytes (a token with other characters: as it is)
      std::string bytes;
      for (const std::string& tok : toks) {
        std::string b;
        bool all = true;
        for (char32_t c : utf8_decode(tok)) {
          const int v = hf::char_byte(c);
          if (v < 0) {
            all = false;
            break;
          }
          b += char(v);
        }
        bytes += all ? b : tok;
      }
      return {hf::utf8_lossy(bytes)};
    }
    case K::metaspace:  // the replacement character back to a space, dropped in the first token
      for (size_t i = 0; i < toks.size(); ++i) {
        std::string out;
        for (size_t p = 0; p < toks[i].size();) {
          if (toks[i].compare(p, d.text.size(), d.text) == 0) {
            if (i != 0 || d.prepend_never) out += ' ';
            p += d.text.size();
          } else {
            out += toks[i][p++];
          }
        }
        toks[i] = std::move(out);
      }
      return toks;
    case K::byte_fallback: {  // runs of <0xXX> tokens become their text, or one U+FFFD per byte if not UTF-8
      std::vector<std::string> out;
      std::string run;
      size_t run_len = 0;
      auto flush = [&] {
        if (!run_len) return;
        if (hf::utf8_lossy(run) == run) {
          out.push_back(run);
        } else {
          for (size_t i = 0; i < run_len; ++i) out.push_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_len = 0;
      };
      for (std::string& tok : toks) {
        const bool hex = tok.size() == 6 && tok.starts_with("<0x") && tok.back() == '>' &&
                         std::isxdigit(uint8_t(tok[3])) && std::isxdigit(uint8_t(tok[4]));
        if (hex) {
          run += char(std::stoi(tok.substr(3, 2), nullptr, 16));
          ++run_len;
          continue;
        }
        flush();
        out.push_back(std::move(tok));
      }
      flush();
      return out;
    }
    case K::fuse: {
      std::string all;
      for (const std::string& tok : toks) all += tok;
      return {all};
    }
    case K::strip:  // up to `start` leading and `stop` trailing `content` characters of each token
      for (std::string& tok : toks) {
        const std::u32string u = utf8_decode(tok);
        size_t a = 0, b = u.size();
        while (a < d.start && a < b && u[a] == d.content) ++a;
        for (size_t i = 0; i < d.stop && b > a && u[b - 1] == d.content; ++i) --b;
        tok = utf8_encode(std::u32string_view(u).substr(a, b - a));
      }
      return toks;
    case K::replace:
      for (std::string& tok : toks) tok = replace_all(d.pattern, tok, d.text);
      return toks;
    case K::bpe:  // end_of_word_suffix -> a space, none after the last token
      for (size_t i = 0; i < toks.size(); ++i) {
        const std::string by = i + 1 == toks.size() ? "" : " ";
        for (size_t p = toks[i].find(d.text); p != std::string::npos; p = toks[i].find(d.text, p + by.size()))
          toks[i].replace(p, d.text.size(), by);
      }
      return toks;
  }
  return toks;
}

}  // namespace

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  for (int64_t id : ids) {
    auto a = t.special_of.find(id);
    if (a != t.special_of.end() && skip_special_tokens && a->second) continue;
    toks.push_back(id_to_token(id));
  }
  std::string out;
  if (t.decoders.empty()) {
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  for (const Decoder& d : t.decoders) toks = decode_chain(d, std::move(toks));
  for (const std::string& tok : toks) out += tok;
  return out;
}

int64_t HfTokenizer::vocab_size() const { return int64_t(impl_->tokens.size()); }

int64_t HfTokenizer::token_to_id(const std::string& token) const {
  for (const auto* set : {&impl_->added_raw, &impl_->added_normalized})
    for (const AddedToken& a : *set)
      if (impl_->tokens[size_t(a.id)] == token) return a.id;
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

std::string HfTokenizer::id_to_token(int64_t id) const {
  ATTN_CHECK(id >= 0 && id < vocab_size() && (impl_->special_of.count(id) || !impl_->tokens[size_t(id)].empty()),
             "Expected a token id in the vocabulary of '", impl_->path, "' (", vocab_size(), " ids), but got ", id,
             " instead");
  return impl_->tokens[size_t(id)];
}

int64_t HfTokenizer::pad_id() const { return impl_->pad; }
int64_t HfTokenizer::max_length() const { return impl_->max_length; }

}  // namespace attn
