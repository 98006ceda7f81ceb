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
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/flash_backward.cpp"  // found through include/; src/ is not on the path
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3  // as flash_forward.cpp: SSE4 is the portable SIMD target
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "attn/rng.h"
#include "attn/sdpa.h"
#include "attn/threads.h"
#include "flash_common.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {
namespace {

constexpr int64_t kBr = 128;  // queries per tile (columns of the transposed tiles), a multiple of kNV·N
constexpr int64_t kBc = 96;   // keys per tile (rows), a multiple of kMR (64x64 to 128x192 measured within noise)
constexpr int64_t kMinTasks = 16;  // split each KV head's blocks into chunks until there are this many tasks

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

void Backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  const auto& a = p.args;
  const int64_t L = p.L, S = p.S, D = p.D, Dv = p.Dv, group = p.H / p.Hkv;
  const int64_t Lp = round_up(L, kBr), Dp = round_up(D, N), Dvp = round_up(Dv, N);
  const int64_t nq = Lp / kBr, nkv = (S + kBc - 1) / kBc;
  // chunks per KV head: a function of the sizes only, never of the thread count
  const int64_t C = std::max(int64_t(1), std::min((kMinTasks + p.B * p.Hkv - 1) / (p.B * p.Hkv), nkv));
  const float scale = float(p.scale), c2 = float(p.scale) * kLog2e;
  const float inf = std::numeric_limits<float>::infinity();
  const uint32_t threshold = dropout_threshold(a.dropout_p);
  const uint64_t seed = a.seed;  // a local: lets the compiler hoist mix64(seed) out of the dropout loop
  const float keep_scale = a.dropout_p < 1 ? 1.f / float(1 - a.dropout_p) : 0.f;  // as the forward
  const bool causal = a.causal != Causal::none;
  const int64_t off = a.causal == Causal::bottom_right ? S - L : 0;  // causal: key s is seen by queries l >= s − off

  // ---- pack every query head ----
  // Q and dO rows are read in place when they have unit column stride and no padding is needed.
  const bool q_in_place = a.q.strides[3] == 1 && D == Dp, dout_in_place = dout.strides[3] == 1 && Dv == Dvp;
  const int64_t per_head = Lp * (D + Dv + 2) + (q_in_place ? 0 : L * Dp) + (dout_in_place ? 0 : L * Dvp);
  auto packed = hwy::AllocateAligned<float>(std::max<int64_t>(1, p.B * p.H * per_head));  // (B, H, per_head)
  auto head = [&](int64_t b, int64_t h) {
    float* x = packed.get() + (b * p.H + h) * per_head;
    QHead r;
    r.qt = x, x += Lp * D;
    r.dot = x, x += Lp * Dv;
    r.lse2 = x, x += Lp;
    r.dsum = x, x += Lp;
    r.q = q_in_place ? a.q.data + b * a.q.strides[0] + h * a.q.strides[1] : x;
    r.ldq = q_in_place ? a.q.strides[2] : Dp;
    x += q_in_place ? 0 : L * Dp;
    r.dout = dout_in_place ? dout.data + b * dout.strides[0] + h * dout.strides[1] : x;
    r.lddo = dout_in_place ? dout.strides[2] : Dvp;
    return r;
  };
  parallel_items(p.B * p.H, L * (D + Dv) * 3, [&](int64_t bh, int) {
      const int64_t b = bh / p.H, h = bh % p.H;
      QHead r = head(b, h);
      const float* q = a.q.data + b * a.q.strides[0] + h * a.q.strides[1];
      const float* dO = dout.data + b * dout.strides[0] + h * dout.strides[1];
      const auto& O = p.out.out;
      const auto& lse = p.out.lse;
      const int64_t filled = round_up(L, N);  // pack_panels writes the panels of [0, L), padding included
      pack_panels(q, a.q.strides[2], a.q.strides[3], L, D, N, r.qt);
      std::fill(r.qt + filled * D, r.qt + Lp * D, 0.f);
      for (int64_t i = 0; i < filled * D; ++i) r.qt[i] *= c2;
      pack_panels(dO, dout.strides[2], dout.strides[3], L, Dv, N, r.dot);
      std::fill(r.dot + filled * Dv, r.dot + Lp * Dv, 0.f);
      if (!q_in_place) pack_rows(q, a.q.strides[2], a.q.strides[3], L, D, Dp, const_cast<float*>(r.q));
      if (!dout_in_place) pack_rows(dO, dout.strides[2], dout.strides[3], L, Dv, Dvp, const_cast<float*>(r.dout));
      for (int64_t l = 0; l < Lp; ++l) {
        if (l >= L) {
          r.lse2[l] = inf, r.dsum[l] = 0.f;
          continue;
        }
        const float m = lse.data[b * lse.strides[0] + h * lse.strides[1] + l * lse.strides[2]];
        r.lse2[l] = m == -inf ? inf : m * kLog2e;
        const float* o = O.data + b * O.strides[0] + h * O.strides[1] + l * O.strides[2];
        float s = 0;
        for (int64_t e = 0; e < Dv; ++e) s += r.dout[l * r.lddo + e] * o[e * O.strides[3]];
        r.dsum[l] = s;
      }
  });

  // ---- dQ partials: (C, B, H, nq, D, kBr), the blocked dQᵀ of each chunk, zeroed by the task that owns it ----
  auto dqt = hwy::AllocateAligned<float>(std::max<int64_t>(1, C * p.B * p.H * nq * D * kBr));
  auto dqt_block = [&](int64_t c, int64_t b, int64_t h, int64_t i) {
    return dqt.get() + (((c * p.B + b) * p.H + h) * nq + i) * D * kBr;
  };

  // ---- KV blocks outer, Q blocks inner ----
  const int64_t buf_size = kBc * D * 2 + kBc * Dv + kBc * Dp + kBc * Dvp + 2 * kBc * kBr;
  std::vector<float> bufs(size_t(num_threads() * buf_size));  // one scratch per worker
  parallel_items(p.B * p.Hkv * C, (nkv + C - 1) / C * kBc * L * group * (D + Dv) * 3, [&](int64_t item, int worker) {
    const int64_t b = item / (p.Hkv * C), kvh = item / C % p.Hkv, c = item % C;
    float* kr = bufs.data() + worker * buf_size;  // (kBc, D) K_j rows
    float* kt = kr + kBc * D;     // (D, kBc) K_jᵀ
    float* vr = kt + kBc * D;     // (kBc, Dv) V_j rows
    float* dk = vr + kBc * Dv;    // (kBc, Dp) dK_j / scale
    float* dv = dk + kBc * Dp;    // (kBc, Dvp) dV_j
    float* st = dv + kBc * Dvp;   // (kBc, kBr) Sᵀ, then P(_dropped)ᵀ
    float* dpt = st + kBc * kBr;  // (kBc, kBr) dPᵀ, then dSᵀ
        {
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
            std::fill(dqt_block(c, b, h, 0), dqt_block(c, b, h, nq), 0.f);
          for (int64_t j = c; j < nkv; j += C) {
            const int64_t s0 = j * kBc, bc = std::min(kBc, S - s0);
            const float* k = a.k.data + b * a.k.strides[0] + kvh * a.k.strides[1] + s0 * a.k.strides[2];
            const float* v = a.v.data + b * a.v.strides[0] + kvh * a.v.strides[1] + s0 * a.v.strides[2];
            pack_rows(k, a.k.strides[2], a.k.strides[3], bc, D, D, kr);
            for (int64_t s = 0; s < bc; ++s)
              for (int64_t d = 0; d < D; ++d) kt[d * kBc + s] = kr[s * D + d];
            pack_rows(v, a.v.strides[2], a.v.strides[3], bc, Dv, Dv, vr);
            std::fill(dk, dk + kBc * Dp, 0.f);
            std::fill(dv, dv + kBc * Dvp, 0.f);
            for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
              const QHead r = head(b, h);
              for (int64_t i = 0; i < nq; ++i) {
                const int64_t l0 = i * kBr, br = std::min(kBr, L - l0), np = (br + N - 1) / N, w = np * N;
                if (p.key_end(l0 + br - 1) <= s0) continue;  // causal: the tile's last query sees no key of it
                // Sᵀ = K_j · Q_iᵀ (log2 units), + bias·log2e
                QKTile(kr, bc, D, r.qt + l0 * D, np, st, kBr, false);
                if (p.has_bias())
                  for (int64_t s = 0; s < bc; ++s)
                    for (int64_t l = 0; l < br; ++l) st[s * kBr + l] += p.bias(b, h, l0 + l, s0 + s) * kLog2e;
                // Pᵀ = exp2(Sᵀ − LSE·log2e); keys past a query's causal edge get P = 0
                VF any = hn::Zero(df);
                for (int64_t s = 0; s < bc; ++s) {
                  float* x = st + s * kBr;
                  const int64_t hidden = causal ? std::clamp(s0 + s - off - l0, int64_t(0), w) : 0;  // l < s − off
                  for (int64_t l = 0; l < hidden; ++l) x[l] = -inf;
                  for (int64_t l = 0; l < w; l += N) {
                    const VF pv = Exp2(df, hn::Sub(hn::LoadU(df, x + l), hn::LoadU(df, r.lse2 + l0 + l)));
                    hn::StoreU(pv, df, x + l);
                    any = hn::Max(any, pv);
                  }
                }
                if (hn::GetLane(hn::MaxOfLanes(df, any)) == 0.f) continue;  // fully masked tile: no gradient
                // dPᵀ = V_j · dO_iᵀ
                QKTile(vr, bc, Dv, r.dot + l0 * Dv, np, dpt, kBr, false);
                // dSᵀ = Pᵀ ∘ (dPᵀ∘keep/(1-p) − D); Pᵀ ← Pᵀ∘keep/(1-p) for dV
                if (a.dropout_p > 0) {
                  for (int64_t s = 0; s < bc; ++s)
                    for (int64_t l = 0; l < w; ++l) {
                      const uint64_t index = ((b * p.H + h) * L + l0 + l) * S + s0 + s;
                      const bool keep = dropout_keep(seed, index, threshold) && l0 + l < L;
                      const float pr = st[s * kBr + l], ks = keep ? keep_scale : 0.f;
                      dpt[s * kBr + l] = pr * (dpt[s * kBr + l] * ks - r.dsum[l0 + l]);
                      st[s * kBr + l] = pr * ks;
                    }
                } else {
                  for (int64_t s = 0; s < bc; ++s)
                    for (int64_t l = 0; l < w; l += N) {
                      const VF pv = hn::LoadU(df, st + s * kBr + l);
                      const VF dp = hn::LoadU(df, dpt + s * kBr + l);
                      hn::StoreU(hn::Mul(pv, hn::Sub(dp, hn::LoadU(df, r.dsum + l0 + l))), df, dpt + s * kBr + l);
                    }
                }
                // dV_j += P_droppedᵀ · dO_i;  dK_j += dSᵀ · Q_i;  dQ_iᵀ += K_jᵀ · dSᵀ
                PVTile(st, bc, kBr, r.dout + l0 * r.lddo, r.lddo, br, dv, Dvp, nullptr);
                PVTile(dpt, bc, kBr, r.q + l0 * r.ldq, r.ldq, br, dk, Dp, nullptr);
                PVTile(kt, D, kBc, dpt, kBr, bc, dqt_block(c, b, h, i), kBr, nullptr);
              }
            }
            // dK = scale · dSᵀ·Q; both summed over the group's query heads above
            const auto& GK = g.dk;
            const auto& GV = g.dv;
            float* gk = GK.data + b * GK.strides[0] + kvh * GK.strides[1] + s0 * GK.strides[2];
            float* gv = GV.data + b * GV.strides[0] + kvh * GV.strides[1] + s0 * GV.strides[2];
            for (int64_t s = 0; s < bc; ++s) {
              for (int64_t d = 0; d < D; ++d) gk[s * GK.strides[2] + d * GK.strides[3]] = scale * dk[s * Dp + d];
              for (int64_t e = 0; e < Dv; ++e) gv[s * GV.strides[2] + e * GV.strides[3]] = dv[s * Dvp + e];
            }
          }
        }
  });

  // ---- dQ = scale · Σ_c partial_c, in the order c = 0, 1, ... ----
  const auto& GQ = g.dq;
  parallel_items(p.B * p.H * nq, kBr * D * C, [&](int64_t item, int) {
        const int64_t b = item / (p.H * nq), h = item / nq % p.H, i = item % nq;
        const int64_t l0 = i * kBr, br = std::min(kBr, L - l0);
        float* gq = GQ.data + b * GQ.strides[0] + h * GQ.strides[1] + l0 * GQ.strides[2];
        for (int64_t d = 0; d < D; ++d)
          for (int64_t l = 0; l < br; ++l) {
            float sum = 0;
            for (int64_t c = 0; c < C; ++c) sum += dqt_block(c, b, h, i)[d * kBr + l];
            gq[l * GQ.strides[2] + d * GQ.strides[3]] = scale * sum;
          }
  });
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
