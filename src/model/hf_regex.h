// The regular expressions of tokenizer.json (Split and Replace patterns, ByteLevel's GPT-2 pattern) on
// PCRE2 with UTF-8 and Unicode properties (\p{L}, lookahead), and the `tokenizers` library's way of
// cutting a string by them (Pattern::find_matches: pieces that cover the string, each a match or not).
// Private to src/model. Not Oniguruma, the library's engine: the patterns tokenizer files use mean the
// same in both, except \s, which is rewritten to Oniguruma's White_Space set (see hf_regex.cpp). The work
// of each input is bounded (RegexBudget).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attn::hf {

struct Piece {  // [begin, end) bytes of the string
  size_t begin, end;
  bool match;
};

// The matching work one input may cost, shared by every pattern it meets (one encode() of a text, one
// decode() of tokens), counted in PCRE2's match-limit steps (its backtracking points: a greedy loop over a
// word costs 1 or 2, a pattern like (a+)+b|a 2^n on a run of n a's). Each search is given a small limit
// first and twice that after each time it runs out, and every limit given is taken from the budget, so
// what is taken bounds what ran, the same on every machine. A pattern that backtracks past it is an Error
// naming the pattern and where it is, instead of minutes of work (a run of 18 a's and a space, 380 KB of
// it, through (a+)+b|a: 11 ms per 19 bytes, over 30 s).
struct RegexBudget {
  // kFirst: a search's first limit, above the 1 to 9 steps ordinary patterns take (measured with GPT-2's
  // and Llama 3's on words, runs of spaces and 100 KB without a break, with and without the JIT);
  // kBase: PCRE2's own default limit for one search, so that what PCRE2 alone would match in one search
  // still matches; kPerByte: 64 first tries per byte (a search consumes at least a character; a text meets
  // a few patterns, and normalizing can lengthen it).
  static constexpr uint64_t kFirst = 16, kBase = 10'000'000, kPerByte = 64 * kFirst;
  explicit RegexBudget(size_t bytes) : left(kBase + kPerByte * uint64_t(bytes)), bytes(bytes) {}
  uint64_t left;
  size_t bytes;  // of the input, for the message
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
  // match is skipped (as Oniguruma's find_iter does). The work is taken from `budget`: an Error naming the
  // pattern and `where` when it runs out, or when PCRE2 stops for another reason (its heap limit).
  std::vector<Piece> find_matches(std::string_view s, RegexBudget& budget) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8
  std::string pattern_, where_;  // as given, for messages
};

}  // namespace attn::hf
