// attn's bf16 matrix product (gemm.h's gemm_bf16): the packed GEMM of gemm.cpp over bf16 PAIRS (a 32-bit
// word holds two bf16 of consecutive k, 2q low, 2q+1 high), in the arithmetic of AMX's TDPBF16PS as
// measured on an Intel Xeon (docs/kernels.md): k runs in GROUPS of 16 pairs (32 k, the last group
// zero-padded); per group and element of C, two fp32 chains from +0, E over the even k's products and O
// over the odd k's, each add rounded to nearest even, then C = C + (E + O); subnormal inputs and sums
// flushed to zero. A product of two bf16 has at most 16 significant bits, so it is exact in fp32.
//
//   for each K block of kc PAIRS (a multiple of 16): pack op(B) as (kc, NR) pair panels, op(A) as
//   panels of MR rows (fp32 operands rounded to bf16 on the way), then per tile the microkernel
//
// Three microkernels, one answer:
// - AMX (a CPU with AMX-BF16 whose OS grants the tiles): 32x32 blocks of C in four tiles, one TDPBF16PS
//   per 16x16 tile and group; A panels of 32 rows and B panels of 16 columns laid out group by group,
//   so that each operand tile is 1 KB in one piece; K blocks sized for L2 (AmxBlocking).
// - VDPBF16PS (AVX512_BF16), which adds a word's high product, then its low one: the panels' rows 2s
//   and 2s+1 hold (k of pair 2s, k of pair 2s+1) words of the even k's and of the odd k's (pairs.h's
//   ChainRows; every panel is made so directly, a transposed B's by reordering each column's group before
//   its transpose (Chained)),
//   so one VDPBF16PS is two steps of one chain and a group is 8 on E, 8 on O.
// - Its emulation everywhere else: fp32 panels (a bf16 is the high half of an fp32), op(A)'s packed
//   straight (PackAWide), B's pair panels widened (Widen), then attn's fp32 microkernel (register_block.h
//   FmaBlock) over the even k's rows for E and the odd k's for O, under MXCSR's DAZ/FTZ: each product
//   exact, each FMA rounded once, as the instruction.
// Blocking as gemm.cpp's (gemm_blocking.h), counted in pairs; it decides who computes an element, never
// its value (C carries the chain from one K block to the next). A bf16 C: the fp32 result rounded once, block
// by block as the last K block ends (the fp32 sums of earlier K blocks in scratch; none for a single K block).
// op(B) may come packed once (PackedB16: a bf16 encoder's weights), its panels read instead of made.
#include "attn/gemm.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/check.h"
#include "attn/threads.h"
#include "amx.h"
#include "gemm_args.h"
#include "gemm_blocking.h"
#include "pairs.h"
#include "../core/hwy_targets.h"  // ATTN_AVX512_TARGET

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/gemm_bf16.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "gemm_tile.h"
#include "register_block.h"  // ForBlock, DpBlock
#include "transpose16.h"

HWY_BEFORE_NAMESPACE();
namespace attn::gemm_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using regblock::HWY_NAMESPACE::ARows;
using regblock::HWY_NAMESPACE::BRows;
using regblock::HWY_NAMESPACE::GroupBlock;
constexpr int64_t kGroup = regblock::HWY_NAMESPACE::kGroupPairs;  // pairs per group: one TDPBF16PS's K, full tiles
using regblock::HWY_NAMESPACE::kPairWidth;
using regblock::HWY_NAMESPACE::DU;
using regblock::HWY_NAMESPACE::LoadU;
using regblock::HWY_NAMESPACE::StoreBf16;
using regblock::HWY_NAMESPACE::kDpTarget;
using regblock::HWY_NAMESPACE::LoadFirst;
using regblock::HWY_NAMESPACE::PairAcross;
using regblock::HWY_NAMESPACE::PairWords;
using regblock::HWY_NAMESPACE::UseDp;
using namespace attn::pairs;
#if ATTN_AVX512_TARGET(HWY_TARGET)
using transpose::HWY_NAMESPACE::Transpose16;
#endif

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocks: kMR rows x NV vectors of C, two fp32 accumulators each (E and O). VDPBF16PS (AVX-512,
// 32 registers): 6 x 2, E and O together (24 accumulators). Emulated: the fp32 GEMM's block (6 x 4 on
// AVX-512, 6 x 2 on the 16-register targets), E, then O (E waits on the stack). AMX: 32 x 32 in four
// 16 x 16 tiles.
constexpr int kMR = regblock::HWY_NAMESPACE::kMR, kNVDp = 2, kNVEmu = regblock::HWY_NAMESPACE::kNV;
constexpr int64_t kAmx = 32;  // AMX block: rows of an A panel and columns of a B panel

enum class Kernel { amx, dp, emu };

// Rows of an A panel, and columns of a block of C and of a packed B panel (AMX: a block's two B tiles
// are two 16-column panels, each tile 1 KB in one piece), for a kernel.
inline int64_t PanelRows(Kernel k) { return k == Kernel::amx ? kAmx : kMR; }
inline int64_t BlockCols(Kernel k) {
  return k == Kernel::amx ? kAmx : (k == Kernel::dp ? kNVDp : kNVEmu) * static_cast<int64_t>(hn::Lanes(DF()));
}
inline int64_t PanelCols(Kernel k) { return k == Kernel::amx ? kAmx / 2 : BlockCols(k); }
// Word (q, r) of an A panel of `rows` rows: group by group (16 pairs); in a group the pairs of each row
// in a row for AMX (an A tile: 16 rows of 64 bytes, 1 KB in one piece), row by row of pairs otherwise.
inline int64_t AWord(Kernel k, int64_t rows, int64_t q, int64_t r) {
  return (q / kGroup) * kGroup * rows + (k == Kernel::amx ? r * kGroup + q % kGroup : q % kGroup * rows + r);
}
// Pair words from one packed A panel to the next: kc·rows plus one cache line (gemm.cpp's PanelStride).
inline int64_t PanelStride(int64_t kc, int64_t rows) { return kc * rows + 16; }

// The fp32 of a 32-bit pattern: a bf16 is the high half of its fp32.
inline float AsFloat(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Pair rows [b, e) of a packed panel (w words a row) as the emulation's fp32 rows 2q (k = 2q, a word's low
// half) and 2q + 1 (its high half) of `out`.
inline void Widen(const uint32_t* HWY_RESTRICT words, int64_t b, int64_t e, int64_t w, float* HWY_RESTRICT out) {
  for (int64_t q = b; q < e; ++q)
    for (int64_t j = 0; j < w; ++j) {
      const uint32_t x = words[q * w + j];
      out[2 * q * w + j] = AsFloat(x << 16);
      out[(2 * q + 1) * w + j] = AsFloat(x & 0xFFFF0000u);
    }
}

// The rows along k whose bf16 are pair word q's low and high halves, k the word's first: k and k + 1, or
// where `chains`, VDPBF16PS's chain words made directly (as ChainRows makes them from a panel's pair rows
// 2s and 2s + 1): k + 2 and k for an even q, k + 1 and k - 1 for an odd one.
inline std::array<int64_t, 2> HalvesOf(int64_t k, int64_t q, bool chains) {
  return chains ? std::array<int64_t, 2>{k + 2 - q % 2, k - q % 2} : std::array<int64_t, 2>{k, k + 1};
}

// PairAcross of the first n elements of rows lo and hi, where either may be null: a row of zeros.
template <typename S>
HWY_INLINE hn::Vec<DU> PairOf(const S* HWY_RESTRICT lo, const S* HWY_RESTRICT hi, size_t n) {
  if (lo) return PairAcross(lo, hi, n);
  return hi ? hn::ShiftLeft<16>(PairAcross(hi, nullptr, n)) : hn::Zero(DU());
}

// words[j] = the pair of lo[j] and hi[j] (PairOf) for j < valid, 0 for valid <= j < n; n <= kRun, words kRun
// long.
template <typename S>
void AcrossRows(const S* HWY_RESTRICT lo, const S* HWY_RESTRICT hi, int64_t valid, int64_t n,
                uint32_t* HWY_RESTRICT words) {
  const int64_t lanes = hn::Lanes(DU());
  for (int64_t j = 0; j < n; j += lanes) {  // kRun is a multiple of the lanes: the last store stays in words
    const size_t v = static_cast<size_t>(std::clamp<int64_t>(valid - j, 0, lanes));
    hn::StoreU(PairOf(lo ? lo + j : nullptr, hi ? hi + j : nullptr, v), DU(), words + j);
  }
}

// The 16 pair words of one group of a row along k, x[0, 32) of which the first `valid` (any count) count
// and the rest are 0: word q = bf16(x[2q]) | bf16(x[2q + 1]) << 16.
HWY_INLINE void GroupWords(const float* HWY_RESTRICT x, int64_t valid, uint32_t* HWY_RESTRICT out) {
  const DF df;
  const int64_t lanes = hn::Lanes(df);
  for (int64_t w = 0; w < kGroup; w += lanes) {  // words [w, w + lanes): elements [2w, 2w + 2·lanes)
    const auto part = [&](int64_t at) {
      return LoadFirst(df, x + at, static_cast<size_t>(std::clamp<int64_t>(valid - at, 0, lanes)));
    };
    hn::StoreU(PairWords(part(2 * w), part(2 * w + lanes)), DU(), out + w);
  }
}
HWY_INLINE void GroupWords(const uint16_t* HWY_RESTRICT x, int64_t valid, uint32_t* HWY_RESTRICT out) {
  const int64_t n = std::clamp<int64_t>(valid, 0, 2 * kGroup);  // bf16 pairs are the words, little-endian
  if (n == 2 * kGroup) return (void)std::memcpy(out, x, 4 * kGroup);  // a constant size: inlined (a call per
                                                                      // group was a fifth of 4096x128x512 NT)
  std::memcpy(out, x, static_cast<size_t>(n) * 2);
  std::memset(reinterpret_cast<uint16_t*>(out) + n, 0, static_cast<size_t>(2 * kGroup - n) * 2);
}

#if ATTN_AVX512_TARGET(HWY_TARGET)
// A group's 16 pair words along k (of a row of A or a column of B) as chain words, as ChainRows makes them from
// pair rows: the halves h0 h1 of word 2s and h2 h3 of word 2s + 1 -> h2 h0 and h3 h1 (word 2s = h0 high, h2 low).
HWY_INLINE hn::Vec<DU> Chained(hn::Vec<DU> words) {
  const hn::Repartition<uint8_t, DU> d8;
  alignas(16) static constexpr uint8_t kChain[16] = {4, 5, 0, 1, 6, 7, 2, 3, 12, 13, 8, 9, 14, 15, 10, 11};
  return hn::BitCast(DU(), hn::TableLookupBytes(hn::BitCast(d8, words), hn::LoadDup128(d8, kChain)));
}
#endif

// The np B panels of op(B) pairs [q0, q0 + kc), panel p columns [p·nr, (p + 1)·nr) as (kc, nr) words at
// dst + p·kc·nr; columns past N and a k past K are 0; chain words (ChainRows) where `chains`. Transposed:
// panels [b, e), each column's pairs converted along a row of B. Not transposed: pairs [b, e) of every
// panel (rows 2q, 2q + 1 of B, read once, start to end, as PackA's transposed A; b and e even where chain
// words are made). Each reads B in runs along its rows: panel by panel, a pair row would be nr elements
// of a row, a page apart from the next.
template <typename S>
void PackB(const Bf16Args& g, int64_t np, int64_t b, int64_t e, int64_t q0, int64_t kc, int64_t nr, bool chains,
           uint32_t* HWY_RESTRICT dst) {
  const S* B = static_cast<const S*>(g.B);
  const int64_t k0 = 2 * q0, ps = kc * nr;  // ps: words from one panel to the next
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if (g.tb) {  // 16 columns by a group of pairs at a time, transposed in registers into 16 pair rows (the words
               // stored one by one, nr apart, were most of PackB)
    HWY_ALIGN uint32_t block[16 * kGroup];  // column c of the 16: its group of pair words at block[c·16]
    for (int64_t p = b; p < e; ++p)
      for (int64_t c0 = 0; c0 < nr; c0 += 16)
        for (int64_t q = 0; q < kc; q += kGroup) {
          for (int64_t c = 0; c < 16; ++c) {
            const int64_t j = p * nr + c0 + c, k = k0 + 2 * q;
            if (j < g.N) GroupWords(B + j * g.ldb + k, g.K - k, block + c * 16);
            else std::fill(block + c * 16, block + c * 16 + 16, 0u);  // columns past N
            if (chains) hn::Store(Chained(hn::Load(DU(), block + c * 16)), DU(), block + c * 16);
          }
          Transpose16(reinterpret_cast<const float*>(block), 16, 16, 16, 1.f,
                      reinterpret_cast<float*>(dst + p * ps + q * nr + c0), nr);
        }
    return;
  }
#endif
  if (g.tb) {  // op(B)(k, j) = B[j·ldb + k]: row j of B holds column j's pairs
    uint32_t words[kRun / 2];
    for (int64_t j = b * nr; j < e * nr; ++j) {
      uint32_t* d = dst + j / nr * ps + j % nr;
      if (j >= g.N) {  // columns past N
        for (int64_t q = 0; q < kc; ++q) d[q * nr] = 0;
        continue;
      }
      for (int64_t q1 = 0; q1 < kc; q1 += kRun / 2) {
        const int64_t qn = std::min(kRun / 2, kc - q1);
        PairsAlongRow(B + j * g.ldb + k0 + 2 * q1, qn, g.K - k0 - 2 * q1, words);
        for (int64_t q = 0; q < qn; ++q) d[(q1 + q) * nr] = words[q];
      }
    }
    return;  // no chain words here: VDPBF16PS runs on AVX-512 targets only
  }
  const int64_t lanes = hn::Lanes(DU()), n = np * nr;  // op(B)(k, j) = B[k·ldb + j]: a pair interleaves
  for (int64_t q = b; q < e; ++q) {                      // two rows of B (HalvesOf), made in registers
    const auto [klo, khi] = HalvesOf(k0 + 2 * q, q, chains);
    const S* lo = klo < g.K ? B + klo * g.ldb : nullptr;  // a row past K packs zeros
    const S* hi = khi < g.K ? B + khi * g.ldb : nullptr;
    for (int64_t j = 0; j < n; j += lanes) {  // nr is a multiple of the lanes
      const size_t valid = static_cast<size_t>(std::clamp<int64_t>(g.N - j, 0, lanes));
      hn::StoreU(PairOf(lo ? lo + j : nullptr, hi ? hi + j : nullptr, valid), DU(),
                 dst + j / nr * ps + q * nr + j % nr);
    }
  }
}

#if ATTN_AVX512_TARGET(HWY_TARGET)
// A VDPBF16PS panel (kMR rows, kc pairs, kc whole groups) of `valid` rows of A where k runs along them (row r
// at a + r·lda, `kvalid` k's, then zeros), a group at a time in registers: each row's 16 pair words
// (GroupWords) made chain words (Chained),
// then the rows interleaved so that word (q, r) lands at q·kMR + r (AWord). Written word by word and chained
// after, this packing was 30% of 768x128x512 NN on a Zen 4.
template <typename S>
void ChainPanel(const S* HWY_RESTRICT a, int64_t lda, int64_t valid, int64_t kvalid, int64_t kc,
                uint32_t* HWY_RESTRICT d) {
  static_assert(kMR == 6 && kGroup == 16, "three interleaved row pairs of one 16-lane group");
  const DU du;
  const hn::Repartition<uint64_t, DU> d64;
  const hn::Rebind<uint32_t, decltype(d64)> dh;  // half a group: 8 words
  HWY_ALIGN uint32_t w[kMR][kGroup] = {};  // rows past `valid` stay 0
  for (int64_t q = 0; q < kc; q += kGroup) {
    hn::Vec<DU> v[kMR];
    for (int r = 0; r < kMR; ++r) {
      if (r < valid) GroupWords(a + r * lda + 2 * q, kvalid - 2 * q, w[r]);
      v[r] = Chained(hn::Load(du, w[r]));
    }
    // (row r, row r + 1) of each word as one 64-bit lane; three such lanes in turn are one q's kMR words
    const auto two = [&](int r, bool upper) {
      const auto lo = upper ? hn::UpperHalf(dh, v[r]) : hn::LowerHalf(dh, v[r]);
      const auto hi = upper ? hn::UpperHalf(dh, v[r + 1]) : hn::LowerHalf(dh, v[r + 1]);
      return hn::Or(hn::PromoteTo(d64, lo), hn::ShiftLeft<32>(hn::PromoteTo(d64, hi)));
    };
    for (int h = 0; h < 2; ++h)
      hn::StoreInterleaved3(two(0, h), two(2, h), two(4, h), d64,
                            reinterpret_cast<uint64_t*>(d + (q + h * kGroup / 2) * kMR));
  }
}
#endif

// Panels of op(A) pairs [q0, q0 + kc), `rows` rows each, at dst + p·PanelStride(kc, rows); rows past M and
// a k past K are 0. Word (q, r) of a panel at AWord (chain words for VDPBF16PS). Not
// transposed: panels [b, e), each row's pairs converted along it. Transposed: pairs [b, e) of every panel
// (rows 2q, 2q + 1 of A, read once, start to end, as gemm.cpp's PackA; b and e even where chain words are
// made, whole groups for AMX, whose tiles are made 16 x 16 words at a time in registers and transposed).
template <typename S>
void PackA(const Bf16Args& g, Kernel kernel, int64_t b, int64_t e, int64_t q0, int64_t kc,
           uint32_t* HWY_RESTRICT dst) {
  const S* A = static_cast<const S*>(g.A);
  const int64_t rows = PanelRows(kernel), ps = PanelStride(kc, rows), k0 = 2 * q0, mp = ceil_div(g.M, rows);
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if (g.ta && kernel == Kernel::amx) {  // words scattered one by one, 16 apart, were 3/4 of 512x128x4096 TN
    HWY_ALIGN uint32_t block[16 * kGroup];  // pair t of the group, rows i..i+15 of A: block[t·16 + lane]
    for (int64_t q = b; q < e; q += kGroup)
      for (int64_t i = 0; i < mp * rows; i += 16) {
        const size_t valid = static_cast<size_t>(std::clamp<int64_t>(g.M - i, 0, 16));
        for (int64_t t = 0; t < kGroup; ++t) {
          const int64_t k = k0 + 2 * (q + t);
          const S* lo = A + std::min(k, g.K - 1) * g.lda + std::min(i, g.M - 1);  // never past A
          hn::StoreU(k < g.K && valid ? PairAcross(lo, k + 1 < g.K ? lo + g.lda : nullptr, valid) : hn::Zero(DU()),
                     DU(), block + t * 16);
        }
        Transpose16(reinterpret_cast<const float*>(block), 16, 16, 16, 1.f,
                    reinterpret_cast<float*>(dst + i / rows * ps + AWord(kernel, rows, q, i % rows)));
      }
    return;
  }
#endif
  if (g.ta) {  // op(A)(i, k) = A[k·lda + i]
    const int64_t kRows = kRun / rows * rows;  // rows of A converted at a time: whole panels
    uint32_t words[kRun];
    for (int64_t q = b; q < e; ++q) {
      const auto [klo, khi] = HalvesOf(k0 + 2 * q, q, kernel == Kernel::dp);  // a row past K packs zeros
      const auto row = [&](int64_t kr, int64_t i0) { return kr < g.K ? A + kr * g.lda + i0 : nullptr; };
      for (int64_t i0 = 0; i0 < mp * rows; i0 += kRows) {
        const int64_t m = std::min(kRows, mp * rows - i0), valid = std::min(m, g.M - i0);
        AcrossRows(row(klo, i0), row(khi, i0), valid, m, words);
        uint32_t* d = dst + i0 / rows * ps;
        for (int64_t p = 0; p < m / rows; ++p)
          for (int64_t r = 0; r < rows; ++r) d[p * ps + AWord(kernel, rows, q, r)] = words[p * rows + r];
      }
    }
    return;
  }
  for (int64_t p = b; p < e; ++p) {  // op(A)(i, k) = A[i·lda + k]
    uint32_t* d = dst + p * ps;
    const int64_t valid = std::min<int64_t>(rows, g.M - p * rows);
#if ATTN_AVX512_TARGET(HWY_TARGET)
    if (kernel == Kernel::dp) {
      ChainPanel(A + p * rows * g.lda + k0, g.lda, valid, g.K - k0, kc, d);
      continue;
    }
#endif
    for (int64_t r = 0; r < valid; ++r)  // AMX: a group's pairs of a row lie together, made in registers
      for (int64_t q = 0; q < kc; q += kGroup)
        GroupWords(A + (p * rows + r) * g.lda + k0 + 2 * q, g.K - k0 - 2 * q, d + AWord(kernel, rows, q, r));
    for (int64_t r = valid; r < rows; ++r)
      for (int64_t q = 0; q < kc; ++q) d[AWord(kernel, rows, q, r)] = 0;
  }
}

// The emulation's A panels straight to fp32 (no pair words): element (k, r) of panel p at dst +
// p·PanelStride(2·kc, kMR) + k·kMR + r, the bf16 of op(A)(p·kMR + r, 2·q0 + k) widened; rows past M and a k
// past K 0. Each row of A converted a run at a time, then the panels written as gemm.cpp's PackA writes
// them. Not transposed: panels [b, e), k outer, so a panel is written in order from its kMR rows (as pair
// words scattered row by row and widened after, the stores took 17% of 768x128x512 NT on a Zen 3).
// Transposed: pairs [b, e) of every panel, rows 2q, 2q + 1 of A read once, start to end (pair words then
// widened: 20% of 512x128x4096 TN).
template <typename S>
void PackAWide(const Bf16Args& g, int64_t b, int64_t e, int64_t q0, int64_t kc, float* HWY_RESTRICT dst) {
  const S* A = static_cast<const S*>(g.A);
  const int64_t k0 = 2 * q0, ps = PanelStride(2 * kc, kMR);
  const auto widened = [](uint16_t h) { return AsFloat(uint32_t(h) << 16); };
  if (g.ta) {  // op(A)(i, k) = A[k·lda + i]
    const int64_t mp = ceil_div(g.M, kMR), kRows = kRun / kMR * kMR;  // rows of A converted at a time: whole panels
    uint16_t h[kRun];
    for (int64_t k = 2 * b; k < 2 * e; ++k)
      for (int64_t i0 = 0; i0 < mp * kMR; i0 += kRows) {
        const int64_t m = std::min(kRows, mp * kMR - i0), valid = k0 + k < g.K ? std::min(m, g.M - i0) : 0;
        if (valid > 0) Row16(A + (k0 + k) * g.lda + i0, valid, h);
        std::fill(h + valid, h + m, uint16_t(0));
        for (int64_t p = 0; p < m / kMR; ++p)
#pragma GCC unroll 16
          for (int r = 0; r < kMR; ++r) dst[(i0 / kMR + p) * ps + k * kMR + r] = widened(h[p * kMR + r]);
      }
    return;
  }
  const int64_t n = std::clamp<int64_t>(g.K - k0, 0, 2 * kc);  // op(A)(i, k) = A[i·lda + k]
  uint16_t h[kMR][kRun];
  for (int64_t p = b; p < e; ++p) {
    float* d = dst + p * ps;
    const int64_t rows = std::min<int64_t>(kMR, g.M - p * kMR);
    for (int64_t k1 = 0; k1 < 2 * kc; k1 += kRun) {
      const int64_t m = std::min(kRun, 2 * kc - k1), valid = std::clamp<int64_t>(n - k1, 0, m);
      for (int r = 0; r < kMR; ++r) {
        const int64_t v = r < rows ? valid : 0;
        if (v > 0) Row16(A + (p * kMR + r) * g.lda + k0 + k1, v, h[r]);
        std::fill(h[r] + v, h[r] + m, uint16_t(0));
      }
      for (int64_t k = 0; k < m; ++k)
#pragma GCC unroll 16
        for (int r = 0; r < kMR; ++r) d[(k1 + k) * kMR + r] = widened(h[r][k]);
    }
  }
}

// C (kMR, NV·N) = C0 + A (kMR, kc pairs) · Bp (kc pairs, NV·N), C0 = 0 where `zero`, else C: a whole block
// of C, read and written by full vectors (edges: EdgeThroughCopy), by register_block.h's GroupBlock.
// T = uint32_t: VDPBF16PS on chain words, ap's word (q, r) at q·kMR + r, bp's (q, j) at q·ldbp + j. T = float:
// the emulation on fp32 panels (PackAWide, Widen), element (k, r) of A at k·kMR + r, (k, j) of B at k·ldbp + j.
template <int NV, typename T>
HWY_NOINLINE void Micro(const T* HWY_RESTRICT ap, const T* HWY_RESTRICT bp, int64_t ldbp, int64_t kc,
                        float* HWY_RESTRICT c, int64_t ldc, bool zero) {
  const int64_t N = hn::Lanes(DF());
  GroupBlock<kMR, NV>(DF(), ARows<T>{ap, 1, kMR}, kMR, BRows<T>{bp, ldbp, N}, kc * kPairWidth<T>, c, ldc, zero);
}

// The narrowest instance that covers nr columns; an edge block (mr < kMR or a partial last vector)
// through a copy of its part of C.
template <int NV, typename T>
HWY_INLINE void MicroCols(int64_t nr, const T* ap, const T* bp, int64_t ldbp, int64_t kc, float* c, int64_t ldc,
                          int64_t mr, bool zero) {
  const int64_t w = NV * static_cast<int64_t>(hn::Lanes(DF()));
  if constexpr (NV > 1)
    if (nr <= w - static_cast<int64_t>(hn::Lanes(DF())))
      return MicroCols<NV - 1>(nr, ap, bp, ldbp, kc, c, ldc, mr, zero);
  if (mr == kMR && nr == w) return Micro<NV>(ap, bp, ldbp, kc, c, ldc, zero);
  EdgeThroughCopy<float, kMR * NV * hn::MaxLanes(DF())>(c, ldc, mr, nr, kMR, w, zero ? Start::zero : Start::c,
                                                        [&](float* tile, int64_t ldt) {
                                                          Micro<NV>(ap, bp, ldbp, kc, tile, ldt, zero);
                                                        });
}

// C (32, 32) = C0 + A (32 rows, kc pairs) · B (kc pairs, 32), C0 = 0 where `zero`, else C (amx.h's Block): A
// the AMX A panel (AWord: a group's two row tiles 16 words a row, one after the other; ATilesOf) or A's rows
// themselves, bp two B panels of 16 columns, (kc, 16) words each, one after the other.
HWY_INLINE void MicroAmx(amx::ATiles A, const uint32_t* bp, int64_t kc, float* c, int64_t ldc, bool zero) {
  amx::Block<2>(A, {bp, kGroup, kGroup * kGroup, kGroup * kc}, kc / kGroup, c, ldc, zero);
}
// The tiles of a packed AMX A panel: each 1 KB in one piece.
inline amx::ATiles ATilesOf(const uint32_t* ap) { return {ap, kGroup, kGroup * kAmx}; }

// AMX's K block: its tiles stream from L2 (a 32-row A panel of 2 KB per group outruns L1 after 20
// groups, and each group's four tile loads then come from L1 or L2 alike at this rate), so K blocks are cut
// to keep a 32-row A panel in a 32nd of L2 (kc 512 pairs at 2 MiB): fewer loads and stores of C's tiles,
// one per K block. An Intel Xeon (2 MiB L2), 1 thread: kc 96 (L1's rule) -> 512 took 4096x512x512 NT from
// 154 to 210 GFLOP/s, 768x128x512 NT from 143 to 170; 2048³ the same for kc 128 to 2048.
Tuning AmxBlocking() {
  Tuning t;
  t.gemm_kc = std::clamp<int64_t>(cpu_info().l2 / 32 / (kAmx * 4) / kGroup * kGroup, 64, 1024);
  return t;
}

Kernel Choose() {
  if constexpr (kDpTarget)
    if (cpu_info().amx) return Kernel::amx;
  return UseDp() ? Kernel::dp : Kernel::emu;
}

// The pairs of K values, in whole groups (the last zero-padded).
inline int64_t GroupedPairs(int64_t K) { return ceil_div(ceil_div(K, 2), kGroup) * kGroup; }

// PackedB16::layout of panels cut for `kernel` on this target (never 0).
int64_t Layout(Kernel kernel) {
  return int64_t(hwy::Num0BitsBelowLS1Bit_Nonzero64(uint64_t(HWY_TARGET))) * 4 + int64_t(kernel) + 1;
}

// The K block (pairs, whole groups) and the blocking of a product on `kernel`, the K block as B was packed at
// where kc > 0.
Blocking BlockingOf(Kernel kernel, int64_t M, int64_t N, int64_t K2, int64_t kc = 0) {
  const Tuning amx = AmxBlocking();
  Blocking bl = blocking(M, N, K2, PanelRows(kernel), BlockCols(kernel), kernel == Kernel::emu ? 8 : 4,
                         kernel == Kernel::amx ? &amx : nullptr, false, kc);
  bl.kc = ceil_div(bl.kc, kGroup) * kGroup;
  return bl;
}

// op(B)'s np panels (pr columns) of pairs [q0, q0 + kc), in parallel: pair words at bp (np, kc, pr), chain words
// for VDPBF16PS, and for the emulation widened (Widen) at wb, 2·kc·pr floats a panel.
void PackBBlock(const Bf16Args& g, Kernel kernel, int64_t np, int64_t pr, int64_t q0, int64_t kc, uint32_t* bp,
                float* wb) {
  const auto pack_b = g.b16 ? PackB<uint16_t> : PackB<float>;
  const bool chains = kernel == Kernel::dp;
  const auto widen_b = [&](int64_t p0, int64_t p1, int64_t b, int64_t e) {
    for (int64_t p = p0; wb && p < p1; ++p) Widen(bp + p * kc * pr, b, e, pr, wb + p * 2 * kc * pr);
  };
  if (g.tb)
    parallel_for(np, grain_for(kc * pr), [&](int64_t b, int64_t e, int) {
      pack_b(g, np, b, e, q0, kc, pr, chains, bp);
      widen_b(b, e, 0, kc);
    });
  else  // chunks of pairs of pairs: rows of B
    parallel_for(kc / 2, grain_for(4 * g.N), [&](int64_t b, int64_t e, int) {
      pack_b(g, np, 2 * b, 2 * e, q0, kc, pr, chains, bp);
      widen_b(0, np, 2 * b, 2 * e);
    });
}

// One block of C (rows x cols of it at c) on `kernel`'s microkernel, B panels PanelCols(kernel) wide: a, b
// pair words, or for the emulation their widened floats; AMX reads A's tiles at `at` instead of a.
HWY_INLINE void Block(Kernel kernel, const void* a, amx::ATiles at, const void* b, int64_t kc, float* c, int64_t ldc,
                      int64_t rows, int64_t cols, bool zero) {
#if ATTN_AVX512_TARGET(HWY_TARGET)
  const auto* aw = static_cast<const uint32_t*>(a);
  const auto* bw = static_cast<const uint32_t*>(b);
  if (kernel == Kernel::amx) {
    if (rows == kAmx && cols == kAmx) return MicroAmx(at, bw, kc, c, ldc, zero);
    return EdgeThroughCopy<float, kAmx * kAmx>(
        c, ldc, rows, cols, kAmx, kAmx, zero ? Start::zero : Start::c,
        [&](float* tile, int64_t ldt) { MicroAmx(at, bw, kc, tile, ldt, zero); });
  }
  if (kernel == Kernel::dp) return MicroCols<kNVDp>(cols, aw, bw, PanelCols(kernel), kc, c, ldc, rows, zero);
#endif
  MicroCols<kNVEmu>(cols, static_cast<const float*>(a), static_cast<const float*>(b), PanelCols(kernel), kc, c, ldc,
                    rows, zero);
}

void GemmBf16(const Bf16Args& g) {
  const Kernel kernel = Choose();
  const int64_t M = g.M, N = g.N, K2 = GroupedPairs(g.K);
  const int64_t mr = PanelRows(kernel), nr = BlockCols(kernel), pr = PanelCols(kernel);
  const bool packed = g.packed && g.packed->layout == Layout(kernel);  // B's panels cut for this kernel: read
  const bool emu = kernel == Kernel::emu;  // its packed pair: two fp32, else one word
  const Blocking bl = BlockingOf(kernel, M, N, K2, packed ? g.packed->kc : 0);
  const int64_t mp = ceil_div(M, mr), np = ceil_div(N, nr) * (nr / pr);  // panels of A and of B
  // Pair words: A's panels (not for the emulation, which packs A straight to fp32: PackAWide, PanelStride(2·kc,
  // mr) floats apart) and B's (np, kc, pr), which the emulation widens (Widen) to 2·kc·pr floats a panel.
  auto* ap = emu ? nullptr : static_cast<uint32_t*>(scratch(0, static_cast<size_t>(mp * PanelStride(bl.kc, mr)) * 4));
  auto* bp = packed ? nullptr : static_cast<uint32_t*>(scratch(1, static_cast<size_t>(np * pr * bl.kc) * 4));
  float* wa = emu ? static_cast<float*>(scratch(0, static_cast<size_t>(mp * PanelStride(2 * bl.kc, mr)) * 4)) : nullptr;
  float* wb = emu && !packed ? static_cast<float*>(scratch(2, static_cast<size_t>(np * pr * 2 * bl.kc) * 4)) : nullptr;
  const auto pack_a = g.a16 ? PackA<uint16_t> : PackA<float>;
  const auto pack_a_wide = g.a16 ? PackAWide<uint16_t> : PackAWide<float>;
  // AMX reads a bf16 A (not transposed) in place where it can: an A tile is 16 rows of A, lda apart, each a
  // group's 32 k (whole groups in every row: K a multiple of 32), so only a last partial panel is packed
  // (packing took a fifth of 4096x128x512 NT).
  const bool a_rows = kernel == Kernel::amx && g.a16 && !g.ta && g.K % (2 * kGroup) == 0 && g.lda % 2 == 0;
  const int64_t pa = a_rows ? M / mr : 0;  // A's panels [pa, mp) are packed
  const int64_t qa = kernel == Kernel::amx ? kGroup : 2;  // pairs per chunk of a transposed A's packing
  const int64_t tm = ceil_div(M, bl.mc), tn = ceil_div(N, bl.nt);
  // A bf16 C: each block rounded into it as the last K block ends it, from a tile on the stack where one K block
  // from 0 makes it, else from the fp32 sums in scratch (C16 widened first where beta reads it).
  float* C = g.C;
  int64_t ldc = g.ldc;
  if (g.C16) {
    const bool sums = K2 > bl.kc || g.beta != 0.f;
    C = sums ? static_cast<float*>(scratch(4, static_cast<size_t>(M * N) * 4)) : nullptr;
    ldc = N;
    for (int64_t i = 0; sums && g.beta != 0.f && i < M; ++i) from_half(KvDtype::bf16, g.C16 + i * g.ldc, N, C + i * N);
  }
  if (g.beta != 0.f && g.beta != 1.f) scale_c(M, N, g.beta, C, ldc);  // then C + products
  for (int64_t q0 = 0; q0 < K2; q0 += bl.kc) {
    const int64_t kc = std::min(bl.kc, K2 - q0), kpw = PanelStride(2 * kc, mr);
    const bool zero = q0 == 0 && g.beta == 0.f && !g.bias, last = q0 + kc == K2;
    // this K block's B panels: packed once (at q0·np·pr words, the emulation's at 2·q0·np·pr floats), or now
    const uint32_t* bw = packed ? static_cast<const uint32_t*>(g.packed->panels.get()) + q0 * np * pr : bp;
    const float* bf = packed && emu ? static_cast<const float*>(g.packed->panels.get()) + 2 * q0 * np * pr : wb;
    if (!packed) PackBBlock(g, kernel, np, pr, q0, kc, bp, wb);
    const auto pack_a_part = [&](int64_t b, int64_t e) {  // fp32 panels for the emulation, else pair words
      if (wa) pack_a_wide(g, b, e, q0, kc, wa);
      else pack_a(g, kernel, b, e, q0, kc, ap);
    };
    if (g.ta)  // chunks of pairs of pairs (AMX: of groups): rows of A (see PackA)
      parallel_for(kc / qa, grain_for(2 * qa * M), [&](int64_t b, int64_t e, int) { pack_a_part(qa * b, qa * e); });
    else if (pa < mp)
      parallel_for(mp - pa, grain_for(kc * mr), [&](int64_t b, int64_t e, int) { pack_a_part(pa + b, pa + e); });
    const int64_t tile_cost = std::min(M, bl.mc) * std::min(N, bl.nt) * kc * 2;
    parallel_for(tm * tn, grain_for(tile_cost), [&](int64_t t0, int64_t t1, int) {
      const FlushSubnormals flush(true);  // the emulation's FMAs and every path's C + (E + O)
      [[maybe_unused]] const std::optional<amx::Tiles> tiles =
          kernel == Kernel::amx ? std::make_optional<amx::Tiles>() : std::nullopt;
      HWY_ALIGN float tile[kAmx * kAmx];  // a block of a bf16 C that no fp32 sums hold (C == nullptr)
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t i0 = (t % tm) * bl.mc, j0 = (t / tm) * bl.nt;  // tiles sharing B panels run together
        const int64_t i1 = std::min(M, i0 + bl.mc), j1 = std::min(N, j0 + bl.nt);
        for (int64_t i = i0; i < i1; i += mr)
          for (int64_t j = j0; j < j1; j += nr) {
            const int64_t cols = std::min(nr, j1 - j), rows = std::min(mr, i1 - i);
            const void* a = wa ? static_cast<const void*>(wa + i / mr * kpw) : ap + i / mr * PanelStride(kc, mr);
            const void* b = emu ? static_cast<const void*>(bf + j * 2 * kc) : bw + j * kc;
            const amx::ATiles at = i / mr < pa
                                       ? amx::ATiles{reinterpret_cast<const uint32_t*>(
                                                         static_cast<const uint16_t*>(g.A) + i * g.lda + 2 * q0),
                                                     g.lda / 2, kGroup}
                                       : ATilesOf(static_cast<const uint32_t*>(a));
            float* c = C ? C + i * ldc + j : tile;
            const int64_t ldt = C ? ldc : nr;
            if (q0 == 0 && g.bias)  // the block's C0, as gemm.cpp writes it
              bias_rows(g.bias + j, rows, cols, c, ldt);
            Block(kernel, a, at, b, kc, c, ldt, rows, cols, zero);
            for (int64_t r = 0; g.C16 && last && r < rows; ++r)
              StoreBf16(c + r * ldt, cols, g.C16 + (i + r) * g.ldc + j);
          }
      }
    });
  }
}

// pack_b_bf16() on this target: each K block's panels as GemmBf16 packs them (the emulation's widened), block
// q0 at q0·np·pr words (2·q0·np·pr floats).
PackedB16 PackBf16(bool tb, int64_t K, int64_t N, const uint16_t* B, int64_t ldb) {
  const Kernel kernel = Choose();
  const int64_t K2 = GroupedPairs(K), nr = BlockCols(kernel), pr = PanelCols(kernel);
  const int64_t np = ceil_div(N, nr) * (nr / pr);
  const bool emu = kernel == Kernel::emu;
  PackedB16 p{tb, K, N, B, ldb, BlockingOf(kernel, 1, N, K2).kc, Layout(kernel), nullptr};
  void* dst = aligned_bytes(static_cast<uint64_t>(K2 * np * pr) * (emu ? 8 : 4));
  p.panels = std::shared_ptr<const void>(dst, [](const void* q) { std::free(const_cast<void*>(q)); });
  const Bf16Args g{false, tb, 0, N, K, nullptr, false, 0, B, true, ldb, 0.f, nullptr, 0};
  for (int64_t q0 = 0; q0 < K2; q0 += p.kc) {
    const int64_t kc = std::min(p.kc, K2 - q0);
    if (!emu) PackBBlock(g, kernel, np, pr, q0, kc, static_cast<uint32_t*>(dst) + q0 * np * pr, nullptr);
    else  // the pair words in scratch, widened into the panels
      PackBBlock(g, kernel, np, pr, q0, kc, static_cast<uint32_t*>(scratch(1, static_cast<size_t>(np * pr * kc) * 4)),
                 static_cast<float*>(dst) + 2 * q0 * np * pr);
  }
  return p;
}

// "AMX TDPBF16PS, AVX3 32x32", "VDPBF16PS, AVX3 6x32" or "emulated with FMA (no AVX512_BF16), AVX2 4x8".
std::string DescribeBf16() {
  const Kernel kernel = Choose();
  const char* how = kernel == Kernel::amx ? "AMX TDPBF16PS, "
                    : kernel == Kernel::dp ? "VDPBF16PS, "
                                           : "emulated with FMA (no AVX512_BF16), ";
  return how + std::string(hwy::TargetName(HWY_TARGET)) + " " + std::to_string(PanelRows(kernel)) + "x" +
         std::to_string(BlockCols(kernel));
}

}  // namespace attn::gemm_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace gemm_detail {
HWY_EXPORT(GemmBf16);
HWY_EXPORT(PackBf16);
HWY_EXPORT(DescribeBf16);
HWY_EXPORT(UseDp);

void run_bf16(const Bf16Args& g) {
  if (g.M <= 0 || g.N <= 0) return;
  if (g.K > 0) return HWY_DYNAMIC_DISPATCH(GemmBf16)(g);
  if (!g.C16) return scale_c(g.M, g.N, g.beta, g.C, g.ldc, g.bias);
  std::vector<float> row(static_cast<size_t>(g.N));  // beta·C of a bf16 C, through fp32
  for (int64_t i = 0; i < g.M; ++i) {
    if (g.beta != 0.f) from_half(KvDtype::bf16, g.C16 + i * g.ldc, g.N, row.data());
    scale_c(1, g.N, g.beta, row.data(), g.N);
    to_half(KvDtype::bf16, row.data(), g.N, g.C16 + i * g.ldc);
  }
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
PackedB16 pack_b_bf16(bool trans_b, int64_t K, int64_t N, const uint16_t* B, int64_t ldb) {
  ATTN_CHECK(K > 0 && N > 0 && B, "Expected a B of at least one row and column to pack, but got (", K, ", ", N,
             ") instead");
  return HWY_DYNAMIC_DISPATCH(gemm_detail::PackBf16)(trans_b, K, N, B, ldb);
}
void gemm_bf16(bool ta, int64_t M, const float* A, int64_t lda, const PackedB16& B, float beta, float* C,
               int64_t ldc) {
  gemm_detail::run_bf16({ta, B.trans_b, M, B.N, B.K, A, false, lda, B.B, true, B.ldb, beta, C, ldc, &B});
}
void gemm_bf16(bool ta, int64_t M, const uint16_t* A, int64_t lda, const PackedB16& B, float beta, float* C,
               int64_t ldc) {
  gemm_detail::run_bf16({ta, B.trans_b, M, B.N, B.K, A, true, lda, B.B, true, B.ldb, beta, C, ldc, &B});
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint16_t* B,
               int64_t ldb, float beta, uint16_t* C, int64_t ldc) {
  gemm_detail::run_bf16({ta, tb, M, N, K, A, true, lda, B, true, ldb, beta, nullptr, ldc, nullptr, C});
}

}  // namespace attn
#endif  // HWY_ONCE
