// The masks of the flash kernels, forward and backward: one row of the log2-domain score tile gets
// log2(e)·(attn_mask + key_padding) and -inf outside the row's keys (causal, window, documents). Internal
// to src/kernels; the semantics (which keys a query sees, what a mask adds) are SdpaProblem's
// (attn/kernels/problem.h) and are only called here, never restated. Not SIMD and not the causal tile
// skipping (that is each kernel's loop structure), and not the score modifications (score_mod.h).
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

// The keys of [s0, s0 + n) that query (b, l) sees, as offsets from s0: [begin, end) within [0, n).
inline Range VisibleKeys(const SdpaProblem<float>& p, int64_t b, int64_t l, int64_t s0, int64_t n) {
  const Range r = p.keys(b, l);
  const int64_t begin = std::clamp<int64_t>(r.begin - s0, 0, n);
  return {begin, std::clamp<int64_t>(r.end - s0, begin, n)};
}

// The mask part of score row (b, h, l) over keys [s0, s0 + n), written (not added) to row[0, npad):
// log2(e)·bias on the keys the query sees, -inf elsewhere and on [n, npad) (panel padding). Returns
// whether any entry is not -inf (a fully masked row costs no GEMM).
inline bool FillMaskRow(const SdpaProblem<float>& p, int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n,
                        int64_t npad, float* row) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const Range r = VisibleKeys(p, b, l, s0, n);
  std::fill(row, row + r.begin, -kInf);
  std::fill(row + r.begin, row + r.end, 0.f);
  std::fill(row + r.end, row + npad, -kInf);
  AddMaskRow(p, b, h, l, s0 + r.begin, r.end - r.begin, row + r.begin, 1);
  bool any = false;
  for (int64_t j = r.begin; j < r.end; ++j) any |= row[j] != -kInf;
  return any;
}

// Only the edges, no masks: row[j] = -inf outside the keys query (b, l) sees and on [n, npad). Costs the
// edges, not the row.
inline void MaskEdgeRow(const SdpaProblem<float>& p, int64_t b, int64_t l, int64_t s0, int64_t n, int64_t npad,
                        float* row) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const Range r = VisibleKeys(p, b, l, s0, n);
  std::fill(row, row + r.begin, -kInf);
  std::fill(row + r.end, row + npad, -kInf);
}

// The transposed form, for the backward: key (b, s) (one row of a (keys, queries) tile) over queries
// [l0, l0 + w); the queries that see it, as offsets from l0: [begin, end) within [0, w).
inline Range SeeingQueries(const SdpaProblem<float>& p, int64_t b, int64_t s, int64_t l0, int64_t w) {
  const Range r = p.queries(b, s);
  const int64_t begin = std::clamp<int64_t>(r.begin - l0, 0, w);
  return {begin, std::clamp<int64_t>(r.end - l0, begin, w)};
}

}  // namespace attn::flash
