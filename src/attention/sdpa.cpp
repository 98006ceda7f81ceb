// sdpa(): argument checks with clear errors, backend choice, dispatch. No math here.
#include "attn/sdpa.h"

#include <type_traits>

#include "attn/simd.h"

namespace attn {
namespace {

std::string dims_str(const char* names, const Shape& shape) { return cat(names, " = ", to_string(shape)); }

template <typename V>
void check_rank4(const char* arg, const char* dims, const V& v) {
  ATTN_CHECK(!v.empty(), "Expected ", arg, " ", dims, ", but got nothing instead");
  ATTN_CHECK(v.rank() == 4, "Expected ", arg, " of rank 4 ", dims, ", but got shape ", to_string(v.shape),
             " instead");
}

template <typename V>
void check_shape(const char* arg, const char* dims, const V& v, const Shape& want) {
  ATTN_CHECK(v.shape == want, "Expected ", arg, " of shape ", dims_str(dims, want), ", but got ",
             to_string(v.shape), " instead");
}

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

// Writes 0 to every element of a rank-4 view.
template <typename T>
void fill_zero(View<T> v) {
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c)
        for (int64_t d = 0; d < v.shape[3]; ++d) v.data[a * v.strides[0] + b * v.strides[1] + c * v.strides[2] + d * v.strides[3]] = 0;
}

// No query head in any batch (B or H is 0): out, weights and lse are empty, and the kernels (which
// split their work by B·H) are not called.
template <typename T>
bool no_queries(const SdpaProblem<T>& p) { return p.B * p.H == 0; }

}  // namespace

const char* to_string(Backend b) {
  switch (b) {
    case Backend::automatic: return "automatic";
    case Backend::reference: return "reference";
    case Backend::flash: return "flash";
  }
  return "?";
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
  ATTN_CHECK(a.dropout_p >= 0 && a.dropout_p <= 1, "Expected dropout_p in [0, 1], but got ", a.dropout_p,
             " instead");
  p.drop_threshold = dropout_threshold(a.dropout_p);
  p.keep_scale = a.dropout_p < 1 ? T(1) / T(1 - a.dropout_p) : T(0);  // p = 1 drops every weight
  return p;
}

// The backend for a checked problem. automatic: flash for float32, unless weights are requested (flash
// never materializes them) or T is double; strict turns such a fallback into an error. An explicit
// backend is honoured, or refused with the reason.
template <typename T>
BackendChoice choose(const SdpaProblem<T>& p, const SdpaOptions& options) {
  constexpr bool fp64 = std::is_same_v<T, double>;
  const bool weights = !p.out.weights.empty();
  if (options.backend == Backend::reference) return {Backend::reference, "reference requested"};
  if (options.backend == Backend::flash) {
    ATTN_CHECK(!fp64, "Expected float32 inputs for backend flash, but got float64 instead (fp64 runs on the reference)");
    ATTN_CHECK(!weights, "Expected no weights output for backend flash (flash never materializes them), but got ",
               "weights of shape ", to_string(p.out.weights.shape), " instead");
    return {Backend::flash, "flash requested"};
  }
  if (options.strict) check_no_simd_fallback();
  if (!fp64 && !weights) return {Backend::flash, "float32 without weights runs on the flash kernel"};
  const char* reason = fp64 ? "fp64 runs on the reference" : "weights requested: flash never materializes them";
  ATTN_CHECK(!options.strict, "Expected the flash backend (strict mode allows no fallback), but got a fallback to ",
             "the reference instead: ", reason);
  return {Backend::reference, reason};
}

template <typename T>
BackendChoice explain(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options) {
  return choose(make_problem(args, out), options);
}

template <typename T>
void sdpa(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options) {
  SdpaProblem<T> p = make_problem(args, out);
  const Backend backend = choose(p, options).backend;  // throws where explicit flash or strict refuse fp64
  if (no_queries(p)) return;
  if constexpr (std::is_same_v<T, float>) {
    if (backend == Backend::flash) return flash_forward(p);
  }
  reference_forward(p);
}

template SdpaProblem<float> make_problem(const SdpaArgs<float>&, const SdpaOut<float>&);
template SdpaProblem<double> make_problem(const SdpaArgs<double>&, const SdpaOut<double>&);
template BackendChoice explain(const SdpaArgs<float>&, const SdpaOut<float>&, const SdpaOptions&);
template BackendChoice explain(const SdpaArgs<double>&, const SdpaOut<double>&, const SdpaOptions&);
template void sdpa(const SdpaArgs<float>&, const SdpaOut<float>&, const SdpaOptions&);
template void sdpa(const SdpaArgs<double>&, const SdpaOut<double>&, const SdpaOptions&);

void sdpa(const SdpaArgs<float>& args, const HalfKV& kv, const SdpaOut<float>& out, const SdpaOptions& options) {
  ATTN_CHECK(kv.dtype == KvDtype::f16 || kv.dtype == KvDtype::bf16, "Expected a half KV dtype f16 or bf16, but got ",
             to_string(kv.dtype), " instead (fp32 K/V go through sdpa(args, out))");
  ATTN_CHECK(args.k.empty() && args.v.empty(), "Expected args.k and args.v empty when K and V come from a half KV "
             "cache, but got key ", to_string(args.k.shape), " and value ", to_string(args.v.shape), " instead");
  check_rank4("half key", "(B, Hkv, S, D)", kv.k);
  check_rank4("half value", "(B, Hkv, S, Dv)", kv.v);
  ATTN_CHECK(kv.k.strides[3] == 1 && kv.v.strides[3] == 1, "Expected half key and value with unit column stride, ",
             "but got strides ", to_string(kv.k.strides), " and ", to_string(kv.v.strides), " instead");
  ATTN_CHECK(args.dropout_p == 0, "Expected dropout_p = 0 over a half KV cache (decoding is eval only), but got ",
             args.dropout_p, " instead");
  ATTN_CHECK(out.weights.empty(), "Expected no weights output over a half KV cache, but got weights of shape ",
             to_string(out.weights.shape), " instead");
  ATTN_CHECK(options.backend != Backend::reference, "Expected backend automatic or flash over a half KV cache ",
             "(flash_decode_half is its only kernel), but got reference instead");
  // The problem's K and V views carry the shapes only, so make_problem checks them as for fp32 K/V.
  SdpaArgs<float> a = args;
  a.k = View<const float>(reinterpret_cast<const float*>(kv.k.data), kv.k.shape, kv.k.strides);
  a.v = View<const float>(reinterpret_cast<const float*>(kv.v.data), kv.v.shape, kv.v.strides);
  flash_decode_half(make_problem(a, out), kv);
}

// ---- Backward ----

template <typename T>
void sdpa_backward(const SdpaArgs<T>& args, View<const T> out, View<const T> lse, View<const T> dout,
                   const SdpaGrads<T>& grads, const SdpaOptions& options) {
  // The kernels only read the forward's out and lse; make_problem takes them as outputs to check them.
  auto writable = [](View<const T> x) { return View<T>(const_cast<T*>(x.data), x.shape, x.strides); };
  ATTN_CHECK(!lse.empty(), "Expected lse (B, H, L) from the forward, but got nothing instead");
  SdpaProblem<T> p = make_problem(args, SdpaOut<T>{writable(out), {}, writable(lse)});
  check_rank4("dout", "(B, H, L, Dv)", dout);
  check_shape("dout", "(B, H, L, Dv)", dout, {p.B, p.H, p.L, p.Dv});
  check_rank4("dq", "(B, H, L, D)", grads.dq);
  check_shape("dq", "(B, H, L, D)", grads.dq, {p.B, p.H, p.L, p.D});
  check_rank4("dk", "(B, Hkv, S, D)", grads.dk);
  check_shape("dk", "(B, Hkv, S, D)", grads.dk, {p.B, p.Hkv, p.S, p.D});
  check_rank4("dv", "(B, Hkv, S, Dv)", grads.dv);
  check_shape("dv", "(B, Hkv, S, Dv)", grads.dv, {p.B, p.Hkv, p.S, p.Dv});
  // The forward's choice (no weights here): flash for float32, the reference for fp64 or on request.
  const Backend backend = choose(p, options).backend;  // throws where explicit flash or strict refuse fp64
  if (no_queries(p)) {  // dq is empty; no query reads any key, so dK = dV = 0
    fill_zero(grads.dk);
    fill_zero(grads.dv);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (backend == Backend::flash) return flash_backward(p, dout, grads);
  }
  reference_backward(p, dout, grads);
}

template void sdpa_backward(const SdpaArgs<float>&, View<const float>, View<const float>, View<const float>,
                            const SdpaGrads<float>&, const SdpaOptions&);
template void sdpa_backward(const SdpaArgs<double>&, View<const double>, View<const double>,
                            View<const double>, const SdpaGrads<double>&, const SdpaOptions&);

}  // namespace attn
