// What config.json may hold beyond what a loader reads: the fields no architecture's function depends on
// at inference (ids, dtype, dropout rates, labels, bookkeeping), and the check that refuses every other field
// a loader does not read, by name. Private to src/model (the newer loaders: Mistral, Qwen2, Gemma 2, BLOOM,
// T5, BART; Llama's through the same reader).
#pragma once
#include <initializer_list>
#include <string>

#include "hf_json.h"

namespace attn::hf {

// An Error naming the first field of config `j` (at `where`) that is neither in `read` (the fields the
// loader of `architecture` reads and implements) nor inert at inference.
void check_fields(const json& j, const std::string& where, const std::string& architecture,
                  std::initializer_list<const char*> read);

// generation_config.json's `key` if `dir` has that file and it holds the key, else config's, else fallback;
// an integer (a token id) or null (fallback).
int64_t generation_id(const std::string& dir, const json& config, const char* key, int64_t fallback);

}  // namespace attn::hf
