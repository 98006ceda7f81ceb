// `attn demo`: the README's main job. Walks the seed's tutorial on built-in defaults, in seconds:
// shapes through multi-head attention, our MHA against an fp64 reference with the same weights, the
// padding and causal masks, KV-cache sizes for MHA/GQA/MQA, and a clear error. No data needed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "attn/gemm.h"
#include "attn/mha.h"
#include "attn/param.h"
#include "attn/rng.h"
#include "attn/sdpa.h"
#include "cli.h"

namespace attn {
namespace {

TensorD to_double(View<const float> x) {
  TensorD t(x.shape);
  Tensor c = Tensor::copy_of(x);
  std::copy(c.data(), c.data() + c.numel(), t.data());
  return t;
}

// Self-attention x (B, L, E) done the textbook way in fp64: project, split heads, reference SDPA,
// concat, project. The weights come from `mha`, so the two must agree to float rounding.
TensorD textbook_fp64(const MultiheadAttention& mha, View<const float> x) {
  const int64_t B = x.size(0), L = x.size(1), E = x.size(2), H = mha.options().num_heads;
  StateDict sd = mha.state_dict();
  TensorD w = to_double(sd.at("in_proj_weight")), b = to_double(sd.at("in_proj_bias"));
  TensorD wo = to_double(sd.at("out_proj.weight")), bo = to_double(sd.at("out_proj.bias"));
  TensorD xd = to_double(x), qkv({B * L, 3 * E}), ctx({B, L, E}), out({B * L, E});
  linear<double>(xd.view().reshape({B * L, E}), w, b, qkv);
  // (B·L, 3E) -> three (B, H, L, D) views of the same buffer
  auto head_view = [&](int part) {
    return View<const double>(qkv.data() + part * E, {B, H, L, E / H}, {L * 3 * E, E / H, 3 * E, 1});
  };
  SdpaArgs<double> args{head_view(0), head_view(1), head_view(2)};
  View<double> ctx_heads(ctx.data(), {B, H, L, E / H}, {L * E, E / H, E, 1});
  sdpa<double>(args, {ctx_heads}, {.backend = Backend::reference});  // the entry point, fp64 oracle
  linear<double>(ctx.view().reshape({B * L, E}), wo, bo, out);
  return out;
}

void section(const char* title) { std::printf("\n== %s\n", title); }

}  // namespace

int run_demo() {
  std::printf("attn demo: multi-head attention, step by step, on a batch of 2 sequences of 10 tokens, 512 "
              "dimensions, 8 heads\n");
  const int64_t B = 2, L = 10, E = 512, H = 8;

  section("1. Shapes through MultiheadAttention (B=2, L=10, E=512, H=8, batch_first)");
  MultiheadAttention mha({.embed_dim = E, .num_heads = H, .batch_first = true, .seed = 1});
  mha.eval();
  Tensor x = init::randn({B, L, E}, 2);
  MhaOutput r = mha.forward(x, x, x, {.need_weights = false, .trace = &std::cout});

  section("2. Our MultiheadAttention against the textbook computation in fp64, same weights");
  TensorD ref = textbook_fp64(mha, x);
  double err = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) err = std::max(err, std::abs(ref.data()[i] - double(r.output.data()[i])));
  std::printf("max |attn - fp64 reference| = %.3g over %lld outputs (attn in float32 on the backend traced above)\n",
              err, (long long)ref.numel());

  section("3. Padding mask: the last token of sequence 1 is padding");
  TensorT<uint8_t> pad({B, L});  // (N, S), true = ignore, nn.MultiheadAttention's convention
  pad.data()[1 * L + (L - 1)] = 1;
  MhaOutput padded = mha.forward(x, x, x, {.key_padding_mask = Mask<float>::drop(pad), .average_attn_weights = false});
  float col_max = 0, other_min = 1;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t l = 0; l < L; ++l) {
      col_max = std::max(col_max, padded.weights.view().at({1, h, l, L - 1}));
      other_min = std::min(other_min, padded.weights.view().at({0, h, l, L - 1}));
    }
  std::printf("weight on the padded key, every head and query: max %g (exactly zero: %s)\n", col_max,
              col_max == 0.f ? "yes" : "NO");
  std::printf("the same key in the unpadded sequence 0: min weight %.4f\n", other_min);

  section("4. Causal mask: query l sees keys s <= l");
  MhaOutput causal = mha.forward(x, x, x, {.average_attn_weights = true, .is_causal = true});
  float upper = 0;
  for (int64_t n = 0; n < B; ++n)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t s = l + 1; s < L; ++s) upper = std::max(upper, causal.weights.view().at({n, l, s}));
  std::printf("largest weight above the diagonal: %g (exactly zero: %s)\n", upper, upper == 0.f ? "yes" : "NO");
  std::printf("query 0 row: ");
  for (int64_t s = 0; s < 4; ++s) std::printf("%.3f ", causal.weights.view().at({0, 0, s}));
  std::printf("...   query 3 row: ");
  for (int64_t s = 0; s < 5; ++s) std::printf("%.3f ", causal.weights.view().at({0, 3, s}));
  std::printf("...\n");

  section("5. KV cache per token, LLaMA-2-7B-like (32 layers, 32 query heads, D=128, fp16)");
  const int64_t layers = 32, D = 128, bytes = 2;
  for (auto [name, hkv] : {std::pair{"MHA", 32}, {"GQA", 8}, {"MQA", 1}}) {
    int64_t per_token = 2 * layers * hkv * D * bytes;  // K and V, every layer
    std::printf("%s  Hkv=%2d: %7.1f KiB per token, %6.2f GiB for 4096 tokens\n", name, int(hkv),
                per_token / 1024.0, per_token * 4096.0 / (1 << 30));
  }

  section("6. A clear error instead of a crash");
  try {
    MultiheadAttention bad({.embed_dim = 512, .num_heads = 7});
  } catch (const Error& e) {
    std::printf("MultiheadAttention(embed_dim=512, num_heads=7): %s\n", e.what());
  }

  section("7. What a trained model attends to: the views, and untrained vs trained heads (tools/viz.cpp)");
  return demo_attention_views("out/demo");
}

}  // namespace attn
