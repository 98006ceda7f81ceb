// The regular expressions of tokenizer.json (Split and Replace patterns, ByteLevel's GPT-2 pattern) on
// PCRE2 with UTF-8 and Unicode properties (\p{L}, lookahead), and the `tokenizers` library's way of
// cutting a string by them (Pattern::find_matches: pieces that cover the string, each a match or not).
// Private to src/model. Not Oniguruma, the library's engine: the patterns tokenizer files use mean the
// same in both, except \s, which is rewritten to Oniguruma's White_Space set (see hf_regex.cpp).
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attn::hf {

struct Piece {  // [begin, end) bytes of the string
  size_t begin, end;
  bool match;
};

class Regex {
 public:
  Regex() = default;
  // `pattern` a regular expression, or with literal = true a string matched as it is. An Error naming
  // `where`, the pattern and PCRE2's message when it does not compile.
  Regex(const std::string& pattern, bool literal, const std::string& where);
  bool empty() const { return !code_; }
  // The leftmost-first matches of `s` (valid UTF-8), non-overlapping, and the stretches between them, in
  // order; an empty s gives one piece (0, 0) that is no match. An empty match right after the previous
  // match is skipped (as Oniguruma's find_iter does).
  std::vector<Piece> find_matches(std::string_view s) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8
};

}  // namespace attn::hf
