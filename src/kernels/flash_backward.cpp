// FlashAttention-2 backward on the CPU, fp32: dQ, dK, dV without materializing the (L, S) weights.
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
//   dQ_iᵀ (D, Br) += K_jᵀ · dSᵀ                 PV: Kᵀ rows x dSᵀ rows        (· scale at the end)
//
// Determinism for any thread count: a task is (b, KV head, chunk c of the KV blocks, j ≡ c mod C), C a
// function of the sizes only. A task owns dK/dV of its blocks (summed over the group's query heads in
// order) and writes dQ into its chunk's own partial buffer; the C partials are summed in the order c = 0, 1, ...
//
// Sections, one function each: PackQueryHeads (Qᵀ, dOᵀ panels, LSE·log2e, D), then per task KV block
// j: LoadKV, per query tile ScoresT (Sᵀ, masks, causal edge, Pᵀ) and GradScoresT (dPᵀ, dropout, dSᵀ),
// the three accumulating products, StoreKV; finally SumDq. Masks, the causal edge and dropout are
// mask.h and dropout.h over SdpaProblem, the same calls the forward makes.
#include <algorithm>
#include <cstring>
#include <limits>
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
#include "mask.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {
namespace {

constexpr int64_t kBr = 128;  // queries per tile (columns of the transposed tiles), a multiple of kNV·N
constexpr int64_t kBc = 96;   // keys per tile (rows), a multiple of kMR (64x64 to 128x192 measured within noise)
constexpr int64_t kMinTasks = 16;  // split each KV head's blocks into chunks until there are this many tasks
constexpr float kInf = std::numeric_limits<float>::infinity();

// What the backward needs of query head (b, h), packed once: (Lp = L rounded up to kBr)
struct QHead {
  float* qt;          // (Lp/N, D, N) Qᵀ panels · scale·log2e
  float* dot;         // (Lp/N, Dv, N) dOᵀ panels
  float* lse2;        // (Lp) LSE·log2e; +inf on a fully masked row and past L, so P = exp2(x − lse2) = 0 there
  float* dsum;        // (Lp) D = rowsum(dO∘O); 0 past L
  const float* q;     // (L, Dp) Q rows, unscaled, row stride ldq: the caller's when they fit, else packed
  const float* dout;  // (L, Dvp) dO rows, row stride lddo: likewise
  int64_t ldq, lddo;
};

// The sizes and buffers every section shares.
struct Plan {
  const SdpaProblem<float>& p;
  View<const float> dout;  // (B, H, L, Dv)
  const SdpaGrads<float>& g;
  int64_t N, Lp, Dp, Dvp, nq, nkv, C;  // lanes; padded L, D, Dv; query tiles, KV blocks, chunks per KV head
  bool q_in_place, dout_in_place;      // Q and dO rows read where they are
  int64_t per_head;                    // floats of packed data per query head
  hwy::AlignedFreeUniquePtr<float[]> packed;  // (B, H, per_head)
  hwy::AlignedFreeUniquePtr<float[]> dqt;     // (C, B, H, nq, D, kBr) the blocked dQᵀ partial of each chunk

  Plan(const SdpaProblem<float>& p_, View<const float> dout_, const SdpaGrads<float>& g_) : p(p_), dout(dout_), g(g_) {
    N = static_cast<int64_t>(hn::Lanes(DF()));
    Lp = round_up(p.L, kBr), Dp = round_up(p.D, N), Dvp = round_up(p.Dv, N);
    nq = Lp / kBr, nkv = (p.S + kBc - 1) / kBc;
    // chunks per KV head: a function of the sizes only, never of the thread count
    C = std::max<int64_t>(1, std::min((kMinTasks + p.B * p.Hkv - 1) / (p.B * p.Hkv), nkv));
    // Q and dO rows are read in place when they have unit column stride and no padding is needed.
    q_in_place = p.args.q.strides[3] == 1 && p.D == Dp, dout_in_place = dout.strides[3] == 1 && p.Dv == Dvp;
    per_head = Lp * (p.D + p.Dv + 2) + (q_in_place ? 0 : p.L * Dp) + (dout_in_place ? 0 : p.L * Dvp);
    packed = hwy::AllocateAligned<float>(static_cast<size_t>(std::max<int64_t>(1, p.B * p.H * per_head)));
    dqt = hwy::AllocateAligned<float>(static_cast<size_t>(std::max<int64_t>(1, C * p.B * p.H * nq * p.D * kBr)));
  }
  QHead head(int64_t b, int64_t h) const {
    const auto& a = p.args;
    float* x = packed.get() + (b * p.H + h) * per_head;
    QHead r;
    r.qt = x, x += Lp * p.D;
    r.dot = x, x += Lp * p.Dv;
    r.lse2 = x, x += Lp;
    r.dsum = x, x += Lp;
    r.q = q_in_place ? a.q.data + b * a.q.strides[0] + h * a.q.strides[1] : x;
    r.ldq = q_in_place ? a.q.strides[2] : Dp;
    x += q_in_place ? 0 : p.L * Dp;
    r.dout = dout_in_place ? dout.data + b * dout.strides[0] + h * dout.strides[1] : x;
    r.lddo = dout_in_place ? dout.strides[2] : Dvp;
    return r;
  }
  float* dqt_block(int64_t c, int64_t b, int64_t h, int64_t i) const {
    return dqt.get() + (((c * p.B + b) * p.H + h) * nq + i) * p.D * kBr;
  }
};

// Per query head: Qᵀ·scale·log2e and dOᵀ panels, Q and dO rows where they can't be read in place,
// LSE·log2e, and D = rowsum(dO∘O).
void PackQueryHeads(const Plan& pl) {
  const auto& p = pl.p;
  const auto& a = p.args;
  const int64_t L = p.L, D = p.D, Dv = p.Dv, N = pl.N;
  const float c2 = float(p.scale) * kLog2e;
  parallel_items(p.B * p.H, L * (D + Dv) * 3, [&](int64_t bh, int) {
    const int64_t b = bh / p.H, h = bh % p.H;
    QHead r = pl.head(b, h);
    const float* q = a.q.data + b * a.q.strides[0] + h * a.q.strides[1];
    const float* dO = pl.dout.data + b * pl.dout.strides[0] + h * pl.dout.strides[1];
    const auto& O = p.out.out;
    const auto& lse = p.out.lse;
    const int64_t filled = round_up(L, N);  // pack_panels writes the panels of [0, L), padding included
    pack_panels(q, a.q.strides[2], a.q.strides[3], L, D, N, r.qt);
    std::fill(r.qt + filled * D, r.qt + pl.Lp * D, 0.f);
    for (int64_t i = 0; i < filled * D; ++i) r.qt[i] *= c2;
    pack_panels(dO, pl.dout.strides[2], pl.dout.strides[3], L, Dv, N, r.dot);
    std::fill(r.dot + filled * Dv, r.dot + pl.Lp * Dv, 0.f);
    if (!pl.q_in_place) pack_rows(q, a.q.strides[2], a.q.strides[3], L, D, pl.Dp, const_cast<float*>(r.q));
    if (!pl.dout_in_place)
      pack_rows(dO, pl.dout.strides[2], pl.dout.strides[3], L, Dv, pl.Dvp, const_cast<float*>(r.dout));
    for (int64_t l = 0; l < pl.Lp; ++l) {
      if (l >= L) {
        r.lse2[l] = kInf, r.dsum[l] = 0.f;
        continue;
      }
      const float m = lse.data[b * lse.strides[0] + h * lse.strides[1] + l * lse.strides[2]];
      r.lse2[l] = m == -kInf ? kInf : m * kLog2e;
      const float* o = O.data + b * O.strides[0] + h * O.strides[1] + l * O.strides[2];
      float s = 0;
      for (int64_t e = 0; e < Dv; ++e) s += r.dout[l * r.lddo + e] * o[e * O.strides[3]];
      r.dsum[l] = s;
    }
  });
}

// Per-worker scratch of one KV block and one (keys, queries) tile.
struct Block {
  float* kr;   // (kBc, D) K_j rows
  float* kt;   // (D, kBc) K_jᵀ
  float* vr;   // (kBc, Dv) V_j rows
  float* dk;   // (kBc, Dp) dK_j / scale
  float* dv;   // (kBc, Dvp) dV_j
  float* st;   // (kBc, kBr) Sᵀ, then P(_dropped)ᵀ
  float* dpt;  // (kBc, kBr) dPᵀ, then dSᵀ
  float* keep; // (kBc, kBr) 1 where kept, 0 where dropped (dropout only)
  int64_t b, kvh, s0, bc;  // keys [s0, s0 + bc) of KV head (b, kvh)
  static int64_t size(const Plan& pl) {
    const auto& p = pl.p;
    return kBc * p.D * 2 + kBc * p.Dv + kBc * pl.Dp + kBc * pl.Dvp + 3 * kBc * kBr;
  }
  Block(const Plan& pl, float* x) {
    const auto& p = pl.p;
    kr = x, kt = kr + kBc * p.D, vr = kt + kBc * p.D, dk = vr + kBc * p.Dv, dv = dk + kBc * pl.Dp;
    st = dv + kBc * pl.Dvp, dpt = st + kBc * kBr, keep = dpt + kBc * kBr;
  }
};

// K_j and V_j rows (and K_jᵀ) of keys [s0, s0 + bc); dK_j and dV_j zeroed.
void LoadKV(const Plan& pl, Block& k) {
  const auto& a = pl.p.args;
  const int64_t D = pl.p.D, Dv = pl.p.Dv;
  const float* ks = a.k.data + k.b * a.k.strides[0] + k.kvh * a.k.strides[1] + k.s0 * a.k.strides[2];
  const float* vs = a.v.data + k.b * a.v.strides[0] + k.kvh * a.v.strides[1] + k.s0 * a.v.strides[2];
  pack_rows(ks, a.k.strides[2], a.k.strides[3], k.bc, D, D, k.kr);
  for (int64_t s = 0; s < k.bc; ++s)
    for (int64_t d = 0; d < D; ++d) k.kt[d * kBc + s] = k.kr[s * D + d];
  pack_rows(vs, a.v.strides[2], a.v.strides[3], k.bc, Dv, Dv, k.vr);
  std::fill(k.dk, k.dk + kBc * pl.Dp, 0.f);
  std::fill(k.dv, k.dv + kBc * pl.Dvp, 0.f);
}

// Pᵀ (bc, w) of query head h, queries [l0, l0 + w): Sᵀ = K_j·Q_iᵀ (log2 units) + log2e·bias;
// keys past a query's causal edge -inf; Pᵀ = exp2(Sᵀ − LSE·log2e). Returns false when Pᵀ is all 0
// (a fully masked tile: no gradient).
bool ScoresT(const Plan& pl, Block& k, const QHead& r, int64_t h, int64_t l0, int64_t br, int64_t w) {
  const auto& p = pl.p;
  const DF df;
  const int64_t N = pl.N;
  QKTile(k.kr, k.bc, p.D, r.qt + l0 * p.D, w / N, k.st, kBr, false);
  if (p.has_bias())
    for (int64_t l = 0; l < br; ++l) AddMaskRow(p, k.b, h, l0 + l, k.s0, k.bc, k.st + l, kBr);
  VF any = hn::Zero(df);
  for (int64_t s = 0; s < k.bc; ++s) {
    float* x = k.st + s * kBr;
    std::fill(x, x + HiddenQueries(p, k.s0 + s, l0, w), -kInf);
    for (int64_t l = 0; l < w; l += N) {
      const VF pv = Exp2(df, hn::Sub(hn::LoadU(df, x + l), hn::LoadU(df, r.lse2 + l0 + l)));
      hn::StoreU(pv, df, x + l);
      any = hn::Max(any, pv);
    }
  }
  return hn::GetLane(hn::MaxOfLanes(df, any)) != 0.f;
}

// dPᵀ = V_j·dO_iᵀ; dSᵀ = Pᵀ ∘ (dPᵀ∘keep/(1-p) − D), and Pᵀ ← Pᵀ∘keep/(1-p) for dV. The keep tile is
// 1 with the dropped elements zeroed by DropRow, the forward's function, one query column at a time.
void GradScoresT(const Plan& pl, Block& k, const QHead& r, int64_t h, int64_t l0, int64_t br, int64_t w) {
  const auto& p = pl.p;
  const DF df;
  const int64_t N = pl.N;
  QKTile(k.vr, k.bc, p.Dv, r.dot + l0 * p.Dv, w / N, k.dpt, kBr, false);
  const bool drop = p.dropout();
  if (drop) {
    std::fill(k.keep, k.keep + k.bc * kBr, 1.f);
    for (int64_t l = 0; l < br; ++l) DropRow(p, k.b, h, l0 + l, k.s0, k.bc, kBr, k.keep + l);
  }
  const VF ks = hn::Set(df, p.keep_scale);
  for (int64_t s = 0; s < k.bc; ++s)
    for (int64_t l = 0; l < w; l += N) {
      const VF pv = hn::LoadU(df, k.st + s * kBr + l);
      const VF dp = hn::LoadU(df, k.dpt + s * kBr + l);
      const VF kp = drop ? hn::Mul(hn::LoadU(df, k.keep + s * kBr + l), ks) : hn::Set(df, 1.f);  // keep/(1-p)
      hn::StoreU(hn::Mul(pv, hn::Sub(hn::Mul(dp, kp), hn::LoadU(df, r.dsum + l0 + l))), df, k.dpt + s * kBr + l);
      if (drop) hn::StoreU(hn::Mul(pv, kp), df, k.st + s * kBr + l);
    }
}

// dK = scale·dSᵀ·Q and dV of the block into g; both already summed over the group's query heads.
void StoreKV(const Plan& pl, const Block& k) {
  const auto& GK = pl.g.dk;
  const auto& GV = pl.g.dv;
  const float scale = float(pl.p.scale);
  float* gk = GK.data + k.b * GK.strides[0] + k.kvh * GK.strides[1] + k.s0 * GK.strides[2];
  float* gv = GV.data + k.b * GV.strides[0] + k.kvh * GV.strides[1] + k.s0 * GV.strides[2];
  for (int64_t s = 0; s < k.bc; ++s) {
    for (int64_t d = 0; d < pl.p.D; ++d) gk[s * GK.strides[2] + d * GK.strides[3]] = scale * k.dk[s * pl.Dp + d];
    for (int64_t e = 0; e < pl.p.Dv; ++e) gv[s * GV.strides[2] + e * GV.strides[3]] = k.dv[s * pl.Dvp + e];
  }
}

// One KV block against every query tile of every query head of its group: dK_j, dV_j complete, dQ
// partials of chunk c accumulated.
void BlockTask(const Plan& pl, Block& k, int64_t c) {
  const auto& p = pl.p;
  LoadKV(pl, k);
  for (int64_t h = p.first_head(k.kvh); h < p.first_head(k.kvh) + p.G; ++h) {
    const QHead r = pl.head(k.b, h);
    for (int64_t i = 0; i < pl.nq; ++i) {
      const int64_t l0 = i * kBr, br = std::min(kBr, p.L - l0), w = round_up(br, pl.N);
      if (p.key_end(l0 + br - 1) <= k.s0) continue;  // causal: the tile's last query sees no key of it
      if (!ScoresT(pl, k, r, h, l0, br, w)) continue;
      GradScoresT(pl, k, r, h, l0, br, w);
      // dV_j += P_droppedᵀ · dO_i;  dK_j += dSᵀ · Q_i;  dQ_iᵀ += K_jᵀ · dSᵀ
      PVTile(k.st, k.bc, kBr, r.dout + l0 * r.lddo, r.lddo, br, k.dv, pl.Dvp, nullptr);
      PVTile(k.dpt, k.bc, kBr, r.q + l0 * r.ldq, r.ldq, br, k.dk, pl.Dp, nullptr);
      PVTile(k.kt, p.D, kBc, k.dpt, kBr, k.bc, pl.dqt_block(c, k.b, h, i), kBr, nullptr);
    }
  }
  StoreKV(pl, k);
}

// dQ = scale · Σ_c partial_c, in the order c = 0, 1, ...
void SumDq(const Plan& pl) {
  const auto& p = pl.p;
  const auto& GQ = pl.g.dq;
  const float scale = float(p.scale);
  parallel_items(p.B * p.H * pl.nq, kBr * p.D * pl.C, [&](int64_t item, int) {
    const int64_t b = item / (p.H * pl.nq), h = item / pl.nq % p.H, i = item % pl.nq;
    const int64_t l0 = i * kBr, br = std::min(kBr, p.L - l0);
    float* gq = GQ.data + b * GQ.strides[0] + h * GQ.strides[1] + l0 * GQ.strides[2];
    for (int64_t d = 0; d < p.D; ++d)
      for (int64_t l = 0; l < br; ++l) {
        float sum = 0;
        for (int64_t c = 0; c < pl.C; ++c) sum += pl.dqt_block(c, b, h, i)[d * kBr + l];
        gq[l * GQ.strides[2] + d * GQ.strides[3]] = scale * sum;
      }
  });
}

void Backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g) {
  const Plan pl(p, dout, g);
  PackQueryHeads(pl);
  // KV blocks outer (task (b, kvh, c) takes blocks j ≡ c mod C), Q blocks inner
  const int64_t size = Block::size(pl);
  std::vector<float> bufs(size_t(num_threads() * size));  // one scratch per worker
  parallel_items(p.B * p.Hkv * pl.C, (pl.nkv + pl.C - 1) / pl.C * kBc * p.L * p.G * (p.D + p.Dv) * 3,
                 [&](int64_t item, int worker) {
    Block k(pl, bufs.data() + worker * size);
    k.b = item / (p.Hkv * pl.C), k.kvh = item / pl.C % p.Hkv;
    const int64_t c = item % pl.C;
    for (int64_t h = p.first_head(k.kvh); h < p.first_head(k.kvh) + p.G; ++h)
      std::fill(pl.dqt_block(c, k.b, h, 0), pl.dqt_block(c, k.b, h, pl.nq), 0.f);
    for (int64_t j = c; j < pl.nkv; j += pl.C) {
      k.s0 = j * kBc, k.bc = std::min(kBc, p.S - k.s0);
      BlockTask(pl, k, c);
    }
  });
  SumDq(pl);
}

}  // namespace
}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace flash {
HWY_EXPORT(Backward);
}  // namespace flash

void flash_backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g) {
  HWY_DYNAMIC_DISPATCH(flash::Backward)(p, dout, g);
}

}  // namespace attn
#endif  // HWY_ONCE
