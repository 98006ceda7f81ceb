// Checkpoint directories on disk (private to src/train): the atomic write of the model.safetensors +
// config.json pair, the verified read, and the JSON forms of the configs. The format is described in
// include/attn/train.h. Not a general serialisation layer.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "attn/gpt.h"
#include "attn/safetensors.h"
#include "attn/tokenizer.h"
#include "attn/train.h"

namespace attn::ckpt {

using nlohmann::json;

// Writes DIR/model.safetensors (tensors) and DIR/config.json (config, completed with the checkpoint id
// and the model file's size and hash) into a new sibling directory, fsyncs, then swaps it in for DIR.
// DIR may be missing, empty or a checkpoint; anything else in it is an Error (it would be lost).
void write(const std::string& dir, const StateDict& tensors, json config);
// What write() checks before writing anything (see attn::check_checkpoint_dir); returns DIR normalised.
std::filesystem::path prepare(const std::string& dir);

struct Contents {
  json config;
  StateDict tensors;
};
// Reads and verifies a checkpoint directory before anything is built from it: format, the hash of
// config.json's own content, the id match, size and hash of model.safetensors, then config.json's schema
// (types and ranges of every field read, consistency with the tensors' shapes). json errors never escape:
// each problem is an attn::Error naming the file and the field.
Contents read(const std::string& dir);

// The directory swap, injectable so a test can run the fallback: renameat2(RENAME_EXCHANGE) by default;
// when it fails (a file system without it), the old directory is moved aside and the new one moved in.
using SwapFn = int (*)(const char* from, const char* to);
void set_swap_for_testing(SwapFn swap);  // nullptr: the default

json to_json(const GptConfig& c);
GptConfig gpt_config_from(const json& j, const std::string& where);
json to_json(const TrainOptions& o);
TrainOptions train_options_from(const json& j, const std::string& where);
json tokenizer_json(const CharTokenizer& t);
CharTokenizer tokenizer_from(const json& j, const std::string& where);

// "%016x" of a 64-bit hash, as checkpoints record them.
std::string hex64(uint64_t v);
// FNV-1a of config.json's content without its own hash field (what "config_fnv1a64" records).
std::string config_hash(json config);

// Splits "optim."-prefixed tensors (optimizer state) from the model's.
StateDict take_prefixed(StateDict& all, const std::string& prefix);

}  // namespace attn::ckpt
