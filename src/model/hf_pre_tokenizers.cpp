// tokenizer.json's pre-tokenizers (see hf_pipeline.h), each read from the file and applied as the
// `tokenizers` library's pre_tokenizers/*.rs do: BertPreTokenizer, ByteLevel (GPT-2's pattern), Split (a
// regular expression or a string, every behavior, invert), Metaspace, Whitespace, WhitespaceSplit,
// Digits, Punctuation, CharDelimiterSplit. Each cuts every piece further, as PreTokenizedString::split
// does, empty pieces dropped. Not UnicodeScripts or FixedLength: refused by name.
#include <algorithm>

#include "attn/tokenizer.h"
#include "hf_pipeline.h"

namespace attn::hf {

namespace {

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

// Rust's char::is_numeric: the number categories Nd, Nl, No.
bool is_numeric(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

// NormalizedString::split: the [begin, end) ranges to keep of a string cut into `m` (covering it).
std::vector<std::pair<size_t, size_t>> split_ranges(const std::vector<Piece>& m, Behavior b) {
  std::vector<std::pair<size_t, size_t>> out;
  bool prev = false;
  switch (b) {
    case Behavior::isolated:
      for (const Piece& p : m) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::removed:
      for (const Piece& p : m)
        if (!p.match) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::contiguous:  // runs of matches, and of non-matches, each one piece
      for (const Piece& p : m) {
        if (p.match == prev && !out.empty()) out.back().second = p.end;
        else out.emplace_back(p.begin, p.end);
        prev = p.match;
      }
      break;
    case Behavior::merged_with_previous:  // a match joins the piece before it
      for (const Piece& p : m) {
        if (p.match && !prev && !out.empty()) out.back().second = p.end;
        else out.emplace_back(p.begin, p.end);
        prev = p.match;
      }
      break;
    case Behavior::merged_with_next:  // a match joins the piece after it (the same fold, from the end)
      for (size_t i = m.size(); i-- > 0;) {
        const Piece& p = m[i];
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
std::vector<Piece> char_matches(const std::string& s, Is is) {
  if (s.empty()) return {{0, 0, false}};
  std::vector<Piece> out;
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

// The Whitespace pre-tokenizer's \w+|[^\w\s]+, with Rust's regex crate's \w (Alphabetic, marks, decimal
// digits, connector punctuation, joiners) and \s (White_Space) spelled out: PCRE2's \w is letters and
// numbers only.
const Regex& whitespace_pattern() {
  static const Regex re(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+)"
                        R"(|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)", false,
                        "Whitespace's pattern");
  return re;
}

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
const Regex& gpt2_pattern() {
  static const Regex re(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", false,
                        "ByteLevel's pattern");
  return re;
}

Behavior behavior_of(const json& p, const std::string& where) {
  const std::string b = field<std::string>(p, "behavior", where);
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  throw Error(cat("Expected \"behavior\" Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous in ",
                  where, ", but got \"", b, "\" instead"));
}

}  // namespace

PreTokenizer pre_tokenizer_of(const json& p, const std::string& type, const std::string& pw) {
  using K = PreTokenizer::Kind;
  if (type == "Whitespace") return {K::whitespace};
  if (type == "WhitespaceSplit") return {K::whitespace_split};
  PreTokenizer x{K::bert};
  if (type == "BertPreTokenizer") {
  } else if (type == "ByteLevel") {
    x.kind = K::byte_level;
    x.add_prefix_space = field_or<bool>(p, "add_prefix_space", pw, true);
    x.use_regex = field_or<bool>(p, "use_regex", pw, true);
  } else if (type == "Split") {
    x.kind = K::split;
    x.pattern = pattern_of(p, pw);
    x.behavior = behavior_of(p, pw);
    x.invert = field_or<bool>(p, "invert", pw, false);
  } else if (type == "Metaspace") {
    x.kind = K::metaspace;
    x.replacement = one_char(p, "replacement", pw, "\u2581");
    x.prepend = metaspace_scheme(p, pw);
    x.split = field_or<bool>(p, "split", pw, true);
  } else if (type == "Digits") {
    x.kind = K::digits;
    x.individual_digits = field_or<bool>(p, "individual_digits", pw, false);
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

void pre_tokenize(const std::vector<PreTokenizer>& pre_tokenizers, std::vector<Split>& splits, RegexBudget& budget) {
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
          emit(sp, s, split_ranges(gpt2_pattern().find_matches(s, budget), Behavior::isolated));
          for (size_t i = from; i < next.size(); ++i) next[i].text = byte_level(next[i].text);
          break;
        }
        case K::split: {
          std::vector<Piece> m = p.pattern.find_matches(sp.text, budget);
          if (p.invert)
            for (Piece& x : m) x.match = !x.match;
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
          std::vector<Piece> m = whitespace_pattern().find_matches(sp.text, budget);
          for (Piece& x : m) x.match = !x.match;
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

}  // namespace attn::hf
