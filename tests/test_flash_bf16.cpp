// The bf16 flash forward (flash_forward(p, Precision::bf16); sdpa() under an Autocast): Q·Kᵀ and P·V over
// bf16 pairs with fp32 sums and softmax. Against an fp64 oracle with a bound derived from bf16's 8-bit
// significand and the bf16 kernels' exp2 (and shown to be bf16's error, not fp32's); the same bits with AMX's
// paths (their tiles in software where the CPU has none), VDPBF16PS and its emulation,
// on every SIMD target with FMA, for any cache size, tile rows and thread count; and where sdpa() sends
// bf16 (flash without weights) and where not (weights, the MHA training forward). Not speed
// (bench/compare_torch.py --bf16).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/mha.h"
#include "attn/threads.h"
#include "attn/train.h"  // fnv1a64
#include "../src/kernels/flash_pack.h"  // kExp2Bf16Error
#include "sdpa_harness.h"
#include "test_util.h"

using namespace attn;
using namespace attn::test;

namespace {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff: 8 significant bits, round to nearest
constexpr double kE = flash::kExp2Bf16Error;  // the relative error of the bf16 kernels' 2^x (test_exp2.cpp)

void bf16_forward(const SdpaProblem<float>& p) { flash_forward(p, Precision::bf16); }

// One query row of a case in fp64: its scores s[j] for j < end (the causal edge), -inf where masked,
// their magnitudes scale·Σ_d |q_d·k_d|, the max m (-inf: a fully masked row), Σ exp(s - m), and the bound
// δ of bf16 rounding on each score: Q and K rounded move a score by at most (2u + u²)·its magnitude
// (plus fp32 sums).
struct Row {
  std::vector<double> s, mag;
  double m = -kInf, sum = 0, delta = 0;
  int64_t end = 0, kvh = 0;
  double weight(int64_t j) const { return std::exp(s[size_t(j)] - m) / sum; }  // before dropout
};

struct Oracle {
  const Case& c;
  Bound<double> b;
  TensorD unused;  // the problem's output, never written
  SdpaProblem<double> p;
  explicit Oracle(const Inputs& in)
      : c(in.c), b(in.bind<double>()), unused({c.B, c.H, c.L, c.Dv}),
        p(make_problem(b.args, SdpaOut<double>{unused.view(), {}, {}})) {}
  static double at(const View<const double>& x, int64_t i, int64_t j, int64_t k, int64_t l) {
    return x.data[i * x.strides[0] + j * x.strides[1] + k * x.strides[2] + l * x.strides[3]];
  }
  Row row(int64_t bb, int64_t h, int64_t l) const {
    Row r;
    r.kvh = p.kv_head(h), r.end = p.keys(bb, l).end;  // these cases: causal at most (keys from 0)
    r.s.assign(size_t(r.end), 0), r.mag = r.s;
    for (int64_t j = 0; j < r.end; ++j) {
      double dot = 0, abs_dot = 0;
      for (int64_t d = 0; d < c.D; ++d) {
        const double x = at(b.args.q, bb, h, l, d) * at(b.args.k, bb, r.kvh, j, d);
        dot += x, abs_dot += std::abs(x);
      }
      r.s[size_t(j)] = dot * p.scale + p.bias(bb, h, l, j), r.mag[size_t(j)] = abs_dot * p.scale;
      r.m = std::max(r.m, r.s[size_t(j)]);
    }
    if (r.m == -kInf) return r;
    for (int64_t j = 0; j < r.end; ++j) {
      r.sum += std::exp(r.s[size_t(j)] - r.m);
      if (r.s[size_t(j)] > -kInf)
        r.delta = std::max(r.delta, (2 * kU + kU * kU) * r.mag[size_t(j)] + 1e-6 * (1 + r.mag[size_t(j)]));
    }
    return r;
  }
};

// The fp64 truth of a case and, per output element, the bound of bf16 rounding: the scores move by at
// most δ (Row), which moves each normalized weight by a factor within e^{±2δ_row}; 2^x's error ε (kE) on
// each weight and on their sum, by (1 + ε)/(1 - ε); P and V rounded add (1 + u)² more. So
//   |out' - out| <= (e^{2δ}·(1 + ε)/(1 - ε)·(1 + u)² - 1)·Σ_s w_s·|v_s|  (+ fp32 slack),
//   |lse' - lse| <= δ - ln(1 - ε) (+ slack).
struct Truth {
  std::vector<double> out, lse, out_bound, lse_bound;
};

Truth truth_of(const Inputs& in) {
  const Case& c = in.c;
  const Oracle o(in);
  Truth t;
  t.out.assign(size_t(c.B * c.H * c.L * c.Dv), 0), t.out_bound = t.out;
  t.lse.assign(size_t(c.B * c.H * c.L), -kInf), t.lse_bound.assign(t.lse.size(), 0);
  for (int64_t bb = 0; bb < c.B; ++bb)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l) {
        const Row r = o.row(bb, h, l);
        const int64_t row = (bb * c.H + h) * c.L + l;
        if (r.m == -kInf) continue;  // fully masked: out 0, lse -inf
        t.lse[size_t(row)] = r.m + std::log(r.sum);
        t.lse_bound[size_t(row)] = r.delta - std::log1p(-kE) + 1e-5;
        const double grow = std::exp(2 * r.delta) * (1 + kE) / (1 - kE) * (1 + kU) * (1 + kU) - 1 + 1e-5;
        for (int64_t e = 0; e < c.Dv; ++e) {
          double out = 0, w_abs_v = 0;
          for (int64_t j = 0; j < r.end; ++j) {
            const double w = r.weight(j) * o.p.keep_weight(bb, h, l, j), v = Oracle::at(o.b.args.v, bb, r.kvh, j, e);
            out += w * v, w_abs_v += std::abs(w * v);
          }
          t.out[size_t(row * c.Dv + e)] = out;
          t.out_bound[size_t(row * c.Dv + e)] = grow * w_abs_v + 1e-6;
        }
      }
  return t;
}

// Within the bound, and (where bf16 rounding can show) with an error far above fp32 flash's: the bf16
// products did run. Returns bf16's largest error over fp32's.
double expect_bf16_close(const Case& c) {
  SCOPED_TRACE(c.name());
  const Inputs in(c);
  const Truth t = truth_of(in);
  const Forward got = forward<float>(bf16_forward, in), f32 = forward<float>(flash_forward, in);
  double err = 0, err32 = 0;
  for (size_t i = 0; i < t.out.size(); ++i) {
    EXPECT_LE(std::abs(got.out[i] - t.out[i]), t.out_bound[i]) << "out element " << i;
    err = std::max(err, std::abs(got.out[i] - t.out[i])), err32 = std::max(err32, std::abs(f32.out[i] - t.out[i]));
  }
  for (size_t i = 0; i < t.lse.size(); ++i) {
    if (std::isinf(t.lse[i])) {
      EXPECT_EQ(got.lse[i], t.lse[i]) << "lse element " << i;  // a fully masked row: -inf, its output 0
      continue;
    }
    EXPECT_LE(std::abs(got.lse[i] - t.lse[i]), t.lse_bound[i]) << "lse element " << i;
  }
  return err / std::max(err32, 1e-12);
}

// Values as the raw bits of their floats; bits(): the output and LSE of the bf16 forward.
std::vector<uint32_t> bits_of(std::initializer_list<const std::vector<double>*> parts) {
  std::vector<uint32_t> x;
  for (const auto* v : parts)
    for (double d : *v) {
      const float f = static_cast<float>(d);
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      x.push_back(u);
    }
  return x;
}

std::vector<uint32_t> bits(const Inputs& in) {
  const Forward r = forward<float>(bf16_forward, in);
  return bits_of({&r.out, &r.lse});
}

// ---- Backward ----

// The gradients of the bf16 forward's out and LSE (flash_forward(p, prec)) by flash_backward(p, prec), as
// training under an Autocast runs them. Gradients start as NaN and go through the case's out_layout.
Grads flash_grads(const Inputs& in, Precision prec) {
  const Case& c = in.c;
  const Bound<float> b = in.bind<float>();
  Tensor out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L});
  const SdpaProblem<float> p = make_problem(b.args, SdpaOut<float>{out.view(), {}, lse.view()});
  flash_forward(p, prec);
  Arr<float> dq({c.B, c.H, c.L, c.D}, c.out_layout, NAN), dk({c.B, c.Hkv, c.S, c.D}, c.out_layout, NAN),
      dv({c.B, c.Hkv, c.S, c.Dv}, c.out_layout, NAN);
  flash_backward(p, b.dout.view, {dq.view, dk.view, dv.view}, prec);
  return {dq.values(), dk.values(), dv.values()};
}

// Per gradient element, the bound of bf16 rounding, first order in nothing (every product of bounds
// kept), from the forward's: with P the true weights, K the keep weights, u = 2^-8, ε = 2^x's error (kE),
//   P recomputed by 2^x from scores within δ and LSE within δ - ln(1 - ε):
//                                                        eP = (e^{2δ}·(1 + ε)/(1 - ε) - 1)·P
//   dP = V·dOᵀ from rounded V, dO:                        edP = (2u + u²)·Σ|v||do|
//   D = rowsum(dO∘O), O within the forward's bound Eo:   eD = Σ|do|·Eo
//   dS = P·(K·dP - D) = P·g, before its rounding:         edS = eP·|g| + (P + eP)·(K·edP + eD)
//   dV = Σ_l (K·P)·dO, both rounded:   Σ ((1 + u)·K·(u·P + (1 + u)·eP) + u·K·P)·|do|
//   dK = scale·Σ_l dS·q, dQ = scale·Σ_s dS·k, both rounded:  scale·Σ ((1 + u)·edS + u·|dS|)·|q| (|k|)
// plus fp32 slack (1e-5 of Σ of the terms' magnitudes) and 1e-6·(1 + the largest gradient).
Grads grad_bound_of(const Inputs& in, const Truth& t, const Grads& truth) {
  const Case& c = in.c;
  const Oracle o(in);
  const auto& A = o.b.args;
  const double u = kU, scale = o.p.scale;
  Grads bound{std::vector<double>(truth.dq.size(), 0), std::vector<double>(truth.dk.size(), 0),
              std::vector<double>(truth.dv.size(), 0)};
  std::vector<double> g(size_t(c.S)), eg(g.size()), P(g.size()), eP(g.size());
  for (int64_t bb = 0; bb < c.B; ++bb)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l) {
        const Row r = o.row(bb, h, l);
        if (r.m == -kInf) continue;  // fully masked: zero gradient, the slack only
        const int64_t row = (bb * c.H + h) * c.L + l, kvh = r.kvh;
        const auto kv = [&](int64_t j, int64_t d, int64_t width) {
          return size_t(((bb * c.Hkv + kvh) * c.S + j) * width + d);
        };
        double D = 0, eD = 0;
        for (int64_t e = 0; e < c.Dv; ++e) {
          const double dout = in.dout.data()[size_t(row * c.Dv + e)];
          D += dout * t.out[size_t(row * c.Dv + e)], eD += std::abs(dout) * t.out_bound[size_t(row * c.Dv + e)];
        }
        const double grow = std::exp(2 * r.delta + 2e-5) * (1 + kE) / (1 - kE) - 1;
        for (int64_t j = 0; j < r.end; ++j) {
          const double K = o.p.keep_weight(bb, h, l, j);
          double dP = 0, mag = 0;
          for (int64_t e = 0; e < c.Dv; ++e) {
            const double x = in.dout.data()[size_t(row * c.Dv + e)] * Oracle::at(A.v, bb, kvh, j, e);
            dP += x, mag += std::abs(x);
          }
          P[size_t(j)] = r.s[size_t(j)] == -kInf ? 0 : r.weight(j), eP[size_t(j)] = grow * P[size_t(j)];
          g[size_t(j)] = K * dP - D, eg[size_t(j)] = K * ((2 * u + u * u) * mag + 1e-6 * (1 + mag)) + eD;
          for (int64_t e = 0; e < c.Dv; ++e) {
            const double dout = std::abs(in.dout.data()[size_t(row * c.Dv + e)]), pj = P[size_t(j)];
            bound.dv[kv(j, e, c.Dv)] +=
                ((1 + u) * K * (u * pj + (1 + u) * eP[size_t(j)]) + u * K * pj) * dout + 1e-5 * K * pj * dout;
          }
        }
        for (int64_t j = 0; j < r.end; ++j) {
          const size_t jj = size_t(j);
          const double dS = std::abs(P[jj] * g[jj]), edS = eP[jj] * std::abs(g[jj]) + (P[jj] + eP[jj]) * eg[jj];
          const double f = scale * ((1 + u) * edS + u * dS), slack = 1e-5 * scale * dS;
          for (int64_t d = 0; d < c.D; ++d) {
            const double q = std::abs(Oracle::at(A.q, bb, h, l, d)), k = std::abs(Oracle::at(A.k, bb, kvh, j, d));
            bound.dq[size_t(row * c.D + d)] += (f + slack) * k;
            bound.dk[kv(j, d, c.D)] += (f + slack) * q;
          }
        }
      }
  const double atol = 1e-6 * (1 + [&] {
    double largest = 0;
    for (const auto* x : {&truth.dq, &truth.dk, &truth.dv})
      for (double y : *x) largest = std::max(largest, std::abs(y));
    return largest;
  }());
  for (auto* x : {&bound.dq, &bound.dk, &bound.dv})
    for (double& y : *x) y += atol;
  return bound;
}

// dq, dk, dv of the bf16 backward within their bounds; returns its largest error over fp32 flash's.
double expect_bf16_grads_close(const Case& c) {
  SCOPED_TRACE(c.name());
  const Inputs in(c);
  const Grads truth = backward<double>(reference_backward<double>, in);
  const Grads bound = grad_bound_of(in, truth_of(in), truth);
  const Grads got = flash_grads(in, Precision::bf16), f32 = flash_grads(in, Precision::f32);
  double err = 0, err32 = 0;
  const char* names[] = {"dq", "dk", "dv"};
  const std::vector<double>* parts[][4] = {{&got.dq, &f32.dq, &truth.dq, &bound.dq},
                                           {&got.dk, &f32.dk, &truth.dk, &bound.dk},
                                           {&got.dv, &f32.dv, &truth.dv, &bound.dv}};
  for (int i = 0; i < 3; ++i) {
    const auto& [g, g32, want, bnd] = parts[i];
    int bad = 0;
    for (size_t e = 0; e < want->size(); ++e) {
      const double d = std::abs((*g)[e] - (*want)[e]);
      if (!(d <= (*bnd)[e]) && bad++ < 5)
        ADD_FAILURE() << names[i] << " element " << e << ": error " << d << " over the bound " << (*bnd)[e];
      err = std::max(err, d), err32 = std::max(err32, std::abs((*g32)[e] - (*want)[e]));
    }
  }
  return err / std::max(err32, 1e-12);
}

// The three ways the bf16 tiles multiply, for a scope, as far as the CPU has them (else the next one down); AMX
// with its tiles in software (emulate_cpu_amx) where the CPU has AVX512_BF16 but no AMX.
constexpr const char* kKernels[] = {"AMX", "VDPBF16PS", "emulated"};
struct Bf16Kernel : Bf16Instructions {
  explicit Bf16Kernel(int k) : Bf16Instructions(k < 2, k == 0, k == 0 && !cpu_info().amx) {}
};

Case sized(int64_t L, int64_t S, int64_t D, int64_t Dv) {
  Case c;
  c.L = L, c.S = S, c.D = D, c.Dv = Dv;
  return c;
}

// The cases both bounds are checked on: odd L (a backward tile's last query pairs with padding), odd S (a
// block's last key with a zero row), D 1 and odd, causal both ways with odd edges, GQA, masks with fully
// masked rows, strided views, dropout, large scores.
std::vector<Case> bf16_cases() {
  std::vector<Case> cases;
  for (auto [L, S, D, Dv] : {std::array<int64_t, 4>{7, 9, 8, 8}, {65, 301, 64, 64}, {33, 513, 63, 80},
                             {130, 257, 128, 128}, {17, 31, 1, 3}, {40, 600, 80, 16}})
    cases.push_back(sized(L, S, D, Dv));
  Case c = sized(71, 300, 64, 64);
  c.causal = Causal::top_left, cases.push_back(c);
  c.causal = Causal::bottom_right, c.L = 51, cases.push_back(c);
  c = sized(61, 203, 64, 64), c.H = 8, c.Hkv = 2, c.causal = Causal::top_left, cases.push_back(c);  // GQA
  c = sized(60, 200, 32, 32), c.mask = additive(), c.padding = drop(), cases.push_back(c);           // masks
  c.masked_rows = 0.3, c.mask = keep(), cases.push_back(c);  // fully masked rows
  c = sized(60, 301, 64, 64), c.in_layout = 2, c.out_layout = 1, cases.push_back(c);                 // strided views
  c = sized(50, 201, 64, 64), c.dropout_p = 0.2, c.causal = Causal::top_left, cases.push_back(c);
  c = sized(20, 80, 64, 64), c.scale = 0.9, cases.push_back(c);                                       // large scores
  return cases;
}

// check (within the bound, returning bf16's error over fp32's) on every case, and bf16's rounding seen in one.
void expect_bf16_on_every_case(double (*check)(const Case&)) {
  double ratio = 0;
  for (const Case& cs : bf16_cases()) ratio = std::max(ratio, check(cs));
  EXPECT_GT(ratio, 20) << "bf16's error should be that of 8-bit operands, far above fp32 flash's";
}

}  // namespace

TEST(FlashBf16, WithinTheBoundOfBf16RoundingAgainstFp64) { expect_bf16_on_every_case(expect_bf16_close); }

TEST(FlashBf16, TheSameBitsWithTheInstructionAndItsEmulationOnEveryTargetCacheTileAndThreadCount) {
  Case c = sized(70, 333, 63, 80);
  c.H = 4, c.Hkv = 2, c.causal = Causal::top_left, c.mask = additive();
  const Inputs in(c);
  const std::vector<uint32_t> want = bits(in);
  int runs = 0, fma_targets = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (!(target & (HWY_AVX3 | HWY_AVX2))) continue;  // targets without FMA may give other bits (attn info)
    ++fma_targets;
    for (int kernel : {0, 1, 2})
      for (auto [l1d, l2] : {std::pair<int64_t, int64_t>{0, 0}, {32 << 10, 512 << 10}, {48 << 10, 2 << 20}})
        for (int threads : {1, 2})
          for (int64_t rows : {0, 12, 64}) {
            SCOPED_TRACE(cat(hwy::TargetName(target), " ", kKernels[kernel], " L1d ", l1d, " L2 ", l2, " threads ",
                             threads, " rows ", rows));
            const PretendMachine machine(target, l1d, l2, threads);
            const Bf16Kernel cpu(kernel);
            set_flash_tiles({0, rows});
            EXPECT_EQ(bits(in), want);
            set_flash_tiles({});
            ++runs;
          }
  }
  EXPECT_GE(fma_targets, cpu_info().avx512 ? 2 : 1);  // AVX2, and AVX3 where the CPU has AVX-512
  EXPECT_EQ(runs, 54 * fma_targets);
  if (!cpu_info().bf16) GTEST_LOG_(INFO) << "no AVX512_BF16 here: emulation against emulation only";
  if (!cpu_info().amx) GTEST_LOG_(INFO) << "no AMX here: its paths ran with their tiles in software";
}

TEST(FlashBf16, SdpaSendsAutocastToTheBf16KernelWithoutWeightsOnly) {
  Case c = sized(40, 200, 64, 64);
  const Inputs in(c);
  const Bound<float> b = in.bind<float>();
  const auto run = [&](bool weights, const SdpaOptions& opt) {
    Tensor out({c.B, c.H, c.L, c.Dv}), w(weights ? Shape{c.B, c.H, c.L, c.S} : Shape{0});
    sdpa(b.args, SdpaOut<float>{out.view(), weights ? w.view() : View<float>{}, {}}, opt);
    return std::vector<float>(out.data(), out.data() + out.numel());
  };
  const std::vector<float> f32 = run(false, {}), bf16 = [&] {
    const Autocast autocast(Precision::bf16);
    return run(false, {});  // SdpaOptions{} reads the thread's precision
  }();
  const Forward direct = forward<float>(bf16_forward, in);
  EXPECT_NE(f32, bf16);
  EXPECT_EQ(bf16, std::vector<float>(direct.out.begin(), direct.out.end()));
  {
    const Autocast autocast(Precision::bf16);
    EXPECT_EQ(run(true, {}), f32);  // weights requested: fp32, so they agree with the output
    SdpaOptions opt;
    opt.precision = Precision::f32;
    EXPECT_EQ(run(false, opt), f32);
    EXPECT_NE(explain(b.args, SdpaOut<float>{Tensor({c.B, c.H, c.L, c.Dv}).view(), {}, {}}).reason.find("bf16"),
              std::string::npos);
    const Bf16Instructions cpu(false, false);
    SdpaOptions strict;
    strict.strict = true;
    try {
      run(false, strict);
      ADD_FAILURE() << "strict bf16 ran emulated";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("AVX512_BF16"), std::string::npos) << e.what();
    }
  }
}

TEST(FlashBf16, MhaUnderAutocastTrainsWithBf16AttentionForwardAndBackward) {
  MhaOptions o;
  o.embed_dim = 64, o.num_heads = 4, o.batch_first = true, o.seed = 7;
  MultiheadAttention mha(o);
  Rng rng(3);
  Tensor x({2, 40, 64}), dy({2, 40, 64});
  for (Tensor* t : {&x, &dy})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = float(rng.normal());
  struct Run {
    std::vector<float> y, dx;
  };
  // The forward under `prec`; training: the backward too, under f32, so only the precision the forward
  // saved can make it bf16.
  const auto run = [&](bool training, Precision prec, bool weights = false) {
    mha.train(training);
    Run r;
    {
      const Autocast autocast(prec);
      MhaArgs args;
      args.need_weights = weights;  // weights keep the attention fp32 (they must agree with its output)
      const Tensor y = mha.forward(x.view(), x.view(), x.view(), args).output;
      r.y.assign(y.data(), y.data() + y.numel());
    }
    if (training) {
      const Autocast autocast(Precision::f32);
      const Tensor dx = mha.backward(dy.view()).dquery;
      r.dx.assign(dx.data(), dx.data() + dx.numel());
    }
    return r;
  };
  const Run eval16 = run(false, Precision::bf16), train16 = run(true, Precision::bf16),
            train32 = run(true, Precision::f32), weights16 = run(true, Precision::bf16, true);
  EXPECT_EQ(eval16.y, train16.y);  // no dropout: training multiplies as eval does, the attention in bf16
  EXPECT_NE(train16.y, weights16.y);
  EXPECT_NE(train16.dx, train32.dx);
  double err = 0, norm = 0;
  for (size_t i = 0; i < train32.dx.size(); ++i) {
    err = std::max(err, double(std::abs(train16.dx[i] - train32.dx[i])));
    norm = std::max(norm, double(std::abs(train32.dx[i])));
  }
  EXPECT_LT(err, 0.05 * norm) << "bf16 gradients far from fp32's";
}

TEST(FlashBf16, BackwardWithinTheBoundOfBf16RoundingAgainstFp64) { expect_bf16_on_every_case(expect_bf16_grads_close); }

// Every compiled target, those without FMA too (SSE4, and SCALAR with its one lane: pairs of keys and
// queries may not be whole vectors there): forward and backward within their bounds on odd sizes.
TEST(FlashBf16, WithinTheBoundsOnEveryTarget) {
  Case c = sized(37, 45, 7, 9);
  c.causal = Causal::top_left, c.H = 4, c.Hkv = 2, c.mask = additive();
  int targets = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const PretendMachine machine(target, 0, 0, 2);
    expect_bf16_close(c);
    expect_bf16_grads_close(c);
    ++targets;
  }
  EXPECT_GE(targets, 3);
}

// The bf16 backward's gradients, as raw bits.
std::vector<uint32_t> grad_bits(const Inputs& in) {
  const Grads g = flash_grads(in, Precision::bf16);
  return bits_of({&g.dq, &g.dk, &g.dv});
}

// Query rows per tile and the scratch budget (1: a phase per unit) change no bits (flash_backward_tiles);
// keys per block do, and stay derived.
TEST(FlashBf16, BackwardTheSameBitsWithTheInstructionAndItsEmulationOnEveryTargetTileAndThreadCount) {
  Case c = sized(71, 333, 63, 80);
  c.H = 4, c.Hkv = 2, c.causal = Causal::top_left, c.mask = additive(), c.dropout_p = 0.1;
  const Inputs in(c);
  const std::vector<uint32_t> want = grad_bits(in);
  int runs = 0, fma_targets = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (!(target & (HWY_AVX3 | HWY_AVX2))) continue;  // targets without FMA may give other bits (attn info)
    ++fma_targets;
    for (int kernel : {0, 1, 2})
      for (int threads : {1, 2})
        for (auto [rows, scratch] : {std::pair<int64_t, int64_t>{0, 0}, {16, 0}, {0, 1}}) {
          SCOPED_TRACE(cat(hwy::TargetName(target), " ", kKernels[kernel], " threads ", threads, " rows ", rows,
                           " scratch ", scratch));
          const PretendMachine machine(target, 0, 0, threads);
          const Bf16Kernel cpu(kernel);
          set_flash_backward_tiles({0, rows, scratch});
          EXPECT_EQ(grad_bits(in), want);
          set_flash_backward_tiles({});
          ++runs;
        }
  }
  EXPECT_GE(fma_targets, cpu_info().avx512 ? 2 : 1);  // AVX2, and AVX3 where the CPU has AVX-512
  EXPECT_EQ(runs, 18 * fma_targets);
}

// The bits the instructions give, on every CPU: on one without AMX or AVX512_BF16 the tests above compare the
// emulation only with itself, so these hashes (FNV-1a of the forward's out and LSE and of the backward's
// dQ, dK, dV on the two cases above) pin it to TDPBF16PS's arithmetic. First recorded on 2026-12-04 on an Intel
// Xeon with AMX from the forward's AMX tiles, which the tests above had found equal to VDPBF16PS's chains and
// the emulation there (the backward: VDPBF16PS and the emulation). Recorded again on 2026-12-07 for the bf16
// kernels' own 2^x (Exp2<true>), on an AMD Zen 4 from VDPBF16PS's chains, which the tests above found equal to
// the emulation and to AMX's paths with their tiles in software by TDPBF16PS's definition (the one measured on
// that Xeon, docs/kernels.md); print again with ATTN_PRINT_GOLDEN=1.
TEST(FlashBf16, TheGoldenBitsOfTheInstructionsOnEveryCpu) {
  Case c = sized(70, 333, 63, 80);
  c.H = 4, c.Hkv = 2, c.causal = Causal::top_left, c.mask = additive();
  const std::vector<uint32_t> fwd = bits(Inputs(c));
  c.L = 71, c.dropout_p = 0.1;
  const std::vector<uint32_t> bwd = grad_bits(Inputs(c));
  const uint64_t hf = fnv1a64(fwd.data(), fwd.size() * 4), hb = fnv1a64(bwd.data(), bwd.size() * 4);
  if (std::getenv("ATTN_PRINT_GOLDEN")) std::printf("forward 0x%016llxull backward 0x%016llxull\n",
                                                    (unsigned long long)hf, (unsigned long long)hb);
  EXPECT_EQ(hf, 0x2b21924b86467cddull) << "the bf16 flash forward's bits";
  EXPECT_EQ(hb, 0xada4fd02a487e95cull) << "the bf16 flash backward's bits";
}

TEST(FlashBf16, SdpaBackwardUnderAutocastIsTheBf16Kernel) {
  const Case c = sized(40, 200, 64, 64);
  const Inputs in(c);
  const Bound<float> b = in.bind<float>();
  const auto run = [&](Precision prec) {
    const Autocast autocast(prec);
    Tensor out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L});
    sdpa(b.args, SdpaOut<float>{out.view(), {}, lse.view()});
    Tensor dq({c.B, c.H, c.L, c.D}), dk({c.B, c.Hkv, c.S, c.D}), dv({c.B, c.Hkv, c.S, c.Dv});
    sdpa_backward<float>(b.args, out.view(), lse.view(), b.dout.view, {dq.view(), dk.view(), dv.view()});
    std::vector<double> x;
    for (const Tensor* t : {&dq, &dk, &dv}) x.insert(x.end(), t->data(), t->data() + t->numel());
    return x;
  };
  const Grads direct = flash_grads(in, Precision::bf16);
  std::vector<double> want = direct.dq;
  want.insert(want.end(), direct.dk.begin(), direct.dk.end());
  want.insert(want.end(), direct.dv.begin(), direct.dv.end());
  EXPECT_EQ(run(Precision::bf16), want);
  EXPECT_NE(run(Precision::f32), want);
}
