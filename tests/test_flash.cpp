// The flash forward kernel against the fp64 reference, with FlashAttention's derived tolerance: its
// error may be at most 2x the error of the plain fp32 reference, plus a tiny atol. Also: bitwise the same
// output for 1 and 2 threads, the zero policy on fully masked rows, every SIMD target compiled in,
// forced small and large tile sizes, and sdpa()'s backend choice (explain, strict). Not a benchmark (bench/bench_kernels.cpp is).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "attn/rng.h"
#include "attn/sdpa.h"
#include "attn/threads.h"

using namespace attn;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Absolute slack of the tolerance rule. Where the fp32 reference happens to be exact (one key: out = v)
// the rule's 2x term is 0; flash still rounds Q·scale·log2(e), the exp2 polynomial and 1/l, a few ulp
// of |out| <= ~4 (unit-normal inputs) and of |LSE| <= ~20.
constexpr double kAtolOut = 2e-6;
constexpr double kAtolLse = 8e-6;

enum class MaskKind { none, keep, drop, additive };

struct Case {
  int64_t B = 1, H = 2, Hkv = 2, L = 7, S = 9, D = 8, Dv = 8;
  Causal causal = Causal::none;
  MaskKind mask = MaskKind::none;
  Shape mask_shape;  // right-aligned against (B, H, L, S); {L, S} if empty
  MaskKind padding = MaskKind::none;
  double masked_rows = 0;  // probability that a bool/additive mask row is masked out entirely
  double dropout_p = 0;
  int in_layout = 0, out_layout = 0;  // see make_arr
  uint64_t seed = 1;

  std::string name() const {
    return cat("B=", B, " H=", H, " Hkv=", Hkv, " L=", L, " S=", S, " D=", D, " Dv=", Dv, " causal=",
               int(causal), " mask=", int(mask), to_string(mask_shape), " padding=", int(padding),
               " p=", dropout_p, " layouts=", in_layout, "/", out_layout);
  }
};

// A strided array and the storage under it. layout 0: contiguous; 1: dims 1 and 2 swapped in memory,
// as MultiheadAttention's (B, L, H, D) projections are read; 2: every element 2 apart (column stride 2).
template <typename T>
struct Arr {
  std::vector<T> store;
  View<T> view;
};

template <typename T>
Arr<T> make_arr(const Shape& shape, int layout, T fill = T(0)) {
  Shape mem = shape;
  if (layout == 1) std::swap(mem[1], mem[2]);
  Shape st = contiguous_strides(mem);
  if (layout == 1) std::swap(st[1], st[2]);
  if (layout == 2)
    for (auto& x : st) x *= 2;
  Arr<T> a;
  a.store.assign(static_cast<size_t>(numel(shape) * (layout == 2 ? 2 : 1)), fill);
  a.view = View<T>(a.store.data(), shape, st);
  return a;
}

template <typename T, typename U>
Arr<T> convert(const Arr<U>& src) {
  Arr<T> a;
  a.store.assign(src.store.begin(), src.store.end());
  a.view = View<T>(a.store.data(), src.view.shape, src.view.strides);
  return a;
}

// Every element of a rank-3 or rank-4 view, in index order, as double.
template <typename T>
std::vector<double> gather(View<T> v) {
  std::vector<double> x;
  Shape s = v.shape;
  while (s.size() < 4) s.insert(s.begin(), 1);
  Shape st = v.strides;
  while (st.size() < 4) st.insert(st.begin(), 0);
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c)
        for (int64_t d = 0; d < s[3]; ++d) x.push_back(double(v.data[a * st[0] + b * st[1] + c * st[2] + d * st[3]]));
  return x;
}

// The inputs of a case in float and, with the same values, in double.
struct Inputs {
  Case c;
  Arr<float> q, k, v, mask_add, pad_add;
  Arr<double> qd, kd, vd, mask_addd, pad_addd;
  Arr<uint8_t> mask_bool, pad_bool;

  explicit Inputs(const Case& cs) : c(cs) {
    Rng rng(c.seed);
    auto randn = [&](Arr<float>& a) {
      for (float& x : a.store) x = static_cast<float>(rng.normal());
    };
    q = make_arr<float>({c.B, c.H, c.L, c.D}, c.in_layout);
    k = make_arr<float>({c.B, c.Hkv, c.S, c.D}, c.in_layout);
    v = make_arr<float>({c.B, c.Hkv, c.S, c.Dv}, c.in_layout);
    randn(q), randn(k), randn(v);
    qd = convert<double>(q), kd = convert<double>(k), vd = convert<double>(v);
    make_mask(c.mask, c.mask_shape.empty() ? Shape{c.L, c.S} : c.mask_shape, 0.25, mask_add, mask_bool, rng);
    make_mask(c.padding, {c.B, c.S}, 0.2, pad_add, pad_bool, rng);
    mask_addd = convert<double>(mask_add), pad_addd = convert<double>(pad_add);
  }

  // masked entries with probability p_masked, and whole last-dim rows with probability c.masked_rows
  void make_mask(MaskKind kind, const Shape& shape, double p_masked, Arr<float>& add, Arr<uint8_t>& bools, Rng& rng) {
    if (kind == MaskKind::none) return;
    const int64_t n = numel(shape), row = shape.back();
    std::vector<bool> masked(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i += row) {
      const bool all = rng.uniform() < c.masked_rows;
      for (int64_t j = i; j < i + row; ++j) masked[j] = all || rng.uniform() < p_masked;
    }
    if (kind == MaskKind::additive) {
      add = make_arr<float>(shape, 0);
      for (int64_t i = 0; i < n; ++i) add.store[i] = masked[i] ? -INFINITY : static_cast<float>(rng.normal());
    } else {
      bools = make_arr<uint8_t>(shape, 0);
      for (int64_t i = 0; i < n; ++i) bools.store[i] = masked[i] == (kind == MaskKind::drop);
    }
  }

  template <typename T>
  Mask<T> mask_of(MaskKind kind, const Arr<uint8_t>& bools, const Arr<float>& add, const Arr<double>& addd) const {
    switch (kind) {
      case MaskKind::none: return {};
      case MaskKind::keep: return Mask<T>::keep(bools.view);
      case MaskKind::drop: return Mask<T>::drop(bools.view);
      case MaskKind::additive:
        if constexpr (std::is_same_v<T, float>) return Mask<T>::additive(add.view);
        else return Mask<T>::additive(addd.view);
    }
    return {};
  }

  template <typename T>
  SdpaArgs<T> args() const {
    SdpaArgs<T> a;
    if constexpr (std::is_same_v<T, float>) a.q = q.view, a.k = k.view, a.v = v.view;
    else a.q = qd.view, a.k = kd.view, a.v = vd.view;
    a.attn_mask = mask_of<T>(c.mask, mask_bool, mask_add, mask_addd);
    a.key_padding = mask_of<T>(c.padding, pad_bool, pad_add, pad_addd);
    a.causal = c.causal;
    a.dropout_p = c.dropout_p;
    a.seed = 42;
    return a;
  }
};

struct Result {
  std::vector<double> out, lse;
};

enum class Kernel { reference, flash };

template <typename T>
Result run(const Inputs& in, Kernel kernel) {
  const Case& c = in.c;
  // NaN where nothing was written yet: an element the kernel skips fails every comparison.
  auto out = make_arr<T>({c.B, c.H, c.L, c.Dv}, c.out_layout, T(NAN));
  auto lse = make_arr<T>({c.B, c.H, c.L}, 0, T(NAN));
  SdpaProblem<T> p = make_problem(in.args<T>(), SdpaOut<T>{out.view, {}, lse.view});
  if constexpr (std::is_same_v<T, float>) {
    if (kernel == Kernel::flash) flash_forward(p);
    else reference_forward(p);
  } else {
    reference_forward(p);
  }
  return {gather(out.view), gather(lse.view)};
}

// FlashAttention's rule: max |flash - fp64| <= 2·max |ref32 - fp64| + atol. Infinite truths (LSE of a
// fully masked row) must be matched exactly; NaN never passes.
void expect_close(const char* what, const std::vector<double>& flash, const std::vector<double>& ref32,
                  const std::vector<double>& truth, double atol) {
  ASSERT_EQ(flash.size(), truth.size());
  double err_flash = 0, err_ref = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    if (std::isinf(truth[i])) {
      ASSERT_EQ(flash[i], truth[i]) << what << " element " << i;
      continue;
    }
    ASSERT_FALSE(std::isnan(flash[i])) << what << " element " << i;
    err_flash = std::max(err_flash, std::abs(flash[i] - truth[i]));
    err_ref = std::max(err_ref, std::abs(ref32[i] - truth[i]));
  }
  EXPECT_LE(err_flash, 2 * err_ref + atol) << what << ": flash error " << err_flash << ", fp32 reference error "
                                           << err_ref;
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name());
  Inputs in(c);
  const Result flash = run<float>(in, Kernel::flash), ref32 = run<float>(in, Kernel::reference),
               truth = run<double>(in, Kernel::reference);
  expect_close("out", flash.out, ref32.out, truth.out, kAtolOut);
  expect_close("lse", flash.lse, ref32.lse, truth.lse, kAtolLse);
}

// The flash output of a case with n threads, as raw floats.
std::vector<float> flash_bits(const Inputs& in, int threads) {
  set_num_threads(threads);
  const Result r = run<float>(in, Kernel::flash);
  std::vector<float> x(r.out.begin(), r.out.end());
  x.insert(x.end(), r.lse.begin(), r.lse.end());
  return x;
}

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
          c.B = 2, c.L = L, c.S = S, c.mask = mask, c.padding = padding, c.causal = causal, c.masked_rows = 0.1;
          check_case(c);
        }
}

TEST(Flash, FullyMaskedKeyTilesAreSkippedCorrectly) {
  // key padding that masks whole key tiles (and, for batch 1, every key): the skipped tiles must
  // leave the rows exactly as the reference has them
  Case c;
  c.B = 2, c.L = 70, c.S = 1000, c.padding = MaskKind::drop;
  Inputs in(c);
  for (int64_t s = 0; s < c.S; ++s) {
    in.pad_bool.store[s] = s < 600;       // batch 0: keys [0, 600) masked out
    in.pad_bool.store[c.S + s] = 1;       // batch 1: every key masked out
  }
  const Result flash = run<float>(in, Kernel::flash), ref32 = run<float>(in, Kernel::reference),
               truth = run<double>(in, Kernel::reference);
  expect_close("out", flash.out, ref32.out, truth.out, kAtolOut);
  expect_close("lse", flash.lse, ref32.lse, truth.lse, kAtolLse);
  EXPECT_EQ(flash.lse.back(), -kInf);
}

TEST(Flash, MaskBroadcastShapes) {
  for (Shape shape : {Shape{2, 2, 70, 300}, Shape{2, 1, 1, 300}, Shape{1, 2, 70, 1}, Shape{300}, Shape{70, 300}})
    for (MaskKind kind : {MaskKind::keep, MaskKind::additive}) {
      Case c;
      c.B = 2, c.L = 70, c.S = 300, c.mask = kind, c.mask_shape = shape;
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
      c.H = 8, c.Hkv = 8 / ratio, c.L = 65, c.S = 129, c.causal = causal, c.mask = MaskKind::keep,
      c.mask_shape = {1, 8, 65, 129};
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
      c.causal = Causal::bottom_right, c.padding = MaskKind::drop, c.Dv = 63;
      check_case(c);
      c.mask = MaskKind::additive, c.mask_shape = {1, 8, L, S}, c.masked_rows = 0.3;
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
        c.L = L, c.S = S, c.causal = causal, c.padding = MaskKind::drop, c.mask = MaskKind::additive,
        c.masked_rows = 0.2;
        check_case(c);
      }
    for (MaskKind kind : {MaskKind::keep, MaskKind::drop, MaskKind::additive}) {
      Case c;
      c.H = 8, c.Hkv = 2, c.L = 130, c.S = 600, c.mask = kind, c.mask_shape = {1, 8, 130, 600}, c.D = c.Dv = 128;
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
  cases[1].H = 8, cases[1].Hkv = 2, cases[1].L = 300, cases[1].S = 700, cases[1].mask = MaskKind::additive;
  cases[2].H = 8, cases[2].Hkv = 1, cases[2].L = 2, cases[2].S = 3000;  // decode
  cases[3].L = 1, cases[3].S = 4100, cases[3].dropout_p = 0.2;          // decode, dropout
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    Inputs in(c);
    const std::vector<float> one = flash_bits(in, 1);
    for (int threads : {2, 3}) {
      const std::vector<float> other = flash_bits(in, threads);
      ASSERT_EQ(one.size(), other.size());
      EXPECT_EQ(std::memcmp(one.data(), other.data(), one.size() * sizeof(float)), 0) << threads << " threads";
    }
  }
  set_num_threads(before);
}

TEST(Flash, FullyMaskedRowsGiveZeroAndMinusInfLse) {
  // bottom-right causal with L > S: the first L - S queries see no key; plus masked-out mask rows
  for (int64_t S : {int64_t(40), int64_t(1200)}) {
    Case c;
    c.L = S == 40 ? 70 : 16, c.S = S, c.H = c.Hkv = 1, c.causal = Causal::bottom_right, c.mask = MaskKind::keep,
    c.masked_rows = 0.3;
    Inputs in(c);
    const Result flash = run<float>(in, Kernel::flash), truth = run<double>(in, Kernel::reference);
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
  in.q.store[0] = NAN;  // row 0 of query
  const Result flash = run<float>(in, Kernel::flash);
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
    c.mask = MaskKind::additive;
    check_case(c);
    c.L = 1, c.S = 1500, c.Dv = 64, c.H = 16, c.Hkv = 1;  // decode, 16 rows: several Qᵀ panels below AVX-512
    check_case(c);
    c.L = 5, c.S = 100, c.H = 3, c.Hkv = 1, c.in_layout = 2;  // few rows, K copied as rows
    check_case(c);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// ---- Weights from the flash LSE (sdpa with weights requested) ----

// The weights sdpa() returns on the flash path (weights_from_lse) against the fp64 reference's, with the
// same rule as the output; every mask kind, causal alignment, GQA and dropout (the same keep bits).
TEST(FlashWeights, MatchTheReferenceWithMasksCausalGqaAndDropout) {
  const MaskKind kinds[] = {MaskKind::none, MaskKind::keep, MaskKind::additive};
  int i = 0;
  for (MaskKind mask : kinds)
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Case c;
      c.B = 2, c.H = 4, c.Hkv = i % 2 ? 2 : 4, c.L = 37, c.S = 65, c.D = c.Dv = 63, c.mask = mask;
      c.padding = i % 3 ? MaskKind::none : MaskKind::drop, c.causal = causal, c.masked_rows = 0.1;
      c.dropout_p = i++ % 2 ? 0.25 : 0;
      SCOPED_TRACE(c.name());
      Inputs in(c);
      auto weights = [&](auto zero, Backend backend) {
        using T = decltype(zero);
        auto out = make_arr<T>({c.B, c.H, c.L, c.Dv}, 0, T(NAN));
        auto w = make_arr<T>({c.B, c.H, c.L, c.S}, 0, T(NAN));
        sdpa<T>(in.args<T>(), SdpaOut<T>{out.view, w.view, {}}, {backend, false});
        return std::pair{gather(w.view), gather(out.view)};
      };
      const auto flash = weights(0.f, Backend::automatic), ref32 = weights(0.f, Backend::reference),
                 truth = weights(0.0, Backend::reference);
      expect_close("weights", flash.first, ref32.first, truth.first, kAtolOut);
      expect_close("out", flash.second, ref32.second, truth.second, kAtolOut);
    }
}

// ---- sdpa(): backend choice ----

TEST(FlashBackend, ExplainAndStrict) {
  Case c;
  Inputs in(c);
  auto out = make_arr<float>({c.B, c.H, c.L, c.Dv}, 0);
  auto weights = make_arr<float>({c.B, c.H, c.L, c.S}, 0);
  const SdpaArgs<float> args = in.args<float>();
  const SdpaOut<float> plain{out.view, {}, {}}, with_weights{out.view, weights.view, {}};

  BackendChoice ch = explain(args, plain);
  EXPECT_EQ(ch.backend, Backend::flash) << ch.reason;
  ch = explain(args, with_weights);
  EXPECT_EQ(ch.backend, Backend::flash);
  EXPECT_EQ(ch.reason, "float32 with weights: flash for the output and LSE, the weights from the LSE");
  EXPECT_NO_THROW(sdpa(args, with_weights, {Backend::automatic, true}));
  EXPECT_NO_THROW(sdpa(args, with_weights, {Backend::flash, false}));
  // weights with strided columns: the reference materializes them (a fallback strict mode refuses)
  auto wide = make_arr<float>({c.B, c.H, c.L, 2 * c.S}, 0);
  const View<float> strided(wide.view.data, {c.B, c.H, c.L, c.S}, {c.H * c.L * 2 * c.S, c.L * 2 * c.S, 2 * c.S, 2});
  const SdpaOut<float> with_strided{out.view, strided, {}};
  EXPECT_EQ(explain(args, with_strided).backend, Backend::reference);
  EXPECT_THROW(sdpa(args, with_strided, {Backend::automatic, true}), Error);
  EXPECT_THROW(sdpa(args, with_strided, {Backend::flash, false}), Error);
  EXPECT_EQ(explain(args, with_weights, {Backend::reference, true}).backend, Backend::reference);
  EXPECT_EQ(explain(args, plain, {Backend::reference, false}).backend, Backend::reference);
  EXPECT_EQ(explain(args, plain, {Backend::flash, true}).backend, Backend::flash);

  const SdpaArgs<double> argsd = in.args<double>();
  auto outd = make_arr<double>({c.B, c.H, c.L, c.Dv}, 0);
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
  Inputs in(c);
  const Result direct = run<float>(in, Kernel::flash);
  auto out = make_arr<float>({c.B, c.H, c.L, c.Dv}, 0);
  sdpa(in.args<float>(), SdpaOut<float>{out.view, {}, {}}, {Backend::automatic, true});
  EXPECT_EQ(gather(out.view), direct.out);
}
