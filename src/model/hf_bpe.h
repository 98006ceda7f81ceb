// The BPE model of tokenizer.json (models/bpe in the `tokenizers` library): a word's characters, each
// a vocabulary symbol (or its bytes as <0xXX> tokens with byte_fallback, or the unk token), merged pair by
// pair in the order of the merges list, lowest rank first and leftmost among equals; and GPT-2's
// byte-level alphabet that ByteLevel pre-tokenizers and decoders map bytes through. Private to
// src/model (hf_models.cpp). Not a trainer and not BPE-dropout (a file with dropout > 0 is refused).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hf_json.h"

namespace attn::hf {

using Vocab = std::unordered_map<std::string, int64_t>;

// GPT-2's bytes_to_unicode: byte b as the UTF-8 of its stand-in character (printable bytes stand for
// themselves, the others for U+0100 onwards), and back: the byte a code point stands for, or -1.
const std::string& byte_char(unsigned char b);
int char_byte(char32_t c);

// Rust's String::from_utf8_lossy: each maximal invalid stretch (as Unicode's "maximal subpart" rule cuts
// them) becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

class Bpe {
 public:
  // `model` is tokenizer.json's "model" object of type BPE and `vocab` its vocabulary; an Error naming
  // `where` for a merge whose parts or result are not in the vocabulary, or an unsupported option.
  Bpe(const json& model, const Vocab& vocab, const std::string& where);
  // The ids of one pre-tokenized word (non-empty), appended to `out`. Thread-safe (the cache is locked).
  void tokenize(const std::string& word, const Vocab& vocab, std::vector<int64_t>& out) const;

 private:
  std::vector<int64_t> merge_word(const std::string& word, const Vocab& vocab) const;
  struct Merge {
    uint32_t rank;
    int64_t id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, merged id
  std::string unk_, prefix_, suffix_;           // empty: none
  bool has_unk_ = false, fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  struct Cache;
  std::shared_ptr<Cache> cache_;  // word -> ids, for words under 256 bytes (as the library caches)
};

}  // namespace attn::hf
