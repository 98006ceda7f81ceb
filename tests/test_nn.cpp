// nn layers and MultiheadAttention's training path: every backward (input and parameter gradients)
// against central finite differences of the float forward, with a tolerance derived from float's rounding
// (below); gradient accumulation and zero_grad; dropout masks shared by forward and backward; KV-cache
// decoding against the full causal forward; state_dict names. Not a test against PyTorch:
// tests/python/test_nn.py is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/nn.h"
#include "attn/param.h"
#include "attn/rng.h"
#include "attn/threads.h"
#include "test_util.h"

using namespace attn;

namespace {

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
// - rounding: each float output carries a relative error of c·eps (eps = 2^-24; c counts the roundings
//   on the way: sums of <= 24 unit-scale terms through a few layers), so the difference of two losses
//   errs by <= 2·c·eps·Σ|w·y| and the quotient by c·eps·Σ|w·y| / h; c = 8 (measured errors stay below
//   half of that bound on every case here);
// - truncation: h²/6 · |∂³L| <= h² · (1 + |g|) for unit-scale inputs of smooth layers.
// A wrong gradient (a missed term, a transposed weight, a wrong mask) errs by O(|g|) ~ 0.1..1, far above.
template <class L>
void check_gradients(GradCase<L>& c, const char* what, double h = 1e-2, int per_tensor = 12) {
  SCOPED_TRACE(what);
  constexpr double kEps = std::numeric_limits<float>::epsilon() / 2;
  auto base = c.make();
  Tensor y = c.forward(*base, c.inputs);
  Rng rng(99);
  Tensor w = init::randn(y.shape(), rng);
  base->zero_grad();
  std::vector<Tensor> din = c.backward(*base, w.view());
  std::vector<Param> params = base->parameter_list();
  const double tol_round = 8 * kEps * abs_dot(w, y) / h;

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

// After two identical backward calls every gradient is twice the first one's. Not bitwise: the second
// call adds its row sums into the first's (S + r1 + r2 ...) rather than doubling S. Each element errs by
// a few roundings of the largest partial sum: 1e-5 of the tensor's largest gradient is ~100 ulps.
template <class L>
void expect_doubled(L& layer, const StateDict& once) {
  for (Param& p : layer.parameter_list()) {
    const Tensor& g1 = once.at(p.name);
    double scale = 0;
    for (int64_t i = 0; i < g1.numel(); ++i) scale = std::max(scale, std::abs(double(g1.data()[i])));
    for (int64_t i = 0; i < g1.numel(); ++i)
      ASSERT_NEAR(p.grad->data()[i], 2 * g1.data()[i], 1e-5 * scale) << p.name << "[" << i << "]";
  }
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
    auto c = unary<Linear>([bias] { return std::make_unique<Linear>(7, 5, bias, 3); }, init::randn({2, 3, 7}, rng));
    check_gradients(c, bias ? "Linear" : "Linear, no bias");
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  Rng rng(2);
  for (int variant = 0; variant < 3; ++variant) {  // affine with bias, affine without bias, no affine
    auto make = [variant] {
      auto l = std::make_unique<LayerNorm>(9, 1e-5, variant < 2, variant == 0);
      Rng r(5);  // non-trivial weight and bias, so their gradients and their use in dx are tested
      for (Param& p : l->parameter_list()) *p.value = init::randn(p.value->shape(), r);
      return l;
    };
    auto c = unary<LayerNorm>(make, init::randn({4, 9}, rng));
    check_gradients(c, "LayerNorm");
  }
}

// The numerics LayerNorm promises (layernorm.h), written as plain scalar loops: mean, variance and the
// backward's row sums in double over 8 fixed lanes (element i in lane i % 8, lanes added 0..7), the rest
// as the scalar layer computed it. The SIMD kernel must give these bits on every target.
double lane_sum(int64_t F, const std::function<double(int64_t)>& term) {
  double lanes[8] = {};
  for (int64_t i = 0; i < F; ++i) lanes[i % 8] += term(i);
  double s = 0;
  for (double l : lanes) s += l;
  return s;
}

struct Shape3 {
  int64_t n, in, out;
};

struct LnRef {
  Tensor y, dx, dw, db;
};

LnRef layer_norm_ref(const Tensor& x, const Tensor& dy, const float* w, const float* b, double eps) {
  const int64_t F = x.size(-1), N = x.numel() / F;
  LnRef r{Tensor(x.shape()), Tensor(x.shape()), Tensor({F}), Tensor({F})};
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.data() + n * F;
    const float* g = dy.data() + n * F;
    const double mean = lane_sum(F, [&](int64_t i) { return double(xr[i]); }) / double(F);
    const double var = lane_sum(F, [&](int64_t i) { return (xr[i] - mean) * (xr[i] - mean); });
    const float rstd = float(1.0 / std::sqrt(var / double(F) + eps)), m = float(mean);
    std::vector<float> h(static_cast<size_t>(F));
    for (int64_t i = 0; i < F; ++i) {
      h[size_t(i)] = (xr[i] - m) * rstd;
      r.y.data()[n * F + i] = h[size_t(i)] * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
    const double mg = lane_sum(F, [&](int64_t i) { return double(g[i]) * (w ? w[i] : 1.0f); }) / double(F);
    const double mgh =
        lane_sum(F, [&](int64_t i) { return double(g[i]) * (w ? w[i] : 1.0f) * h[size_t(i)]; }) / double(F);
    for (int64_t i = 0; i < F; ++i)
      r.dx.data()[n * F + i] = rstd * float(g[i] * (w ? w[i] : 1.0f) - mg - h[size_t(i)] * mgh);
    for (int64_t i = 0; i < F; ++i) {  // rows in order
      r.dw.data()[i] += g[i] * h[size_t(i)];
      r.db.data()[i] += g[i];
    }
  }
  return r;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  EXPECT_TRUE(test::same_bits(a, b)) << what;
}

TEST(LayerNorm, SimdRowsHaveTheScalarLanesBitsAtOddSizes) {
  Rng rng(7);
  for (int64_t F : {1, 7, 8, 9, 17, 63, 130})
    for (int64_t N : {1, 5, 67})
      for (int variant = 0; variant < 3; ++variant) {  // affine with bias, without bias, no affine
        SCOPED_TRACE(::testing::Message() << "F " << F << ", N " << N << ", variant " << variant);
        LayerNorm ln(F, 1e-5, variant < 2, variant == 0);
        for (Param& p : ln.parameter_list()) *p.value = init::randn(p.value->shape(), rng);
        Tensor x = init::randn({N, F}, rng), dy = init::randn({N, F}, rng);
        for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = 3 * x.data()[i] + 1;  // not normalised already
        if (F >= 8) {  // row 0 cancels: ±1e20 in lanes 0 and 4, so the order of the double sums shows in
          // the floats (in 8 lanes, lanes 1..3 are absorbed by 1e20 before lane 4 cancels it; in 4 lanes
          // or serially, other terms are: a 4-lane reference fails this test at every F >= 8)
          x.data()[0] = 1e20f, x.data()[4] = -1e20f, x.data()[1] = 1.0f;
          dy.data()[0] = 1e20f, dy.data()[4] = -1e20f, dy.data()[1] = 1.0f;
        }
        LnRef want = layer_norm_ref(x, dy, ln.weight.data(), ln.bias.data(), 1e-5);
        expect_same_bits(ln.forward(x.view()), want.y, "y");
        expect_same_bits(ln.backward(dy.view()), want.dx, "dx");
        if (ln.weight.data()) expect_same_bits(ln.weight_grad, want.dw, "dweight");
        if (ln.bias.data()) expect_same_bits(ln.bias_grad, want.db, "dbias");
      }
}

TEST(LayerNorm, FusedResidualAddsHaveTheBitsOfAddThenNorm) {
  Rng rng(8);
  for (int64_t F : {1, 9, 33, 128}) {
    SCOPED_TRACE(F);
    LayerNorm a(F), b(F);
    for (Param& p : a.parameter_list()) *p.value = init::randn(p.value->shape(), rng);
    for (size_t i = 0; i < a.parameter_list().size(); ++i)
      *b.parameter_list()[i].value = Tensor::copy_of(a.parameter_list()[i].value->view());
    Tensor branch = init::randn({3, 5, F}, rng), res = init::randn({3, 5, F}, rng), dy = init::randn({3, 5, F}, rng);
    Tensor g = init::randn({3, 5, F}, rng);
    // unfused: x = branch + res; y = norm(x); then g + backward(dy)
    Tensor x = Tensor::copy_of(branch.view());
    add_(x.view(), res.view());
    Tensor y = a.forward(x.view());
    Tensor g_unfused = Tensor::copy_of(g.view());
    add_(g_unfused.view(), a.backward(dy.view()).view());
    // fused
    Tensor xf = Tensor::copy_of(branch.view());
    Tensor yf = b.forward_add(xf, res.view());
    b.backward_add(dy.view(), g);
    expect_same_bits(xf, x, "x + residual");
    expect_same_bits(yf, y, "norm");
    expect_same_bits(g, g_unfused, "g + dx");
    expect_same_bits(b.weight_grad, a.weight_grad, "dweight");
    expect_same_bits(b.bias_grad, a.bias_grad, "dbias");
  }
  LayerNorm ln(4);
  Tensor x({2, 4});
  EXPECT_THROW(ln.forward_add(x, Tensor({2, 3}).view()), Error);
  ln.forward(x.view());
  Tensor g({2, 3});
  EXPECT_THROW(ln.backward_add(Tensor({2, 4}).view(), g), Error);
}

TEST(LayerNorm, SameBitsForOneAndTwoThreads) {
  Rng rng(9);
  const int64_t N = 700, F = 100;  // rows and features in several chunks each
  Tensor x = init::randn({N, F}, rng), dy = init::randn({N, F}, rng);
  Tensor w = init::randn({F}, rng), bb = init::randn({F}, rng);
  std::vector<Tensor> outs;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    LayerNorm ln(F);
    ln.weight = Tensor::copy_of(w.view()), ln.bias = Tensor::copy_of(bb.view());
    outs.push_back(ln.forward(x.view()));
    outs.push_back(ln.backward(dy.view()));
    outs.push_back(Tensor::copy_of(ln.weight_grad.view()));
    outs.push_back(Tensor::copy_of(ln.bias_grad.view()));
  }
  set_num_threads(0);
  for (size_t i = 0; i < 4; ++i) expect_same_bits(outs[i], outs[i + 4], "output " + std::to_string(i));
}

TEST(Activation, GradientsMatchFiniteDifferences) {
  Rng rng(3);
  Tensor x = init::randn({3, 11}, rng);
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

// In eval, a tensor handed over (an MLP's Linear output) gets the activation written over it: the same bits as a
// new output, in the same buffer. In training it is the saved input, and a view is never written over.
TEST(Activation, EvalWritesOverAnInputHandedOver) {
  Rng rng(4);
  const Tensor x = init::randn({37, 29}, rng);  // a ragged count: the lockstep groups' tail too
  for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh}) {
    ActivationLayer layer(a);
    layer.eval();
    const Tensor want = layer.forward(x.view());
    Tensor given = Tensor::copy_of(x.view());
    const float* buffer = given.data();
    const Tensor y = layer.forward(std::move(given));
    EXPECT_EQ(y.data(), buffer) << to_string(a);
    EXPECT_EQ(std::memcmp(y.data(), want.data(), sizeof(float) * size_t(x.numel())), 0) << to_string(a);
    Tensor kept = Tensor::copy_of(x.view());
    const float* saved = kept.data();
    layer.train();
    const Tensor z = layer.forward(std::move(kept));
    EXPECT_NE(z.data(), saved) << to_string(a);
    EXPECT_EQ(std::memcmp(z.data(), want.data(), sizeof(float) * size_t(x.numel())), 0) << to_string(a);
    const Tensor g = layer.backward(x.view());  // from the saved input, x's values untouched
    const Tensor g_view = [&] {
      ActivationLayer fresh(a);
      fresh.forward(x.view());
      return fresh.backward(x.view());
    }();
    EXPECT_EQ(std::memcmp(g.data(), g_view.data(), sizeof(float) * size_t(x.numel())), 0) << to_string(a);
  }
}

TEST(Activation, GeluMatchesDoubleFormulasAcrossTheRange) {
  // The SIMD erfc (Numerical Recipes' erfcc, fractional error 1.2e-7) against std::erfc in double, over
  // [-12, 12] on both sides of every branch, with 1000 values per unit plus a ragged tail. Relative bound:
  // 1.2e-7 for the approximation, plus the rounding of the exp argument -z² + P (z = |x|/√2 rounded once,
  // z² once more, the sum once: ~4 eps relative to z²), which exp turns into a relative error of the
  // result, plus a few eps for the other products. At x = -12 that is 1.8e-5 relative, where PyTorch's
  // float32 1 + erf has cancelled to 0; the tails stay accurate because Φ is computed as erfc.
  const int64_t n = 24001;
  Tensor x({n});
  for (int64_t i = 0; i < n; ++i) x.data()[i] = float(-12.0 + 24.0 * double(i) / double(n - 1));
  for (Activation a : {Activation::gelu, Activation::gelu_tanh}) {
    ActivationLayer layer(a);
    Tensor y = layer.forward(x.view());
    Tensor ones({n});
    for (int64_t i = 0; i < n; ++i) ones.data()[i] = 1.0f;
    Tensor g = layer.backward(ones.view());
    for (int64_t i = 0; i < n; ++i) {
      const double v = x.data()[i];
      double f, df;
      if (a == Activation::gelu) {
        const double cdf = 0.5 * std::erfc(-v / std::sqrt(2.0)), pdf = std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
        f = v * cdf, df = cdf + v * pdf;
      } else {
        const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (v + 0.044715 * v * v * v));
        f = 0.5 * v * (1 + t), df = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
      }
      const double eps = std::numeric_limits<float>::epsilon() / 2;
      // tanh: Highway's Tanh is good to a few ulp, but 1 + t cancels for x << 0; bound it absolutely.
      const double rel = a == Activation::gelu ? 1.2e-7 + (0.5 * v * v + 2) * 4 * eps : 16 * eps;
      const double abs_floor = a == Activation::gelu ? 1e-38 : 16 * eps * std::abs(v);
      ASSERT_NEAR(y.data()[i], f, rel * std::abs(f) + abs_floor) << to_string(a) << "(" << v << ")";
      ASSERT_NEAR(g.data()[i], df, rel * std::abs(df) + abs_floor + 4 * eps) << to_string(a) << "'(" << v << ")";
    }
  }
}

TEST(Dropout, MaskSharedByForwardAndBackward) {
  Rng rng(4);
  Tensor x = init::randn({64, 33}, rng);
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
  Tensor g = init::randn({2, 2, 3}, rng);
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
                                  init::randn({2, 3, 6}, rng));
      check_gradients(c, p > 0 ? "FeedForward with dropout" : "FeedForward");
    }
  }
}

// linear's bias gradient summed in the activation's backward (backward_before) against the two layers'
// backwards one after the other: the same bits for every gradient; odd widths (out 1100: several column
// groups and a partial one), N = 1, with and without bias.
TEST(FeedForward, BiasGradientInTheActivationsBackwardHasTheBitsOfTwoLayers) {
  Rng rng(11);
  for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh})
    for (bool bias : {true, false})
      for (Shape3 s :
           {Shape3{1, 1, 1}, Shape3{3, 17, 33}, Shape3{67, 13, 129}, Shape3{5, 1100, 7}, Shape3{9, 5, 1100}}) {
        SCOPED_TRACE(::testing::Message() << to_string(a) << " bias " << bias << " N " << s.n << " in " << s.in
                                          << " out " << s.out);
        Linear l1(s.in, s.out, bias, 3), l2(s.in, s.out, bias, 3);
        ActivationLayer act1(a), act2(a);
        Tensor x = init::randn({s.n, s.in}, rng), dy = init::randn({s.n, s.out}, rng);
        act1.forward(l1.forward(x.view()));
        act2.forward(l2.forward(x.view()));
        Tensor dx1 = l1.backward(act1.backward(dy.view()).view());
        // fused: with a bias, linear's bias gradient summed in the activation's backward pass
        Tensor g2 = bias ? act2.backward_before(l2, Tensor::copy_of(dy.view())) : act2.backward(dy.view());
        Tensor dx2 = l2.backward(g2.view(), !bias);
        expect_same_bits(dx2, dx1, "dx");
        expect_same_bits(l2.weight_grad, l1.weight_grad, "dweight");
        if (bias) expect_same_bits(l2.bias_grad, l1.bias_grad, "dbias");
      }
  ActivationLayer act(Activation::gelu);
  act.forward(Tensor({2, 3}).view());
  Linear no_bias(4, 3, false);
  EXPECT_THROW(act.backward_before(no_bias, Tensor({2, 3})), Error);
}

TEST(Gradients, AccumulateAndZero) {
  Rng rng(7);
  FeedForward ff(4, 8, Activation::gelu, 0.0, true, 1);
  Tensor x = init::randn({3, 4}, rng), d = init::randn({3, 4}, rng);
  ff.forward(x.view());
  ff.backward(d.view());
  StateDict once;
  for (Param& p : ff.parameter_list()) once.emplace(p.name, Tensor::copy_of(p.grad->view()));
  ff.forward(x.view());
  ff.backward(d.view());
  expect_doubled(ff, once);
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

// ---- MultiheadAttention ----

namespace {

struct MhaCase {
  const char* name;
  MhaOptions o;
  int64_t B = 2, L = 5, S = 5;
  bool self = true;       // one input as query, key and value
  bool unbatched = false;
  bool causal = false;
  int mask = 0;           // 0 none, 1 bool (L, S), 2 additive (N·H, L, S)
  bool padding = false;   // key_padding_mask: the last key of batch 1 is padding
  bool need_weights = false;
};

// Mask storage that outlives the GradCase's lambdas.
struct MhaMasks {
  TensorT<uint8_t> bools, padding;
  Tensor additive;
  MhaArgs args;
};

std::shared_ptr<MhaMasks> make_masks(const MhaCase& m, Rng& rng) {
  auto k = std::make_shared<MhaMasks>();
  k->args.need_weights = m.need_weights;
  k->args.is_causal = m.causal;
  if (m.mask == 1) {
    k->bools = TensorT<uint8_t>({m.L, m.S});
    for (int64_t i = 0; i < k->bools.numel(); ++i)
      k->bools.data()[i] = (i % m.S) != 0 && rng.uniform() < 0.3;  // key 0 stays
    k->args.attn_mask = Mask<float>::drop(k->bools.view());
  } else if (m.mask == 2) {
    k->additive = init::randn({m.B * m.o.num_heads, m.L, m.S}, rng);
    k->args.attn_mask = Mask<float>::additive(k->additive.view());
  }
  if (m.padding) {
    k->padding = TensorT<uint8_t>({m.B, m.S});
    k->padding.data()[m.B * m.S - 1] = 1;
    k->args.key_padding_mask = Mask<float>::drop(k->padding.view());
  }
  return k;
}

Shape layout(const MhaCase& m, int64_t T, int64_t C) {
  if (m.unbatched) return {T, C};
  return m.o.batch_first ? Shape{m.B, T, C} : Shape{T, m.B, C};
}

// Nonzero biases (PyTorch initialises them to 0), so their gradients and slices are tested.
template <class L>
void randomize_biases(L& layer) {
  Rng r(77);
  for (Param& p : layer.parameter_list())
    if (p.name.find("bias") != std::string::npos) *p.value = init::randn(p.value->shape(), r, 0.5);
}

GradCase<MultiheadAttention> mha_case(const MhaCase& m) {
  Rng rng(std::hash<std::string>{}(m.name));
  GradCase<MultiheadAttention> c;
  MhaOptions o = m.o;
  c.make = [o] {
    auto l = std::make_unique<MultiheadAttention>(o);
    randomize_biases(*l);
    return l;
  };
  auto masks = make_masks(m, rng);
  const int64_t kdim = m.o.kdim ? m.o.kdim : m.o.embed_dim, vdim = m.o.vdim ? m.o.vdim : m.o.embed_dim;
  c.inputs.push_back(init::randn(layout(m, m.L, m.o.embed_dim), rng));
  if (!m.self) {
    c.inputs.push_back(init::randn(layout(m, m.S, kdim), rng));
    c.inputs.push_back(init::randn(layout(m, m.S, vdim), rng));
  }
  c.forward = [masks](MultiheadAttention& l, const std::vector<Tensor>& in) {
    const Tensor& q = in[0];
    const Tensor& k = in.size() > 1 ? in[1] : in[0];
    const Tensor& v = in.size() > 1 ? in[2] : in[0];
    return std::move(l.forward(q.view(), k.view(), v.view(), masks->args).output);
  };
  const bool self = m.self;
  c.backward = [self](MultiheadAttention& l, View<const float> d) {
    MhaGrads g = l.backward(d);
    std::vector<Tensor> r;
    if (self) {
      add_(g.dquery.view(), g.dkey.view());
      add_(g.dquery.view(), g.dvalue.view());
      r.push_back(std::move(g.dquery));
    } else {
      r.push_back(std::move(g.dquery));
      r.push_back(std::move(g.dkey));
      r.push_back(std::move(g.dvalue));
    }
    return r;
  };
  return c;
}

MhaOptions mha_opts(int64_t E, int64_t H, int64_t Hkv = 0) {
  MhaOptions o;
  o.embed_dim = E, o.num_heads = H, o.num_kv_heads = Hkv, o.seed = 5;
  return o;
}

}  // namespace

TEST(MultiheadAttention, GradientsMatchFiniteDifferences) {
  std::vector<MhaCase> cases;
  cases.push_back({"self", mha_opts(8, 2)});
  cases.push_back({"self causal batch_first", mha_opts(8, 2)});
  cases.back().o.batch_first = true, cases.back().causal = true;
  cases.push_back({"cross kdim/vdim, additive (N·H, L, S) mask, padding", mha_opts(8, 2), 2, 4, 6, false});
  cases.back().o.kdim = 5, cases.back().o.vdim = 7, cases.back().mask = 2, cases.back().padding = true;
  cases.push_back({"GQA 4:2 self, bool mask, causal", mha_opts(8, 4, 2)});
  cases.back().mask = 1, cases.back().causal = true;
  cases.push_back({"MQA 4:1 cross batch_first", mha_opts(8, 4, 1), 2, 3, 6, false});
  cases.back().o.batch_first = true, cases.back().padding = true;
  cases.push_back({"add_bias_kv add_zero_attn causal, padding", mha_opts(8, 2)});
  cases.back().o.add_bias_kv = cases.back().o.add_zero_attn = true, cases.back().causal = true,
      cases.back().padding = true;
  cases.push_back({"add_bias_kv cross batch_first, bool mask", mha_opts(8, 2), 2, 4, 6, false});
  cases.back().o.add_bias_kv = true, cases.back().o.batch_first = true, cases.back().mask = 1;
  cases.push_back({"no bias, unbatched", mha_opts(8, 2)});
  cases.back().o.bias = false, cases.back().unbatched = true;
  cases.push_back({"dropout 0.2 on the weights", mha_opts(8, 2)});
  cases.back().o.dropout = 0.2;
  cases.push_back({"need_weights in training (reference forward, LSE)", mha_opts(8, 2)});
  cases.back().need_weights = true, cases.back().mask = 2;
  for (const MhaCase& m : cases) {
    auto c = mha_case(m);
    check_gradients(c, m.name);
  }
}

TEST(MultiheadAttention, BackwardNeedsATrainingForward) {
  MultiheadAttention m(mha_opts(8, 2));
  Tensor x({3, 2, 8});
  EXPECT_THROW(m.backward(x.view()), Error);
  m.eval();
  m.forward(x.view(), x.view(), x.view());
  EXPECT_THROW(m.backward(x.view()), Error);
  m.train();
  m.forward(x.view(), x.view(), x.view());
  Tensor wrong({2, 3, 8});
  EXPECT_THROW(m.backward(wrong.view()), Error);
  std::vector<std::string> names;
  for (Param& p : m.parameter_list()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}));
}

// ---- Transformer layers ----

namespace {

TransformerOptions tf_opts(bool norm_first, Activation act, double dropout = 0.0) {
  TransformerOptions o;
  o.d_model = 8, o.nhead = 2, o.dim_feedforward = 12, o.dropout = dropout, o.activation = act;
  o.norm_first = norm_first, o.seed = 3;
  return o;
}

}  // namespace

TEST(TransformerEncoderLayer, GradientsMatchFiniteDifferences) {
  struct Case {
    const char* name;
    TransformerOptions o;
    bool causal, padding;
  };
  std::vector<Case> cases = {
      {"post-LN gelu", tf_opts(false, Activation::gelu), false, false},
      {"pre-LN gelu causal, padding", tf_opts(true, Activation::gelu), true, true},
      {"pre-LN gelu_tanh, GQA 2:1, batch_first", tf_opts(true, Activation::gelu_tanh), false, false},
      {"post-LN gelu, dropout 0.1", tf_opts(false, Activation::gelu, 0.1), true, false},
  };
  cases[2].o.num_kv_heads = 1, cases[2].o.batch_first = true;
  for (const Case& k : cases) {
    Rng rng(11);
    TransformerOptions o = k.o;
    auto pad = std::make_shared<TensorT<uint8_t>>(Shape{2, 5});
    pad->data()[9] = 1;
    EncoderArgs a;
    a.is_causal = k.causal;
    if (k.padding) a.src_key_padding_mask = Mask<float>::drop(pad->view());
    GradCase<TransformerEncoderLayer> c;
    c.make = [o] {
      auto l = std::make_unique<TransformerEncoderLayer>(o);
      randomize_biases(*l);
      return l;
    };
    c.inputs.push_back(init::randn(o.batch_first ? Shape{2, 5, 8} : Shape{5, 2, 8}, rng));
    c.forward = [a, pad](TransformerEncoderLayer& l, const std::vector<Tensor>& in) {
      return l.forward(in[0].view(), a);
    };
    c.backward = [](TransformerEncoderLayer& l, View<const float> d) {
      std::vector<Tensor> r;
      r.push_back(l.backward(d));
      return r;
    };
    check_gradients(c, k.name);
  }
}

TEST(TransformerDecoderLayer, GradientsMatchFiniteDifferences) {
  struct Case {
    const char* name;
    TransformerOptions o;
    bool causal, masks;
  };
  std::vector<Case> cases = {
      {"post-LN gelu causal", tf_opts(false, Activation::gelu), true, false},
      {"pre-LN gelu, memory mask and padding, batch_first", tf_opts(true, Activation::gelu), false, true},
      {"pre-LN gelu_tanh causal, GQA 2:1, dropout 0.1", tf_opts(true, Activation::gelu_tanh, 0.1), true, true},
  };
  cases[1].o.batch_first = true;
  cases[2].o.num_kv_heads = 1;
  for (const Case& k : cases) {
    Rng rng(12);
    TransformerOptions o = k.o;
    const int64_t L = 4, S = 6, B = 2, E = 8;
    auto mm = std::make_shared<Tensor>(init::randn({L, S}, rng));  // additive memory_mask
    auto pad = std::make_shared<TensorT<uint8_t>>(Shape{B, S});
    pad->data()[B * S - 1] = 1;
    DecoderArgs a;
    a.tgt_is_causal = k.causal;
    if (k.masks) {
      a.memory_mask = Mask<float>::additive(mm->view());
      a.memory_key_padding_mask = Mask<float>::drop(pad->view());
    }
    GradCase<TransformerDecoderLayer> c;
    c.make = [o] {
      auto l = std::make_unique<TransformerDecoderLayer>(o);
      randomize_biases(*l);
      return l;
    };
    c.inputs.push_back(init::randn(o.batch_first ? Shape{B, L, E} : Shape{L, B, E}, rng));
    c.inputs.push_back(init::randn(o.batch_first ? Shape{B, S, E} : Shape{S, B, E}, rng));
    c.forward = [a, mm, pad](TransformerDecoderLayer& l, const std::vector<Tensor>& in) {
      return l.forward(in[0].view(), in[1].view(), a);
    };
    c.backward = [](TransformerDecoderLayer& l, View<const float> d) {
      DecoderGrads g = l.backward(d);
      std::vector<Tensor> r;
      r.push_back(std::move(g.dtgt));
      r.push_back(std::move(g.dmemory));
      return r;
    };
    check_gradients(c, k.name);
  }
}

TEST(TransformerLayers, StateDictNamesAreTorchs) {
  TransformerEncoderLayer enc(tf_opts(false, Activation::relu));
  TransformerDecoderLayer dec(tf_opts(true, Activation::relu));
  std::vector<std::string> e, d;
  for (Param& p : enc.parameter_list()) e.push_back(p.name);
  for (Param& p : dec.parameter_list()) d.push_back(p.name);
  EXPECT_EQ(e, (std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                         "self_attn.out_proj.weight", "self_attn.out_proj.bias", "linear1.weight",
                                         "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias",
                                         "norm2.weight", "norm2.bias"}));
  EXPECT_EQ(d.size(), 4u + 4u + 4u + 6u);
  EXPECT_EQ(d[4], "multihead_attn.in_proj_weight");
  EXPECT_EQ(d.back(), "norm3.bias");
}

TEST(TransformerLayers, GradientsAccumulate) {
  Rng rng(13);
  TransformerEncoderLayer enc(tf_opts(true, Activation::gelu));
  Tensor x = init::randn({5, 2, 8}, rng), d = init::randn({5, 2, 8}, rng);
  enc.forward(x.view());
  Tensor dx1 = enc.backward(d.view());
  StateDict once;
  for (Param& p : enc.parameter_list()) once.emplace(p.name, Tensor::copy_of(p.grad->view()));
  enc.forward(x.view());
  Tensor dx2 = enc.backward(d.view());
  for (int64_t i = 0; i < dx1.numel(); ++i) ASSERT_EQ(dx1.data()[i], dx2.data()[i]);  // deterministic
  expect_doubled(enc, once);
  enc.zero_grad();
  for (Param& p : enc.parameter_list())
    for (int64_t i = 0; i < p.grad->numel(); ++i) ASSERT_EQ(p.grad->data()[i], 0.0f) << p.name;
}

// ---- KV cache ----

namespace {

// Runs T0 tokens then one at a time through step(), against one full causal forward.
// Float tolerance: both sides are float32 attention over <= 12 keys of unit-scale projections; the
// decode path and the full flash forward sum in other orders, ~1e-6 apart. 1e-5 is 10x that, and far
// below a wrong alignment or a missed key (errors ~0.1).
constexpr double kCacheTol = 1e-5;

void expect_rows_equal(const Tensor& full, const Tensor& step, bool batch_first, int64_t B, int64_t t0, int64_t T,
                       int64_t E) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        const int64_t fi = batch_first ? (b * full.size(1) + t0 + t) * E + e : ((t0 + t) * B + b) * E + e;
        const int64_t si = batch_first ? (b * T + t) * E + e : (t * B + b) * E + e;
        ASSERT_NEAR(step.data()[si], full.data()[fi], kCacheTol) << "b " << b << " t " << t0 + t << " e " << e;
      }
}

// Tokens [t0, t0 + T) of x in its layout, contiguous.
Tensor slice_tokens(const Tensor& x, bool batch_first, int64_t t0, int64_t T) {
  View<const float> v = x.view();
  const int d = batch_first ? 1 : 0;
  v.data += t0 * v.stride(d);
  v.shape[d] = T;
  return Tensor::copy_of(v);
}

}  // namespace

TEST(KVCache, IncrementalAttentionEqualsFullCausalForward) {
  for (int64_t Hkv : {4, 2, 1}) {
    for (bool batch_first : {false, true}) {
      SCOPED_TRACE(testing::Message() << "Hkv " << Hkv << " batch_first " << batch_first);
      MhaOptions o = mha_opts(16, 4, Hkv);
      o.batch_first = batch_first;
      MultiheadAttention m(o);
      randomize_biases(m);
      m.eval();
      const int64_t B = 2, T = 11, T0 = 4, E = 16;
      Rng rng(20);
      Tensor x = init::randn(batch_first ? Shape{B, T, E} : Shape{T, B, E}, rng);
      MhaArgs a;
      a.need_weights = false;
      a.is_causal = true;
      Tensor full = std::move(m.forward(x.view(), x.view(), x.view(), a).output);
      KVCache cache(2, B, Hkv, 12, 4);
      Tensor first = m.forward_cached(slice_tokens(x, batch_first, 0, T0).view(), cache, 1);  // prefill
      expect_rows_equal(full, first, batch_first, B, 0, T0, E);
      for (int64_t t = T0; t < T; ++t) {
        Tensor y = m.forward_cached(slice_tokens(x, batch_first, t, 1).view(), cache, 1);
        expect_rows_equal(full, y, batch_first, B, t, 1, E);
      }
      EXPECT_EQ(cache.length(1), T);
      EXPECT_EQ(cache.length(0), 0);
      Tensor more = slice_tokens(x, batch_first, 0, 2);
      EXPECT_THROW(m.forward_cached(more.view(), cache, 1), Error);  // 11 + 2 > S_max = 12
      KVCache wrong(1, B, 4 * Hkv, 12, 4);  // stores H·Hkv heads, not Hkv
      EXPECT_THROW(m.forward_cached(more.view(), wrong, 0), Error);
    }
  }
}

TEST(KVCache, EncoderLayerIncrementalEqualsFullCausalForward) {
  for (bool norm_first : {true, false}) {
    TransformerOptions o = tf_opts(norm_first, Activation::gelu, 0.1);
    o.num_kv_heads = 1, o.batch_first = true;
    TransformerEncoderLayer enc(o);
    randomize_biases(enc);
    Rng rng(21);
    const int64_t B = 2, T = 7, E = 8;
    Tensor x = init::randn({B, T, E}, rng);
    KVCache cache(1, B, 1, T, 4);
    EXPECT_THROW(enc.forward_cached(x.view(), cache, 0), Error);  // training mode
    enc.eval();
    EncoderArgs a;
    a.is_causal = true;
    Tensor full = enc.forward(x.view(), a);
    Tensor first = enc.forward_cached(slice_tokens(x, true, 0, 3).view(), cache, 0);
    expect_rows_equal(full, first, true, B, 0, 3, E);
    for (int64_t t = 3; t < T; ++t)
      expect_rows_equal(full, enc.forward_cached(slice_tokens(x, true, t, 1).view(), cache, 0), true, B, t, 1, E);
  }
}

// A rolling layer (a sliding window of W tokens) holds exactly the last W tokens appended, in position order,
// as one strided view, whatever the appends' sizes (one token, several, more than W); in f32 and bf16; a
// layer that keeps every token beside it is unchanged; MultiheadAttention refuses a rolling layer by name.
TEST(KVCache, RollingLayerHoldsTheLastWindowInOrder) {
  const int64_t B = 2, Hkv = 3, D = 5, W = 4, S_max = 9;
  for (KvDtype dtype : {KvDtype::f32, KvDtype::bf16}) {
    SCOPED_TRACE(to_string(dtype));
    KVCache cache(2, B, Hkv, S_max, D, 0, dtype, {0, W});
    EXPECT_EQ(cache.window(0), 0);
    EXPECT_EQ(cache.window(1), W);
    EXPECT_EQ(cache.max_length(), S_max);
    // token p's K element (b, h, e) = p + 0.25·e (exact in bf16 for p < 64); V = -K
    auto tokens = [&](int64_t p0, int64_t T) {
      Tensor k({B, Hkv, T, D}), v({B, Hkv, T, D});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t e = 0; e < D; ++e) {
              const int64_t i = ((b * Hkv + h) * T + t) * D + e;
              k.data()[i] = float(p0 + t) + 0.25f * float(e) + float(b + h);
              v.data()[i] = -k.data()[i];
            }
      return std::pair{std::move(k), std::move(v)};
    };
    int64_t n = 0;
    for (int64_t T : {1, 2, 1, 3, 5, 1, 1}) {  // 14 tokens: past the window twice, and one append longer than W
      auto [k, v] = tokens(n, T);
      if (cache.length(0) + T <= S_max) cache.append(0, k.view(), v.view());
      cache.append(1, k.view(), v.view());
      n += T;
      ASSERT_EQ(cache.length(1), n);
      ASSERT_EQ(cache.stored(1), std::min(n, W));
      std::vector<float> kk(static_cast<size_t>(D)), vv(static_cast<size_t>(D));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hkv; ++h)
          for (int64_t s = 0; s < cache.stored(1); ++s) {
            const int64_t p = n - cache.stored(1) + s;  // the position slot s holds
            if (dtype == KvDtype::f32) {
              const View<const float> K = cache.keys(1), V = cache.values(1);
              for (int64_t e = 0; e < D; ++e) {
                kk[size_t(e)] = K.data[b * K.stride(0) + h * K.stride(1) + s * K.stride(2) + e];
                vv[size_t(e)] = V.data[b * V.stride(0) + h * V.stride(1) + s * V.stride(2) + e];
              }
            } else {
              const HalfKV kv = cache.half(1);
              from_half(dtype, kv.k.data + b * kv.k.stride(0) + h * kv.k.stride(1) + s * kv.k.stride(2), D, kk.data());
              from_half(dtype, kv.v.data + b * kv.v.stride(0) + h * kv.v.stride(1) + s * kv.v.stride(2), D, vv.data());
            }
            for (int64_t e = 0; e < D; ++e) {
              const float want = float(p) + 0.25f * float(e) + float(b + h);
              ASSERT_EQ(kk[size_t(e)], want) << "n " << n << " b " << b << " h " << h << " s " << s << " e " << e;
              ASSERT_EQ(vv[size_t(e)], -want);
            }
          }
    }
    EXPECT_EQ(cache.length(0), 9);  // the layer keeping every token stops at S_max
    EXPECT_THROW(cache.append(0, tokens(9, 1).first.view(), tokens(9, 1).second.view()), Error);
    cache.clear();
    EXPECT_EQ(cache.stored(1), 0);
  }
  KVCache rolling(1, 1, 1, 8, 4, 0, KvDtype::f32, {3});
  EXPECT_EQ(rolling.max_length(), std::numeric_limits<int64_t>::max());  // every layer rolls: no limit
  EXPECT_EQ(KVCache(1, 1, 1, 8, 4, 0, KvDtype::f32, {8}).window(0), 0);  // W >= S_max keeps every token
  EXPECT_THROW(KVCache(2, 1, 1, 8, 4, 0, KvDtype::f32, {3}), Error);     // one window per layer
  MultiheadAttention m(mha_opts(4, 1, 1));
  m.eval();
  Tensor x({1, 1, 4});
  const std::string e = test::error_of([&] { m.forward_cached(x.view(), rolling, 0); });
  EXPECT_NE(e.find("keeps every token"), std::string::npos) << e;
}

TEST(TransformerLayers, SameBitsForOneTwoAndThreeThreads) {
  // DESIGN: a reduction order that does not depend on how work was split (our row loops, the flash
  // kernels and gemm, which split output tiles, never the summed dimension).
  Rng rng(30);
  const int64_t B = 3, L = 33, S = 17, E = 32;
  Tensor tgt = init::randn({B, L, E}, rng), mem = init::randn({B, S, E}, rng), d = init::randn({B, L, E}, rng);
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    TransformerOptions o = tf_opts(true, Activation::gelu, 0.1);
    o.d_model = E, o.nhead = 4, o.num_kv_heads = 2, o.dim_feedforward = 3 * E, o.batch_first = true;
    TransformerDecoderLayer dec(o);
    DecoderArgs a;
    a.tgt_is_causal = true;
    Tensor y = dec.forward(tgt.view(), mem.view(), a);
    DecoderGrads g = dec.backward(d.view());
    std::vector<float> all(y.data(), y.data() + y.numel());
    all.insert(all.end(), g.dtgt.data(), g.dtgt.data() + g.dtgt.numel());
    all.insert(all.end(), g.dmemory.data(), g.dmemory.data() + g.dmemory.numel());
    for (Param& p : dec.parameter_list()) all.insert(all.end(), p.grad->data(), p.grad->data() + p.grad->numel());
    runs.push_back(std::move(all));
  }
  set_num_threads(1);
  for (size_t t : {1, 2}) {
    ASSERT_EQ(runs[0].size(), runs[t].size());
    for (size_t i = 0; i < runs[0].size(); ++i) ASSERT_EQ(runs[0][i], runs[t][i]) << "element " << i << ", run " << t;
  }
}

TEST(Dropout, ReseedRestartsTheStream) {
  Rng rng(41);
  Tensor x = init::randn({8, 16}, rng);
  Dropout fresh(0.5, 123), used(0.5, 7);
  used.forward(x.view());
  used.reseed(123);
  Tensor a = fresh.forward(x.view()), b = used.forward(x.view());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]);
  // Attention-weight dropout: the same seed gives the same output, another seed another one.
  MhaOptions o = mha_opts(8, 2);
  o.dropout = 0.5;
  MultiheadAttention m(o);
  Tensor q = init::randn({4, 2, 8}, rng);
  MhaArgs args;
  args.need_weights = false;
  m.reseed(9);
  Tensor y1 = std::move(m.forward(q.view(), q.view(), q.view(), args).output);
  Tensor y2 = std::move(m.forward(q.view(), q.view(), q.view(), args).output);
  m.reseed(9);
  Tensor y3 = std::move(m.forward(q.view(), q.view(), q.view(), args).output);
  int64_t same12 = 0;
  for (int64_t i = 0; i < y1.numel(); ++i) {
    ASSERT_EQ(y1.data()[i], y3.data()[i]);
    same12 += y1.data()[i] == y2.data()[i];
  }
  EXPECT_LT(same12, y1.numel());
}

// ---- No wasted copies (issue #9): the Tensor&& entry points keep buffers, and give the View path's bits ----

namespace {

using test::same_bits;

TEST(NoCopies, DropoutApplyIsTheIdentityWithoutACopy) {
  Rng rng(51);
  Dropout off(0.0, 1), on(0.5, 1);
  Tensor x = init::randn({4, 8}, rng);
  const float* p = x.data();
  Tensor y = off.apply(std::move(x));  // p = 0: the same buffer back
  EXPECT_EQ(y.data(), p);
  Tensor g = off.apply_backward(std::move(y));
  EXPECT_EQ(g.data(), p);
  on.eval();  // eval mode: the identity too
  Tensor z = on.apply(std::move(g));
  EXPECT_EQ(z.data(), p);
  on.train();  // training with p > 0: forward's masked copy, the same bits as forward()
  Dropout twin(0.5, 1);
  Tensor want = twin.forward(z.view());
  Tensor got = on.apply(std::move(z));
  EXPECT_NE(got.data(), p);
  EXPECT_TRUE(same_bits(got, want));
}

TEST(NoCopies, TemporaryInputsGiveTheSameBitsAsViews) {
  // Linear and GELU keep a temporary input instead of copying it; GELU's backward writes over dout.
  Rng rng(52);
  Tensor x = init::randn({5, 7, 12}, rng), d = init::randn({5, 7, 9}, rng);
  Linear a(12, 9, true, 3), b(12, 9, true, 3);
  ActivationLayer ga(Activation::gelu), gb(Activation::gelu);
  Tensor ya = ga.forward(a.forward(x.view()).view());
  Tensor xb = Tensor::copy_of(x.view());
  Tensor yb = gb.forward(b.forward(std::move(xb)));
  EXPECT_TRUE(same_bits(ya, yb));
  Tensor da = a.backward(ga.backward(d.view()).view());
  Tensor dd = Tensor::copy_of(d.view());
  const float* p = dd.data();
  Tensor gd = gb.backward(std::move(dd));
  EXPECT_EQ(gd.data(), p);  // in place
  Tensor db = b.backward(gd.view());
  EXPECT_TRUE(same_bits(da, db));
  EXPECT_TRUE(same_bits(a.weight_grad, b.weight_grad));
  EXPECT_TRUE(same_bits(a.bias_grad, b.bias_grad));
}

TEST(NoCopies, EncoderLayerTemporaryGradientGivesTheSameBits) {
  // Pre-LN backward(Tensor&&) accumulates over dout's buffer; forward_self keeps the norm's output.
  Rng rng(53);
  Tensor x = init::randn({2, 9, 16}, rng), d = init::randn({2, 9, 16}, rng);
  TransformerOptions o;
  o.d_model = 16, o.nhead = 4, o.dim_feedforward = 24, o.dropout = 0.1, o.activation = Activation::gelu;
  o.batch_first = true, o.norm_first = true, o.seed = 9;
  TransformerEncoderLayer a(o), b(o);
  EncoderArgs args;
  args.is_causal = true;
  EXPECT_TRUE(same_bits(a.forward(x.view(), args), b.forward(x.view(), args)));
  Tensor da = a.backward(d.view());
  Tensor dd = Tensor::copy_of(d.view());
  const float* p = dd.data();
  Tensor db = b.backward(std::move(dd));
  EXPECT_EQ(db.data(), p);
  EXPECT_TRUE(same_bits(da, db));
  std::vector<Param> pa = a.parameter_list(), pb = b.parameter_list();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(same_bits(*pa[i].grad, *pb[i].grad)) << pa[i].name;
}

}  // namespace

// A leaf that records what its parent passes down.
struct Probe : Layer {
  uint64_t seed = 0;
  int64_t batch_offset = -1;
  void reseed(uint64_t s) override { seed = s; }
  void set_batch_offset(int64_t b0) override { batch_offset = b0; }
};

// A composite that lists a Linear, a nested composite (FeedForward) and probes once, in children().
struct Composite : Layer {
  Linear proj{4, 3, true, 1};
  FeedForward inner{3, 5, Activation::gelu, 0.5, true, 2};
  Probe probe;
  std::vector<Child> children() override {
    return {{"proj.", &proj}, {"inner.", &inner, 8}, {"probe.", &probe, 3}};
  }
};

TEST(Layer, ParametersTrainReseedAndBatchOffsetWalkTheChildren) {
  Composite c;
  std::vector<std::string> names;
  for (const Param& p : c.parameter_list()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"proj.weight", "proj.bias", "inner.linear1.weight",
                                             "inner.linear1.bias", "inner.linear2.weight", "inner.linear2.bias"}));
  std::vector<Param> prefixed;
  c.parameters(prefixed, "m.");
  EXPECT_EQ(prefixed.front().name, "m.proj.weight");
  c.eval();
  for (Layer* l : std::initializer_list<Layer*>{&c, &c.proj, &c.inner, &c.inner.dropout, &c.probe})
    EXPECT_FALSE(l->training());
  c.train();
  for (Layer* l : std::initializer_list<Layer*>{&c, &c.proj, &c.inner, &c.inner.dropout, &c.probe})
    EXPECT_TRUE(l->training());
  c.reseed(64);
  EXPECT_EQ(c.probe.seed, 64u ^ 3u);
  Dropout expected(0.5, 0);  // the nested dropout draws as one reseeded with 64 ^ 8 (FeedForward's stream 0)
  expected.reseed(64 ^ 8);
  Rng rng(5);
  Tensor x = init::randn({6, 3}, rng);
  Tensor a = expected.forward(x.view()), b = c.inner.dropout.forward(x.view());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data()[i], b.data()[i]) << "element " << i;
  c.set_batch_offset(7);
  EXPECT_EQ(c.probe.batch_offset, 7);
}
