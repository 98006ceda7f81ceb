// The stages of a tokenizer.json pipeline (attn/hf_tokenizer.h), one file each, each component's reading
// from the JSON beside what it does: hf_normalizers.cpp, hf_pre_tokenizers.cpp, hf_models.cpp (WordPiece;
// BPE is hf_bpe.cpp), hf_post_processors.cpp, hf_decoders.cpp; hf_tokenizer.cpp runs them in order (added
// tokens first). What several stages share is here and in hf_pipeline.cpp: the Unicode properties as
// Rust's char methods define them, the patterns of Split and Replace, GPT-2's byte-level alphabet applied
// to a string, and how a component or a Sequence of them is read. Private to src/model.
#pragma once
#include <utf8proc.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/check.h"
#include "attn/hf_tokenizer.h"
#include "hf_bpe.h"
#include "hf_json.h"
#include "hf_regex.h"

namespace attn::hf {

// ---- Unicode properties, as Rust's char methods and the unicode_categories crate define them ----

inline utf8proc_category_t category(char32_t c) { return utf8proc_category(utf8proc_int32_t(c)); }
// char::is_whitespace: the White_Space property, which is Zs, Zl, Zp and the controls \t \n \v \f \r U+0085.
bool is_whitespace(char32_t c);

// ---- what several stages share ----

// A "pattern" of Split and Replace: {"String": s} (matched as it is) or {"Regex": r}.
Regex pattern_of(const json& part, const std::string& where);
// The replacement of every match of `re` in s by `content` (NormalizedString::replace, Replace's decoder).
std::string replace_all(const Regex& re, const std::string& s, const std::string& content, RegexBudget& budget);
// Each byte of s as GPT-2's byte-level alphabet spells it (hf_bpe.h's byte_char).
std::string byte_level(const std::string& s);

// Metaspace's prepend_scheme (the pre-tokenizer's and the decoder's).
enum class PrependScheme { always, first, never };
PrependScheme metaspace_scheme(const json& p, const std::string& where);
// A string field of one character (`fallback` when absent).
std::string one_char(const json& p, const char* key, const std::string& where, const char* fallback);

// The "type" of a component ("" for null), or an Error naming `name` and `where`.
std::string type_of(const json& part, const std::string& name, const std::string& where);
// The items of a Sequence's `key` list.
const json& items_of(const json& part, const char* key, const std::string& where);

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

// ---- normalizers (hf_normalizers.cpp) ----

struct Normalizer {
  enum class Kind { bert, nfc, nfd, nfkc, nfkd, lowercase, strip_accents, strip, prepend, replace, byte_level };
  Kind kind;
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;  // BertNormalizer
  bool left = true, right = true;                                                 // Strip
  std::string content;                                                            // Prepend, Replace
  Regex pattern;                                                                  // Replace
};
// The normalizer of `type` in `n`; `where` names it in the file.
Normalizer normalizer_of(const json& n, const std::string& type, const std::string& where);
// s through the normalizers in order; their patterns' work from `budget`.
std::string normalize(const std::vector<Normalizer>& normalizers, std::string s, RegexBudget& budget);

// ---- pre-tokenizers (hf_pre_tokenizers.cpp) ----

// SplitDelimiterBehavior: what NormalizedString::split does with the pieces that matched.
enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreTokenizer {
  enum class Kind { bert, byte_level, split, metaspace, whitespace, whitespace_split, digits, punctuation, delimiter };
  Kind kind;
  bool add_prefix_space = true, use_regex = true;  // ByteLevel
  Regex pattern;                                   // Split
  Behavior behavior = Behavior::isolated;          // Split, Punctuation
  bool individual_digits = false;                  // Digits
  char32_t delimiter = U' ';                       // CharDelimiterSplit
  bool invert = false;
  std::string replacement = "\u2581";  // Metaspace: ▁
  PrependScheme prepend = PrependScheme::always;
  bool split = true;
};

// A piece of text on its way through the pre-tokenizers; at_start: it begins where the input began
// (Metaspace's prepend_scheme "first" asks).
struct Split {
  std::string text;
  bool at_start;
};

PreTokenizer pre_tokenizer_of(const json& p, const std::string& type, const std::string& where);
// Each pre-tokenizer in order cuts every piece further (PreTokenizedString::split; empty pieces dropped);
// their patterns' work from `budget`.
void pre_tokenize(const std::vector<PreTokenizer>& pre_tokenizers, std::vector<Split>& splits, RegexBudget& budget);

// ---- models (hf_models.cpp): WordPiece, or BPE (hf_bpe.h) ----

// Token ids are at most this: the library keeps them as u32 (a larger one is its load error), and the
// BPE merge table packs two of them into 64 bits.
constexpr int64_t kMaxTokenId = 4294967295;

struct Model {
  Vocab vocab;
  std::optional<Bpe> bpe;  // none: WordPiece
  std::string unk;         // WordPiece's
  int64_t unk_id = -1, max_chars = 100;
  std::string prefix = "##";
  size_t longest = 0;  // code points of the vocabulary's longest token: no longer piece can match

  // tokenizer.json's "model" object; `where` names the file.
  static Model read(const json& model, const std::string& where);
  // The ids of one pre-tokenized word, appended to `ids`.
  void tokenize(const std::string& word, std::vector<int64_t>& ids) const;

 private:
  void wordpiece(const std::u32string& word, std::vector<int64_t>& ids) const;
};

// ---- post-processors (hf_post_processors.cpp) ----

using Specials = std::vector<std::pair<std::string, int64_t>>;
// A post-processor's special tokens around a single sequence, added to `before` and `after` (a Sequence
// of processors wraps them in order: the later ones outside).
void add_post_processor(const json& post, const std::string& where, Specials& before, Specials& after);
// body with `before` ahead of it and `after` behind it.
Encoding post_process(const Specials& before, const Specials& after, const Encoding& body);

// ---- decoders (hf_decoders.cpp) ----

struct Decoder {
  enum class Kind { wordpiece, byte_level, metaspace, byte_fallback, fuse, strip, replace, bpe };
  Kind kind;
  std::string prefix = "##";  // WordPiece
  bool cleanup = true;
  char32_t content = U' ';    // Strip
  size_t start = 0, stop = 0;
  Regex pattern;              // Replace
  std::string text;           // Replace's content, BPEDecoder's suffix, Metaspace's replacement
  bool prepend_never = false;  // Metaspace
};
Decoder decoder_of(const json& d, const std::string& type, const std::string& where);
// The text of tokens through the decoders in order (none: the tokens joined by spaces); Replace's work from
// a budget for the tokens' bytes.
std::string decode_tokens(const std::vector<Decoder>& decoders, std::vector<std::string> tokens);

}  // namespace attn::hf
