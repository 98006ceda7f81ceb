// gemm_bf16 (attn/gemm.h): the bits of AMX's TDPBF16PS arithmetic, written plainly here (per group of 32 k,
// an fp32 chain over the even k and one over the odd k from 0, then C + (E + O), each sum rounded once,
// subnormals flushed), on every SIMD target this CPU runs, with AMX (its tiles in software too, emulate_cpu_amx),
// with VDPBF16PS and with the FMA emulation, any cache size and thread count; the instructions against the plain
// definition on edge cases; and the accuracy bound against an fp64 oracle derived from bf16's 8-bit significand.
// Not speed (bench/gemm_vs_torch.py --dtype bf16).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attn/check.h"
#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/gemv.h"
#include "attn/kernels/half_kv.h"
#include "attn/nn.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "gemm_harness.h"
#include "test_util.h"

namespace attn {
namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
float flush(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x; }
// A bf16 as the instruction reads it: the high half of an fp32, a subnormal as zero.
float value(uint16_t b) { return flush(from_bits(uint32_t(b) << 16)); }

// The definition, plainly: element (i, j) of op(A)·op(B) + beta·C with bf16 A and B.
std::vector<float> plain(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const std::vector<uint16_t>& A,
                         int64_t lda, const std::vector<uint16_t>& B, int64_t ldb, float beta, std::vector<float> C,
                         int64_t ldc) {
  auto a = [&](int64_t i, int64_t k) { return k < K ? value(ta ? A[k * lda + i] : A[i * lda + k]) : 0.f; };
  auto b = [&](int64_t k, int64_t j) { return k < K ? value(tb ? B[j * ldb + k] : B[k * ldb + j]) : 0.f; };
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = beta == 0.f ? 0.f : beta == 1.f ? C[i * ldc + j] : beta * C[i * ldc + j];
      for (int64_t k0 = 0; k0 < K; k0 += 32) {  // a group: 16 pairs
        float even = 0.f, odd = 0.f;
        for (int64_t k = k0; k < k0 + 32; k += 2) {
          even = flush(std::fma(a(i, k), b(k, j), even));
          odd = flush(std::fma(a(i, k + 1), b(k + 1, j), odd));
        }
        acc = flush(flush(acc) + flush(even + odd));
      }
      C[i * ldc + j] = acc;
    }
  return C;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  to_half(KvDtype::bf16, x.data(), int64_t(x.size()), out.data());
  return out;
}


// Every target this CPU runs; on AVX-512 targets, with each instruction the CPU has (VDPBF16PS, AMX) and
// with the emulation.
struct Path {
  int64_t target;
  bool bf16, amx, amx_emulated = false;
  std::string name() const {
    return std::string(hwy::TargetName(target)) +
           (amx_emulated ? " AMX emulated" : amx ? " AMX" : bf16 ? " VDPBF16PS" : " emulated");
  }
};
// Every path on every target this CPU runs; AMX's paths with its tiles in software too where it has AVX512_BF16.
std::vector<Path> paths() {
  std::vector<Path> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    out.push_back({t, false, false});
    if (cpu_info().bf16 && avx512_target(t)) out.push_back({t, true, false}), out.push_back({t, true, true, true});
    if (cpu_info().amx && avx512_target(t)) out.push_back({t, true, true});
  }
  return out;
}

struct Bf16Off : test::Bf16Instructions {  // a path's instructions for a scope
  explicit Bf16Off(bool bf16, bool amx = false, bool amx_emulated = false)
      : test::Bf16Instructions(bf16, amx, amx_emulated) {}
  Bf16Off(const Path& p) : Bf16Off(p.bf16, p.amx, p.amx_emulated) {}
};

TEST(GemmBf16, EqualsThePlainDefinitionOnEveryPathCacheAndThreadCount) {
  // alpha 1 (gemm_bf16 has none); its own leading dimensions below, not the case's pad
  const test::GemmCase shapes[] = {
      {1, 1, 1, false, false, 0, 1, 0},     {7, 5, 3, false, true, 0, 1, 0},       {13, 70, 37, false, true, 0, 1, 1},
      {64, 64, 64, false, false, 0, 1, 0},  {31, 97, 129, true, false, 0, 1, 0.5}, {50, 33, 600, true, true, 0, 1, 0},
      {130, 200, 2100, false, true, 0, 1, 0},  // K > any K block: later blocks continue the chain
      {70, 66, 96, true, true, 0, 1, 2},       // whole groups, AMX edge blocks on both sides
      {40, 50, 1101, false, false, 0, 1, 1},   // B's pair rows across K blocks, an odd K, a B panel past N
      {70, 66, 2048, false, true, 0, 1, 1},    // AMX reads A's rows in place, across K blocks; its last panel packed
      {45, 40, 2100, true, false, 0, 1, 0.5},  // a transposed A across K blocks, a partial group and panel
  };
  const int64_t caches[][2] = {{cpu_info().l1d, cpu_info().l2}, {32 << 10, 512 << 10}, {48 << 10, 2 << 20}};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  int checked = 0;
  for (const test::GemmCase& s : shapes) {
    const float beta = float(s.beta);
    // odd strides, but an even one where AMX can read A's rows in place (whole groups of k in each: K % 32 == 0)
    const int64_t lda = (s.ta ? s.M : s.K) + (!s.ta && s.K % 32 == 0 ? 4 : 3), ldb = (s.tb ? s.K : s.N) + 1,
                  ldc = s.N + 2;
    std::vector<float> a32((s.ta ? s.K : s.M) * lda), b32((s.tb ? s.N : s.K) * ldb), c0(s.M * ldc);
    for (float& x : a32) x = nd(rng);
    for (float& x : b32) x = nd(rng) * 4.f;
    for (float& x : c0) x = nd(rng);
    // the padding of each row NaN: a path that reads past K (or past M, N) turns its sums into NaN
    for (auto [v, ld, used] : {std::tuple{&a32, lda, s.ta ? s.M : s.K}, std::tuple{&b32, ldb, s.tb ? s.K : s.N}})
      for (size_t e = 0; e < v->size(); ++e)
        if (int64_t(e) % ld >= used) (*v)[e] = NAN;
    const std::vector<uint16_t> a = to_bf16(a32), b = to_bf16(b32), c0b = to_bf16(c0);
    const std::vector<float> want = plain(s.ta, s.tb, s.M, s.N, s.K, a, lda, b, ldb, beta, c0, ldc);
    std::vector<float> c0w(c0b.size());  // a bf16 C: the fp32 result from C widened, rounded once
    from_half(KvDtype::bf16, c0b.data(), int64_t(c0b.size()), c0w.data());
    const std::vector<uint16_t> want16 = to_bf16(plain(s.ta, s.tb, s.M, s.N, s.K, a, lda, b, ldb, beta, c0w, ldc));
    // B packed once here (under the CPU's own path) and again under each; on another path the first packs B per call
    const PackedB16 once = pack_b_bf16(s.tb, s.K, s.N, b.data(), ldb);
    int n = 0;
    for (const Path& p : paths())
      for (const auto& cs : caches) {
        const int threads = 1 + (n++ % std::min(2, max_threads()));
        const test::PretendMachine as(p.target, cs[0], cs[1], threads);
        const Bf16Off off(p);
        const std::string where = "M N K " + std::to_string(s.M) + " " + std::to_string(s.N) + " " +
                                  std::to_string(s.K) + ", " + p.name() + ", L1d " + std::to_string(cs[0] >> 10) +
                                  " KiB, " + std::to_string(threads) + " thread(s)";
        std::vector<float> c16 = c0, c32 = c0, cmix = c0;
        gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, a.data(), lda, b.data(), ldb, beta, c16.data(), ldc);
        gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, a32.data(), lda, b32.data(), ldb, beta, c32.data(), ldc);
        gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, a32.data(), lda, b.data(), ldb, beta, cmix.data(), ldc);
        // every element, the columns past N too (never written); element e is row e / ldc, column e % ldc
        ASSERT_TRUE(test::same_bits(c16, want)) << where << ", bf16 operands (ldc " << ldc << ")";
        ASSERT_TRUE(test::same_bits(c32, want)) << where << ", fp32 operands (ldc " << ldc << ")";
        ASSERT_TRUE(test::same_bits(cmix, want)) << where << ", fp32 A, bf16 B (ldc " << ldc << ")";
        for (const PackedB16& p16 : {once, pack_b_bf16(s.tb, s.K, s.N, b.data(), ldb)}) {
          std::vector<float> cp = c0, cp16 = c0;
          gemm_bf16(s.ta, s.M, a32.data(), lda, p16, beta, cp.data(), ldc);
          gemm_bf16(s.ta, s.M, a.data(), lda, p16, beta, cp16.data(), ldc);
          ASSERT_TRUE(test::same_bits(cp, want)) << where << ", fp32 A, packed B (ldc " << ldc << ")";
          ASSERT_TRUE(test::same_bits(cp16, want)) << where << ", bf16 A, packed B (ldc " << ldc << ")";
        }
        std::vector<uint16_t> c16b = c0b;
        gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, a.data(), lda, b.data(), ldb, beta, c16b.data(), ldc);
        ASSERT_TRUE(c16b == want16) << where << ", bf16 C (ldc " << ldc << ")";
        ++checked;
      }
  }
  EXPECT_GE(checked, 11 * 3);
}

// Pairs chosen so that each rule decides the result: two chains (not VDPBF16PS's one), one rounding per
// sum, ties to even, subnormal inputs, a subnormal accumulator, a subnormal sum, signed zeros, infinities, NaN.
TEST(GemmBf16, EdgeCasesOnEveryPathMatchThePlainDefinition) {
  const float tiny = std::ldexp(1.f, -63), min_normal = std::ldexp(1.f, -126);
  struct Case {
    float c, a0, a1, b0, b1;
    bool subnormal_product = false;  // targets without FMA flush the product itself (gemm.h)
  } cases[] = {
      {1.f, std::ldexp(1.f, -30), -1.f, 1.f, 1.f},              // 1 + (2^-30 - 1): 0; one chain, odd first: 2^-30
      {1.f, std::ldexp(1.f, -24), std::ldexp(1.f, -24), 1.f, 1.f},  // 1 + (two half-ulps): 1 + 2^-23; one chain: 1
      {1.f, 3.f * std::ldexp(1.f, -24), 0.f, 1.f, 0.f},         // a tie to even upwards
      {0.f, std::ldexp(1.f, -130), 0.f, 1.f, 0.f},              // a subnormal bf16 input reads as 0
      {std::ldexp(1.f, -127), tiny, 0.f, tiny, 0.f},            // a subnormal accumulator reads as 0
      {0.f, std::ldexp(1.f, -70), 0.f, std::ldexp(1.f, -70), 0.f},  // a subnormal sum is flushed
      {min_normal, -std::ldexp(1.f, -64), 0.f, std::ldexp(1.f, -63), 0.f, true},  // min_normal - 2^-127: flushed
      {-0.f, 0.f, 0.f, 1.f, 0.f},                               // -0 + 0·1 + 0·0
      {1.f, INFINITY, 0.f, 2.f, 0.f},                            // inf
      {1.f, INFINITY, 0.f, 0.f, 0.f},                            // inf·0: NaN
  };
  for (const Case& cs : cases) {
    const std::vector<uint16_t> a = to_bf16({cs.a0, cs.a1}), b = to_bf16({cs.b0, cs.b1});
    const float want = plain(false, false, 1, 1, 2, a, 2, b, 1, 1.f, {cs.c}, 1)[0];
    for (const Path& p : paths()) {
      if (cs.subnormal_product && !fma_target(p.target)) continue;
      const test::PretendMachine as(p.target, 0, 0, 1);
      const Bf16Off off(p);
      float got = cs.c;
      gemm_bf16(false, false, 1, 1, 2, a.data(), 2, b.data(), 1, 1.f, &got, 1);
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << p.name();
      else EXPECT_TRUE(test::same_bits(&got, &want, 1)) << p.name() << ": c " << cs.c << " a " << cs.a0 << "," << cs.a1
                                                  << " b " << cs.b0 << "," << cs.b1 << ": " << got << " vs " << want;
    }
  }
}

// Against fp64: with the operands as rounded to bf16, each of the K/2·2 sums rounds once (relative
// u = 2^-24), so |C - C64| <= K·u·Σ|a·b| (+ a term for flushed subnormals, none here); against the fp32
// operands, each bf16 rounding adds at most 2^-8 to each factor: 2·2^-8 + 2^-16 more of Σ|a·b|.
TEST(GemmBf16, WithinTheBoundOfBf16RoundingAgainstFp64) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  for (int64_t K : {1, 2, 255, 1024, 3001}) {
    const int64_t M = 9, N = 21;
    std::vector<float> a32(M * K), b32(N * K);
    for (float& x : a32) x = ud(rng);
    for (float& x : b32) x = ud(rng) * 100.f;
    const std::vector<uint16_t> a = to_bf16(a32), b = to_bf16(b32);
    std::vector<float> c(M * N);
    gemm_bf16(false, true, M, N, K, a32.data(), K, b32.data(), K, 0.f, c.data(), N);
    const double u = std::ldexp(1.0, -24), ub = std::ldexp(1.0, -8);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double exact16 = 0, exact32 = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact16 += double(value(a[i * K + k])) * value(b[j * K + k]);
          exact32 += double(a32[i * K + k]) * b32[j * K + k];
          mag += std::fabs(double(a32[i * K + k]) * b32[j * K + k]);
        }
        const double got = c[i * N + j];
        EXPECT_LE(std::fabs(got - exact16), double(K) * u * mag * 1.01) << "K " << K << " at " << i << "," << j;
        EXPECT_LE(std::fabs(got - exact32), (double(K) * u + 2 * ub + ub * ub) * mag * 1.01)
            << "K " << K << " at " << i << "," << j;
      }
  }
}

TEST(GemmBf16, NothingToMultiplyScalesCAndEmptyOutputsAreNoOps) {
  std::vector<float> c = {1.f, -2.f, NAN, 4.f};
  const uint16_t one = 0x3F80;
  gemm_bf16(false, false, 2, 2, 0, &one, 1, &one, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c[0], 0.5f);
  EXPECT_EQ(c[1], -1.f);
  EXPECT_TRUE(std::isnan(c[2]));
  gemm_bf16(false, false, 2, 2, 0, &one, 1, &one, 2, 0.f, c.data(), 2);  // beta 0: C not read
  EXPECT_EQ(c[2], 0.f);
  gemm_bf16(false, false, 0, 2, 3, &one, 3, &one, 2, 0.f, static_cast<float*>(nullptr), 2);
}

// A bf16 C is the fp32 C of the same product from C widened, rounded once to nearest even: beta 0 (C not
// read: NaN there stays out), beta 1 and 0.75, a row stride past N (the columns between never written); K of
// one K block (no fp32 sums kept), of several, and 0 (beta·C alone).
TEST(GemmBf16, Bf16OutputIsTheFp32ResultRoundedOnce) {
  const int64_t M = 37, N = 45, ldc = N + 3;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (const int64_t K : {70, 2100, 0}) {
    std::vector<float> a32(M * K), b32(K * N), c32(M * ldc);
    for (float& x : a32) x = nd(rng);
    for (float& x : b32) x = nd(rng);
    for (float& x : c32) x = nd(rng) * 8.f;
    const std::vector<uint16_t> a = to_bf16(a32), b = to_bf16(b32), c0 = to_bf16(c32);
    for (const float beta : {0.f, 1.f, 0.75f}) {
      std::vector<uint16_t> c16 = c0;
      if (beta == 0.f)
        for (int64_t i = 0; i < M; ++i) c16[i * ldc] = 0x7FC0;  // NaN: must not reach the result
      gemm_bf16(false, true, M, N, K, a.data(), K, b.data(), K, beta, c16.data(), ldc);
      std::vector<float> want(M * ldc);
      from_half(KvDtype::bf16, c0.data(), M * ldc, want.data());
      gemm_bf16(false, true, M, N, K, a.data(), K, b.data(), K, beta, want.data(), ldc);
      const std::vector<uint16_t> rounded = to_bf16(want);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < ldc; ++j)
          ASSERT_EQ(c16[i * ldc + j], j < N ? rounded[i * ldc + j] : c0[i * ldc + j])
              << "K " << K << ", beta " << beta << " at " << i << "," << j;
    }
  }
}

// Autocast(bf16): linear and linear_backward run gemm_bf16 on this thread while it is alive, and f32
// again after; the parse names what it refuses.
TEST(GemmBf16, AutocastSendsLinearAndItsBackwardThroughGemmBf16) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t N = 19, in = 23, out = 17;
  auto fill = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = nd(rng);
    return v;
  };
  const std::vector<float> x = fill(N * in), w = fill(out * in), bias = fill(out), dy = fill(N * out);
  const View<const float> X(x.data(), {N, in}), W(w.data(), {out, in}), Bias(bias.data(), {out}),
      DY(dy.data(), {N, out});
  auto run = [&](std::vector<float>& y, std::vector<float>& dx, std::vector<float>& dw) {
    y.assign(N * out, 0.f), dx.assign(N * in, 0.f), dw.assign(out * in, 1.f);
    linear<float>(X, W, Bias, View<float>(y.data(), {N, out}));
    linear_backward(X, W, DY, View<float>(dx.data(), {N, in}), View<float>(dw.data(), {out, in}), {});
  };
  std::vector<float> y16, dx16, dw16, y32, dx32, dw32;
  EXPECT_EQ(matmul_precision(), Precision::f32);
  {
    const Autocast bf16(Precision::bf16);
    EXPECT_EQ(matmul_precision(), Precision::bf16);
    run(y16, dx16, dw16);
  }
  EXPECT_EQ(matmul_precision(), Precision::f32);
  run(y32, dx32, dw32);
  std::vector<float> want_y(N * out), want_dx(N * in, 0.f), want_dw(out * in, 1.f);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < out; ++c) want_y[r * out + c] = bias[c];
  gemm_bf16(false, true, N, out, in, x.data(), in, w.data(), in, 1.f, want_y.data(), out);
  gemm_bf16(false, false, N, in, out, dy.data(), out, w.data(), in, 0.f, want_dx.data(), in);
  gemm_bf16(true, false, out, in, N, dy.data(), out, x.data(), in, 1.f, want_dw.data(), in);
  ASSERT_TRUE(test::same_bits(y16, want_y)) << "y";
  ASSERT_TRUE(test::same_bits(dx16, want_dx)) << "dx";
  ASSERT_TRUE(test::same_bits(dw16, want_dw)) << "dw";
  EXPECT_NE(y16, y32);  // the f32 run after the scope is another computation
  EXPECT_EQ(parse_precision("bfloat16"), Precision::bf16);
  EXPECT_EQ(parse_precision("float32"), Precision::f32);
  try {
    parse_precision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp16'"), std::string::npos) << e.what();
  }
}

// A pretrained Linear (given weights) multiplies in the Autocast's precision in either weight layout: GPT-2's
// (in, out) Conv1D weights once took gemm() directly and stayed fp32 under --dtype bf16.
TEST(GemmBf16, AutocastReachesAPretrainedLinearOfEitherLayout) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int64_t N = kGemvRows + 9, in = 40, out = 24;  // past linear_rows' few rows: the GEMM
  Tensor x({N, in}), w_oi({out, in}), bias({out});
  for (Tensor* t : {&x, &w_oi, &bias})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = nd(rng);
  Tensor w_io({in, out});  // the same matrix transposed
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) w_io.data()[i * out + o] = w_oi.data()[o * in + i];
  std::vector<float> want(N * out);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < out; ++c) want[r * out + c] = bias.data()[c];
  gemm_bf16(false, true, N, out, in, x.data(), in, w_oi.data(), in, 1.f, want.data(), out);
  for (const WeightLayout layout : {WeightLayout::out_in, WeightLayout::in_out}) {
    Linear lin(Tensor::copy_of((layout == WeightLayout::in_out ? w_io : w_oi).view()), Tensor::copy_of(bias.view()),
               layout);
    Tensor y16, y32 = lin.forward(x.view());
    {
      const Autocast bf16(Precision::bf16);
      y16 = lin.forward(x.view());
    }
    ASSERT_TRUE(test::same_bits(y16.data(), want.data(), size_t(N * out)))
        << (layout == WeightLayout::in_out ? "in_out" : "out_in");
    EXPECT_NE(std::vector<float>(y32.data(), y32.data() + N * out), want);  // fp32 outside the scope
  }
}

TEST(GemmBf16, InfoNamesThePath) {
  const std::string k = gemm_bf16_kernel();
  EXPECT_NE(k.find(cpu_info().amx ? "AMX" : cpu_info().bf16 ? "VDPBF16PS" : "emulated"), std::string::npos) << k;
  {
    const Bf16Off off(false);
    EXPECT_NE(gemm_bf16_kernel().find("emulated"), std::string::npos);
  }
}

}  // namespace
}  // namespace attn
