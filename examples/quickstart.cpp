// A first program with attn: scaled dot-product attention on your own buffers, then
// nn.MultiheadAttention-style self-attention with a padding mask. Build: `make` builds it as
// build/example_quickstart.
#include <cstdio>
#include <vector>

#include "attn/mha.h"
#include "attn/sdpa.h"

int main() {
  using namespace attn;
  // 1. SDPA over views of memory you own: Q (B, H, L, D), K and V (B, Hkv, S, D), here GQA with 2 KV heads.
  //    View<const float>(pointer, shape) reads your buffer in place (contiguous; other layouts add strides).
  const int64_t B = 1, H = 4, Hkv = 2, L = 5, S = 5, D = 8;
  std::vector<float> q(B * H * L * D, 0.1f), k(B * Hkv * S * D, 0.2f), v(B * Hkv * S * D, 1.0f);
  Tensor out({B, H, L, D});
  SdpaArgs<float> args{View<const float>(q.data(), {B, H, L, D}), View<const float>(k.data(), {B, Hkv, S, D}),
                       View<const float>(v.data(), {B, Hkv, S, D})};
  args.causal = Causal::top_left;
  std::printf("backend: %s\n", explain(args, SdpaOut<float>{out}).reason.c_str());
  sdpa(args, SdpaOut<float>{out});
  std::printf("out shape %s, out[0,0,0,0] = %.3f\n", to_string(out.shape()).c_str(), out.view().at({0, 0, 0, 0}));

  // 2. Multi-head self-attention with PyTorch's semantics; the last key of the sequence is padding.
  MultiheadAttention mha({.embed_dim = 16, .num_heads = 4, .batch_first = true, .seed = 0});
  mha.eval();
  Tensor x({1, 6, 16});  // (N, L, E)
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = float(i % 7) * 0.1f;
  TensorT<uint8_t> padding({1, 6});  // (N, S), true = ignore
  padding.data()[5] = 1;
  MhaOutput r = mha.forward(x, x, x, {.key_padding_mask = Mask<float>::drop(padding)});
  std::printf("output %s, weights %s, weight on the padded key: %g\n", to_string(r.output.shape()).c_str(),
              to_string(r.weights.shape()).c_str(), r.weights.view().at({0, 0, 5}));
  return 0;
}
