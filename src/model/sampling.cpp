// The sampler and the decode loop of sampling.h, shared by generate() of gpt.h and of hf.h. No model here.
#include "attn/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/check.h"

namespace attn {

int64_t sample_token(const float* logits, int64_t V, const SampleOptions& o, Rng& rng) {
  if (o.temperature <= 0) return std::max_element(logits, logits + V) - logits;
  std::vector<double> p(logits, logits + V);
  for (double& x : p) x /= o.temperature;
  if (o.top_k > 0 && o.top_k < V) {  // keep values >= the k-th largest (ties kept, as nanoGPT)
    std::vector<double> sorted = p;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[size_t(o.top_k - 1)];
    for (double& x : p) if (x < kth) x = -std::numeric_limits<double>::infinity();
  }
  const double m = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (double& x : p) sum += (x = std::exp(x - m));
  double u = rng.uniform() * sum;
  for (int64_t v = 0; v < V; ++v) {
    if (u < p[size_t(v)]) return v;
    u -= p[size_t(v)];
  }
  for (int64_t v = V; v-- > 0;) if (p[size_t(v)] > 0) return v;  // rounding left u past the end
  return 0;
}

std::vector<int64_t> sample_loop(const std::vector<int64_t>& prompt, const SampleOptions& o, int64_t V,
                                 int64_t context, const DecodeStep& step) {
  ATTN_CHECK(!prompt.empty(), "Expected a prompt of at least one token, but got none instead");
  ATTN_CHECK(o.max_new_tokens >= 0, "Expected max_new_tokens >= 0, but got ", o.max_new_tokens, " instead");
  ATTN_CHECK(o.top_k >= 0, "Expected top_k >= 0, but got ", o.top_k, " instead");
  // NaN compared false everywhere and sampled token 0 every time; a negative one ran greedy where the CLI
  // refused it
  ATTN_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "Expected a finite temperature >= 0 (0: greedy), "
             "but got ", o.temperature, " instead");
  for (int64_t t : prompt)
    ATTN_CHECK(t >= 0 && t < V, "Expected prompt tokens in [0, ", V, "), but got ", t, " instead");
  std::vector<int64_t> all = prompt, out;
  if (o.max_new_tokens == 0) return out;
  const int64_t limit = context > 0 ? context : std::numeric_limits<int64_t>::max();
  // Fills the cache from the last `keep` tokens; the logits of the last one.
  int64_t len = 0;  // tokens in the cache
  auto refill = [&](int64_t keep) {
    len = keep;
    return step(all.data() + all.size() - size_t(keep), keep, true);
  };
  const float* logits = refill(std::min<int64_t>(int64_t(all.size()), limit));
  Rng rng(o.seed);
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    const int64_t tok = sample_token(logits, V, o, rng);
    all.push_back(tok);
    out.push_back(tok);
    if (o.on_token) o.on_token(tok);
    if (n + 1 == o.max_new_tokens ||
        std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), tok) != o.eos_token_ids.end())
      break;
    if (len == limit) {
      logits = refill(std::max<int64_t>(1, limit / 2));
    } else {
      logits = step(&tok, 1, false);
      ++len;
    }
  }
  return out;
}

}  // namespace attn
