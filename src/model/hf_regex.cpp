// PCRE2 behind hf_regex.h: compiled once per pattern (JIT where PCRE2 has it, the same matches either
// way), matched with fresh match data and limits per call, so one Regex serves several threads. Each
// search's match limit comes out of the input's RegexBudget, doubling from RegexBudget::kFirst.
#include "hf_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "attn/check.h"

namespace attn::hf {

namespace {

// Oniguruma's \s (the library's engine, Unicode encodings) is the White_Space property; PCRE2's also has
// U+180E (Mongolian vowel separator, a format character since Unicode 6.3) and Oniguruma keeps it out
// (`tokenizers` does not split "a\u180e\u180eb" as whitespace). So \s and \S become that set, inside a
// class its ranges; everything else is PCRE2's.
constexpr const char* kWhiteSpace = "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
                                    "\\x{202f}\\x{205f}\\x{3000}";

std::string oniguruma_spaces(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[++i];
      if (n == 's') out += in_class ? std::string(kWhiteSpace) : cat("[", kWhiteSpace, "]");
      else if (n == 'S' && !in_class) out += cat("[^", kWhiteSpace, "]");
      else out += {c, n};
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is a member
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) : pattern_(pattern), where_(where) {
  const std::string p = literal ? pattern : oniguruma_spaces(pattern);
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                   literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(cat("Expected a regular expression PCRE2 compiles in ", where, ", but got '", pattern,
                    "' instead (", reinterpret_cast<const char*>(msg), " at offset ", at, ")"));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // an error here leaves the interpreter, with the same matches
  code_ = std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
}

namespace {

// The interpreter's frames for one search (the JIT's stack is its own, 32 KiB; a search that needs more
// runs in the interpreter instead): 256 MiB, against PCRE2's default of 20 GB.
constexpr uint32_t kHeapLimitKiB = 256 * 1024;

std::string pcre2_message(int rc) {
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(rc, msg, sizeof msg);
  return reinterpret_cast<const char*>(msg);
}

}  // namespace

std::vector<Piece> Regex::find_matches(std::string_view s, RegexBudget& budget) const {
  if (s.empty()) return {{0, 0, false}};
  auto* code = static_cast<const pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create_from_pattern(code, nullptr),
                                                                     pcre2_match_data_free);
  std::unique_ptr<pcre2_match_context, void (*)(pcre2_match_context*)> mc(pcre2_match_context_create(nullptr),
                                                                          pcre2_match_context_free);
  ATTN_CHECK(md && mc, "Expected memory for a regular expression's match data, but got none instead");
  pcre2_set_heap_limit(mc.get(), kHeapLimitKiB);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  // One search from `from`, its limit doubling while it runs out, every limit taken from the budget.
  auto search = [&](size_t from) {
    uint32_t options = PCRE2_NO_UTF_CHECK;
    uint64_t limit = std::min(RegexBudget::kFirst, budget.left);
    for (;;) {
      ATTN_CHECK(limit > 0, "Expected the regular expression '", pattern_, "' of ", where_, " to match ",
                 budget.bytes, " bytes of input within ", RegexBudget::kBase, " + ", RegexBudget::kPerByte,
                 " per byte PCRE2 steps, but got a pattern that backtracks more on this text instead");
      pcre2_set_match_limit(mc.get(), uint32_t(std::min<uint64_t>(limit, UINT32_MAX)));
      const int rc = pcre2_match(code, subject, s.size(), from, options, md.get(), mc.get());
      budget.left -= limit;
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !(options & PCRE2_NO_JIT)) {  // the same search, frames on the heap
        options |= PCRE2_NO_JIT;
      } else if (rc == PCRE2_ERROR_MATCHLIMIT) {
        limit = std::min(2 * limit, budget.left);
      } else {
        ATTN_CHECK(rc >= 0 || rc == PCRE2_ERROR_NOMATCH, "Expected the regular expression '", pattern_, "' of ",
                   where_, " to run, but got PCRE2's '", pcre2_message(rc), "' instead");
        return rc;
      }
      limit = std::min(limit, budget.left);
    }
  };
  std::vector<Piece> out;
  size_t prev = 0, from = 0;
  bool matched_before = false;  // did a match end at `prev`
  while (from <= s.size()) {
    const int rc = search(from);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (b == e && matched_before && e == prev) {  // empty right after a match: try one character on
      if (from >= s.size()) break;
      ++from;
      while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
      continue;
    }
    if (b != prev) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
    matched_before = true;
    if (e == b) {  // an empty match: the next search starts a character later
      if (e >= s.size()) break;
      from = e + 1;
      while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
    } else {
      from = e;
    }
  }
  if (prev != s.size()) out.push_back({prev, s.size(), false});
  return out;
}

}  // namespace attn::hf
