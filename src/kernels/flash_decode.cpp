// The decode kernel, over K/V stored as fp32, fp16 or bf16 (flash_decode and flash_decode_half), and the
// fp32 <-> half conversions: few query rows, long S, so the step is bound by reading K and V, and the
// kernel is built to read each once. Not the prefill kernel (flash_forward.cpp, which hands its decode
// shapes here) and no weights.
//
// Work item = (batch b, KV head kvh, chunk c of kChunk keys); its L·G query rows (row r: position
// row_position(r), head row_head(kvh, r), as in flash_forward.cpp) all read the chunk's K and V rows, converted to
// fp32 in registers (never through memory) and met by a block of rows there: 4 keys x kQR rows of dot
// products folded to N sums at once (no horizontal reduction per key), P·V with a kMR x kNV block of O
// in registers (flash_common.h's PVTile). K and V rows are prefetched kAhead keys on, so the reads overlap
// the arithmetic and the step runs at the speed of reading K/V. Per item, in the log2 domain (Q pre-scaled
// by scale·log2e):
//   S (rows, n) = Q·Kᵀ + log2e·mask, -inf past each row's causal edge
//   m = rowmax(S); P = 2^(S − m); l = rowsum(P); O (rows, Dv) = P·V
// The items' (m, l, O) are merged per row in chunk order (softmax.h), so any thread count gives the
// same bits. Memory: O(B·Hkv·S/kChunk·rows·Dv) for the partials.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/flash_decode.cpp"  // found through include/
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "attn/check.h"
#include "attn/kernels/half_kv.h"
#include "attn/threads.h"
#include "dropout.h"
#include "flash_common.h"
#include "../core/aligned.h"  // allocate_aligned: every buffer checked
#include "mask.h"
#include "score_mod.h"
#include "softmax.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {
namespace {

constexpr int64_t kChunk = 512;  // keys per item: fixed, so the merge order never depends on threads
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr int64_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);  // room for one vector of any target

using DH = hn::Rebind<hwy::float16_t, DF>;   // N half lanes, promoted to one float vector
using DU16 = hn::Rebind<uint16_t, DF>;
using DU32 = hn::RebindToUnsigned<DF>;

// N halves at src as one float vector.
template <KvDtype T>
HWY_INLINE VF Promote(const uint16_t* HWY_RESTRICT src) {
  const DF df;
  if constexpr (T == KvDtype::f16) {
    return hn::PromoteTo(df, hn::LoadU(DH(), reinterpret_cast<const hwy::float16_t*>(src)));
  } else {  // bf16: the 16 bits are the high half of the float
    const DU32 du;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(DU16(), src))));
  }
}

// n floats to n halves at dst, rounded to nearest even.
void ToHalf(KvDtype t, const float* src, int64_t n, uint16_t* dst) {
  if (t == KvDtype::bf16) return StoreBf16(src, n, dst);
  StoreRow(src, n, dst, [](VF v, uint16_t* out) {
    hn::StoreU(hn::DemoteTo(DH(), v), DH(), reinterpret_cast<hwy::float16_t*>(out));
  });
}

void FromHalf(KvDtype t, const uint16_t* src, int64_t n, float* dst) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(t == KvDtype::f16 ? Promote<KvDtype::f16>(src + i) : Promote<KvDtype::bf16>(src + i), df, dst + i);
  if (i < n) {  // the tail through a padded vector
    alignas(64) uint16_t in[kMaxLanes] = {};
    alignas(64) float out[kMaxLanes];
    std::copy(src + i, src + n, in);
    hn::Store(t == KvDtype::f16 ? Promote<KvDtype::f16>(in) : Promote<KvDtype::bf16>(in), df, out);
    std::copy(out, out + (n - i), dst + i);
  }
}

// Row of n stored elements (halves, or floats with column stride cs) into n floats of dst; dst has room
// for round_up(n, N). The packing of the shapes the direct loads do not cover (see Direct below).
template <KvDtype T>
HWY_INLINE void PromoteRow(const float* HWY_RESTRICT src, int64_t cs, int64_t n, float* HWY_RESTRICT dst) {
  static_assert(T == KvDtype::f32);
  if (cs == 1) std::copy(src, src + n, dst);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * cs];
}
template <KvDtype T>
HWY_INLINE void PromoteRow(const uint16_t* HWY_RESTRICT src, int64_t /*cs: 1*/, int64_t n, float* HWY_RESTRICT dst) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::Store(Promote<T>(src + i), df, dst + i);
  if (i < n) {  // the tail through a padded vector; dst has room for it
    alignas(64) uint16_t in[kMaxLanes] = {};
    std::copy(src + i, src + n, in);
    hn::Store(Promote<T>(in), df, dst + i);
  }
}

// N stored elements at src as one float vector: converted in registers, never through memory.
template <KvDtype T>
struct LoadKV {
  HWY_INLINE VF operator()(const float* HWY_RESTRICT src) const { return hn::LoadU(DF(), src); }
  HWY_INLINE VF operator()(const uint16_t* HWY_RESTRICT src) const { return Promote<T>(src); }
};

// Register blocks of the scores (AVX-512 has 32 vector registers, the others 16): kQR rows x 4 keys x
// kSumVecs vectors of accumulators (the 16 virtual lanes of each dot product) plus the 4 key vectors.
// P·V is flash_common.h's PVTile (kMR x kNV).
#if ATTN_AVX512_TARGET(HWY_TARGET)
constexpr int kQR = 4;
#else
constexpr int kQR = 1;
#endif
constexpr int64_t kAhead = 64;  // keys between a prefetch of a K/V row and its use
constexpr int64_t kVB = kAhead;  // keys per pass over the Dv vectors: each prefetches its columns of the next kVB
constexpr size_t kLanes = hn::MaxLanes(DF());

// Calls f(std::integral_constant<int, R>) with R = min(r, MAX): runtime row counts to template blocks.
template <int MAX, class F>
HWY_INLINE void WithRows(int64_t r, F&& f) {
  if constexpr (MAX > 1)
    if (r < MAX) return WithRows<MAX - 1>(r, f);
  f(std::integral_constant<int, MAX>());
}

#if HWY_TARGET != HWY_SCALAR  // one lane: nothing to fold
// The horizontal sums of many dot products without one reduction each: a tree whose adds each halve
// the lanes of two vectors and pack the halves side by side, so N accumulators (one per key) end as one
// vector of N sums, lane j the sum of accumulator j, at ~1 shuffle per key instead of log2(N) per key.
// Fold4: 4 accumulators to one vector whose 128-bit block i holds, in lane 4i + j, part of Σ a_j.
template <class D, class V>
HWY_INLINE V Fold4(D d, V a0, V a1, V a2, V a3) {
  const hn::Repartition<uint64_t, D> d64;
  // per block: (a0 lanes 0+2, a1 0+2, a0 1+3, a1 1+3), then 64-bit halves of two such: (a0, a1, a2, a3)
  const V t01 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const V t23 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const auto w01 = hn::BitCast(d64, t01), w23 = hn::BitCast(d64, t23);
  return hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, w01, w23)),
                 hn::BitCast(d, hn::InterleaveUpper(d64, w01, w23)));
}
// FoldBlocks: the Fold4 vectors of keys [0, 4), [4, 8), ... (u[g], N/4 of them) to one vector, lane j
// the sum for key j: the blocks of each u[g] are added and u[g]'s sum lands in block g.
template <class D, class V>
HWY_INLINE V FoldBlocks(D d, const V* u) {
  constexpr size_t n = hn::MaxLanes(D());
  if constexpr (n == 4) {
    return u[0];
  } else if constexpr (n == 8) {  // halves: (u0.lo + u0.hi, u1.lo + u1.hi)
    return hn::Add(hn::ConcatLowerLower(d, u[1], u[0]), hn::ConcatUpperUpper(d, u[1], u[0]));
  } else {  // n == 16, blocks b0..b3: x02 = (u0 b0+b2, u0 b1+b3, u2 b0+b2, u2 b1+b3), x13 likewise
    static_assert(n == 16);
    const V x02 = hn::Add(hn::ConcatLowerLower(d, u[2], u[0]), hn::ConcatUpperUpper(d, u[2], u[0]));
    const V x13 = hn::Add(hn::ConcatLowerLower(d, u[3], u[1]), hn::ConcatUpperUpper(d, u[3], u[1]));
    // block g = the two blocks of u[g]'s pair added: (x02 b0+b1, x13 b0+b1, x02 b2+b3, x13 b2+b3)
    return hn::Add(hn::OddEvenBlocks(x13, x02), hn::SwapAdjacentBlocks(hn::OddEvenBlocks(x02, x13)));
  }
}

// The Fold4 vectors of one group of keys, one per vector of virtual lanes (F[v]: lanes 16/N·… of it), as
// one: block b of the result holds B_b + B_b+2 …, the first level of AVX-512's FoldBlocks tree, so that
// every target ends with ((B0 + B2) + (B1 + B3)) for each key, B_b the 4-lane sum of virtual block b.
template <class V>
HWY_INLINE V FoldVecs(const V* F) {
  if constexpr (kSumVecs == 1) return F[0];
  else if constexpr (kSumVecs == 2) return hn::Add(F[0], F[1]);
  else return hn::Add(hn::Add(F[0], F[2]), hn::Add(F[1], F[3]));  // kSumVecs == 4 (flash_common.h)
}
#endif

// S rows [0, R) over n keys: s[r·kChunk + j] = q_r·k_j for j < round_up(n, N) (keys past n score 0).
// q: (R, Dp) rows, zero past D. k: key rows ldk elements apart, D elements each (D a multiple of N).
// zero: a row of D zero elements, stands in for the keys past n. prefetch: the K rows kAhead keys on.
// Each K vector is converted once per R rows and meets all R of them in registers; 4 keys at a time.
// Each dot product runs over 16 virtual lanes (element d in lane d % 16, one FMA chain per lane in d
// order), folded by one tree on every target (Fold4, FoldVecs, FoldBlocks): the same bits on AVX2 and AVX-512.
template <KvDtype T, int R, typename E>
HWY_NOINLINE void ScoreRows(const float* HWY_RESTRICT q, int64_t Dp, const E* HWY_RESTRICT k, int64_t ldk, int64_t n,
                            int64_t D, const E* HWY_RESTRICT zero, float* HWY_RESTRICT s, bool prefetch) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  for (int64_t j = 0; j < n; j += N) {
#if HWY_TARGET == HWY_SCALAR  // one lane: a key's sum is its accumulator
    for (int r = 0; r < R; ++r) {
      VF a = hn::Zero(df);
      for (int64_t d = 0; d < D; d += N) a = hn::MulAdd(hn::LoadU(df, q + r * Dp + d), LoadKV<T>()(k + j * ldk + d), a);
      s[r * kChunk + j] = hn::GetLane(a);
    }
    (void)zero, (void)prefetch;
#else
    {
      VF u[R][kLanes / 4];
      for (size_t g = 0; g < kLanes / 4; ++g) {
        const E* kp[4];
        for (int i = 0; i < 4; ++i) {
          const int64_t key = j + int64_t(4 * g) + i;
          kp[i] = key < n ? k + key * ldk : zero;
          if (prefetch) PrefetchRow(k, (key + kAhead) * ldk * int64_t(sizeof(E)), D * int64_t(sizeof(E)));
        }
        VF acc[R][4][kSumVecs];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i)
#pragma GCC unroll 4
            for (int v = 0; v < kSumVecs; ++v) acc[r][i][v] = hn::Zero(df);
        for (int64_t d0 = 0; d0 < D; d0 += kSumLanes)
#pragma GCC unroll 4
          for (int v = 0; v < kSumVecs; ++v) {
            const int64_t d = d0 + v * N;
            if (d >= D) break;
            VF kv[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) kv[i] = LoadKV<T>()(kp[i] + d);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) {
              const VF qv = hn::LoadU(df, q + r * Dp + d);
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) acc[r][i][v] = hn::MulAdd(qv, kv[i], acc[r][i][v]);
            }
          }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          VF F[kSumVecs];
#pragma GCC unroll 4
          for (int v = 0; v < kSumVecs; ++v) F[v] = Fold4(df, acc[r][0][v], acc[r][1][v], acc[r][2][v], acc[r][3][v]);
          u[r][g] = FoldVecs(F);
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) hn::StoreU(FoldBlocks(df, u[r]), df, s + r * kChunk + j);
    }
#endif
  }
}

// Per-worker scratch of one item. Dp, Dvp: D, Dv rounded up to N.
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> buf;
  float *q, *s, *zero;  // (rows, Dp) Q·scale·log2e; (rows, kChunk) S then P; (Dp) zeros
  hwy::AlignedFreeUniquePtr<float[]> kp, vp;  // (kChunk, Dp), (kChunk, Dvp): packed K/V, when not Direct
  Scratch(int64_t rows, int64_t Dp) : buf(attn::allocate_aligned<float>(rows * (Dp + kChunk) + Dp)) {
    q = buf.get(), s = q + rows * Dp, zero = s + rows * kChunk;
    std::fill(zero, zero + Dp, 0.f);
  }
  // A zeroed (kChunk, cols) buffer on first use: the columns past what PromoteRow writes stay 0.
  static float* Packed(hwy::AlignedFreeUniquePtr<float[]>& x, int64_t cols) {
    if (!x) {
      x = attn::allocate_aligned<float>(kChunk * cols);
      std::fill(x.get(), x.get() + kChunk * cols, 0.f);
    }
    return x.get();
  }
};

// K and V as stored: E = uint16_t (f16, bf16) or float (f32), element strides.
template <typename E>
struct Stored {
  const E* k;
  const E* v;
  const int64_t* ks;  // (4) strides of K (B, Hkv, S, D)
  const int64_t* vs;  // (4) strides of V (B, Hkv, S, Dv)
};

// Rows read in place need unit column stride and a width that is whole vectors; others are packed.
inline bool Direct(const int64_t* strides, int64_t cols, int64_t N) { return strides[3] == 1 && cols % N == 0; }

// S (rows, kChunk) from column c0 = Q·Kᵀ over keys [0, n) of k (rows ldk apart, D elements, D a multiple
// of N). prefetch: the K rows kAhead keys on, on the first pass (k is the data as stored).
template <KvDtype T, typename E>
void Scores(const Scratch& sc, int64_t c0, int64_t rows, int64_t Dp, const E* k, int64_t ldk, int64_t n, int64_t D,
            bool prefetch) {
  for (int64_t r = 0; r < rows; r += kQR)
    WithRows<kQR>(rows - r, [&](auto R) {
      ScoreRows<T, R.value>(sc.q + r * Dp, Dp, k, ldk, n, D, reinterpret_cast<const E*>(sc.zero),
                            sc.s + r * kChunk + c0, prefetch && r == 0);
    });
}

// O (rows, Dvp) += P·V over keys [0, n) of v (rows ldv apart, Dvp elements) and P from column c0, kVB keys
// at a time. prefetch: the V rows kAhead keys on (v as stored).
template <KvDtype T, typename E>
void Values(const Scratch& sc, int64_t c0, int64_t rows, const E* v, int64_t ldv, int64_t n, int64_t Dvp, float* o,
            bool prefetch) {
  for (int64_t s = 0; s < n; s += kVB)
    PVTile(sc.s + c0 + s, rows, kChunk, v + s * ldv, ldv, std::min(kVB, n - s), o, Dvp, nullptr, LoadKV<T>(),
           prefetch ? kAhead : 0);
}

// The sizes of one decode: rows = L·G query rows per (b, kvh) pair (row r: p.row_position(r), p.row_head),
// nc chunks of kChunk keys per pair, item = pair·nc + chunk.
struct DecodeShape {
  int64_t N, rows, Dp, Dvp, pairs, nc;
  explicit DecodeShape(const SdpaProblem<float>& p)
      : N(int64_t(hn::Lanes(DF()))), rows(p.L * p.G), Dp(round_up(p.D, N)), Dvp(round_up(p.Dv, N)),
        pairs(p.B * p.Hkv), nc((p.S + kChunk - 1) / kChunk) {}
};

// The rows of (b, kvh)'s group from Q, times qscale (scale·log2e: the log2 domain), zero past D: q (rows, Dp).
void LoadGroupQ(const SdpaProblem<float>& p, const DecodeShape& z, int64_t b, int64_t kvh, float qscale, float* q) {
  const auto& Q = p.args.q;
  for (int64_t r = 0; r < z.rows; ++r) {
    const float* src = Q.data + b * Q.strides[0] + p.row_head(kvh, r) * Q.strides[1] + p.row_position(r) * Q.strides[2];
    float* dst = q + r * z.Dp;
    for (int64_t d = 0; d < p.D; ++d) dst[d] = src[d * Q.strides[3]] * qscale;
    std::fill(dst + p.D, dst + z.Dp, 0.f);
  }
}

// The scores of keys [s0, s0 + nv) (row columns from c0) to P, row by row: the score modifications and
// masks, -inf outside each row's keys (and on the padding to npad) (score_mod.h); m = rowmax(S);
// P = 2^(S − m); l = rowsum(P); dropout after l (the sum stays pre-dropout).
void SoftmaxRows(const SdpaProblem<float>& p, int64_t rows, int64_t b, int64_t kvh, int64_t s0, int64_t c0, int64_t nv,
                 int64_t npad, float* s, float* m, float* l) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * kChunk + c0;
    const int64_t pos = p.row_position(r), h = p.row_head(kvh, r);
    ModScoreRow(p, b, h, pos, s0, nv, npad, row);
    m[r] = RowMax(row, npad);
    l[r] = Exp2Row(row, npad, ExpBase(m[r]));
    if (p.dropout()) DropRow(p, b, h, pos, s0, nv, 1, row);
  }
}

// One item: chunk c of pair (b, kvh) to its partial (m, l, O): m, l (rows), o (rows, Dvp).
template <KvDtype T, typename E>
void DecodeChunk(const SdpaProblem<float>& p, const Stored<E>& kv, const DecodeShape& z, int64_t pair, int64_t c,
                 Scratch& sc, float* m, float* l, float* o) {
  const int64_t b = pair / p.Hkv, kvh = pair % p.Hkv;
  const int64_t s0 = c * kChunk, n = std::min(kChunk, p.S - s0);
  std::fill(o, o + z.rows * z.Dvp, 0.f);
  // keys visible to some row: [s0 + c0, s0 + c1), from the first query's first key (down to whole sets of
  // the 16 virtual lanes of the row sums, so they keep their terms) to the last query's last
  const int64_t c0 = std::clamp<int64_t>((p.keys(b, 0).begin - s0) / kSumLanes * kSumLanes, 0, n);
  const int64_t c1 = std::clamp<int64_t>(p.keys(b, p.L - 1).end - s0, 0, n), nv = c1 - c0;
  if (nv <= 0) {  // a chunk no row sees: never read
    std::fill(m, m + z.rows, -kInfF);
    std::fill(l, l + z.rows, 0.f);
    return;
  }
  const int64_t npad = round_up(nv, z.N);
  LoadGroupQ(p, z, b, kvh, float(p.scale) * kLog2e, sc.q);
  const E* kb = kv.k + b * kv.ks[0] + kvh * kv.ks[1] + (s0 + c0) * kv.ks[2];
  const E* vb = kv.v + b * kv.vs[0] + kvh * kv.vs[1] + (s0 + c0) * kv.vs[2];
  // S = Q·Kᵀ: each K vector read and converted once per kQR rows, in registers
  if (Direct(kv.ks, p.D, z.N)) {
    Scores<T>(sc, c0, z.rows, z.Dp, kb, kv.ks[2], nv, p.D, true);
  } else {
    float* kp = Scratch::Packed(sc.kp, z.Dp);
    for (int64_t s = 0; s < nv; ++s) PromoteRow<T>(kb + s * kv.ks[2], kv.ks[3], p.D, kp + s * z.Dp);
    Scores<KvDtype::f32>(sc, c0, z.rows, z.Dp, static_cast<const float*>(kp), z.Dp, nv, z.Dp, false);
  }
  SoftmaxRows(p, z.rows, b, kvh, s0 + c0, c0, nv, npad, sc.s, m, l);
  // O = P·V: each V vector read and converted once per kMR rows, in registers
  if (Direct(kv.vs, p.Dv, z.N)) {
    Values<T>(sc, c0, z.rows, vb, kv.vs[2], nv, z.Dvp, o, true);
  } else {
    float* vp = Scratch::Packed(sc.vp, z.Dvp);
    for (int64_t s = 0; s < nv; ++s) PromoteRow<T>(vb + s * kv.vs[2], kv.vs[3], p.Dv, vp + s * z.Dvp);
    Values<KvDtype::f32>(sc, c0, z.rows, static_cast<const float*>(vp), z.Dvp, nv, z.Dvp, o, false);
  }
}

// Every (pair, chunk) item in parallel, then per row the merge in chunk order and out = O/l (softmax.h).
template <KvDtype T, typename E>
void DecodeT(const SdpaProblem<float>& p, const Stored<E>& kv) {
  const DecodeShape z(p);
  const int64_t items = z.pairs * z.nc;
  auto part_m = attn::allocate_aligned<float>(std::max<int64_t>(1, items * z.rows));  // (pairs, nc, rows)
  auto part_l = attn::allocate_aligned<float>(std::max<int64_t>(1, items * z.rows));
  auto part_o = attn::allocate_aligned<float>(std::max<int64_t>(1, items * z.rows * z.Dvp));  // (pairs, nc, rows, Dvp)
  PerWorker<Scratch> scratch;
  parallel_items(items, z.rows * std::min(p.S, kChunk) * (p.D + p.Dv), [&](int64_t item, int worker) {
    DecodeChunk<T>(p, kv, z, item / z.nc, item % z.nc, scratch.get(worker, z.rows, z.Dp),
                   part_m.get() + item * z.rows, part_l.get() + item * z.rows, part_o.get() + item * z.rows * z.Dvp);
  });
  PerWorker<std::vector<float>> row_o;
  parallel_items(z.pairs * z.rows, z.nc * z.Dvp, [&](int64_t j, int worker) {
    const int64_t pair = j / z.rows, r = j % z.rows, first = pair * z.nc * z.rows + r;
    float* o = row_o.get(worker, size_t(z.Dvp)).data();  // (Dvp,)
    float m, lsum;
    MergeChunks(part_m.get() + first, part_l.get() + first, part_o.get() + first * z.Dvp, z.nc, z.rows,
                z.rows * z.Dvp, z.Dvp, o, &m, &lsum);
    WriteRow(p, pair / p.Hkv, p.row_head(pair % p.Hkv, r), p.row_position(r), o, m, lsum);
  });
}

void Decode(const SdpaProblem<float>& p, const HalfKV& kv) {
  if (p.B == 0 || p.H == 0 || p.L == 0) return;
  const Stored<uint16_t> st{kv.k.data, kv.v.data, kv.k.strides.data(), kv.v.strides.data()};
  if (kv.dtype == KvDtype::f16) DecodeT<KvDtype::f16>(p, st);
  else DecodeT<KvDtype::bf16>(p, st);
}

void DecodeF32(const SdpaProblem<float>& p) {
  if (p.B == 0 || p.H == 0 || p.L == 0) return;
  const auto& a = p.args;
  DecodeT<KvDtype::f32>(p, Stored<float>{a.k.data, a.v.data, a.k.strides.data(), a.v.strides.data()});
}

}  // namespace
}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace flash {
HWY_EXPORT(Decode);
HWY_EXPORT(DecodeF32);
HWY_EXPORT(ToHalf);
HWY_EXPORT(FromHalf);
}  // namespace flash

const char* to_string(KvDtype t) {
  switch (t) {
    case KvDtype::f32: return "f32";
    case KvDtype::f16: return "f16";
    case KvDtype::bf16: return "bf16";
  }
  return "?";
}

KvDtype parse_kv_dtype(const char* s) {
  const std::string x = s;
  if (x == "f32") return KvDtype::f32;
  if (x == "f16") return KvDtype::f16;
  if (x == "bf16") return KvDtype::bf16;
  ATTN_CHECK(false, "Expected a KV dtype f32, f16 or bf16, but got '", x, "' instead");
  return KvDtype::f32;
}

double kv_unit_roundoff(KvDtype t) {
  return t == KvDtype::f16 ? std::ldexp(1.0, -11) : t == KvDtype::bf16 ? std::ldexp(1.0, -8) : 0.0;
}

void to_half(KvDtype t, const float* src, int64_t n, uint16_t* dst) {
  ATTN_CHECK(t != KvDtype::f32, "Expected f16 or bf16 for to_half, but got f32 instead");
  HWY_DYNAMIC_DISPATCH(flash::ToHalf)(t, src, n, dst);
}

void from_half(KvDtype t, const uint16_t* src, int64_t n, float* dst) {
  ATTN_CHECK(t != KvDtype::f32, "Expected f16 or bf16 for from_half, but got f32 instead");
  HWY_DYNAMIC_DISPATCH(flash::FromHalf)(t, src, n, dst);
}

void flash_decode_half(const SdpaProblem<float>& p, const HalfKV& kv) { HWY_DYNAMIC_DISPATCH(flash::Decode)(p, kv); }
void flash_decode(const SdpaProblem<float>& p) { HWY_DYNAMIC_DISPATCH(flash::DecodeF32)(p); }

}  // namespace attn
#endif  // HWY_ONCE
