// MultiheadAttention against a plain-loop fp64 oracle written here (per-head projections by hand,
// masks as PyTorch defines them, softmax with the zero policy), over layouts, kdim/vdim, GQA/MQA,
// add_bias_kv, add_zero_attn and every mask kind; plus errors, state_dict I/O, dropout and the trace.
// Not a test against PyTorch itself: tests/python/test_mha.py is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attn/mha.h"
#include "attn/param.h"
#include "attn/rng.h"
#include "sdpa_harness.h"
#include "test_util.h"

using namespace attn;
using test::error_of;

namespace {

// fp32 projections and softmax over sums of <= 64 unit-scale terms err by ~1e-6 against fp64; 2e-5 is
// 10x that, and far below any semantic error (a wrong mask or head mapping moves values by ~0.1).
constexpr double kTol = 2e-5;

using Bools = TensorT<uint8_t>;

using test::kInf;
using test::MaskKind;  // the SDPA family's mask kinds; MultiheadAttention takes none, drop and additive

struct Case {
  MhaOptions o{.embed_dim = 16, .num_heads = 4, .seed = 1};
  int64_t B = 2, L = 5, S = 5;
  bool self = false;        // query, key and value are one view (needs L == S, kdim == vdim == E)
  bool unbatched = false;
  bool strided = false;     // seq-first inputs as transposed views of (B, T, C) data, not contiguous copies
  MaskKind kpm = MaskKind::none, am = MaskKind::none;
  int am_rank = 2;          // (L, S) or (N·H, L, S)
  bool causal = false;
  bool need_weights = true, average = false;
  bool randomize_biases = true;  // PyTorch initialises them to 0; nonzero ones test the bias slices
};

// The oracle. x* are (B, T, C) logical tensors; bias(b, h, l, s) is what the masks add over S' columns.
struct Oracle {
  std::vector<double> out;  // (B, L, E)
  std::vector<double> w;    // (B, H, L, S')
};

template <typename Bias>
Oracle oracle(const MhaOptions& o, const StateDict& sd, const Tensor& xq, const Tensor& xk, const Tensor& xv,
              Bias bias, bool causal) {
  const int64_t B = xq.size(0), L = xq.size(1), S = xk.size(1), E = o.embed_dim, H = o.num_heads;
  const int64_t Hkv = o.num_kv_heads, D = E / H, KV = Hkv * D;
  const int64_t S2 = S + o.add_bias_kv + o.add_zero_attn;
  const bool packed = sd.count("in_proj_weight") > 0;
  // Weight rows of each projection: packed (3E, E) or separate.
  const float* Wq = packed ? sd.at("in_proj_weight").data() : sd.at("q_proj_weight").data();
  const float* Wk = packed ? Wq + E * E : sd.at("k_proj_weight").data();
  const float* Wv = packed ? Wq + 2 * E * E : sd.at("v_proj_weight").data();
  const float* bin = o.bias ? sd.at("in_proj_bias").data() : nullptr;  // (E + 2·KV)
  auto proj = [](const float* W, const float* b, const float* x, int64_t in, int64_t row) {
    double acc = b ? b[row] : 0.0;
    for (int64_t e = 0; e < in; ++e) acc += double(W[row * in + e]) * x[e];
    return acc;
  };
  Oracle r{std::vector<double>(B * L * E), std::vector<double>(B * H * L * S2)};
  std::vector<double> ctx(B * L * E);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);  // the KV head of query head h, written independently of sdpa.h
      // K and V of this head, (S', D): projected rows, then bias_k / bias_v, then the zero row.
      std::vector<double> k(S2 * D, 0.0), v(S2 * D, 0.0);
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) {
          k[s * D + d] = proj(Wk, bin ? bin + E : nullptr, xk.data() + (b * S + s) * o.kdim, o.kdim, g * D + d);
          v[s * D + d] = proj(Wv, bin ? bin + E + KV : nullptr, xv.data() + (b * S + s) * o.vdim, o.vdim, g * D + d);
        }
      if (o.add_bias_kv)
        for (int64_t d = 0; d < D; ++d) {
          k[S * D + d] = sd.at("bias_k").data()[g * D + d];
          v[S * D + d] = sd.at("bias_v").data()[g * D + d];
        }
      for (int64_t l = 0; l < L; ++l) {
        std::vector<double> q(D), p(S2);
        for (int64_t d = 0; d < D; ++d) q[d] = proj(Wq, bin, xq.data() + (b * L + l) * E, E, h * D + d);
        double m = -kInf;
        for (int64_t s = 0; s < S2; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[s * D + d];
          p[s] = dot / std::sqrt(double(D)) + bias(b, h, l, s) + (causal && s < S && s > l ? -kInf : 0.0);
          m = std::max(m, p[s]);
        }
        double sum = 0;
        for (double& x : p) sum += (x = m == -kInf ? 0.0 : std::exp(x - m));
        for (int64_t s = 0; s < S2; ++s) {
          const double w = m == -kInf ? 0.0 : p[s] / sum;  // fully masked row: zeros
          r.w[((b * H + h) * L + l) * S2 + s] = w;
          for (int64_t d = 0; d < D; ++d) ctx[(b * L + l) * E + h * D + d] += w * v[s * D + d];
        }
      }
    }
  const float* Wo = sd.at("out_proj.weight").data();
  const float* bo = o.bias ? sd.at("out_proj.bias").data() : nullptr;
  for (int64_t bl = 0; bl < B * L; ++bl)
    for (int64_t e = 0; e < E; ++e) {
      double acc = bo ? bo[e] : 0.0;
      for (int64_t j = 0; j < E; ++j) acc += double(Wo[e * E + j]) * ctx[bl * E + j];
      r.out[bl * E + e] = acc;
    }
  return r;
}

// A (B, T, C) tensor as the module takes it: (T, C) unbatched, (B, T, C) batch_first, else (T, B, C)
// as a contiguous copy or (strided) a transposed view of the same bytes.
struct Layout {
  bool unbatched, batch_first, strided;
  std::vector<Tensor> keep;  // copies the views point into
  View<const float> operator()(const Tensor& x) {
    if (unbatched) return View<const float>(x.data(), {x.size(1), x.size(2)});
    if (batch_first) return x.view();
    if (strided) return x.view().transpose(0, 1);
    keep.push_back(Tensor::copy_of(x.view().transpose(0, 1)));
    return keep.back().view();
  }
  // Index of (b, t, c) in the module's output.
  float at(const Tensor& y, int64_t b, int64_t t, int64_t c) const {
    if (unbatched) return y.view().at({t, c});
    return batch_first ? y.view().at({b, t, c}) : y.view().at({t, b, c});
  }
};

void randomize_biases(MultiheadAttention& m, Rng& rng) {
  for (const Param& p : m.parameter_list())
    if (p.name.find("bias") != std::string::npos)
      for (int64_t i = 0; i < p.value->numel(); ++i) p.value->data()[i] = float(0.5 * rng.normal());
}

// Runs one case through the module and the oracle and compares outputs and weights.
void check_case(Case c) {
  SCOPED_TRACE(cat("E=", c.o.embed_dim, " H=", c.o.num_heads, " Hkv=", c.o.num_kv_heads, " kdim=", c.o.kdim,
                   " vdim=", c.o.vdim, " bias_kv=", c.o.add_bias_kv, " zero_attn=", c.o.add_zero_attn,
                   " batch_first=", c.o.batch_first, " B=", c.B, " L=", c.L, " S=", c.S, " self=", c.self,
                   " unbatched=", c.unbatched, " strided=", c.strided, " kpm=", int(c.kpm), " am=", int(c.am),
                   "/", c.am_rank, " causal=", c.causal, " weights=", c.need_weights, "/", c.average));
  MultiheadAttention m(c.o);
  m.eval();
  Rng rng(c.o.seed + 100);
  if (c.randomize_biases) randomize_biases(m, rng);
  const MhaOptions& o = m.options();
  if (c.unbatched) c.B = 1;
  const int64_t B = c.B, L = c.L, S = c.S, H = o.num_heads, E = o.embed_dim;
  const int64_t S2 = S + o.add_bias_kv + o.add_zero_attn;
  Tensor xq = init::randn({B, L, E}, rng);
  Tensor xk = c.self ? Tensor::copy_of(xq.view()) : init::randn({B, S, o.kdim}, rng);
  Tensor xv = c.self ? Tensor::copy_of(xq.view()) : init::randn({B, S, o.vdim}, rng);

  // Masks as PyTorch takes them: bool True = masked (25%), float values added (10% -inf).
  auto random_bools = [&](const Shape& s) {
    Bools t(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.uniform() < 0.25;
    return t;
  };
  auto random_floats = [&](const Shape& s) {
    Tensor t(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = rng.uniform() < 0.1 ? float(-kInf) : float(rng.normal());
    return t;
  };
  const Shape kpm_shape = c.unbatched ? Shape{S} : Shape{B, S};
  const Shape am_shape = c.am_rank == 2 ? Shape{L, S} : Shape{B * H, L, S};
  Bools kpm_b = random_bools(kpm_shape), am_b = random_bools(am_shape);
  Tensor kpm_f = random_floats(kpm_shape), am_f = random_floats(am_shape);
  MhaArgs args;
  args.need_weights = c.need_weights;
  args.average_attn_weights = c.average;
  args.is_causal = c.causal;
  if (c.kpm == MaskKind::drop) args.key_padding_mask = Mask<float>::drop(kpm_b.view());
  if (c.kpm == MaskKind::additive) args.key_padding_mask = Mask<float>::additive(kpm_f.view());
  if (c.am == MaskKind::drop) args.attn_mask = Mask<float>::drop(am_b.view());
  if (c.am == MaskKind::additive) args.attn_mask = Mask<float>::additive(am_f.view());
  auto bias = [&](int64_t b, int64_t h, int64_t l, int64_t s) {
    if (s >= S) return 0.0;  // appended columns: PyTorch pads the masks with "not masked"
    double x = 0;
    if (c.kpm == MaskKind::drop) x += kpm_b.data()[b * S + s] ? -kInf : 0.0;
    if (c.kpm == MaskKind::additive) x += kpm_f.data()[b * S + s];
    const int64_t am_off = (c.am_rank == 2 ? 0 : (b * H + h) * L * S) + l * S + s;
    if (c.am == MaskKind::drop) x += am_b.data()[am_off] ? -kInf : 0.0;
    if (c.am == MaskKind::additive) x += am_f.data()[am_off];
    return x;
  };

  Layout layout{c.unbatched, o.batch_first, c.strided, {}};
  View<const float> q = layout(xq);
  View<const float> k = c.self ? q : layout(xk);
  View<const float> v = c.self ? q : layout(xv);
  MhaOutput got = m.forward(q, k, v, args);
  Oracle want = oracle(o, m.state_dict(), xq, xk, xv, bias, c.causal);

  const Shape out_shape = c.unbatched ? Shape{L, E} : o.batch_first ? Shape{B, L, E} : Shape{L, B, E};
  ASSERT_EQ(got.output.shape(), out_shape);
  double err = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < E; ++e)
        err = std::max(err, std::abs(layout.at(got.output, b, l, e) - want.out[(b * L + l) * E + e]));
  EXPECT_LE(err, kTol) << "output";
  if (!c.need_weights) {
    EXPECT_EQ(got.weights.data(), nullptr);
    return;
  }
  Shape w_shape = c.average ? Shape{B, L, S2} : Shape{B, H, L, S2};
  if (c.unbatched) w_shape.erase(w_shape.begin());
  ASSERT_EQ(got.weights.shape(), w_shape);
  err = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t s = 0; s < S2; ++s) {
        double mean = 0;
        for (int64_t h = 0; h < H; ++h) {
          const double w = want.w[((b * H + h) * L + l) * S2 + s];
          mean += w / double(H);
          if (!c.average) err = std::max(err, std::abs(got.weights.data()[((b * H + h) * L + l) * S2 + s] - w));
        }
        if (c.average) err = std::max(err, std::abs(got.weights.data()[(b * L + l) * S2 + s] - mean));
      }
  EXPECT_LE(err, kTol) << "weights";
}

}  // namespace

TEST(Mha, SelfAttentionAllLayouts) {
  for (bool batch_first : {false, true})
    for (bool strided : {false, true})
      for (bool average : {false, true}) {
        Case c;
        c.o.batch_first = batch_first;
        c.self = true;
        c.strided = strided;
        c.average = average;
        check_case(c);
      }
}

TEST(Mha, CrossAttentionKdimVdim) {
  for (bool batch_first : {false, true}) {
    Case c;
    c.o.batch_first = batch_first;
    c.L = 3, c.S = 7;
    check_case(c);
    c.o.kdim = 12, c.o.vdim = 20;  // separate projection weights
    check_case(c);
    c.o.bias = false;
    c.randomize_biases = false;
    check_case(c);
  }
}

TEST(Mha, Unbatched) {
  for (bool average : {false, true}) {
    Case c;
    c.unbatched = true;
    c.L = 4, c.S = 6;
    c.average = average;
    c.kpm = MaskKind::drop;
    check_case(c);
    c.am = MaskKind::additive, c.am_rank = 3;  // (H, L, S)
    check_case(c);
  }
}

TEST(Mha, GroupedAndMultiQueryAgainstOracle) {
  for (int64_t hkv : {1, 2, 4}) {
    Case c;
    c.o.num_heads = 4, c.o.num_kv_heads = hkv;
    c.L = 3, c.S = 6;
    c.am = MaskKind::drop, c.am_rank = 3;
    check_case(c);
    c.o.kdim = 10;
    check_case(c);
  }
}

TEST(Mha, EveryMaskKind) {
  for (MaskKind kpm : {MaskKind::none, MaskKind::drop, MaskKind::additive})
    for (MaskKind am : {MaskKind::none, MaskKind::drop, MaskKind::additive})
      for (int rank : {2, 3})
        for (bool causal : {false, true}) {
          if (am == MaskKind::none && rank == 3) continue;
          Case c;
          c.kpm = kpm, c.am = am, c.am_rank = rank, c.causal = causal;
          check_case(c);
          c.need_weights = false;  // the path a faster backend takes
          check_case(c);
        }
}

TEST(Mha, BiasKvAndZeroAttnWithMasks) {
  for (bool bias_kv : {false, true})
    for (bool zero_attn : {false, true})
      for (bool causal : {false, true})
        for (bool batch_first : {false, true}) {
          if (!bias_kv && !zero_attn) continue;
          Case c;
          c.o.add_bias_kv = bias_kv, c.o.add_zero_attn = zero_attn, c.o.batch_first = batch_first;
          c.o.num_kv_heads = 2;
          c.L = 4, c.S = 6;
          c.causal = causal;
          check_case(c);  // no masks: causal alone is folded into a padded mask
          c.kpm = MaskKind::drop, c.am = MaskKind::additive, c.am_rank = 3;
          check_case(c);
          c.kpm = MaskKind::additive, c.am = MaskKind::drop, c.am_rank = 2;
          check_case(c);
        }
}

TEST(Mha, NonContiguousLastDimIsCopied) {
  MultiheadAttention m({.embed_dim = 8, .num_heads = 2, .batch_first = true, .seed = 3});
  m.eval();
  Rng rng(5);
  Tensor x = init::randn({2, 5, 8}, rng);
  Tensor xt = Tensor::copy_of(x.view().transpose(1, 2));  // (B, E, L) bytes
  View<const float> odd = xt.view().transpose(1, 2);      // (B, L, E) with last stride L
  MhaOutput a = m.forward(x.view(), x.view(), x.view()), b = m.forward(odd, odd, odd);
  for (int64_t i = 0; i < a.output.numel(); ++i) EXPECT_EQ(a.output.data()[i], b.output.data()[i]);
}

TEST(Mha, GqaEqualsMhaWithRepeatedKvRows) {
  for (int64_t hkv : {1, 2}) {
    const int64_t E = 16, H = 4, D = E / H, rep = H / hkv;
    MultiheadAttention gqa({.embed_dim = E, .num_heads = H, .num_kv_heads = hkv, .seed = 7});
    MultiheadAttention mha({.embed_dim = E, .num_heads = H, .seed = 8});
    gqa.eval(), mha.eval();
    Rng rng(9);
    randomize_biases(gqa, rng);
    StateDict g = gqa.state_dict(), sd;
    // in_proj_weight = [Wq; Wk with each KV head's D rows repeated H/Hkv times; Wv likewise].
    Tensor w({3 * E, E}), bias({3 * E});
    auto copy_rows = [](const float* src, float* dst, int64_t n) { std::copy(src, src + n, dst); };
    copy_rows(g.at("q_proj_weight").data(), w.data(), E * E);
    copy_rows(g.at("in_proj_bias").data(), bias.data(), E);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kv = h / rep;
      copy_rows(g.at("k_proj_weight").data() + kv * D * E, w.data() + (E + h * D) * E, D * E);
      copy_rows(g.at("v_proj_weight").data() + kv * D * E, w.data() + (2 * E + h * D) * E, D * E);
      copy_rows(g.at("in_proj_bias").data() + E + kv * D, bias.data() + E + h * D, D);
      copy_rows(g.at("in_proj_bias").data() + E + hkv * D + kv * D, bias.data() + 2 * E + h * D, D);
    }
    sd.emplace("in_proj_weight", std::move(w));
    sd.emplace("in_proj_bias", std::move(bias));
    sd.emplace("out_proj.weight", Tensor::copy_of(g.at("out_proj.weight").view()));
    sd.emplace("out_proj.bias", Tensor::copy_of(g.at("out_proj.bias").view()));
    mha.load_state_dict(sd);
    Tensor q = init::randn({3, 2, E}, rng), kv = init::randn({5, 2, E}, rng);
    MhaArgs args{.average_attn_weights = false, .is_causal = true};
    MhaOutput a = gqa.forward(q.view(), kv.view(), kv.view(), args),
              b = mha.forward(q.view(), kv.view(), kv.view(), args);
    // Same products in the same order; only gemm blocking over a different N may differ (~1 ulp).
    for (int64_t i = 0; i < a.output.numel(); ++i) EXPECT_NEAR(a.output.data()[i], b.output.data()[i], 1e-6);
    for (int64_t i = 0; i < a.weights.numel(); ++i) EXPECT_NEAR(a.weights.data()[i], b.weights.data()[i], 1e-6);
  }
}

TEST(Mha, PaddedKeysAndCausalTriangleGetExactlyZeroWeight) {
  MultiheadAttention m({.embed_dim = 16, .num_heads = 4, .add_bias_kv = true, .add_zero_attn = true, .seed = 2});
  m.eval();
  Rng rng(4);
  const int64_t L = 5, N = 2, S = 5, H = 4, S2 = S + 2;
  Tensor x = init::randn({L, N, 16}, rng);
  Bools pad({N, S});
  pad.data()[0 * S + 1] = pad.data()[1 * S + 4] = 1;  // key 1 of batch 0, key 4 of batch 1
  MhaOutput r =
      m.forward(x.view(), x.view(), x.view(),
                {.key_padding_mask = Mask<float>::drop(pad.view()), .average_attn_weights = false, .is_causal = true});
  ASSERT_EQ(r.weights.shape(), (Shape{N, H, L, S2}));
  for (int64_t b = 0; b < N; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) {
        double sum = 0;
        for (int64_t s = 0; s < S2; ++s) {
          const float w = r.weights.view().at({b, h, l, s});
          sum += w;
          if ((s < S && s > l) || (s < S && pad.data()[b * S + s])) {
            EXPECT_EQ(w, 0.f) << b << h << l << s;
          }
          if (s >= S) {
            EXPECT_GT(w, 0.f);  // bias_k and zero-attn columns stay visible under causal
          }
        }
        EXPECT_NEAR(sum, 1.0, 1e-5);  // fp32 sum of <= 7 weights
      }
}

TEST(Mha, FullyMaskedRowGivesZeroWeightsAndBiasOutput) {
  MultiheadAttention m({.embed_dim = 8, .num_heads = 2, .seed = 6});
  m.eval();
  Rng rng(6);
  randomize_biases(m, rng);
  Tensor x = init::randn({3, 2, 8}, rng);
  Bools pad({2, 3});
  for (int64_t s = 0; s < 3; ++s) pad.data()[1 * 3 + s] = 1;  // batch 1: every key masked
  for (bool need_weights : {true, false}) {
    MhaOutput r = m.forward(x.view(), x.view(), x.view(),
                            {.key_padding_mask = Mask<float>::drop(pad.view()), .need_weights = need_weights});
    const StateDict sd = m.state_dict();
    const float* bo = sd.at("out_proj.bias").data();
    for (int64_t l = 0; l < 3; ++l)
      for (int64_t e = 0; e < 8; ++e) EXPECT_FLOAT_EQ(r.output.view().at({l, 1, e}), bo[e]);
    if (need_weights) {
      for (int64_t l = 0; l < 3; ++l)
        for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(r.weights.view().at({1, l, s}), 0.f);
    }
  }
}

TEST(Mha, Errors) {
  std::string e = error_of([] { MultiheadAttention({.embed_dim = 10, .num_heads = 3}); });
  EXPECT_NE(e.find("Expected embed_dim divisible by num_heads, but got embed_dim = 10 and num_heads = 3 instead"),
            std::string::npos) << e;
  e = error_of([] { MultiheadAttention({.embed_dim = 12, .num_heads = 6, .num_kv_heads = 4}); });
  EXPECT_NE(e.find("Expected num_heads divisible by num_kv_heads, but got num_heads = 6 and num_kv_heads = 4 instead"),
            std::string::npos) << e;
  EXPECT_THROW(MultiheadAttention({.embed_dim = 8, .num_heads = 2, .dropout = 1.5}), Error);

  MultiheadAttention m({.embed_dim = 8, .num_heads = 2});
  Tensor x({4, 2, 8}), y({4, 2, 6}), z({4, 8});
  e = error_of([&] { m.forward(x.view(), y.view(), y.view()); });
  EXPECT_NE(e.find("(4, 2, 6)"), std::string::npos) << e;  // kdim 6 != 8
  e = error_of([&] { m.forward(x.view(), z.view(), z.view()); });
  EXPECT_NE(e.find("Expected key and value of rank 3"), std::string::npos) << e;
  Bools pad({2, 5}), am({3, 4});
  e = error_of([&] { m.forward(x.view(), x.view(), x.view(), {.key_padding_mask = Mask<float>::drop(pad.view())}); });
  EXPECT_NE(e.find("Expected key_padding_mask of shape (N, S) = (2, 4), but got (2, 5) instead"), std::string::npos)
      << e;
  e = error_of([&] { m.forward(x.view(), x.view(), x.view(), {.attn_mask = Mask<float>::drop(am.view())}); });
  EXPECT_NE(e.find("(L, S) = (4, 4) or (N·H, L, S) = (4, 4, 4), but got (3, 4) instead"), std::string::npos) << e;
}

TEST(Mha, StateDictRoundTripAndErrors) {
  MhaOptions o{.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .kdim = 6, .num_kv_heads = 1, .seed = 11};
  MultiheadAttention a(o),
      b({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .kdim = 6, .num_kv_heads = 1, .seed = 12});
  a.eval(), b.eval();
  std::vector<std::string> names;
  for (const Param& p : a.parameter_list()) names.push_back(p.name + to_string(p.value->shape()));
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj_weight(8, 8)", "k_proj_weight(4, 6)", "v_proj_weight(4, 8)",
                                             "in_proj_bias(16,)", "bias_k(1, 1, 4)", "bias_v(1, 1, 4)",
                                             "out_proj.weight(8, 8)", "out_proj.bias(8,)"}));
  Rng rng(1);
  Tensor q = init::randn({3, 1, 8}, rng), k = init::randn({4, 1, 6}, rng), v = init::randn({4, 1, 8}, rng);
  auto out = [&](MultiheadAttention& m) { return m.forward(q.view(), k.view(), v.view()).output; };
  Tensor before = out(b);
  b.load_state_dict(a.state_dict());
  Tensor ya = out(a), yb = out(b);
  bool changed = false;
  for (int64_t i = 0; i < ya.numel(); ++i) {
    EXPECT_EQ(ya.data()[i], yb.data()[i]);
    changed |= before.data()[i] != yb.data()[i];
  }
  EXPECT_TRUE(changed);

  StateDict sd = a.state_dict();
  sd.emplace("in_proj_weight", Tensor({24, 8}));
  std::string e = error_of([&] { b.load_state_dict(sd); });
  EXPECT_NE(e.find("unknown name 'in_proj_weight'"), std::string::npos) << e;
  sd = a.state_dict();
  sd.erase("bias_v");
  e = error_of([&] { b.load_state_dict(sd); });
  EXPECT_NE(e.find("bias_v"), std::string::npos) << e;
  sd = a.state_dict();
  sd.insert_or_assign("k_proj_weight", Tensor({4, 8}));
  e = error_of([&] { b.load_state_dict(sd); });
  EXPECT_NE(e.find("(4, 6)"), std::string::npos) << e;
  EXPECT_NE(e.find("(4, 8)"), std::string::npos) << e;
}

TEST(Mha, SaveLoadFile) {
  MultiheadAttention a({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .seed = 1});
  MultiheadAttention b({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .seed = 2});
  const std::string path = (std::filesystem::temp_directory_path() / "attn_test_mha.safetensors").string();
  a.save(path);
  b.load(path);
  std::filesystem::remove(path);
  StateDict sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (auto& [name, t] : sa)
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data()[i], sb.at(name).data()[i]) << name;
}

TEST(Mha, InitialisationLikePyTorch) {
  const int64_t E = 256;
  MultiheadAttention m({.embed_dim = E, .num_heads = 8, .add_bias_kv = true, .kdim = 128, .seed = 3});
  StateDict sd = m.state_dict();
  auto stats = [](const Tensor& t) {
    double mx = 0, ss = 0;
    for (int64_t i = 0; i < t.numel(); ++i)
      mx = std::max(mx, double(std::abs(t.data()[i]))), ss += double(t.data()[i]) * t.data()[i];
    return std::pair{mx, std::sqrt(ss / double(t.numel()))};
  };
  // Uniform(-b, b): max just under b, rms b/sqrt(3). Tolerances: >= 16k samples give rms within ~1%;
  // bias_k has 256 normal samples, rms within ~10% (3 sigma of 1/sqrt(2·256) ≈ 4.4%, doubled).
  auto uniform = [&](const StateDict& sd, const char* name, double bound) {
    auto [mx, rms] = stats(sd.at(name));
    EXPECT_LE(mx, bound) << name;
    EXPECT_GT(mx, 0.99 * bound) << name;
    EXPECT_NEAR(rms, bound / std::sqrt(3.0), 0.03 * bound) << name;
  };
  auto xavier = [](double fan_in, double fan_out) { return std::sqrt(6.0 / (fan_in + fan_out)); };
  uniform(sd, "q_proj_weight", xavier(E, E));
  uniform(sd, "k_proj_weight", xavier(128, E));       // (E, kdim): fan_in kdim, fan_out E
  uniform(sd, "out_proj.weight", 1.0 / std::sqrt(E));  // kaiming_uniform(a=sqrt(5))
  for (const char* z : {"in_proj_bias", "out_proj.bias"}) EXPECT_EQ(stats(sd.at(z)).first, 0.0) << z;
  // xavier_normal on (1, 1, E): fan_in = fan_out = E
  EXPECT_NEAR(stats(sd.at("bias_k")).second, std::sqrt(1.0 / E), 0.1 * std::sqrt(1.0 / E));
  MultiheadAttention packed({.embed_dim = E, .num_heads = 8, .seed = 3});
  uniform(packed.state_dict(), "in_proj_weight", xavier(E, 3 * E));  // one (3E, E) tensor, as PyTorch
}

TEST(Mha, DropoutInTrainingOnly) {
  const double p = 0.5;
  MultiheadAttention m({.embed_dim = 16, .num_heads = 4, .dropout = p, .seed = 5});
  Rng rng(2);
  Tensor x = init::randn({6, 2, 16}, rng);
  MhaArgs args{.average_attn_weights = false};
  m.eval();
  MhaOutput e1 = m.forward(x.view(), x.view(), x.view(), args), e2 = m.forward(x.view(), x.view(), x.view(), args);
  m.train();
  MhaOutput t1 = m.forward(x.view(), x.view(), x.view(), args), t2 = m.forward(x.view(), x.view(), x.view(), args);
  MultiheadAttention same({.embed_dim = 16, .num_heads = 4, .dropout = p, .seed = 5});  // trains from construction
  MhaOutput s1 = same.forward(x.view(), x.view(), x.view(), args);
  int dropped = 0, differs = 0;
  for (int64_t i = 0; i < e1.weights.numel(); ++i) {
    const float w = t1.weights.data()[i], ref = e1.weights.data()[i];
    EXPECT_EQ(e1.weights.data()[i], e2.weights.data()[i]);  // eval: no dropout, deterministic
    EXPECT_EQ(w, s1.weights.data()[i]);                      // same seed, same first call: same drops
    // each weight is dropped or scaled by 1/(1-p); 1e-6 for the rounding of the scaling
    if (w == 0.f) {
      ++dropped;
    } else {
      EXPECT_NEAR(w, ref / (1 - p), 1e-6);
    }
    differs += t1.weights.data()[i] != t2.weights.data()[i];  // the seed advances between calls
  }
  const int n = int(e1.weights.numel());  // 2·4·6·6 = 288: dropped ~ Binomial(288, 0.5), 144 ± 8.5
  EXPECT_GT(dropped, n / 2 - 40);
  EXPECT_LT(dropped, n / 2 + 40);
  EXPECT_GT(differs, n / 4);
  for (int64_t i = 0; i < e1.output.numel(); ++i) EXPECT_EQ(e1.output.data()[i], e2.output.data()[i]);
}

TEST(Mha, TracePrintsEveryStage) {
  MultiheadAttention m({.embed_dim = 64, .num_heads = 4, .batch_first = true, .num_kv_heads = 2});
  Tensor x({1, 6, 64}), kv({1, 9, 64});
  std::ostringstream trace;
  m.forward(x.view(), kv.view(), kv.view(), {.trace = &trace});
  const std::string t = trace.str();
  for (const char* line : {"Q after projection (B, L, E): (1, 6, 64)", "K after projection (B, S, Hkv·D): (1, 9, 32)",
                           "Q after head split (B, H, L, D): (1, 4, 6, 16)",
                           "K after head split (B, Hkv, S, D): (1, 2, 9, 16)", "scores (B, H, L, S): (1, 4, 6, 9)",
                           "context (B, H, L, Dv): (1, 4, 6, 16)", "context after concat (B, L, E): (1, 6, 64)",
                           "output (N, L, E): (1, 6, 64)", "weights (N, L, S): (1, 6, 9)", "sdpa backend: "})
    EXPECT_NE(t.find(line), std::string::npos) << line << "\n" << t;
}
