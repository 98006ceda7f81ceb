// Token strings made safe to draw and to embed: UTF-8 repair and visible stand-ins for blanks.
// Not a tokenizer: a token is whatever string the caller gives.
#include <cstdint>

#include "attn/viz.h"

namespace attn::viz {
namespace {

// The code point starting at s[i] (advancing i past it), or -1 for an invalid sequence (advancing one
// byte). Rejects overlong forms, surrogates and values past U+10FFFF, as RFC 3629 does.
int32_t next_code_point(const std::string& s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t b = byte(i);
  int n = b < 0x80 ? 0 : (b >> 5) == 0x6 ? 1 : (b >> 4) == 0xE ? 2 : (b >> 3) == 0x1E ? 3 : -1;
  if (n < 0 || i + n >= s.size()) return ++i, -1;  // bad lead byte or truncated
  int32_t cp = n == 0 ? b : b & (0x3F >> n);
  for (int k = 1; k <= n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return ++i, -1;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr int32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return ++i, -1;
  i += n + 1;
  return cp;
}

void append_utf8(std::string& out, int32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

constexpr int32_t kReplacement = 0xFFFD;

}  // namespace

std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int32_t cp = next_code_point(s, i);
    append_utf8(out, cp < 0 ? kReplacement : cp);
  }
  return out;
}

std::string display_token(const std::string& token, int max_chars) {
  if (token.empty()) return "\u2205";  // ∅
  const bool all_spaces = token.find_first_not_of(' ') == std::string::npos;
  std::string out;
  int count = 0;
  for (size_t i = 0; i < token.size();) {
    if (count == max_chars) return out + "\u2026";  // …
    int32_t cp = next_code_point(token, i);
    if (cp < 0) cp = kReplacement;
    else if (cp == '\n') cp = 0x23CE;        // ⏎
    else if (cp == '\t') cp = 0x21E5;        // ⇥
    else if (cp < 0x20) cp = 0x2400 + cp;    // control pictures: ␍ ␀ ...
    else if (cp == 0x7F) cp = 0x2421;        // ␡
    else if (cp == ' ' && all_spaces) cp = 0x2423;  // ␣
    append_utf8(out, cp);
    ++count;
  }
  return out;
}

}  // namespace attn::viz
