// The reference SDPA (the oracle every fast kernel is tested against), itself tested against a second,
// independent fp64 oracle written here: full (B, H, L, S) scores, masks expanded to full shape, K/V
// heads repeated, plain softmax. It is not a test of sdpa()'s backend choice or of the flash kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "sdpa_harness.h"
#include "test_util.h"

using namespace attn;
using namespace attn::test;

namespace {

// ---- The independent oracle ----

// Expands a mask to a full (B, H, L, S) additive array by right-aligned broadcasting of its own shape.
std::vector<double> expand(const Case& c, const std::vector<double>& x, bool key_padding) {
  std::vector<double> full(c.B * c.H * c.L * c.S, 0.0);  // (B, H, L, S)
  const MaskKind kind = key_padding ? c.padding.kind : c.mask.kind;
  const Shape shape = key_padding ? c.padding_shape() : c.mask_shape();
  if (kind == MaskKind::none) return full;
  const int64_t target[4] = {c.B, c.H, c.L, c.S};
  // which target dim each mask dim stands for
  std::vector<int> dims;
  if (key_padding) dims = {0, 3};
  else for (int i = 4 - static_cast<int>(shape.size()); i < 4; ++i) dims.push_back(i);
  int64_t n = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l)
        for (int64_t s = 0; s < c.S; ++s, ++n) {
          const int64_t idx[4] = {b, h, l, s};
          int64_t flat = 0;
          for (size_t i = 0; i < dims.size(); ++i) {
            EXPECT_TRUE(shape[i] == 1 || shape[i] == target[dims[i]]);
            flat = flat * shape[i] + (shape[i] == 1 ? 0 : idx[dims[i]]);
          }
          const double e = x[flat];
          if (kind == MaskKind::additive) full[n] = e;
          else if ((kind == MaskKind::keep && e == 0) || (kind == MaskKind::drop && e != 0)) full[n] = -kInf;
        }
  return full;
}

// Whether query l may see key s: counted from the start (top_left) or from the end (bottom_right).
bool visible(Causal causal, int64_t l, int64_t s, int64_t L, int64_t S) {
  if (causal == Causal::top_left) return s <= l;
  if (causal == Causal::bottom_right) return S - 1 - s >= L - 1 - l;
  return true;
}

struct Oracle {
  std::vector<double> out, weights, lse;  // (B, H, L, Dv), (B, H, L, S), (B, H, L)
  double dot_abs = 0, x_abs = 0, v_abs = 0;  // max of scale·Σ|q·k|, of |finite score|, of |v|: for the float bound
};

Oracle oracle(const Inputs& in) {
  const Case& c = in.c;
  const int64_t B = c.B, H = c.H, L = c.L, S = c.S, D = c.D, Dv = c.Dv, group = c.H / c.Hkv;
  // GQA as MHA: repeat each K/V head `group` times (query heads kv*group .. kv*group+group-1 read head kv)
  std::vector<double> k(B * H * S * D), v(B * H * S * Dv);  // (B, H, S, D), (B, H, S, Dv)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kv = 0; kv < c.Hkv; ++kv)
      for (int64_t j = 0; j < group; ++j) {
        const int64_t h = kv * group + j;
        for (int64_t i = 0; i < S * D; ++i) k[(b * H + h) * S * D + i] = in.k.data()[(b * c.Hkv + kv) * S * D + i];
        for (int64_t i = 0; i < S * Dv; ++i) v[(b * H + h) * S * Dv + i] = in.v.data()[(b * c.Hkv + kv) * S * Dv + i];
      }
  const double scale = c.scale ? *c.scale : 1 / std::sqrt(static_cast<double>(D));
  const std::vector<double> mask = expand(c, in.mask, false);
  const std::vector<double> padding = expand(c, in.padding, true);

  Oracle o;
  for (double x : v) o.v_abs = std::max(o.v_abs, std::abs(x));
  std::vector<double> x(B * H * L * S);  // (B, H, L, S) scores
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t s = 0; s < S; ++s) {
          const double* qr = in.q.data() + ((b * H + h) * L + l) * D;
          const double* kr = k.data() + ((b * H + h) * S + s) * D;
          double dot = 0, dot_abs = 0;
          for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d], dot_abs += std::abs(qr[d] * kr[d]);
          const int64_t n = ((b * H + h) * L + l) * S + s;
          x[n] = visible(c.causal, l, s, L, S) ? dot * scale + mask[n] + padding[n] : -kInf;
          o.dot_abs = std::max(o.dot_abs, dot_abs * std::abs(scale));
          if (std::isfinite(x[n])) o.x_abs = std::max(o.x_abs, std::abs(x[n]));
        }
  // plain softmax per row; a row with no finite score is the zero row (weights 0, out 0, LSE -inf)
  o.weights.assign(B * H * L * S, 0.0);
  o.lse.assign(B * H * L, -kInf);
  o.out.assign(B * H * L * Dv, 0.0);
  const uint32_t threshold = dropout_threshold(c.dropout_p);
  for (int64_t r = 0; r < B * H * L; ++r) {
    double m = -kInf;
    for (int64_t s = 0; s < S; ++s) m = std::max(m, x[r * S + s]);
    if (m == -kInf) continue;
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += std::exp(x[r * S + s] - m);
    o.lse[r] = m + std::log(sum);
    for (int64_t s = 0; s < S; ++s) {
      double w = std::exp(x[r * S + s] - m) / sum;
      if (c.dropout_p > 0) w = dropout_keep(c.dropout_seed, r * S + s, threshold) ? w / (1 - c.dropout_p) : 0.0;
      o.weights[r * S + s] = w;
      for (int64_t e = 0; e < Dv; ++e) o.out[r * Dv + e] += w * v[(r / L * S + s) * Dv + e];
    }
  }
  return o;
}

// ---- Running the kernel under test ----

// The reference kernel in T on the case's inputs: out, weights and lse.
template <typename T>
Forward run(const Inputs& in) {
  return forward<T>(reference_forward<T>, in, true);
}

// Largest |got - want| (-inf == -inf counts as 0; NaN as infinite), and where.
void expect_near(const char* what, const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double err = g == w ? 0.0 : std::isnan(g - w) ? kInf : std::abs(g - w);
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, tol) << what << ": worst at flat index " << at << ": got " << got[at] << ", want "
                        << want[at];
}

// Float against the fp64 oracle: a first-order worst-case bound of the float kernel's rounding, u = 2^-24.
// Score: the dot product of D terms accumulates γ_D ≈ D·u of scale·Σ|q·k|, one more u for the multiply
// by scale, and u·|x| each for adding the mask and subtracting the row max (|x - m| <= 2·max|x|):
//   δx = u·((D + 1)·scale·Σ|q·k| + 3·max|x|).
// Weights: exp(x - m) carries 2δx + u, the sum of S terms adds S·u, the division u: rel. error 4δx + (S + 2)·u.
// Out = Σ w·v adds another γ_S of max|v|. LSE = m + log(sum): δx + (S + 1)·u + u·|LSE|.
// Each bound is doubled to cover the second-order terms; dropout's scale 1/(1-p) multiplies weights and out.
struct Tolerance {
  double out, weights, lse;
};

template <typename T>
Tolerance tolerance(const Case& c, const Oracle& o) {
  if (std::is_same_v<T, double>) return {1e-12, 1e-12, 1e-12};  // the same bound with u = 2^-53 is < 1e-13 here
  const double u = std::ldexp(1.0, -24), S = static_cast<double>(c.S);
  const double dx = u * ((c.D + 1) * o.dot_abs + 3 * o.x_abs);
  const double rel_w = (4 * dx + (S + 2) * u) / (1 - std::min(c.dropout_p, 0.5));
  double lse_abs = 0;
  for (double x : o.lse) if (std::isfinite(x)) lse_abs = std::max(lse_abs, std::abs(x));
  return {2 * o.v_abs * (rel_w + S * u), 2 * rel_w, 2 * (dx + (S + 1) * u + u * lse_abs)};
}

template <typename T>
void check_against_oracle(const Inputs& in) {
  const Case& c = in.c;
  SCOPED_TRACE(cat(std::is_same_v<T, float> ? "float " : "double ", c.name()));
  const Oracle o = oracle(in);
  const Forward r = run<T>(in);
  const Tolerance tol = tolerance<T>(c, o);
  expect_near("out", r.out, o.out, tol.out);
  expect_near("weights", r.weights, o.weights, tol.weights);
  expect_near("lse", r.lse, o.lse, tol.lse);
}

template <typename T>
void check_against_oracle(const Case& c) { check_against_oracle<T>(Inputs(c)); }

// Every mask kind and broadcast shape, alone and combined with each other and with causal.
std::vector<Case> mask_cases(int64_t B, int64_t H, int64_t L, int64_t S) {
  const Causal none = Causal::none, tl = Causal::top_left, br = Causal::bottom_right;
  struct Row { MaskSpec mask, padding; Causal causal; };
  const std::vector<Row> rows = {
      {{}, {}, none},
      {keep({L, S}), {}, none},
      {drop({1, L, S}), {}, none},
      {additive({B, 1, L, S}), {}, none},
      {keep({H, L, S}), {}, none},
      {additive({B, H, L, S}), {}, none},
      {drop({B, H, L, S}), {}, none},
      {additive({1, S}), {}, none},  // broadcast over L too
      {{}, drop({B, S}), none},
      {{}, keep({B, S}), none},
      {{}, additive({B, S}), none},
      {{}, {}, tl},
      {{}, {}, br},
      {keep({L, S}), drop({B, S}), tl},
      {additive({H, L, S}), keep({B, S}), br},
      {drop({B, 1, L, S}), additive({B, S}), tl},
      {additive({L, S}), {}, br},
      {keep({B, H, L, S}), additive({B, S}), br},
  };
  std::vector<Case> cases;
  for (const Row& r : rows) {
    Case c;
    c.B = B, c.H = H, c.L = L, c.S = S, c.mask = r.mask, c.padding = r.padding, c.causal = r.causal;
    cases.push_back(c);
  }
  return cases;
}

// Odd sizes (a sweep, not the full cross product): (L, S) pairs with L < S, L = S, L > S, and D, Dv, Hkv
// rotating through their lists so each size meets several head dims, GQA ratios and mask kinds.
template <typename T>
void sweep() {
  const std::vector<std::pair<int64_t, int64_t>> ls = {{1, 1}, {1, 129}, {7, 63}, {63, 7},  {64, 64},
                                                       {65, 129}, {129, 65}, {129, 1}, {7, 7}};
  const int64_t Ds[] = {8, 63, 64, 80}, Dvs[] = {8, 17, 64, 63}, Hkvs[] = {4, 2, 1};
  int n = 0;
  for (auto [L, S] : ls)
    for (Case c : mask_cases(2, 4, L, S)) {
      c.D = Ds[n % 4], c.Dv = Dvs[(n / 4 + n) % 4], c.Hkv = Hkvs[n % 3];
      if (n % 5 == 0) c.scale = 0.3;  // a custom scale now and then
      c.seed = ++n;
      check_against_oracle<T>(c);
    }
}

TEST(Reference, MatchesOracleInDouble) { sweep<double>(); }
TEST(Reference, MatchesOracleInFloat) { sweep<float>(); }

// Flat positions of (b, h, l) in (B, H, L) and of (b, h, l, j) in (B, H, L, n).
size_t row(const Case& c, int64_t b, int64_t h, int64_t l) { return static_cast<size_t>((b * c.H + h) * c.L + l); }
size_t at(const Case& c, int64_t b, int64_t h, int64_t l, int64_t j, int64_t n) { return row(c, b, h, l) * n + j; }

TEST(Reference, CausalAlignments) {
  for (Causal causal : {Causal::top_left, Causal::bottom_right})
    for (auto [L, S] : std::vector<std::pair<int64_t, int64_t>>{{5, 9}, {9, 9}, {9, 5}, {1, 7}, {7, 1}}) {
      Case c;
      c.B = 2, c.H = 2, c.L = L, c.S = S, c.D = 8, c.Dv = 5, c.causal = causal;
      check_against_oracle<double>(c);
      check_against_oracle<float>(c);
      // rows that see no key: none under top_left (row l sees key 0); the first L - S under bottom_right
      c.seed = 7;
      const Forward r = run<double>(Inputs(c));
      int64_t blind = 0;
      for (int64_t l = 0; l < L; ++l) {
        const bool sees_none = causal == Causal::bottom_right && l < L - S;
        blind += sees_none;
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < c.H; ++h) {
            EXPECT_EQ(r.lse[row(c, b, h, l)] == -kInf, sees_none) << "row " << l << " " << c.name();
            for (int64_t e = 0; e < c.Dv && sees_none; ++e) EXPECT_EQ(r.out[at(c, b, h, l, e, c.Dv)], 0.0);
            for (int64_t s = 0; s < S && sees_none; ++s) EXPECT_EQ(r.weights[at(c, b, h, l, s, S)], 0.0);
          }
      }
      EXPECT_EQ(blind, causal == Causal::bottom_right ? std::max<int64_t>(L - S, 0) : 0);
    }
}

// GQA: Hkv heads read by groups of H/Hkv query heads give exactly what MHA gives with K/V heads repeated.
TEST(Reference, GqaEqualsMhaWithRepeatedHeads) {
  for (int64_t ratio : {1, 2, 4, 8}) {
    Case c;
    c.B = 2, c.H = 8, c.Hkv = 8 / ratio, c.L = 7, c.S = 65, c.D = 63, c.Dv = 17, c.causal = Causal::bottom_right;
    c.mask = additive({c.H, c.L, c.S}), c.seed = 3;
    SCOPED_TRACE(c.name());
    const Inputs in(c);
    Inputs rep = in.clone();
    rep.c.Hkv = c.H;
    rep.k = TensorD({c.B, c.H, c.S, c.D}), rep.v = TensorD({c.B, c.H, c.S, c.Dv});
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t s = 0; s < c.S; ++s) {
          for (int64_t d = 0; d < c.D; ++d) rep.k.view().at({b, h, s, d}) = in.k.view().at({b, h / ratio, s, d});
          for (int64_t e = 0; e < c.Dv; ++e) rep.v.view().at({b, h, s, e}) = in.v.view().at({b, h / ratio, s, e});
        }
    const Forward g = run<double>(in), m = run<double>(rep);
    for (size_t i = 0; i < g.out.size(); ++i) ASSERT_EQ(g.out[i], m.out[i]) << i;
    for (size_t i = 0; i < g.weights.size(); ++i) ASSERT_EQ(g.weights[i], m.weights[i]) << i;
    check_against_oracle<double>(in);
  }
}

// A row that sees no key, through each mask kind and through causal: out 0, weights 0, LSE -inf; the other
// rows are untouched.
TEST(Reference, FullyMaskedRowIsZero) {
  Case base;
  base.B = 2, base.H = 2, base.L = 4, base.S = 6, base.D = 8, base.Dv = 3, base.seed = 4;
  std::vector<std::pair<std::string, std::function<void(Inputs&)>>> ways = {
      {"keep mask all false", [](Inputs& in) { const Case& c = in.c; in.mask.assign(c.L * c.S, 1);
         for (int64_t s = 0; s < c.S; ++s) in.mask[1 * c.S + s] = 0; }},
      {"drop mask all true", [](Inputs& in) { const Case& c = in.c; in.mask.assign(c.L * c.S, 0);
         for (int64_t s = 0; s < c.S; ++s) in.mask[1 * c.S + s] = 1; }},
      {"additive all -inf", [](Inputs& in) { const Case& c = in.c; in.mask.assign(c.L * c.S, 0.5);
         for (int64_t s = 0; s < c.S; ++s) in.mask[1 * c.S + s] = -kInf; }},
      {"mask and padding together", [](Inputs& in) {  // row 1 keeps keys 0-2, padding drops them
         const Case& c = in.c;
         in.mask.assign(c.L * c.S, 1);
         for (int64_t s = 3; s < c.S; ++s) in.mask[1 * c.S + s] = 0;
         in.padding.assign(c.B * c.S, 0);
         for (int64_t b = 0; b < c.B; ++b) for (int64_t s = 0; s < 3; ++s) in.padding[b * c.S + s] = 1; }},
      {"bottom_right causal, L > S", [](Inputs&) {}},  // rows 0, 1 see nothing; row 1 is checked
  };
  const MaskSpec masks[] = {keep(), drop(), additive(), keep(), {}};
  for (size_t w = 0; w < ways.size(); ++w) {
    SCOPED_TRACE(ways[w].first);
    Case c = base;
    c.mask = masks[w];
    if (w == 3) c.padding = drop();
    if (w == 4) c.L = 8, c.causal = Causal::bottom_right, c.seed = 5;
    Inputs in(c);
    ways[w].second(in);
    const Forward r = run<double>(in), f = run<float>(in);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h) {
        EXPECT_EQ(r.lse[row(c, b, h, 1)], -kInf);
        EXPECT_EQ(f.lse[row(c, b, h, 1)], -kInf);
        EXPECT_TRUE(std::isfinite(r.lse[row(c, b, h, c.L - 1)]));
        for (int64_t e = 0; e < c.Dv; ++e) EXPECT_EQ(r.out[at(c, b, h, 1, e, c.Dv)], 0.0);
        for (int64_t e = 0; e < c.Dv; ++e) EXPECT_EQ(f.out[at(c, b, h, 1, e, c.Dv)], 0.0);
        for (int64_t s = 0; s < c.S; ++s) EXPECT_EQ(r.weights[at(c, b, h, 1, s, c.S)], 0.0);
      }
    const Oracle o = oracle(in);
    expect_near("out", r.out, o.out, 1e-12);
    expect_near("weights", r.weights, o.weights, 1e-12);
    expect_near("lse", r.lse, o.lse, 1e-12);
  }
}

// LSE is log Σ exp(score), summed here without the max shift (scores are small), and each row of weights
// sums to 1. Tolerance 1e-12: both are O(1) sums of S = 129 double terms.
TEST(Reference, LseAndWeightsSumToOne) {
  Case c;
  c.B = 2, c.H = 3, c.Hkv = 3, c.L = 9, c.S = 129, c.D = 64, c.Dv = 8, c.padding = additive(), c.seed = 9;
  const Inputs in(c);
  const Forward r = run<double>(in);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l) {
        double sum_exp = 0, sum_w = 0;
        for (int64_t s = 0; s < c.S; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) dot += in.q.view().at({b, h, l, d}) * in.k.view().at({b, h, s, d});
          sum_exp += std::exp(dot / std::sqrt(64.0) + in.padding[b * c.S + s]);
          sum_w += r.weights[at(c, b, h, l, s, c.S)];
        }
        EXPECT_NEAR(r.lse[row(c, b, h, l)], std::log(sum_exp), 1e-12);
        EXPECT_NEAR(sum_w, 1.0, 1e-12);
      }
}

// Strided inputs and outputs: Q/K/V read from (B, L, H, D) buffers as (B, H, L, D) views, out/weights/lse
// written through transposed views and through views of every other element. Same arithmetic, so
// bit-identical to the contiguous run, and nothing is written between the elements of a view.
template <typename T>
void check_strided() {
  Case c;
  c.B = 2, c.H = 4, c.Hkv = 2, c.L = 7, c.S = 65, c.D = 63, c.Dv = 17, c.causal = Causal::bottom_right;
  c.mask = keep(), c.padding = additive(), c.seed = 11;
  const Forward want = run<T>(Inputs(c));
  for (int layout : {1, 2}) {
    c.in_layout = c.out_layout = layout;
    SCOPED_TRACE(c.name());
    Inputs in(c);
    ASSERT_FALSE(in.bind<T>().args.q.is_contiguous());
    const Forward got = run<T>(in);
    EXPECT_TRUE(test::same_bits(got.out, want.out)) << "out";
    EXPECT_TRUE(test::same_bits(got.weights, want.weights)) << "weights";
    EXPECT_TRUE(test::same_bits(got.lse, want.lse)) << "lse";
  }
  const Bound<T> b = Inputs(c).bind<T>();  // layout 2: the gaps between elements keep their NaN
  Arr<T> out({c.B, c.H, c.L, c.Dv}, 2, T(NAN)), weights({c.B, c.H, c.L, c.S}, 2, T(NAN));
  reference_forward(make_problem(b.args, SdpaOut<T>{out.view, weights.view, {}}));
  for (const Arr<T>* a : {&out, &weights})
    for (size_t i = 1; i < a->store.size(); i += 2) ASSERT_TRUE(std::isnan(a->store[i])) << "gap written at " << i;
}

TEST(Reference, StridedInputsAndOutputs) {
  check_strided<double>();
  check_strided<float>();
}

TEST(Reference, Dropout) {
  Case c;
  c.B = 2, c.H = 4, c.L = 64, c.S = 129, c.D = 8, c.Dv = 8, c.dropout_seed = 42, c.seed = 13;
  Inputs in(c);
  const Forward plain = run<double>(in);
  for (double p : {0.1, 0.5, 0.9}) {
    SCOPED_TRACE(cat("p = ", p));
    in.c.dropout_p = p;
    const Forward r = run<double>(in), f = run<float>(in);
    // kept fraction: each weight is kept independently with q = 1 - threshold/2^32 (≈ 1 - p), so the count
    // is Binomial(N, q); 6 standard deviations make a false failure less likely than 1e-8.
    const double N = static_cast<double>(r.weights.size());
    const double q = 1 - std::ldexp(static_cast<double>(dropout_threshold(p)), -32);
    EXPECT_NEAR(q, 1 - p, 1e-9);
    double kept = 0;
    const double keep_scale = 1 / (1 - p);
    for (size_t i = 0; i < r.weights.size(); ++i) {
      const double w = r.weights[i], w0 = plain.weights[i];
      ASSERT_GT(w0, 0.0);  // no weight underflows, so a zero weight means dropped
      if (w != 0) {
        ++kept;
        ASSERT_EQ(w, w0 * keep_scale) << i;  // scaled by exactly 1/(1-p)
      }
      ASSERT_EQ(f.weights[i] != 0, w != 0) << "float and double drop different weights at " << i;
    }
    EXPECT_LE(std::abs(kept - N * q), 6 * std::sqrt(N * q * (1 - q))) << "kept " << kept << " of " << N;
    check_against_oracle<double>(in);  // out = (dropped, rescaled weights) · V
    check_against_oracle<float>(in);

    // same seed, same mask; another seed, another mask (they agree on a fraction q² + (1-q)² of weights)
    const Forward again = run<double>(in);
    for (size_t i = 0; i < r.weights.size(); ++i) ASSERT_EQ(again.weights[i], r.weights[i]);
    in.c.dropout_seed = 43;
    const Forward o = run<double>(in);
    in.c.dropout_seed = 42;
    double same = 0;
    for (size_t i = 0; i < r.weights.size(); ++i) same += (o.weights[i] != 0) == (r.weights[i] != 0);
    const double agree = q * q + (1 - q) * (1 - q);
    EXPECT_LE(std::abs(same - N * agree), 6 * std::sqrt(N * agree * (1 - agree)));
  }
  in.c.dropout_p = 1;  // everything dropped
  const Forward r = run<double>(in);
  for (double x : r.out) ASSERT_EQ(x, 0.0);
  for (double x : r.weights) ASSERT_EQ(x, 0.0);
  for (size_t i = 0; i < r.lse.size(); ++i) ASSERT_EQ(r.lse[i], plain.lse[i]);  // LSE: before dropout
  in.c.dropout_p = 0;
  in.c.dropout_seed = 7;  // p = 0: the seed does not matter
  const Forward z = run<double>(in);
  for (size_t i = 0; i < z.out.size(); ++i) ASSERT_EQ(z.out[i], plain.out[i]);
}

// NaN and Inf flow through without a crash: a row they touch is non-finite (a NaN is never taken for a
// masked score), every other row is unchanged.
TEST(Reference, NanAndInfFlowThrough) {
  Case c;
  c.B = 1, c.H = 2, c.Hkv = 2, c.L = 5, c.S = 7, c.D = 8, c.Dv = 4, c.mask = additive(), c.seed = 17;
  Inputs in(c);
  for (double& x : in.mask) x = std::isinf(x) ? 0.0 : x;  // no -inf: then a fully masked row can't hide a NaN
  const Forward clean = run<double>(in);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  in.q.view().at({0, 0, 2, 3}) = nan;   // query row (0, 0, 2): all its scores are NaN
  in.mask[4 * c.S + 1] = nan;           // one score of row l = 4, every head
  in.v.view().at({0, 1, 3, 0}) = kInf;  // value 3 of head 1: every row of head 1
  const Forward r = run<double>(in), f = run<float>(in);
  for (int64_t h = 0; h < c.H; ++h)
    for (int64_t l = 0; l < c.L; ++l) {
      SCOPED_TRACE(cat("row h = ", h, ", l = ", l));
      const bool touched = (h == 0 && l == 2) || l == 4 || h == 1;
      bool finite = true, finite_f = true;
      for (int64_t e = 0; e < c.Dv; ++e) {
        const size_t i = at(c, 0, h, l, e, c.Dv);
        finite = finite && std::isfinite(r.out[i]);
        finite_f = finite_f && std::isfinite(f.out[i]);
        if (!touched) {
          EXPECT_EQ(r.out[i], clean.out[i]);
        }
      }
      EXPECT_EQ(finite, !touched);
      EXPECT_EQ(finite_f, !touched);
      if (l == 2 && h == 0) {
        EXPECT_TRUE(std::isnan(r.lse[row(c, 0, h, l)]));
      }
    }
}

// ---- make_problem's errors: attn::Error naming the argument and both shapes ----

struct Shapes {
  Shape q = {2, 4, 7, 8}, k = {2, 2, 5, 8}, v = {2, 2, 5, 6}, out = {2, 4, 7, 6}, weights, lse;
  MaskSpec mask, padding;
  double dropout_p = 0;
  std::optional<double> scale;
  bool no_out = false;
};

void expect_error(const Shapes& s, const std::vector<std::string>& parts) {
  TensorD q(s.q), k(s.k), v(s.v), out(s.out), w(s.weights), lse(s.lse), mb(s.mask.shape), pb(s.padding.shape);
  TensorT<uint8_t> mk(s.mask.shape), pk(s.padding.shape);
  auto mask = [](const MaskSpec& m, TensorD& bias, TensorT<uint8_t>& bools) -> Mask<double> {
    if (m.kind == MaskKind::none) return {};
    if (m.kind == MaskKind::additive) return Mask<double>::additive(bias.view());
    return m.kind == MaskKind::keep ? Mask<double>::keep(bools.view()) : Mask<double>::drop(bools.view());
  };
  SdpaArgs<double> a;
  a.q = q.view(), a.k = k.view(), a.v = v.view();
  a.attn_mask = mask(s.mask, mb, mk), a.key_padding = mask(s.padding, pb, pk);
  a.dropout_p = s.dropout_p, a.scale = s.scale;
  SdpaOut<double> o{s.no_out ? View<double>{} : out.view(), s.weights.empty() ? View<double>{} : w.view(),
                    s.lse.empty() ? View<double>{} : lse.view()};
  try {
    make_problem(a, o);
    ADD_FAILURE() << "no error; expected one naming " << ::testing::PrintToString(parts);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("Expected ", 0), 0u) << msg;
    EXPECT_NE(msg.find(" instead"), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

template <typename F>
void expect_error_with(F change, const std::vector<std::string>& parts) {
  Shapes s;
  change(s);
  SCOPED_TRACE(::testing::PrintToString(parts));
  expect_error(s, parts);
}

TEST(Reference, ValidShapesAreAccepted) {
  Shapes s;  // the base of the error cases below must itself be valid, or they prove nothing
  TensorD q(s.q), k(s.k), v(s.v), out(s.out);
  SdpaArgs<double> a;
  a.q = q.view(), a.k = k.view(), a.v = v.view();
  const SdpaProblem<double> p = make_problem(a, SdpaOut<double>{out.view(), {}, {}});
  EXPECT_EQ(p.H / p.Hkv, 2);
  EXPECT_EQ(p.scale, 1 / std::sqrt(8.0));
}

TEST(Reference, ErrorsNameArgumentAndShapes) {
  expect_error_with([](Shapes& s) { s.q = {4, 7, 8}; }, {"query", "(B, H, L, D)", "(4, 7, 8)"});
  expect_error_with([](Shapes& s) { s.k = {2, 2, 5, 8, 1}; }, {"key", "(B, Hkv, S, D)", "(2, 2, 5, 8, 1)"});
  expect_error_with([](Shapes& s) { s.v = {2, 5, 6}; }, {"value", "(B, Hkv, S, Dv)", "(2, 5, 6)"});
  expect_error_with([](Shapes& s) { s.out = {2, 4, 7}; }, {"out", "(B, H, L, Dv)", "(2, 4, 7)"});
  expect_error_with([](Shapes& s) { s.no_out = true; }, {"out", "(B, H, L, Dv)"});
  // key/value against query
  expect_error_with([](Shapes& s) { s.k = {2, 2, 5, 9}; }, {"key", "(2, 2, 5, 8)", "(2, 2, 5, 9)"});
  expect_error_with([](Shapes& s) { s.k = {3, 2, 5, 8}; }, {"key", "(2, 2, 5, 8)", "(3, 2, 5, 8)"});
  expect_error_with([](Shapes& s) { s.v = {2, 2, 6, 6}; }, {"value", "(2, 2, 5, 6)", "(2, 2, 6, 6)"});
  expect_error_with([](Shapes& s) { s.v = {2, 1, 5, 6}; }, {"value", "(2, 2, 5, 6)", "(2, 1, 5, 6)"});
  expect_error_with([](Shapes& s) { s.v = {1, 2, 5, 6}; }, {"value", "(2, 2, 5, 6)", "(1, 2, 5, 6)"});
  // H % Hkv
  expect_error_with([](Shapes& s) { s.k = {2, 3, 5, 8}, s.v = {2, 3, 5, 6}; },
                    {"H = 4", "Hkv = 3", "(2, 4, 7, 8)", "(2, 3, 5, 8)"});
  // outputs
  expect_error_with([](Shapes& s) { s.out = {2, 4, 7, 8}; }, {"out", "(2, 4, 7, 6)", "(2, 4, 7, 8)"});
  expect_error_with([](Shapes& s) { s.weights = {2, 4, 5, 7}; }, {"weights", "(2, 4, 7, 5)", "(2, 4, 5, 7)"});
  expect_error_with([](Shapes& s) { s.lse = {2, 4, 7, 1}; }, {"lse", "(2, 4, 7)", "(2, 4, 7, 1)"});
  // masks
  for (MaskKind kind : {MaskKind::keep, MaskKind::drop, MaskKind::additive}) {
    for (Shape bad : {Shape{7, 6}, Shape{5, 7}, Shape{3, 7, 5}, Shape{2, 2, 7, 5}, Shape{1, 2, 4, 7, 5}})
      expect_error_with([&](Shapes& s) { s.mask = {kind, bad}; },
                        {"attn_mask", "(B, H, L, S) = (2, 4, 7, 5)", to_string(bad)});
    for (Shape bad : {Shape{2, 6}, Shape{5}, Shape{1, 5}, Shape{2, 1, 1, 5}, Shape{5, 2}})
      expect_error_with([&](Shapes& s) { s.padding = {kind, bad}; },
                        {"key_padding_mask", "(B, S) = (2, 5)", to_string(bad)});
  }
  // scalars
  for (double p : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()})
    expect_error_with([&](Shapes& s) { s.dropout_p = p; }, {"dropout_p", "[0, 1]"});
  for (double scale : {kInf, -kInf, std::numeric_limits<double>::quiet_NaN()})
    expect_error_with([&](Shapes& s) { s.scale = scale; }, {"scale"});
}

}  // namespace
