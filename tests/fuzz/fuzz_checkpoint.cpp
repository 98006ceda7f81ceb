// libFuzzer target: the checkpoint loader (config.json included) on arbitrary bytes. The input is
// 4 bytes (little-endian length n of config.json), n bytes of config.json, then model.safetensors. When
// the first byte is odd and config.json parses as an object, its recorded hashes are recomputed, so
// mutations reach the schema checks behind them (a random edit never matches an FNV-1a by chance).
// Every input must load or throw attn::Error; anything else is a finding. Built by `make fuzz` (clang).
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "../../src/train/checkpoint.h"
#include "attn/train.h"

namespace {

void write(const std::string& path, const void* p, size_t n) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(static_cast<const char*>(p), std::streamsize(n));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using attn::ckpt::json;
  static const std::string dir = "/tmp/attn_fuzz_checkpoint_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  if (size < 4) return 0;
  uint32_t n;
  std::memcpy(&n, data, 4);
  if (n > size - 4) return 0;
  std::string config(reinterpret_cast<const char*>(data) + 4, n);
  const uint8_t* model = data + 4 + n;
  const size_t model_size = size - 4 - n;
  if (data[0] & 1) {
    json j = json::parse(config, nullptr, false);
    if (j.is_object()) {
      j["model_file"] = {{"name", "model.safetensors"}, {"bytes", model_size},
                         {"fnv1a64", attn::ckpt::hex64(attn::fnv1a64(model, model_size))}};
      j["config_fnv1a64"] = attn::ckpt::config_hash(j);
      config = j.dump(-1, ' ', false, json::error_handler_t::replace);
    }
  }
  write(dir + "/config.json", config.data(), config.size());
  write(dir + "/model.safetensors", model, model_size);
  try {
    attn::LoadedModel m = attn::load_model(dir);
  } catch (const attn::Error&) {
  }
  return 0;
}
