// Reading the JSON files of a Hugging Face model directory (config.json, tokenizer.json, ...): the file
// read with file.h's checks and parsed, and core's typed field getters (src/core/json.h) under the names
// src/model uses. Private to src/model. Not a schema: each loader says which fields it needs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "../core/json.h"
#include "attn/check.h"
#include "attn/file.h"

namespace attn::hf {

using json = json_io::json;
using json_io::brief;
using json_io::field;
using json_io::field_or;

// Files a model directory holds are at most this large (tokenizer.json of a 250k vocabulary is ~20 MB).
constexpr uint64_t kMaxJsonBytes = uint64_t(1) << 30;

// The JSON object in the file at `path` (an array with `array`), read with file.h's checks and nesting
// bounded by json_io::parse; an Error naming `what` and the path for anything else.
inline json read_json(const std::string& path, const std::string& what, bool array = false) {
  json j = json_io::parse(read_regular_file(path, what, kMaxJsonBytes), what, path);
  ATTN_CHECK(!j.is_discarded() && (array ? j.is_array() : j.is_object()), "Expected ", what, " '", path,
             "' to hold a JSON ", array ? "array" : "object", ", but got text that is not one instead");
  return j;
}

// a · b for sizes a config.json implies (num_attention_heads · head_dim), or an Error naming `what` and
// `where` (the file) when the product does not fit in 64 bits: nothing is sized by a wrapped number.
inline int64_t product(int64_t a, int64_t b, const char* what, const std::string& where) {
  int64_t r;
  ATTN_CHECK(!__builtin_mul_overflow(a, b, &r), "Expected ", what, " in ", where, " to fit in 64 bits, but got ", a,
             " * ", b, " instead");
  return r;
}

// A norm's epsilon (layer_norm_eps, rms_norm_eps): a finite number >= 0, `fallback` where absent. A
// negative one gave NaN embeddings (sqrt of a negative variance + eps) with exit 0.
inline double epsilon(const json& j, const char* key, const std::string& where, double fallback) {
  const double eps = field_or<double>(j, key, where, fallback);
  ATTN_CHECK(eps >= 0, "Expected \"", key, "\" in ", where, " to be >= 0, but got ", eps, " instead");
  return eps;
}

// The token ids that end generation: generation_config.json's "eos_token_id" in `dir` if the file has one
// (transformers' generate reads it there), else `config`'s; an integer or a list of them; none: empty.
std::vector<int64_t> eos_token_ids(const std::string& dir, const json& config);

}  // namespace attn::hf
