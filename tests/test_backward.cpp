// SDPA backward: the reference backward against central finite differences in fp64 on tiny shapes, and
// the flash backward (fp32) against the fp64 reference backward with the derived tolerance, over every
// mask kind, both causal alignments, GQA ratios 1, 2, 4, dropout and odd sizes; zero gradients of fully
// masked rows; flash bitwise the same for 1 and 2 threads and with its query side in phases; forced small and
// large tiles and every SIMD target against the oracle; the flash backward drops exactly the forward's
// elements (DropRow shared); the argument checks of sdpa_backward. Cases, inputs and the tolerance rule
// are tests/sdpa_harness.h's. Not a benchmark.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include <hwy/targets.h>

#include "attn/threads.h"
#include "sdpa_harness.h"
#include "test_util.h"

using namespace attn;
using namespace attn::test;

namespace {

// The masks of the sweeps: none; keep (L, S), broadcast over B and H, whose last row keeps nothing; drop
// (B, 1, L, S), broadcast over H; additive (B, H, L, S), finite values and some -inf; key padding (B, S).
const char* const kMasks[] = {"none", "keep", "drop", "additive", "padding"};
const char* name(Causal c) { return c == Causal::none ? "none" : c == Causal::top_left ? "tl" : "br"; }

Case make(int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S, int64_t D, int64_t Dv, int mask = 0,
          Causal causal = Causal::none, double dropout = 0) {
  Case c;
  c.B = B, c.H = H, c.Hkv = Hkv, c.L = L, c.S = S, c.D = D, c.Dv = Dv, c.causal = causal, c.dropout_p = dropout;
  if (mask == 1) c.mask = keep({L, S});
  if (mask == 2) c.mask = drop({B, 1, L, S});
  if (mask == 3) c.mask = additive({B, H, L, S});
  if (mask == 4) c.padding = drop();
  return c;
}

// The inputs of a case of make(), seeded: the keep mask's last row keeps nothing, so every sweep with it
// has a fully masked row.
Inputs inputs(Case c, uint64_t seed) {
  c.seed = seed;
  Inputs in(c);
  if (c.mask.kind == MaskKind::keep)
    for (int64_t s = 0; s < c.S; ++s) in.mask[(c.L - 1) * c.S + s] = 0;
  return in;
}

Grads reference_grads(const Inputs& in) { return backward<double>(reference_backward<double>, in); }
Grads flash_grads(const Inputs& in) { return backward<float>(flash_backward, in); }

// The functional whose gradient we check: f(q, k, v) = sum(dout ∘ sdpa(q, k, v)), so df/dout-side = dout.
double functional(const Inputs& in) {
  const Forward r = forward<double>(reference_forward<double>, in);
  double f = 0;
  for (size_t i = 0; i < r.out.size(); ++i) f += in.dout.data()[i] * r.out[i];
  return f;
}

using Param = std::tuple<int /* mask */, Causal, int /* H / Hkv */, double /* dropout */, bool /* L > S */>;

std::string param_name(const testing::TestParamInfo<Param>& info) {
  auto [mask, causal, ratio, dropout, tall] = info.param;
  return cat(kMasks[mask], "_causal_", name(causal), "_gqa", ratio, dropout > 0 ? "_dropout" : "",
             tall ? "_L7S5" : "_L5S7");
}

// Every mask, both alignments and none, GQA ratios 1, 2, 4, with and without dropout, L < S and L > S.
const auto kSweep = testing::Combine(testing::Range(0, 5),
                                     testing::Values(Causal::none, Causal::top_left, Causal::bottom_right),
                                     testing::Values(1, 2, 4), testing::Values(0.0, 0.3), testing::Bool());

class ReferenceBackwardFd : public testing::TestWithParam<Param> {};

TEST_P(ReferenceBackwardFd, MatchesCentralDifferences) {
  auto [mask, causal, ratio, dropout, tall] = GetParam();
  set_num_threads(1);  // thousands of tiny forwards: threads would cost more than they bring
  Inputs in = inputs(make(2, 4, 4 / ratio, tall ? 7 : 5, tall ? 5 : 7, 3, 4, mask, causal, dropout), 7);
  const Grads g = reference_grads(in);
  // Central differences: error <= h²/6·|f'''| + ε·Σ|terms of f|/h. Inputs and dout are N(0, 1), so
  // |f'''| per element is O(10) and Σ|terms| is O(100): with h = 1e-5 that is ~2e-10 + ~2e-9. The
  // tolerance 1e-7·(1 + |g|) leaves a margin of ~50 without letting a wrong term (O(1e-2) or more) pass.
  const double h = 1e-5, tol = 1e-7;
  double worst = 0;
  auto check = [&](TensorD& x, const std::vector<double>& grad, const char* what) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double x0 = x.data()[i];
      x.data()[i] = x0 + h;
      const double fp = functional(in);
      x.data()[i] = x0 - h;
      const double fm = functional(in);
      x.data()[i] = x0;
      const double fd = (fp - fm) / (2 * h), got = grad[i];
      worst = std::max(worst, std::abs(fd - got) / (1 + std::abs(got)));
      ASSERT_NEAR(got, fd, tol * (1 + std::abs(got))) << what << " element " << i;
    }
  };
  check(in.q, g.dq, "dq");
  check(in.k, g.dk, "dk");
  check(in.v, g.dv, "dv");
  RecordProperty("worst_relative_error", cat(worst));
}

INSTANTIATE_TEST_SUITE_P(Sweep, ReferenceBackwardFd, kSweep, param_name);

// A row that attends to nothing has output 0 whatever q, k, v are: its dq is 0 and its dout feeds
// nothing, so changing that dout leaves dk and dv as they were. keep mask: the last row keeps nothing;
// bottom-right causal with L > S: the first L - S rows see no key. Grads of the reference in fp64 or flash.
template <typename T>
void expect_zero_gradient_of_masked_rows(BackwardKernel<T> kernel, int64_t L, int64_t S, int64_t D) {
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    Inputs in = inputs(make(1, 2, 1, L, S, D, D, 1, causal, 0.3), 11);
    const Grads g = backward<T>(kernel, in);
    std::vector<int64_t> masked_rows = {L - 1};
    if (causal == Causal::bottom_right)
      for (int64_t l = 0; l < L - S; ++l) masked_rows.push_back(l);
    for (int64_t h = 0; h < in.c.H; ++h)
      for (int64_t l : masked_rows) {
        for (int64_t d = 0; d < D; ++d) EXPECT_EQ(g.dq[(h * L + l) * D + d], 0.0) << "h " << h << " l " << l;
        for (int64_t e = 0; e < D; ++e) in.dout.view().at({0, h, l, e}) = 1e3;
      }
    const Grads g2 = backward<T>(kernel, in);
    EXPECT_EQ(g.dk, g2.dk);
    EXPECT_EQ(g.dv, g2.dv);
  }
}

TEST(ReferenceBackward, FullyMaskedRowsGiveZeroGradient) {
  expect_zero_gradient_of_masked_rows<double>(reference_backward<double>, 7, 5, 3);
}

// Strided gradients: dq written into a (B, L, H, D) buffer viewed as (B, H, L, D), as MHA does, and into
// every other element; the gradients start as NaN, so a backward that added instead of overwriting fails.
TEST(ReferenceBackward, WritesStridedGradients) {
  Case c = make(2, 4, 2, 5, 6, 3, 4, 4, Causal::top_left);
  const Grads want = reference_grads(inputs(c, 3));
  for (int layout : {1, 2}) {
    c.out_layout = layout;
    const Grads got = reference_grads(inputs(c, 3));
    EXPECT_EQ(got.dq, want.dq) << "layout " << layout;
    EXPECT_EQ(got.dk, want.dk) << "layout " << layout;
    EXPECT_EQ(got.dv, want.dv) << "layout " << layout;
  }
}

// ---- flash backward ----

void expect_flash_close(const Case& c, uint64_t seed) { expect_backward_close(flash_backward, inputs(c, seed)); }

class FlashBackward : public testing::TestWithParam<Param> {};

TEST_P(FlashBackward, MatchesFp64ReferenceWithinDerivedTolerance) {
  auto [mask, causal, ratio, dropout, tall] = GetParam();
  // 65 and 129: a full tile plus one row or key, so tails and several KV blocks (dQ chunks) are covered
  expect_flash_close(make(2, 4, 4 / ratio, tall ? 129 : 65, tall ? 65 : 129, 24, 20, mask, causal, dropout), 17);
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashBackward, kSweep, param_name);

// Odd sizes: L, S in 0, 1, 7, 63, 64, 65, 129, 513 and D, Dv in 8, 63, 64, 80, 128.
TEST(FlashBackward, OddSizes) {
  const Case cases[] = {
      make(1, 2, 2, 1, 7, 8, 8),       make(1, 2, 1, 7, 1, 8, 63),     make(2, 4, 2, 63, 65, 64, 64),
      make(1, 2, 2, 64, 64, 128, 128), make(1, 8, 2, 65, 129, 63, 80), make(1, 2, 1, 129, 7, 80, 8),
      make(1, 1, 1, 513, 513, 64, 64, 4, Causal::top_left),
      make(1, 2, 2, 1, 513, 128, 64, 0, Causal::bottom_right),
      make(1, 2, 1, 5, 0, 8, 8),  // no keys: every row fully masked, dq = 0
  };
  for (const Case& c : cases) expect_flash_close(c, 23);
}

TEST(FlashBackward, FullyMaskedRowsGiveZeroGradient) {
  expect_zero_gradient_of_masked_rows<float>(flash_backward, 70, 66, 16);  // bottom-right rows 0..3 see nothing
}

// dQ, dK and dV of got bitwise those of want.
void expect_same_bits(const Grads& got, const Grads& want, const std::string& what) {
  EXPECT_TRUE(test::same_bits(got.dq, want.dq)) << what;
  EXPECT_TRUE(test::same_bits(got.dk, want.dk)) << what;
  EXPECT_TRUE(test::same_bits(got.dv, want.dv)) << what;
}

TEST(FlashBackward, SameBitsForOneTwoAndThreeThreads) {
  const Inputs in = inputs(make(2, 4, 2, 300, 333, 40, 24, 4, Causal::bottom_right, 0.2), 29);
  set_num_threads(1);
  const Grads one = flash_grads(in);
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    expect_same_bits(flash_grads(in), one, cat(threads, " threads"));
  }
  set_num_threads(0);
}

// Q, K, V and dO as (B, L, H, D) buffers viewed as (B, H, L, D), as MultiheadAttention passes them, and
// as every other element: read in place (D = 64) or packed (D = 24), the gradients are bitwise those of
// contiguous inputs.
TEST(FlashBackward, StridedInputsGiveTheSameBits) {
  for (int64_t D : {64, 24}) {
    Case c = make(2, 4, 2, 70, 90, D, D, 0, Causal::top_left);
    const Grads want = flash_grads(inputs(c, 31));
    for (int layout : {1, 2}) {
      c.in_layout = layout;
      expect_same_bits(flash_grads(inputs(c, 31)), want, cat("D ", D, " layout ", layout));
    }
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
    Inputs in = inputs(make(B, H, H, n, n, 16, n, 0, Causal::none, p), 41);
    for (TensorD* eye : {&in.v, &in.dout}) {  // V (B, Hkv, S, Dv) = I, dO (B, H, L, Dv) = I
      std::fill(eye->data(), eye->data() + eye->numel(), 0.0);
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t i = 0; i < n; ++i) eye->data()[(bh * n + i) * n + i] = 1;
    }
    const std::vector<double> out = forward<float>(flash_forward, in).out,
                              weights = forward<float>(reference_forward<float>, in, true).weights,
                              dv = flash_grads(in).dv;
    int64_t dropped = 0;
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t l = 0; l < n; ++l)
        for (int64_t s = 0; s < n; ++s) {
          const double fwd = out[(bh * n + l) * n + s], bwd = dv[(bh * n + s) * n + l];
          const double ref = weights[(bh * n + l) * n + s];
          ASSERT_EQ(fwd == 0, bwd == 0) << "p " << p << " (b, h) " << bh << " l " << l << " s " << s;
          ASSERT_EQ(fwd == 0, ref == 0) << "p " << p << " (b, h) " << bh << " l " << l << " s " << s;
          dropped += fwd == 0;
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
  const Case cases[] = {
      make(2, 4, 2, 129, 65, 24, 20, 1, Causal::top_left, 0.3),
      make(1, 4, 4, 64, 64, 32, 32, 0, Causal::top_left),  // the nanoGPT CPU training shape
      make(2, 8, 2, 65, 129, 63, 80, 4, Causal::bottom_right),
      make(1, 2, 1, 300, 200, 16, 16, 3, Causal::none, 0.1),
  };
  for (const FlashTiles t : {FlashTiles{5, 7}, FlashTiles{256, 512}}) {
    set_flash_backward_tiles(t);
    ASSERT_EQ(flash_backward_tiles(129, 65).keys, t.keys);
    ASSERT_EQ(flash_backward_tiles(129, 65).rows, t.rows);
    SCOPED_TRACE(cat("keys ", t.keys, " rows ", t.rows));
    for (const Case& c : cases) expect_flash_close(c, 43);
  }
  set_flash_backward_tiles({});
  EXPECT_EQ(flash_backward_tiles(129, 65).keys, 65);  // derived again: all of a short S in one block
}

// The query side in phases (the scratch budget forced down to one float, so each phase holds one 16-row
// segment of one query head and dK/dV wait in the caller's buffers between phases) gives bitwise the
// gradients of one phase, for 1 and 2 threads: the phases go head by head within a GQA group, then segment
// by segment, so every sum keeps its order. Several chunks (B·Hkv < 16), dropout, a mask, the causal edge.
TEST(FlashBackward, PhasesOfBoundedScratchGiveTheSameBits) {
  const Inputs in = inputs(make(2, 4, 2, 100, 133, 40, 24, 4, Causal::bottom_right, 0.2), 47);
  const Grads want = flash_grads(in);
  set_flash_backward_tiles({0, 16, 1});
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    expect_same_bits(flash_grads(in), want, cat(threads, " threads"));
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
    expect_flash_close(make(2, 4, 2, 129, 65, 24, 20, 1, Causal::top_left, 0.3), 53);
    expect_flash_close(make(1, 4, 4, 64, 64, 32, 32, 0, Causal::top_left), 53);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// sdpa_backward: every argument's shape is checked, and the error names the argument and both shapes.
TEST(SdpaBackward, ShapeErrorsNameBothShapes) {
  const Case c = make(1, 4, 2, 5, 6, 3, 4);
  const Bound<float> b = inputs(c, 5).bind<float>();
  const SdpaArgs<float>& args = b.args;
  const View<const float> dout = b.dout.view;
  Tensor out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L});
  sdpa(args, SdpaOut<float>{out.view(), {}, lse.view()});
  Tensor dq({c.B, c.H, c.L, c.D}), dk({c.B, c.Hkv, c.S, c.D}), dv({c.B, c.Hkv, c.S, c.Dv});
  const SdpaGrads<float> g{dq.view(), dk.view(), dv.view()};
  sdpa_backward<float>(args, out, lse, dout, g);  // well-formed: no throw

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
  expect_error([&] { sdpa_backward<float>(args, out, lse, wrong_dout, g); }, "dout", "(1, 4, 5, 4)", "(1, 4, 5, 3)");
  expect_error([&] { sdpa_backward<float>(args, out, lse, dout, {g.dq, wrong_dk, g.dv}); }, "dk", "(1, 2, 6, 3)",
               "(1, 4, 6, 3)");
  expect_error([&] { sdpa_backward<float>(args, out, wrong_lse, dout, g); }, "lse", "(1, 4, 5)", "(1, 4, 6)");
  expect_error([&] { sdpa_backward<float>(args, wrong_dout, lse, dout, g); }, "out", "(1, 4, 5, 4)", "(1, 4, 5, 3)");
  expect_error([&] { sdpa_backward<float>(args, out, {}, dout, g); }, "lse", "(B, H, L)", "nothing");
}

// sdpa_backward runs what sdpa would: flash for float32, the reference for fp64 or on request; strict
// refuses the fp64 fallback and explicit flash refuses fp64.
TEST(SdpaBackward, ChoosesTheBackendAsTheForward) {
  const Case c = make(1, 4, 2, 33, 40, 16, 8, 2, Causal::top_left, 0.1);
  const Inputs in = inputs(c, 8);
  // sdpa_backward with options, as a kernel of the harness
  static SdpaOptions options;
  BackwardKernel<float> via_sdpa = [](const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g) {
    sdpa_backward<float>(p.args, p.out.out, p.out.lse, dout, g, options);
  };
  options = {};
  EXPECT_EQ(backward<float>(via_sdpa, in).dq, flash_grads(in).dq);
  options = {Backend::reference};
  EXPECT_EQ(backward<float>(via_sdpa, in).dk, backward<float>(reference_backward<float>, in).dk);

  const Bound<double> b = in.bind<double>();
  TensorD out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L});
  sdpa(b.args, SdpaOut<double>{out.view(), {}, lse.view()});
  TensorD dq({c.B, c.H, c.L, c.D}), dk({c.B, c.Hkv, c.S, c.D}), dv({c.B, c.Hkv, c.S, c.Dv});
  const SdpaGrads<double> g{dq.view(), dk.view(), dv.view()};
  sdpa_backward<double>(b.args, out, lse, b.dout.view, g);  // automatic: the reference
  EXPECT_THROW(sdpa_backward<double>(b.args, out, lse, b.dout.view, g, {Backend::automatic, true}), Error);
  EXPECT_THROW(sdpa_backward<double>(b.args, out, lse, b.dout.view, g, {Backend::flash}), Error);
}

}  // namespace
