// JSON from files users name (a model directory's config.json, tokenizer.json, modules.json; a
// checkpoint's config.json; a safetensors header's values in messages): one parse bounded in nesting, one
// typed field getter whose errors name the field and the file, one short rendering of a value for
// messages. Private to src/ (core, model, train). Not a schema: each reader says which fields it needs.
#pragma once
#include <cstdint>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "attn/check.h"

namespace attn::json_io {

using json = nlohmann::json;

// Containers nested deeper than this are refused before anything reads them: the Rust libraries that
// write and read these files (tokenizers, safetensors) parse with serde_json, which refuses a 128th
// level, and every recursive walk of a value (a copy, a dump for a message, a Sequence of Sequences)
// then stays shallow.
constexpr int kMaxDepth = 127;

// `text` parsed (a discarded value if it is not JSON), or an Error naming `what` and `path` when it nests
// deeper than kMaxDepth.
json parse(std::string_view text, const std::string& what, const std::string& path);

// A JSON value for an error message, cut short (a vocabulary is megabytes), invalid UTF-8 replaced.
std::string brief(const json& v);

// j[key] as T (bool, an integer type, double, std::string): `fallback` where the key is absent or null,
// else an Error naming the key and `where` (the file, and the part of it). Integers must fit T (-1 is no
// uint64_t, 2^40 no int32_t) and numbers be finite: nothing wraps or becomes inf on the way in.
template <typename T>
T field(const json& j, const char* key, const std::string& where, const T* fallback = nullptr) {
  auto it = j.is_object() ? j.find(key) : j.end();
  if (it == j.end() || it->is_null()) {
    ATTN_CHECK(fallback, "Expected ", where, " to have \"", key, "\", but got none instead");
    return *fallback;
  }
  const json& v = *it;
  bool ok;
  std::string want;
  if constexpr (std::is_same_v<T, bool>) {
    ok = v.is_boolean(), want = "a boolean";
  } else if constexpr (std::is_integral_v<T>) {
    using L = std::numeric_limits<T>;
    if (v.is_number_unsigned()) ok = v.get<uint64_t>() <= uint64_t(L::max());
    else if (v.is_number_integer())
      ok = v.get<int64_t>() >= 0 ? uint64_t(v.get<int64_t>()) <= uint64_t(L::max())
                                 : std::is_signed_v<T> && v.get<int64_t>() >= int64_t(L::min());
    else ok = false;
    want = std::is_same_v<T, int64_t>    ? "an integer that fits in 64 bits"
           : std::is_same_v<T, uint64_t> ? "a non-negative integer that fits in 64 bits"
                                         : cat("an integer in [", int64_t(L::min()), ", ", uint64_t(L::max()), "]");
  } else if constexpr (std::is_floating_point_v<T>) {
    ok = v.is_number() && std::isfinite(v.get<double>()), want = "a finite number";
  } else {
    ok = v.is_string(), want = "a string";
  }
  ATTN_CHECK(ok, "Expected \"", key, "\" in ", where, " to be ", want, ", but got ", brief(v), " instead");
  return v.get<T>();
}
template <typename T>
T field_or(const json& j, const char* key, const std::string& where, T fallback) {
  return field<T>(j, key, where, &fallback);
}

}  // namespace attn::json_io
