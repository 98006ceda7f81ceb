// Tests of the attention variants (issue 37): sliding windows, ALiBi, softcap, T5's relative bias and
// packed documents (ids and varlen cu_seqlens), alone and combined with GQA, masks, padding, causal
// alignments and dropout.
// - SdpaProblem's key ranges against a brute-force reading of FlashAttention 2's definitions, and
//   queries() as the exact inverse of keys();
// - the reference against an independent fp64 formula (the oracle's oracle);
// - flash forward, backward (with the relative bias's table gradient) and decode against the fp64
//   reference by the tolerance rule;
// - skipping is exact: flash with a window or documents gives bitwise the result of flash with the same
//   visibility as a dense bool mask, fp32 and bf16, and keys no query can see are never read;
// - refusals name the argument and both shapes.
// Not the speed (bench/) and not the Python / PyTorch parity (tests/python/test_variants.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "attn/sdpa.h"
#include "attn/train.h"  // fnv1a64
#include "sdpa_harness.h"
#include "test_util.h"

namespace attn {
namespace {

using namespace attn::test;

// ---- Semantics: key ranges ----

// Does query l see key s? Read straight from the definitions: both in one document (of lengths Lg, Sg),
// at local positions l', s'; causal top-left s' <= l', bottom-right s' <= l' + Sg - Lg; the window
// l' + Sg - Lg - left <= s' <= l' + Sg - Lg + right.
bool sees(const Case& c, int64_t l, int64_t s) {
  int64_t q0 = 0, q1 = c.L, k0 = 0, k1 = c.S;
  if (!c.docs.empty()) {
    const std::vector<int64_t>& dk = c.docs_k.empty() ? c.docs : c.docs_k;
    bool found = false;
    for (size_t i = 0, qa = 0, ka = 0; i < c.docs.size() && !found; qa += size_t(c.docs[i]), ka += size_t(dk[i]), ++i)
      if (int64_t(qa) <= l && l < int64_t(qa) + c.docs[i]) {
        q0 = int64_t(qa), q1 = q0 + c.docs[i], k0 = int64_t(ka), k1 = k0 + dk[i], found = true;
      }
    if (s < k0 || s >= k1) return false;
  }
  const int64_t lp = l - q0, sp = s - k0, off = (k1 - k0) - (q1 - q0);
  if (c.causal == Causal::top_left && sp > lp) return false;
  if (c.causal == Causal::bottom_right && sp > lp + off) return false;
  if (c.window.left >= 0 && sp < lp + off - c.window.left) return false;
  if (c.window.right >= 0 && sp > lp + off + c.window.right) return false;
  return true;
}

std::vector<Case> range_cases() {
  std::vector<Case> cs;
  for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
    for (Window w : {Window{}, Window{3, 0}, Window{0, 2}, Window{2, 5}, Window{-1, 1}, Window{4, -1}, Window{0, 0}}) {
      for (auto [L, S] : {std::pair<int64_t, int64_t>{9, 9}, {5, 12}, {12, 5}, {1, 17}}) {
        Case c;
        c.L = L, c.S = S, c.causal = causal, c.window = w;
        cs.push_back(c);
      }
      Case d;  // documents by ids, self-attention
      d.B = 2, d.L = d.S = 20, d.causal = causal, d.window = w, d.docs = {6, 1, 9, 4};
      cs.push_back(d);
      Case v;  // varlen: other lengths for keys, an empty document of each side
      v.L = 14, v.S = 21, v.causal = causal, v.window = w, v.docs = {4, 0, 7, 3}, v.docs_k = {6, 5, 0, 10};
      cs.push_back(v);
    }
  return cs;
}

TEST(Variants, KeyRangesAreTheDefinitionAndQueriesTheirInverse) {
  for (const Case& c : range_cases()) {
    SCOPED_TRACE(c.name());
    const Bound<float> b = Inputs(c).bind<float>();
    Tensor out({c.B, c.H, c.L, c.Dv});
    const SdpaProblem<float> p = make_problem(b.args, SdpaOut<float>{out.view(), {}, {}});
    for (int64_t bb = 0; bb < c.B; ++bb) {
      Range prev{0, 0};
      for (int64_t l = 0; l < c.L; ++l) {
        const Range r = p.keys(bb, l);
        for (int64_t s = 0; s < c.S; ++s)
          ASSERT_EQ(s >= r.begin && s < r.end, sees(c, l, s)) << "l " << l << " s " << s;
        EXPECT_GE(r.begin, prev.begin) << "keys() must not decrease, l " << l;
        EXPECT_GE(r.end, prev.end) << "keys() must not decrease, l " << l;
        prev = r;
      }
      for (int64_t s = 0; s < c.S; ++s) {
        const Range r = p.queries(bb, s);
        for (int64_t l = 0; l < c.L; ++l)
          ASSERT_EQ(l >= r.begin && l < r.end, sees(c, l, s)) << "l " << l << " s " << s;
      }
    }
  }
}

// transformers' T5 buckets (values printed by T5Attention._relative_position_bucket, transformers 5.24,
// num_buckets 32, max_distance 128, for the distances below).
TEST(Variants, RelativeBucketsAreT5s) {
  const int64_t d[] = {-200, -128, -100, -64, -33, -16, -9, -8, -7, -1, 0, 1, 7, 8, 9, 16, 33, 64, 100, 128, 200};
  const int64_t bi[] = {15, 15, 15, 14, 12, 10, 8, 8, 7, 1, 0, 17, 23, 24, 24, 26, 28, 30, 31, 31, 31};
  const int64_t uni[] = {31, 31, 30, 26, 21, 16, 9, 8, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < std::size(d); ++i) {
    EXPECT_EQ(relative_position_bucket(d[i], true, 32, 128), bi[i]) << "bidirectional d " << d[i];
    EXPECT_EQ(relative_position_bucket(d[i], false, 32, 128), uni[i]) << "causal d " << d[i];
  }
}

// ---- The reference against an independent fp64 formula ----

// out (B, H, L, Dv) of one case from the definitions alone: x = softcap·tanh(scale·q·k/softcap), + ALiBi
// -slope·|s' - l' - (Sg - Lg)|, + table[bucket(s' - l' - (Sg - Lg)), h], + masks (none here), -inf where
// the query does not see the key; softmax; · V.
std::vector<double> formula(const Inputs& in) {
  const Case& c = in.c;
  std::vector<double> out;
  const double scale = 1 / std::sqrt(double(c.D));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l) {
        std::vector<double> x(size_t(c.S), -kInf);
        double m = -kInf;
        for (int64_t s = 0; s < c.S; ++s) {
          if (!sees(c, l, s)) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d)
            dot += in.q.data()[((b * c.H + h) * c.L + l) * c.D + d] *
                   in.k.data()[((b * c.Hkv + h / (c.H / c.Hkv)) * c.S + s) * c.D + d];
          double v = dot * scale;
          if (c.softcap > 0) v = c.softcap * std::tanh(v / c.softcap);
          // the distance within the document: s - l - (k1 - q1), k1 and q1 its ends
          int64_t q1 = c.L, k1 = c.S;
          if (!c.docs.empty()) {
            const std::vector<int64_t>& dk = c.docs_k.empty() ? c.docs : c.docs_k;
            int64_t qa = 0, ka = 0;
            for (size_t i = 0; i < c.docs.size(); ++i) {
              qa += c.docs[i], ka += dk[i];
              if (l < qa) {
                q1 = qa, k1 = ka;
                break;
              }
            }
          }
          const int64_t dist = s - l - (k1 - q1);
          if (c.alibi) v += -in.slopes[size_t((c.alibi == 2 ? b * c.H : 0) + h)] * double(std::abs(dist));
          if (c.rel_buckets)
            v += in.table[size_t(
                relative_position_bucket(dist, c.rel_bidirectional, c.rel_buckets, c.rel_max_distance) * c.H + h)];
          x[size_t(s)] = v, m = std::max(m, v);
        }
        double sum = 0;
        for (double& v : x) sum += (v = m == -kInf ? 0 : std::exp(v - m));
        for (int64_t e = 0; e < c.Dv; ++e) {
          double o = 0;
          for (int64_t s = 0; s < c.S; ++s)
            o += x[size_t(s)] / (m == -kInf ? 1 : sum) *
                 in.v.data()[((b * c.Hkv + h / (c.H / c.Hkv)) * c.S + s) * c.Dv + e];
          out.push_back(o);
        }
      }
  return out;
}

std::vector<Case> mod_cases() {
  std::vector<Case> cs;
  Case c;
  c.B = 2, c.H = 4, c.Hkv = 2, c.L = 13, c.S = 13, c.D = 16, c.Dv = 8;
  for (int alibi : {0, 1, 2})
    for (double cap : {0.0, 2.5})
      for (int64_t rel : {0, 8}) {
        Case x = c;
        x.alibi = alibi, x.softcap = cap, x.rel_buckets = rel;
        x.window = alibi == 1 ? Window{4, 0} : Window{};
        x.causal = rel && cap > 0 ? Causal::bottom_right : Causal::none;
        x.rel_bidirectional = x.causal == Causal::none;
        x.docs = alibi == 2 ? std::vector<int64_t>{5, 8} : std::vector<int64_t>{};
        cs.push_back(x);
      }
  Case v = c;  // varlen with every modification
  v.B = 1, v.L = 11, v.S = 17, v.docs = {3, 8}, v.docs_k = {9, 8}, v.alibi = 1, v.softcap = 3, v.rel_buckets = 6;
  v.rel_bidirectional = false, v.causal = Causal::bottom_right, v.window = Window{5, 0};
  cs.push_back(v);
  return cs;
}

TEST(Variants, ReferenceIsTheFormula) {
  for (const Case& c : mod_cases()) {
    SCOPED_TRACE(c.name());
    const Inputs in(c);
    const Forward got = forward<double>(reference_forward<double>, in);
    const std::vector<double> want = formula(in);
    ASSERT_EQ(got.out.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got.out[i], want[i], 1e-12) << "element " << i;
  }
}

// ---- Flash against the fp64 reference ----

std::vector<Case> sweep() {
  std::vector<Case> cs;
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1}, {7, 7}, {63, 65}, {65, 63}, {129, 129}, {300, 513}, {513, 300}};
  int i = 0;
  for (auto [L, S] : sizes)
    for (Window w : {Window{16, 0}, Window{40, 40}, Window{0, 7}, Window{-1, 3}}) {
      Case c;
      c.L = L, c.S = S, c.window = w, c.seed = uint64_t(++i);
      c.H = 4, c.Hkv = i % 2 ? 2 : 4;
      c.D = i % 3 == 0 ? 63 : 64, c.Dv = i % 3 == 0 ? 80 : 64;
      c.causal = i % 3 == 0 ? Causal::none : i % 3 == 1 ? Causal::top_left : Causal::bottom_right;
      c.alibi = i % 4 == 1 ? 1 : i % 4 == 3 ? 2 : 0;
      c.softcap = i % 5 == 2 ? 1.5 : 0;
      c.rel_buckets = i % 6 == 4 ? 12 : 0, c.rel_bidirectional = c.causal == Causal::none;
      if (i % 7 == 3) c.mask = additive(), c.masked = 0.1;
      if (i % 7 == 5) c.padding = drop(), c.masked = 0.2;
      if (i % 9 == 4) c.dropout_p = 0.25;
      cs.push_back(c);
    }
  // documents: ids (B = 2), and varlen with other key lengths, with and without causal
  for (Causal causal : {Causal::none, Causal::top_left}) {
    Case d;
    d.B = 2, d.H = 4, d.Hkv = 1, d.L = d.S = 600, d.D = d.Dv = 32, d.causal = causal;
    d.docs = {100, 1, 255, 244}, d.alibi = 1, d.seed = 77;
    cs.push_back(d);
    Case v;
    v.B = 1, v.H = 2, v.Hkv = 2, v.L = 400, v.S = 700, v.D = v.Dv = 64, v.causal = causal;
    v.docs = {150, 0, 250}, v.docs_k = {300, 100, 300}, v.softcap = 4, v.rel_buckets = 16, v.seed = 78;
    v.rel_bidirectional = causal == Causal::none;
    cs.push_back(v);
  }
  return cs;
}

TEST(Variants, FlashForwardIsWithinTheRule) {
  for (const Case& c : sweep()) expect_forward_close(flash_forward, c);
}

TEST(Variants, FlashBackwardIsWithinTheRule) {
  for (const Case& c : sweep()) {
    if (c.L * c.S > 200 * 1000) continue;  // the fp64 reference backward is slow; the bits tests cover the rest
    expect_backward_close(flash_backward, c);
  }
}

// Decoding shapes (few query rows, long S) run flash_decode: windows and position biases there too.
TEST(Variants, DecodeIsWithinTheRule) {
  for (int i = 0; i < 6; ++i) {
    Case c;
    c.H = 8, c.Hkv = 2, c.L = i % 2 ? 1 : 3, c.S = 3000, c.D = c.Dv = 64, c.causal = Causal::bottom_right;
    c.window = i < 2 ? Window{1000, 0} : i < 4 ? Window{100, 0} : Window{};
    c.alibi = i % 3 == 0 ? 1 : 0, c.softcap = i % 3 == 1 ? 2 : 0, c.rel_buckets = i % 3 == 2 ? 32 : 0;
    c.rel_bidirectional = false, c.rel_max_distance = 500, c.seed = uint64_t(i + 100);
    expect_forward_close(flash_forward, c);
  }
}

// ---- Skipping is exact ----

// The case's visibility (window, documents, causal) as a dense keep mask (B, 1, L, S), the case without them.
Inputs as_dense_mask(const Inputs& in) {
  Inputs d = in.clone();
  Case& c = d.c;
  c.mask = keep({c.B, 1, c.L, c.S});
  d.mask.assign(size_t(c.B * c.L * c.S), 0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t l = 0; l < c.L; ++l)
      for (int64_t s = 0; s < c.S; ++s) d.mask[size_t((b * c.L + l) * c.S + s)] = sees(in.c, l, s);
  c.window = {}, c.docs = {}, c.docs_k = {}, c.causal = Causal::none;
  return d;
}

void bf16_forward(const SdpaProblem<float>& p) { flash_forward(p, Precision::bf16); }
void bf16_backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g) {
  flash_backward(p, dout, g, Precision::bf16);
}

TEST(Variants, SkippedTilesGiveTheBitsOfTheDenseMask) {
  std::vector<Case> cs;
  for (Window w : {Window{100, 0}, Window{300, 50}, Window{0, 0}, Window{-1, 31}}) {
    Case c;
    c.H = 4, c.Hkv = 2, c.L = 700, c.S = 900, c.D = c.Dv = 64, c.window = w, c.causal = Causal::bottom_right;
    cs.push_back(c);
  }
  Case d;
  d.B = 2, d.H = 2, d.Hkv = 2, d.L = d.S = 1000, d.D = d.Dv = 32, d.docs = {300, 1, 399, 300},
  d.causal = Causal::top_left;
  cs.push_back(d);
  Case v;
  v.H = 2, v.Hkv = 1, v.L = 500, v.S = 800, v.D = v.Dv = 64, v.docs = {200, 300}, v.docs_k = {350, 450};
  cs.push_back(v);
  for (const Case& c : cs) {
    SCOPED_TRACE(c.name());
    const Inputs in(c), dense = as_dense_mask(in);
    for (ForwardKernel<float> k : {ForwardKernel<float>(flash_forward), ForwardKernel<float>(bf16_forward)}) {
      const Forward a = forward<float>(k, in), b = forward<float>(k, dense);
      EXPECT_TRUE(same_bits(a.out, b.out)) << "out";
      EXPECT_TRUE(same_bits(a.lse, b.lse)) << "lse";
    }
    for (BackwardKernel<float> k : {BackwardKernel<float>(flash_backward), BackwardKernel<float>(bf16_backward)}) {
      const Grads a = backward<float>(k, in), b = backward<float>(k, dense);
      EXPECT_TRUE(same_bits(a.dq, b.dq)) << "dq";
      EXPECT_TRUE(same_bits(a.dk, b.dk)) << "dk";
      EXPECT_TRUE(same_bits(a.dv, b.dv)) << "dv";
    }
  }
}

// Keys far outside every window are never read: NaN in them reaches no output of the queries far from them
// (0·NaN would, were their tiles computed). Queries from 2048 on see keys from 2048 - 128 on; keys below
// 1024 are more than a query tile and a key tile away.
TEST(Variants, KeysNoQuerySeesAreNeverRead) {
  Case c;
  c.B = 1, c.H = 2, c.Hkv = 2, c.L = c.S = 4096, c.D = c.Dv = 32, c.window = {128, 0}, c.causal = Causal::top_left;
  Inputs in(c);
  for (int64_t i = 0; i < c.Hkv * c.S * c.D; ++i)
    if (i / c.D % c.S < 1024) in.k.data()[i] = in.v.data()[i] = NAN;
  for (ForwardKernel<float> k : {ForwardKernel<float>(flash_forward), ForwardKernel<float>(bf16_forward)}) {
    const Forward f = forward<float>(k, in);
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 2048; l < c.L; ++l)
        for (int64_t e = 0; e < c.Dv; ++e)
          ASSERT_FALSE(std::isnan(f.out[size_t((h * c.L + l) * c.Dv + e)]))
              << (k == bf16_forward ? "bf16 " : "fp32 ") << l;
  }
  for (BackwardKernel<float> k : {BackwardKernel<float>(flash_backward), BackwardKernel<float>(bf16_backward)}) {
    const Grads g = backward<float>(k, in);
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 2048; l < c.L; ++l)
        for (int64_t d = 0; d < c.D; ++d) ASSERT_FALSE(std::isnan(g.dq[size_t((h * c.L + l) * c.D + d)])) << l;
    for (int64_t s = 2048; s < c.S; ++s)
      for (int64_t d = 0; d < c.D; ++d) ASSERT_FALSE(std::isnan(g.dk[size_t(s * c.D + d)])) << s;
  }
}

// The bits of the variants on every CPU (the same on every AVX2 and AVX-512 CPU, test_bits.cpp checks that
// across the targets this machine has): FNV-1a of flash's out, LSE and gradients (the table's too) on one
// case with every variant, fp32 and bf16. Recorded on 2026-12-06 on an AMD Zen 3 (AVX2; bf16 by the exact
// emulation, which test_flash_bf16's golden pins to the instructions), bf16 again on 2026-12-07 (an AMD Zen 4)
// for the bf16 kernels' own 2^x; print with ATTN_PRINT_GOLDEN=1.
TEST(Variants, TheGoldenBitsOnEveryCpu) {
  Case c;
  c.B = 2, c.H = 4, c.Hkv = 2, c.L = 200, c.S = 330, c.D = 63, c.Dv = 40, c.causal = Causal::bottom_right;
  c.window = {150, 10}, c.alibi = 2, c.softcap = 2.5, c.rel_buckets = 24, c.rel_bidirectional = false;
  c.padding = drop(), c.masked = 0.1, c.dropout_p = 0.1, c.seed = 2026;
  const Inputs in(c);
  for (Precision prec : {Precision::f32, Precision::bf16}) {
    const bool bf = prec == Precision::bf16;
    const Forward f = forward<float>(bf ? bf16_forward : ForwardKernel<float>(flash_forward), in);
    const Grads g = backward<float>(bf ? bf16_backward : BackwardKernel<float>(flash_backward), in);
    std::vector<float> all;
    for (const auto* x : {&f.out, &f.lse, &g.dq, &g.dk, &g.dv, &g.drel}) all.insert(all.end(), x->begin(), x->end());
    const uint64_t h = fnv1a64(all.data(), all.size() * sizeof(float));
    if (std::getenv("ATTN_PRINT_GOLDEN")) std::printf("%s 0x%016llxull\n", bf ? "bf16" : "fp32", (unsigned long long)h);
    EXPECT_EQ(h, bf ? 0xc022546877e5a8d5ull : 0xb19f07278dc00ae7ull)
        << (bf ? "bf16" : "fp32") << " flash bits of the variants";
  }
}

// ---- Refusals ----

void expect_refused(const Case& c, void (*edit)(SdpaArgs<float>&), const std::string& want) {
  Bound<float> b = Inputs(c).bind<float>();
  edit(b.args);
  Tensor out({c.B, c.H, c.L, c.Dv});
  try {
    make_problem(b.args, SdpaOut<float>{out.view(), {}, {}});
    ADD_FAILURE() << "accepted; wanted " << want;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(Variants, BadArgumentsAreRefusedByName) {
  Case c;
  c.B = 2, c.H = 4, c.L = c.S = 6;
  expect_refused(c, [](SdpaArgs<float>& a) { a.window = {-2, 0}; }, "Expected window (left, right)");
  expect_refused(c, [](SdpaArgs<float>& a) { a.softcap = -1; }, "Expected softcap >= 0");
  static float slopes[3] = {1, 2, 3};
  expect_refused(c, [](SdpaArgs<float>& a) { a.alibi_slopes = View<const float>(slopes, {3}); },
                 "Expected alibi_slopes of shape (H) = (4,) or (B, H) = (2, 4), but got (3,) instead");
  static float table[12] = {};
  expect_refused(c, [](SdpaArgs<float>& a) { a.relative_bias.table = View<const float>(table, {4, 3}); },
                 "Expected relative_bias of shape (num_buckets, H = 4)");
  static int64_t ids[12] = {0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1};
  expect_refused(c, [](SdpaArgs<float>& a) { a.documents.ids = View<const int64_t>(ids, {2, 6}); },
                 "Expected each document of document_ids to be one run of positions, but got document 0");
  expect_refused(c, [](SdpaArgs<float>& a) { a.documents.ids = View<const int64_t>(ids, {2, 5}); },
                 "Expected document_ids of shape (B, L) = (2, 6), but got (2, 5) instead");
  static int64_t cu[3] = {0, 2, 6};
  expect_refused(
      c, [](SdpaArgs<float>& a) { a.documents.cu_seqlens_q = a.documents.cu_seqlens_k = View<const int64_t>(cu, {3}); },
      "Expected batch B = 1 with cu_seqlens");
  Case one = c;
  one.B = 1;
  static int64_t cu_short[3] = {0, 2, 5};
  expect_refused(one, [](SdpaArgs<float>& a) {
    a.documents.cu_seqlens_q = View<const int64_t>(cu, {3});
    a.documents.cu_seqlens_k = View<const int64_t>(cu_short, {3});
  }, "Expected cu_seqlens_k from 0 to S = 6, but got 0 to 5 instead");
}

}  // namespace
}  // namespace attn
