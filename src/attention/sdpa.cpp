// sdpa(): the entry points' argument checks (beyond make_problem's), backend choice, dispatch. No math here.
#include "attn/sdpa.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "attn/gemm.h"  // check_bf16_native, gemm_bf16_kernel
#include "attn/simd.h"

namespace attn {
namespace {

// Writes 0 to every element of a rank-4 view.
template <typename T>
void fill_zero(View<T> v) {
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c)
        for (int64_t d = 0; d < v.shape[3]; ++d)
          v.data[a * v.strides[0] + b * v.strides[1] + c * v.strides[2] + d * v.strides[3]] = 0;
}

// No query head in any batch (B or H is 0): out, weights and lse are empty, and the kernels (which
// split their work by B·H) are not called.
template <typename T>
bool no_queries(const SdpaProblem<T>& p) { return p.B * p.H == 0; }

}  // namespace

// The one spelling of each backend, printed and parsed alike (CLI, Python, traces).
constexpr std::pair<Backend, const char*> kBackendNames[] = {
    {Backend::automatic, "auto"}, {Backend::reference, "reference"}, {Backend::flash, "flash"}};

const char* to_string(Backend b) {
  for (const auto& [backend, name] : kBackendNames)
    if (backend == b) return name;
  return "?";
}

Backend parse_backend(const std::string& s) {
  for (const auto& [backend, name] : kBackendNames)
    if (s == name) return backend;
  throw Error(cat("Expected backend in {auto, reference, flash}, but got '", s, "' instead"));
}

// Weights requested: flash writes the output and LSE, weights_from_lse the weights, which needs unit
// column strides of Q, K and the weights (its GEMM's rows); else the reference materializes them.
template <typename T>
bool weights_by_gemm(const SdpaProblem<T>& p) {
  return p.args.q.strides[3] == 1 && p.args.k.strides[3] == 1 && p.out.weights.strides[3] == 1;
}

// The backend for a checked problem. automatic: flash for float32 (with weights requested, the weights
// from its LSE), unless T is double or requested weights have strided columns; strict turns such a
// fallback into an error. An explicit backend is honoured, or refused with the reason.
template <typename T>
BackendChoice choose(const SdpaProblem<T>& p, const SdpaOptions& options) {
  constexpr bool fp64 = std::is_same_v<T, double>;
  const bool weights = !p.out.weights.empty(), strided = weights && !weights_by_gemm(p);
  if (options.backend == Backend::reference) return {Backend::reference, "reference requested"};
  if (options.backend == Backend::flash) {
    ATTN_CHECK(!fp64,
               "Expected float32 inputs for backend flash, but got float64 instead (fp64 runs on the reference)");
    ATTN_CHECK(!strided, "Expected query, key and weights with unit column stride for backend flash with weights ",
               "(the weights come from one GEMM per head), but got strides ", to_string(p.args.q.strides), ", ",
               to_string(p.args.k.strides), " and ", to_string(p.out.weights.strides), " instead");
    return {Backend::flash, "flash requested"};
  }
  if (options.strict) check_no_simd_fallback();
  if (!fp64 && !weights && options.precision == Precision::bf16) {
    if (options.strict) check_bf16_native();
    return {Backend::flash, "float32 without weights runs on the flash kernel, its products in bf16 (" +
                                gemm_bf16_kernel() + ")"};
  }
  if (!fp64 && !weights) return {Backend::flash, "float32 without weights runs on the flash kernel"};
  if (!fp64 && !strided)
    return {Backend::flash, "float32 with weights: flash for the output and LSE, the weights from the LSE"};
  const char* reason = fp64 ? "fp64 runs on the reference"
                            : "weights requested with strided columns: the reference materializes them";
  ATTN_CHECK(!options.strict, "Expected the flash backend (strict mode allows no fallback), but got a fallback to ",
             "the reference instead: ", reason);
  return {Backend::reference, reason};
}

template <typename T>
TileCount flash_tile_count(const SdpaProblem<T>& p) {
  // the forward's tiles: about flash_tiles().rows query rows (whole GQA groups) by the keys of a key tile
  const FlashTiles t = flash_tiles();
  const int64_t lq = std::max<int64_t>(1, t.rows / p.G), kt = t.keys, per_b = (p.S + kt - 1) / kt;
  TileCount n;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t l0 = 0; l0 < p.L; l0 += lq) {
      const Range first = p.keys(b, l0), last = p.keys(b, std::min(p.L, l0 + lq) - 1);
      n.total += per_b;
      if (last.end > first.begin) n.computed += (last.end + kt - 1) / kt - first.begin / kt;
    }
  return n;
}

// "; variants: window (512, 0), ALiBi, ..., in the kernel; the flash forward computes 96 of 4096 (query, key)
// tiles (98% never computed)", or "" without variants.
template <typename T>
std::string variants_of(const SdpaProblem<T>& p, Backend backend) {
  const SdpaArgs<T>& a = p.args;
  std::string v;
  const auto add = [&](const std::string& x) { v += (v.empty() ? "" : ", ") + x; };
  if (a.window.given()) add(cat("window (", a.window.left, ", ", a.window.right, ")"));
  if (p.alibi) add("ALiBi");
  if (p.has_softcap()) add(cat("softcap ", a.softcap));
  if (a.relative_bias.given())
    add(cat("relative bias (", a.relative_bias.table.size(0), " buckets, ",
            a.relative_bias.bidirectional ? "bidirectional" : "causal", ")"));
  if (!p.segments.empty()) add(cat(p.segments.size(), " documents"));
  if (v.empty()) return v;
  std::string out = "; variants: " + v + ", in the kernel";
  if (backend != Backend::flash || p.L == 0 || p.S == 0) return out;
  const TileCount n = flash_tile_count(p);
  return cat(out, "; the flash forward computes ", n.computed, " of ", n.total, " (query, key) tiles (",
             n.skipped_percent(), "% never computed)");
}

template <typename T>
BackendChoice explain(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options) {
  const SdpaProblem<T> p = make_problem(args, out);
  BackendChoice c = choose(p, options);
  c.reason += variants_of(p, c.backend);
  return c;
}

template <typename T>
void sdpa(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options) {
  SdpaProblem<T> p = make_problem(args, out);
  const Backend backend = choose(p, options).backend;  // throws where explicit flash or strict refuse fp64
  if (no_queries(p)) return;
  if constexpr (std::is_same_v<T, float>) {
    if (backend == Backend::flash && p.out.weights.empty()) return flash_forward(p, options.precision);
    if (backend == Backend::flash) {  // flash never holds a row of weights: its LSE gives them
      SdpaProblem<float> f = p;
      f.out.weights = {};
      Tensor lse;  // (B, H, L) when the caller asked for none
      if (f.out.lse.empty()) f.out.lse = (lse = Tensor({p.B, p.H, p.L})).view();
      flash_forward(f);
      f.out.weights = p.out.weights;
      return weights_from_lse(f);
    }
  }
  reference_forward(p);
}

template TileCount flash_tile_count(const SdpaProblem<float>&);
template TileCount flash_tile_count(const SdpaProblem<double>&);
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
  // The additive mask's gradient dS runs on the reference, the one kernel that writes it.
  const bool dmask = !grads.dmask.empty();
  if (dmask) {
    ATTN_CHECK(args.attn_mask.kind == Mask<T>::Kind::additive, "Expected an additive (float) attn_mask for its ",
               "gradient dmask, but got ", args.attn_mask.given() ? "a bool mask" : "no attn_mask", " instead");
    check_rank4("dmask", "(B, H, L, S)", grads.dmask);
    check_shape("dmask", "(B, H, L, S)", grads.dmask, {p.B, p.H, p.L, p.S});
    ATTN_CHECK(options.backend != Backend::flash, "Expected backend automatic or reference for the attn_mask's ",
               "gradient (the reference is the kernel that writes dS), but got flash instead");
  }
  if (!grads.drelative_bias.empty()) {
    const Shape want = {args.relative_bias.given() ? args.relative_bias.table.size(0) : 0, p.H};
    ATTN_CHECK(args.relative_bias.given(), "Expected a relative_bias for its gradient drelative_bias, but got none ",
               "instead");
    ATTN_CHECK(grads.drelative_bias.shape == want, "Expected drelative_bias of shape ",
               dims_str("(num_buckets, H)", want), ", but got ", to_string(grads.drelative_bias.shape), " instead");
  }
  // The forward's choice (no weights here): flash for float32, the reference for fp64 or on request.
  const Backend backend = dmask ? Backend::reference : choose(p, options).backend;  // choose throws where explicit
                                                                                     // flash or strict refuse fp64
  if (no_queries(p)) {  // dq is empty; no query reads any key, so dK = dV = 0
    fill_zero(grads.dk);
    fill_zero(grads.dv);
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (backend == Backend::flash) return flash_backward(p, dout, grads, options.precision);
  }
  reference_backward(p, dout, grads);
}

template void sdpa_backward(const SdpaArgs<float>&, View<const float>, View<const float>, View<const float>,
                            const SdpaGrads<float>&, const SdpaOptions&);
template void sdpa_backward(const SdpaArgs<double>&, View<const double>, View<const double>,
                            View<const double>, const SdpaGrads<double>&, const SdpaOptions&);

}  // namespace attn
