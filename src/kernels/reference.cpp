// Naive SDPA. Slow and O(S) scratch per row on purpose: the oracle every kernel is tested against.
// Runs in float (the "plain fp32" baseline of the tolerance rule) or double (the truth).
#include <cmath>
#include <limits>
#include <vector>

#include "attn/kernels/problem.h"
#include "attn/threads.h"
#include "reference_row.h"

namespace attn {

template <typename T>
void reference_forward(const SdpaProblem<T>& p) {
  const auto& a = p.args;
  constexpr T kInf = std::numeric_limits<T>::infinity();

  parallel_items(p.B * p.H, p.L * p.S * (p.D + p.Dv), [&](int64_t bh, int) {
    const int64_t b = bh / p.H, h = bh % p.H, kvh = p.kv_head(h);
    std::vector<T> w(p.S);  // (S,) one row of weights
    for (int64_t l = 0; l < p.L; ++l) {
      // P = softmax(q·kᵀ·scale + masks); a fully masked row (m = -inf) gives weights 0, output 0, LSE -inf
      const RowMax<T> r = reference_weights(p, b, h, l, w.data());
      for (int64_t s = 0; s < p.S; ++s) w[s] *= p.keep_weight(b, h, l, s);  // P_dropped = P · (keep_scale or 0)
      if (!p.out.lse.empty())
        p.out.lse.data[b * p.out.lse.strides[0] + h * p.out.lse.strides[1] + l * p.out.lse.strides[2]] =
            r.m == -kInf ? -kInf : r.m + std::log(r.sum);
      if (!p.out.weights.empty()) {
        const auto& W = p.out.weights;
        T* row = W.data + b * W.strides[0] + h * W.strides[1] + l * W.strides[2];
        for (int64_t s = 0; s < p.S; ++s) row[s * W.strides[3]] = w[s];
      }
      // out = weights · V
      const auto& O = p.out.out;
      T* o = O.data + b * O.strides[0] + h * O.strides[1] + l * O.strides[2];
      for (int64_t e = 0; e < p.Dv; ++e) {
        T acc = 0;
        const T* v = a.v.data + b * a.v.strides[0] + kvh * a.v.strides[1] + e * a.v.strides[3];
        for (int64_t s = 0; s < p.S; ++s) acc += w[s] * v[s * a.v.strides[2]];
        o[e * O.strides[3]] = acc;
      }
    }
  });
}

template void reference_forward(const SdpaProblem<float>&);
template void reference_forward(const SdpaProblem<double>&);

}  // namespace attn
