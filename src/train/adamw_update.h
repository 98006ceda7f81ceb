// The elementwise AdamW update over float arrays, SIMD (Highway: AVX-512, AVX2, SSE4 or SCALAR, chosen
// when the program runs). Private to src/train: optim.cpp splits the parameters over threads and calls it.
#pragma once
#include <cstdint>

namespace attn {

// The float32 scalars of one step, as torch.optim.AdamW turns its Python floats into them.
struct AdamWScalars {
  float decay;      // 1 - lr·λ, or 1 where the parameter does not decay
  float w1;         // 1 - β1
  float b2, w2;     // β2, 1 - β2
  float bc2_sqrt;   // sqrt(1 - β2^step)
  float eps;
  float step_size;  // lr / (1 - β1^step)
  float grad_scale; // the clip coefficient g is multiplied by first (1: unclipped, g·1 = g exactly)
};

// θ, m, v updated in place from g, with torch's operation order (no fused multiply-adds):
//   g ← g·grad_scale (in a register: the bits clip_grad_norm's in-place g *= c gave);  θ ← θ·decay;
//   m ← m + w1·(g − m);  v ← v·β2 + (w2·g)·g;  θ ← θ + (−step_size·m) / (sqrt(v)/bc2_sqrt + ε)
void adamw_update(int64_t n, float* theta, const float* g, float* m, float* v, const AdamWScalars& s);

}  // namespace attn
