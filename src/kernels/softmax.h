// The ends of the online softmax shared by the flash kernels (forward, decode over fp32 or half K/V):
// merging the (m, l, O) triples of key chunks, and the final normalisation of one output row. Internal
// to src/kernels, plain C++ (the per-element exp2 of the tiles is flash_common.h's SIMD Exp2). Scores
// are in the log2 domain: m is a max of scores·log2(e), so the LSE is m·ln2 + ln(l).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/kernels/problem.h"
#include "flash_pack.h"

namespace attn::flash {

// What a row's scores are exponentiated against: their max m, or 0 when m = -inf (fully masked so far),
// so that 2^(-inf - -inf) is not NaN (P = 0 then).
inline float ExpBase(float m) { return m == -std::numeric_limits<float>::infinity() ? 0.f : m; }

// Merge of one row over nc key chunks; chunk c's statistics at m[c·step], l[c·step] and its O at
// o[c·ostep] (n floats). m = max_c m_c; l = Σ_c 2^(m_c − m)·l_c; O = Σ_c 2^(m_c − m)·O_c, in chunk
// order, so the result does not depend on which thread computed which chunk. Writes O to out (n).
inline void MergeChunks(const float* m, const float* l, const float* o, int64_t nc, int64_t step, int64_t ostep,
                        int64_t n, float* out, float* m_out, float* l_out) {
  float mm = -std::numeric_limits<float>::infinity(), lsum = 0.f;
  for (int64_t c = 0; c < nc; ++c) mm = std::max(mm, m[c * step]);
  const float m_use = ExpBase(mm);
  std::fill(out, out + n, 0.f);
  for (int64_t c = 0; c < nc; ++c) {
    if (l[c * step] == 0.f) continue;  // no live key for this row in chunk c (its O is 0)
    const float w = std::exp2(m[c * step] - m_use);
    const float* oc = o + c * ostep;
    lsum += w * l[c * step];
    for (int64_t e = 0; e < n; ++e) out[e] += w * oc[e];
  }
  *m_out = mm, *l_out = lsum;
}

// out row (b, h, l) = o·keep_scale/lsum; LSE = m·ln2 + ln(lsum). A fully masked row (lsum = 0, m = -inf):
// out 0, LSE -inf. A NaN score leaves lsum NaN, so the row is NaN, never taken for fully masked.
inline void WriteRow(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, const float* o, float m,
                     float lsum) {
  const auto& O = p.out.out;
  float* dst = O.data + b * O.strides[0] + h * O.strides[1] + l * O.strides[2];
  const bool empty = lsum == 0.f;
  const float inv = empty ? 0.f : p.keep_scale / lsum;
  if (O.strides[3] == 1)
    for (int64_t e = 0; e < p.Dv; ++e) dst[e] = empty ? 0.f : o[e] * inv;  // vectorized
  else
    for (int64_t e = 0; e < p.Dv; ++e) dst[e * O.strides[3]] = empty ? 0.f : o[e] * inv;
  const auto& lse = p.out.lse;
  if (!lse.empty())
    lse.data[b * lse.strides[0] + h * lse.strides[1] + l * lse.strides[2]] =
        empty ? -std::numeric_limits<float>::infinity() : m * kLn2 + std::log(lsum);
}

}  // namespace attn::flash
