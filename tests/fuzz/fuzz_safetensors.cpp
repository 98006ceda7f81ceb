// libFuzzer target: load_safetensors on arbitrary bytes. Every input must load or throw attn::Error; a
// crash, a sanitizer report, a hang or any other exception is a finding. Built by `make fuzz` (clang).
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "attn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/attn_fuzz_safetensors_" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  try {
    std::map<std::string, std::string> meta;
    attn::StateDict sd = attn::load_safetensors(path, &meta);
  } catch (const attn::Error&) {
  }
  return 0;
}
