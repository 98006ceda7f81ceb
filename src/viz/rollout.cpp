// Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"): how much of each
// token's input reaches each position through every layer, the residual connection counted. Per layer, the
// head-averaged weights plus the identity, Â = 0.5·mean_h(A) + 0.5·I, each row renormalised to sum to 1;
// then the product of the layers: R_0 = Â_0, R_l = Â_l · R_{l-1}. Not a view (html.cpp draws it) and not a
// model runner: the weights are the caller's, as for every view.
#include <cmath>
#include <vector>

#include "attn/check.h"
#include "attn/viz.h"

namespace attn::viz {

std::vector<Tensor> attention_rollout(const std::vector<View<const float>>& layers) {
  ATTN_CHECK(!layers.empty(), "Expected at least one layer of weights (H, T, T), but got none instead");
  const int64_t T = layers[0].rank() == 3 ? layers[0].size(1) : 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& w = layers[l];
    ATTN_CHECK(w.rank() == 3 && w.size(0) > 0 && w.size(1) == T && w.size(2) == T && T > 0, "Expected layers[", l,
               "] of self-attention weights (H, T, T) with T = ", T, " (rollout multiplies the layers), but got ",
               to_string(w.shape), " instead");
  }
  std::vector<double> a(size_t(T * T)), r(size_t(T * T)), next(size_t(T * T));  // (T, T) each
  std::vector<Tensor> out;
  for (size_t l = 0; l < layers.size(); ++l) {
    const View<const float>& w = layers[l];
    const int64_t H = w.size(0);
    // Â = 0.5·mean_h(A) + 0.5·I, rows renormalised (a row of zeros, fully masked, keeps the identity's 1)
    for (int64_t i = 0; i < T; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < T; ++j) {
        double m = 0;
        for (int64_t h = 0; h < H; ++h) {
          const float x = w.data[h * w.strides[0] + i * w.strides[1] + j * w.strides[2]];
          m += std::isfinite(x) ? x : 0.0;  // a non-finite weight (NaN input) adds nothing
        }
        a[size_t(i * T + j)] = 0.5 * m / double(H) + (i == j ? 0.5 : 0.0);
        sum += a[size_t(i * T + j)];
      }
      for (int64_t j = 0; j < T; ++j) a[size_t(i * T + j)] /= sum;  // sum >= 0.5: the identity's share
    }
    if (l == 0) {
      r = a;
    } else {  // R_l = Â_l · R_{l-1}
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j) {
          double s = 0;
          for (int64_t k = 0; k < T; ++k) s += a[size_t(i * T + k)] * r[size_t(k * T + j)];
          next[size_t(i * T + j)] = s;
        }
      r.swap(next);
    }
    Tensor t = Tensor::uninitialized({T, T});
    for (size_t k = 0; k < r.size(); ++k) t.data()[k] = float(r[k]);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace attn::viz
