// make_problem (kernels/problem.h): every argument of an attention problem checked once, with the error
// naming the argument and both shapes, and the semantics derived from them (G, scale, resolved masks,
// the dropout threshold and keep scale). Every kernel takes its result; no math here.
#include <cmath>

#include "attn/kernels/problem.h"

namespace attn {
namespace {

// Right-aligned broadcast of a mask of rank <= 4 to `target`; stride 0 on broadcast dims.
template <typename T>
MaskRef<T> resolve(const char* arg, const char* dims, const Mask<T>& m, const Shape& target,
                   const Shape& place /* which target dim each mask dim maps to, right-aligned */) {
  MaskRef<T> r;
  if (!m.given()) return r;
  const Shape& shape = m.shape();
  const Shape& strides = m.kind == Mask<T>::Kind::additive ? m.bias.strides : m.bools.strides;
  const int rank = static_cast<int>(shape.size());
  const int max_rank = static_cast<int>(place.size());
  bool ok = rank <= max_rank;
  int64_t st[4] = {0, 0, 0, 0};
  for (int i = 0; ok && i < rank; ++i) {
    int t = static_cast<int>(place[max_rank - rank + i]);
    if (shape[i] == target[t]) st[t] = strides[i];
    else ok = shape[i] == 1;
  }
  ATTN_CHECK(ok, "Expected ", arg, " broadcastable to ", dims_str(dims, target), ", but got shape ",
             to_string(shape), " instead");
  r.kind = m.kind;
  r.bools = m.bools.data;
  r.bias = m.bias.data;
  r.sb = st[0], r.sh = st[1], r.sl = st[2], r.ss = st[3];
  return r;
}

}  // namespace

template <typename T>
SdpaProblem<T> make_problem(const SdpaArgs<T>& a, const SdpaOut<T>& o) {
  check_rank4("query", "(B, H, L, D)", a.q);
  check_rank4("key", "(B, Hkv, S, D)", a.k);
  check_rank4("value", "(B, Hkv, S, Dv)", a.v);
  SdpaProblem<T> p;
  p.args = a, p.out = o;
  p.B = a.q.size(0), p.H = a.q.size(1), p.Hkv = a.k.size(1), p.L = a.q.size(2), p.S = a.k.size(2);
  p.D = a.q.size(3), p.Dv = a.v.size(3);
  check_shape("key", "(B, Hkv, S, D)", a.k, {p.B, p.Hkv, p.S, p.D});
  ATTN_CHECK(a.v.size(0) == p.B && a.v.size(1) == p.Hkv && a.v.size(2) == p.S, "Expected value of shape ",
             dims_str("(B, Hkv, S, Dv)", {p.B, p.Hkv, p.S, a.v.size(3)}), " to match key ",
             to_string(a.k.shape), ", but got ", to_string(a.v.shape), " instead");
  ATTN_CHECK(p.Hkv > 0, "Expected key and value of at least one head (Hkv >= 1), but got key of shape ",
             to_string(a.k.shape), " instead");
  ATTN_CHECK(p.H % p.Hkv == 0, "Expected the query heads H = ", p.H,
             " to be a multiple of the key/value heads Hkv = ", p.Hkv, " (query ", to_string(a.q.shape),
             ", key ", to_string(a.k.shape), "), but got a remainder of ", p.H % p.Hkv, " instead");
  p.G = p.H / p.Hkv;
  check_rank4("out", "(B, H, L, Dv)", o.out);
  check_shape("out", "(B, H, L, Dv)", o.out, {p.B, p.H, p.L, p.Dv});
  if (!o.weights.empty()) check_shape("weights", "(B, H, L, S)", o.weights, {p.B, p.H, p.L, p.S});
  if (!o.lse.empty()) check_shape("lse", "(B, H, L)", o.lse, {p.B, p.H, p.L});
  const Shape target = {p.B, p.H, p.L, p.S};
  p.mask = resolve("attn_mask", "(B, H, L, S)", a.attn_mask, target, {0, 1, 2, 3});
  if (a.key_padding.given())
    ATTN_CHECK(a.key_padding.shape() == Shape({p.B, p.S}), "Expected key_padding_mask of shape ",
               dims_str("(B, S)", {p.B, p.S}), ", but got ", to_string(a.key_padding.shape()), " instead");
  p.padding = resolve("key_padding_mask", "(B, S)", a.key_padding, target, {0, 3});
  // D = 0: every score is an empty dot product, 0 at any finite scale (torch: the mean of V), so 1.
  p.scale = a.scale ? *a.scale : p.D ? 1.0 / std::sqrt(static_cast<double>(p.D)) : 1.0;
  ATTN_CHECK(std::isfinite(p.scale), "Expected a finite scale, but got ", p.scale, " instead");
  check_dropout_p("dropout_p", a.dropout_p);
  p.drop_threshold = dropout_threshold(a.dropout_p);
  p.keep_scale = dropout_keep_scale<T>(a.dropout_p);  // p = 1 drops every weight
  return p;
}

template SdpaProblem<float> make_problem(const SdpaArgs<float>&, const SdpaOut<float>&);
template SdpaProblem<double> make_problem(const SdpaArgs<double>&, const SdpaOut<double>&);

}  // namespace attn
