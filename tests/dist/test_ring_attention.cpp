// Ring attention on 2, 3 and 4 ranks (ctest runs this program under scripts/mpirun-local -np 2/3/4):
// forward and backward against the single-process flash kernel and the fp64 reference, causal and not,
// GQA, both layouts, lengths that do not divide by N or 2N (and parts of 0 rows), a key padding mask
// with fully masked rows (zero policy), the same bits for any thread count, the layouts themselves, and
// bad input: the same attn::Error on every rank, no hang. Every rank builds the whole problem from one
// seed, runs its own rows through the ring and checks them against its rows of the single-process result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "../sdpa_harness.h"
#include "../test_util.h"
#include "attn/ring_attention.h"
#include "attn/threads.h"

using namespace attn;
using namespace attn::test;

namespace {

// Absolute slack of the forward's tolerance rule: the harness's (tests/sdpa_harness.h), doubled. The
// ring's merge adds two exps, a division and a log per row: a few ulp more than flash alone.
constexpr double kRingAtolOut = 2 * kAtolOut;
constexpr double kRingAtolLse = 2 * kAtolLse;

struct Config {
  int64_t B = 2, H = 4, Hkv = 2, L = 37, D = 16, Dv = 8;
  Causal causal = Causal::none;
  bool padding = false;
  RingLayout layout = RingLayout::zigzag;
};

std::string describe(const Config& c) {
  return cat("B ", c.B, " H ", c.H, " Hkv ", c.Hkv, " L ", c.L, " D ", c.D, " Dv ", c.Dv, " causal ",
             c.causal == Causal::none ? "none" : "top_left", c.padding ? " padding" : "", " ", to_string(c.layout),
             " on rank ", dist::rank(), " of ", dist::size());
}

// The whole problem, the same on every rank: the harness's inputs of self-attention (S = L). Key padding
// (B, L), true = masked out: batch 0 masks ~25% of the keys and key 0 (so under causal masking query 0
// sees nothing); batch 1 masks every key (every row fully masked).
Inputs problem(const Config& c, uint64_t seed) {
  Case k;
  k.B = c.B, k.H = c.H, k.Hkv = c.Hkv, k.L = k.S = c.L, k.D = c.D, k.Dv = c.Dv, k.causal = c.causal, k.seed = seed;
  if (c.padding) k.padding = drop();
  Inputs in(k);
  if (c.padding)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = 0; s < c.L; ++s) in.padding[b * c.L + s] = b == 1 || s == 0 || in.padding[b * c.L + s];
  return in;
}

// Single process, whole sequence: out, lse and the gradients of sum(dout ∘ out), through one kernel pair.
struct Single {
  Forward f;
  Grads g;
};
template <typename T>
Single single(const Inputs& in, ForwardKernel<T> fwd, BackwardKernel<T> bwd) {
  return {forward<T>(fwd, in), backward<T>(bwd, in)};
}

// out (B, H, L, Dv), lse (B, H, L), and the gradients of sum(dout ∘ out), of this rank's rows.
struct Result {
  Tensor out, lse, dq, dk, dv;
  Result(int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t D, int64_t Dv)
      : out({B, H, L, Dv}), lse({B, H, L}), dq({B, H, L, D}), dk({B, Hkv, L, D}), dv({B, Hkv, L, Dv}) {}
  SdpaGrads<float> grads() { return {dq.view(), dk.view(), dv.view()}; }
};

// This rank's rows, through the ring: local inputs taken from the whole problem.
struct Ring {
  Result local;
  RingStats fwd, bwd;
  Ring(const Config& c, const Inputs& in)
      : local(c.B, c.H, c.Hkv, ring_local_length(c.L, dist::rank(), dist::size(), c.layout), c.D, c.Dv) {
    const int r = dist::rank(), n = dist::size();
    const int64_t Lr = local.out.size(2);
    const Bound<float> whole = in.bind<float>();
    Tensor q({c.B, c.H, Lr, c.D}), k({c.B, c.Hkv, Lr, c.D}), v({c.B, c.Hkv, Lr, c.Dv}), dout({c.B, c.H, Lr, c.Dv});
    TensorT<uint8_t> pad({c.B, Lr});
    ring_take<float>(whole.q.view, q, 2, r, n, c.layout);
    ring_take<float>(whole.k.view, k, 2, r, n, c.layout);
    ring_take<float>(whole.v.view, v, 2, r, n, c.layout);
    ring_take<float>(whole.dout.view, dout, 2, r, n, c.layout);
    SdpaArgs<float> a{q, k, v};
    a.causal = c.causal;
    if (c.padding) {
      ring_take<uint8_t>(whole.pad_bools.view, pad, 1, r, n, c.layout);
      a.key_padding = Mask<float>::drop(pad.view());
    }
    ring_sdpa(a, SdpaOut<float>{local.out.view(), {}, local.lse.view()}, dist::world(), c.layout, &fwd);
    ring_sdpa_backward(a, local.out.view(), local.lse.view(), dout.view(), local.grads(), dist::world(), c.layout,
                       &bwd);
  }
};

// This rank's rows of a whole tensor of `shape` (sequence dim 2) given in index order.
std::vector<double> mine(const std::vector<double>& full, Shape shape, RingLayout layout) {
  if (shape.size() == 3) shape.push_back(1);
  Shape s = shape;
  s[2] = ring_local_length(s[2], dist::rank(), dist::size(), layout);
  TensorD local(s);
  ring_take<double>(View<const double>(full.data(), shape), local, 2, dist::rank(), dist::size(), layout);
  return std::vector<double>(local.data(), local.data() + local.numel());
}

std::vector<double> widen(const Tensor& t) { return std::vector<double>(t.data(), t.data() + t.numel()); }

// max |a − b| over the elements; equal infinities (LSE −inf of a fully masked row) count as 0, any
// other infinity or NaN as +inf.
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    const double d = std::abs(a[i] - b[i]);
    m = std::max(m, std::isnan(d) ? kInf : d);
  }
  return m;
}

// FlashAttention's rule twice: the ring's error against fp64 is at most 2x the plain fp32 reference's
// error plus atol (the harness's rule, every fast kernel's), and its distance from the single-process
// flash kernel is at most 2x flash's own error plus atol (the ring is the flash kernel with its keys in
// other blocks and merged in another order: that may move the result by about flash's error, not more).
void expect_ring_close(const char* what, const std::vector<double>& ring, const std::vector<double>& flash,
                       const std::vector<double>& ref32, const std::vector<double>& truth, double atol) {
  expect_close(what, ring, ref32, truth, atol);
  const double apart = max_diff(ring, flash), flash_err = max_diff(flash, truth);
  EXPECT_LE(apart, 2 * flash_err + atol) << what << ": ring - flash " << apart << ", flash error " << flash_err;
}

void expect_ring_matches(const Config& c, uint64_t seed = 17) {
  SCOPED_TRACE(describe(c));
  const Inputs in = problem(c, seed);
  const Single flash = single<float>(in, flash_forward, flash_backward),
               ref32 = single<float>(in, reference_forward<float>, reference_backward<float>),
               truth = single<double>(in, reference_forward<double>, reference_backward<double>);
  const Ring ring(c, in);
  const RingLayout lay = c.layout;
  const Shape o = {c.B, c.H, c.L, c.Dv}, l = {c.B, c.H, c.L}, q = {c.B, c.H, c.L, c.D}, k = {c.B, c.Hkv, c.L, c.D},
              v = {c.B, c.Hkv, c.L, c.Dv};
  auto fwd = [&](const char* what, const Tensor& got, std::vector<double> Forward::*m, const Shape& shape,
                 double atol) {
    expect_ring_close(what, widen(got), mine(flash.f.*m, shape, lay), mine(ref32.f.*m, shape, lay),
                      mine(truth.f.*m, shape, lay), atol);
  };
  auto bwd = [&](const char* what, const Tensor& got, std::vector<double> Grads::*m, const Shape& shape, double atol) {
    expect_ring_close(what, widen(got), mine(flash.g.*m, shape, lay), mine(ref32.g.*m, shape, lay),
                      mine(truth.g.*m, shape, lay), atol);
  };
  fwd("out", ring.local.out, &Forward::out, o, kRingAtolOut);
  fwd("lse", ring.local.lse, &Forward::lse, l, kRingAtolLse);
  // Backward atol: the harness's, of this rank's rows of the fp64 gradients.
  const double atol = backward_atol({mine(truth.g.dq, q, lay), mine(truth.g.dk, k, lay), mine(truth.g.dv, v, lay)});
  bwd("dq", ring.local.dq, &Grads::dq, q, atol);
  bwd("dk", ring.local.dk, &Grads::dk, k, atol);
  bwd("dv", ring.local.dv, &Grads::dv, v, atol);
  // The zero policy, exactly: where the fp64 reference has a fully masked row (LSE −inf), the ring's out
  // and dq are 0 and its LSE is −inf.
  const std::vector<double> lse64 = mine(truth.f.lse, l, lay), out = widen(ring.local.out), dq = widen(ring.local.dq);
  int64_t masked = 0;
  for (size_t row = 0; row < lse64.size(); ++row) {
    if (lse64[row] != -kInf) continue;
    ++masked;
    EXPECT_EQ(ring.local.lse.data()[row], -kInf) << "row " << row;
    for (int64_t e = 0; e < c.Dv; ++e) EXPECT_EQ(out[row * c.Dv + e], 0.0) << "row " << row;
    for (int64_t d = 0; d < c.D; ++d) EXPECT_EQ(dq[row * c.D + d], 0.0) << "row " << row;
  }
  if (c.padding && c.B > 1) {
    EXPECT_GT(masked, 0) << "the padding should leave fully masked rows";
  }
}

using Param = std::tuple<Causal, RingLayout, int /* H / Hkv */, bool /* padding */>;
class RingAttention : public testing::TestWithParam<Param> {};

TEST_P(RingAttention, MatchesFlashAndFp64Reference) {
  auto [causal, layout, ratio, padding] = GetParam();
  // L = 67: not a multiple of 2, 3, 4 or of 2N, so parts differ by a row
  Config c;
  c.H = 4, c.Hkv = 4 / ratio, c.L = 67, c.causal = causal, c.padding = padding, c.layout = layout;
  expect_ring_matches(c);
}

std::string param_name(const testing::TestParamInfo<Param>& info) {
  auto [causal, layout, ratio, padding] = info.param;
  return cat(causal == Causal::none ? "full" : "causal", "_", to_string(layout), "_gqa", ratio,
             padding ? "_padding" : "");
}

INSTANTIATE_TEST_SUITE_P(Sweep, RingAttention,
                         testing::Combine(testing::Values(Causal::none, Causal::top_left),
                                          testing::Values(RingLayout::zigzag, RingLayout::contiguous),
                                          testing::Values(1, 2, 4), testing::Bool()),
                         param_name);

// Lengths with empty parts (fewer rows than 2N), a single row, several flash tiles per block, head
// dims that are not multiples of the SIMD width, and D != Dv.
TEST(RingAttention, OddSizes) {
  const Config configs[] = {
      {1, 2, 1, 1, 8, 8, Causal::top_left, false, RingLayout::zigzag},
      {1, 2, 2, 2, 8, 8, Causal::none, false, RingLayout::contiguous},  // 3 and 4 ranks: a rank of 0 rows
      {1, 2, 1, 5, 8, 8, Causal::top_left, true, RingLayout::zigzag},
      {2, 4, 1, 7, 63, 80, Causal::top_left, true, RingLayout::zigzag},
      {1, 8, 2, 333, 64, 64, Causal::top_left, true, RingLayout::zigzag},
      {1, 2, 2, 301, 24, 40, Causal::none, false, RingLayout::contiguous},
  };
  for (const Config& c : configs) expect_ring_matches(c, 23);
}

// bottom_right is top_left when L = S: the ring accepts it as such.
TEST(RingAttention, BottomRightIsTopLeftInSelfAttention) {
  Config c;
  c.causal = Causal::bottom_right;
  expect_ring_matches(c);
}

// The merge and the dK/dV sums have a fixed order, and the flash kernel gives the same bits for any
// thread count: so does the ring.
TEST(RingAttention, SameBitsForOneAndTwoThreads) {
  Config c;
  c.L = 201, c.causal = Causal::top_left, c.padding = true, c.D = 32, c.Dv = 32;
  const Inputs in = problem(c, 5);
  set_num_threads(1);
  const Ring one(c, in);
  set_num_threads(2);
  const Ring two(c, in);
  set_num_threads(0);
  for (auto [a, b] : {std::pair{&one.local.out, &two.local.out}, {&one.local.lse, &two.local.lse},
                      {&one.local.dq, &two.local.dq}, {&one.local.dk, &two.local.dk}, {&one.local.dv, &two.local.dv}})
    EXPECT_TRUE(test::same_bits(*a, *b));
}

// What travels: the forward sends N − 1 K/V blocks (each rank's own first, then what it received); the
// backward sends as many and the N dK/dV accumulators of the blocks it held. Bytes of fp32 K and V.
TEST(RingAttention, SendsEachBlockOnce) {
  Config c;
  c.L = 67;
  const int r = dist::rank(), n = dist::size();
  const Ring ring(c, problem(c, 3));
  int64_t kv = 0, acc = 0;  // bytes of the blocks this rank passes on, and of the accumulators
  for (int t = 0; t < n; ++t) {
    const int64_t rows = ring_local_length(c.L, (r - t + n) % n, n, c.layout);
    const int64_t bytes = 4 * c.B * c.Hkv * rows * (c.D + c.Dv);
    if (t + 1 < n) kv += bytes;
    acc += bytes;
  }
  EXPECT_EQ(ring.fwd.sent_bytes, kv);
  EXPECT_EQ(ring.bwd.sent_bytes, kv + acc);
  EXPECT_GT(ring.fwd.scratch_bytes, 0);
}

// ---- The layouts ----

TEST(RingLayout, RanksCoverTheSequenceOnceAndZigzagBalancesCausalWork) {
  const int n = dist::size();
  for (RingLayout layout : {RingLayout::zigzag, RingLayout::contiguous})
    for (int64_t L : {0, 1, 5, 67, 4096, 4099}) {
      std::vector<int> seen(size_t(L), 0);
      std::vector<int64_t> pairs;  // causal (query, key) pairs each rank computes
      for (int r = 0; r < n; ++r) {
        int64_t causal_pairs = 0;
        for (const RowRange& g : ring_rows(L, r, n, layout)) {
          for (int64_t i = g.begin; i < g.begin + g.size; ++i) ++seen[size_t(i)];
          causal_pairs += g.size * g.begin + g.size * (g.size + 1) / 2;  // query l sees keys 0..l
        }
        pairs.push_back(causal_pairs);
      }
      for (int64_t i = 0; i < L; ++i) ASSERT_EQ(seen[size_t(i)], 1) << to_string(layout) << " L " << L << " row " << i;
      const auto [lo, hi] = std::minmax_element(pairs.begin(), pairs.end());
      // zigzag: parts differ by at most a row, so ranks differ by at most ~2 rows of pairs (2·L)
      if (layout == RingLayout::zigzag) {
        EXPECT_LE(*hi - *lo, 2 * L + 2) << "L " << L;
      } else if (L >= 4096 && n > 1) {  // contiguous: the last rank sees (n - 1)/n² of all pairs more than rank 0
        EXPECT_GT(*hi - *lo, L * L / (4 * n)) << "L " << L;
      }
    }
}

TEST(RingLayout, TakeAndPutRoundTrip) {
  const int r = dist::rank(), n = dist::size();
  Tensor full({2, 3, 29, 5}), back({2, 3, 29, 5});
  for (int64_t i = 0; i < full.numel(); ++i) full.data()[i] = float(i);
  for (RingLayout layout : {RingLayout::zigzag, RingLayout::contiguous})
    for (int p = 0; p < n; ++p) {  // every rank's part, so back is whole again
      Tensor local({2, 3, ring_local_length(29, p, n, layout), 5});
      ring_take<float>(full, local, 2, p, n, layout);
      if (p == r) {
        EXPECT_EQ(local.data()[0], full.data()[ring_rows(29, p, n, layout)[0].begin * 5]);
      }
      ring_put<float>(local, back, 2, p, n, layout);
    }
  EXPECT_TRUE(test::same_bits(full, back));
  Tensor wrong({2, 3, 4, 5});
  EXPECT_NE(test::error_of([&] { ring_take<float>(full, wrong, 2, r, n, RingLayout::zigzag); }).find("Expected"),
            std::string::npos);
}

// ---- Bad input: the same error on every rank, and no rank left waiting ----

// Runs ring_sdpa on this rank's slice of c, with `edit` changing this rank's arguments first; returns the
// error message ("" if none).
template <typename F>
std::string ring_error(const Config& c, F&& edit) {
  const int r = dist::rank(), n = dist::size();
  const int64_t Lr = ring_local_length(c.L, r, n, c.layout);
  Tensor q({c.B, c.H, Lr, c.D}), k({c.B, c.Hkv, Lr, c.D}), v({c.B, c.Hkv, Lr, c.Dv}), out({c.B, c.H, Lr, c.Dv});
  SdpaArgs<float> a{q, k, v};
  a.causal = c.causal;
  SdpaOut<float> o{out};
  Tensor q2({c.B, c.H, Lr, c.D + 1}), out2({c.B, c.H, Lr + 1, c.Dv});  // wrong shapes, for `edit`
  Tensor mask({c.L, c.L});
  edit(a, o, q2, out2, mask);
  return test::error_of([&] { ring_sdpa(a, o, dist::world(), c.layout); });
}

// Every rank must have thrown, and rank 0's message must be every rank's (they decide from the same data).
void expect_same_error_everywhere(const std::string& msg, const std::string& contains) {
  EXPECT_NE(msg.find(contains), std::string::npos) << "rank " << dist::rank() << ": " << msg;
  int len = int(msg.size()), len0 = len;
  MPI_Bcast(&len0, 1, MPI_INT, 0, dist::world());
  std::string msg0 = dist::rank() == 0 ? msg : std::string(size_t(len0), ' ');
  MPI_Bcast(msg0.data(), len0, MPI_CHAR, 0, dist::world());
  EXPECT_EQ(msg, msg0) << "rank " << dist::rank();
}

TEST(RingAttentionErrors, MismatchedHeadDimOnOneRank) {
  Config c;
  const int last = dist::size() - 1;
  const std::string msg = ring_error(c, [&](SdpaArgs<float>& a, SdpaOut<float>&, Tensor& q2, Tensor&, Tensor&) {
    if (dist::rank() == last) a.q = q2, a.k = q2.view().narrow(1, 0, c.Hkv);  // D + 1 on this rank alone
  });
  expect_same_error_everywhere(msg, cat("on rank ", last));
  EXPECT_NE(msg.find("Expected the same B, H, Hkv, D and Dv"), std::string::npos) << msg;
}

TEST(RingAttentionErrors, ALocalErrorOnOneRankReachesEveryRank) {
  Config c;
  const int last = dist::size() - 1;
  const std::string msg = ring_error(c, [&](SdpaArgs<float>&, SdpaOut<float>& o, Tensor&, Tensor& out2, Tensor&) {
    if (dist::rank() == last) o.out = out2;
  });
  expect_same_error_everywhere(msg, cat("rank ", last, " of ", dist::size(), ": Expected out of shape"));
}

TEST(RingAttentionErrors, RowsThatAreNotTheLayouts) {
  // A length whose contiguous and zigzag parts differ on some rank: each rank passes its contiguous rows
  // to a zigzag ring.
  const int n = dist::size();
  int64_t L = 1;
  auto differs = [&](int64_t len) {
    for (int r = 0; r < n; ++r)
      if (ring_local_length(len, r, n, RingLayout::contiguous) != ring_local_length(len, r, n, RingLayout::zigzag))
        return true;
    return false;
  };
  while (!differs(L)) ++L;
  Config c;
  c.L = L, c.layout = RingLayout::contiguous;
  const std::string msg = test::error_of([&] {
    const int64_t Lr = ring_local_length(c.L, dist::rank(), n, RingLayout::contiguous);
    Tensor q({c.B, c.H, Lr, c.D}), k({c.B, c.Hkv, Lr, c.D}), v({c.B, c.Hkv, Lr, c.Dv}), out({c.B, c.H, Lr, c.Dv});
    ring_sdpa(SdpaArgs<float>{q, k, v}, SdpaOut<float>{out}, dist::world(), RingLayout::zigzag);
  });
  expect_same_error_everywhere(msg, "rows of the zigzag layout of L = ");
}

TEST(RingAttentionErrors, WhatTheRingDoesNotDo) {
  Config c;
  const std::string mask = ring_error(c, [](SdpaArgs<float>& a, SdpaOut<float>&, Tensor&, Tensor&, Tensor& m) {
    a.attn_mask = Mask<float>::additive(m.view());
  });
  expect_same_error_everywhere(mask, "Expected no attn_mask in ring attention");
  const std::string drop = ring_error(c, [](SdpaArgs<float>& a, SdpaOut<float>&, Tensor&, Tensor&, Tensor&) {
    a.dropout_p = 0.1;
  });
  expect_same_error_everywhere(drop, "Expected dropout_p = 0");
  // Backward: a dq of the wrong shape on rank 0 only
  const int r = dist::rank(), n = dist::size();
  const int64_t Lr = ring_local_length(c.L, r, n, c.layout);
  Tensor q({c.B, c.H, Lr, c.D}), k({c.B, c.Hkv, Lr, c.D}), v({c.B, c.Hkv, Lr, c.Dv}), out({c.B, c.H, Lr, c.Dv}),
      lse({c.B, c.H, Lr}), dq({c.B, c.H, Lr, r == 0 ? c.D + 1 : c.D}), dk({c.B, c.Hkv, Lr, c.D}),
      dv({c.B, c.Hkv, Lr, c.Dv});
  const std::string bwd = test::error_of([&] {
    ring_sdpa_backward({q, k, v}, out, lse, out, {dq, dk, dv}, dist::world(), c.layout);
  });
  expect_same_error_everywhere(bwd, "rank 0 of ");
  EXPECT_NE(bwd.find("Expected dq of shape"), std::string::npos) << bwd;
}

}  // namespace
