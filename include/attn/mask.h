// Masks that say what they mean. A bool mask is either a keep-mask (true = may attend, the convention
// of F.scaled_dot_product_attention) or a drop-mask (true = masked out, the convention of
// nn.MultiheadAttention); an additive mask is added to the scores (-inf = masked out). The kind is
// chosen by the factory that builds the Mask, so the two bool conventions can't be mixed up silently.
#pragma once
#include <cstdint>

#include "attn/tensor.h"

namespace attn {

// Causal alignment. top_left: query l sees keys s <= l (PyTorch's is_causal). bottom_right: query l
// sees keys s <= l + (S - L), so the last query sees every key (what a KV cache needs).
enum class Causal { none, top_left, bottom_right };

template <typename T>
struct Mask {
  enum class Kind { none, keep, drop, additive };
  Kind kind = Kind::none;
  View<const uint8_t> bools;  // keep and drop
  View<const T> bias;         // additive

  static Mask keep(View<const uint8_t> m) { return {Kind::keep, m, {}}; }
  static Mask drop(View<const uint8_t> m) { return {Kind::drop, m, {}}; }
  static Mask additive(View<const T> m) { return {Kind::additive, {}, m}; }

  bool given() const { return kind != Kind::none; }
  const Shape& shape() const { return kind == Kind::additive ? bias.shape : bools.shape; }
};

}  // namespace attn
