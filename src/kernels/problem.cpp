// make_problem (kernels/problem.h): every argument of an attention problem checked once, with the error
// naming the argument and both shapes, and the semantics derived from them (G, scale, resolved masks,
// the dropout threshold and keep scale). Every kernel takes its result; no math here.
#include <algorithm>
#include <cmath>
#include <vector>

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

// "(3,)": a 1-d view's shape, or nothing.
template <typename V>
std::string shape_of(const V& v) { return v.empty() ? std::string("nothing") : to_string(v.shape); }

// The values of a rank-1 int64 view (any stride).
std::vector<int64_t> values_of(const View<const int64_t>& v) {
  std::vector<int64_t> x(size_t(v.shape[0]));
  for (int64_t i = 0; i < v.shape[0]; ++i) x[size_t(i)] = v.data[i * v.strides[0]];
  return x;
}

// cu_seqlens_q / _k: n + 1 non-decreasing offsets from 0 to `total`.
void check_cu(const char* arg, const View<const int64_t>& v, int64_t total, const char* dim) {
  ATTN_CHECK(!v.empty() && v.rank() == 1 && v.shape[0] >= 1, "Expected ", arg, " of shape (n + 1,), but got ",
             shape_of(v), " instead");
  const std::vector<int64_t> x = values_of(v);
  ATTN_CHECK(x.front() == 0 && x.back() == total, "Expected ", arg, " from 0 to ", dim, " = ", total, ", but got ",
             x.front(), " to ", x.back(), " instead");
  for (size_t i = 1; i < x.size(); ++i)
    ATTN_CHECK(x[i] >= x[i - 1], "Expected ", arg, " non-decreasing, but got ", x[i - 1], " then ", x[i],
               " at index ", i, " instead");
}

// The problem's documents: its segments, and each query's and key's segment.
template <typename T>
void resolve_documents(SdpaProblem<T>& p) {
  const Documents& d = p.args.documents;
  if (!d.given()) return;
  const bool ids = !d.ids.empty();
  ATTN_CHECK(!ids || (d.cu_seqlens_q.empty() && d.cu_seqlens_k.empty()), "Expected document_ids or cu_seqlens, ",
             "but got both instead");
  p.q_segment.assign(size_t(p.B * p.L), 0);
  p.k_segment.assign(size_t(p.B * p.S), 0);
  const auto add = [&](int64_t b, Segment g) {
    const int32_t i = int32_t(p.segments.size());
    p.segments.push_back(g);
    std::fill(p.q_segment.begin() + b * p.L + g.q0, p.q_segment.begin() + b * p.L + g.q1, i);
    std::fill(p.k_segment.begin() + b * p.S + g.k0, p.k_segment.begin() + b * p.S + g.k1, i);
  };
  if (ids) {
    ATTN_CHECK(p.L == p.S, "Expected document_ids for self-attention (L == S), but got query ",
               to_string(p.args.q.shape), " and key ", to_string(p.args.k.shape),
               " instead (cu_seqlens_q/_k give documents of other lengths)");
    ATTN_CHECK(d.ids.shape == Shape({p.B, p.L}), "Expected document_ids of shape ", dims_str("(B, L)", {p.B, p.L}),
               ", but got ", to_string(d.ids.shape), " instead");
    const auto id = [&](int64_t b, int64_t l) { return d.ids.data[b * d.ids.strides[0] + l * d.ids.strides[1]]; };
    for (int64_t b = 0; b < p.B; ++b) {
      std::vector<std::pair<int64_t, int64_t>> runs;  // (id, first position) of each run
      for (int64_t l = 0, end = 0; l < p.L; l = end) {
        for (end = l + 1; end < p.L && id(b, end) == id(b, l);) ++end;
        runs.push_back({id(b, l), l});
        add(b, {l, end, l, end});
      }
      std::sort(runs.begin(), runs.end());
      for (size_t i = 1; i < runs.size(); ++i)
        ATTN_CHECK(runs[i].first != runs[i - 1].first, "Expected each document of document_ids to be one run of ",
                   "positions, but got document ", runs[i].first, " at positions ", runs[i - 1].second, " and ",
                   runs[i].second, " of batch ", b, " instead");
    }
    return;
  }
  ATTN_CHECK(p.B == 1, "Expected batch B = 1 with cu_seqlens (the documents are packed along L and S), but got ",
             "query ", to_string(p.args.q.shape), " instead");
  check_cu("cu_seqlens_q", d.cu_seqlens_q, p.L, "L");
  check_cu("cu_seqlens_k", d.cu_seqlens_k, p.S, "S");
  ATTN_CHECK(d.cu_seqlens_q.shape == d.cu_seqlens_k.shape, "Expected cu_seqlens_q and cu_seqlens_k of one ",
             "shape (one entry per document), but got ", to_string(d.cu_seqlens_q.shape), " and ",
             to_string(d.cu_seqlens_k.shape), " instead");
  const std::vector<int64_t> cq = values_of(d.cu_seqlens_q), ck = values_of(d.cu_seqlens_k);
  for (size_t i = 0; i + 1 < cq.size(); ++i) add(0, {cq[i], cq[i + 1], ck[i], ck[i + 1]});
}

// ALiBi slopes (H) or (B, H), and the relative bias table (num_buckets, H) by distance.
template <typename T>
void resolve_position_biases(SdpaProblem<T>& p) {
  const SdpaArgs<T>& a = p.args;
  if (!a.alibi_slopes.empty()) {
    const View<const T>& v = a.alibi_slopes;
    ATTN_CHECK(v.shape == Shape({p.H}) || v.shape == Shape({p.B, p.H}), "Expected alibi_slopes of shape ",
               dims_str("(H)", {p.H}), " or ", dims_str("(B, H)", {p.B, p.H}), ", but got ", to_string(v.shape),
               " instead");
    p.alibi = v.data;
    p.alibi_sb = v.rank() == 2 ? v.strides[0] : 0;
    p.alibi_sh = v.strides[v.rank() - 1];
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.H; ++h)
        ATTN_CHECK(std::isfinite(double(p.alibi_slope(b, h))), "Expected finite alibi_slopes, but got ",
                   p.alibi_slope(b, h), " for batch ", b, " head ", h, " instead");
  }
  const RelativeBias<T>& rb = a.relative_bias;
  if (rb.given()) {
    ATTN_CHECK(rb.table.rank() == 2 && rb.table.shape[1] == p.H && rb.table.shape[0] >= (rb.bidirectional ? 4 : 2),
               "Expected relative_bias of shape (num_buckets, H = ", p.H, ") with num_buckets >= ",
               rb.bidirectional ? 4 : 2, ", but got ", to_string(rb.table.shape), " instead");
    const int64_t nb = rb.table.shape[0];
    ATTN_CHECK(rb.max_distance > (rb.bidirectional ? nb / 4 : nb / 2), "Expected relative_bias max_distance > ",
               rb.bidirectional ? nb / 4 : nb / 2, " (the exact buckets), but got ", rb.max_distance, " instead");
    const int64_t n = p.L + p.S - 1;
    p.relative_bucket.resize(size_t(std::max<int64_t>(n, 0)));
    p.relative.resize(size_t(p.H * std::max<int64_t>(n, 0)));
    for (int64_t i = 0; i < n; ++i)
      p.relative_bucket[size_t(i)] =
          int32_t(relative_position_bucket(i - (p.S - 1), rb.bidirectional, nb, rb.max_distance));
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < n; ++i)
        p.relative[size_t(h * n + i)] =
            rb.table.data[p.relative_bucket[size_t(i)] * rb.table.strides[0] + h * rb.table.strides[1]];
  }
}

}  // namespace

int64_t relative_position_bucket(int64_t d, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  int64_t bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (d > 0) bucket += num_buckets;
    d = d < 0 ? -d : d;
  } else {
    d = d < 0 ? -d : 0;  // -min(d, 0): only keys before the query have buckets of their own
  }
  const int64_t max_exact = num_buckets / 2;
  if (d < max_exact) return bucket + d;
  // float32, as transformers computes it: log(d / max_exact) / log(max_distance / max_exact) · (nb - max_exact)
  const float x = std::log(float(d) / float(max_exact)) / float(std::log(double(max_distance) / double(max_exact))) *
                  float(num_buckets - max_exact);
  return bucket + std::min<int64_t>(max_exact + int64_t(x), num_buckets - 1);
}

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
  ATTN_CHECK(a.window.left >= -1 && a.window.right >= -1, "Expected window (left, right) of sizes >= 0 or -1 ",
             "(unbounded), but got (", a.window.left, ", ", a.window.right, ") instead");
  ATTN_CHECK(std::isfinite(a.softcap) && a.softcap >= 0, "Expected softcap >= 0 (0: none), but got ", a.softcap,
             " instead");
  resolve_documents(p);
  resolve_position_biases(p);
  return p;
}

template SdpaProblem<float> make_problem(const SdpaArgs<float>&, const SdpaOut<float>&);
template SdpaProblem<double> make_problem(const SdpaArgs<double>&, const SdpaOut<double>&);

}  // namespace attn
