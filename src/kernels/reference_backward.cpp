// Naive SDPA backward: dQ, dK, dV by the chain rule, recomputing each row of weights with the forward's
// code (reference_row.h).
// Slow and O(S) scratch per row on purpose: the oracle the flash backward is tested against. It reads
// neither the saved output nor the LSE, so a wrong forward can't hide a wrong backward. The one kernel
// that writes dS itself (g.dmask: the gradient of an additive attn_mask, learned biases).
#include <cmath>
#include <limits>
#include <vector>

#include "attn/kernels/problem.h"
#include "attn/threads.h"
#include "reference_row.h"

namespace attn {

template <typename T>
void reference_backward(const SdpaProblem<T>& p, View<const T> dout, const SdpaGrads<T>& g) {
  const auto& a = p.args;
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const T scale = T(p.scale);

  // The relative bias table's gradient: each task's share (num_buckets, G) of its heads, summed in task order.
  const bool drel = !g.drelative_bias.empty();
  const int64_t nb = drel ? g.drelative_bias.shape[0] : 0;
  std::vector<T> rel_part(size_t(p.B * p.Hkv * nb * p.G), T(0));

  // One task per (b, KV head): it owns dK and dV of that head and dQ of the query heads of its group,
  // so the sums below have one order whatever the thread count.
  parallel_items(p.B * p.Hkv, p.G * p.L * p.S * (p.D + p.Dv) * 2, [&](int64_t bkv, int) {
    const int64_t b = bkv / p.Hkv, kvh = bkv % p.Hkv;
    std::vector<T> w(p.S), dw(p.S);  // (S,) one row of weights and of their gradient
    const T* kb = a.k.data + b * a.k.strides[0] + kvh * a.k.strides[1];
    const T* vb = a.v.data + b * a.v.strides[0] + kvh * a.v.strides[1];
    T* dkb = g.dk.data + b * g.dk.strides[0] + kvh * g.dk.strides[1];
    T* dvb = g.dv.data + b * g.dv.strides[0] + kvh * g.dv.strides[1];
    for (int64_t s = 0; s < p.S; ++s) {
      for (int64_t d = 0; d < p.D; ++d) dkb[s * g.dk.strides[2] + d * g.dk.strides[3]] = 0;
      for (int64_t e = 0; e < p.Dv; ++e) dvb[s * g.dv.strides[2] + e * g.dv.strides[3]] = 0;
    }
    for (int64_t h = p.first_head(kvh); h < p.first_head(kvh) + p.G; ++h) {
      for (int64_t l = 0; l < p.L; ++l) {
        const T* q = a.q.data + b * a.q.strides[0] + h * a.q.strides[1] + l * a.q.strides[2];
        const T* dO = dout.data + b * dout.strides[0] + h * dout.strides[1] + l * dout.strides[2];
        T* dq = g.dq.data + b * g.dq.strides[0] + h * g.dq.strides[1] + l * g.dq.strides[2];
        for (int64_t d = 0; d < p.D; ++d) dq[d * g.dq.strides[3]] = 0;
        T* dmask = g.dmask.empty() ? nullptr  // (S,) dS of this row, when asked for
                                   : g.dmask.data + b * g.dmask.strides[0] + h * g.dmask.strides[1] +
                                         l * g.dmask.strides[2];
        if (dmask)
          for (int64_t s = 0; s < p.S; ++s) dmask[s * g.dmask.strides[3]] = 0;
        // P = softmax(q·kᵀ·scale + masks), by the forward's own code; a fully masked row has P = 0, so
        // every gradient it feeds is 0
        if (reference_weights(p, b, h, l, w.data()).m == -kInf) continue;
        // dP_dropped = dO·Vᵀ; dP = dP_dropped ∘ keep/(1-p); D = rowsum(P ∘ dP) = rowsum(dO ∘ O)
        T D = 0;
        for (int64_t s = 0; s < p.S; ++s) {
          const T* v = vb + s * a.v.strides[2];
          T dot = 0;
          for (int64_t e = 0; e < p.Dv; ++e) dot += dO[e * dout.strides[3]] * v[e * a.v.strides[3]];
          const T keep = p.keep_weight(b, h, l, s);
          dw[s] = dot * keep;
          D += w[s] * dw[s];
          // dV += P_droppedᵀ·dO
          T pd = w[s] * keep;
          T* dv = dvb + s * g.dv.strides[2];
          for (int64_t e = 0; e < p.Dv; ++e) dv[e * g.dv.strides[3]] += pd * dO[e * dout.strides[3]];
        }
        // dS = P ∘ (dP − D), the gradient of the scores (the additive mask's and the relative bias's);
        // through the softcap x' = c·tanh(x/c): dx = dS·(1 − tanh²(x/c)); dQ = scale·dx·K; dK += scale·dxᵀ·Q
        const Range keys = p.keys(b, l);
        for (int64_t s = 0; s < p.S; ++s) {
          const T dscore = w[s] * (dw[s] - D);
          if (dmask) dmask[s * g.dmask.strides[3]] = dscore;
          const bool seen = s >= keys.begin && s < keys.end;
          if (drel && seen)
            rel_part[size_t((bkv * nb + p.relative_bucket[size_t(p.distance(b, l, s) + p.S - 1)]) * p.G +
                            h - p.first_head(kvh))] += dscore;
          T ds = dscore * scale;
          const T* k = kb + s * a.k.strides[2];
          if (p.has_softcap() && seen) {
            T dot = 0;
            for (int64_t d = 0; d < p.D; ++d) dot += q[d * a.q.strides[3]] * k[d * a.k.strides[3]];
            const T t = std::tanh(dot * scale / T(p.args.softcap));
            ds *= T(1) - t * t;
          }
          T* dk = dkb + s * g.dk.strides[2];
          for (int64_t d = 0; d < p.D; ++d) {
            dq[d * g.dq.strides[3]] += ds * k[d * a.k.strides[3]];
            dk[d * g.dk.strides[3]] += ds * q[d * a.q.strides[3]];
          }
        }
      }
    }
  });
  if (drel)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t i = 0; i < nb; ++i) {
        T sum = 0;
        for (int64_t b = 0; b < p.B; ++b)
          sum += rel_part[size_t(((b * p.Hkv + p.kv_head(h)) * nb + i) * p.G + h - p.first_head(p.kv_head(h)))];
        g.drelative_bias.data[i * g.drelative_bias.strides[0] + h * g.drelative_bias.strides[1]] = sum;
      }
}

template void reference_backward(const SdpaProblem<float>&, View<const float>, const SdpaGrads<float>&);
template void reference_backward(const SdpaProblem<double>&, View<const double>, const SdpaGrads<double>&);

}  // namespace attn
