// Drawing tokens from a language model's logits, and the decode loop every model shares (attn's own GPT,
// gpt.h, and the pretrained decoders, hf.h): prefill the prompt into the model's KV cache, then one token
// per step, greedy at temperature 0, top-k, seeded. Not a model and not a beam search.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "attn/kernels/half_kv.h"
#include "attn/rng.h"

namespace attn {

// Sampling options for generate(): temperature 0 is greedy (argmax); top_k 0 keeps every token.
// The defaults here are the library's one set, which the Python bindings take as their own (GPT.generate,
// from_pretrained(...).generate): greedy, as transformers' generate is, so a call without options repeats
// transformers' output. `attn generate` samples on purpose (tools/cli.h, GenerateCli, says why).
struct SampleOptions {
  int64_t max_new_tokens = 100;
  double temperature = 0.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  KvDtype kv_dtype = KvDtype::f32;  // how the KV cache stores K and V (f16/bf16: half the bytes per step)
  std::function<void(int64_t token)> on_token;  // if set, called with each new token as it is drawn
  // Generation ends after drawing one of these (which is returned, as transformers' generate does).
  std::vector<int64_t> eos_token_ids;
};

// A token drawn from logits (V): greedy at temperature 0 (the first maximum), else softmax(logits / T)
// over the top k (ties with the k-th kept, as nanoGPT), one uniform draw of rng.
int64_t sample_token(const float* logits, int64_t V, const SampleOptions& options, Rng& rng);

// The model side of the decode loop: runs tokens ids[0, n) through the model's KV cache (after clearing it
// when `restart`) and returns the logits (V) of the last one, valid until the next call.
using DecodeStep = std::function<const float*(const int64_t* ids, int64_t n, bool restart)>;

// Continues `prompt` (at least one token): prefills its last `context` tokens (context 0: all), then
// one token per step until max_new_tokens or an eos token. Once the cache holds `context` tokens it is
// refilled from the last context/2 (a position table ends there). Returns only the new tokens.
std::vector<int64_t> sample_loop(const std::vector<int64_t>& prompt, const SampleOptions& options, int64_t V,
                                 int64_t context, const DecodeStep& step);

}  // namespace attn
