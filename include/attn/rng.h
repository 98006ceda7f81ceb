// Randomness from a seed: a counter-based hash for dropout (the keep bit of element i is a pure
// function of (seed, i), so every backend, thread count and the backward pass agree), and a small
// generator for parameter initialisation. Not PyTorch's generator: same distributions, other numbers.
#pragma once
#include <cmath>
#include <cstdint>

#include "attn/check.h"

namespace attn {

// splitmix64's finaliser: a bijection on 64 bits with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Dropout, one rule for the attention weights (SdpaProblem, element index in (B, H, L, S)) and for
// activations (nn Dropout, index in the flattened tensor): p is a probability in [0, 1], checked by
// check_dropout_p wherever it is given; element `index` is kept iff its 32 random bits >= threshold; a
// kept element is scaled by 1/(1 - p), and p = 1 drops everything.
inline void check_dropout_p(const char* arg, double p) {
  ATTN_CHECK(p >= 0 && p <= 1, "Expected ", arg, " in [0, 1], but got ", p, " instead");
}
// What a kept element is multiplied by: 1/(1 - p) rounded once to T, 0 when p = 1 (everything dropped).
template <typename T>
T dropout_keep_scale(double p) {
  return p < 1 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
}
inline uint32_t dropout_threshold(double p) {
  double t = std::ldexp(p, 32);
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}
inline bool dropout_keep(uint64_t seed, uint64_t index, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(mix64(seed) ^ index) >> 32) >= threshold;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_++); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {  // Box-Muller
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace attn
