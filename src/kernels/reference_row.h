// One row of the reference's weights, the code reference_forward and reference_backward share, so the
// backward recomputes P with the forward's own arithmetic: scores x = q·kᵀ·scale, softcapped, plus position
// biases and masks (SdpaProblem::score_row; -inf outside the query's keys), then P = exp(x - m) / Σ exp(x - m),
// before dropout. Obvious and O(S) per row on purpose;
// not the flash kernels' online softmax (softmax.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/kernels/problem.h"

namespace attn {

template <typename T>
struct RowMax {
  T m;    // the row's largest score; -inf on a fully masked row
  T sum;  // Σ exp(x - m); 0 on a fully masked row
};

// w (S,) <- row (b, h, l) of P; a fully masked row (m = -inf) gives w = 0, so out, weights and every
// gradient the row feeds are 0.
template <typename T>
RowMax<T> reference_weights(const SdpaProblem<T>& p, int64_t b, int64_t h, int64_t l, T* w) {
  const auto& a = p.args;
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const T* q = a.q.data + b * a.q.strides[0] + h * a.q.strides[1] + l * a.q.strides[2];
  const T* kb = a.k.data + b * a.k.strides[0] + p.kv_head(h) * a.k.strides[1];
  // x = scale·q·k for the keys the query sees, then the score modifications and masks (score_row)
  const Range keys = p.keys(b, l);
  for (int64_t s = keys.begin; s < keys.end; ++s) {
    const T* k = kb + s * a.k.strides[2];
    T dot = 0;
    for (int64_t d = 0; d < p.D; ++d) dot += q[d * a.q.strides[3]] * k[d * a.k.strides[3]];
    w[s] = dot * T(p.scale);
  }
  p.score_row(b, h, l, 0, p.S, T(1), w, 1);
  T m = -kInf;
  // not std::max, which skips a NaN: a NaN score makes the row NaN, never "fully masked" (zero)
  for (int64_t s = 0; s < p.S; ++s)
    if (w[s] > m || std::isnan(w[s])) m = w[s];
  T sum = 0;
  for (int64_t s = 0; s < p.S; ++s) sum += (w[s] = m == -kInf ? T(0) : std::exp(w[s] - m));
  if (m != -kInf)
    for (int64_t s = 0; s < p.S; ++s) w[s] /= sum;
  return {m, sum};
}

}  // namespace attn
