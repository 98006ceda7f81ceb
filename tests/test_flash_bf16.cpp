// The bf16 flash forward (flash_forward(p, Precision::bf16); sdpa() under an Autocast): Q·Kᵀ and P·V over
// bf16 pairs with fp32 sums and softmax. Against an fp64 oracle with a bound derived from bf16's 8-bit
// significand (and shown to be bf16's error, not fp32's); the same bits with VDPBF16PS and its emulation,
// on every SIMD target with FMA, for any cache size, tile rows and thread count; and where sdpa() sends
// bf16 (flash without weights) and where not (weights, the MHA training forward). Not speed
// (bench/compare_torch.py --bf16).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/mha.h"
#include "attn/threads.h"
#include "sdpa_harness.h"
#include "test_util.h"

using namespace attn;
using namespace attn::test;

namespace {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff: 8 significant bits, round to nearest

void bf16_forward(const SdpaProblem<float>& p) { flash_forward(p, Precision::bf16); }

// The fp64 truth of a case and, per output element, the bound of bf16 rounding: Q and K rounded move
// each score by at most δ = (2u + u²)·scale·Σ_d |q_d·k_d| (plus fp32 sums), which moves each normalized
// weight by a factor within e^{±2δ_row}; P and V rounded add (1 + u)² more. So
//   |out' - out| <= (e^{2δ}·(1 + u)² - 1)·Σ_s w_s·|v_s|  (+ fp32 slack),   |lse' - lse| <= δ (+ slack).
struct Truth {
  std::vector<double> out, lse, out_bound, lse_bound;
};

Truth truth_of(const Inputs& in) {
  const Case& c = in.c;
  const Bound<double> b = in.bind<double>();
  TensorD unused({c.B, c.H, c.L, c.Dv});
  const SdpaProblem<double> p = make_problem(b.args, SdpaOut<double>{unused.view(), {}, {}});
  Truth t;
  t.out.assign(size_t(c.B * c.H * c.L * c.Dv), 0), t.out_bound = t.out;
  t.lse.assign(size_t(c.B * c.H * c.L), -kInf), t.lse_bound.assign(t.lse.size(), 0);
  const auto at = [](const View<const double>& x, int64_t i, int64_t j, int64_t k, int64_t l) {
    return x.data[i * x.strides[0] + j * x.strides[1] + k * x.strides[2] + l * x.strides[3]];
  };
  std::vector<double> s(size_t(c.S)), mag(size_t(c.S));
  for (int64_t bb = 0; bb < c.B; ++bb)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l) {
        const int64_t kvh = p.kv_head(h), end = p.key_end(l), row = (bb * c.H + h) * c.L + l;
        double m = -kInf, delta = 0;
        for (int64_t j = 0; j < end; ++j) {
          double dot = 0, abs_dot = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            const double x = at(b.args.q, bb, h, l, d) * at(b.args.k, bb, kvh, j, d);
            dot += x, abs_dot += std::abs(x);
          }
          s[j] = dot * p.scale + p.bias(bb, h, l, j);
          mag[j] = abs_dot * p.scale;
          if (s[j] > m) m = s[j];
        }
        if (m == -kInf) continue;  // fully masked: out 0, lse -inf
        double sum = 0;
        for (int64_t j = 0; j < end; ++j) {
          sum += std::exp(s[j] - m);
          if (s[j] > -kInf) delta = std::max(delta, (2 * kU + kU * kU) * mag[j] + 1e-6 * (1 + mag[j]));
        }
        t.lse[row] = m + std::log(sum);
        t.lse_bound[row] = delta + 1e-5;
        const double grow = std::exp(2 * delta) * (1 + kU) * (1 + kU) - 1 + 1e-5;
        for (int64_t e = 0; e < c.Dv; ++e) {
          double o = 0, w_abs_v = 0;
          for (int64_t j = 0; j < end; ++j) {
            const double w = std::exp(s[j] - m) / sum * p.keep_weight(bb, h, l, j), v = at(b.args.v, bb, kvh, j, e);
            o += w * v, w_abs_v += std::abs(w * v);
          }
          t.out[size_t(row * c.Dv + e)] = o;
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

// The output and LSE of the bf16 forward, as raw bits.
std::vector<uint32_t> bits(const Inputs& in) {
  const Forward r = forward<float>(bf16_forward, in);
  std::vector<uint32_t> x;
  for (const auto* v : {&r.out, &r.lse})
    for (double d : *v) {
      const float f = static_cast<float>(d);
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      x.push_back(u);
    }
  return x;
}

struct Bf16Cpu {  // set_cpu_bf16 for a scope: false runs the emulation
  explicit Bf16Cpu(bool on) { set_cpu_bf16(on); }
  ~Bf16Cpu() { set_cpu_bf16(true); }
};

Case sized(int64_t L, int64_t S, int64_t D, int64_t Dv) {
  Case c;
  c.L = L, c.S = S, c.D = D, c.Dv = Dv;
  return c;
}

}  // namespace

TEST(FlashBf16, WithinTheBoundOfBf16RoundingAgainstFp64) {
  std::vector<Case> cases;
  for (auto [L, S, D, Dv] : {std::array<int64_t, 4>{7, 9, 8, 8}, {65, 300, 64, 64}, {33, 513, 63, 80},
                             {100, 257, 128, 128}, {17, 31, 1, 3}, {40, 600, 80, 16}})
    cases.push_back(sized(L, S, D, Dv));
  Case c = sized(70, 300, 64, 64);
  c.causal = Causal::top_left, cases.push_back(c);
  c.causal = Causal::bottom_right, c.L = 50, cases.push_back(c);
  c = sized(60, 200, 64, 64), c.H = 8, c.Hkv = 2, cases.push_back(c);                        // GQA
  c = sized(60, 200, 32, 32), c.mask = additive(), c.padding = drop(), cases.push_back(c);  // masks
  c.masked_rows = 0.3, c.mask = keep(), cases.push_back(c);                                  // fully masked rows
  c = sized(60, 301, 64, 64), c.in_layout = 2, c.out_layout = 1, cases.push_back(c);        // strided views
  c = sized(50, 200, 64, 64), c.dropout_p = 0.2, cases.push_back(c);
  c = sized(20, 80, 64, 64), c.scale = 0.9, cases.push_back(c);                              // large scores
  double ratio = 0;
  for (const Case& cs : cases) ratio = std::max(ratio, expect_bf16_close(cs));
  EXPECT_GT(ratio, 20) << "bf16's error should be that of 8-bit operands, far above fp32 flash's";
}

TEST(FlashBf16, TheSameBitsWithTheInstructionAndItsEmulationOnEveryTargetCacheTileAndThreadCount) {
  Case c = sized(70, 333, 63, 80);
  c.H = 4, c.Hkv = 2, c.causal = Causal::top_left, c.mask = additive();
  const Inputs in(c);
  const std::vector<uint32_t> want = bits(in);
  int runs = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (!(target & (HWY_AVX3 | HWY_AVX2))) continue;  // targets without FMA may give other bits (attn info)
    for (bool native : {true, false})
      for (auto [l1d, l2] : {std::pair<int64_t, int64_t>{0, 0}, {32 << 10, 512 << 10}, {48 << 10, 2 << 20}})
        for (int threads : {1, 2})
          for (int64_t rows : {0, 12, 64}) {
            SCOPED_TRACE(cat(hwy::TargetName(target), native ? " native" : " emulated", " L1d ", l1d, " L2 ", l2,
                             " threads ", threads, " rows ", rows));
            const PretendMachine machine(target, l1d, l2, threads);
            const Bf16Cpu cpu(native && cpu_info().bf16);
            set_flash_tiles({0, rows});
            EXPECT_EQ(bits(in), want);
            set_flash_tiles({});
            ++runs;
          }
  }
  EXPECT_GE(runs, 36);  // AVX2 and AVX3 (this test needs an AVX-512 machine to see both; CI's are)
  if (!cpu_info().bf16) GTEST_LOG_(INFO) << "no AVX512_BF16 here: emulation against emulation only";
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
    const Bf16Cpu cpu(false);
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

TEST(FlashBf16, MhaUnderAutocastMultipliesInBf16InEvalAndFp32InTraining) {
  MhaOptions o;
  o.embed_dim = 64, o.num_heads = 4, o.batch_first = true, o.seed = 7;
  MultiheadAttention mha(o);
  Rng rng(3);
  Tensor x({2, 40, 64});
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = float(rng.normal());
  const auto fwd = [&](bool training, Precision prec) {
    mha.train(training);
    const Autocast autocast(prec);
    MhaArgs args;
    args.need_weights = false;  // weights keep the attention fp32 (they must agree with its output)
    const Tensor y = mha.forward(x.view(), x.view(), x.view(), args).output;
    return std::vector<float>(y.data(), y.data() + y.numel());
  };
  // Projections multiply in bf16 in both modes, the attention in eval only: training and eval agree
  // under f32 (no dropout), not under bf16.
  const std::vector<float> eval16 = fwd(false, Precision::bf16), train16 = fwd(true, Precision::bf16);
  EXPECT_NE(eval16, train16);
  EXPECT_EQ(fwd(false, Precision::f32), fwd(true, Precision::f32));
}
