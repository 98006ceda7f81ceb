// libFuzzer target: a tokenizer.json (HfTokenizer::from_file) on arbitrary bytes, then encoding and
// decoding with it. The input is the file, optionally followed by a NUL byte and a text: the text (or a
// fixed one) is encoded with and without special tokens, and its ids decoded. Every input must load and
// run or throw attn::Error; a crash, a sanitizer report, a hang past -timeout or any other exception is a
// finding. Seeds (tests/fuzz/corpus/tokenizer): small files of each model, normalizer, pre-tokenizer,
// post-processor and decoder kind the reader supports. Built by `make fuzz` (clang).
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "attn/check.h"
#include "attn/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/attn_fuzz_tokenizer_" + std::to_string(::getpid()) + ".json";
  const char* bytes = reinterpret_cast<const char*>(data);
  const char* nul = static_cast<const char*>(std::memchr(bytes, 0, size));
  const size_t file_size = nul ? size_t(nul - bytes) : size;
  const std::string text = nul ? std::string(nul + 1, bytes + size) : std::string("Hello, wörld! 12345 héllo  <s>x");
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes, std::streamsize(file_size));
  try {
    const attn::HfTokenizer t = attn::HfTokenizer::from_file(path);
    for (bool special : {true, false}) {
      const attn::Encoding e = t.encode(text, special);
      t.decode(e.ids, true);
      t.decode(e.ids, false);
    }
    t.encode(text, true, 3);  // truncation
  } catch (const attn::Error&) {
  }
  return 0;
}
