// Strict UTF-8 (RFC 3629) and the character-level tokenizer. Not a Unicode library: no normalisation,
// no grapheme clusters; a code point is a token.
#include "attn/tokenizer.h"

#include <algorithm>
#include <cstdio>

#include "attn/check.h"

namespace attn {
namespace {

std::string hex_byte(unsigned char b) {
  char s[8];
  std::snprintf(s, sizeof s, "0x%02X", b);
  return s;
}

std::string code_point_name(char32_t c) {
  char s[16];
  std::snprintf(s, sizeof s, "U+%04X", unsigned(c));
  return s;
}

template <typename U>
void store_le(unsigned char* p, U v) {
  for (size_t k = 0; k < sizeof(U); ++k) p[k] = static_cast<unsigned char>(v >> (8 * k));
}

bool encodable(char32_t c) { return c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF); }

// The code point starting at bytes[i]; advances i. Throws naming offset i.
char32_t decode_one(std::string_view bytes, size_t& i) {
  const size_t start = i;
  const auto b0 = static_cast<unsigned char>(bytes[i]);
  auto fail = [&](const char* what) {
    throw Error(cat("Expected valid UTF-8, but got ", what, " (byte ", hex_byte(b0), ") at byte offset ", start,
                    " instead"));
  };
  if (b0 < 0x80) return ++i, b0;
  int len = 0;
  char32_t c = 0, min = 0;  // min: the smallest code point that needs `len` bytes (below it: overlong)
  if ((b0 & 0xE0) == 0xC0) len = 2, c = b0 & 0x1F, min = 0x80;
  else if ((b0 & 0xF0) == 0xE0) len = 3, c = b0 & 0x0F, min = 0x800;
  else if ((b0 & 0xF8) == 0xF0) len = 4, c = b0 & 0x07, min = 0x10000;
  else if ((b0 & 0xC0) == 0x80) fail("a continuation byte without a lead byte");
  else fail("a byte that never occurs in UTF-8");
  for (int k = 1; k < len; ++k) {
    if (start + k >= bytes.size()) fail("a sequence truncated by the end of the text");
    const auto b = static_cast<unsigned char>(bytes[start + k]);
    if ((b & 0xC0) != 0x80) fail("a sequence cut short by a byte that is not a continuation byte");
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min) fail("an overlong encoding");
  if (c >= 0xD800 && c <= 0xDFFF) fail("an encoded surrogate");
  if (c > 0x10FFFF) fail("a code point past U+10FFFF");
  i = start + len;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  ATTN_CHECK(encodable(c), "Expected a Unicode scalar value, but got ", code_point_name(c), " instead");
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

}  // namespace

std::u32string utf8_decode(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) out += decode_one(bytes, i);
  return out;
}

std::string utf8_encode(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) append_utf8(out, c);
  return out;
}

int64_t code_points(std::string_view utf8) {
  int64_t n = 0;
  for (const char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// One pass with a bit per code point (136 KB), not the text's code points sorted (4 bytes per character).
CharTokenizer CharTokenizer::from_text(std::string_view text) {
  std::vector<bool> seen(0x110000);
  for (size_t i = 0; i < text.size();) seen[decode_one(text, i)] = true;
  std::u32string cps;
  for (char32_t c = 0; c < 0x110000; ++c)
    if (seen[c]) cps += c;
  return CharTokenizer(std::move(cps));
}

CharTokenizer::CharTokenizer(std::u32string vocab) : vocab_(std::move(vocab)) {
  ATTN_CHECK(!vocab_.empty(), "Expected a vocabulary of at least one character, but got an empty one instead");
  for (size_t i = 0; i < vocab_.size(); ++i) {
    ATTN_CHECK(encodable(vocab_[i]), "Expected vocabulary entries that are Unicode scalar values, but got ",
               code_point_name(vocab_[i]), " at index ", i, " instead");
    ATTN_CHECK(i == 0 || vocab_[i - 1] < vocab_[i],
               "Expected a vocabulary sorted by code point without repeats, but got ", code_point_name(vocab_[i]),
               " after ", code_point_name(vocab_[i - 1]), " at index ", i, " instead");
  }
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(size_t(code_points(text)));
  encode_into(text, 4, reinterpret_cast<unsigned char*>(ids.data()));
  return ids;
}

void CharTokenizer::encode_into(std::string_view text, int width, unsigned char* out) const {
  ATTN_CHECK(width == 1 || width == 2 || width == 4, "Expected a token width of 1, 2 or 4 bytes, but got ", width,
             " instead");
  ATTN_CHECK(width >= id_width(), "Expected a token width that holds ", vocab_.size(), " ids, but got ", width,
             " bytes instead");
  int32_t ascii[128];  // the id of each ASCII character, -1 if not in the vocabulary
  for (char32_t c = 0; c < 128; ++c) {
    auto it = std::lower_bound(vocab_.begin(), vocab_.end(), c);
    ascii[c] = it != vocab_.end() && *it == c ? int32_t(it - vocab_.begin()) : -1;
  }
  for (size_t i = 0; i < text.size(); out += width) {
    const size_t at = i;
    const char32_t c = decode_one(text, i);
    int32_t id = c < 128 ? ascii[c] : -1;
    if (id < 0) {
      auto it = std::lower_bound(vocab_.begin(), vocab_.end(), c);
      if (it == vocab_.end() || *it != c) {
        std::string shown;
        append_utf8(shown, c);
        throw Error(cat("Expected characters of the vocabulary (", vocab_.size(), " characters), but got '", shown,
                        "' (", code_point_name(c), ") at byte offset ", at, " instead"));
      }
      id = int32_t(it - vocab_.begin());
    }
    if (width == 1) *out = static_cast<unsigned char>(id);
    else if (width == 2) store_le(out, uint16_t(id));
    else store_le(out, uint32_t(id));
  }
}

std::string CharTokenizer::decode(const int32_t* ids, int64_t n) const {
  std::string out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    ATTN_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "Expected token ids in [0, ", vocab_size(), "), but got ", ids[i],
               " at position ", i, " instead");
    append_utf8(out, vocab_[size_t(ids[i])]);
  }
  return out;
}

}  // namespace attn
