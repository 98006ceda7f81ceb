// attn's bf16 matrix product (gemm.h's gemm_bf16): the packed GEMM of gemm.cpp over bf16 PAIRS. Each
// 32-bit lane of a packed panel holds two bf16 of consecutive k (2p low, 2p+1 high), the operand layout
// of AVX512_BF16's VDPBF16PS, which adds both products of a pair to an fp32 lane: the odd k's first,
// then the even k's, each sum rounded to nearest even, subnormal inputs and sums flushed to zero (the
// instruction's DAZ/FTZ). Measured on a Zen 5: exactly that, 2·10^6 random pairs and the edge cases of
// tests/test_gemm_bf16.cpp. Not AMX (named by attn info where present, not used), no bf16 output.
//
//   for each K block of kc PAIRS: pack op(B) as (kc, NR) pair panels, op(A) as (kc, MR) pair panels
//   (fp32 operands rounded to bf16 on the way), then per tile the microkernel, as in gemm.cpp
//   microkernel: acc (MR, NR) = C0; per pair: acc = dp(a pair, b pairs, acc)
//
// Two microkernels share the panels: VDPBF16PS (AVX-512 targets on a CPU with AVX512_BF16), and its
// emulation everywhere else: the pair widened to two fp32 vectors (a bf16 is the high half of an fp32)
// and two FMAs, odd then even, under MXCSR's DAZ and FTZ. A product of two bf16 has at most 16
// significant bits, so it is exact in fp32 and an FMA adds it with the instruction's one rounding: the
// bits are the same on every CPU. Blocking as gemm.cpp's (gemm_blocking.h), counted in pairs; it decides
// who computes an element, never its value.
#include "attn/gemm.h"

#include <string>

#include "attn/check.h"
#include "attn/threads.h"
#include "gemm_blocking.h"
#include "pairs.h"
#include "../core/hwy_targets.h"  // ATTN_AVX512_TARGET

#ifndef ATTN_GEMM_BF16_ONCE
#define ATTN_GEMM_BF16_ONCE
namespace attn::gemm_detail {

// One bf16 product: each operand fp32 (rounded when packed) or bf16 bits.
struct Bf16Args {
  bool ta, tb;
  int64_t M, N, K;
  const void* A;
  bool a16;  // A holds bf16 bits (uint16_t), else float
  int64_t lda;
  const void* B;
  bool b16;
  int64_t ldb;
  float beta;
  float* C;
  int64_t ldc;
};

}  // namespace attn::gemm_detail
#endif  // ATTN_GEMM_BF16_ONCE

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/gemm_bf16.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "gemm_tile.h"
#include "register_block.h"  // ForBlock, DpBlock

HWY_BEFORE_NAMESPACE();
namespace attn::gemm_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using regblock::HWY_NAMESPACE::ARows;
using regblock::HWY_NAMESPACE::BRows;
using regblock::HWY_NAMESPACE::DpBlock;
using regblock::HWY_NAMESPACE::ForBlock;
using regblock::HWY_NAMESPACE::kDpTarget;
using regblock::HWY_NAMESPACE::UseDp;
using namespace attn::pairs;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocks: kMR rows x NV vectors of fp32 accumulators. AVX-512 (32 registers): 6 x 4 with
// VDPBF16PS (24 accumulators, 4 B vectors), 6 x 3 emulated (each B vector widens to two). The
// 16-register targets, emulated: 4 x 2 (8 accumulators, 4 widened B vectors, 2 A values).
#if ATTN_AVX512_TARGET(HWY_TARGET)
constexpr int kMR = 6, kNVDp = 4, kNVEmu = 3;
#else
constexpr int kMR = 4, kNVDp = 1, kNVEmu = 2;
#endif

// Pair words from one packed A panel to the next: kc·kMR plus one cache line (gemm.cpp's PanelStride).
inline int64_t PanelStride(int64_t kc) { return kc * kMR + 16; }

// op(B) pairs [q0, q0 + kc) x columns [j0, j0 + nr) -> (kc, nr) words (2p low, 2p+1 high); columns past
// N and a k past K are 0.
template <typename S>
void PackB(const Bf16Args& g, int64_t j0, int64_t q0, int64_t kc, int64_t nr, uint32_t* HWY_RESTRICT dst) {
  const S* B = static_cast<const S*>(g.B);
  const int64_t cols = std::min(nr, g.N - j0), k0 = 2 * q0;
  if (g.tb) {  // op(B)(k, j) = B[j·ldb + k]: row j of B holds column j's pairs; 16 pairs at a time, so
               // the writes stay in 16 rows of the panel, in L1
    uint32_t words[kRun / 2];
    for (int64_t p0 = 0; p0 < kc; p0 += kRun / 2) {
      const int64_t pn = std::min(kRun / 2, kc - p0);
      for (int64_t j = 0; j < cols; ++j) {
        PairsAlongRow(B + (j0 + j) * g.ldb + k0 + 2 * p0, pn, g.K - k0 - 2 * p0, words);
        for (int64_t p = 0; p < pn; ++p) dst[(p0 + p) * nr + j] = words[p];
      }
    }
  } else {  // op(B)(k, j) = B[k·ldb + j]: a pair interleaves rows k and k + 1 of B
    for (int64_t p = 0; p < kc; ++p) {
      const int64_t k = k0 + 2 * p;
      const S* lo = B + k * g.ldb + j0;
      PairsAcrossRows(lo, k + 1 < g.K ? lo + g.ldb : nullptr, cols, dst + p * nr);
    }
  }
  for (int64_t p = 0; p < kc; ++p)
    for (int64_t j = cols; j < nr; ++j) dst[p * nr + j] = 0;
}

// Panels of op(A) pairs [q0, q0 + kc): panel p is rows [p·kMR, p·kMR + kMR) as (kc, kMR) words at
// dst + p·PanelStride(kc); rows past M and a k past K are 0. Not transposed: panels [b, e), each row's
// pairs converted along it. Transposed: pairs [b, e) of every panel (rows 2q, 2q + 1 of A, read once,
// start to end, as gemm.cpp's PackA).
template <typename S>
void PackA(const Bf16Args& g, int64_t b, int64_t e, int64_t q0, int64_t kc, uint32_t* HWY_RESTRICT dst) {
  const S* A = static_cast<const S*>(g.A);
  const int64_t ps = PanelStride(kc), k0 = 2 * q0, mp = ceil_div(g.M, kMR);
  if (g.ta) {  // op(A)(i, k) = A[k·lda + i]
    constexpr int64_t kRows = kRun / kMR * kMR;  // rows of A converted at a time: whole panels
    uint32_t words[kRows];
    for (int64_t q = b; q < e; ++q) {
      const int64_t k = k0 + 2 * q;
      const S* lo = A + k * g.lda;
      for (int64_t i0 = 0; i0 < mp * kMR; i0 += kRows) {
        const int64_t m = std::min(kRows, mp * kMR - i0), valid = std::min(m, g.M - i0);
        PairsAcrossRows(lo + i0, k + 1 < g.K ? lo + g.lda + i0 : nullptr, valid, words);
        std::fill(words + valid, words + m, 0u);  // rows past M
        uint32_t* d = dst + i0 / kMR * ps + q * kMR;
        for (int64_t p = 0; p < m / kMR; ++p)
#pragma GCC unroll 8
          for (int r = 0; r < kMR; ++r) d[p * ps + r] = words[p * kMR + r];
      }
    }
    return;
  }
  uint32_t words[kRun / 2];
  for (int64_t p = b; p < e; ++p) {  // op(A)(i, k) = A[i·lda + k]
    uint32_t* d = dst + p * ps;
    const int64_t rows = std::min<int64_t>(kMR, g.M - p * kMR);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t q0r = 0; q0r < kc; q0r += kRun / 2) {
        const int64_t qn = std::min(kRun / 2, kc - q0r);
        PairsAlongRow(A + (p * kMR + r) * g.lda + k0 + 2 * q0r, qn, g.K - k0 - 2 * q0r, words);
        for (int64_t q = 0; q < qn; ++q) d[(q0r + q) * kMR + r] = words[q];
      }
    for (int64_t r = rows; r < kMR; ++r)
      for (int64_t q = 0; q < kc; ++q) d[q * kMR + r] = 0;
  }
}

// C (kMR, NV·N) = C0 + A (kMR, kc pairs) · Bp (kc pairs, NV·N), C0 per `start`: a whole block of C, read
// and written by full vectors (edges: EdgeThroughCopy). ap: the packed A panel (word (q, r) at q·kMR + r),
// bp: word (q, j) at q·ldbp + j. Each accumulator is one chain over the pairs in order, odd k then even
// k, whichever microkernel runs.
template <int NV, bool kDp>
HWY_NOINLINE void Micro(const uint32_t* HWY_RESTRICT ap, const uint32_t* HWY_RESTRICT bp, int64_t ldbp, int64_t kc,
                        float* HWY_RESTRICT c, int64_t ldc, Start start, float beta) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  VF acc[kMR][NV];
  ForBlock<kMR, NV>([&](int r, int j) {
    acc[r][j] = start == Start::zero ? hn::Zero(df) : hn::LoadU(df, c + r * ldc + j * N);
    if (start == Start::scaled) acc[r][j] = hn::Mul(hn::Set(df, beta), acc[r][j]);
  });
  DpBlock<kDp, kMR, NV>(df, acc, ARows<uint32_t>{ap, 1, kMR}, kMR, BRows<uint32_t>{bp, ldbp, N}, kc);
  ForBlock<kMR, NV>([&](int r, int j) { hn::StoreU(acc[r][j], df, c + r * ldc + j * N); });
}

// The narrowest instance that covers nr columns; an edge block (mr < kMR or a partial last vector)
// through a copy of its part of C.
template <bool kDp, int NV>
HWY_INLINE void MicroCols(int64_t nr, const uint32_t* ap, const uint32_t* bp, int64_t ldbp, int64_t kc, float* c,
                          int64_t ldc, int64_t mr, Start start, float beta) {
  const int64_t w = NV * static_cast<int64_t>(hn::Lanes(DF()));
  if constexpr (NV > 1)
    if (nr <= w - static_cast<int64_t>(hn::Lanes(DF())))
      return MicroCols<kDp, NV - 1>(nr, ap, bp, ldbp, kc, c, ldc, mr, start, beta);
  if (mr == kMR && nr == w) return Micro<NV, kDp>(ap, bp, ldbp, kc, c, ldc, start, beta);
  EdgeThroughCopy<float, kMR * NV * hn::MaxLanes(DF())>(c, ldc, mr, nr, kMR, w, start, [&](float* tile, int64_t ldt) {
    Micro<NV, kDp>(ap, bp, ldbp, kc, tile, ldt, start, beta);
  });
}


void GemmBf16(const Bf16Args& g) {
  const bool dp = UseDp();
  const int64_t M = g.M, N = g.N, K2 = ceil_div(g.K, 2);  // K2: pairs
  const int64_t nr = (dp ? kNVDp : kNVEmu) * static_cast<int64_t>(hn::Lanes(DF()));
  const Blocking bl = blocking(M, N, K2, kMR, nr, sizeof(uint32_t), nullptr);
  const int64_t mp = ceil_div(M, kMR), np = ceil_div(N, nr);  // panels of A and of B
  auto* ap = static_cast<uint32_t*>(scratch(0, static_cast<size_t>(mp * PanelStride(bl.kc)) * 4));  // (mp, kc, kMR)
  auto* bp = static_cast<uint32_t*>(scratch(1, static_cast<size_t>(np * nr * bl.kc) * 4));          // (np, kc, nr)
  const auto pack_a = g.a16 ? PackA<uint16_t> : PackA<float>;
  const auto pack_b = g.b16 ? PackB<uint16_t> : PackB<float>;
  const int64_t tm = ceil_div(M, bl.mc), tn = ceil_div(N, bl.nt);
  for (int64_t q0 = 0; q0 < K2; q0 += bl.kc) {
    const int64_t kc = std::min(bl.kc, K2 - q0);
    const Start start = q0 > 0 || g.beta == 1.f ? Start::c : g.beta == 0.f ? Start::zero : Start::scaled;
    parallel_for(np, grain_for(kc * nr), [&](int64_t b, int64_t e, int) {
      for (int64_t p = b; p < e; ++p) pack_b(g, p * nr, q0, kc, nr, bp + p * nr * kc);
    });
    if (g.ta)  // chunks of pairs: rows of A (see PackA)
      parallel_for(kc, grain_for(2 * M), [&](int64_t b, int64_t e, int) { pack_a(g, b, e, q0, kc, ap); });
    else
      parallel_for(mp, grain_for(kc * kMR), [&](int64_t b, int64_t e, int) { pack_a(g, b, e, q0, kc, ap); });
    const int64_t tile_cost = std::min(M, bl.mc) * std::min(N, bl.nt) * kc * 2;
    parallel_for(tm * tn, grain_for(tile_cost), [&](int64_t t0, int64_t t1, int) {
      const FlushSubnormals flush(!dp);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t i0 = (t % tm) * bl.mc, j0 = (t / tm) * bl.nt;  // tiles sharing B panels run together
        const int64_t i1 = std::min(M, i0 + bl.mc), j1 = std::min(N, j0 + bl.nt);
        for (int64_t i = i0; i < i1; i += kMR)
          for (int64_t j = j0; j < j1; j += nr) {
            const uint32_t* a = ap + i / kMR * PanelStride(kc);
            const int64_t cols = std::min(nr, j1 - j), rows = std::min<int64_t>(kMR, i1 - i);
            float* c = g.C + i * g.ldc + j;
            if constexpr (kDpTarget)
              if (dp) {
                MicroCols<true, kNVDp>(cols, a, bp + j * kc, nr, kc, c, g.ldc, rows, start, g.beta);
                continue;
              }
            MicroCols<false, kNVEmu>(cols, a, bp + j * kc, nr, kc, c, g.ldc, rows, start, g.beta);
          }
      }
    });
  }
}

// "VDPBF16PS, AVX3 6x64" or "emulated with FMA (no AVX512_BF16), AVX2 4x16".
std::string DescribeBf16() {
  const bool dp = UseDp();
  const int64_t nr = (dp ? kNVDp : kNVEmu) * static_cast<int64_t>(hn::Lanes(DF()));
  return std::string(dp ? "VDPBF16PS, " : "emulated with FMA (no AVX512_BF16), ") + hwy::TargetName(HWY_TARGET) +
         " " + std::to_string(kMR) + "x" + std::to_string(nr);
}

}  // namespace attn::gemm_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace gemm_detail {
HWY_EXPORT(GemmBf16);
HWY_EXPORT(DescribeBf16);
HWY_EXPORT(UseDp);

void run_bf16(const Bf16Args& g) {
  if (g.M <= 0 || g.N <= 0) return;
  if (g.K <= 0) return scale_c(g.M, g.N, g.beta, g.C, g.ldc);
  HWY_DYNAMIC_DISPATCH(GemmBf16)(g);
}
}  // namespace gemm_detail

std::string gemm_bf16_kernel() { return HWY_DYNAMIC_DISPATCH(gemm_detail::DescribeBf16)(); }

void check_bf16_native() {
  ATTN_CHECK(HWY_DYNAMIC_DISPATCH(gemm_detail::UseDp)(), "Expected a CPU with AVX512_BF16 for bf16 under --strict, ",
             "but got ", gemm_bf16_kernel(), " instead");
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B,
               int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_detail::run_bf16({ta, tb, M, N, K, A, true, lda, B, true, ldb, beta, C, ldc});
}
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_detail::run_bf16({ta, tb, M, N, K, A, false, lda, B, false, ldb, beta, C, ldc});
}
void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B,
               int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_detail::run_bf16({ta, tb, M, N, K, A, false, lda, B, true, ldb, beta, C, ldc});
}

}  // namespace attn
#endif  // HWY_ONCE
