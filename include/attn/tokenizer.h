// Character-level tokenizer: one token per Unicode code point, the vocabulary sorted by code point and
// built from a text, as nanoGPT's shakespeare_char. Strict UTF-8 in and out. Not a subword tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace attn {

// Code points of UTF-8 text. Throws attn::Error naming the byte offset and the problem for a stray
// continuation byte, a truncated or overlong sequence, a surrogate, or a value past U+10FFFF.
std::u32string utf8_decode(std::string_view bytes);
// The number of code points of valid UTF-8 (its bytes that are not continuation bytes).
int64_t code_points(std::string_view utf8);
// UTF-8 of code points; throws for a surrogate or a value past U+10FFFF.
std::string utf8_encode(std::u32string_view code_points);

class CharTokenizer {
 public:
  CharTokenizer() = default;
  // The sorted distinct code points of `text` (valid UTF-8).
  static CharTokenizer from_text(std::string_view text);
  // A saved vocabulary: strictly increasing code points, at least one.
  explicit CharTokenizer(std::u32string vocab);

  // Token ids of `text`; throws naming the character and its byte offset if it is not in the vocabulary.
  std::vector<int32_t> encode(std::string_view text) const;
  // The same ids written compactly: each as an unsigned little-endian integer of `width` bytes (1, 2 or
  // 4; the vocabulary must fit) at out[0], out[width], ...; `out` holds code_points(text) · width bytes.
  void encode_into(std::string_view text, int width, unsigned char* out) const;
  // Bytes per token that hold every id: 1 up to 256 characters, 2 up to 65,536, else 4.
  int id_width() const { return vocab_.size() <= 256 ? 1 : vocab_.size() <= 65536 ? 2 : 4; }

  // UTF-8 of token ids; throws for an id outside [0, vocab_size).
  std::string decode(const int32_t* ids, int64_t n) const;
  std::string decode(const std::vector<int32_t>& ids) const { return decode(ids.data(), int64_t(ids.size())); }

  int64_t vocab_size() const { return int64_t(vocab_.size()); }
  const std::u32string& vocab() const { return vocab_; }

 private:
  std::u32string vocab_;  // sorted code points; token id = index
};

}  // namespace attn
