// SDPA backward: the reference backward against central finite differences in fp64 on tiny shapes, and
// the flash backward (fp32) against the fp64 reference backward with the derived tolerance, over every
// mask kind, both causal alignments, GQA ratios 1, 2, 4, dropout and odd sizes; zero gradients of fully
// masked rows; flash bitwise the same for 1 and 2 threads and with its query side in phases; forced small and
// large tiles and every SIMD target against the oracle; the flash backward drops exactly the forward's
// elements (DropRow shared); the argument checks of sdpa_backward.
// Not a benchmark.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include <hwy/targets.h>

#include "attn/rng.h"
#include "attn/sdpa.h"
#include "attn/threads.h"

using namespace attn;

namespace {

enum class MaskCase { none, keep, drop, additive, padding };

const char* name(MaskCase m) {
  const char* names[] = {"none", "keep", "drop", "additive", "padding"};
  return names[static_cast<int>(m)];
}
const char* name(Causal c) { return c == Causal::none ? "none" : c == Causal::top_left ? "tl" : "br"; }

struct Config {
  int64_t B, H, Hkv, L, S, D, Dv;
  MaskCase mask = MaskCase::none;
  Causal causal = Causal::none;
  double dropout = 0;
};

// Random inputs, masks and dout of one config. The values are floats widened to T, so a float and a double
// Inputs of the same seed hold the same numbers and only the arithmetic differs.
template <typename T>
struct Inputs {
  TensorT<T> q, k, v;  // (B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv)
  TensorT<T> dout;     // (B, H, L, Dv)
  TensorT<T> bias;     // (B, H, L, S) additive mask
  TensorT<uint8_t> bools;
  SdpaArgs<T> args;

  Inputs(const Config& c, uint64_t seed)
      : q({c.B, c.H, c.L, c.D}), k({c.B, c.Hkv, c.S, c.D}), v({c.B, c.Hkv, c.S, c.Dv}),
        dout({c.B, c.H, c.L, c.Dv}) {
    Rng rng(seed);
    for (TensorT<T>* t : {&q, &k, &v, &dout})
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = T(float(rng.normal()));
    args.q = q, args.k = k, args.v = v;
    args.causal = c.causal;
    args.dropout_p = c.dropout;
    args.seed = 1234;
    const float inf = std::numeric_limits<float>::infinity();
    switch (c.mask) {
      case MaskCase::none: break;
      case MaskCase::keep:  // (L, S), broadcast over B and H; the last row keeps nothing
        bools = TensorT<uint8_t>({c.L, c.S});
        for (int64_t l = 0; l < c.L; ++l)
          for (int64_t s = 0; s < c.S; ++s) bools.data()[l * c.S + s] = l < c.L - 1 && rng.uniform() < 0.7;
        args.attn_mask = Mask<T>::keep(bools.view());
        break;
      case MaskCase::drop:  // (B, 1, L, S), broadcast over H
        bools = TensorT<uint8_t>({c.B, 1, c.L, c.S});
        for (int64_t i = 0; i < bools.numel(); ++i) bools.data()[i] = rng.uniform() < 0.3;
        args.attn_mask = Mask<T>::drop(bools.view());
        break;
      case MaskCase::additive:  // (B, H, L, S): finite values and a few -inf
        bias = TensorT<T>({c.B, c.H, c.L, c.S});
        for (int64_t i = 0; i < bias.numel(); ++i) bias.data()[i] = T(rng.uniform() < 0.2 ? -inf : float(rng.normal()));
        args.attn_mask = Mask<T>::additive(bias.view());
        break;
      case MaskCase::padding:  // key_padding (B, S), true = masked out
        bools = TensorT<uint8_t>({c.B, c.S});
        for (int64_t i = 0; i < bools.numel(); ++i) bools.data()[i] = rng.uniform() < 0.3;
        args.key_padding = Mask<T>::drop(bools.view());
        break;
    }
  }
};

template <typename T>
struct Grads {
  TensorT<T> dq, dk, dv;  // (B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv)
  explicit Grads(const Config& c) : dq({c.B, c.H, c.L, c.D}), dk({c.B, c.Hkv, c.S, c.D}), dv({c.B, c.Hkv, c.S, c.Dv}) {}
  SdpaGrads<T> views() { return {dq.view(), dk.view(), dv.view()}; }
};

template <typename T>
Grads<T> reference_grads(const Config& c, const Inputs<T>& in) {
  Grads<T> g(c);
  TensorT<T> out({c.B, c.H, c.L, c.Dv});  // (B, H, L, Dv), unread by the reference backward
  reference_backward(make_problem(in.args, SdpaOut<T>{out.view(), {}, {}}), in.dout.view(), g.views());
  return g;
}

// The functional whose gradient we check: f(q, k, v) = sum(dout ∘ sdpa(q, k, v)), so df/dout-side = dout.
double functional(const Config& c, const Inputs<double>& in) {
  TensorD out({c.B, c.H, c.L, c.Dv});  // (B, H, L, Dv)
  reference_forward(make_problem(in.args, SdpaOut<double>{out.view(), {}, {}}));
  double f = 0;
  for (int64_t i = 0; i < out.numel(); ++i) f += in.dout.data()[i] * out.data()[i];
  return f;
}

using FdParam = std::tuple<MaskCase, Causal, int /* H / Hkv */, double /* dropout */, bool /* L > S */>;

class ReferenceBackwardFd : public testing::TestWithParam<FdParam> {};

TEST_P(ReferenceBackwardFd, MatchesCentralDifferences) {
  auto [mask, causal, ratio, dropout, tall] = GetParam();
  set_num_threads(1);  // thousands of tiny forwards: threads would cost more than they bring
  Config c{2, 4, 4 / ratio, tall ? 7 : 5, tall ? 5 : 7, 3, 4, mask, causal, dropout};
  Inputs<double> in(c, 7);
  Grads<double> g = reference_grads(c, in);
  // Central differences: error <= h²/6·|f'''| + ε·Σ|terms of f|/h. Inputs and dout are N(0, 1), so
  // |f'''| per element is O(10) and Σ|terms| is O(100): with h = 1e-5 that is ~2e-10 + ~2e-9. The
  // tolerance 1e-7·(1 + |g|) leaves a margin of ~50 without letting a wrong term (O(1e-2) or more) pass.
  const double h = 1e-5, tol = 1e-7;
  double worst = 0;
  auto check = [&](TensorD& x, const TensorD& grad, const char* what) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double x0 = x.data()[i];
      x.data()[i] = x0 + h;
      const double fp = functional(c, in);
      x.data()[i] = x0 - h;
      const double fm = functional(c, in);
      x.data()[i] = x0;
      const double fd = (fp - fm) / (2 * h), got = grad.data()[i];
      worst = std::max(worst, std::abs(fd - got) / (1 + std::abs(got)));
      ASSERT_NEAR(got, fd, tol * (1 + std::abs(got))) << what << " element " << i;
    }
  };
  check(in.q, g.dq, "dq");
  check(in.k, g.dk, "dk");
  check(in.v, g.dv, "dv");
  RecordProperty("worst_relative_error", cat(worst));
}

std::string fd_name(const testing::TestParamInfo<FdParam>& info) {
  auto [mask, causal, ratio, dropout, tall] = info.param;
  return cat(name(mask), "_causal_", name(causal), "_gqa", ratio, dropout > 0 ? "_dropout" : "", tall ? "_L7S5" : "_L5S7");
}

INSTANTIATE_TEST_SUITE_P(Sweep, ReferenceBackwardFd,
                         testing::Combine(testing::Values(MaskCase::none, MaskCase::keep, MaskCase::drop,
                                                          MaskCase::additive, MaskCase::padding),
                                          testing::Values(Causal::none, Causal::top_left, Causal::bottom_right),
                                          testing::Values(1, 2, 4), testing::Values(0.0, 0.3), testing::Bool()),
                         fd_name);

// A row that attends to nothing has output 0 whatever q, k, v are: its dq is 0 and its dout feeds
// nothing, so changing that dout leaves dk and dv as they were.
TEST(ReferenceBackward, FullyMaskedRowsGiveZeroGradient) {
  // keep mask: the last row keeps nothing; bottom-right causal with L > S: rows 0 and 1 see no key
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    Config c{1, 2, 1, 7, 5, 3, 4, MaskCase::keep, causal, 0.3};
    Inputs<double> in(c, 11);
    Grads<double> g = reference_grads(c, in);
    std::vector<int64_t> masked_rows = {c.L - 1};
    if (causal == Causal::bottom_right) masked_rows.insert(masked_rows.end(), {0, 1});
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l : masked_rows) {
        for (int64_t d = 0; d < c.D; ++d) EXPECT_EQ(g.dq.view().at({0, h, l, d}), 0.0);
        for (int64_t e = 0; e < c.Dv; ++e) in.dout.view().at({0, h, l, e}) = 1e3;
      }
    Grads<double> g2 = reference_grads(c, in);
    for (int64_t i = 0; i < g.dk.numel(); ++i) EXPECT_EQ(g.dk.data()[i], g2.dk.data()[i]);
    for (int64_t i = 0; i < g.dv.numel(); ++i) EXPECT_EQ(g.dv.data()[i], g2.dv.data()[i]);
  }
}

// Strided gradients: dq written into a (B, L, H, D) buffer viewed as (B, H, L, D), as MHA does.
TEST(ReferenceBackward, WritesStridedGradients) {
  Config c{2, 4, 2, 5, 6, 3, 4, MaskCase::padding, Causal::top_left, 0.0};
  Inputs<double> in(c, 3);
  Grads<double> want = reference_grads(c, in);
  TensorD dq_blhd({c.B, c.L, c.H, c.D}), dk({c.B, c.Hkv, c.S, c.D}), dv({c.B, c.Hkv, c.S, c.Dv});
  for (int64_t i = 0; i < dk.numel(); ++i) dk.data()[i] = 99;  // the backward overwrites, never adds
  TensorD out({c.B, c.H, c.L, c.Dv});
  reference_backward<double>(make_problem(in.args, SdpaOut<double>{out.view(), {}, {}}), in.dout.view(),
                     SdpaGrads<double>{dq_blhd.view().transpose(1, 2), dk.view(), dv.view()});
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l)
        for (int64_t d = 0; d < c.D; ++d) EXPECT_EQ(dq_blhd.view().at({b, l, h, d}), want.dq.view().at({b, h, l, d}));
  for (int64_t i = 0; i < dk.numel(); ++i) EXPECT_EQ(dk.data()[i], want.dk.data()[i]);
}

// ---- flash backward ----

// The forward's out (B, H, L, Dv) and lse (B, H, L) in fp32, as a caller of sdpa_backward has them.
struct Forward {
  Tensor out, lse;
  Forward(const Config& c, const Inputs<float>& in) : out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L}) {
    sdpa(in.args, SdpaOut<float>{out.view(), {}, lse.view()});
  }
};

Grads<float> flash_grads(const Config& c, const Inputs<float>& in, Forward& f) {
  Grads<float> g(c);
  flash_backward(make_problem(in.args, SdpaOut<float>{f.out.view(), {}, f.lse.view()}), in.dout.view(), g.views());
  return g;
}

double max_abs_diff(const float* a, const double* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

// FlashAttention's rule: the fp32 kernel's error against the fp64 reference is at most twice the error of
// the plain fp32 reference (same formula, fp32 arithmetic), plus a tiny atol: 1e-6 (~8 fp32 ulps) of the
// largest gradient of the problem. The atol covers gradients that are exact cancellations, where the
// reference can round to exactly 0 and flash, whose D = rowsum(dO∘O) comes from the forward's O instead
// of rowsum(P∘dP), cannot (S = 1: dK = 0 exactly).
void expect_flash_close(const Config& c, uint64_t seed) {
  Inputs<float> in32(c, seed);
  Inputs<double> in64(c, seed);
  Forward f(c, in32);
  Grads<float> flash = flash_grads(c, in32, f), ref32 = reference_grads(c, in32);
  Grads<double> ref64 = reference_grads(c, in64);
  double largest = 0;
  for (const TensorD* t : {&ref64.dq, &ref64.dk, &ref64.dv})
    for (int64_t i = 0; i < t->numel(); ++i) largest = std::max(largest, std::abs(t->data()[i]));
  const double atol = 1e-6 * (1 + largest);
  auto check = [&](const Tensor& got, const Tensor& plain, const TensorD& truth, const char* what) {
    const double err = max_abs_diff(got.data(), truth.data(), truth.numel());
    const double base = max_abs_diff(plain.data(), truth.data(), truth.numel());
    EXPECT_LE(err, 2 * base + atol) << what << ": flash error " << err << ", fp32 reference error " << base;
    EXPECT_TRUE(std::isfinite(err)) << what;
  };
  check(flash.dq, ref32.dq, ref64.dq, "dq");
  check(flash.dk, ref32.dk, ref64.dk, "dk");
  check(flash.dv, ref32.dv, ref64.dv, "dv");
}

using FlashParam = std::tuple<MaskCase, Causal, int /* H / Hkv */, double /* dropout */, bool /* L > S */>;
class FlashBackward : public testing::TestWithParam<FlashParam> {};

TEST_P(FlashBackward, MatchesFp64ReferenceWithinDerivedTolerance) {
  auto [mask, causal, ratio, dropout, tall] = GetParam();
  // 65 and 129: a full tile plus one row or key, so tails and several KV blocks (dQ chunks) are covered
  expect_flash_close({2, 4, 4 / ratio, tall ? 129 : 65, tall ? 65 : 129, 24, 20, mask, causal, dropout}, 17);
}

std::string flash_name(const testing::TestParamInfo<FlashParam>& info) { return fd_name(info); }

INSTANTIATE_TEST_SUITE_P(Sweep, FlashBackward,
                         testing::Combine(testing::Values(MaskCase::none, MaskCase::keep, MaskCase::drop,
                                                          MaskCase::additive, MaskCase::padding),
                                          testing::Values(Causal::none, Causal::top_left, Causal::bottom_right),
                                          testing::Values(1, 2, 4), testing::Values(0.0, 0.3), testing::Bool()),
                         flash_name);

// Odd sizes: L, S in 0, 1, 7, 63, 64, 65, 129, 513 and D, Dv in 8, 63, 64, 80, 128.
TEST(FlashBackward, OddSizes) {
  const Config configs[] = {
      {1, 2, 2, 1, 7, 8, 8},         {1, 2, 1, 7, 1, 8, 63},         {2, 4, 2, 63, 65, 64, 64},
      {1, 2, 2, 64, 64, 128, 128},   {1, 8, 2, 65, 129, 63, 80},     {1, 2, 1, 129, 7, 80, 8},
      {1, 1, 1, 513, 513, 64, 64, MaskCase::padding, Causal::top_left},
      {1, 2, 2, 1, 513, 128, 64, MaskCase::none, Causal::bottom_right},
      {1, 2, 1, 5, 0, 8, 8},  // no keys: every row fully masked, dq = 0
  };
  for (const Config& c : configs) {
    SCOPED_TRACE(cat("B ", c.B, " H ", c.H, " Hkv ", c.Hkv, " L ", c.L, " S ", c.S, " D ", c.D, " Dv ", c.Dv));
    expect_flash_close(c, 23);
  }
}

TEST(FlashBackward, FullyMaskedRowsGiveZeroGradient) {
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    Config c{1, 2, 1, 70, 66, 16, 16, MaskCase::keep, causal, 0.3};  // L > S: bottom-right rows 0..3 see nothing
    Inputs<float> in(c, 11);
    Forward f(c, in);
    Grads<float> g = flash_grads(c, in, f);
    std::vector<int64_t> masked_rows = {c.L - 1};
    if (causal == Causal::bottom_right)
      for (int64_t l = 0; l < c.L - c.S; ++l) masked_rows.push_back(l);
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l : masked_rows) {
        for (int64_t d = 0; d < c.D; ++d) EXPECT_EQ(g.dq.view().at({0, h, l, d}), 0.f);
        for (int64_t e = 0; e < c.Dv; ++e) in.dout.view().at({0, h, l, e}) = 1e3f;
      }
    Grads<float> g2 = flash_grads(c, in, f);
    for (int64_t i = 0; i < g.dk.numel(); ++i) EXPECT_EQ(g.dk.data()[i], g2.dk.data()[i]);
    for (int64_t i = 0; i < g.dv.numel(); ++i) EXPECT_EQ(g.dv.data()[i], g2.dv.data()[i]);
  }
}

// dQ, dK and dV of got bitwise those of want.
void expect_same_bits(const Grads<float>& got, const Grads<float>& want, const std::string& what) {
  EXPECT_EQ(std::memcmp(got.dq.data(), want.dq.data(), want.dq.numel() * sizeof(float)), 0) << what;
  EXPECT_EQ(std::memcmp(got.dk.data(), want.dk.data(), want.dk.numel() * sizeof(float)), 0) << what;
  EXPECT_EQ(std::memcmp(got.dv.data(), want.dv.data(), want.dv.numel() * sizeof(float)), 0) << what;
}

TEST(FlashBackward, SameBitsForOneTwoAndThreeThreads) {
  Config c{2, 4, 2, 300, 333, 40, 24, MaskCase::padding, Causal::bottom_right, 0.2};
  Inputs<float> in(c, 29);
  Forward f(c, in);
  set_num_threads(1);
  Grads<float> one = flash_grads(c, in, f);
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    Grads<float> two = flash_grads(c, in, f);
    expect_same_bits(two, one, cat(threads, " threads"));
  }
}

// Q and dO as (B, L, H, D) buffers viewed as (B, H, L, D), as MultiheadAttention passes them: read in
// place (D = 64) or packed (D = 24), the gradients are bitwise those of contiguous inputs.
TEST(FlashBackward, StridedInputsGiveTheSameBits) {
  for (int64_t D : {64, 24}) {
    Config c{2, 4, 2, 70, 90, D, D, MaskCase::none, Causal::top_left};
    Inputs<float> in(c, 31);
    Forward f(c, in);
    Grads<float> want = flash_grads(c, in, f);
    Tensor q_blhd({c.B, c.L, c.H, c.D}), dout_blhd({c.B, c.L, c.H, c.Dv});
    View<float> q = q_blhd.view().transpose(1, 2), dout = dout_blhd.view().transpose(1, 2);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t l = 0; l < c.L; ++l)
          for (int64_t d = 0; d < c.D; ++d) {
            q.at({b, h, l, d}) = in.q.view().at({b, h, l, d});
            dout.at({b, h, l, d}) = in.dout.view().at({b, h, l, d});
          }
    SdpaArgs<float> args = in.args;
    args.q = q;
    Grads<float> got(c);
    flash_backward(make_problem(args, SdpaOut<float>{f.out.view(), {}, f.lse.view()}), dout, got.views());
    EXPECT_EQ(std::memcmp(got.dq.data(), want.dq.data(), want.dq.numel() * sizeof(float)), 0) << "D " << D;
    EXPECT_EQ(std::memcmp(got.dk.data(), want.dk.data(), want.dk.numel() * sizeof(float)), 0) << "D " << D;
    EXPECT_EQ(std::memcmp(got.dv.data(), want.dv.data(), want.dv.numel() * sizeof(float)), 0) << "D " << D;
  }
}

// The dropout mask of the flash backward is the forward's on every element. With V = I (S = Dv) the
// forward's output row l is the dropped weight row itself, out[l, s] = P_dropped[l, s]; with dO = I
// (L = Dv) the backward's dV[s, e] = Σ_l P_dropped[l, s]·dO[l, e] = P_dropped[e, s]. So out[l, s] == 0
// exactly where dV[s, l] == 0, and both where the reference drops (its weights output). P > 0 on every
// kept element (unit-normal scores over 37 keys never underflow), so a single element dropped by one
// pass and not the other fails. Several (b, h) pairs test the index, not just one row.
TEST(FlashBackward, DropsExactlyTheForwardsElements) {
  const int64_t B = 2, H = 2, n = 37;  // L = S = Dv = n
  for (double p : {0.1, 0.5, 0.9}) {
    Config c{B, H, H, n, n, 16, n, MaskCase::none, Causal::none, p};
    Inputs<float> in(c, 41);
    Tensor eye_v({B, H, n, n}), eye_do({B, H, n, n});  // V (B, Hkv, S, Dv) = I, dO (B, H, L, Dv) = I
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t i = 0; i < n; ++i) eye_v.data()[(bh * n + i) * n + i] = eye_do.data()[(bh * n + i) * n + i] = 1.f;
    SdpaArgs<float> args = in.args;
    args.v = eye_v.view();
    Tensor out({B, H, n, n}), lse({B, H, n}), weights({B, H, n, n}), ref_out({B, H, n, n});
    flash_forward(make_problem(args, SdpaOut<float>{out.view(), {}, lse.view()}));
    reference_forward(make_problem(args, SdpaOut<float>{ref_out.view(), weights.view(), {}}));
    Grads<float> g(c);
    flash_backward(make_problem(args, SdpaOut<float>{out.view(), {}, lse.view()}), eye_do.view(), g.views());
    int64_t dropped = 0;
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t l = 0; l < n; ++l)
        for (int64_t s = 0; s < n; ++s) {
          const float fwd = out.data()[(bh * n + l) * n + s], bwd = g.dv.data()[(bh * n + s) * n + l];
          const float ref = weights.data()[(bh * n + l) * n + s];
          ASSERT_EQ(fwd == 0.f, bwd == 0.f) << "p " << p << " (b, h) " << bh << " l " << l << " s " << s;
          ASSERT_EQ(fwd == 0.f, ref == 0.f) << "p " << p << " (b, h) " << bh << " l " << l << " s " << s;
          dropped += fwd == 0.f;
        }
    // about p of the elements: the test would pass vacuously with no dropout at all
    EXPECT_NEAR(double(dropped) / double(B * H * n * n), p, 0.05) << "p " << p;
  }
}

// Tile sizes forced (set_flash_backward_tiles): small tiles (5 keys per block, 7 queries rounded up to the
// lanes), so every problem below spans many KV blocks, chunks and query tiles and the causal edge crosses
// most tiles, and large ones (256 keys, 512 queries), so each is one tile padded to the lanes: both within
// the derived tolerance of the fp64 oracle. The derived sizes are restored after.
TEST(FlashBackward, SmallAndLargeTilesMatchTheOracle) {
  const Config configs[] = {
      {2, 4, 2, 129, 65, 24, 20, MaskCase::keep, Causal::top_left, 0.3},
      {1, 4, 4, 64, 64, 32, 32, MaskCase::none, Causal::top_left},  // the nanoGPT CPU training shape
      {2, 8, 2, 65, 129, 63, 80, MaskCase::padding, Causal::bottom_right},
      {1, 2, 1, 300, 200, 16, 16, MaskCase::additive, Causal::none, 0.1},
  };
  for (const FlashTiles t : {FlashTiles{5, 7}, FlashTiles{256, 512}}) {
    set_flash_backward_tiles(t);
    ASSERT_EQ(flash_backward_tiles(129, 65).keys, t.keys);
    ASSERT_EQ(flash_backward_tiles(129, 65).rows, t.rows);
    for (const Config& c : configs) {
      SCOPED_TRACE(cat("keys ", t.keys, " rows ", t.rows, ": B ", c.B, " H ", c.H, " Hkv ", c.Hkv, " L ", c.L, " S ", c.S));
      expect_flash_close(c, 43);
    }
  }
  set_flash_backward_tiles({});
  EXPECT_EQ(flash_backward_tiles(129, 65).keys, 65);  // derived again: all of a short S in one block
}

// The query side in phases (the scratch budget forced down to one float, so each phase holds one 16-row
// segment of one query head and dK/dV wait in the caller's buffers between phases) gives bitwise the
// gradients of one phase, for 1 and 2 threads: the phases go head by head within a GQA group, then segment
// by segment, so every sum keeps its order. Several chunks (B·Hkv < 16), dropout, a mask, the causal edge.
TEST(FlashBackward, PhasesOfBoundedScratchGiveTheSameBits) {
  Config c{2, 4, 2, 100, 133, 40, 24, MaskCase::padding, Causal::bottom_right, 0.2};
  Inputs<float> in(c, 47);
  Forward f(c, in);
  Grads<float> want = flash_grads(c, in, f);
  set_flash_backward_tiles({0, 16, 1});
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    expect_same_bits(flash_grads(c, in, f), want, cat(threads, " threads"));
  }
  set_flash_backward_tiles({});
  set_num_threads(0);
}

// Every SIMD target compiled in (AVX-512 transposes its panels in registers, the others copy them; lanes
// 16, 8, 4 or 1 set the tile padding): within the derived tolerance on a causal GQA case with dropout,
// packed Q rows (D = 24) and tiles the causal edge crosses, and on the training shape.
TEST(FlashBackward, EverySimdTargetCompiledIn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    expect_flash_close({2, 4, 2, 129, 65, 24, 20, MaskCase::keep, Causal::top_left, 0.3}, 53);
    expect_flash_close({1, 4, 4, 64, 64, 32, 32, MaskCase::none, Causal::top_left}, 53);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// sdpa_backward: every argument's shape is checked, and the error names the argument and both shapes.
TEST(SdpaBackward, ShapeErrorsNameBothShapes) {
  Config c{1, 4, 2, 5, 6, 3, 4};
  Inputs<float> in(c, 5);
  Tensor out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L});
  sdpa(in.args, SdpaOut<float>{out.view(), {}, lse.view()});
  Grads<float> g(c);
  sdpa_backward<float>(in.args, out, lse, in.dout, g.views());  // well-formed: no throw

  Tensor wrong_dout({c.B, c.H, c.L, c.D}), wrong_dk({c.B, c.H, c.S, c.D}), wrong_lse({c.B, c.H, c.S});
  auto expect_error = [](auto&& call, const std::string& arg, const std::string& want, const std::string& got) {
    try {
      call();
      ADD_FAILURE() << "no error for " << arg;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(arg), std::string::npos) << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
      EXPECT_NE(msg.find(got), std::string::npos) << msg;
    }
  };
  expect_error([&] { sdpa_backward<float>(in.args, out, lse, wrong_dout, g.views()); }, "dout", "(1, 4, 5, 4)",
               "(1, 4, 5, 3)");
  expect_error([&] { sdpa_backward<float>(in.args, out, lse, in.dout, {g.dq, wrong_dk, g.dv}); }, "dk",
               "(1, 2, 6, 3)", "(1, 4, 6, 3)");
  expect_error([&] { sdpa_backward<float>(in.args, out, wrong_lse, in.dout, g.views()); }, "lse", "(1, 4, 5)",
               "(1, 4, 6)");
  expect_error([&] { sdpa_backward<float>(in.args, wrong_dout, lse, in.dout, g.views()); }, "out", "(1, 4, 5, 4)",
               "(1, 4, 5, 3)");
  expect_error([&] { sdpa_backward<float>(in.args, out, {}, in.dout, g.views()); }, "lse", "(B, H, L)", "nothing");
}

// sdpa_backward runs what sdpa would: flash for float32, the reference for fp64 or on request; strict
// refuses the fp64 fallback and explicit flash refuses fp64.
TEST(SdpaBackward, ChoosesTheBackendAsTheForward) {
  Config c{1, 4, 2, 33, 40, 16, 8, MaskCase::drop, Causal::top_left, 0.1};
  Inputs<float> in(c, 8);
  Forward f(c, in);
  Grads<float> flash = flash_grads(c, in, f), ref = reference_grads(c, in), autom(c), requested(c);
  sdpa_backward<float>(in.args, f.out, f.lse, in.dout, autom.views());
  sdpa_backward<float>(in.args, f.out, f.lse, in.dout, requested.views(), {Backend::reference});
  EXPECT_EQ(std::memcmp(autom.dq.data(), flash.dq.data(), flash.dq.numel() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(requested.dk.data(), ref.dk.data(), ref.dk.numel() * sizeof(float)), 0);

  Inputs<double> in64(c, 8);
  TensorD out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L});
  sdpa(in64.args, SdpaOut<double>{out.view(), {}, lse.view()});
  Grads<double> g(c);
  sdpa_backward<double>(in64.args, out, lse, in64.dout, g.views());  // automatic: the reference
  EXPECT_THROW(sdpa_backward<double>(in64.args, out, lse, in64.dout, g.views(), {Backend::automatic, true}), Error);
  EXPECT_THROW(sdpa_backward<double>(in64.args, out, lse, in64.dout, g.views(), {Backend::flash}), Error);
}

}  // namespace
