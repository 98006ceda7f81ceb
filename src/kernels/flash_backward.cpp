// FlashAttention-2 backward on the CPU, fp32 or bf16 products: dQ, dK, dV without materializing the (L, S) weights.
// KV blocks outer, Q blocks inner; P is recomputed from the saved LSE, D = rowsum(dO∘O) is computed once.
// Not the oracle (reference_backward is) and not fp64.
//
// Every tile is computed transposed, keys in rows and queries in columns, so all five products are the
// forward's two microkernels (flash_common.h) without a transpose:
//   Sᵀ  (Bc, Br) = K_j · Q_iᵀ·scale·log2e      QK: K rows  x Qᵀ panels
//   dPᵀ (Bc, Br) = V_j · dO_iᵀ                  QK: V rows  x dOᵀ panels
//   Pᵀ = exp2(Sᵀ + bias·log2e − LSE·log2e);  dSᵀ = Pᵀ ∘ (dPᵀ∘keep/(1-p) − D)
//   dV_j (Bc, Dv) += P_droppedᵀ · dO_i         PV: Pᵀ rows x dO rows
//   dK_j (Bc, D)  += dSᵀ · Q_i                  PV: dSᵀ rows x Q rows          (· scale at the end)
//   dQ_i (Br, D)  += dS · K_j                   PV, A transposed: dSᵀ read as dS x K rows  (· scale at the end)
// Across the causal diagonal each block of kMR rows (keys, or queries for dQ) runs only over the queries
// (keys) it sees: what it skips is exact zeros, so the bits are those of the whole tile.
//
// Determinism for any thread count: a task is (b, KV head, chunk c of the KV blocks, j ≡ c mod C), C and
// the keys per block functions of the sizes only. A task owns dK/dV of its blocks and writes dQ into its
// chunk's own partial buffer; with C = 1 it stores dQ itself, else the C partials are summed in the order
// c = 0, 1, ... Every sum runs in one order, whatever the tiles: dK_j, dV_j over the group's query heads
// and then the queries in order, dQ over the keys of its chunk in order.
//
// Bounded scratch: the query side (Qᵀ, dOᵀ panels, LSE, D, dQ partials) is packed per unit, the rows of one
// segment of one query head of every (b, KV head) group, and processed in phases of a few units in the
// order (head within the group, segment), so the sums above keep their order; between phases dK/dV wait,
// unscaled, in the caller's dK/dV. A phase holds at most 32 MB (flash_backward_tiles().scratch), or one
// tile's rows of every group. All of a call's scratch is one Scratch (aligned.h): where small, the calling
// thread's block, kept between calls.
//
// bf16 (precision bf16, as an Autocast trains): the five products over bf16 pairs with fp32 sums, as
// FlashAttention's bf16 backward rounds them: Q, K, V, dO rounded to bf16 when packed, P(_dropped)ᵀ and dSᵀ
// rounded after their fp32 elementwise steps; scores, LSE, D, the softmax and every sum stay fp32. Each
// product's operands are paired along its depth: Qᵀ and dOᵀ panels and K, V rows along D (Sᵀ, dPᵀ), Pᵀ and
// dSᵀ along queries with Q and dO pair rows (dV, dK), dSᵀ's pair rows along keys with K's (dQ; for AMX
// transposed into dS's rows). Every product sums in AMX's arithmetic (groups of 16 pairs from the start of
// its depth, register_block.h), each depth padded with zeros to whole groups; a block of rows starting at a
// causal edge starts at the group of queries holding it (the ones more are P = 0). The pairs are E: pair
// words for AMX's tiles (32-row blocks) and VDPBF16PS's chain words (uint32_t), or bf16 values as fp32 for
// the FMAs (float; a pair row is two rows, a pair along a row two elements). Where AMX is, VDPBF16PS runs
// at half the FMA rate (Intel), so without AMX tiles there the FMAs run. Every task runs under DAZ/FTZ:
// the instructions' bits on every FMA CPU.
//
// Sections, one function each: PackUnit (Qᵀ, dOᵀ panels, LSE·log2e, D), then per task KV block j: LoadKV,
// per query tile ScoresT (Sᵀ, masks, causal edge, Pᵀ) and GradScoresT (dPᵀ, dropout, dSᵀ), Products,
// StoreKV; finally StoreDq. Masks, the causal edge and dropout are mask.h and dropout.h over SdpaProblem,
// the same calls the forward makes.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/flash_backward.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "attn/kernels/problem.h"
#include "attn/threads.h"
#include "dropout.h"
#include "flash_common.h"
#include "../core/aligned.h"  // Scratch: every buffer checked, kept between calls where small
#include "mask.h"
#include "score_mod.h"
#include "transpose16.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {
namespace {

constexpr int64_t kMinTasks = 16;  // split each KV head's blocks into chunks until there are this many tasks
constexpr float kInf = std::numeric_limits<float>::infinity();

// What the backward needs of the rows [l_begin, l_end) of query head (b, h), packed (n = rows rounded up to N):
template <typename E>
struct QHead {
  float* qt;          // (n/N, D, N) Qᵀ panels · scale·log2e (bf16: unscaled, before pairing)
  float* dot;         // (n/N, Dv, N) dOᵀ panels
  float* lse2;        // (n) LSE·log2e; +inf on a fully masked row and past l_end, so P = exp2(x − lse2) = 0 there
  float* dsum;        // (n) D = rowsum(dO∘O); 0 past l_end
  const float* q;  // (rows, Dp) Q rows from l_begin, unscaled, row stride ldq: the caller's when they fit, else packed
  const float* dout;  // (rows, Dvp) dO rows from l_begin, row stride lddo: likewise
  float* dq;          // (rows, Dp) this chunk's dQ partial / scale
  int64_t ldq, lddo, h, l_begin, l_end;
  // bf16 only, from Q and dO rounded (Q unscaled), pairs E (the header):
  E* qt16 = nullptr;   // (n/N, D2, N) Qᵀ pair panels (pairs along D)
  E* dot16 = nullptr;  // (n/N, Dv2, N) dOᵀ pair panels
  E* q2 = nullptr;     // (n/2, Dp) Q pair rows (queries 2i, 2i + 1)
  E* do2 = nullptr;    // (n/2, Dvp) dO pair rows
};

// The sizes and buffers every section shares.
struct Plan {
  const SdpaProblem<float>& p;
  View<const float> dout;  // (B, H, L, Dv)
  const SdpaGrads<float>& g;
  int64_t N, Br, Bc, Dp, Dvp, nkv, C;  // lanes; queries per tile, keys per block; padded D, Dv; KV blocks, chunks
  bool q_in_place, dout_in_place;      // Q and dO rows read where they are
  bool bf16, amx, dp;  // products over bf16 pairs: AMX tiles or VDPBF16PS (uint32_t pairs), else FMAs (float)
  int64_t Bcp;         // rows of the key side's buffers: Bc, or for AMX's 32-row blocks rounded up to them
  int64_t D2, Dv2, Dw, Dvw, Bw;        // bf16: pairs along D, Dv (whole groups); per row of K, V; of (Bc, Br) tiles
  int64_t Ls, nseg;                    // query rows per segment (a multiple of Br), segments per head
  int64_t units, per_phase;  // units G·nseg (unit u: head u / nseg of the group, segment u % nseg); per phase
  int64_t pw;                          // elements per pair: 1 (a pair word), 2 (floats)
  int64_t per_row, per_row16;          // floats (and bf16: pair elements) packed per query row
  // From the call's Scratch (Backward), of the sizes n_*:
  float* packed = nullptr;      // (B, Hkv, per_phase, Ls, per_row)
  void* packed16 = nullptr;     // bf16: (B, Hkv, per_phase, Ls, per_row16) pairs (uint32_t or float)
  float* dq = nullptr;          // (C, B, Hkv, per_phase, Ls, Dp) the dQ partial of each chunk
  int64_t n_packed, n_packed16, n_dq;

  Plan(const SdpaProblem<float>& p_, View<const float> dout_, const SdpaGrads<float>& g_, Precision precision)
      : p(p_), dout(dout_), g(g_) {
    N = static_cast<int64_t>(hn::Lanes(DF()));
    const FlashTiles t = flash_backward_tiles(p.L, p.S);
    // VDPBF16PS runs at half the FMA rate on the CPUs with AMX (Intel's): the FMAs' emulation there
    bf16 = precision == Precision::bf16, amx = bf16 && kDpTarget && cpu_info().amx, dp = bf16 && UseDp() && !amx;
    pw = bf16 && !amx && !dp ? 2 : 1;
    Br = round_up(t.rows, bf16 ? 2 * kGroupPairs : N),
    Bc = t.keys;  // bf16: tiles of whole groups (rows change no bits)
    Dp = round_up(p.D, N), Dvp = round_up(p.Dv, N);
    nkv = (p.S + Bc - 1) / Bc, Bcp = amx ? round_up(Bc, 32) : Bc;
    // chunks per KV head: a function of the sizes only, never of the thread count
    C = std::max<int64_t>(1, std::min((kMinTasks + p.B * p.Hkv - 1) / (p.B * p.Hkv), nkv));
    D2 = GroupPairs(p.D), Dv2 = GroupPairs(p.Dv);
    Dw = D2, Dvw = Dv2, Bw = Br / 2;
    // Q and dO rows are read in place when they have unit column stride and no padding is needed.
    q_in_place = p.args.q.strides[3] == 1 && p.D == Dp, dout_in_place = dout.strides[3] == 1 && p.Dv == Dvp;
    per_row = p.D + p.Dv + 2 + (q_in_place ? 0 : Dp) + (dout_in_place ? 0 : Dvp);
    per_row16 = bf16 ? pw * (D2 + Dv2 + (Dp + Dvp + 1) / 2) : 0;  // Ls is even: a multiple of Br, itself of 2N
    // Segments: the whole of L where every unit fits the budget, else as many tiles as one unit's budget holds.
    const int64_t groups = std::max<int64_t>(1, p.B * p.Hkv), row_floats = groups * (per_row + per_row16 + C * Dp);
    const int64_t Lr = round_up(std::max<int64_t>(p.L, 1), Br);
    const int64_t budget = t.scratch;
    Ls = p.G * Lr * row_floats <= budget ? Lr : std::clamp(budget / row_floats / Br * Br, Br, Lr);
    nseg = std::max<int64_t>(1, (p.L + Ls - 1) / Ls);  // L = 0: one empty unit still writes dK = dV = 0
    units = p.G * nseg;
    per_phase = std::clamp<int64_t>(budget / (Ls * row_floats), 1, std::max<int64_t>(1, units));
    n_packed = groups * per_phase * Ls * per_row, n_packed16 = groups * per_phase * Ls * per_row16;
    n_dq = C * groups * per_phase * Ls * Dp;
  }
  // Unit u (the ju-th of its phase) of group (b, kvh), chunk c's dQ partial; bf16 pairs E.
  template <typename E = float>
  QHead<E> head(int64_t b, int64_t kvh, int64_t u, int64_t ju, int64_t c) const {
    const auto& a = p.args;
    QHead<E> r;
    r.h = p.first_head(kvh) + u / nseg, r.l_begin = u % nseg * Ls, r.l_end = std::min(p.L, r.l_begin + Ls);
    const int64_t slot = (b * p.Hkv + kvh) * per_phase + ju;
    float* x = packed + slot * Ls * per_row;
    r.qt = x, x += Ls * p.D;
    r.dot = x, x += Ls * p.Dv;
    r.lse2 = x, x += Ls;
    r.dsum = x, x += Ls;
    const float* q = a.q.data + b * a.q.strides[0] + r.h * a.q.strides[1] + r.l_begin * a.q.strides[2];
    r.q = q_in_place ? q : x;
    r.ldq = q_in_place ? a.q.strides[2] : Dp;
    x += q_in_place ? 0 : Ls * Dp;
    r.dout = dout_in_place ? dout.data + b * dout.strides[0] + r.h * dout.strides[1] + r.l_begin * dout.strides[2] : x;
    r.lddo = dout_in_place ? dout.strides[2] : Dvp;
    r.dq = dq + ((c * p.B * p.Hkv) * per_phase + slot) * Ls * Dp;
    if (bf16) {
      E* w = static_cast<E*>(packed16) + slot * Ls * per_row16;
      r.qt16 = w, r.dot16 = w + pw * Ls * D2, r.q2 = r.dot16 + pw * Ls * Dv2, r.do2 = r.q2 + pw * (Ls / 2) * Dp;
    }
    return r;
  }
};

#if ATTN_AVX512_TARGET(HWY_TARGET)
using transpose::HWY_NAMESPACE::Transpose16;
#endif

// Rows [0, n) of a (n, D) matrix with strides (rs, cs), times mul, as (D, N) panels, 0 past n. With
// AVX-512 and unit column stride by 16x16 register transposes (the scalar transpose was a fifth of a small
// problem's time, gathers more), else pack_panels.
void PanelsOf(const float* src, int64_t rs, int64_t cs, int64_t n, int64_t D, float mul, float* dst) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if (cs == 1 && N == 16) {
    for (int64_t i0 = 0; i0 < n; i0 += 16, dst += D * 16)
      for (int64_t d0 = 0; d0 < D; d0 += 16)
        Transpose16(src + i0 * rs + d0, rs, std::min<int64_t>(16, n - i0), std::min<int64_t>(16, D - d0), mul,
                    dst + d0 * 16);
    return;
  }
#endif
  pack_panels(src, rs, cs, n, D, N, dst);
  if (mul != 1.f)
    for (int64_t i = 0; i < round_up(n, N) * D; ++i) dst[i] *= mul;
}

// One unit of group (b, kvh): Qᵀ·scale·log2e and dOᵀ panels, Q and dO rows where they can't be read in
// place (bf16: Qᵀ unscaled, and the pair panels and pair rows of Q and dO from these), LSE·log2e, and
// D = rowsum(dO∘O) in fp32, each row summed in order over Dv (N rows at once, one per lane). bf16 pairs E.
template <typename E>
void PackUnit(const Plan& pl, int64_t b, int64_t kvh, int64_t u, int64_t ju, float* ot) {
  const auto& p = pl.p;
  const auto& a = p.args;
  const DF df;
  const int64_t D = p.D, Dv = p.Dv, N = pl.N;
  QHead<E> r = pl.head<E>(b, kvh, u, ju, 0);
  const int64_t n = r.l_end - r.l_begin, filled = round_up(n, N);  // panels cover [0, filled), padding 0
  const float* q = a.q.data + b * a.q.strides[0] + r.h * a.q.strides[1] + r.l_begin * a.q.strides[2];
  const float* dO = pl.dout.data + b * pl.dout.strides[0] + r.h * pl.dout.strides[1] + r.l_begin * pl.dout.strides[2];
  const auto& O = p.out.out;
  const auto& lse = p.out.lse;
  const float* o = O.data + b * O.strides[0] + r.h * O.strides[1] + r.l_begin * O.strides[2];
  const float* m = lse.data + b * lse.strides[0] + r.h * lse.strides[1] + r.l_begin * lse.strides[2];
  PanelsOf(q, a.q.strides[2], a.q.strides[3], n, D, pl.bf16 ? 1.f : float(p.scale) * kLog2e, r.qt);
  PanelsOf(dO, pl.dout.strides[2], pl.dout.strides[3], n, Dv, 1.f, r.dot);
  if (!pl.q_in_place) pack_rows(q, a.q.strides[2], a.q.strides[3], n, D, pl.Dp, const_cast<float*>(r.q));
  if (!pl.dout_in_place)
    pack_rows(dO, pl.dout.strides[2], pl.dout.strides[3], n, Dv, pl.Dvp, const_cast<float*>(r.dout));
  if (pl.bf16) {  // the pairs from the fp32 panels (along D, Dv) and rows (across queries), whole groups
    for (int64_t l0 = 0; l0 < filled; l0 += N) {
      E* qt = r.qt16 + pl.pw * l0 * pl.D2;
      E* dot = r.dot16 + pl.pw * l0 * pl.Dv2;
      PairRowsOf(r.qt + l0 * D, D, N, N, qt, N, pl.D2);
      PairRowsOf(r.dot + l0 * Dv, Dv, N, N, dot, N, pl.Dv2);
      ChainRowsIf(pl.dp, qt, pl.D2, N, N), ChainRowsIf(pl.dp, dot, pl.Dv2, N, N);
    }
    PairRowsOf(r.q, n, r.ldq, pl.Dp, r.q2, pl.Dp, GroupPairs(n));
    PairRowsOf(r.dout, n, r.lddo, pl.Dvp, r.do2, pl.Dvp, GroupPairs(n));
    ChainRowsIf(pl.dp, r.q2, GroupPairs(n), pl.Dp, pl.Dp), ChainRowsIf(pl.dp, r.do2, GroupPairs(n), pl.Dvp, pl.Dvp);
  }
  for (int64_t l = 0; l < filled; ++l) {
    const float x = l < n ? m[l * lse.strides[2]] : -kInf;
    r.lse2[l] = x == -kInf ? kInf : x * kLog2e;
  }
  // D: O of N rows as a (Dv, N) panel beside dOᵀ's; s = Σ_e dO·O in the order e = 0, 1, ... per lane
  for (int64_t l0 = 0; l0 < filled; l0 += N) {
    PanelsOf(o + l0 * O.strides[2], O.strides[2], O.strides[3], std::min(N, n - l0), Dv, 1.f, ot);
    const float* dot = r.dot + l0 * Dv;
    VF s = hn::Zero(df);
    for (int64_t e = 0; e < Dv; ++e) s = hn::Add(s, hn::Mul(hn::LoadU(df, dot + e * N), hn::LoadU(df, ot + e * N)));
    hn::StoreU(s, df, r.dsum + l0);
  }
}

// Per-worker scratch of one KV block and one (keys, queries) tile; bf16 pairs E.
template <typename E>
struct Block {
  float* kr;    // (Bc, Dp) K_j rows, zero past D
  float* vr;    // (Bc, Dvp) V_j rows, zero past Dv
  float* dk;    // (Bc, Dp) dK_j / scale
  float* dv;    // (Bc, Dvp) dV_j
  float* st;    // (Bc, Br) Sᵀ, then P(_dropped)ᵀ
  float* dpt;   // (Bc, Br) dPᵀ, then dSᵀ
  float* keep;  // (Bc, Br) 1 where kept, 0 where dropped (dropout only)
  float* dcap;  // (Bc, Br) softcap only: 1 − tanh² of each score, the softcap's derivative
  int64_t* hid; // (Bc) queries of the tile before the first that sees each key (causal edge, window)
  int64_t* vend; // (Bc) queries of the tile before the last that sees each key, plus one (window, documents)
  int64_t b, kvh, s0, bc;  // keys [s0, s0 + bc) of KV head (b, kvh)
  // bf16 only, from kr and vr:
  E* kr16 = nullptr;  // (Bc, Dw) K_j pairs along D
  E* vr16 = nullptr;  // (Bc, Dvw) V_j pairs along Dv
  E* k2 = nullptr;    // (GroupPairs(Bc), Dp) K_j pair rows (keys 2i, 2i + 1)
  E* pt16 = nullptr;  // (Bc, Bw) P(_dropped)ᵀ pairs along queries
  E* dst16 = nullptr; // (Bc, Bw) dSᵀ pairs along queries
  E* ds2 = nullptr;   // (GroupPairs(Bc), Br) dSᵀ pair rows: dS pairs along keys
  E* dsa = nullptr;   // AMX only: (Br, GroupPairs(Bc)) dS pairs along keys, ds2 transposed (dQ's A tiles)
  static int64_t size(const Plan& pl) {
    return round_up(pl.Bcp * (2 * pl.Dp + 2 * pl.Dvp + (pl.p.has_softcap() ? 4 : 3) * pl.Br), 16);
  }
  // 32-bit elements (a pair word or a float)
  static int64_t size16(const Plan& pl) {
    const int64_t half = GroupPairs(pl.Bc);
    const int64_t dsa = pl.amx ? pl.Br * half : 0;
    return pl.bf16 ? pl.pw * round_up(pl.Bcp * (pl.Dw + pl.Dvw + 2 * pl.Bw) + half * (pl.Dp + pl.Br) + dsa, 16) : 0;
  }
  Block(const Plan& pl, float* x, E* w, int64_t* hid_) : hid(hid_), vend(hid_ + pl.Bc) {
    const int64_t n = pl.Bcp;
    kr = x, vr = kr + n * pl.Dp, dk = vr + n * pl.Dvp, dv = dk + n * pl.Dp;
    st = dv + n * pl.Dvp, dpt = st + n * pl.Br, keep = dpt + n * pl.Br, dcap = keep + n * pl.Br;
    if (!pl.bf16) return;
    const int64_t pw = pl.pw;
    kr16 = w, vr16 = kr16 + pw * n * pl.Dw, pt16 = vr16 + pw * n * pl.Dvw, dst16 = pt16 + pw * n * pl.Bw;
    k2 = dst16 + pw * n * pl.Bw, ds2 = k2 + pw * GroupPairs(pl.Bc) * pl.Dp;
    if (pl.amx) dsa = ds2 + GroupPairs(pl.Bc) * pl.Br;
  }
};

// K_j and V_j rows of keys [s0, s0 + bc); dK_j and dV_j zeroed, or (a later phase) what the earlier
// phases left in the caller's dK, dV.
template <typename E>
void LoadKV(const Plan& pl, Block<E>& k, bool first) {
  const auto& a = pl.p.args;
  const int64_t D = pl.p.D, Dv = pl.p.Dv;
  const float* ks = a.k.data + k.b * a.k.strides[0] + k.kvh * a.k.strides[1] + k.s0 * a.k.strides[2];
  const float* vs = a.v.data + k.b * a.v.strides[0] + k.kvh * a.v.strides[1] + k.s0 * a.v.strides[2];
  pack_rows(ks, a.k.strides[2], a.k.strides[3], k.bc, D, pl.Dp, k.kr);
  pack_rows(vs, a.v.strides[2], a.v.strides[3], k.bc, Dv, pl.Dvp, k.vr);
  if (pl.bf16) {  // the pairs from the fp32 rows: along each row (K, V), and across two (K), whole groups
    for (int64_t s = 0; s < k.bc; ++s) {
      E* kw = k.kr16 + pl.pw * s * pl.Dw;
      E* vw = k.vr16 + pl.pw * s * pl.Dvw;
      PairRow(k.kr + s * pl.Dp, pl.Dp, kw, pl.Dw);
      PairRow(k.vr + s * pl.Dvp, pl.Dvp, vw, pl.Dvw);
      ChainRowsIf(pl.dp, kw, pl.Dw, 1, 1), ChainRowsIf(pl.dp, vw, pl.Dvw, 1, 1);
    }
    PairRowsOf(k.kr, k.bc, pl.Dp, pl.Dp, k.k2, pl.Dp, GroupPairs(k.bc));
    ChainRowsIf(pl.dp, k.k2, GroupPairs(k.bc), pl.Dp, pl.Dp);
  }
  if (first) {
    std::fill(k.dk, k.dk + pl.Bc * pl.Dp, 0.f);
    std::fill(k.dv, k.dv + pl.Bc * pl.Dvp, 0.f);
    return;
  }
  const auto& GK = pl.g.dk;
  const auto& GV = pl.g.dv;
  pack_rows(GK.data + k.b * GK.strides[0] + k.kvh * GK.strides[1] + k.s0 * GK.strides[2], GK.strides[2],
            GK.strides[3], k.bc, D, pl.Dp, k.dk);
  pack_rows(GV.data + k.b * GV.strides[0] + k.kvh * GV.strides[1] + k.s0 * GV.strides[2], GV.strides[2],
            GV.strides[3], k.bc, Dv, pl.Dvp, k.dv);
}

// y[d·stride] = scale·x[d] for d < n; whole vectors where y has unit stride.
void StoreRow(const float* x, int64_t n, float scale, float* y, int64_t stride) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), vec_end = stride == 1 ? n / N * N : 0;
  for (int64_t d = 0; d < vec_end; d += N) hn::StoreU(hn::Mul(hn::Set(df, scale), hn::LoadU(df, x + d)), df, y + d);
  for (int64_t d = vec_end; d < n; ++d) y[d * stride] = scale * x[d];
}

// x[0, n) = 0, n a multiple of the lanes: a few vector stores (std::fill calls memset, slow for short rows).
void ZeroRow(float* x, int64_t n) {
  const DF df;
  for (int64_t i = 0; i < n; i += static_cast<int64_t>(hn::Lanes(df))) hn::StoreU(hn::Zero(df), df, x + i);
}

// dK = scale·dSᵀ·Q (or, before the last phase, dSᵀ·Q as it is) and dV of the block into g.
template <typename E>
void StoreKV(const Plan& pl, const Block<E>& k, bool last) {
  const auto& GK = pl.g.dk;
  const auto& GV = pl.g.dv;
  const float scale = last ? float(pl.p.scale) : 1.f;
  float* gk = GK.data + k.b * GK.strides[0] + k.kvh * GK.strides[1] + k.s0 * GK.strides[2];
  float* gv = GV.data + k.b * GV.strides[0] + k.kvh * GV.strides[1] + k.s0 * GV.strides[2];
  for (int64_t s = 0; s < k.bc; ++s) {
    StoreRow(k.dk + s * pl.Dp, pl.p.D, scale, gk + s * GK.strides[2], GK.strides[3]);
    StoreRow(k.dv + s * pl.Dvp, pl.p.Dv, 1.f, gv + s * GV.strides[2], GV.strides[3]);
  }
}

// (bc, Br) tile = A (bc, depth) rows lda apart · (depth, N) panels: each block of kMR rows
// from the panel holding its first row's first visible query (hid), so the causal triangle costs little.
// bf16 (depth in positions of pairs E, whole groups): each sum times qscale (fp32 folds it into the panels: 1).
template <typename E, class Blk>
void QKFrom(const Plan& pl, const Blk& k, const E* a, int64_t lda, int64_t depth, const E* panels, int64_t np,
            float qscale, float* out) {
  const int64_t N = pl.N;
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if constexpr (std::is_same_v<E, uint32_t>)
    if (pl.amx) {  // 32 keys at a time, from the panel of the block's first visible query
      for (int64_t r = 0; r < k.bc; r += 32) {
        const int64_t j0 = k.hid[r] / N;
        if (j0 < np)
          QKAmx(a + r * lda, std::min<int64_t>(32, k.bc - r), depth, panels + j0 * depth * N, np - j0, qscale,
                out + r * pl.Br + j0 * N, pl.Br, false);
      }
      return;
    }
#endif
  const int64_t nv = pl.bf16 ? kNV16<E> : kNV;
  for (int64_t j = 0; j < np; j += nv) {
    const int64_t je = std::min(np, j + nv);
    for (int64_t r = 0; r < k.bc; r += kMR) {
      const int64_t j0 = std::max(j, k.hid[r] / N);
      if (j0 >= je) continue;
      const int64_t mr = std::min<int64_t>(kMR, k.bc - r);
      const E* b = panels + j0 * depth * N;
      if (pl.bf16)
        RunBlock<QK16Op, kMR, kNV16<E>>(mr, je - j0, a + r * lda, lda, b, depth * N, depth, qscale,
                                        out + r * pl.Br + j0 * N, pl.Br, false);
      else if constexpr (std::is_same_v<E, float>)
        QK(mr, je - j0, a + r * lda, lda, b, depth * N, depth, qscale, out + r * pl.Br + j0 * N, pl.Br, false);
    }
  }
}

// Pᵀ (bc, w) of query head r.h, queries [l0, l0 + w) (l0 from the unit's first row): Sᵀ = K_j·Q_iᵀ (log2
// units), softcapped (its derivative kept in dcap), plus log2e·(position biases + masks) (score_mod.h's
// order and arithmetic); -inf where a query does not see the key; Pᵀ = exp2(Sᵀ − LSE·log2e), written 0
// where not computed. Returns false when Pᵀ is all 0 (a fully masked tile: no gradient).
template <typename E>
bool ScoresT(const Plan& pl, Block<E>& k, const QHead<E>& r, int64_t l0, int64_t br, int64_t w) {
  const auto& p = pl.p;
  const DF df;
  const int64_t N = pl.N, lg = r.l_begin + l0;  // lg: the tile's first query in the head
  for (int64_t s = 0; s < k.bc; ++s) {
    const Range q = SeeingQueries(p, k.b, k.s0 + s, lg, w);  // [br, w) pads the tile: never seeing
    k.hid[s] = q.begin, k.vend[s] = std::min(q.end, br);
  }
  const int64_t pw = pl.pw;
  if (pl.bf16)
    QKFrom(pl, k, k.kr16, pw * pl.Dw, pw * pl.D2, r.qt16 + pw * l0 * pl.D2, w / N, float(p.scale) * kLog2e, k.st);
  else
    QKFrom(pl, k, k.kr, pl.Dp, p.D, r.qt + l0 * p.D, w / N, 1.f, k.st);
  if (p.has_softcap())
    for (int64_t s = 0; s < k.bc; ++s) {
      const int64_t ha = k.hid[s] / N * N;
      SoftcapRowGrad(k.st + s * pl.Br + ha, k.dcap + s * pl.Br + ha, w - ha, float(p.args.softcap) * kLog2e);
    }
  if (p.has_position_bias() || p.has_bias())
    for (int64_t l = 0; l < br; ++l) {
      const Range kr = VisibleKeys(p, k.b, lg + l, k.s0, k.bc);
      if (p.has_position_bias())
        for (int64_t s = kr.begin; s < kr.end; ++s) AddPositionBias(p, k.b, r.h, lg + l, k.s0 + s, k.st[s * pl.Br + l]);
      AddMaskRow(p, k.b, r.h, lg + l, k.s0 + kr.begin, kr.end - kr.begin, k.st + kr.begin * pl.Br + l, pl.Br);
    }
  VF any = hn::Zero(df);
  for (int64_t s = 0; s < k.bc; ++s) {
    float* x = k.st + s * pl.Br;
    const int64_t h = k.hid[s], ha = h / N * N;
    ZeroRow(x, ha);
    std::fill(x + ha, x + h, -kInf);
    std::fill(x + std::max(k.vend[s], ha), x + w, -kInf);  // queries past the last that sees it (window, documents)
    for (int64_t l = ha; l < w; l += N) {
      const VF e = hn::Sub(hn::LoadU(df, x + l), hn::LoadU(df, r.lse2 + l0 + l));
      const VF pv = pl.bf16 ? Exp2<true>(df, e) : Exp2<false>(df, e);  // as the forward made P
      hn::StoreU(pv, df, x + l);
      any = hn::Max(any, pv);
    }
  }
  return hn::GetLane(hn::MaxOfLanes(df, any)) != 0.f;
}

// dLoss/d(relative bias) of this tile's pairs, by distance: acc[d + S − 1] += dSᵀ (the scores' gradient, before
// the softcap's derivative) over each key's seeing queries, keys then queries in order, so the sum's order
// is the tile's and never the SIMD width's.
template <typename E>
void RelativeGrad(const Plan& pl, const Block<E>& k, const QHead<E>& r, int64_t l0, const float* ds, double* acc) {
  const auto& p = pl.p;
  const int64_t lg = r.l_begin + l0;
  for (int64_t s = 0; s < k.bc; ++s)
    for (int64_t l = k.hid[s]; l < k.vend[s]; ++l)
      acc[p.distance(k.b, lg + l, k.s0 + s) + p.S - 1] += ds[s * pl.Br + l];
}

// dPᵀ = V_j·dO_iᵀ; dSᵀ = Pᵀ ∘ (dPᵀ∘keep/(1-p) − D), and Pᵀ ← Pᵀ∘keep/(1-p) for dV. The keep tile is
// 1 with the dropped elements zeroed by DropRow, the forward's function, one query column at a time.
// bf16: Pᵀ and dSᵀ rounded straight to their pair words along queries, and dSᵀ to its pair rows along keys.
// With a relative bias, acc (by distance, this head's) gets dLoss/d(bias) (RelativeGrad); with a softcap,
// dSᵀ is then multiplied by its derivative (dcap).
template <typename E>
void GradScoresT(const Plan& pl, Block<E>& k, const QHead<E>& r, int64_t l0, int64_t br, int64_t w, double* acc) {
  const auto& p = pl.p;
  const DF df;
  const int64_t N = pl.N, lg = r.l_begin + l0, ld = pl.Br, pw = pl.pw;
  if (pl.bf16)
    QKFrom(pl, k, k.vr16, pw * pl.Dvw, pw * pl.Dv2, r.dot16 + pw * l0 * pl.Dv2, w / N, 1.f, k.dpt);
  else
    QKFrom(pl, k, k.vr, pl.Dvp, p.Dv, r.dot + l0 * p.Dv, w / N, 1.f, k.dpt);
  const bool drop = p.dropout();
  if (drop) {
    for (int64_t s = 0; s < k.bc; ++s) std::fill(k.keep + s * ld, k.keep + s * ld + w, 1.f);
    for (int64_t l = 0; l < br; ++l) {
      const Range kr = VisibleKeys(p, k.b, lg + l, k.s0, k.bc);
      DropRow(p, k.b, r.h, lg + l, k.s0 + kr.begin, kr.end - kr.begin, ld, k.keep + kr.begin * ld + l);
    }
  }
  const bool cap = p.has_softcap();
  const VF ks = hn::Set(df, p.keep_scale);
  // dSᵀ and P(_dropped)ᵀ of key row s, queries [q, q + N)
  const auto grad = [&](int64_t s, int64_t q, VF& ds, VF& pd) {
    const VF pv = hn::LoadU(df, k.st + s * ld + q);
    const VF dp = hn::LoadU(df, k.dpt + s * ld + q);
    const VF kp = drop ? hn::Mul(hn::LoadU(df, k.keep + s * ld + q), ks) : hn::Set(df, 1.f);  // keep/(1-p)
    ds = hn::Mul(pv, hn::Sub(hn::Mul(dp, kp), hn::LoadU(df, r.dsum + l0 + q)));
    pd = drop ? hn::Mul(pv, kp) : pv;
  };
  if (!pl.bf16) {
    for (int64_t s = 0; s < k.bc; ++s) {
      const int64_t ha = k.hid[s] / N * N;
      ZeroRow(k.dpt + s * ld, ha);
      for (int64_t q = ha; q < w; q += N) {
        VF ds, pd;
        grad(s, q, ds, pd);
        hn::StoreU(ds, df, k.dpt + s * ld + q);
        if (drop) hn::StoreU(pd, df, k.st + s * ld + q);
      }
    }
    if (acc) RelativeGrad(pl, k, r, l0, k.dpt, acc);
    if (cap)  // through x' = c·tanh(x/c): dx = dS·(1 − tanh²)
      for (int64_t s = 0; s < k.bc; ++s)
        for (int64_t q = k.hid[s] / N * N; q < w; q += N)
          hn::StoreU(hn::Mul(hn::LoadU(df, k.dpt + s * ld + q), hn::LoadU(df, k.dcap + s * ld + q)), df,
                     k.dpt + s * ld + q);
    return;
  }
  // bf16: two key rows by 2N queries at a time, straight to the pairs (no fp32 tile written): rows s and
  // s + 1 of dSᵀ's pair rows, and of each row Pᵀ's and dSᵀ's pairs along queries. 0 below a row's causal edge
  // (ha, as the fp32 tile's ZeroRow), past w up to whole groups (wg) and for a missing row s + 1.
  const int64_t wg = 2 * GroupPairs(br), kg = GroupPairs(k.bc);
  const bool ne = UseNe();  // P and dS: computed under FTZ
  for (int64_t s = 0; s < k.bc; s += 2) {
    const int64_t rows = std::min<int64_t>(2, k.bc - s),
                  ha[2] = {k.hid[s] / N * N, rows == 2 ? k.hid[s + 1] / N * N : w};
    for (int64_t l = 0; l < wg; l += 2 * N) {
      VF ds[2][2], pd[2][2];
      for (int i = 0; i < 2; ++i)
        for (int c = 0; c < 2; ++c) {
          const int64_t q = l + c * N;
          ds[i][c] = pd[i][c] = hn::Zero(df);
          if (i < rows && q < w && q >= ha[i]) {
            grad(s + i, q, ds[i][c], pd[i][c]);
            if (acc) hn::StoreU(ds[i][c], df, k.dpt + (s + i) * ld + q);  // for RelativeGrad, read above
            if (cap) ds[i][c] = hn::Mul(ds[i][c], hn::LoadU(df, k.dcap + (s + i) * ld + q));
          }
        }
      for (int i = 0; i < rows; ++i) {
        StorePairs(pd[i][0], pd[i][1], k.pt16 + pw * ((s + i) * pl.Bw + l / 2), ne);
        StorePairs(ds[i][0], ds[i][1], k.dst16 + pw * ((s + i) * pl.Bw + l / 2), ne);
      }
      for (int c = 0; c < 2; ++c) StoreAcross(ds[0][c], ds[1][c], k.ds2 + pw * (s / 2) * pl.Br + l + c * N, pl.Br);
    }
    for (int64_t i = s; i < s + rows; ++i)
      ChainRowsIf(pl.dp, k.pt16 + pw * i * pl.Bw, GroupPairs(br), 1, 1),
          ChainRowsIf(pl.dp, k.dst16 + pw * i * pl.Bw, GroupPairs(br), 1, 1);
  }
  // dSᵀ's pair rows past the keys, up to whole groups: zero (a chained pair of rows is rewritten whole)
  for (int64_t i = (k.bc + 1) / 2; i < kg; ++i) std::fill(k.ds2 + pw * i * pl.Br, k.ds2 + pw * (i + 1) * pl.Br, E(0));
  ChainRowsIf(pl.dp, k.ds2, kg, pl.Br, wg);
  if (acc) RelativeGrad(pl, k, r, l0, k.dpt, acc);
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if constexpr (std::is_same_v<E, uint32_t>)
    if (pl.amx)  // dS along keys for dQ's A tiles: the words of ds2 transposed, 16 x 16 at a time
      for (int64_t i = 0; i < kg; i += 16)
        for (int64_t l = 0; l < wg; l += 16)
          Transpose16(reinterpret_cast<const float*>(k.ds2 + i * pl.Br + l), pl.Br, 16, 16, 1.f,
                      reinterpret_cast<float*>(k.dsa + l * kg + i), kg);
#endif
}

// dV_j += P_droppedᵀ · dO_i;  dK_j += dSᵀ · Q_i;  dQ_i += dS · K_j. Each block of kMR keys (dV, dK) starts
// at its first row's first visible query and each block of kMR queries (dQ) ends at its last row's causal
// edge: the terms skipped are zeros at the start or the end of a sum, so every sum keeps its bits. bf16:
// a key block starts at the group of queries holding its first (groups stay where the sum's start puts
// them), a query block ends at the group of keys holding its edge (the extra terms are P = 0 or dS = 0 times
// a finite value, or zero rows of padding).
template <typename E>
void Products(const Plan& pl, Block<E>& k, const QHead<E>& r, int64_t l0, int64_t br) {
  const auto& p = pl.p;
  const int64_t N = pl.N, lg = r.l_begin + l0, even = pl.bf16 ? 2 * kGroupPairs : 1;
  // f(s, c, mr, nv, q0) for each block of keys [s, s + mr) x vectors [c, c + nv) of width: its first query q0
  const int64_t NV = pl.bf16 ? kNV16<E> : kNV;  // vectors per block
  const auto key_blocks = [&](int64_t width, auto&& f) {
    for (int64_t c = 0; c < width / N; c += NV)
      for (int64_t s = 0; s < k.bc; s += kMR) {
        const int64_t q0 = k.hid[s] / even * even;
        if (q0 < br) f(s, c, std::min<int64_t>(kMR, k.bc - s), std::min<int64_t>(NV, width / N - c), q0);
      }
  };
  // f(l, c, mr, nv, n) for each block of queries [l, l + mr) x vectors [c, c + nv) of Dp: n keys its last row sees
  const auto query_blocks = [&](auto&& f) {
    for (int64_t c = 0; c < pl.Dp / N; c += NV)
      for (int64_t l = 0; l < br; l += kMR) {
        const int64_t mr = std::min<int64_t>(kMR, br - l), n = VisibleKeys(p, k.b, lg + l + mr - 1, k.s0, k.bc).end;
        if (n > 0) f(l, c, mr, std::min<int64_t>(NV, pl.Dp / N - c), n);
      }
  };
  float* dq = r.dq + l0 * pl.Dp;
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if constexpr (std::is_same_v<E, uint32_t>)
    if (pl.amx) {  // 32 keys (dV, dK) or queries (dQ) at a time; O = C in the caller's accumulators
      const int64_t kg = GroupPairs(k.bc);
      for (int64_t s = 0; s < k.bc; s += 32) {
        const int64_t q0 = k.hid[s] / even * even, rows = std::min<int64_t>(32, k.bc - s);
        if (q0 >= br) continue;
        const int64_t n = GroupPairs(br) - q0 / 2;
        PVAmx(k.pt16 + s * pl.Bw + q0 / 2, rows, pl.Bw, r.do2 + (l0 + q0) / 2 * pl.Dvp, n, k.dv + s * pl.Dvp, pl.Dvp,
              nullptr);
        PVAmx(k.dst16 + s * pl.Bw + q0 / 2, rows, pl.Bw, r.q2 + (l0 + q0) / 2 * pl.Dp, n, k.dk + s * pl.Dp, pl.Dp,
              nullptr);
      }
      for (int64_t l = 0; l < br; l += 32) {
        const int64_t mr = std::min<int64_t>(32, br - l), n = VisibleKeys(p, k.b, lg + l + mr - 1, k.s0, k.bc).end;
        if (n > 0) PVAmx(k.dsa + l * kg, mr, kg, k.k2, GroupPairs(n), dq + l * pl.Dp, pl.Dp, nullptr);
      }
      return;
    }
#endif
  if (pl.bf16) {  // depths in positions of pairs E (pw a pair), whole groups
    const int64_t pw = pl.pw;
    const auto keys_by_queries = [&](const E* a, const E* rows, int64_t ldr, float* acc, int64_t width) {
      key_blocks(width, [&](int64_t s, int64_t c, int64_t mr, int64_t nv, int64_t q0) {
        RunBlock<PV16Op<false>, kMR, kNV16<E>>(mr, nv, a + pw * (s * pl.Bw + q0 / 2), pw * pl.Bw,
                                               rows + pw * ((l0 + q0) / 2) * ldr + c * N, ldr,
                                               pw * (GroupPairs(br) - q0 / 2), acc + s * width + c * N, width, nullptr);
      });
    };
    keys_by_queries(k.pt16, r.do2, pl.Dvp, k.dv, pl.Dvp);
    keys_by_queries(k.dst16, r.q2, pl.Dp, k.dk, pl.Dp);
    query_blocks([&](int64_t l, int64_t c, int64_t mr, int64_t nv, int64_t n) {
      RunBlock<PV16Op<true>, kMR, kNV16<E>>(mr, nv, k.ds2 + l, pl.Br, k.k2 + c * N, pl.Dp, pw * GroupPairs(n),
                                            dq + l * pl.Dp + c * N, pl.Dp, nullptr);
    });
    return;
  }
  const auto keys_by_queries = [&](const float* a, const float* rows, int64_t ldr, float* acc, int64_t width) {
    key_blocks(width, [&](int64_t s, int64_t c, int64_t mr, int64_t nv, int64_t q0) {
      PV(mr, nv, a + s * pl.Br + q0, pl.Br, rows + q0 * ldr + c * N, ldr, br - q0, acc + s * width + c * N, width,
         nullptr);
    });
  };
  keys_by_queries(k.st, r.dout + l0 * r.lddo, r.lddo, k.dv, pl.Dvp);
  keys_by_queries(k.dpt, r.q + l0 * r.ldq, r.ldq, k.dk, pl.Dp);
  query_blocks([&](int64_t l, int64_t c, int64_t mr, int64_t nv, int64_t n) {
    PV<kNV, true>(mr, nv, k.dpt + l, pl.Br, k.kr + c * N, pl.Dp, n, dq + l * pl.Dp + c * N, pl.Dp, nullptr);
  });
}

// One KV block against every query tile of the phase's units [u0, u1) (in order: head within the group,
// then segment): dK_j, dV_j accumulated, dQ partials of chunk c accumulated.
// acc: with a relative bias, this task's dLoss/d(bias) by distance, (G, L + S − 1), else nullptr.
template <typename E>
void BlockTask(const Plan& pl, Block<E>& k, int64_t c, int64_t u0, int64_t u1, bool first, bool last, double* acc) {
  const auto& p = pl.p;
  // Do queries [lb, le) see a key of the block? (causal, windows, documents: many may not)
  const auto sees = [&](int64_t lb, int64_t le) {
    return le > lb && p.keys(k.b, le - 1).end > k.s0 && p.keys(k.b, lb).begin < k.s0 + k.bc;
  };
  bool seen = false;
  for (int64_t u = u0; u < u1 && !seen; ++u) {
    const int64_t lb = u % pl.nseg * pl.Ls;
    seen = sees(lb, std::min(p.L, lb + pl.Ls));
  }
  if (!seen && !first && !last) return;  // dK_j, dV_j wait in g unchanged
  LoadKV(pl, k, first);
  for (int64_t u = u0; u < u1; ++u) {
    const QHead<E> r = pl.head<E>(k.b, k.kvh, u, u - u0, c);
    double* hacc = acc ? acc + (r.h - p.first_head(k.kvh)) * (p.L + p.S - 1) : nullptr;
    for (int64_t l0 = 0; l0 < r.l_end - r.l_begin; l0 += pl.Br) {
      const int64_t br = std::min(pl.Br, r.l_end - r.l_begin - l0), w = round_up(br, pl.N);
      if (!sees(r.l_begin + l0, r.l_begin + l0 + br)) continue;  // no query of the tile sees a key of the block
      if (!ScoresT(pl, k, r, l0, br, w)) continue;
      GradScoresT(pl, k, r, l0, br, w, hacc);
      Products(pl, k, r, l0, br);
    }
  }
  StoreKV(pl, k, last);
}

// dQ = scale · Σ_c partial_c (in the order c = 0, 1, ...) of unit u (the ju-th of its phase) of group (b, kvh).
void StoreDq(const Plan& pl, int64_t b, int64_t kvh, int64_t u, int64_t ju) {
  const auto& p = pl.p;
  const auto& GQ = pl.g.dq;
  const DF df;
  const int64_t N = pl.N;
  const float scale = float(p.scale);
  const QHead<float> r = pl.head(b, kvh, u, ju, 0);
  const int64_t chunk = p.B * p.Hkv * pl.per_phase * pl.Ls * pl.Dp;  // floats between two chunks' partials
  const int64_t vec_end = GQ.strides[3] == 1 ? p.D / N * N : 0;       // columns stored a vector at a time
  float* gq = GQ.data + b * GQ.strides[0] + r.h * GQ.strides[1] + r.l_begin * GQ.strides[2];
  for (int64_t l = 0; l < r.l_end - r.l_begin; ++l) {
    const float* x = r.dq + l * pl.Dp;
    float* y = gq + l * GQ.strides[2];
    for (int64_t d = 0; d < vec_end; d += N) {
      VF sum = hn::Zero(df);
      for (int64_t c = 0; c < pl.C; ++c) sum = hn::Add(sum, hn::LoadU(df, x + c * chunk + d));
      hn::StoreU(hn::Mul(hn::Set(df, scale), sum), df, y + d);
    }
    for (int64_t d = vec_end; d < p.D; ++d) {
      float sum = 0;
      for (int64_t c = 0; c < pl.C; ++c) sum += x[c * chunk + d];
      y[d * GQ.strides[3]] = scale * sum;
    }
  }
}

// f(E*{}) with the plan's kind of bf16 pairs E: pair words where VDPBF16PS runs, else floats (fp32 too).
template <class F>
void WithPairs(const Plan& pl, F&& f) {
  if constexpr (kDpTarget)
    if (pl.amx || pl.dp) return f(static_cast<uint32_t*>(nullptr));
  f(static_cast<float*>(nullptr));
}

void Backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g, Precision precision) {
  if (p.B == 0 || p.H == 0) return;
  Plan pl(p, dout, g, precision);
  const int64_t groups = p.B * p.Hkv, size = Block<float>::size(pl), size16 = Block<float>::size16(pl);
  const int64_t T = num_threads();
  Scratch scratch(Scratch::bytes_of<float>(pl.n_packed) + Scratch::bytes_of<uint32_t>(pl.n_packed16) +
                  Scratch::bytes_of<float>(pl.n_dq) + Scratch::bytes_of<float>(T * size) +
                  Scratch::bytes_of<uint32_t>(T * size16));
  pl.packed = scratch.take<float>(pl.n_packed), pl.packed16 = scratch.take<uint32_t>(pl.n_packed16);  // or floats
  pl.dq = scratch.take<float>(pl.n_dq);
  float* bufs = scratch.take<float>(T * size);  // one Block per worker
  uint32_t* bufs16 = scratch.take<uint32_t>(T * size16);  // pair words or floats
  std::vector<int64_t> hids(static_cast<size_t>(num_threads() * 2 * pl.Bc));              // Block::hid, vend
  std::vector<float> ots(static_cast<size_t>(num_threads() * p.Dv * pl.N));               // PackUnit's O panel
  // The relative bias's gradient by distance: each task's (G, L + S − 1), summed into buckets at the end.
  const bool drel = !g.drelative_bias.empty();
  const int64_t nd = p.L + p.S - 1, per_task = p.G * nd;
  std::vector<double> rel_acc(drel ? size_t(groups * pl.C * per_task) : 0, 0.0);
  const int64_t nphase = (pl.units + pl.per_phase - 1) / pl.per_phase;
  for (int64_t ph = 0; ph < nphase; ++ph) {
    const int64_t u0 = ph * pl.per_phase, u1 = std::min(pl.units, u0 + pl.per_phase), nu = u1 - u0;
    parallel_items(groups * nu, pl.Ls * (p.D + 2 * p.Dv) * 2, [&](int64_t item, int worker) {
      const pairs::FlushSubnormals flush(pl.bf16);  // bf16: every fp32 step as VDPBF16PS rounds (the header)
      const int64_t pair = item / nu, ju = item % nu;
      WithPairs(pl, [&](auto* e) {
        PackUnit<std::remove_pointer_t<decltype(e)>>(pl, pair / p.Hkv, pair % p.Hkv, u0 + ju, ju,
                                                     ots.data() + worker * p.Dv * pl.N);
      });
    });
    // KV blocks outer (task (b, kvh, c) takes blocks j ≡ c mod C), Q tiles inner
    const int64_t cost = (pl.nkv + pl.C - 1) / pl.C * pl.Bc * nu * pl.Ls * (p.D + p.Dv) * 3;
    parallel_items(groups * pl.C, cost, [&](int64_t item, int worker) {
      const pairs::FlushSubnormals flush(pl.bf16);
      [[maybe_unused]] const std::optional<amx::Tiles> tiles = pl.amx ? std::make_optional<amx::Tiles>() : std::nullopt;
      WithPairs(pl, [&](auto* e) {
        using E = std::remove_pointer_t<decltype(e)>;
        Block<E> k(pl, bufs + worker * size, pl.bf16 ? reinterpret_cast<E*>(bufs16 + worker * size16) : nullptr,
                   hids.data() + worker * 2 * pl.Bc);
        k.b = item / (p.Hkv * pl.C), k.kvh = item / pl.C % p.Hkv;
        const int64_t c = item % pl.C;
        for (int64_t ju = 0; ju < nu; ++ju) {
          float* dq = pl.head(k.b, k.kvh, u0 + ju, ju, c).dq;
          std::fill(dq, dq + pl.Ls * pl.Dp, 0.f);
        }
        for (int64_t j = c; j < pl.nkv; j += pl.C) {
          k.s0 = j * pl.Bc, k.bc = std::min(pl.Bc, p.S - k.s0);
          BlockTask(pl, k, c, u0, u1, ph == 0, ph == nphase - 1, drel ? rel_acc.data() + item * per_task : nullptr);
        }
        if (pl.C == 1)  // the task owns its heads' dQ rows
          for (int64_t ju = 0; ju < nu; ++ju) StoreDq(pl, k.b, k.kvh, u0 + ju, ju);
      });
    });
    if (pl.C > 1)
      parallel_items(groups * nu, pl.Ls * p.D * pl.C, [&](int64_t item, int) {
        const pairs::FlushSubnormals flush(pl.bf16);
        StoreDq(pl, item / nu / p.Hkv, item / nu % p.Hkv, u0 + item % nu, item % nu);
      });
  }
  if (drel) {  // per head: the tasks (b, chunk) in order, each by distance in order, into the buckets
    const View<float>& dt = g.drelative_bias;
    const int64_t nb = dt.shape[0];
    std::vector<double> sum(static_cast<size_t>(nb));
    for (int64_t h = 0; h < p.H; ++h) {
      std::fill(sum.begin(), sum.end(), 0.0);
      const int64_t kvh = p.kv_head(h);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t c = 0; c < pl.C; ++c) {
          const double* a = rel_acc.data() + ((b * p.Hkv + kvh) * pl.C + c) * per_task + (h - p.first_head(kvh)) * nd;
          for (int64_t i = 0; i < nd; ++i) sum[size_t(p.relative_bucket[size_t(i)])] += a[i];
        }
      for (int64_t i = 0; i < nb; ++i) dt.data[i * dt.strides[0] + h * dt.strides[1]] = float(sum[size_t(i)]);
    }
  }
}

}  // namespace
}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace flash {
HWY_EXPORT(Backward);
}  // namespace flash

void flash_backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g,
                    Precision precision) {
  HWY_DYNAMIC_DISPATCH(flash::Backward)(p, dout, g, precision);
}

namespace {
FlashTiles g_forced_backward;  // set_flash_backward_tiles; 0 = derived
}  // namespace

// keys: 96 per block (64x64 to 128x192 tiles measured within noise on 1 MiB L2), or all of a shorter S;
// queries: 128 per tile, or all of a shorter L, so a small problem is one tile padded to the lanes only.
FlashTiles flash_backward_tiles(int64_t L, int64_t S) {
  constexpr int64_t kKeys = 96, kQueries = 128, kScratch = 8 << 20;  // 32 MB of floats
  const FlashTiles& f = g_forced_backward;
  FlashTiles t;
  t.keys = f.keys > 0 ? f.keys : std::clamp<int64_t>(S, 1, kKeys);
  t.rows = f.rows > 0 ? f.rows : std::clamp<int64_t>(L, 1, kQueries);
  t.scratch = f.scratch > 0 ? f.scratch : kScratch;
  return t;
}

void set_flash_backward_tiles(FlashTiles t) { g_forced_backward = t; }

}  // namespace attn
#endif  // HWY_ONCE
