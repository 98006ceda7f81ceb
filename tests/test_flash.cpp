// The flash forward kernel against the fp64 reference, with FlashAttention's derived tolerance: its
// error may be at most 2x the error of the plain fp32 reference, plus a tiny atol. Also: bitwise the same
// output for 1 and 2 threads, the zero policy on fully masked rows, every SIMD target compiled in,
// forced small and large tile sizes, and sdpa()'s backend choice (explain, strict). Not a benchmark
// (bench/bench_kernels.cpp is).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "attn/threads.h"
#include "sdpa_harness.h"
#include "test_util.h"

using namespace attn;
using namespace attn::test;

namespace {

// The flash output and LSE of a case with n threads, as raw floats.
std::vector<float> flash_bits(const Inputs& in, int threads) {
  set_num_threads(threads);
  const Forward r = forward<float>(flash_forward, in);
  std::vector<float> x(r.out.begin(), r.out.end());
  x.insert(x.end(), r.lse.begin(), r.lse.end());
  return x;
}

void check_case(const Case& c) { expect_forward_close(flash_forward, c); }

const int64_t kSizes[] = {1, 7, 63, 64, 65, 129, 513};
const int64_t kDims[] = {8, 63, 64, 80, 128};

}  // namespace

TEST(Flash, SizesSweep) {
  // every L against a few S and every S against a few L, D cycling: all sizes, not the full product
  int i = 0;
  for (int64_t L : kSizes)
    for (int64_t S : {int64_t(1), int64_t(65), int64_t(513), L}) {
      Case c;
      c.L = L, c.S = S, c.D = c.Dv = kDims[i++ % 5];
      check_case(c);
      c.L = S, c.S = L;
      check_case(c);
    }
}

TEST(Flash, HeadDimsAndDvDiffersFromD) {
  for (int64_t D : kDims)
    for (int64_t Dv : kDims) {
      Case c;
      c.L = 65, c.S = 129, c.D = D, c.Dv = Dv;
      check_case(c);
    }
}

TEST(Flash, EveryMaskKindAndCombination) {
  const MaskKind kinds[] = {MaskKind::none, MaskKind::keep, MaskKind::drop, MaskKind::additive};
  for (MaskKind mask : kinds)
    for (MaskKind padding : kinds)
      for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
        for (auto [L, S] : {std::pair<int64_t, int64_t>{37, 300}, {300, 37}}) {
          Case c;
          c.B = 2, c.L = L, c.S = S, c.mask = {mask, {}}, c.padding = {padding, {}}, c.causal = causal,
          c.masked_rows = 0.1;
          check_case(c);
        }
}

TEST(Flash, FullyMaskedKeyTilesAreSkippedCorrectly) {
  // key padding that masks whole key tiles (and, for batch 1, every key): the skipped tiles must
  // leave the rows exactly as the reference has them
  Case c;
  c.B = 2, c.L = 70, c.S = 1000, c.padding = drop();
  Inputs in(c);
  for (int64_t s = 0; s < c.S; ++s) {
    in.padding[s] = s < 600;       // batch 0: keys [0, 600) masked out
    in.padding[c.S + s] = 1;       // batch 1: every key masked out
  }
  expect_forward_close(flash_forward, in);
  EXPECT_EQ(forward<float>(flash_forward, in).lse.back(), -kInf);
}

TEST(Flash, MaskBroadcastShapes) {
  for (Shape shape : {Shape{2, 2, 70, 300}, Shape{2, 1, 1, 300}, Shape{1, 2, 70, 1}, Shape{300}, Shape{70, 300}})
    for (MaskKind kind : {MaskKind::keep, MaskKind::additive}) {
      Case c;
      c.B = 2, c.L = 70, c.S = 300, c.mask = {kind, shape};
      check_case(c);
    }
}

TEST(Flash, CausalBothAlignmentsLongerThanATile) {
  for (Causal causal : {Causal::top_left, Causal::bottom_right})
    for (auto [L, S] : {std::pair<int64_t, int64_t>{600, 600}, {200, 700}, {700, 200}, {513, 1}, {1, 513}}) {
      Case c;
      c.L = L, c.S = S, c.causal = causal, c.D = c.Dv = 64;
      check_case(c);
    }
}

TEST(Flash, GqaRatios) {
  for (int64_t ratio : {1, 2, 4, 8})
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c;
      c.H = 8, c.Hkv = 8 / ratio, c.L = 65, c.S = 129, c.causal = causal, c.mask = keep({1, 8, 65, 129});
      check_case(c);
    }
}

TEST(Flash, DecodePath) {
  // L·H/Hkv <= 16 rows per KV head and S >= 1024: S split in fixed chunks, partials merged
  for (auto [L, S] : {std::pair<int64_t, int64_t>{1, 1024}, {1, 3000}, {2, 2049}, {16, 1500}})
    for (int64_t Hkv : {int64_t(1), int64_t(8)}) {
      if (L * 8 / Hkv > 16) continue;
      Case c;
      c.H = 8, c.Hkv = Hkv, c.L = L, c.S = S, c.D = c.Dv = 64;
      check_case(c);
      c.causal = Causal::bottom_right, c.padding = drop(), c.Dv = 63;
      check_case(c);
      c.mask = additive({1, 8, L, S}), c.masked_rows = 0.3;
      check_case(c);
    }
}

// Tile sizes come from the cache sizes of the machine the tests run on; other machines get others. Force
// a small (64 keys x 12 rows) and a large (512 x 512) configuration and check odd sizes, every mask
// kind, both alignments across tile edges, GQA, dropout and strided layouts against the oracle in both.
TEST(Flash, SmallAndLargeTileConfigurations) {
  const FlashTiles derived = flash_tiles();
  EXPECT_GE(derived.keys, 64);
  EXPECT_EQ(derived.keys % 64, 0);
  for (FlashTiles t : {FlashTiles{64, 12}, FlashTiles{512, 512}}) {
    set_flash_tiles(t);
    ASSERT_EQ(flash_tiles().keys, t.keys);
    SCOPED_TRACE(cat("tiles ", t.keys, " keys x ", t.rows, " rows"));
    for (int64_t L : {1, 63, 65, 513})
      for (int64_t S : {7, 129, 700}) {
        Case c;
        c.L = L, c.S = S, c.D = c.Dv = (L + S) % 2 ? 63 : 64;
        check_case(c);
      }
    for (Causal causal : {Causal::top_left, Causal::bottom_right})
      for (auto [L, S] : {std::pair<int64_t, int64_t>{600, 600}, {200, 700}, {700, 200}}) {
        Case c;
        c.L = L, c.S = S, c.causal = causal, c.padding = drop(), c.mask = additive(), c.masked_rows = 0.2;
        check_case(c);
      }
    for (MaskKind kind : {MaskKind::keep, MaskKind::drop, MaskKind::additive}) {
      Case c;
      c.H = 8, c.Hkv = 2, c.L = 130, c.S = 600, c.mask = {kind, {1, 8, 130, 600}}, c.D = c.Dv = 128;
      check_case(c);
    }
    {
      Case c;
      c.L = 300, c.S = 555, c.dropout_p = 0.3, c.causal = Causal::bottom_right, c.in_layout = 1, c.out_layout = 2;
      check_case(c);
    }
  }
  set_flash_tiles({});
  EXPECT_EQ(flash_tiles().keys, derived.keys);
}

TEST(Flash, DropoutKeepsTheReferenceBits) {
  for (double p : {0.1, 0.5, 1.0})
    for (auto [L, S] : {std::pair<int64_t, int64_t>{65, 300}, {1, 2000}}) {
      Case c;
      c.L = L, c.S = S, c.dropout_p = p, c.causal = Causal::bottom_right;
      check_case(c);
    }
}

TEST(Flash, StridedInputsAndOutput) {
  for (int in_layout : {0, 1, 2})
    for (int out_layout : {0, 1, 2}) {
      Case c;
      c.L = 65, c.S = 129, c.D = 64, c.Dv = 64, c.in_layout = in_layout, c.out_layout = out_layout;
      check_case(c);
      c.L = 1, c.S = 1100;  // decode
      check_case(c);
    }
}

TEST(Flash, SameBitsForOneTwoAndThreeThreads) {
  const int before = num_threads();
  std::vector<Case> cases(4);
  cases[0].L = cases[0].S = 513, cases[0].D = cases[0].Dv = 64, cases[0].causal = Causal::top_left;
  cases[1].H = 8, cases[1].Hkv = 2, cases[1].L = 300, cases[1].S = 700, cases[1].mask = additive();
  cases[2].H = 8, cases[2].Hkv = 1, cases[2].L = 2, cases[2].S = 3000;  // decode
  cases[3].L = 1, cases[3].S = 4100, cases[3].dropout_p = 0.2;          // decode, dropout
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    Inputs in(c);
    const std::vector<float> one = flash_bits(in, 1);
    for (int threads : {2, 3}) {
      const std::vector<float> other = flash_bits(in, threads);
      EXPECT_TRUE(test::same_bits(one, other)) << threads << " threads";
    }
  }
  set_num_threads(before);
}

TEST(Flash, FullyMaskedRowsGiveZeroAndMinusInfLse) {
  // bottom-right causal with L > S: the first L - S queries see no key; plus masked-out mask rows
  for (int64_t S : {int64_t(40), int64_t(1200)}) {
    Case c;
    c.L = S == 40 ? 70 : 16, c.S = S, c.H = c.Hkv = 1, c.causal = Causal::bottom_right, c.mask = keep(),
    c.masked_rows = 0.3;
    Inputs in(c);
    const Forward flash = forward<float>(flash_forward, in), truth = forward<double>(reference_forward<double>, in);
    int64_t masked = 0;
    for (int64_t l = 0; l < c.L; ++l) {
      const bool empty = truth.lse[l] == -kInf;
      masked += empty;
      EXPECT_EQ(flash.lse[l] == -kInf, empty) << "row " << l;
      for (int64_t e = 0; e < c.Dv; ++e) {
        ASSERT_FALSE(std::isnan(flash.out[l * c.Dv + e]));
        if (empty) {
          EXPECT_EQ(flash.out[l * c.Dv + e], 0.0) << "row " << l;
        }
      }
    }
    EXPECT_GT(masked, 0);  // the case does test the policy
  }
}

TEST(Flash, NanInputGivesNanRowNotZeros) {
  Case c;
  c.H = c.Hkv = 1, c.L = 3, c.S = 70;
  Inputs in(c);
  in.q.data()[0] = NAN;  // row 0 of query
  const Forward flash = forward<float>(flash_forward, in);
  EXPECT_TRUE(std::isnan(flash.out[0]));
  EXPECT_TRUE(std::isnan(flash.lse[0]));
  EXPECT_FALSE(std::isnan(flash.out[c.Dv]));  // other rows untouched
}

TEST(Flash, EverySimdTargetCompiledIn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    Case c;
    c.L = 70, c.S = 300, c.D = 63, c.Dv = 80, c.H = 4, c.Hkv = 2, c.causal = Causal::top_left,
    c.mask = additive();
    check_case(c);
    c.L = 1, c.S = 1500, c.Dv = 64, c.H = 16, c.Hkv = 1;  // decode, 16 rows: several Qᵀ panels below AVX-512
    check_case(c);
    c.L = 5, c.S = 100, c.H = 3, c.Hkv = 1, c.in_layout = 2;  // few rows, K copied as rows
    check_case(c);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The harness's rule can fail: flash with one output element, or one dQ element, moved by 1e-4 (50x the
// atol, far above 2x the fp32 reference's error on this small case) does not pass it.
static void off_forward(const SdpaProblem<float>& p) {
  flash_forward(p);
  p.out.out.data[0] += 1e-4f;
}
static void off_backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g) {
  flash_backward(p, dout, g);
  g.dq.data[0] += 1e-4f;
}
static void forward_off() { expect_forward_close(off_forward, Case{}); }
static void backward_off() { expect_backward_close(off_backward, Case{}); }

TEST(Flash, TheToleranceRuleCatchesAWrongKernel) {
  EXPECT_NONFATAL_FAILURE(forward_off(), "out: error");
  EXPECT_NONFATAL_FAILURE(backward_off(), "dq: error");
}

// ---- Weights from the flash LSE (sdpa with weights requested) ----

// What sdpa() runs for fp32 with weights requested: flash_forward for out and LSE, then weights_from_lse.
static void flash_then_weights(const SdpaProblem<float>& p) {
  SdpaProblem<float> q = p;
  q.out.weights = {};
  flash_forward(q);
  weights_from_lse(p);
}

// The weights of the flash path against the fp64 reference's, with the same rule as the output; every mask
// kind, causal alignment, GQA and dropout (the same keep bits).
TEST(FlashWeights, MatchTheReferenceWithMasksCausalGqaAndDropout) {
  int i = 0;
  for (MaskKind mask : {MaskKind::none, MaskKind::keep, MaskKind::additive})
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Case c;
      c.B = 2, c.H = 4, c.Hkv = i % 2 ? 2 : 4, c.L = 37, c.S = 65, c.D = c.Dv = 63, c.mask = {mask, {}};
      c.padding = i % 3 ? MaskSpec{} : drop(), c.causal = causal, c.masked_rows = 0.1;
      c.dropout_p = i++ % 2 ? 0.25 : 0;
      SCOPED_TRACE(c.name());
      const Inputs in(c);
      const Forward got = forward<float>(flash_then_weights, in, true);
      const Forward ref32 = forward<float>(reference_forward<float>, in, true);
      const Forward truth = forward<double>(reference_forward<double>, in, true);
      expect_close("weights", got.weights, ref32.weights, truth.weights, kAtolOut);
      expect_close("out", got.out, ref32.out, truth.out, kAtolOut);
    }
}

// ---- sdpa(): backend choice ----

TEST(FlashBackend, ExplainAndStrict) {
  Case c;
  const Inputs in(c);
  Arr<float> out({c.B, c.H, c.L, c.Dv}, 0), weights({c.B, c.H, c.L, c.S}, 0);
  const Bound<float> b = in.bind<float>();
  const SdpaArgs<float>& args = b.args;
  const SdpaOut<float> plain{out.view, {}, {}}, with_weights{out.view, weights.view, {}};

  BackendChoice ch = explain(args, plain);
  EXPECT_EQ(ch.backend, Backend::flash) << ch.reason;
  ch = explain(args, with_weights);
  EXPECT_EQ(ch.backend, Backend::flash);
  EXPECT_EQ(ch.reason, "float32 with weights: flash for the output and LSE, the weights from the LSE");
  EXPECT_NO_THROW(sdpa(args, with_weights, {Backend::automatic, true}));
  EXPECT_NO_THROW(sdpa(args, with_weights, {Backend::flash, false}));
  // weights with strided columns: the reference materializes them (a fallback strict mode refuses)
  Arr<float> wide({c.B, c.H, c.L, 2 * c.S}, 0);
  const View<float> strided(wide.view.data, {c.B, c.H, c.L, c.S}, {c.H * c.L * 2 * c.S, c.L * 2 * c.S, 2 * c.S, 2});
  const SdpaOut<float> with_strided{out.view, strided, {}};
  EXPECT_EQ(explain(args, with_strided).backend, Backend::reference);
  EXPECT_THROW(sdpa(args, with_strided, {Backend::automatic, true}), Error);
  EXPECT_THROW(sdpa(args, with_strided, {Backend::flash, false}), Error);
  EXPECT_EQ(explain(args, with_weights, {Backend::reference, true}).backend, Backend::reference);
  EXPECT_EQ(explain(args, plain, {Backend::reference, false}).backend, Backend::reference);
  EXPECT_EQ(explain(args, plain, {Backend::flash, true}).backend, Backend::flash);

  const Bound<double> bd = in.bind<double>();
  const SdpaArgs<double>& argsd = bd.args;
  Arr<double> outd({c.B, c.H, c.L, c.Dv}, 0);
  const SdpaOut<double> plaind{outd.view, {}, {}};
  ch = explain(argsd, plaind);
  EXPECT_EQ(ch.backend, Backend::reference);
  EXPECT_EQ(ch.reason, "fp64 runs on the reference");
  EXPECT_THROW(sdpa(argsd, plaind, {Backend::flash, false}), Error);
  EXPECT_THROW(sdpa(argsd, plaind, {Backend::automatic, true}), Error);
  try {
    explain(argsd, plaind, {Backend::automatic, true});
    FAIL() << "strict fp64 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp64 runs on the reference"), std::string::npos) << e.what();
  }
}

TEST(FlashBackend, SdpaRunsFlashAndMatchesTheKernel) {
  Case c;
  c.L = 65, c.S = 129;
  const Inputs in(c);
  const Forward direct = forward<float>(flash_forward, in);
  Arr<float> out({c.B, c.H, c.L, c.Dv}, 0);
  sdpa(in.bind<float>().args, SdpaOut<float>{out.view, {}, {}}, {Backend::automatic, true});
  EXPECT_EQ(out.values(), direct.out);
}

TEST(FlashBackend, EachBackendIsPrintedAsItIsParsed) {
  for (Backend b : {Backend::automatic, Backend::reference, Backend::flash}) EXPECT_EQ(parse_backend(to_string(b)), b);
  EXPECT_STREQ(to_string(Backend::automatic), "auto");  // as Python's backend="auto"
  EXPECT_THROW(parse_backend("automatic"), Error);
}
