// The attention weights of a forward whose output and LSE the flash kernel computed (flash never holds
// a whole row of weights): W = keep ∘ exp(scores − lse), the same weights the reference
// materializes, with one GEMM per (batch, head) for the scores instead of the reference's scalar dot
// products. Not a softmax of its own: the LSE says what each row sums to. Float32, unit column strides.
#include <cmath>
#include <limits>

#include "attn/gemm.h"
#include "attn/kernels/problem.h"
#include "attn/threads.h"

namespace attn {

void weights_from_lse(const SdpaProblem<float>& p) {
  const auto& a = p.args;
  const View<float>& w = p.out.weights;  // (B, H, L, S)
  const View<float>& lse = p.out.lse;    // (B, H, L)
  // scores = Q·Kᵀ·scale, one GEMM per (b, h) (each GEMM splits its own work over the threads)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.H; ++h)
      gemm(false, true, p.L, p.S, p.D, float(p.scale), a.q.data + b * a.q.strides[0] + h * a.q.strides[1],
           a.q.strides[2], a.k.data + b * a.k.strides[0] + p.kv_head(h) * a.k.strides[1], a.k.strides[2], 0.f,
           w.data + b * w.strides[0] + h * w.strides[1], w.strides[2]);
  // W = keep ∘ exp(scores − lse) for the keys the query sees, else 0, the scores softcapped and with the
  // position biases and masks added (score_row); a fully masked row (lse = -inf) is 0, a NaN score stays
  // NaN (its lse is NaN).
  parallel_items(p.B * p.H * p.L, p.S * 8, [&](int64_t i, int) {
    const int64_t b = i / (p.H * p.L), h = i / p.L % p.H, l = i % p.L;
    float* row = w.data + b * w.strides[0] + h * w.strides[1] + l * w.strides[2];
    const float m = lse.data[b * lse.strides[0] + h * lse.strides[1] + l * lse.strides[2]];
    const Range keys = m == -std::numeric_limits<float>::infinity() ? Range{} : p.keys(b, l);
    p.score_row(b, h, l, 0, p.S, 1.f, row, 1);
    for (int64_t s = 0; s < p.S; ++s)
      row[s] = s >= keys.begin && s < keys.end ? std::exp(row[s] - m) * p.keep_weight(b, h, l, s) : 0.f;
  });
}

}  // namespace attn
