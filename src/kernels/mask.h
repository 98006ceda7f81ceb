// The masks of the flash kernels, forward and backward: one row of the log2-domain score tile gets
// log2(e)·(attn_mask + key_padding) and -inf past the row's causal edge. Internal to src/kernels; the
// semantics (which keys a query sees, what a mask adds) are SdpaProblem's (attn/kernels/problem.h) and
// are only called here, never restated. Not SIMD and not the causal tile skipping (that is each
// kernel's loop structure).
//
// A row is (b, h, l) over keys [s0, s0 + n), element j at row[j·stride]: stride 1 for the forward's
// (queries, keys) tiles, the tile width for the backward's transposed (keys, queries) tiles.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "attn/kernels/problem.h"
#include "flash_pack.h"

namespace attn::flash {

// Scores live in the log2 domain (exp(x) = 2^(x·log2 e)), so the masks are scaled by log2(e).
// row[j·stride] += log2(e)·bias(b, h, l, s0 + j), -inf where a bool mask masks.
inline void AddMaskRow(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n,
                       float* row, int64_t stride) {
  p.add_bias_row(b, h, l, s0, n, kLog2e, row, stride);
}

// The number of keys of [s0, s0 + n) that query l sees: keys [s0, s0 + VisibleKeys) are before its causal edge.
inline int64_t VisibleKeys(const SdpaProblem<float>& p, int64_t l, int64_t s0, int64_t n) {
  return std::clamp<int64_t>(p.key_end(l) - s0, 0, n);
}

// The mask part of score row (b, h, l) over keys [s0, s0 + n), written (not added) to row[0, npad):
// log2(e)·bias before the causal edge, -inf from it on and on [n, npad) (panel padding). Returns whether
// any entry is not -inf (a fully masked row costs no GEMM).
inline bool FillMaskRow(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n,
                        int64_t npad, float* row) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t end = VisibleKeys(p, l, s0, n);
  std::fill(row, row + end, 0.f);
  std::fill(row + end, row + npad, -kInf);
  AddMaskRow(p, b, h, l, s0, end, row, 1);
  bool any = false;
  for (int64_t j = 0; j < end; ++j) any |= row[j] != -kInf;
  return any;
}

// Only the causal edge, no masks: row[j] = -inf for j in [VisibleKeys, npad). Costs the triangle, not the tile.
inline void MaskEdgeRow(const SdpaProblem<float>& p, int64_t l, int64_t s0, int64_t n, int64_t npad, float* row) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::fill(row + VisibleKeys(p, l, s0, n), row + npad, -kInf);
}

// The transposed form, for the backward: key s0 + s (one row of a (keys, queries) tile) over queries
// [l0, l0 + w); queries before query_begin(s) do not see the key: x[0, HiddenQueries) = -inf.
inline int64_t HiddenQueries(const SdpaProblem<float>& p, int64_t s, int64_t l0, int64_t w) {
  return std::clamp<int64_t>(p.query_begin(s) - l0, 0, w);
}

}  // namespace attn::flash
