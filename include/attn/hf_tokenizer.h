// Tokenizers from a Hugging Face tokenizer.json, giving the ids the `tokenizers` library gives: added
// (special) tokens split out of the raw text first, then the normalizer, the pre-tokenizer and the model,
// then the post-processor's special tokens and the file's truncation. Supported: the models WordPiece
// (BERT) and BPE (GPT-2's and Llama's byte-level BPE: merges in either form, byte_fallback, ignore_merges,
// unk_token, continuing_subword_prefix, end_of_word_suffix); the normalizers BertNormalizer, NFC, NFD,
// NFKC, NFKD, Lowercase, StripAccents, Strip, Prepend, Replace, ByteLevel; the pre-tokenizers
// BertPreTokenizer, ByteLevel, Split (a regular expression or a string, every behavior, invert),
// Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation and CharDelimiterSplit; the post-processors
// BertProcessing, RobertaProcessing, TemplateProcessing and ByteLevel; the decoders WordPiece, ByteLevel,
// Metaspace, ByteFallback, Fuse, Strip, Replace, BPEDecoder; and Sequence of each. Unicode data from
// utf8proc, regular expressions from PCRE2. Not a trainer, no offsets, and not every component: one the file
// names that is not supported is an Error naming it, never a silent difference.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace attn {

struct Encoding {
  std::vector<int64_t> ids;
  std::vector<std::string> tokens;  // the token strings, as the vocabulary spells them ("##ing", "[CLS]")
};

class HfTokenizer {
 public:
  // Reads tokenizer.json; an Error naming the file and the part it can't use.
  static HfTokenizer from_file(const std::string& path);
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer();

  // Valid UTF-8 (an Error naming the byte offset otherwise, where the library refuses a Python str that
  // can't be one). add_special_tokens: the post-processor's ([CLS] ... [SEP]); truncation to max_length
  // tokens, special ones included (-1: as the file says, 0: none). The file's padding is not applied:
  // callers pad batches themselves (Pretrained::embed: to each batch's longest, at no cost).
  Encoding encode(std::string_view text, bool add_special_tokens = true, int64_t max_length = -1) const;
  // The text of ids, through the file's decoder; skip_special_tokens drops the special added tokens.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;

  int64_t vocab_size() const;                         // the model's vocabulary plus the added tokens
  int64_t token_to_id(const std::string& token) const;  // -1 if none
  std::string id_to_token(int64_t id) const;            // an Error for an unknown id
  int64_t pad_id() const;                             // the file's padding id, else [PAD]'s, else 0
  int64_t max_length() const;                         // the file's truncation length (0: none)

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn
