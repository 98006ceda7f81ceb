// Scaled dot-product attention: the entry point sdpa(), its backward, and the backend choice (explain).
// out = softmax(Q·Kᵀ·scale + masks) · V, per (batch, head). The argument types (SdpaArgs, SdpaOut,
// SdpaGrads) and the problem every kernel takes live in attn/kernels/problem.h, the kernel interface;
// this header adds the choice between kernels and no semantics of its own.
#pragma once
#include <string>

#include "attn/kernels/half_kv.h"
#include "attn/kernels/problem.h"
#include "attn/precision.h"

namespace attn {

// ---- Backends ----

enum class Backend { automatic, reference, flash };
const char* to_string(Backend b);              // "auto", "reference", "flash"
Backend parse_backend(const std::string& s);   // the inverse; an Error naming the three otherwise

struct SdpaOptions {
  Backend backend = Backend::automatic;
  bool strict =
      false;  // an automatic choice that is not the fastest backend, or a SIMD fallback (simd.h), becomes an error
  // What the flash kernels' products multiply in (attn/precision.h): the thread's Autocast, as linear()
  // follows it. bf16 applies to float32 without weights on the flash kernels (flash_forward, and
  // flash_backward for a bf16 forward's out and LSE); weights, the reference and decoding shapes stay fp32;
  // under strict, bf16 emulated (no AVX512_BF16) is an error.
  Precision precision = matmul_precision();
};

struct BackendChoice {
  Backend backend;
  std::string reason;  // why this backend, in a sentence
};

// The flash forward's (query tile, key tile) pairs over all batches and KV heads' groups: how many it
// computes (causal, windows and documents leave the others out) and how many there are.
struct TileCount {
  int64_t computed = 0, total = 0;
  int skipped_percent() const { return total ? int(100.0 * double(total - computed) / double(total) + 0.5) : 0; }
};
template <typename T>
TileCount flash_tile_count(const SdpaProblem<T>& p);

// Which backend sdpa() would run for these arguments, and why (with the variants, what they are and the
// tiles never computed). Throws in strict mode where sdpa would.
template <typename T>
BackendChoice explain(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options = {});

// The entry point: checks, chooses a backend, runs it.
template <typename T>
void sdpa(const SdpaArgs<T>& args, const SdpaOut<T>& out, const SdpaOptions& options = {});

// Decoding over a half-precision KV cache: as sdpa(args, out) with K and V taken from kv (fp16 or bf16,
// (B, Hkv, S, D) and (B, Hkv, S, Dv), unit column stride); args.k and args.v must be empty. Eval only
// (dropout_p = 0), no weights; runs flash_decode_half, whatever options.backend says (there is one
// kernel for half K/V; an explicit reference backend is refused).
void sdpa(const SdpaArgs<float>& args, const HalfKV& kv, const SdpaOut<float>& out, const SdpaOptions& options = {});

// ---- Cost, as `attn bench` and bench/ count it ----

// FLOPs of the forward: 4·B·H·L·S·D (Q·Kᵀ and P·V, 2·L·S·D each per head), half when causal (the visible
// triangle). The backward counts 2.5x that: five products instead of two.
inline double sdpa_forward_flops(int64_t B, int64_t H, int64_t L, int64_t S, int64_t D, Causal causal) {
  return 4.0 * double(B) * double(H) * double(L) * double(S) * double(D) * (causal == Causal::none ? 1.0 : 0.5);
}
inline double sdpa_backward_flops(int64_t B, int64_t H, int64_t L, int64_t S, int64_t D, Causal causal) {
  return 2.5 * sdpa_forward_flops(B, H, L, S, D, causal);
}

// ---- Backward ----

// Gradients of sdpa(args) given its output `out` (B, H, L, Dv), its `lse` (B, H, L) (sdpa with
// out.lse requested) and dout = dLoss/dout (B, H, L, Dv). Same masks, causal, scale and dropout seed as
// the forward; a fully masked row gets zero gradient. Backend choice as in sdpa().
template <typename T>
void sdpa_backward(const SdpaArgs<T>& args, View<const T> out, View<const T> lse, View<const T> dout,
                   const SdpaGrads<T>& grads, const SdpaOptions& options = {});

}  // namespace attn
