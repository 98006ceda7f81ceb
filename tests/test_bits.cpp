// One answer on every CPU: the bits of attn's results depend on nothing the machine decides. Each test
// runs the same computation under every configuration this machine can pretend to be — every SIMD target
// with FMA that it supports (AVX-512 and AVX2 here, forced through Highway's SetSupportedTargetsForTest),
// several cache sizes (set_cpu_caches: L1d 32/48 KiB, L2 512 KiB/1 MiB/2 MiB, which change the GEMM's K
// block and tiles) and 1 or 2 threads — and expects the same bits in every one. The GEMM is also checked
// against the scalar loop that defines its bits (one fma chain per element), so it holds on any CPU.
// Not accuracy (test_gemm, test_flash, test_backward compare against fp64 oracles) and not speed.
#include <gtest/gtest.h>
#include <hwy/targets.h>  // with the library's HWY_DISABLED_TARGETS (CMakeLists.txt): its targets, no more

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/cpu.h"
#include "attn/gemm.h"
#include "attn/gpt.h"
#include "attn/kernels/half_kv.h"
#include "attn/nn.h"
#include "attn/sdpa.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "attn/train.h"
#include "attn/tune.h"
#include "test_util.h"

namespace attn {
namespace {

// One configuration the machine pretends to be.
struct Config {
  int64_t target;   // Highway target
  int64_t l1d, l2;  // bytes
  int threads;
  std::string name() const {
    return std::string(hwy::TargetName(target)) + ", L1d " + std::to_string(l1d >> 10) + " KiB, L2 " +
           std::to_string(l2 >> 10) + " KiB, " + std::to_string(threads) + " thread(s)";
  }
};

// Every FMA target this CPU runs x four cache shapes, threads alternating 1 and 2 (where there are 2).
std::vector<Config> configs() {
  const CpuInfo& c = cpu_info();
  const int64_t caches[][2] = {{c.l1d, c.l2}, {32 << 10, 512 << 10}, {48 << 10, 1 << 20}, {32 << 10, 2 << 20}};
  std::vector<Config> out;
  int n = 0;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (!fma_target(t)) continue;  // no FMA: other bits, by design
    for (const auto& cs : caches) out.push_back({t, cs[0], cs[1], 1 + (n++ % std::min(2, max_threads()))});
  }
  return out;
}

// f() under each configuration; compare(first, now) expects the first one's result again.
template <typename R>
void expect_same_everywhere(const std::function<R()>& f, const std::function<void(const R&, const R&)>& same) {
  const std::vector<Config> all = configs();
  ASSERT_FALSE(all.empty()) << "no SIMD target with FMA on this CPU: nothing to compare";
  R first{};
  for (size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(all[i].name());
    const test::PretendMachine as(all[i].target, all[i].l1d, all[i].l2, all[i].threads);
    R r = f();
    if (i == 0) first = std::move(r);
    else same(first, r);
  }
}

template <typename T>
void expect_bits(const std::vector<T>& want, const std::vector<T>& got, const char* what) {
  EXPECT_TRUE(test::same_bits(want, got)) << what;
}

std::vector<float> uniform(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = u(gen);
  return x;
}

// ---- GEMM: the scalar chain, on every configuration ----

struct GemmCase {
  int64_t M, N, K;
  bool ta, tb;
  double alpha, beta;
};

// C = fma chain over k in order from C0 (0, C or beta·C), with products (alpha·a)·b: the bits the
// GEMM documents (gemm.cpp's header).
template <typename T>
std::vector<T> chain(const GemmCase& g, const std::vector<T>& a, int64_t lda, const std::vector<T>& b, int64_t ldb,
                     std::vector<T> c, int64_t ldc) {
  const T alpha = T(g.alpha), beta = T(g.beta);
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) {
      T& cij = c[size_t(i * ldc + j)];
      T acc = beta == T(0) ? T(0) : beta == T(1) ? cij : beta * cij;
      for (int64_t k = 0; k < g.K; ++k) {
        const T x = g.ta ? a[size_t(k * lda + i)] : a[size_t(i * lda + k)];
        const T y = g.tb ? b[size_t(j * ldb + k)] : b[size_t(k * ldb + j)];
        acc = std::fma(alpha == T(1) ? x : alpha * x, y, acc);
      }
      cij = acc;
    }
  return c;
}

template <typename T>
void expect_gemm_is_the_chain(const GemmCase& g) {
  SCOPED_TRACE(testing::Message() << "M=" << g.M << " N=" << g.N << " K=" << g.K << " ta=" << g.ta << " tb=" << g.tb
                                  << " alpha=" << g.alpha << " beta=" << g.beta << " " << sizeof(T) * 8 << "-bit");
  const int64_t pad = 3, lda = (g.ta ? g.M : g.K) + pad, ldb = (g.tb ? g.K : g.N) + pad, ldc = g.N + pad;
  auto cast = [](const std::vector<float>& x) { return std::vector<T>(x.begin(), x.end()); };
  const std::vector<T> a = cast(uniform(size_t((g.ta ? g.K : g.M) * lda), 1));
  const std::vector<T> b = cast(uniform(size_t((g.tb ? g.N : g.K) * ldb), 2));
  const std::vector<T> c0 = cast(uniform(size_t(g.M * ldc), 3));
  const std::vector<T> want = chain<T>(g, a, lda, b, ldb, c0, ldc);
  // float: on each of the target's register blocks; B packed once here (under the CPU's own target and
  // block) and again under each configuration; on panels of another width the first packs B per call, as
  // gemm() does
  PackedB once;
  if constexpr (std::is_same_v<T, float>) once = pack_b(g.tb, g.K, g.N, b.data(), ldb);
  expect_same_everywhere<std::vector<T>>(
      [&] {
        std::vector<T> c = c0;
        gemm(g.ta, g.tb, g.M, g.N, g.K, T(g.alpha), a.data(), lda, b.data(), ldb, T(g.beta), c.data(), ldc);
        expect_bits(want, c, "gemm against the scalar fma chain");
        if constexpr (std::is_same_v<T, float>) {
          for (const RegisterBlock& rb : gemm_register_blocks())
            for (int64_t keep_b : {0, 1}) {
              SCOPED_TRACE(testing::Message() << "register block " << rb.rows << "x" << rb.cols << ", keep_b "
                                              << keep_b);
              force_tuning({.gemm_mr = rb.rows, .gemm_keep_b = keep_b});
              std::vector<float> cb = c0;
              gemm(g.ta, g.tb, g.M, g.N, g.K, float(g.alpha), a.data(), lda, b.data(), ldb, float(g.beta), cb.data(),
                   ldc);
              expect_bits(want, cb, "gemm against the scalar fma chain");
              for (const PackedB& p : {once, pack_b(g.tb, g.K, g.N, b.data(), ldb)}) {
                std::vector<float> cp = c0;
                gemm(g.ta, g.M, float(g.alpha), a.data(), lda, p, float(g.beta), cp.data(), ldc);
                expect_bits(want, cp, "gemm over packed B against the scalar fma chain");
              }
            }
          clear_forced_tuning();
        }
        return c;
      },
      [](const std::vector<T>& x, const std::vector<T>& y) { expect_bits(x, y, "gemm"); });
}

TEST(Bits, GemmIsOneFmaChainPerElementOnEveryConfiguration) {
  // K of 1100 and 2100: several K blocks at every L1d; odd M, N: edge tiles and partial vectors.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      expect_gemm_is_the_chain<float>({7, 65, 1100, ta, tb, 1, 0});
      expect_gemm_is_the_chain<float>({65, 129, 700, ta, tb, 1, 1});
      expect_gemm_is_the_chain<float>({13, 200, 2100, ta, tb, 0.5, 0.25});
      expect_gemm_is_the_chain<double>({19, 33, 1300, ta, tb, -2, 0});
      // few rows under a transposed B: computed as Cᵀ, from C (a linear's bias), beta·C, and in double
      expect_gemm_is_the_chain<float>({48, 300, 1100, ta, tb, 1, 1});
      expect_gemm_is_the_chain<float>({9, 100, 500, ta, tb, 1, 0.5});
      expect_gemm_is_the_chain<double>({19, 33, 1300, ta, tb, 1, -1});
      // row blocks of 2 and 4 (2; 3 as 4; 8 as 4 + 4; 14 as 4 + 6 + 4), as Cᵀ when B is transposed
      for (int64_t M : {2, 3, 8, 14}) expect_gemm_is_the_chain<float>({M, 40, 300, ta, tb, 1, 0});
    }
  expect_gemm_is_the_chain<float>({1, 1, 1, false, false, 1, 0});
  expect_gemm_is_the_chain<float>({130, 67, 900, false, true, 1, -1});
}

// ---- Attention: forward (tiles, few rows, decode; fp32 and half K/V) and backward ----

struct AttnCase {
  int64_t B, H, Hkv, L, S, D, Dv;
  Causal causal = Causal::none;
  bool additive_mask = false, key_padding = false;
  double dropout = 0;
  // variants: a window, ALiBi slopes (H), softcap, a relative bias of rel_buckets, documents of these lengths
  Window window;
  bool alibi = false;
  double softcap = 0;
  int64_t rel_buckets = 0;
  std::vector<int64_t> docs;
  Precision precision = Precision::f32;
};

struct Inputs {
  AttnCase c;
  std::vector<float> q, k, v, mask, dout, slopes, table;
  std::vector<uint8_t> pad;
  std::vector<int64_t> ids;
  explicit Inputs(const AttnCase& c_) : c(c_) {
    slopes = uniform(size_t(c.H), 16, 0.01f, 0.5f);
    table = uniform(size_t(std::max<int64_t>(c.rel_buckets, 1) * c.H), 17, -2, 2);
    for (int64_t b = 0; b < c.B; ++b)
      for (size_t i = 0; i < c.docs.size(); ++i) ids.insert(ids.end(), size_t(c.docs[i]), int64_t(i));
    q = uniform(size_t(c.B * c.H * c.L * c.D), 11, -2, 2);
    k = uniform(size_t(c.B * c.Hkv * c.S * c.D), 12, -2, 2);
    v = uniform(size_t(c.B * c.Hkv * c.S * c.Dv), 13);
    mask = uniform(size_t(c.L * c.S), 14, -3, 1);
    dout = uniform(size_t(c.B * c.H * c.L * c.Dv), 15);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = 0; s < c.S; ++s) pad.push_back(s % 7 == 3 || s >= c.S - b);  // true = ignore
  }
  SdpaArgs<float> args() const {
    SdpaArgs<float> a{{q.data(), {c.B, c.H, c.L, c.D}}, {k.data(), {c.B, c.Hkv, c.S, c.D}},
                      {v.data(), {c.B, c.Hkv, c.S, c.Dv}}};
    if (c.additive_mask) a.attn_mask = Mask<float>::additive({mask.data(), {c.L, c.S}});
    if (c.key_padding) a.key_padding = Mask<float>::drop({pad.data(), {c.B, c.S}});
    a.causal = c.causal;
    a.dropout_p = c.dropout;
    a.seed = 7;
    a.window = c.window, a.softcap = c.softcap;
    if (c.alibi) a.alibi_slopes = {slopes.data(), {c.H}};
    if (c.rel_buckets) a.relative_bias.table = {table.data(), {c.rel_buckets, c.H}}, a.relative_bias.max_distance = 300;
    if (!c.docs.empty()) a.documents.ids = {ids.data(), {c.B, c.L}};
    return a;
  }
};

// out, lse, then (if backward) dq, dk, dv, all in one vector.
std::vector<float> run_attention(const Inputs& in, bool backward, KvDtype kv = KvDtype::f32) {
  const AttnCase& c = in.c;
  std::vector<float> out(size_t(c.B * c.H * c.L * c.Dv)), lse(size_t(c.B * c.H * c.L));
  const SdpaArgs<float> a = in.args();
  const SdpaOut<float> o{{out.data(), {c.B, c.H, c.L, c.Dv}}, {}, {lse.data(), {c.B, c.H, c.L}}};
  const SdpaOptions flash{Backend::flash, false, c.precision};
  if (kv != KvDtype::f32) {
    std::vector<uint16_t> kh(in.k.size()), vh(in.v.size());
    to_half(kv, in.k.data(), int64_t(in.k.size()), kh.data());
    to_half(kv, in.v.data(), int64_t(in.v.size()), vh.data());
    SdpaArgs<float> qa = a;
    qa.k = {}, qa.v = {};
    sdpa(qa, HalfKV{kv, {kh.data(), {c.B, c.Hkv, c.S, c.D}}, {vh.data(), {c.B, c.Hkv, c.S, c.Dv}}}, o);
  } else {
    sdpa(a, o, flash);
  }
  std::vector<float> all = out;
  all.insert(all.end(), lse.begin(), lse.end());
  if (!backward) return all;
  std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size()), drel(size_t(c.rel_buckets * c.H));
  SdpaGrads<float> g{{dq.data(), {c.B, c.H, c.L, c.D}}, {dk.data(), {c.B, c.Hkv, c.S, c.D}},
                     {dv.data(), {c.B, c.Hkv, c.S, c.Dv}}};
  if (c.rel_buckets) g.drelative_bias = {drel.data(), {c.rel_buckets, c.H}};
  sdpa_backward<float>(a, {out.data(), {c.B, c.H, c.L, c.Dv}}, {lse.data(), {c.B, c.H, c.L}},
                       {in.dout.data(), {c.B, c.H, c.L, c.Dv}}, g, flash);
  for (auto* x : {&dq, &dk, &dv, &drel}) all.insert(all.end(), x->begin(), x->end());
  return all;
}

void expect_attention_same_everywhere(const AttnCase& c, bool backward, KvDtype kv = KvDtype::f32) {
  SCOPED_TRACE(testing::Message() << "B=" << c.B << " H=" << c.H << " Hkv=" << c.Hkv << " L=" << c.L << " S=" << c.S
                                  << " D=" << c.D << " Dv=" << c.Dv << " kv " << to_string(kv));
  const Inputs in(c);
  expect_same_everywhere<std::vector<float>>(
      [&] { return run_attention(in, backward, kv); },
      [](const std::vector<float>& x, const std::vector<float>& y) { expect_bits(x, y, "attention"); });
}

TEST(Bits, FlashForwardAndBackwardOnEveryConfiguration) {
  // S = 600 spans several key tiles (the online softmax rescales at each); D 63 and Dv 80 pad to the
  // lanes differently on AVX2 and AVX-512; masks, causal alignments, GQA and dropout.
  AttnCase c{2, 4, 2, 70, 600, 63, 80, Causal::top_left, true, true};
  expect_attention_same_everywhere(c, true);
  c = {1, 8, 2, 257, 300, 64, 64, Causal::bottom_right};
  c.dropout = 0.2;
  expect_attention_same_everywhere(c, true);
  c = {1, 3, 1, 5, 100, 48, 40};  // few rows: K read as rows, Sᵀ = K·Qᵀ
  c.key_padding = true;
  expect_attention_same_everywhere(c, true);
}

TEST(Bits, VariantsOnEveryConfiguration) {
  // windows (tiles skipped, bands trimmed), ALiBi, softcap, a relative bias (its gradient summed by distance
  // and bucket), documents; fp32 and bf16 products; decoding with a window and biases
  for (Precision prec : {Precision::f32, Precision::bf16}) {
    AttnCase c{2, 4, 2, 300, 600, 63, 80, Causal::bottom_right, true, true};
    c.window = {200, 0}, c.alibi = true, c.softcap = 2, c.precision = prec;
    expect_attention_same_everywhere(c, true);
    c = {2, 4, 4, 400, 400, 64, 64, Causal::top_left};
    c.docs = {150, 1, 249}, c.rel_buckets = 32, c.dropout = 0.1, c.precision = prec;
    expect_attention_same_everywhere(c, true);
  }
  AttnCase d{1, 8, 2, 1, 2100, 64, 64, Causal::bottom_right};
  d.window = {700, 0}, d.alibi = true, d.rel_buckets = 16, d.softcap = 3;
  expect_attention_same_everywhere(d, false);
}

TEST(Bits, DecodeOnEveryConfiguration) {
  // One query row per head against 1500 / 2100 keys: S split into chunks, dot products over D in
  // virtual lanes; D 80 is not a multiple of 16 (AVX-512 pads it, AVX2 does not).
  for (KvDtype kv : {KvDtype::f32, KvDtype::f16, KvDtype::bf16}) {
    expect_attention_same_everywhere({1, 16, 1, 1, 1500, 64, 64}, false, kv);
    AttnCase c{2, 8, 2, 1, 2100, 80, 48, Causal::bottom_right, false, true};
    expect_attention_same_everywhere(c, false, kv);
  }
}

// ---- Encoder and decoder layers, forward and backward (post-LN and pre-LN, dropout, GQA) ----

std::vector<float> layers_run(bool norm_first) {
  TransformerOptions o;
  o.d_model = 48, o.nhead = 6, o.num_kv_heads = 2, o.dim_feedforward = 600, o.dropout = 0.1;
  o.batch_first = true, o.norm_first = norm_first, o.seed = 9;
  TransformerEncoderLayer enc(o);
  TransformerDecoderLayer dec(o);
  const int64_t N = 2, L = 37, S = 29;
  std::vector<float> src = uniform(size_t(N * L * o.d_model), 21), mem = uniform(size_t(N * S * o.d_model), 22);
  std::vector<float> dout = uniform(size_t(N * L * o.d_model), 23);
  Tensor y = enc.forward({src.data(), {N, L, o.d_model}});
  Tensor z = dec.forward(y.view(), {mem.data(), {N, S, o.d_model}});
  DecoderGrads g = dec.backward({dout.data(), {N, L, o.d_model}});
  Tensor dsrc = enc.backward(g.dtgt.view());
  std::vector<float> all(z.data(), z.data() + z.numel());
  for (const Tensor* t : {&g.dmemory, &dsrc}) all.insert(all.end(), t->data(), t->data() + t->numel());
  for (Layer* l : {static_cast<Layer*>(&enc), static_cast<Layer*>(&dec)})
    for (const Param& p : l->parameter_list()) all.insert(all.end(), p.grad->data(), p.grad->data() + p.grad->numel());
  return all;
}

TEST(Bits, EncoderAndDecoderLayersOnEveryConfiguration) {
  for (bool norm_first : {false, true})
    expect_same_everywhere<std::vector<float>>([&] { return layers_run(norm_first); },
                                               [](const std::vector<float>& x, const std::vector<float>& y) {
                                                 expect_bits(x, y, "outputs and gradients");
                                               });
}

// ---- Training (every layer forward and backward, AdamW) and generation ----

struct RunBits {
  std::vector<float> losses, params;
  std::vector<int64_t> tokens;
};

RunBits train_and_generate(const TrainOptions& o, Dataset d) {
  Trainer t(o, std::move(d));
  RunBits r;
  for (int i = 0; i < 4; ++i) r.losses.push_back(t.step().loss);
  for (const Param& p : t.model().parameter_list())
    r.params.insert(r.params.end(), p.value->data(), p.value->data() + p.value->numel());
  SampleOptions s;
  s.max_new_tokens = 24, s.temperature = 0.9, s.seed = 3;
  r.tokens = generate(t.model(), {1, 2, 3}, s);
  return r;
}

void expect_run_same_everywhere(const TrainOptions& o, const std::function<Dataset()>& data) {
  expect_same_everywhere<RunBits>([&] { return train_and_generate(o, data()); },
                                  [](const RunBits& x, const RunBits& y) {
                                    expect_bits(x.losses, y.losses, "losses");
                                    expect_bits(x.params, y.params, "parameters after 4 steps");
                                    EXPECT_EQ(x.tokens, y.tokens) << "generated tokens";
                                  });
}

TEST(Bits, TrainingStepsAndGenerationOnEveryConfiguration) {
  TrainOptions tiny = synthetic_defaults();  // biases, LayerNorm, GELU, dropout, ignored targets
  tiny.dropout = 0.1;
  expect_run_same_everywhere(tiny, [] { return Dataset::reverse_task(); });
  TrainOptions nano;  // nanoGPT's CPU shape: E 128, K up to 512 in the MLP's GEMMs
  nano.config = "nanogpt-cpu", nano.block_size = 32, nano.batch = 4, nano.warmup = 2;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 17) + "\n";
  expect_run_same_everywhere(nano, [&] { return Dataset::text(text); });
}

}  // namespace
}  // namespace attn
