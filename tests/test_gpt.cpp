// Tests of the GPT model: cross-entropy against a plain fp64 formula and finite differences, gradients
// of the whole model against finite differences, incremental decoding through the KV cache against the
// full forward (MHA and GQA), sampling, attention weights, configurations and errors. The comparison
// with a PyTorch re-implementation is tests/python/test_gpt.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "attn/check.h"
#include "attn/gpt.h"
#include "attn/rng.h"
#include "test_util.h"

namespace attn {
namespace {

using test::error_of;

GptConfig small_config(int64_t n_kv_head = 0) {
  GptConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = n_kv_head;
  c.n_embd = 16;
  return c;
}

std::vector<int64_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = int64_t(rng.next() % uint64_t(V));
  return ids;
}

TEST(CrossEntropy, MatchesTheFormulaAndFiniteDifferences) {
  const int64_t N = 5, V = 7;
  Tensor logits({N, V}), d({N, V});
  Rng rng(1);
  for (int64_t i = 0; i < N * V; ++i) logits.data()[i] = float(3 * rng.normal());
  const int64_t targets[N] = {0, 6, -1, 3, 3};
  const float loss = cross_entropy(logits.view(), targets, d.view());
  auto loss64 = [&](const Tensor& x) {  // mean over the 4 scored rows of logsumexp - x[t], in fp64
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (targets[n] < 0) continue;
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(x.data()[n * V + v]));
      sum += std::log(z) - x.data()[n * V + targets[n]];
    }
    return sum / 4;
  };
  // float32 logits of size ~3: the loss is exact to a few float ulps of its magnitude.
  EXPECT_NEAR(loss, loss64(logits), 1e-5);
  for (int64_t i = 0; i < N * V; ++i) {
    const float keep = logits.data()[i];
    const double h = 1e-2;
    logits.data()[i] = float(keep + h);
    const double up = loss64(logits);
    logits.data()[i] = float(keep - h);
    const double down = loss64(logits);
    logits.data()[i] = keep;
    // Central difference error ~h²·f'''/6 with |f'''| < 1 here, far below this bound.
    EXPECT_NEAR(d.data()[i], (up - down) / (2 * h), 1e-4) << i;
  }
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(d.data()[2 * V + v], 0.0f);  // the ignored row
  const int64_t none[N] = {-1, -1, -1, -1, -1};
  EXPECT_EQ(cross_entropy(logits.view(), none), 0.0f);
  const int64_t bad[N] = {0, 7, 0, 0, 0};
  EXPECT_NE(error_of([&] { cross_entropy(logits.view(), bad); }).find("position 1"), std::string::npos);
}

// The loss as a function of one parameter entry, for finite differences.
double loss_at(Gpt& m, const std::vector<int64_t>& x, const std::vector<int64_t>& y, int64_t B, int64_t T) {
  m.eval();
  const double l = m.evaluate(x.data(), y.data(), B, T);
  m.train();
  return l;
}

// The positions and windows of issue 37 (learned, RoPE through the attention's rotation hook, ALiBi in the
// kernel; a sliding window): each configuration the tests below run.
struct Positions {
  const char* position;
  int64_t window;
};
constexpr Positions kPositions[] = {{"learned", 0}, {"rope", 0}, {"alibi", 0}, {"rope", 3}, {"alibi", 2}};

TEST(Gpt, GradientsMatchFiniteDifferences) {
  for (int variant = 0; variant < 6; ++variant) {
    const bool tie = variant != 1;
    const Positions pos = kPositions[variant < 2 ? 0 : variant - 1];
    GptConfig c = small_config(2);
    c.tie_weights = tie;
    c.n_layer = 1;
    c.position = pos.position, c.window = pos.window;
    SCOPED_TRACE(cat(c.position, " window ", c.window));
    Gpt m(c, 3);
    const int64_t B = 2, T = 6;
    std::vector<int64_t> x = random_ids(B * T, c.vocab_size, 4), y = random_ids(B * T, c.vocab_size, 5);
    y[1] = -1;
    m.zero_grad();
    m.forward_backward(x.data(), y.data(), B, T);
    Rng pick(9);
    for (const Param& p : m.parameter_list()) {
      for (int k = 0; k < 3; ++k) {  // three random entries of every parameter
        const int64_t i = int64_t(pick.next() % uint64_t(p.value->numel()));
        float& w = p.value->data()[i];
        const float keep = w;
        const float h = 1e-2f;
        w = keep + h;
        const double up = loss_at(m, x, y, B, T);
        w = keep - h;
        const double down = loss_at(m, x, y, B, T);
        w = keep;
        const double fd = (up - down) / (2 * double(h));
        // fp32 forward: loss rounding ~1e-7·|loss| ≈ 3e-7 per evaluation, divided by 2h = 0.02 gives
        // ~3e-5 of noise; plus the O(h²) truncation. 2e-3 absolute + 2% relative covers both.
        EXPECT_NEAR(p.grad->data()[i], fd, 2e-3 + 0.02 * std::abs(fd)) << p.name << "[" << i << "] tie " << tie;
      }
    }
  }
}

TEST(Gpt, KvCacheDecodingMatchesTheFullForward) {
  for (int variant = 0; variant < 7; ++variant) {  // MHA, GQA, MQA; then the positions and windows with GQA
    const int64_t kv = variant < 3 ? int64_t(4) >> variant : 2;
    GptConfig c = small_config(kv);
    if (variant >= 3) c.position = kPositions[variant - 2].position, c.window = kPositions[variant - 2].window;
    SCOPED_TRACE(cat(c.position, " window ", c.window));
    Gpt m(c, 11);
    m.eval();
    const int64_t T = 13;
    std::vector<int64_t> ids = random_ids(T, c.vocab_size, 12);
    Tensor full = m.forward(ids.data(), 1, T);  // (1, T, V)
    KVCache cache = m.new_cache(1);
    Tensor first = m.forward_cached(ids.data(), 1, 5, cache);  // a prefill of 5, then one token at a time
    std::vector<float> got(first.data(), first.data() + first.numel());
    for (int64_t t = 5; t < T; ++t) {
      Tensor step = m.forward_cached(ids.data() + t, 1, 1, cache);
      got.insert(got.end(), step.data(), step.data() + step.numel());
    }
    ASSERT_EQ(int64_t(got.size()), full.numel());
    // Same math in another order (flash decode split vs full causal tiles): float rounding only. Logits
    // are O(1); 1e-4 is ~100 ulps of headroom over the accumulated fp32 error of two layers.
    for (int64_t i = 0; i < full.numel(); ++i)
      EXPECT_NEAR(got[size_t(i)], full.data()[i], 1e-4) << "kv " << kv << " i " << i;
    EXPECT_EQ(cache.length(0), T);
  }
}

TEST(Gpt, GreedyGenerationFollowsTheFullForwardPastTheBlock) {
  GptConfig c = small_config(2);
  c.block_size = 8;
  Gpt m(c, 21);
  std::vector<int64_t> prompt = {1, 2, 3};
  std::vector<int64_t> got = generate(m, prompt, {.max_new_tokens = 12, .temperature = 0.0});
  ASSERT_EQ(got.size(), 12u);
  // Re-derive each token with full forwards over the context generate() uses: everything within the
  // block, then the last block/2 tokens after each refill.
  std::vector<int64_t> all = prompt;
  int64_t start = 0;
  for (size_t n = 0; n < got.size(); ++n) {
    if (int64_t(all.size()) - start > c.block_size) start = int64_t(all.size()) - c.block_size / 2;
    const int64_t T = int64_t(all.size()) - start;
    Tensor lg = m.forward(all.data() + start, 1, T);
    const float* last = lg.data() + (T - 1) * c.vocab_size;
    const int64_t want = std::max_element(last, last + c.vocab_size) - last;
    EXPECT_EQ(got[n], want) << "token " << n;
    all.push_back(got[n]);
  }
  // Sampling is a function of the seed.
  const SampleOptions a{.max_new_tokens = 20, .temperature = 1, .top_k = 5, .seed = 7};
  EXPECT_EQ(generate(m, prompt, a), generate(m, prompt, a));
  EXPECT_NE(generate(m, prompt, {.max_new_tokens = 20, .temperature = 1, .seed = 7}),
            generate(m, prompt, {.max_new_tokens = 20, .temperature = 1, .seed = 8}));
}

// RoPE and ALiBi have no position table: a model trained on block_size runs on longer sequences (what
// --eval-lengths measures), its KV cache too; learned positions refuse them by name. A window's weights are
// 0 outside it. Saved and loaded, the model is the same (no wpe tensor in its checkpoint).
TEST(Gpt, RopeAndAlibiRunPastTheBlockAndWindowsHideTheKeysBefore) {
  for (const Positions& pos : kPositions) {
    GptConfig c = small_config(2);
    c.block_size = 8, c.position = pos.position, c.window = pos.window;
    SCOPED_TRACE(cat(c.position, " window ", c.window));
    Gpt m(c, 31);
    m.eval();
    std::vector<int64_t> ids = random_ids(20, c.vocab_size, 32);
    if (c.position == std::string("learned")) {
      EXPECT_THROW(m.forward(ids.data(), 1, 20), Error);
      continue;
    }
    Tensor full = m.forward(ids.data(), 1, 20);  // 20 > block_size 8
    for (int64_t i = 0; i < full.numel(); ++i) ASSERT_TRUE(std::isfinite(full.data()[i]));
    const std::vector<Tensor> w = m.attention_weights(ids.data(), 1, 20);
    for (int64_t h = 0; h < 4 && pos.window > 0; ++h)
      for (int64_t l = 0; l < 20; ++l)
        for (int64_t s = 0; s < 20; ++s)
          if (s > l || s < l - pos.window) {
            EXPECT_EQ(w[0].data()[(h * 20 + l) * 20 + s], 0.0f) << l << " " << s;
          }
    const StateDict sd = m.state_dict();
    EXPECT_EQ(sd.count("transformer.wpe.weight"), 0u);
    Gpt again(c, 99);
    again.load_state_dict(sd);
    again.eval();
    Tensor same = again.forward(ids.data(), 1, 20);
    for (int64_t i = 0; i < full.numel(); ++i) ASSERT_EQ(same.data()[i], full.data()[i]);
  }
  GptConfig bad = small_config(2);
  bad.position = "sinusoidal";
  EXPECT_THROW(check_gpt_config(bad), Error);
}

TEST(Gpt, AttentionWeightsAreCausalDistributions) {
  GptConfig c = small_config();
  Gpt m(c, 5);
  m.eval();
  std::vector<int64_t> ids = random_ids(2 * 6, c.vocab_size, 6);
  std::vector<Tensor> w = m.attention_weights(ids.data(), 2, 6);
  ASSERT_EQ(w.size(), 2u);
  for (const Tensor& t : w) {
    ASSERT_EQ(t.shape(), Shape({2, 4, 6, 6}));
    for (int64_t r = 0; r < 2 * 4 * 6; ++r) {
      const int64_t l = r % 6;
      double sum = 0;
      for (int64_t s = 0; s < 6; ++s) {
        const float v = t.data()[r * 6 + s];
        if (s > l) {
          EXPECT_EQ(v, 0.0f);
        }
        sum += v;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

TEST(Gpt, ConfigurationsParametersAndErrors) {
  GptConfig nano = gpt_config("nanogpt-cpu");
  EXPECT_EQ(nano.n_layer, 4);
  EXPECT_EQ(nano.n_embd, 128);
  EXPECT_EQ(nano.block_size, 64);
  EXPECT_EQ(gpt_config("gpt2-small").n_embd, 768);
  EXPECT_NE(error_of([] { gpt_config("huge"); }).find("'huge'"), std::string::npos);

  GptConfig c = small_config();
  Gpt tied(c, 1);
  c.tie_weights = false;
  Gpt untied(c, 1);
  EXPECT_EQ(untied.num_parameters() - tied.num_parameters(), c.vocab_size * c.n_embd);
  std::vector<Param> p = tied.parameter_list();
  EXPECT_EQ(p.front().name, "transformer.wte.weight");
  EXPECT_EQ(untied.parameter_list().back().name, "lm_head.weight");

  std::vector<int64_t> ids(17, 0);
  EXPECT_NE(error_of([&] { tied.forward(ids.data(), 1, 17); }).find("block_size = 16"), std::string::npos);
  ids[0] = 11;
  EXPECT_FALSE(error_of([&] { tied.forward(ids.data(), 1, 2); }).empty());  // id out of the vocabulary
  c.n_kv_head = 3;
  EXPECT_NE(error_of([&] { Gpt bad(c, 1); }).find("n_kv_head"), std::string::npos);
}


// Data-parallel training's pieces, in one process: a batch computed in shares (each with its batch
// offset, its gradient scaled by the whole batch's count) adds up to the whole batch's gradient with
// the same dropout masks; and backward() hands over each group of gradients once it is final.
TEST(Gpt, SharesOfABatchAddUpToTheBatch) {
  GptConfig c = small_config(2);
  c.dropout = 0.2;
  c.tie_weights = false;
  const int64_t B = 5, T = 7;
  Rng rng(3);
  std::vector<int64_t> x(size_t(B * T)), y(size_t(B * T));
  for (auto& v : x) v = int64_t(rng.next() % 11);
  for (auto& v : y) v = rng.next() % 4 == 0 ? -1 : int64_t(rng.next() % 11);
  int64_t count = 0;
  for (int64_t v : y) count += v >= 0;

  Gpt whole(c, 9);
  whole.reseed(77);
  whole.zero_grad();
  const float loss = whole.forward_backward(x.data(), y.data(), B, T);

  Gpt parts(c, 9);
  parts.zero_grad();
  double sum = 0;
  for (auto [b0, rows] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}}) {
    parts.reseed(77);  // every share draws from the step's streams, at its own rows
    parts.set_batch_offset(b0);
    Tensor logits = parts.forward(x.data() + b0 * T, rows, T);
    View<float> r = logits.view().reshape({rows * T, c.vocab_size});
    sum += cross_entropy_sum(r, y.data() + b0 * T, r, count);
    parts.backward(logits.view());  // adds into the gradients
  }
  EXPECT_NEAR(sum / double(count), loss, 1e-6 * loss);
  auto a = whole.parameter_list(), b = parts.parameter_list();
  for (size_t i = 0; i < a.size(); ++i) {
    double err = 0, norm = 0;
    for (int64_t j = 0; j < a[i].grad->numel(); ++j) {
      err = std::max(err, double(std::abs(a[i].grad->data()[j] - b[i].grad->data()[j])));
      norm = std::max(norm, double(std::abs(a[i].grad->data()[j])));
    }
    EXPECT_LE(err, 1e-5 * norm + 1e-9) << a[i].name;  // the order of the sum over rows only
  }
}

TEST(Gpt, BackwardHandsOverEachGradientGroupOnceFinal) {
  for (bool tied : {true, false}) {
    GptConfig c = small_config();
    c.tie_weights = tied;
    Gpt m(c, 4);
    const auto groups = m.grad_groups();
    ASSERT_EQ(groups.size(), size_t(c.n_layer + (tied ? 2 : 3)));
    std::vector<std::string> names, all;
    for (const auto& g : groups)
      for (const Param& p : g) names.push_back(p.name);
    for (const Param& p : m.parameter_list()) all.push_back(p.name);
    std::sort(names.begin(), names.end());
    std::sort(all.begin(), all.end());
    EXPECT_EQ(names, all) << "every parameter in exactly one group";
    EXPECT_EQ(groups.back()[0].name, "transformer.wte.weight");

    std::vector<int64_t> x(2 * 6), y(2 * 6);
    for (size_t i = 0; i < x.size(); ++i) x[i] = int64_t(i % 11), y[i] = int64_t((i * 7) % 11);
    std::vector<size_t> order;
    std::vector<std::vector<Tensor>> at_hook(groups.size());
    m.on_grads_final = [&](size_t g) {
      order.push_back(g);
      for (const Param& p : groups[g]) at_hook[g].push_back(Tensor::copy_of(p.grad->view()));
    };
    m.zero_grad();
    m.forward_backward(x.data(), y.data(), 2, 6);
    ASSERT_EQ(order.size(), groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      EXPECT_EQ(order[g], g);
      for (size_t k = 0; k < groups[g].size(); ++k)  // nothing adds to them after their hook
        EXPECT_TRUE(test::same_bits(at_hook[g][k], *groups[g][k].grad)) << groups[g][k].name << (tied ? " (tied)" : "");
    }
  }
}

}  // namespace
}  // namespace attn
