// Half-precision K/V for decoding: the fp32 <-> fp16/bf16 conversions (round to nearest even, the
// error bound u per element), flash_decode_half against the fp64 reference over the original fp32 K/V
// with a bound derived from u, MHA/GQA/MQA, masks, every compiled SIMD target, the zero policy, the same
// bits for any thread count, and KVCache + MultiheadAttention::forward_cached with a 16-bit cache
// against an fp32 one. Not a benchmark (bench/bench_kernels.cpp is).
#include <gtest/gtest.h>
#include <hwy/targets.h>  // with the library's HWY_DISABLED_TARGETS (CMakeLists.txt): its targets, no more

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/kv_cache.h"
#include "attn/mha.h"
#include "attn/rng.h"
#include "attn/threads.h"
#include "sdpa_harness.h"
#include "test_util.h"

using namespace attn;
using namespace attn::test;

namespace {

const KvDtype kHalves[] = {KvDtype::f16, KvDtype::bf16};

uint16_t bits_of(KvDtype t, float x) {
  uint16_t h;
  to_half(t, &x, 1, &h);
  return h;
}
float value_of(KvDtype t, uint16_t h) {
  float x;
  from_half(t, &h, 1, &x);
  return x;
}

TEST(HalfConvert, RoundTripWithinTheUnitRoundoff) {
  Rng rng(3);
  for (KvDtype t : kHalves) {
    std::vector<float> x(1000 + 7);  // not a multiple of any vector width: the tail is converted too
    for (float& v : x) v = float(rng.normal() * std::exp(rng.uniform(-8, 8)));
    std::vector<uint16_t> h(x.size());
    std::vector<float> y(x.size());
    to_half(t, x.data(), int64_t(x.size()), h.data());
    from_half(t, h.data(), int64_t(h.size()), y.data());
    const double u = kv_unit_roundoff(t);
    for (size_t i = 0; i < x.size(); ++i) {
      // round to nearest: |y - x| <= u·|x| in the normal range; below 2^-14 fp16 is subnormal, spaced
      // 2^-24, so the error is at most half of that instead (bf16 has fp32's range: always relative)
      const double tiny = t == KvDtype::f16 ? std::ldexp(1.0, -25) : 0.0;
      EXPECT_LE(std::abs(double(y[i]) - double(x[i])), std::max(u * std::abs(double(x[i])), tiny))
          << to_string(t) << " " << x[i];
      EXPECT_EQ(bits_of(t, y[i]), h[i]);  // a stored value converts back to itself
    }
  }
}

TEST(HalfConvert, TiesToEvenInfNanAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  // fp16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even is 1. 1 + 3·2^-11 goes up to 1 + 2^-9.
  EXPECT_EQ(value_of(KvDtype::f16, bits_of(KvDtype::f16, 1.f + std::ldexp(1.f, -11))), 1.f);
  EXPECT_EQ(value_of(KvDtype::f16, bits_of(KvDtype::f16, 1.f + 3 * std::ldexp(1.f, -11))), 1.f + std::ldexp(1.f, -9));
  EXPECT_EQ(value_of(KvDtype::f16, bits_of(KvDtype::f16, 70000.f)), inf);  // beyond 65504
  // bf16: the same with 2^-8; a truncating conversion (Highway 1.0's DemoteTo) fails the last two
  EXPECT_EQ(value_of(KvDtype::bf16, bits_of(KvDtype::bf16, 1.f + std::ldexp(1.f, -8))), 1.f);
  EXPECT_EQ(value_of(KvDtype::bf16, bits_of(KvDtype::bf16, 1.f + 3 * std::ldexp(1.f, -8))), 1.f + std::ldexp(1.f, -6));
  EXPECT_EQ(value_of(KvDtype::bf16, bits_of(KvDtype::bf16, 1.f + 0.75f * std::ldexp(1.f, -7))),
            1.f + std::ldexp(1.f, -7));
  for (KvDtype t : kHalves) {
    EXPECT_EQ(value_of(t, bits_of(t, inf)), inf);
    EXPECT_EQ(value_of(t, bits_of(t, -inf)), -inf);
    EXPECT_TRUE(std::isnan(value_of(t, bits_of(t, std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_EQ(value_of(t, bits_of(t, -0.f)), 0.f);
  }
  EXPECT_NE(test::error_of([] { parse_kv_dtype("f8"); }).find("'f8'"), std::string::npos);
}

// A decoding case: one query over 600 keys of 4 heads sharing 2 KV heads, bottom-right causal (as a KV
// cache is read); tests change what they vary.
Case decode_case() {
  Case c;
  c.B = 1, c.H = 4, c.Hkv = 2, c.L = 1, c.S = 600, c.D = 64, c.Dv = 64, c.causal = Causal::bottom_right;
  return c;
}

// The inputs of a case (fp32 values), the K/V also stored as t, and the results of: the decode kernel,
// the fp64 reference on the fp32 K/V (the truth) and the fp32 reference (for the rounding of a plain fp32
// kernel), and both references again over the K/V as stored (rounded: ...r).
struct DecodeRun {
  Inputs in;
  std::vector<uint16_t> k16, v16;
  std::vector<double> got, ref32, ref64, ref32r, ref64r;

  DecodeRun(const Case& c, KvDtype t) : in(c) {
    Inputs rounded = in.clone();
    auto store = [&](const TensorD& x, TensorD& back, std::vector<uint16_t>& h) {
      std::vector<float> f(x.data(), x.data() + x.numel());
      h.resize(f.size());
      to_half(t, f.data(), int64_t(f.size()), h.data());
      from_half(t, h.data(), int64_t(h.size()), f.data());
      std::copy(f.begin(), f.end(), back.data());
    };
    store(in.k, rounded.k, k16);
    store(in.v, rounded.v, v16);
    run_half(t);
    ref64 = forward<double>(reference_forward<double>, in).out;
    ref32 = forward<float>(reference_forward<float>, in).out;
    ref64r = forward<double>(reference_forward<double>, rounded).out;
    ref32r = forward<float>(reference_forward<float>, rounded).out;
  }

  void run_half(KvDtype t) {
    const Case& c = in.c;
    const Bound<float> b = in.bind<float>();
    SdpaArgs<float> a = b.args;
    a.k = {}, a.v = {};
    HalfKV kv{t, View<const uint16_t>(k16.data(), {c.B, c.Hkv, c.S, c.D}),
              View<const uint16_t>(v16.data(), {c.B, c.Hkv, c.S, c.Dv})};
    std::vector<float> out(size_t(c.B * c.H * c.L * c.Dv), NAN);
    sdpa(a, kv, SdpaOut<float>{View<float>(out.data(), {c.B, c.H, c.L, c.Dv}), {}, {}});
    got.assign(out.begin(), out.end());
  }

  // The derived bound on |got − ref64| at (b, h, l, e). Storing K rounds each score x_s by at most
  // ε_s = u·scale·Σ_d |q_d·k_sd|; with ε = max_s ε_s every weight moves by a factor in [e^-2ε, e^2ε],
  // so Σ_s |p'_s − p_s| <= e^2ε − 1. Storing V moves each v_se by at most u·|v_se|. Hence
  //   |out' − out| <= (e^2ε − 1)·max_s |v'_se| + u·max_s |v_se|,
  // plus the fp32 kernel's own rounding, bounded by the tolerance rule of the flash tests: 2x the plain
  // fp32 reference's error and an atol of a few ulp (kAtolOut).
  double bound(KvDtype t, int64_t b, int64_t h, int64_t l, int64_t e, int64_t idx) const {
    const Case& c = in.c;
    const double u = kv_unit_roundoff(t), scale = 1 / std::sqrt(double(c.D));
    const int64_t kvh = h / (c.H / c.Hkv), end = std::min(c.S, l + 1 + c.S - c.L);
    const double* q = in.q.data() + ((b * c.H + h) * c.L + l) * c.D;  // (D)
    const double* k = in.k.data() + (b * c.Hkv + kvh) * c.S * c.D;    // (S, D)
    const double* v = in.v.data() + (b * c.Hkv + kvh) * c.S * c.Dv;   // (S, Dv)
    double eps = 0, vmax = 0;
    for (int64_t s = 0; s < end; ++s) {
      if (c.padding.kind == MaskKind::drop && in.padding[size_t(b * c.S + s)]) continue;
      double dot = 0;
      for (int64_t d = 0; d < c.D; ++d) dot += std::abs(q[d] * k[s * c.D + d]);
      eps = std::max(eps, u * scale * dot);
      vmax = std::max(vmax, std::abs(v[s * c.Dv + e]));
    }
    return std::expm1(2 * eps) * vmax * (1 + u) + u * vmax + 2 * std::abs(ref32[size_t(idx)] - ref64[size_t(idx)]) +
           kAtolOut;
  }

  void check(KvDtype t) const {
    const Case& c = in.c;
    SCOPED_TRACE(cat(to_string(t), " ", c.name()));
    double worst = 0;  // largest error / bound
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t l = 0; l < c.L; ++l)
          for (int64_t e = 0; e < c.Dv; ++e) {
            const int64_t i = ((b * c.H + h) * c.L + l) * c.Dv + e;
            const double err = std::abs(got[size_t(i)] - ref64[size_t(i)]), bd = bound(t, b, h, l, e, i);
            worst = std::max(worst, err / bd);
            ASSERT_LE(err, bd) << "at b=" << b << " h=" << h << " l=" << l << " e=" << e << ": got " << got[size_t(i)]
                               << ", fp64 " << ref64[size_t(i)];
          }
    ::testing::Test::RecordProperty(cat(to_string(t), " ", c.name()), cat(worst));
    // The kernel alone, against the fp64 reference over the K/V as stored: the rule of every fast kernel.
    expect_close("out over stored K/V", got, ref32r, ref64r, kAtolOut);
  }
};

TEST(DecodeHalf, MatchesTheFp64ReferenceWithinTheDerivedBound) {
  std::vector<Case> cases;
  for (int64_t hkv : {4, 2, 1})  // MHA, GQA, MQA
    for (int64_t S : {1, 7, 513, 1100}) {
      Case c = decode_case();
      c.Hkv = hkv, c.S = S;
      cases.push_back(c);
    }
  for (int64_t D : {8, 63, 128}) {  // head dims off and on the vector width
    Case c = decode_case();
    c.D = c.Dv = D;
    cases.push_back(c);
  }
  {
    Case c = decode_case();  // Dv != D, batch, several queries (bottom-right causal), both masks
    c.B = 2, c.L = 3, c.D = 40, c.Dv = 24, c.S = 700, c.mask = additive(), c.padding = drop();
    cases.push_back(c);
  }
  for (KvDtype t : kHalves)
    for (const Case& c : cases) DecodeRun(c, t).check(t);
}

// The kernel's register blocks and folds of the scores differ per SIMD target (4, 8 or 16 lanes; 2 or 4
// rows a block), so every compiled target runs the bound check on shapes that reach the tails of each:
// rows left over past a block (9 = 3 queries x G 3, 8, 1), keys ending inside a group of 4 and inside a
// vector, D and Dv read in place (64) and packed (40, 24 on 16 lanes; 63, 8).
TEST(DecodeHalf, EverySimdTargetCompiledIn) {
  std::vector<Case> cases(3, decode_case());
  cases[0].H = 8, cases[0].Hkv = 1, cases[0].S = 1001;                     // G = 8, D = Dv = 64
  cases[1].B = 2, cases[1].H = 6, cases[1].Hkv = 2, cases[1].L = 3, cases[1].S = 77, cases[1].D = 40,
  cases[1].Dv = 24, cases[1].mask = additive(), cases[1].padding = drop();  // 9 rows, both masks
  cases[2].H = cases[2].Hkv = 2, cases[2].S = 6, cases[2].D = 63, cases[2].Dv = 8;  // one row
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    for (KvDtype t : kHalves)
      for (const Case& c : cases) DecodeRun(c, t).check(t);
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(DecodeHalf, FullyMaskedRowGivesZeros) {
  Case c = decode_case();
  c.S = 40, c.padding = drop();
  for (KvDtype t : kHalves) {
    DecodeRun r(c, t);
    std::fill(r.in.padding.begin(), r.in.padding.end(), 1);  // every key masked out
    r.run_half(t);
    for (double x : r.got) ASSERT_EQ(x, 0.0);
  }
}

TEST(DecodeHalf, SameBitsForOneAndTwoThreads) {
  Case c = decode_case();
  c.S = 3000, c.L = 2;
  const int saved = num_threads();
  for (KvDtype t : kHalves) {
    set_num_threads(1);
    DecodeRun one(c, t);
    set_num_threads(2);
    DecodeRun two(c, t);
    EXPECT_EQ(one.got, two.got) << to_string(t);
  }
  set_num_threads(saved);
}

TEST(DecodeHalf, ErrorsNameTheArgument) {
  Case c = decode_case();
  c.S = 10;
  DecodeRun r(c, KvDtype::f16);
  const Bound<float> b = r.in.bind<float>();
  SdpaArgs<float> a = b.args;
  HalfKV kv{KvDtype::f16, View<const uint16_t>(r.k16.data(), {1, 2, 10, 64}),
            View<const uint16_t>(r.v16.data(), {1, 2, 10, 64})};
  std::vector<float> out(64);
  SdpaOut<float> o{View<float>(out.data(), {1, 4, 1, 64}), {}, {}};
  EXPECT_NE(test::error_of([&] { sdpa(a, kv, o); }).find("args.k and args.v empty"), std::string::npos);
  a.k = {}, a.v = {};
  a.dropout_p = 0.1;
  EXPECT_NE(test::error_of([&] { sdpa(a, kv, o); }).find("dropout_p = 0"), std::string::npos);
  a.dropout_p = 0;
  kv.v = View<const uint16_t>(r.v16.data(), {1, 2, 9, 64});
  EXPECT_NE(test::error_of([&] { sdpa(a, kv, o); }).find("value"), std::string::npos);
}

// A 16-bit cache through MultiheadAttention::forward_cached, token by token, against the same layer
// over an fp32 cache. Both round the same fp32 projections; the difference is the K/V rounding only,
// bounded as above: with unit-scale inputs and 0.1-scale weights the scores are O(1), so a few u.
TEST(DecodeHalf, ForwardCachedWithHalfCacheFollowsTheFp32Cache) {
  for (int64_t hkv : {4, 2, 1}) {  // MHA, GQA, MQA
    MhaOptions mo;
    mo.embed_dim = 32, mo.num_heads = 4, mo.num_kv_heads = hkv, mo.batch_first = true, mo.seed = 5;
    MultiheadAttention mha(mo);
    mha.eval();
    const int64_t T = 20, E = 32, D = 8;
    Rng rng(9);
    std::vector<float> x(size_t(T * E));
    for (float& e : x) e = float(rng.normal());
    for (KvDtype t : kHalves) {
      KVCache c32(1, 1, hkv, T, D), c16(1, 1, hkv, T, D, 0, t);
      double worst = 0;
      for (int64_t i = 0; i < T; ++i) {
        View<const float> xi(x.data() + i * E, {1, 1, E});
        Tensor a = mha.forward_cached(xi, c32, 0), b = mha.forward_cached(xi, c16, 0);
        for (int64_t j = 0; j < E; ++j) worst = std::max(worst, double(std::abs(a.data()[j] - b.data()[j])));
      }
      // outputs are O(1) (out projection of a convex combination of O(1) values); 8u covers the bound's
      // (e^2ε − 1 + u)·max|v| with ε <= 2u·O(1) and the out projection's sum over E·(0.1-scale) weights
      EXPECT_LE(worst, 8 * kv_unit_roundoff(t)) << to_string(t) << " Hkv=" << hkv;
      EXPECT_GT(worst, 0.0) << "a 16-bit cache that rounds nothing is not being used";
      EXPECT_EQ(c16.length(0), T);
    }
  }
}

}  // namespace
