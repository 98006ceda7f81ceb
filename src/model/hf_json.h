// Reading the JSON files of a Hugging Face model directory (config.json, tokenizer.json, ...): the file
// read with file.h's checks, parsed, and typed field getters whose errors name the file and the field.
// Private to src/model. Not a schema: each loader says which fields it needs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/check.h"
#include "attn/file.h"

namespace attn::hf {

using json = nlohmann::json;

// Files a model directory holds are at most this large (tokenizer.json of a 250k vocabulary is ~20 MB).
constexpr uint64_t kMaxJsonBytes = uint64_t(1) << 30;

inline json read_json(const std::string& path, const std::string& what) {
  const std::string text = read_regular_file(path, what, kMaxJsonBytes);
  json j = json::parse(text, nullptr, false);
  ATTN_CHECK(!j.is_discarded() && j.is_object(), "Expected ", what, " '", path,
             "' to hold a JSON object, but got text that is not one instead");
  return j;
}

inline std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

// j[key] as T (int64_t, double, bool, std::string); `fallback` where the key is absent or null, or an
// Error naming `where` (the file) when there is no fallback or the value has another type.
template <typename T>
T field(const json& j, const char* key, const std::string& where, const T* fallback = nullptr) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    ATTN_CHECK(fallback, "Expected ", where, " to have \"", key, "\", but got none instead");
    return *fallback;
  }
  bool ok;
  if constexpr (std::is_same_v<T, bool>) ok = it->is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = it->is_number_integer();
  else if constexpr (std::is_floating_point_v<T>) ok = it->is_number();
  else ok = it->is_string();
  ATTN_CHECK(ok, "Expected \"", key, "\" in ", where, " to be ",
             std::is_same_v<T, bool> ? "a boolean" : std::is_integral_v<T> ? "an integer"
             : std::is_floating_point_v<T> ? "a number" : "a string",
             ", but got ", brief(*it), " instead");
  return it->get<T>();
}
template <typename T>
T field_or(const json& j, const char* key, const std::string& where, T fallback) {
  return field<T>(j, key, where, &fallback);
}

// The token ids that end generation: generation_config.json's "eos_token_id" in `dir` if the file has one
// (transformers' generate reads it there), else `config`'s; an integer or a list of them; none: empty.
std::vector<int64_t> eos_token_ids(const std::string& dir, const json& config);

}  // namespace attn::hf
