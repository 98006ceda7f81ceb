// What the stages of a tokenizer.json pipeline share (see hf_pipeline.h): White_Space, the patterns of
// Split and Replace, the byte-level alphabet over a string, Metaspace's options, and how a component is
// read from the JSON. Not a stage itself.
#include "hf_pipeline.h"

#include "attn/tokenizer.h"

namespace attn::hf {

bool is_whitespace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x85) return true;
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

Regex pattern_of(const json& part, const std::string& where) {
  const json& p = part.contains("pattern") ? part["pattern"] : json();
  const bool literal = p.is_object() && p.contains("String") && p["String"].is_string();
  ATTN_CHECK(literal || (p.is_object() && p.contains("Regex") && p["Regex"].is_string()),
             "Expected \"pattern\" {\"String\": ...} or {\"Regex\": ...} in ", where, ", but got ", brief(p),
             " instead");
  return Regex(p[literal ? "String" : "Regex"].get<std::string>(), literal, where);
}

std::string replace_all(const Regex& re, const std::string& s, const std::string& content, RegexBudget& budget) {
  std::string out;
  for (const Piece& p : re.find_matches(s, budget)) out += p.match ? content : s.substr(p.begin, p.end - p.begin);
  return out;
}

std::string byte_level(const std::string& s) {
  std::string out;
  for (unsigned char b : s) out += byte_char(b);
  return out;
}

PrependScheme metaspace_scheme(const json& p, const std::string& where) {
  // prepend_scheme (default "always"); files written before it have add_prefix_space, false meaning never
  const std::string s = field_or<std::string>(p, "prepend_scheme", where, "always");
  ATTN_CHECK(s == "first" || s == "never" || s == "always", "Expected \"prepend_scheme\" first, always or never in ",
             where, ", but got \"", s, "\" instead");
  PrependScheme scheme = s == "first"   ? PrependScheme::first
                         : s == "never" ? PrependScheme::never
                                        : PrependScheme::always;
  if (!field_or<bool>(p, "add_prefix_space", where, true)) {
    ATTN_CHECK(scheme == PrependScheme::never || !p.contains("prepend_scheme"), "Expected add_prefix_space false to "
               "come with prepend_scheme never in ", where, ", but got \"", s, "\" instead");
    scheme = PrependScheme::never;
  }
  return scheme;
}

std::string one_char(const json& p, const char* key, const std::string& where, const char* fallback) {
  const std::string s = field_or<std::string>(p, key, where, fallback);
  ATTN_CHECK(utf8_decode(s).size() == 1, "Expected \"", key, "\" in ", where, " to be one character, but got '", s,
             "' instead");
  return s;
}

std::string type_of(const json& part, const std::string& name, const std::string& where) {
  if (part.is_null()) return "";
  ATTN_CHECK(part.is_object() && part.contains("type") && part["type"].is_string(), "Expected ", name, " in ", where,
             " to be an object with a \"type\", but got ", brief(part), " instead");
  return part["type"].get<std::string>();
}

const json& items_of(const json& part, const char* key, const std::string& where) {
  ATTN_CHECK(part.contains(key) && part[key].is_array(), "Expected \"", key, "\" (a list) in ", where, ", but got ",
             brief(part), " instead");
  return part[key];
}

}  // namespace attn::hf
