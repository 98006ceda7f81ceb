// The bounded parse and the short rendering of json.h. The nesting is measured on the text before
// nlohmann parses it (one pass over the bytes), so a value nested 100,000 deep never becomes a tree.
#include "json.h"

#include <algorithm>

namespace attn::json_io {

namespace {

// The deepest nesting of [ and { in `text` outside strings (a string's \" and \\ escapes skipped).
// For text that is not JSON the number means nothing; the parse refuses that text anyway.
int nesting(std::string_view text) {
  int depth = 0, most = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      most = std::max(most, ++depth);
      if (most > kMaxDepth) return most;  // deep enough to refuse
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return most;
}

}  // namespace

json parse(std::string_view text, const std::string& what, const std::string& path) {
  ATTN_CHECK(nesting(text) <= kMaxDepth, "Expected ", what, " '", path, "' nested at most ", kMaxDepth,
             " levels deep (as the tokenizers and safetensors libraries read JSON), but got deeper nesting instead");
  return json::parse(text, nullptr, false);
}

std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

}  // namespace attn::json_io
