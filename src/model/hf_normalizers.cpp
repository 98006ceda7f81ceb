// tokenizer.json's normalizers (see hf_pipeline.h), each read from the file and applied as the
// `tokenizers` library's normalizers/*.rs do: BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase,
// StripAccents, Strip, Prepend, Replace, ByteLevel. Unicode data from utf8proc. Not Precompiled (the
// SentencePiece charsmap): refused by name.
#include <algorithm>
#include <cstdlib>

#include "attn/tokenizer.h"
#include "hf_pipeline.h"

namespace attn::hf {

namespace {

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

// BertNormalizer's is_chinese_char: the CJK Unified Ideographs blocks it lists.
bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Canonical decomposition (NFD) of a code point sequence.
std::u32string nfd(const std::u32string& s) {
  if (s.empty()) return s;
  std::u32string out;
  utf8proc_int32_t tmp[32];
  int last_boundclass = 0;
  for (char32_t c : s) {
    const utf8proc_ssize_t n =
        utf8proc_decompose_char(utf8proc_int32_t(c), tmp, 32, UTF8PROC_DECOMPOSE, &last_boundclass);
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

}  // namespace

Normalizer normalizer_of(const json& n, const std::string& type, const std::string& nw) {
  using K = Normalizer::Kind;
  static const std::pair<const char*, K> kPlain[] = {{"NFC", K::nfc}, {"NFD", K::nfd}, {"NFKC", K::nfkc},
      {"NFKD", K::nfkd}, {"Lowercase", K::lowercase}, {"StripAccents", K::strip_accents}, {"ByteLevel", K::byte_level}};
  for (const auto& [name, kind] : kPlain)  // the ones without options
    if (type == name) return {kind};
  Normalizer x{K::bert};
  if (type == "BertNormalizer") {
    x.clean_text = field_or<bool>(n, "clean_text", nw, true);
    x.chinese = field_or<bool>(n, "handle_chinese_chars", nw, true);
    x.lowercase = field_or<bool>(n, "lowercase", nw, true);
    x.strip_accents = field_or<bool>(n, "strip_accents", nw, x.lowercase);  // null: as lowercase
  } else if (type == "Strip") {
    x.kind = K::strip;
    x.left = field_or<bool>(n, "strip_left", nw, true);
    x.right = field_or<bool>(n, "strip_right", nw, true);
  } else if (type == "Prepend") {
    x.kind = K::prepend;
    x.content = field<std::string>(n, "prepend", nw);
  } else if (type == "Replace") {
    x.kind = K::replace;
    x.pattern = pattern_of(n, nw);
    x.content = field<std::string>(n, "content", nw);
  } else {
    throw Error(cat("Expected a \"normalizer\" BertNormalizer, NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, "
                    "Prepend, Replace, ByteLevel, Sequence or none, but got ", nw, " instead"));
  }
  return x;
}

std::string normalize(const std::vector<Normalizer>& normalizers, std::string s, RegexBudget& budget) {
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
      case K::replace: s = replace_all(n.pattern, s, n.content, budget); break;
      case K::byte_level: s = byte_level(s); break;
    }
  }
  return s;
}

}  // namespace attn::hf
