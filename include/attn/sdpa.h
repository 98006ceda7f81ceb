// Scaled dot-product attention: the entry point sdpa(), the backend choice (explain), and the problem
// description every kernel takes. out = softmax(Q·Kᵀ·scale + masks) · V, per (batch, head).
//
// Layout: Q (B, H, L, D), K (B, Hkv, S, D), V (B, Hkv, S, Dv), out (B, H, L, Dv), all strided views:
// MultiheadAttention's (B, L, E) projections are passed as (B, H, L, D) views without a copy.
// GQA/MQA: query head h reads KV head kv_head(h); K and V are never repeated.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "attn/mask.h"
#include "attn/tensor.h"

namespace attn {

template <typename T>
struct SdpaArgs {
  View<const T> q;  // (B, H, L, D)
  View<const T> k;  // (B, Hkv, S, D)
  View<const T> v;  // (B, Hkv, S, Dv)
  Mask<T> attn_mask;              // broadcastable to (B, H, L, S), right-aligned as in PyTorch
  Mask<T> key_padding;            // (B, S)
  Causal causal = Causal::none;   // combines with both masks
  std::optional<double> scale;    // default 1/sqrt(D)
  double dropout_p = 0;           // dropout on the weights; the caller passes 0 in eval mode
  uint64_t seed = 0;              // dropout keep bit of weight (b, h, l, s) = f(seed, index)
};

template <typename T>
struct SdpaOut {
  View<T> out;      // (B, H, L, Dv), any strides
  View<T> weights;  // (B, H, L, S), optional: the weights after dropout, as PyTorch returns them
  View<T> lse;      // (B, H, L), optional: log-sum-exp of the scaled masked scores; -inf on a fully masked row
};

// Gradients of sdpa; dk and dv are summed over the query heads of a GQA group.
template <typename T>
struct SdpaGrads {
  View<T> dq;  // (B, H, L, D)
  View<T> dk;  // (B, Hkv, S, D)
  View<T> dv;  // (B, Hkv, S, Dv)
};

// A mask resolved against (B, H, L, S): element strides, 0 on broadcast dims.
template <typename T>
struct MaskRef {
  typename Mask<T>::Kind kind = Mask<T>::Kind::none;
  const uint8_t* bools = nullptr;
  const T* bias = nullptr;
  int64_t sb = 0, sh = 0, sl = 0, ss = 0;

  bool given() const { return kind != Mask<T>::Kind::none; }
  // What the mask adds to score (b, h, l, s): 0, -inf, or the additive value.
  T at(int64_t b, int64_t h, int64_t l, int64_t s) const {
    using K = typename Mask<T>::Kind;
    int64_t off = b * sb + h * sh + l * sl + s * ss;
    if (kind == K::additive) return bias[off];
    if (kind == K::none) return T(0);
    bool masked = (bools[off] != 0) == (kind == K::drop);
    return masked ? -std::numeric_limits<T>::infinity() : T(0);
  }
};

// A checked attention problem: the arguments, where the results go, the sizes and resolved masks.
// Every kernel (reference, flash) takes one, so tests and benchmarks loop over backends.
template <typename T>
struct SdpaProblem {
  SdpaArgs<T> args;
  SdpaOut<T> out;
  int64_t B, H, Hkv, L, S, D, Dv;
  double scale;
  MaskRef<T> mask;     // args.attn_mask
  MaskRef<T> padding;  // args.key_padding, as a (B, 1, 1, S) mask

  // GQA: the KV head that query head h reads. The one home of this mapping.
  int64_t kv_head(int64_t h) const { return h / (H / Hkv); }
  // Causal: query l sees keys [0, key_end(l)); S when not causal.
  int64_t key_end(int64_t l) const {
    if (args.causal == Causal::none) return S;
    int64_t end = l + 1 + (args.causal == Causal::bottom_right ? S - L : 0);
    return end < 0 ? 0 : (end > S ? S : end);
  }
  // Sum of what both masks add to score (b, h, l, s); causal is not included (see key_end).
  T bias(int64_t b, int64_t h, int64_t l, int64_t s) const { return mask.at(b, h, l, s) + padding.at(b, h, l, s); }
  bool has_bias() const { return mask.given() || padding.given(); }
};

// Checks every argument (ranks, shapes, GQA ratio, mask broadcast, scale, dropout) and names the
// argument and both shapes in the error. `out` views that are empty are not requested (out.out is required).
template <typename T>
SdpaProblem<T> make_problem(const SdpaArgs<T>& args, const SdpaOut<T>& out);

// ---- Backends ----

enum class Backend { automatic, reference, flash };
const char* to_string(Backend b);

struct SdpaOptions {
  Backend backend = Backend::automatic;
  bool strict = false;  // an automatic choice that is not the fastest backend, or a SIMD fallback (simd.h), becomes an error
};

struct BackendChoice {
  Backend backend;
  std::string reason;  // why this backend, in a sentence
};

// Which backend sdpa() would run for these arguments, and why. Throws in strict mode where sdpa would.
template <typename T>
BackendChoice explain(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options = {});

// The entry point: checks, chooses a backend, runs it.
template <typename T>
void sdpa(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options = {});

// ---- Kernels (arguments already checked by make_problem) ----

// The oracle: obvious code, materializes each row of scores, float or double.
template <typename T>
void reference_forward(const SdpaProblem<T>& p);
// FlashAttention-2 forward, fp32 only: never materializes the weights (p.out.weights must be empty),
// writes out and, if requested, LSE. Same result for any thread count.
void flash_forward(const SdpaProblem<float>& p);
// The backward oracle: recomputes the weights (reads neither p.out.out nor p.out.lse), float or double.
// dout (B, H, L, Dv); dk and dv are summed over the query heads of a GQA group.
template <typename T>
void reference_backward(const SdpaProblem<T>& p, View<const T> dout, const SdpaGrads<T>& g);
// FlashAttention-2 backward, fp32 only: needs p.out.out and p.out.lse from the forward. dout (B, H, L, Dv).
// Same result for any thread count.
void flash_backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g);

// ---- Backward ----

// Gradients of sdpa(args) given its output `out` (B, H, L, Dv), its `lse` (B, H, L) (sdpa with
// out.lse requested) and dout = dLoss/dout (B, H, L, Dv). Same masks, causal, scale and dropout seed as
// the forward; a fully masked row gets zero gradient. Backend choice as in sdpa().
template <typename T>
void sdpa_backward(const SdpaArgs<T>& args, View<const T> out, View<const T> lse, View<const T> dout,
                   const SdpaGrads<T>& grads, const SdpaOptions& options = {});

}  // namespace attn
