// FlashAttention-2 forward on the CPU, fp32: tiles of queries against tiles of keys with the online
// softmax, never materializing the (L, S) scores; O(S·D) extra memory for the packed keys plus
// O(tile) per thread. Not the oracle (reference.cpp is) and not fp64; no attention weights.
//
// One query tile = lq query positions x the G = H/Hkv query heads of one KV head (row r is position
// l0 + r/G, head kvh·G + r%G), so each packed Kᵀ panel feeds every head of a GQA group. K is packed
// once per (batch, KV head) as Kᵀ panels; a tile of at most kFewRows rows (decoding) reads K in place
// instead, computing Sᵀ = K·Qᵀ, since packing would cost more than the few rows' arithmetic.
// Scores are kept in the log2 domain: Q is scaled by scale·log2(e) when packed, masks are multiplied
// by log2(e), and exp2 replaces exp; LSE is converted back to natural log at the end.
// bf16 (precision bf16, an Autocast): Q, K, V rounded to bf16 when packed (K always as Kᵀ panels, V as
// rows), S = scale·log2(e)·(Q·Kᵀ) from fp32 sums of pair products, the softmax in fp32, P rounded by
// exp2 (after dropout, where there is some), O += P·V in fp32 sums, both products in AMX's arithmetic
// (groups of 16 pairs, register_block.h), the whole tile under DAZ/FTZ, so the bits are the same on every
// FMA CPU. With AMX the operands are pair words in tiles (32-row blocks; an Intel Xeon, L 4096: 2.3-3.5x
// the fp32 kernel); with VDPBF16PS chain words (GroupBlock); without either, bf16 values as fp32 on FMAs.
//
// Threads: attn's pool (parallel_items) over independent (batch, KV head, query tile) items, each
// reduced in a fixed order by one thread, so any thread count gives bitwise the same output. Decoding
// (few query rows, long S) is flash_decode (flash_decode.cpp, the kernel of half-precision K/V
// too): S split into chunks of a fixed size whose (m, l, O) triples are merged in chunk order.
// SIMD: one copy per Highway target (AVX-512, AVX2, SSE4, scalar), chosen when the program runs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>

#include "attn/kernels/half_kv.h"
#include "attn/kernels/problem.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "attn/tune.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/flash_forward.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "dropout.h"
#include "flash_common.h"
#include "../core/aligned.h"  // allocate_aligned: every buffer checked
#include "mask.h"
#include "pairs.h"
#include "score_mod.h"
#include "softmax.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Tile sizes: flash_tiles() (below, HWY_ONCE part): keys per tile a constant of the algorithm.
constexpr int64_t kCutBand = 4 * kMR;     // rows per band where the causal diagonal crosses a tile
constexpr int64_t kFewRows = 16;         // tiles of at most this many rows read K in place (no Kᵀ pack)
constexpr int64_t kDecodeRows = 16;      // at most this many rows per KV head ...
constexpr int64_t kDecodeMinS = 1024;    // ... and at least this many keys: the decode path
constexpr int64_t kPackBudget = 16 << 20;  // bytes of packed K/V held at once (at least one KV head)
constexpr int64_t kPackRows = 1024;      // keys per packing job

// What every tile needs to know about the problem.
struct Plan {
  const SdpaProblem<float>& p;
  int64_t N = 0, Dvp = 0;  // lanes, Dv rounded up to N
  int64_t lq = 0, Br = 0;  // query positions and rows (lq·G) per tile
  bool decode = false;  // split S into chunks instead of L into tiles
  bool few = false;     // Br <= kFewRows: S is computed as K·Qᵀ from K rows, K is not packed as panels
  bool pack_k = false;  // K must be copied: as Kᵀ panels (!few), or as rows (few, column stride != 1)
  bool pack_v = false;  // V rows can't be read in place (column stride != 1 or Dv % N != 0)
  float qscale = 0;     // scale·log2(e), folded into Q (bf16: applied to each fp32 score)
  int64_t bc = 0;       // keys per tile (flash_tiles().keys): where the online softmax rescales
  bool bf16 = false;    // Q·Kᵀ and P·V over bf16 pairs (Q, K, V and P rounded)
  Bf16Kernel kernel = Bf16Kernel::emu;  // bf16: AMX or VDPBF16PS on pair words (E = uint32_t), FMAs on floats
  bool words = false;   // bf16 pairs as words (AMX, VDPBF16PS), else as floats
  int64_t band = kCutBand;  // rows per band across the causal diagonal (AMX: its 32-row blocks)
  int64_t D2 = 0;       // bf16: pairs along D, whole groups (GroupPairs)
  int64_t Dq = 0;       // elements per Q row and per key of a Kᵀ panel: D; bf16 D2 words or 2·D2 floats
};

Plan MakePlan(const SdpaProblem<float>& p, Precision precision) {
  Plan pl{p};
  pl.N = static_cast<int64_t>(hn::Lanes(DF()));
  pl.Dvp = round_up(p.Dv, pl.N);
  pl.decode = p.L * p.G <= kDecodeRows && p.S >= kDecodeMinS;
  const FlashTiles tiles = flash_tiles(HWY_TARGET);
  pl.bc = tiles.keys;
  pl.bf16 = precision == Precision::bf16 && !pl.decode;  // decoding stays fp32 (as linear_rows does)
  if (pl.bf16) {
    pl.kernel = kDpTarget && cpu_info().amx ? Bf16Kernel::amx : UseDp() ? Bf16Kernel::dp : Bf16Kernel::emu;
    pl.words = pl.kernel != Bf16Kernel::emu;
  }
  if (pl.kernel == Bf16Kernel::amx) pl.band = 32;
  // lq·G about tiles.rows and a multiple of kMR (AMX: of its 32-row blocks) where it can be, so no
  // microkernel runs short.
  const int64_t unit = pl.kernel == Bf16Kernel::amx ? 32 : kMR, step = unit / std::gcd<int64_t>(p.G, unit);
  pl.lq = pl.decode ? p.L
                    : std::min(p.L, step * std::max<int64_t>(1, std::llround(double(tiles.rows) / double(step * p.G))));
  pl.Br = pl.lq * p.G;
  pl.D2 = GroupPairs(p.D);
  pl.Dq = !pl.bf16 ? p.D : pl.words ? pl.D2 : 2 * pl.D2;
  pl.few = pl.Br <= kFewRows && !pl.bf16;
  pl.pack_k = !pl.few || p.args.k.strides[3] != 1;
  pl.pack_v = pl.bf16 || p.args.v.strides[3] != 1 || p.Dv % pl.N != 0;
  pl.qscale = static_cast<float>(p.scale) * kLog2e;
  return pl;
}

// Per-worker scratch (from the call's Scratch): one query tile and its running statistics.
struct Tile {
  float* q;      // (Br, Dq) Q rows times scale·log2(e) (bf16: as given; rounded, as floats, in the emulation)
  float* s;      // (Br, bc) scores, then probabilities P
  float* o;      // (Br, Dvp) unnormalised output
  float* m;      // (Br,) running max, log2 domain
  float* l;      // (Br,) running sum of P (before dropout)
  float* alpha;  // (Br,) rescale factor of this key tile
  float* qt;     // few rows only: (D, Brp) Qᵀ panels of q, Brp = Br rounded up to N
  float* st;     // few rows only: (bc, Brp) scores transposed, as K·Qᵀ gives them
  uint32_t* q16 = nullptr;  // pair words only: (Br, D2) pair words of Q (unscaled)
  uint32_t* p16 = nullptr;  // pair words only: (Br, bc/2) pair words of P
  int64_t b = 0, kvh = 0, l0 = 0, rows = 0;

  // Floats and (bf16) pair words of one Tile, 64-byte aligned parts: what the constructor's x and w hold.
  static int64_t floats(const Plan& pl) {
    Sizes z(pl);
    return z.nq + z.ns + z.no + 3 * z.nr + z.nqt + z.nst;
  }
  static int64_t words(const Plan& pl) {
    return pl.words ? round_up(Rows(pl) * pl.D2, 16) + Rows(pl) * pl.bc / 2 : 0;
  }
  Tile(const Plan& pl, float* x, uint32_t* w) {
    const Sizes z(pl);
    q = x, s = q + z.nq, o = s + z.ns, m = o + z.no, l = m + z.nr, alpha = l + z.nr, qt = alpha + z.nr, st = qt + z.nqt;
    if (pl.words) q16 = w, p16 = q16 + round_up(Rows(pl) * pl.D2, 16);
  }

 private:
  // rows of the buffers: Br, or for AMX's 32-row blocks Br rounded up to them
  static int64_t Rows(const Plan& pl) { return pl.kernel == Bf16Kernel::amx ? round_up(pl.Br, 32) : pl.Br; }
  struct Sizes {
    int64_t nq, ns, no, nr, nqt, nst;
    explicit Sizes(const Plan& pl) {
      const int64_t Br = Rows(pl), a = 16, Brp = pl.few ? round_up(Br, pl.N) : 0;
      nq = round_up(Br * pl.Dq, a), ns = round_up(Br * pl.bc, a), no = round_up(Br * pl.Dvp, a);
      nr = round_up(Br, a), nqt = round_up(pl.p.D * Brp, a), nst = round_up(pl.bc * Brp, a);
    }
  };

 public:
  int64_t row_l(const SdpaProblem<float>& p, int64_t r) const { return l0 + p.row_position(r); }
  // bf16: Q's pairs (Dq apart) and where row r's P goes as pairs (bc/2 words, or bc floats, a row)
  template <typename E>
  E* q_pairs() const {
    if constexpr (std::is_same_v<E, uint32_t>) return q16;
    else return q;
  }
  template <typename E>
  E* p_pairs(const Plan& pl, int64_t r) const {
    if constexpr (std::is_same_v<E, uint32_t>) return p16 + r * (pl.bc / 2);
    else return s + r * pl.bc;
  }
  int64_t row_h(const SdpaProblem<float>& p, int64_t r) const { return p.row_head(kvh, r); }
};

// Q rows of positions [l0, l0 + nl) for the G heads of KV head kvh, scaled; statistics reset.
void LoadQ(const Plan& pl, Tile& t, int64_t b, int64_t kvh, int64_t l0, int64_t nl) {
  const auto& Q = pl.p.args.q;
  const int64_t D = pl.p.D;
  t.b = b, t.kvh = kvh, t.l0 = l0, t.rows = nl * pl.p.G;
  for (int64_t r = 0; r < t.rows; ++r) {
    const float* src = Q.data + b * Q.strides[0] + t.row_h(pl.p, r) * Q.strides[1] + t.row_l(pl.p, r) * Q.strides[2];
    float* dst = t.q + r * pl.Dq;
    const float f = pl.bf16 ? 1.f : pl.qscale;  // bf16: Q as given, rounded
    if (Q.strides[3] == 1)
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * f;  // vectorized
    else
      for (int64_t d = 0; d < D; ++d) dst[d] = src[d * Q.strides[3]] * f;
    if (pl.words) {
      PairRow(dst, D, t.q16 + r * pl.D2, pl.D2);
      ChainRowsIf(pl.kernel == Bf16Kernel::dp, t.q16 + r * pl.D2, pl.D2, 1, 1);
    } else if (pl.bf16) {
      PairRow(dst, D, dst, pl.D2);  // rounded in place
    }
  }
  if (pl.kernel == Bf16Kernel::amx)  // its 32-row blocks read Q rows past the tile's: zeros
    std::fill(t.q16 + t.rows * pl.D2, t.q16 + round_up(t.rows, 32) * pl.D2, 0u);
  if (pl.few) pack_panels(t.q, D, 1, t.rows, D, pl.N, t.qt);
  std::fill(t.m, t.m + t.rows, -kInf);
  std::fill(t.l, t.l + t.rows, 0.f);
  std::fill(t.o, t.o + t.rows * pl.Dvp, 0.f);
}

// The mask part of the score tile, rows [r0, r0 + nr), keys [s0, s0 + n) at column c0: log2(e)·(attn_mask
// + key_padding), -inf outside each row's keys and on the columns [n, npad) that only pad the last panel.
// Returns false when every entry is -inf: the GEMMs are skipped.
bool FillMask(const Plan& pl, Tile& t, int64_t r0, int64_t nr, int64_t s0, int64_t c0, int64_t n, int64_t npad) {
  bool live = false;
  for (int64_t r = r0; r < r0 + nr; ++r)
    live |= FillMaskRow(pl.p, t.b, t.row_h(pl.p, r), t.row_l(pl.p, r), s0, n, npad, t.s + r * pl.bc + c0);
  return live;
}

// Without masks, only the edges: S = -inf outside each row's keys and from n (panel padding) to npad. Rows
// [r0, r0 + nr), keys [s0, s0 + n) at column c0; costs the edges, not the tile.
void MaskEdge(const Plan& pl, Tile& t, int64_t r0, int64_t nr, int64_t s0, int64_t c0, int64_t n, int64_t npad) {
  for (int64_t r = r0; r < r0 + nr; ++r)
    MaskEdgeRow(pl.p, t.b, t.row_l(pl.p, r), s0, n, npad, t.s + r * pl.bc + c0);
}

// The score modifications (score_mod.h) of rows [r0, r0 + nr), keys [s0, s0 + n) at column c0: softcap,
// position biases, masks, -inf outside each row's keys and on [n, npad).
void ModScores(const Plan& pl, Tile& t, int64_t r0, int64_t nr, int64_t s0, int64_t c0, int64_t n, int64_t npad) {
  for (int64_t r = r0; r < r0 + nr; ++r)
    ModScoreRow(pl.p, t.b, t.row_h(pl.p, r), t.row_l(pl.p, r), s0, n, npad, t.s + r * pl.bc + c0);
}

// Dropout on P of rows [r0, r0 + nr), keys [s0, s0 + n) at column c0, after the row statistics (l and LSE
// stay pre-dropout): DropRow, the function the backward drops with too.
void Dropout(const Plan& pl, Tile& t, int64_t r0, int64_t nr, int64_t s0, int64_t c0, int64_t n) {
  for (int64_t r = r0; r < r0 + nr; ++r)
    DropRow(pl.p, t.b, t.row_h(pl.p, r), t.row_l(pl.p, r), s0, n, 1, t.s + r * pl.bc + c0);
}

// S (rows, n) at column c0 = Q·Kᵀ (+ S if add) for the few-rows tile, from K rows (ldk apart): Sᵀ = K·Qᵀ
// with the same microkernel (keys as its rows, Qᵀ as its panels), then transposed into S. Each score is the
// same FMA chain as with packed Kᵀ panels, so both give the same bits.
void QKFromRows(const Plan& pl, Tile& t, const float* k, int64_t ldk, int64_t c0, int64_t n, bool add) {
  const int64_t D = pl.p.D, np = (t.rows + pl.N - 1) / pl.N, ldst = np * pl.N;
  for (int64_t j = 0; j < np; j += kNV)
    for (int64_t s = 0; s < n; s += kMR)
      QK(std::min<int64_t>(kMR, n - s), std::min<int64_t>(kNV, np - j), k + s * ldk, ldk, t.qt + j * D * pl.N,
         D * pl.N, D, 1.f, t.st + s * ldst + j * pl.N, ldst, false);
  for (int64_t r = 0; r < t.rows; ++r) {
    float* row = t.s + r * pl.bc + c0;
    if (add)
      for (int64_t s = 0; s < n; ++s) row[s] += t.st[s * ldst + r];
    else
      for (int64_t s = 0; s < n; ++s) row[s] = t.st[s * ldst + r];
  }
}

// Keys of a band start at a multiple of this from the key tile's start: whole groups of bf16 pairs (32 keys)
// and whole sets of the 16 virtual lanes of the row sums, so a band that starts later than the tile keeps
// every sum's terms where they were (the ones it skips are zeros at the start).
constexpr int64_t kBandAlign = 2 * kGroupPairs;
static_assert(kBandAlign % kSumLanes == 0);

// The online softmax of the tile's rows over keys [s_lo, s_hi) (every key some row sees), in key tiles of bc
// from key 0 (where the softmax rescales: a tile no row sees is never computed, one some row sees is
// computed as it would be in a dense problem, so the bits do not depend on which tiles are skipped).
// fp32 (E = float): k: Kᵀ panels from key 0, or K rows ldk apart for a few-rows tile; v: V rows from key 0,
// ldv apart. bf16 (pl.bf16, E its pairs): Kᵀ pair panels (ldk = Dq) and V pair rows (ldv = Dvp) from key 0;
// P is rounded to pairs before P·V.
template <typename E>
void ProcessKeys(const Plan& pl, Tile& t, int64_t s_lo, int64_t s_hi, const E* k, int64_t ldk, const E* v,
                 int64_t ldv) {
  const auto& p = pl.p;
  const int64_t pw = kPairWidth<E>;
  // the keys of the tile's first and last rows: every row's keys lie between (keys() never decrease)
  const Range first = p.keys(t.b, t.row_l(p, 0)), last = p.keys(t.b, t.row_l(p, t.rows - 1));
  const bool mods = p.has_score_mod(), bias = p.has_bias();
  for (int64_t s0 = s_lo / pl.bc * pl.bc; s0 < s_hi; s0 += pl.bc) {
    const int64_t n = std::min(pl.bc, s_hi - s0);
    // Where some row sees only part of the tile (the causal diagonal, a window's edges, a document's end),
    // bands of pl.band rows run only over the columns [c0, c1) their rows see, so what lies outside costs
    // next to nothing; elsewhere the tile is one band. Keys a band skips would be -inf, so each row's
    // result is the same bits either way.
    const bool whole = last.begin <= s0 && first.end >= s0 + n;
    const int64_t band = whole ? t.rows : pl.band;
    for (int64_t r0 = 0; r0 < t.rows; r0 += band) {
      const int64_t nr = std::min(band, t.rows - r0);
      const Range lo = p.keys(t.b, t.row_l(p, r0)), hi = p.keys(t.b, t.row_l(p, r0 + nr - 1));
      const int64_t c0 = whole ? 0 : std::clamp<int64_t>((lo.begin - s0) / kBandAlign * kBandAlign, 0, n);
      const int64_t c1 = whole ? n : std::clamp<int64_t>(hi.end - s0, 0, n);
      if (c1 <= c0) continue;  // no key of this tile for these rows
      const int64_t nb = c1 - c0, nbp = round_up(nb, pl.N), sb = s0 + c0;  // the band's keys [sb, sb + nb)
      float* s_band = t.s + r0 * pl.bc + c0;
      // S = (Q·scale·log2 e)·Kᵀ + log2(e)·masks. With masks (and no score modification), the mask part goes
      // first, so a fully masked band costs no GEMM; with score modifications they follow the product in
      // their order; without either, only the edges and the panel padding get -inf, and bands inside every
      // row's keys need no per-element work at all.
      const bool pre = bias && !mods;
      if (pre && !FillMask(pl, t, r0, nr, sb, c0, nb, nbp)) continue;
      if (pl.bf16) {
        QK16Tile(pl.kernel, t.q_pairs<E>() + r0 * pl.Dq, nr, pl.Dq, k + sb * ldk, nbp / pl.N, pl.qscale, s_band,
                 pl.bc, pre);
      } else if constexpr (std::is_same_v<E, float>) {
        if (pl.few)  // one band: rows <= kFewRows < kCutBand
          QKFromRows(pl, t, k + sb * ldk, ldk, c0, nb, pre);
        else
          QKTile(t.q + r0 * pl.Dq, nr, pl.Dq, k + sb * pl.Dq, nbp / pl.N, 1.f, s_band, pl.bc, pre);
      }
      if (mods) ModScores(pl, t, r0, nr, sb, c0, nb, nbp);
      else if (!bias && (nbp != nb || (!whole && (lo.end < sb + nb || hi.begin > sb))))
        MaskEdge(pl, t, r0, nr, sb, c0, nb, nbp);
      // m_new = max(m, rowmax(S)); P = 2^(S - m_new); l = 2^(m - m_new)·l + rowsum(P)
      const int64_t padded = GroupPairs(nbp);  // bf16: P's pairs, whole groups (0 past nbp)
      bool rescale = false;
      for (int64_t r = r0; r < r0 + nr; ++r) {
        float* row = t.s + r * pl.bc + c0;
        const float m_new = std::max(t.m[r], RowMax(row, nbp));
        const float m_use = ExpBase(m_new);
        // while m = -inf, O and l are still 0: nothing to rescale; nor when the max did not change
        const float a = t.m[r] == -kInf || t.m[r] == m_new ? 1.f : std::exp2(t.m[r] - m_use);
        t.alpha[r] = a;
        rescale |= a != 1.f;
        // bf16 without dropout: P straight to its pairs
        E* pairs = pl.bf16 && !p.dropout() ? t.p_pairs<E>(pl, r) + pw * c0 / 2 : nullptr;
        t.l[r] = a * t.l[r] + (pl.bf16 ? Exp2Row<true>(row, nbp, m_use, pairs, padded)
                                        : Exp2Row<false>(row, nbp, m_use, pairs, padded));
        t.m[r] = m_new;
      }
      if (p.dropout()) Dropout(pl, t, r0, nr, sb, c0, nb);
      if (pl.bf16)
        for (int64_t r = r0; r < r0 + nr; ++r) {
          E* pairs = t.p_pairs<E>(pl, r) + pw * c0 / 2;
          if (p.dropout()) PairRow(t.s + r * pl.bc + c0, nbp, pairs, padded);
          ChainRowsIf(pl.kernel == Bf16Kernel::dp, pairs, padded, 1, 1);
        }
      // O = α ⊙ O + P·V; the rescale only when some row's max changed
      const float* alpha = rescale ? t.alpha + r0 : nullptr;
      if (pl.bf16) {  // P's pairs (keys past nb: 0, as -inf scores give) times V's pair rows
        PV16Tile(pl.kernel, t.p_pairs<E>(pl, r0) + pw * c0 / 2, nr, pw * pl.bc / 2, v + pw * sb / 2 * ldv,
                 pw * GroupPairs(nb), t.o + r0 * pl.Dvp, pl.Dvp, alpha);
      } else if constexpr (std::is_same_v<E, float>) {
        PVTile(s_band, nr, pl.bc, v + sb * ldv, ldv, nb, t.o + r0 * pl.Dvp, pl.Dvp, alpha);
      }
    }
  }
}

// V rows of (b, kvh): the packed copy or, where the layout allows, V itself.
const float* VRows(const Plan& pl, int64_t b, int64_t kvh, const float* packed, int64_t* ldv) {
  const auto& V = pl.p.args.v;
  *ldv = pl.pack_v ? pl.Dvp : V.strides[2];
  return pl.pack_v ? packed : V.data + b * V.strides[0] + kvh * V.strides[1];
}

// K of (b, kvh) as ProcessKeys reads it: the packed copy (panels, or rows D apart) or K itself.
const float* KRows(const Plan& pl, int64_t b, int64_t kvh, const float* packed, int64_t* ldk) {
  const auto& K = pl.p.args.k;
  *ldk = pl.pack_k ? pl.Dq : K.strides[2];
  return pl.pack_k ? packed : K.data + b * K.strides[0] + kvh * K.strides[1];
}

// Pack keys [s0, s0 + n) of (b, kvh) where needed: K at kp (Kᵀ panels, panel of key s0 first; or rows,
// few-rows tiles), V rows at vp. Both have room for n keys from s0 on.
void PackKeys(const Plan& pl, int64_t b, int64_t kvh, int64_t s0, int64_t n, float* kp, float* vp) {
  const auto& K = pl.p.args.k;
  const auto& V = pl.p.args.v;
  const float* k = K.data + b * K.strides[0] + kvh * K.strides[1] + s0 * K.strides[2];
  if (!pl.few) pack_panels(k, K.strides[2], K.strides[3], n, pl.p.D, pl.N, kp);
  else if (pl.pack_k) pack_rows(k, K.strides[2], K.strides[3], n, pl.p.D, pl.p.D, kp);
  if (pl.pack_v)
    pack_rows(V.data + b * V.strides[0] + kvh * V.strides[1] + s0 * V.strides[2], V.strides[2], V.strides[3], n,
              pl.p.Dv, pl.Dvp, vp);
}

// Prefill/training path: items (b, kvh, query tile). K/V of a batch of KV heads are packed once and
// shared by all their query tiles and query heads: as fp32 (E = float, where needed), or bf16 pairs
// (pl.bf16: always; E = uint32_t pair words, or floats), V's pair rows padded to whole groups of keys.
template <typename E>
void ForwardTiles(const Plan& pl) {
  constexpr bool k16 = std::is_same_v<E, uint32_t>;
  const auto& p = pl.p;
  const int64_t heads = p.B * p.Hkv, nt = (p.L + pl.lq - 1) / pl.lq, pw = kPairWidth<E>;
  const int64_t kt_size = pl.pack_k ? round_up(p.S, pl.N) * pl.Dq : 0;
  const int64_t v_size = pl.bf16 ? pw * GroupPairs(p.S) * pl.Dvp : pl.pack_v ? p.S * pl.Dvp : 0;
  const int64_t per_pair = round_up(kt_size + v_size, 16);
  const int64_t batch = std::clamp<int64_t>(kPackBudget / std::max<int64_t>(1, per_pair * 4), 1, heads);
  // One Scratch for the call: the packed K/V, and a Tile per worker.
  const int64_t T = num_threads(), tf = Tile::floats(pl), tw = Tile::words(pl);
  Scratch scratch(Scratch::bytes_of<E>(batch * per_pair) +
                  T * (Scratch::bytes_of<float>(tf) + Scratch::bytes_of<uint32_t>(tw)));
  E* pack = scratch.take<E>(batch * per_pair);
  std::vector<Tile> tiles;
  for (int64_t w = 0; w < T; ++w) tiles.emplace_back(pl, scratch.take<float>(tf), scratch.take<uint32_t>(tw));
  const int64_t blocks = (p.S + kPackRows - 1) / kPackRows;
  for (int64_t first = 0; first < heads; first += batch) {
    const int64_t np = std::min(batch, heads - first);
    parallel_items(np * blocks, std::min(kPackRows, p.S) * (p.D + p.Dv), [&](int64_t i, int) {
      const int64_t pair = first + i / blocks, s0 = (i % blocks) * kPackRows, n = std::min(kPackRows, p.S - s0);
      const int64_t b = pair / p.Hkv, kvh = pair % p.Hkv;
      E* kt = pack + (i / blocks) * per_pair;
      if (pl.bf16) {  // N keys at a time as fp32 (a Kᵀ panel, V rows), then paired; s0 is a multiple of 4
        const auto& K = p.args.k;
        const auto& V = p.args.v;
        const float* ks = K.data + b * K.strides[0] + kvh * K.strides[1] + s0 * K.strides[2];
        const float* vs = V.data + b * V.strides[0] + kvh * V.strides[1] + s0 * V.strides[2];
        const bool chain = pl.kernel == Bf16Kernel::dp;
        const int64_t step = round_up(pl.N, 2);  // whole panels and pairs of keys (N is 1 on the scalar target)
        std::vector<float> tmp(size_t(step * std::max(p.D, pl.Dvp)));
        E* vt = kt + kt_size;
        for (int64_t s = 0; s < n; s += step) {
          const int64_t m = std::min(step, n - s);
          pack_panels(ks + s * K.strides[2], K.strides[2], K.strides[3], m, p.D, pl.N, tmp.data());
          for (int64_t j = 0; j < m; j += pl.N) {  // each panel along D
            E* panel = kt + (s0 + s + j) * pl.Dq;
            PairRowsOf(tmp.data() + j * p.D, p.D, pl.N, pl.N, panel, pl.N, pl.D2);
            ChainRowsIf(chain, panel, pl.D2, pl.N, pl.N);
          }
          pack_rows(vs + s * V.strides[2], V.strides[2], V.strides[3], m, p.Dv, pl.Dvp, tmp.data());
          PairRowsOf(tmp.data(), m, pl.Dvp, pl.Dvp, vt + pw * ((s0 + s) / 2) * pl.Dvp, pl.Dvp, (m + 1) / 2);
        }
        // V's pair rows of this job: zero ones up to a whole group after the last key, then chained
        const int64_t q0 = s0 / 2, q1 = s0 + n == p.S ? GroupPairs(p.S) : (s0 + n) / 2;
        std::fill(vt + pw * ((s0 + n + 1) / 2) * pl.Dvp, vt + pw * q1 * pl.Dvp, E(0));
        ChainRowsIf(chain, vt + pw * q0 * pl.Dvp, q1 - q0, pl.Dvp, pl.Dvp);
      } else if constexpr (!k16) {
        PackKeys(pl, b, kvh, s0, n, kt + s0 * p.D, kt + kt_size + s0 * pl.Dvp);
      }
    });
    parallel_items(np * nt, std::min(pl.lq, p.L) * p.G * p.S * (p.D + p.Dv), [&](int64_t i, int worker) {
      // bf16: the whole tile under DAZ/FTZ, as VDPBF16PS computes, so its emulation and every fp32 step
      // around the products give the same bits on every CPU
      const pairs::FlushSubnormals flush(pl.bf16);
      [[maybe_unused]] const std::optional<amx::Tiles> amx_tiles =
          pl.kernel == Bf16Kernel::amx ? std::make_optional<amx::Tiles>() : std::nullopt;
      Tile& t = tiles[size_t(worker)];
      // last (longest causal) tiles first for balance; tiles are independent, so order changes nothing
      const int64_t pair = first + i % np, ti = nt - 1 - i / np;
      const int64_t b = pair / p.Hkv, kvh = pair % p.Hkv, l0 = ti * pl.lq, nl = std::min(pl.lq, p.L - l0);
      const E* packed = pack + (i % np) * per_pair;
      int64_t ldk = pl.Dq, ldv = pl.Dvp;
      const E* k = packed;
      const E* v = packed + kt_size;
      if constexpr (!k16)
        if (!pl.bf16) k = KRows(pl, b, kvh, packed, &ldk), v = VRows(pl, b, kvh, v, &ldv);
      LoadQ(pl, t, b, kvh, l0, nl);
      ProcessKeys(pl, t, p.keys(b, l0).begin, p.keys(b, l0 + nl - 1).end, k, ldk, v, ldv);
      for (int64_t r = 0; r < t.rows; ++r)
        WriteRow(p, b, t.row_h(pl.p, r), t.row_l(pl.p, r), t.o + r * pl.Dvp, t.m[r], t.l[r]);
    });
  }
}

void FlashForward(const SdpaProblem<float>& p, Precision precision) {
  if (p.B == 0 || p.H == 0 || p.L == 0) return;
  const Plan pl = MakePlan(p, precision);
  if (pl.decode) return flash_decode(p);  // flash_decode.cpp's kernel, over fp32 K/V
  if constexpr (kDpTarget)  // pair words for AMX and VDPBF16PS, on the targets that have them only
    if (pl.words) return ForwardTiles<uint32_t>(pl);
  ForwardTiles<float>(pl);  // fp32, or bf16 pairs as floats
}

}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace flash {
HWY_EXPORT(FlashForward);
}  // namespace flash

void flash_forward(const SdpaProblem<float>& p, Precision precision) {
  HWY_DYNAMIC_DISPATCH(flash::FlashForward)(p, precision);
}

namespace {
FlashTiles g_forced;  // set_flash_tiles; 0 = derived
}  // namespace

// keys: kKeyTile, a constant of the algorithm, never of the cache: the online softmax rescales O and l at
// each tile of keys, so the tile decides the bits (256: measured best on 1 MiB L2, where a 256 x 256
// score tile and its K/V tiles stay in half of it). rows: as measured on this CPU (attn tune), else 256
// (K/V tiles come from L3 once per query tile; measured on a Zen 5: 64 rows 12% slower); rows change no bits.
FlashTiles flash_tiles(int64_t target) {
  constexpr int64_t kKeyTile = 256;
  const Tuning* tuned = tuned_for(target ? target : simd_target_bits());
  FlashTiles t;
  t.keys = g_forced.keys > 0 ? flash::round_up(g_forced.keys, 64) : kKeyTile;
  t.rows = g_forced.rows > 0 ? g_forced.rows : tuned && tuned->flash_rows ? tuned->flash_rows : 256;
  return t;
}

void set_flash_tiles(FlashTiles t) { g_forced = t; }

}  // namespace attn
#endif
