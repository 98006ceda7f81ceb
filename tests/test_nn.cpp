// nn layers and MultiheadAttention's training path: every backward (input and parameter gradients)
// against central finite differences of the float forward, with a tolerance derived from float's rounding
// (below); gradient accumulation and zero_grad; dropout masks shared by forward and backward; KV-cache
// decoding against the full causal forward; state_dict names. Not a test against PyTorch:
// tests/python/test_nn.py is.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/rng.h"

using namespace attn;

namespace {

Tensor random_tensor(const Shape& shape, Rng& rng, double scale = 1.0) {
  Tensor t(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = float(scale * rng.normal());
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.data()[i]) * double(b.data()[i]);
  return s;
}

double abs_dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += std::abs(double(a.data()[i]) * double(b.data()[i]));
  return s;
}

// A layer under test. make() builds it from a fixed seed, so every finite-difference evaluation gets a
// fresh layer whose dropout masks are those of the analytic run; forward() maps the inputs to the output;
// backward() returns the input gradients, in the order of `inputs` (an empty Tensor: no gradient).
template <class L>
struct GradCase {
  std::function<std::unique_ptr<L>()> make;
  std::vector<Tensor> inputs;
  std::function<Tensor(L&, const std::vector<Tensor>&)> forward;
  std::function<std::vector<Tensor>(L&, View<const float>)> backward;
};

// Loss = Σ w·y with a fixed random w, in double. Its central difference (L(x+h) - L(x-h)) / 2h errs by
// - rounding: each float output carries a relative error of a few eps (eps = 2^-24 · 2 for one rounding
//   of a sum of <= 64 unit-scale terms and a handful of layers), so the difference of two losses errs by
//   <= 2·c·eps·Σ|w·y| and the quotient by c·eps·Σ|w·y| / h; c = 32 covers depth and sums on these
//   tiny shapes;
// - truncation: h²/6 · |∂³L| <= h² · (1 + |g|) for unit-scale inputs of smooth layers.
// A wrong gradient (a missed term, a transposed weight, a wrong mask) errs by O(|g|) ~ 0.1..1, far above.
template <class L>
void check_gradients(GradCase<L>& c, const char* what, double h = 1e-2, int per_tensor = 12) {
  SCOPED_TRACE(what);
  constexpr double kEps = std::numeric_limits<float>::epsilon() / 2;
  auto base = c.make();
  Tensor y = c.forward(*base, c.inputs);
  Rng rng(99);
  Tensor w = random_tensor(y.shape(), rng);
  base->zero_grad();
  std::vector<Tensor> din = c.backward(*base, w.view());
  std::vector<Param> params = base->parameter_list();
  const double tol_round = 32 * kEps * abs_dot(w, y) / h;

  // One finite difference: a fresh layer, `perturb` moves one number by ±h.
  auto fd = [&](const std::function<float*(L&, std::vector<Tensor>&)>& at) {
    double loss[2];
    for (int sgn = 0; sgn < 2; ++sgn) {
      auto layer = c.make();
      std::vector<Tensor> in;
      for (const Tensor& t : c.inputs) in.push_back(Tensor::copy_of(t.view()));
      *at(*layer, in) += float(sgn == 0 ? h : -h);
      loss[sgn] = dot(w, c.forward(*layer, in));
    }
    return (loss[0] - loss[1]) / (2 * h);
  };
  // Checks up to per_tensor elements of one gradient, spread over the tensor.
  int checked = 0;
  double worst = 0;
  auto check = [&](const std::string& name, const float* grad, int64_t n,
                   const std::function<float*(L&, std::vector<Tensor>&, int64_t)>& elem) {
    const int64_t step = std::max<int64_t>(1, n / per_tensor);
    for (int64_t i = (n > per_tensor ? int64_t(rng.next() % uint64_t(step)) : 0); i < n; i += step) {
      const double g = fd([&](L& l, std::vector<Tensor>& in) { return elem(l, in, i); });
      const double tol = tol_round + h * h * (1 + std::abs(g));
      worst = std::max(worst, std::abs(grad[i] - g) / tol);
      ++checked;
      EXPECT_NEAR(grad[i], g, tol) << name << "[" << i << "]";
    }
  };
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    if (!din[k].data()) continue;
    ASSERT_EQ(din[k].shape(), c.inputs[k].shape()) << "input " << k;
    check("input " + std::to_string(k), din[k].data(), din[k].numel(),
          [k](L&, std::vector<Tensor>& in, int64_t i) { return in[k].data() + i; });
  }
  for (size_t p = 0; p < params.size(); ++p)
    check(params[p].name, params[p].grad->data(), params[p].grad->numel(),
          [p](L& l, std::vector<Tensor>&, int64_t i) { return l.parameter_list()[p].value->data() + i; });
  EXPECT_GT(checked, 0);
  std::printf("  %s: %d gradients checked, worst error %.2f of the tolerance (rounding part %.1e)\n", what, checked,
              worst, tol_round);
}

// One-input layers: forward(x) and backward(dout) -> dx.
template <class L>
GradCase<L> unary(std::function<std::unique_ptr<L>()> make, Tensor x) {
  GradCase<L> c;
  c.make = std::move(make);
  c.inputs.push_back(std::move(x));
  c.forward = [](L& l, const std::vector<Tensor>& in) { return l.forward(in[0].view()); };
  c.backward = [](L& l, View<const float> d) {
    std::vector<Tensor> r;
    r.push_back(l.backward(d));
    return r;
  };
  return c;
}

}  // namespace

TEST(Linear, GradientsMatchFiniteDifferences) {
  Rng rng(1);
  for (bool bias : {true, false}) {
    auto c = unary<Linear>([bias] { return std::make_unique<Linear>(7, 5, bias, 3); }, random_tensor({2, 3, 7}, rng));
    check_gradients(c, bias ? "Linear" : "Linear, no bias");
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  Rng rng(2);
  for (int variant = 0; variant < 3; ++variant) {  // affine with bias, affine without bias, no affine
    auto make = [variant] {
      auto l = std::make_unique<LayerNorm>(9, 1e-5, variant < 2, variant == 0);
      Rng r(5);  // non-trivial weight and bias, so their gradients and their use in dx are tested
      for (Param& p : l->parameter_list()) *p.value = random_tensor(p.value->shape(), r);
      return l;
    };
    auto c = unary<LayerNorm>(make, random_tensor({4, 9}, rng));
    check_gradients(c, "LayerNorm");
  }
}

TEST(Activation, GradientsMatchFiniteDifferences) {
  Rng rng(3);
  Tensor x = random_tensor({3, 11}, rng);
  for (int64_t i = 0; i < x.numel(); ++i)  // away from ReLU's kink by more than h
    if (std::abs(x.data()[i]) < 0.05f) x.data()[i] = 0.3f;
  for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh}) {
    auto c = unary<ActivationLayer>([a] { return std::make_unique<ActivationLayer>(a); }, Tensor::copy_of(x.view()));
    check_gradients(c, to_string(a), 1e-2, 64);
  }
}

TEST(Activation, GeluValues) {
  // Φ(1) = 0.841344746..., so gelu(1) = 0.841344746; the tanh form gives 0.841191990 (PyTorch's values).
  ActivationLayer exact(Activation::gelu), approx(Activation::gelu_tanh);
  float one = 1.0f;
  View<const float> x(&one, {1});
  EXPECT_NEAR(exact.forward(x).data()[0], 0.841344746, 1e-6);
  EXPECT_NEAR(approx.forward(x).data()[0], 0.841191990, 1e-6);
  EXPECT_THROW(GELU("fast"), Error);
  EXPECT_THROW(parse_activation("swish"), Error);
}

TEST(Dropout, MaskSharedByForwardAndBackward) {
  Rng rng(4);
  Tensor x = random_tensor({64, 33}, rng);
  Dropout d(0.25, 7);
  Tensor y = d.forward(x.view());
  Tensor ones({64, 33});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.data()[i] = 1.0f;
  Tensor g = d.backward(ones.view());
  int64_t kept = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = g.data()[i] != 0;
    kept += keep;
    EXPECT_FLOAT_EQ(g.data()[i], keep ? 1.0f / 0.75f : 0.0f);
    EXPECT_FLOAT_EQ(y.data()[i], keep ? x.data()[i] / 0.75f : 0.0f);
  }
  // 2112 draws at keep probability 0.75: mean 1584, sd 20; 6 sd either side.
  EXPECT_NEAR(double(kept), 1584.0, 120.0);
  Tensor y2 = d.forward(x.view());  // the next forward draws another mask
  int64_t same = 0;
  for (int64_t i = 0; i < x.numel(); ++i) same += (y2.data()[i] != 0) == (y.data()[i] != 0);
  EXPECT_LT(same, x.numel());
  d.eval();
  Tensor e = d.forward(x.view());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(e.data()[i], x.data()[i]);
  EXPECT_THROW(d.backward(ones.view()), Error);  // eval mode saves nothing
  Dropout all(1.0, 1);
  Tensor z = all.forward(x.view());
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.data()[i], 0.0f);
}

TEST(Embedding, ScatterAddsRepeatedIds) {
  Embedding emb(5, 3, 1);
  const int64_t ids[] = {1, 4, 1, 0};
  Tensor y = emb.forward(ids, {2, 2});
  ASSERT_EQ(y.shape(), Shape({2, 2, 3}));
  for (int i = 0; i < 4; ++i)
    for (int e = 0; e < 3; ++e) EXPECT_EQ(y.data()[i * 3 + e], emb.weight.data()[ids[i] * 3 + e]);
  Rng rng(5);
  Tensor g = random_tensor({2, 2, 3}, rng);
  emb.backward(g.view());
  for (int e = 0; e < 3; ++e) {
    EXPECT_FLOAT_EQ(emb.weight_grad.data()[1 * 3 + e], g.data()[0 * 3 + e] + g.data()[2 * 3 + e]);
    EXPECT_FLOAT_EQ(emb.weight_grad.data()[4 * 3 + e], g.data()[1 * 3 + e]);
    EXPECT_FLOAT_EQ(emb.weight_grad.data()[0 * 3 + e], g.data()[3 * 3 + e]);
    EXPECT_EQ(emb.weight_grad.data()[2 * 3 + e], 0.0f);
  }
  const int64_t bad[] = {5};
  EXPECT_THROW(emb.forward(bad, {1}), Error);
}

TEST(FeedForward, GradientsMatchFiniteDifferences) {
  Rng rng(6);
  for (Activation a : {Activation::gelu, Activation::gelu_tanh}) {
    for (double p : {0.0, 0.3}) {  // with dropout: each evaluation's fresh layer draws the same mask
      auto c = unary<FeedForward>([a, p] { return std::make_unique<FeedForward>(6, 10, a, p, true, 8); },
                                  random_tensor({2, 3, 6}, rng));
      check_gradients(c, p > 0 ? "FeedForward with dropout" : "FeedForward");
    }
  }
}

TEST(Gradients, AccumulateAndZero) {
  Rng rng(7);
  FeedForward ff(4, 8, Activation::gelu, 0.0, true, 1);
  Tensor x = random_tensor({3, 4}, rng), d = random_tensor({3, 4}, rng);
  ff.forward(x.view());
  ff.backward(d.view());
  StateDict once;
  for (Param& p : ff.parameter_list()) once.emplace(p.name, Tensor::copy_of(p.grad->view()));
  ff.forward(x.view());
  ff.backward(d.view());
  for (Param& p : ff.parameter_list())
    for (int64_t i = 0; i < p.grad->numel(); ++i)
      ASSERT_FLOAT_EQ(p.grad->data()[i], 2 * once.at(p.name).data()[i]) << p.name;
  ff.zero_grad();
  for (Param& p : ff.parameter_list())
    for (int64_t i = 0; i < p.grad->numel(); ++i) ASSERT_EQ(p.grad->data()[i], 0.0f) << p.name;
}

TEST(Layers, NamesAndErrors) {
  FeedForward ff(4, 8);
  std::vector<std::string> names;
  for (Param& p : ff.parameter_list()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"}));
  Linear lin(3, 2);
  Tensor x({2, 4});
  EXPECT_THROW(lin.forward(x.view()), Error);
  lin.eval();
  Tensor ok({2, 3});
  lin.forward(ok.view());
  Tensor d({2, 2});
  EXPECT_THROW(lin.backward(d.view()), Error);  // eval forward saved nothing
  lin.train();
  lin.forward(ok.view());
  Tensor wrong({3, 2});
  EXPECT_THROW(lin.backward(wrong.view()), Error);
  StateDict sd = lin.state_dict();
  sd.erase("bias");
  EXPECT_THROW(lin.load_state_dict(sd), Error);
}
