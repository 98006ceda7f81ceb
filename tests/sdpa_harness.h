// The SDPA family's one test harness (as ggml's test-backend-ops): a Case names a problem (B, H, Hkv, L, S,
// D, Dv, mask kind and shape, key padding, causal alignment, scale, dropout, strided layouts); Inputs draws
// its numbers once, in double on the float grid, so a float and a double run see the same values; bind<T>()
// views them as SdpaArgs<T> in the case's layouts; forward() and backward() run any kernel; expect_close
// states FlashAttention's tolerance rule once. A new fp32 backend is one line:
//   expect_forward_close(my_forward, c);   expect_backward_close(my_backward, c);
// Used by test_reference, test_flash, test_backward, test_decode_half, test_mha and tests/dist. Not an
// oracle: reference_forward is one, itself checked against the independent fp64 oracle of test_reference.cpp.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attn/rng.h"
#include "attn/sdpa.h"

namespace attn::test {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Absolute slack of the forward's tolerance rule. Where the fp32 reference happens to be exact (one key:
// out = v) the rule's 2x term is 0; flash still rounds Q·scale·log2(e), the exp2 polynomial and 1/l, a few
// ulp of |out| <= ~4 (unit-normal inputs) and of |LSE| <= ~20.
constexpr double kAtolOut = 2e-6;
constexpr double kAtolLse = 8e-6;

enum class MaskKind { none, keep, drop, additive };
inline const char* mask_name(MaskKind k) {
  const char* names[] = {"none", "keep", "drop", "additive"};
  return names[static_cast<int>(k)];
}

// A mask as a case describes it. attn_mask: right-aligned against (B, H, L, S), (L, S) if the shape is
// empty; key padding: (B, S).
struct MaskSpec {
  MaskKind kind = MaskKind::none;
  Shape shape;
};
inline MaskSpec keep(Shape s = {}) { return {MaskKind::keep, std::move(s)}; }
inline MaskSpec drop(Shape s = {}) { return {MaskKind::drop, std::move(s)}; }
inline MaskSpec additive(Shape s = {}) { return {MaskKind::additive, std::move(s)}; }

struct Case {
  int64_t B = 1, H = 2, Hkv = 2, L = 7, S = 9, D = 8, Dv = 8;
  MaskSpec mask, padding;
  Causal causal = Causal::none;
  std::optional<double> scale;
  double dropout_p = 0;
  uint64_t dropout_seed = 42;
  uint64_t seed = 1;        // of the inputs
  double masked = 0.25;     // probability that a mask element masks (bool: masked out; additive: -inf)
  double masked_rows = 0;   // probability that a whole last-dim row of a mask masks
  int in_layout = 0;        // of q, k, v and dout (see Arr)
  int out_layout = 0;       // of out, weights, lse and the gradients
  // Variants (SdpaArgs): a window; ALiBi slopes (1: (H), 2: (B, H)); softcap; T5's relative bias of
  // rel_buckets buckets; documents: lengths of each batch's documents, as document ids (L == S), or with
  // docs_k (B == 1) as cu_seqlens of queries (docs) and keys (docs_k).
  Window window;
  int alibi = 0;
  double softcap = 0;
  int64_t rel_buckets = 0, rel_max_distance = 20;
  bool rel_bidirectional = true;
  std::vector<int64_t> docs, docs_k;

  Shape mask_shape() const { return mask.shape.empty() ? Shape{L, S} : mask.shape; }
  Shape padding_shape() const { return padding.shape.empty() ? Shape{B, S} : padding.shape; }
  std::string name() const {
    const char* causals[] = {"none", "top_left", "bottom_right"};
    return cat("B=", B, " H=", H, " Hkv=", Hkv, " L=", L, " S=", S, " D=", D, " Dv=", Dv, " mask=",
               mask_name(mask.kind), mask.kind == MaskKind::none ? "" : to_string(mask_shape()), " padding=",
               mask_name(padding.kind), " causal=", causals[static_cast<int>(causal)], " p=", dropout_p,
               " layouts=", in_layout, "/", out_layout, variants());
  }
  std::string variants() const {
    std::string v;
    if (window.given()) v += cat(" window=(", window.left, ", ", window.right, ")");
    if (alibi) v += cat(" alibi=", alibi == 1 ? "(H)" : "(B, H)");
    if (softcap > 0) v += cat(" softcap=", softcap);
    if (rel_buckets)
      v += cat(" t5=", rel_buckets, rel_bidirectional ? " bidirectional" : " causal", " max ", rel_max_distance);
    if (!docs.empty()) {
      v += docs_k.empty() ? " doc lengths=" : " varlen q=";
      for (int64_t d : docs) v += cat(d, ",");
      if (!docs_k.empty()) v += " k=";
      for (int64_t d : docs_k) v += cat(d, ",");
    }
    return v;
  }
};

// Offset of the element with flat (index-order) position i in a view.
template <typename T>
int64_t offset_of(const View<T>& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.rank() - 1; d >= 0; --d) off += (i % v.shape[d]) * v.strides[d], i /= v.shape[d];
  return off;
}

// A strided array and the storage under it. Layout 0: contiguous; 1: dims 1 and 2 swapped in memory (as
// MultiheadAttention's (B, L, H, D) projections are read as (B, H, L, D)); 2: every element 2 apart.
// Move-only: the view points into the store.
template <typename T>
struct Arr {
  std::vector<T> store;
  View<T> view;
  Arr() = default;
  Arr(const Shape& shape, int layout, T fill = T(0)) {
    Shape mem = shape;
    if (layout == 1) std::swap(mem[1], mem[2]);
    Shape st = contiguous_strides(mem);
    if (layout == 1) std::swap(st[1], st[2]);
    if (layout == 2)
      for (auto& x : st) x *= 2;
    // at least one element: a view of no elements (S = 0) still points somewhere, as a Tensor's does
    store.assign(static_cast<size_t>(std::max<int64_t>(numel(shape) * (layout == 2 ? 2 : 1), 1)), fill);
    view = View<T>(store.data(), shape, st);
  }
  Arr(Arr&&) noexcept = default;
  Arr& operator=(Arr&&) noexcept = default;
  // Every element in index order, as double.
  std::vector<double> values() const {
    std::vector<double> x(static_cast<size_t>(numel(view.shape)));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(view.data[offset_of(view, int64_t(i))]);
    return x;
  }
};

// x (index order) as an Arr<T> of the given shape and layout.
template <typename T>
Arr<T> to_arr(const double* x, const Shape& shape, int layout) {
  Arr<T> a(shape, layout);
  for (int64_t i = 0; i < numel(shape); ++i) a.view.data[offset_of(a.view, i)] = static_cast<T>(x[i]);
  return a;
}

// A case's inputs, bound as SdpaArgs<T> of its layouts; keeps the storage the views read.
template <typename T>
struct Bound {
  Arr<T> q, k, v, dout, mask_bias, pad_bias, slopes, table;
  Arr<uint8_t> mask_bools, pad_bools;
  Arr<int64_t> ids, cu_q, cu_k;
  SdpaArgs<T> args;
};

// The numbers of a case: floats held in double (every value on the float grid), masks in the shapes of
// the specs (additive values, or 0/1 for bools). Tests may edit them before binding.
struct Inputs {
  Case c;
  TensorD q, k, v, dout;  // (B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, Dv), (B, H, L, Dv)
  std::vector<double> mask, padding;
  std::vector<double> slopes, table;  // ALiBi (H) or (B, H); T5 (rel_buckets, H)

  Inputs() = default;
  explicit Inputs(const Case& cs)
      : c(cs), q({c.B, c.H, c.L, c.D}), k({c.B, c.Hkv, c.S, c.D}), v({c.B, c.Hkv, c.S, c.Dv}),
        dout({c.B, c.H, c.L, c.Dv}) {
    Rng rng(c.seed);
    for (TensorD* t : {&q, &k, &v}) randn(*t, rng);
    mask = random_mask(c.mask.kind, c.mask_shape(), rng);
    padding = random_mask(c.padding.kind, c.padding_shape(), rng);
    randn(dout, rng);
    // ALiBi's geometric slopes 2^(-8(h+1)/H), times a batch factor for (B, H); the table: normal values
    if (c.alibi)
      for (int64_t b = 0; b < (c.alibi == 2 ? c.B : 1); ++b)
        for (int64_t h = 0; h < c.H; ++h)
          slopes.push_back(float(std::exp2(-8.0 * double(h + 1) / double(c.H)) * (1 + 0.5 * double(b))));
    for (int64_t i = 0; i < c.rel_buckets * c.H; ++i) table.push_back(static_cast<float>(rng.normal()));
  }
  Inputs clone() const {
    Inputs in;
    in.c = c, in.mask = mask, in.padding = padding, in.slopes = slopes, in.table = table;
    in.q = TensorD::copy_of(q), in.k = TensorD::copy_of(k), in.v = TensorD::copy_of(v),
    in.dout = TensorD::copy_of(dout);
    return in;
  }

  template <typename T>
  Bound<T> bind() const {
    Bound<T> b;
    b.q = to_arr<T>(q.data(), q.shape(), c.in_layout);
    b.k = to_arr<T>(k.data(), k.shape(), c.in_layout);
    b.v = to_arr<T>(v.data(), v.shape(), c.in_layout);
    b.dout = to_arr<T>(dout.data(), dout.shape(), c.in_layout);
    b.args.q = b.q.view, b.args.k = b.k.view, b.args.v = b.v.view;
    b.args.attn_mask = bind_mask(c.mask.kind, mask, c.mask_shape(), b.mask_bias, b.mask_bools);
    b.args.key_padding = bind_mask(c.padding.kind, padding, c.padding_shape(), b.pad_bias, b.pad_bools);
    b.args.causal = c.causal;
    b.args.scale = c.scale;
    b.args.dropout_p = c.dropout_p;
    b.args.seed = c.dropout_seed;
    b.args.window = c.window;
    b.args.softcap = c.softcap;
    if (c.alibi)
      b.args.alibi_slopes = (b.slopes = to_arr<T>(slopes.data(), c.alibi == 1 ? Shape{c.H} : Shape{c.B, c.H}, 0)).view;
    if (c.rel_buckets) {
      b.args.relative_bias.table = (b.table = to_arr<T>(table.data(), {c.rel_buckets, c.H}, 0)).view;
      b.args.relative_bias.bidirectional = c.rel_bidirectional;
      b.args.relative_bias.max_distance = c.rel_max_distance;
    }
    if (!c.docs.empty() && c.docs_k.empty()) {  // ids 0, 1, 2, ... by the lengths, the same for every batch
      std::vector<double> ids;
      for (int64_t bb = 0; bb < c.B; ++bb)
        for (size_t i = 0; i < c.docs.size(); ++i) ids.insert(ids.end(), size_t(c.docs[i]), double(i));
      b.args.documents.ids = (b.ids = to_arr<int64_t>(ids.data(), {c.B, c.L}, 0)).view;
    } else if (!c.docs.empty()) {
      std::vector<double> cq{0}, ck{0};
      for (int64_t x : c.docs) cq.push_back(cq.back() + double(x));
      for (int64_t x : c.docs_k) ck.push_back(ck.back() + double(x));
      b.args.documents.cu_seqlens_q = (b.cu_q = to_arr<int64_t>(cq.data(), {int64_t(cq.size())}, 0)).view;
      b.args.documents.cu_seqlens_k = (b.cu_k = to_arr<int64_t>(ck.data(), {int64_t(ck.size())}, 0)).view;
    }
    return b;
  }

 private:
  static void randn(TensorD& t, Rng& rng) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(rng.normal());
  }
  std::vector<double> random_mask(MaskKind kind, const Shape& shape, Rng& rng) const {
    if (kind == MaskKind::none) return {};
    const int64_t n = numel(shape), row = shape.back();
    std::vector<double> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i += row) {
      const bool all = c.masked_rows > 0 && rng.uniform() < c.masked_rows;
      for (int64_t j = i; j < i + row; ++j) {
        const bool masked = all || rng.uniform() < c.masked;
        if (kind == MaskKind::additive) x[j] = masked ? -kInf : static_cast<float>(rng.normal());
        else x[j] = masked == (kind == MaskKind::drop);
      }
    }
    return x;
  }
  template <typename T>
  static Mask<T> bind_mask(MaskKind kind, const std::vector<double>& x, const Shape& shape, Arr<T>& bias,
                           Arr<uint8_t>& bools) {
    if (kind == MaskKind::none) return {};
    if (kind == MaskKind::additive) return Mask<T>::additive((bias = to_arr<T>(x.data(), shape, 0)).view);
    bools = to_arr<uint8_t>(x.data(), shape, 0);
    return kind == MaskKind::keep ? Mask<T>::keep(bools.view) : Mask<T>::drop(bools.view);
  }
};

// ---- Running a kernel ----

template <typename T>
using ForwardKernel = void (*)(const SdpaProblem<T>&);
template <typename T>
using BackwardKernel = void (*)(const SdpaProblem<T>&, View<const T>, const SdpaGrads<T>&);

// Results in index order, as double: out (B, H, L, Dv), weights (B, H, L, S) when asked for, lse (B, H, L).
struct Forward {
  std::vector<double> out, weights, lse;
};

// Runs kernel on the case's inputs. Outputs start as NaN, so an element the kernel skips fails every
// comparison; they are written through views of the case's out_layout.
template <typename T>
Forward forward(ForwardKernel<T> kernel, const Inputs& in, bool weights = false) {
  const Case& c = in.c;
  const Bound<T> b = in.bind<T>();
  Arr<T> out({c.B, c.H, c.L, c.Dv}, c.out_layout, T(NAN)), lse({c.B, c.H, c.L}, c.out_layout, T(NAN)), w;
  if (weights) w = Arr<T>({c.B, c.H, c.L, c.S}, c.out_layout, T(NAN));
  kernel(make_problem(b.args, SdpaOut<T>{out.view, w.view, lse.view}));
  return {out.values(), weights ? w.values() : std::vector<double>{}, lse.values()};
}

// dq (B, H, L, D), dk (B, Hkv, S, D), dv (B, Hkv, S, Dv) in index order, as double; drel (rel_buckets, H)
// when the case has a relative bias.
struct Grads {
  std::vector<double> dq, dk, dv, drel;
};

// The gradients of sum(dout ∘ sdpa(q, k, v)) by kernel, after the forward sdpa() would run (flash for
// float, the reference for double: the out and LSE a caller of the backward has). Gradients start as
// NaN (the kernels overwrite, never add) and are written through views of the case's out_layout.
template <typename T>
Grads backward(BackwardKernel<T> kernel, const Inputs& in) {
  const Case& c = in.c;
  const Bound<T> b = in.bind<T>();
  TensorT<T> out({c.B, c.H, c.L, c.Dv}), lse({c.B, c.H, c.L});
  sdpa(b.args, SdpaOut<T>{out.view(), {}, lse.view()});
  Arr<T> dq({c.B, c.H, c.L, c.D}, c.out_layout, T(NAN)), dk({c.B, c.Hkv, c.S, c.D}, c.out_layout, T(NAN)),
      dv({c.B, c.Hkv, c.S, c.Dv}, c.out_layout, T(NAN)), drel;
  if (c.rel_buckets) drel = Arr<T>({c.rel_buckets, c.H}, c.out_layout, T(NAN));
  kernel(make_problem(b.args, SdpaOut<T>{out.view(), {}, lse.view()}), b.dout.view,
         {dq.view, dk.view, dv.view, {}, drel.view});
  return {dq.values(), dk.values(), dv.values(), c.rel_buckets ? drel.values() : std::vector<double>{}};
}

// ---- The tolerance rule ----

// FlashAttention's rule: max |got - fp64| <= 2·max |ref32 - fp64| + atol, where ref32 is the plain fp32
// reference (same formula, fp32 arithmetic). An infinite truth (LSE of a fully masked row) must be
// matched exactly; NaN never passes.
inline void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref32,
                         const std::vector<double>& truth, double atol) {
  ASSERT_EQ(got.size(), truth.size()) << what;
  double err = 0, err_ref = 0;
  for (size_t i = 0; i < truth.size(); ++i) {
    if (std::isinf(truth[i])) {
      ASSERT_EQ(got[i], truth[i]) << what << " element " << i;
      continue;
    }
    ASSERT_FALSE(std::isnan(got[i])) << what << " element " << i;
    err = std::max(err, std::abs(got[i] - truth[i]));
    err_ref = std::max(err_ref, std::abs(ref32[i] - truth[i]));
  }
  EXPECT_LE(err, 2 * err_ref + atol) << what << ": error " << err << ", fp32 reference error " << err_ref;
}

// A fp32 forward kernel on a case: out and LSE by the rule against the fp64 reference.
inline void expect_forward_close(ForwardKernel<float> kernel, const Inputs& in) {
  SCOPED_TRACE(in.c.name());
  const Forward got = forward<float>(kernel, in), ref32 = forward<float>(reference_forward<float>, in),
                truth = forward<double>(reference_forward<double>, in);
  expect_close("out", got.out, ref32.out, truth.out, kAtolOut);
  expect_close("lse", got.lse, ref32.lse, truth.lse, kAtolLse);
}
inline void expect_forward_close(ForwardKernel<float> kernel, const Case& c) {
  expect_forward_close(kernel, Inputs(c));
}

// Backward atol: 1e-6 (~8 fp32 ulps) of the largest gradient of the problem, for gradients that are exact
// cancellations, where the reference can round to exactly 0 and flash, whose D = rowsum(dO∘O) comes from
// the forward's O instead of rowsum(P∘dP), cannot (S = 1: dK = 0 exactly).
inline double backward_atol(const Grads& truth) {
  double largest = 0;
  for (const std::vector<double>* g : {&truth.dq, &truth.dk, &truth.dv})
    for (double x : *g) largest = std::max(largest, std::abs(x));
  return 1e-6 * (1 + largest);
}

// A fp32 backward kernel on a case: dq, dk and dv by the rule against the fp64 reference backward.
inline void expect_backward_close(BackwardKernel<float> kernel, const Inputs& in) {
  SCOPED_TRACE(in.c.name());
  const Grads got = backward<float>(kernel, in), ref32 = backward<float>(reference_backward<float>, in),
              truth = backward<double>(reference_backward<double>, in);
  const double atol = backward_atol(truth);
  expect_close("dq", got.dq, ref32.dq, truth.dq, atol);
  expect_close("dk", got.dk, ref32.dk, truth.dk, atol);
  expect_close("dv", got.dv, ref32.dv, truth.dv, atol);
  if (!truth.drel.empty()) {  // sums of dS: the gradients' atol (dS's exact cancellations), plus their own scale
    double largest = 0;
    for (double x : truth.drel) largest = std::max(largest, std::abs(x));
    expect_close("drelative_bias", got.drel, ref32.drel, truth.drel, atol + 1e-6 * largest);
  }
}
inline void expect_backward_close(BackwardKernel<float> kernel, const Case& c) {
  expect_backward_close(kernel, Inputs(c));
}

}  // namespace attn::test
