// FlashAttention building blocks shared by the CPU flash kernels (forward and backward): the
// packing of K (as Kᵀ panels) and V, the register-blocked tile products S = Q·Kᵀ and O = α⊙O + P·V (on
// register_block.h's microkernel, the GEMM's; in fp32, or over bf16 pairs: pair words on its DpBlock,
// VDPBF16PS, or bf16 values in chain order on FmaBlock, its exact emulation), and a vectorized exp2 (which
// can write P as bf16 pairs). Internal to src/kernels; not a kernel by itself (flash_forward.cpp drives
// these over tiles) and not a general GEMM (sizes are those of attention tiles).
//
// The target-independent part (packing, constants) is flash_pack.h. This SIMD part
// is compiled once per Highway target: include this header after <hwy/highway.h> in a translation unit
// that re-includes itself through <hwy/foreach_target.h>; it defines attn::flash::HWY_NAMESPACE.
//
// Layouts (N = vector lanes of the target, 16 for AVX-512, 8 for AVX2, 4 for SSE4):
//   Kᵀ panel: keys [s, s+N) as a (D, N) block, element (d, j) at d*N + j; consecutive panels of a
//             head lie D*N floats apart, keys past the end are 0.
//   V rows:   (S, ldv) rows, read as is when they have unit column stride and Dv % N == 0, otherwise
//             packed to (S, Dvp) with Dvp = Dv rounded up to N and zero columns past Dv.
#include <type_traits>

#include "flash_pack.h"
#include "pairs.h"  // FlushSubnormals, the pair rounding of whole rows

// ---- Per-target SIMD part ----
#if defined(ATTN_FLASH_COMMON_TOGGLE) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_FLASH_COMMON_TOGGLE
#undef ATTN_FLASH_COMMON_TOGGLE
#else
#define ATTN_FLASH_COMMON_TOGGLE
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "register_block.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// The register block (kMR rows x kNV vectors), its microkernel FmaBlock, ForBlock, ARows / BRows and the
// loads: register_block.h, the GEMM's too.
using namespace regblock::HWY_NAMESPACE;
using LoadF32 = regblock::HWY_NAMESPACE::LoadU;  // the V rows PVBlock reads: fp32 as stored

// 2^x for x <= 0 (every exponent the online softmax takes: scores minus their running max), 0 for
// x < -126 (the result would be subnormal: < 2^-126 against a row maximum of 1), NaN stays NaN.
// x = q + f with q = round(x) and |f| <= 1/2; 2^f = e^(f·ln2) by Highway's polynomial for e^r on
// |r| <= ln2/2 (the one its Exp uses); 2^q goes into the exponent bits. f is exact, so only the
// polynomial and one rounding of f·ln2 contribute error (a few ulp).
// round(x) without a float->int conversion: t = x + 1.5·2^23 rounds x to an integer (nearest even)
// in t's low mantissa bits, so t - 1.5·2^23 = q exactly and t's bits << 23 = q << 23 (|q| < 2^22).
HWY_INLINE VF Exp2(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(d, 12582912.f);  // 1.5·2^23
  const VF t = hn::Add(x, magic);
  const VF q = hn::Sub(t, magic);
  const VF r = hn::Mul(hn::Sub(x, q), hn::Set(d, kLn2));
  const VF y = hn::Add(hn::impl::ExpImpl<float>().ExpPoly(d, r), hn::Set(d, 1.f));
  const VF scale = hn::BitCast(d, hn::Add(hn::ShiftLeft<23>(hn::BitCast(di, t)), hn::Set(di, 127 << 23)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -126.f)), hn::Mul(y, scale));
}

// max of row[0, n), n a multiple of the lanes.
HWY_INLINE float RowMax(const float* HWY_RESTRICT row, int64_t n) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF m = hn::Set(d, -HUGE_VALF);
  for (int64_t j = 0; j < n; j += N) m = hn::Max(m, hn::LoadU(d, row + j));
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// Row sums run over kSumLanes virtual lanes, the same on every target: element j goes to lane j % 16,
// each lane adds its elements in order, and the 16 lanes are added by one fixed tree (SumLanes). A
// vector of N lanes holds 16/N of them in turn (AVX-512: all 16, AVX2: 8 and 8, SSE4: 4 x 4).
inline constexpr int64_t kSumLanes = 16;
inline constexpr int64_t kSumVecs = kSumLanes / int64_t(hn::MaxLanes(DF()));  // vectors of virtual lanes
static_assert(kSumVecs >= 1 && kSumVecs * int64_t(hn::MaxLanes(DF())) == kSumLanes);

// Σ of the 16 virtual lanes held by acc[0, kSumVecs): halves added until one is left,
// ((l0 + l8) + (l4 + l12)) + ((l2 + l10) + (l6 + l14)) + …, the same tree on every target.
HWY_INLINE float SumLanes(const VF* acc) {
  const DF d;
  HWY_ALIGN float lane[kSumLanes];
  for (int64_t v = 0; v < kSumVecs; ++v) hn::Store(acc[v], d, lane + v * int64_t(hn::Lanes(d)));
  for (int64_t w = kSumLanes / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) lane[i] += lane[i + w];
  return lane[0];
}

// ---- bf16 pairs as the kernels store them, of two kinds E ----
// uint32_t: pair words (pairs.h's layout, VDPBF16PS's operands: DpBlock multiplies them); RoundedBf16,
// PairWords and PairAcross (register_block.h) make them.
// float: without VDPBF16PS, bf16 values kept as fp32 (a bf16 is an fp32's high half) in CHAIN ORDER, each
// pair of k swapped (k = 2q + 1, then 2q), and the fp32 blocks (FmaBlock) multiply them: their one FMA chain
// over k adds each pair's odd product, then its even one, exactly as VDPBF16PS does, under DAZ/FTZ: the
// instruction's bits at fp32's speed. A pair row is then two rows, a pair along a row two elements.

// 32-bit elements per pair of kind E: one word, or two floats in chain order.
template <typename E>
inline constexpr int64_t kPairWidth = std::is_same_v<E, float> ? 2 : 1;

// x rounded to bf16 (RoundedBf16), as an fp32.
HWY_INLINE VF Bf16Value(VF x) { return hn::BitCast(DF(), hn::And(RoundedBf16(x), hn::Set(DU(), 0xFFFF0000u))); }

// 2N elements of a row along k (a, then b) as pairs at out: N pair words, or 2N floats in chain order.
HWY_INLINE void StorePairs(VF a, VF b, uint32_t* out) { hn::StoreU(PairWords(a, b), DU(), out); }
HWY_INLINE void StorePairs(VF a, VF b, float* out) {
  const DF d;
#if HWY_TARGET == HWY_SCALAR
  hn::StoreU(Bf16Value(b), d, out), hn::StoreU(Bf16Value(a), d, out + 1);
#else
  hn::StoreU(hn::Reverse2(d, Bf16Value(a)), d, out), hn::StoreU(hn::Reverse2(d, Bf16Value(b)), d, out + hn::Lanes(d));
#endif
}

// Two rows where k runs across them (lo: k = 2i, hi: 2i + 1) as the pair row i at out: one row of words, or
// the rows out (hi) and out + ld (lo) in chain order.
HWY_INLINE void StoreAcross(VF lo, VF hi, uint32_t* out, int64_t) { hn::StoreU(PairAcross(lo, hi), DU(), out); }
HWY_INLINE void StoreAcross(VF lo, VF hi, float* out, int64_t ld) {
  hn::StoreU(Bf16Value(hi), DF(), out), hn::StoreU(Bf16Value(lo), DF(), out + ld);
}

// The pair rows of `rows` rows of floats (ld apart, width a multiple of the lanes): pair row i of out (rows
// ldo apart) pairs rows 2i and 2i + 1 (StoreAcross; an odd last row with a zero row). Kᵀ panels' rows are
// d, so this pairs a panel along D; rows of keys or queries, it pairs them across.
template <typename E>
HWY_INLINE void PairRowsOf(const float* x, int64_t rows, int64_t ld, int64_t width, E* out, int64_t ldo) {
  const DF d;
  const int64_t N = hn::Lanes(d), pw = kPairWidth<E>;
  for (int64_t i = 0; 2 * i < rows; ++i) {
    const float* lo = x + 2 * i * ld;
    for (int64_t j = 0; j < width; j += N)
      StoreAcross(hn::LoadU(d, lo + j), 2 * i + 1 < rows ? hn::LoadU(d, lo + ld + j) : hn::Zero(d),
                  out + pw * i * ldo + j, ldo);
  }
}

// The pairs of row x[0, n) along k (StorePairs; x[n] = 0 where n is odd): ⌈n/2⌉ pair words, rounded up to
// the lanes; or in chain order 2⌈n/2⌉ floats, any n (out may be x).
HWY_INLINE void PairRow(const float* HWY_RESTRICT x, int64_t n, uint32_t* HWY_RESTRICT words) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  for (int64_t j = 0; j < n; j += 2 * N)
    StorePairs(hn::LoadU(d, x + j), j + N < n ? hn::LoadU(d, x + j + N) : hn::Zero(d), words + j / 2);
}
HWY_INLINE void PairRow(const float* x, int64_t n, float* out) {
  const DF d;
  const int64_t N = hn::Lanes(d), n2 = round_up(n, 2);
  int64_t j = 0;
  for (; j + 2 * N <= n; j += 2 * N) StorePairs(hn::LoadU(d, x + j), hn::LoadU(d, x + j + N), out + j);
  const auto first = [&](int64_t at) { return static_cast<size_t>(std::clamp<int64_t>(n - at, 0, N)); };
  for (; j < n2; j += 2 * N) {  // the tail through a buffer: nothing read or written past the row
    HWY_ALIGN float part[2 * hn::MaxLanes(d)];
    StorePairs(LoadFirst(d, x + std::min(j, n - 1), first(j)), LoadFirst(d, x + std::min(j + N, n - 1), first(j + N)),
               part);
    std::copy(part, part + std::min(2 * N, n2 - j), out + j);
  }
}

// row[j] = 2^(row[j] - m) for j < n (n a multiple of the lanes); returns the sum of the new row over the
// virtual lanes (SumLanes). With pairs (bf16): the new row goes to pairs as PairRow writes it (pair words,
// not to row; or in chain order, which may be row itself: 2^(row[n]) = 0 where n is odd, and pairs has room
// for whole pairs of vectors, as a tile's width, a multiple of 2N).
template <typename E = uint32_t>
HWY_INLINE float Exp2Row(float* row, int64_t n, float m, E* pairs = nullptr) {
  const DF d;
  const int64_t N = hn::Lanes(d), pw = kPairWidth<E>;
  const VF vm = hn::Set(d, m);
  VF sum[kSumVecs];
  for (int64_t v = 0; v < kSumVecs; ++v) sum[v] = hn::Zero(d);
  if (pairs) {  // vector i of the row goes to virtual lanes i % kSumVecs, in order, as below
    for (int64_t j = 0; j < n; j += 2 * N) {
      const VF p0 = Exp2(d, hn::Sub(hn::LoadU(d, row + j), vm));
      VF p1 = hn::Zero(d);
      sum[(j / N) % kSumVecs] = hn::Add(sum[(j / N) % kSumVecs], p0);
      if (j + N < n) {
        p1 = Exp2(d, hn::Sub(hn::LoadU(d, row + j + N), vm));
        sum[(j / N + 1) % kSumVecs] = hn::Add(sum[(j / N + 1) % kSumVecs], p1);
      }
      StorePairs(p0, p1, pairs + pw * j / 2);
    }
    return SumLanes(sum);
  }
  for (int64_t j0 = 0; j0 < n; j0 += kSumLanes)
#pragma GCC unroll 16
    for (int64_t v = 0; v < kSumVecs; ++v) {
      const int64_t j = j0 + v * N;
      if (j >= n) break;
      const VF p = Exp2(d, hn::Sub(hn::LoadU(d, row + j), vm));
      hn::StoreU(p, d, row + j);
      sum[v] = hn::Add(sum[v], p);
    }
  return SumLanes(sum);
}

// S (MR, NV·N) = scale · (Q (MR, D) · Kᵀ (D, NV·N)), plus what S holds already if `add` (the mask bias).
// q: MR rows, row stride ldq. kt: NV consecutive Kᵀ panels, ldp floats apart. s: row stride lds. scale: 1
// where Q carries it (fp32; the product by 1 is exact), else applied to the fp32 sum (bf16, as QK16Block).
template <int MR, int NV>
HWY_NOINLINE void QKBlock(const float* HWY_RESTRICT q, int64_t ldq, const float* HWY_RESTRICT kt, int64_t ldp,
                          int64_t D, float scale, float* HWY_RESTRICT s, int64_t lds, bool add) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF acc[MR][NV];
  ForBlock<MR, NV>([&](int r, int j) { acc[r][j] = hn::Zero(d); });
  FmaBlock<MR, NV>(d, acc, ARows<float>{q, ldq, 1}, MR, BRows<float>{kt, N, ldp}, D, LoadF32());
  const VF vs = hn::Set(d, scale);
  const bool scaled = scale != 1.f;
  ForBlock<MR, NV>([&](int r, int j) {
    float* dst = s + r * lds + j * N;
    hn::StoreU(add ? hn::MulAdd(acc[r][j], vs, hn::LoadU(d, dst)) : scaled ? hn::Mul(acc[r][j], vs) : acc[r][j], d, dst);
  });
}

// The (MR, NV·N) accumulators of O (row stride ldo) times α per row (nullptr: none), and back.
template <int MR, int NV>
HWY_INLINE void LoadO(VF (&acc)[MR][NV], const float* HWY_RESTRICT o, int64_t ldo, const float* HWY_RESTRICT alpha) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  ForBlock<MR, NV>([&](int r, int j) {
    acc[r][j] = hn::LoadU(d, o + r * ldo + j * N);
    if (alpha) acc[r][j] = hn::Mul(acc[r][j], hn::Set(d, alpha[r]));
  });
}
template <int MR, int NV>
HWY_INLINE void StoreO(const VF (&acc)[MR][NV], float* HWY_RESTRICT o, int64_t ldo) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  ForBlock<MR, NV>([&](int r, int j) { hn::StoreU(acc[r][j], d, o + r * ldo + j * N); });
}

// O (MR, NV·N) = α ⊙ O + P (MR, n) · V (n, NV·N); α per row, or none (nullptr: α = 1).
// p: row stride ldp, or with TransA P's transpose stored (n, ldp) (the backward's dQ = dS·K from dSᵀ).
// v: rows ldv apart, elements E read by load. o: row stride ldo. pf_rows: with each V row s, prefetch
// the same columns of row s + pf_rows (FmaBlock's pf).
template <int MR, int NV, bool TransA = false, typename E = float, class Load = LoadF32>
HWY_NOINLINE void PVBlock(const float* HWY_RESTRICT p, int64_t ldp, const E* HWY_RESTRICT v, int64_t ldv,
                          int64_t n, float* HWY_RESTRICT o, int64_t ldo, const float* HWY_RESTRICT alpha,
                          Load load = Load(), int64_t pf_rows = 0) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF acc[MR][NV];
  LoadO(acc, o, ldo, alpha);
  const ARows<float> a = TransA ? ARows<float>{p, 1, ldp} : ARows<float>{p, ldp, 1};
  FmaBlock<MR, NV>(d, acc, a, MR, BRows<E>{v, ldv, N}, n, load, pf_rows);
  StoreO(acc, o, ldo);
}

// S (MR, NV·N) = qscale · (Q (MR, D2) · Kᵀ (D2, NV·N)) over bf16 pairs (DpBlock), plus what S holds already
// if `add` (the mask bias): q: MR rows of D2 pair words, ldq apart; kt: NV consecutive Kᵀ pair panels
// ((D2, N) words), ldp words apart. The scale is applied to the fp32 sum, as torch's bf16 SDPA does.
template <int MR, int NV>
HWY_NOINLINE void QK16Block(const uint32_t* HWY_RESTRICT q, int64_t ldq, const uint32_t* HWY_RESTRICT kt,
                            int64_t ldp, int64_t D2, float qscale, float* HWY_RESTRICT s, int64_t lds, bool add) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF acc[MR][NV];
  ForBlock<MR, NV>([&](int r, int j) { acc[r][j] = hn::Zero(d); });
  DpBlock<MR, NV>(d, acc, ARows<uint32_t>{q, ldq, 1}, MR, BRows<uint32_t>{kt, N, ldp}, D2);
  const VF vs = hn::Set(d, qscale);
  ForBlock<MR, NV>([&](int r, int j) {
    float* dst = s + r * lds + j * N;
    hn::StoreU(add ? hn::MulAdd(acc[r][j], vs, hn::LoadU(d, dst)) : hn::Mul(acc[r][j], vs), d, dst);
  });
}

// O (MR, NV·N) = α ⊙ O + P (MR, n2) · V (n2, NV·N) over bf16 pairs (DpBlock); α per row, or none.
// p: MR rows of n2 pair words (keys 2q, 2q + 1), ldp apart, or with TransA P's transpose stored (n2, ldp)
// (the backward's dQ = dS·K from dSᵀ's pair rows); v: pair rows of V (keys 2q, 2q + 1 of each column),
// ldv words apart. o: row stride ldo.
template <int MR, int NV, bool TransA = false>
HWY_NOINLINE void PV16Block(const uint32_t* HWY_RESTRICT p, int64_t ldp, const uint32_t* HWY_RESTRICT v,
                            int64_t ldv, int64_t n2, float* HWY_RESTRICT o, int64_t ldo,
                            const float* HWY_RESTRICT alpha) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF acc[MR][NV];
  LoadO(acc, o, ldo, alpha);
  const ARows<uint32_t> a = TransA ? ARows<uint32_t>{p, 1, ldp} : ARows<uint32_t>{p, ldp, 1};
  DpBlock<MR, NV>(d, acc, a, MR, BRows<uint32_t>{v, ldv, N}, n2);
  StoreO(acc, o, ldo);
}

// The (mr, nv) instance of Op::Run, mr <= MR and nv <= NV: the tails of a tile run the smaller blocks.
template <class Op, int MR = kMR, int NV = kNV, class... Args>
HWY_INLINE void RunBlock(int64_t mr, int64_t nv, Args... args) {
  if constexpr (NV > 1)
    if (nv < NV) return RunBlock<Op, MR, NV - 1>(mr, nv, args...);
  if constexpr (MR > 1)
    if (mr < MR) return RunBlock<Op, MR - 1, NV>(mr, nv, args...);
  Op::template Run<MR, NV>(args...);
}
struct QKOp {
  template <int MR, int NV, class... Args>
  static HWY_INLINE void Run(Args... args) { QKBlock<MR, NV>(args...); }
};
template <bool TransA>
struct PVOp {
  template <int MR, int NV, class... Args>
  static HWY_INLINE void Run(Args... args) { PVBlock<MR, NV, TransA>(args...); }
};
struct QK16Op {
  template <int MR, int NV, class... Args>
  static HWY_INLINE void Run(Args... args) { QK16Block<MR, NV>(args...); }
};
template <bool TransA = false>
struct PV16Op {
  template <int MR, int NV, class... Args>
  static HWY_INLINE void Run(Args... args) { PV16Block<MR, NV, TransA>(args...); }
};
template <int NV = kNV, class... Args>
HWY_INLINE void QK(int64_t mr, int64_t nv, Args... args) { RunBlock<QKOp, kMR, NV>(mr, nv, args...); }
template <int NV = kNV, bool TransA = false, class... Args>
HWY_INLINE void PV(int64_t mr, int64_t nv, Args... args) { RunBlock<PVOp<TransA>, kMR, NV>(mr, nv, args...); }

// f(r, c, mr, nv) for the kMR x kNV blocks of a (rows, nvec vectors) tile: vectors [c, c + nv) of rows
// [r, r + mr), column blocks outer.
template <class F>
HWY_INLINE void ForTile(int64_t rows, int64_t nvec, F&& f) {
  for (int64_t c = 0; c < nvec; c += kNV)
    for (int64_t r = 0; r < rows; r += kMR) f(r, c, std::min<int64_t>(kMR, rows - r), std::min<int64_t>(kNV, nvec - c));
}

// S (rows, lds) = scale · Q (rows, D) · Kᵀ over np panels (+ S if add), blocked kMR x kNV.
HWY_INLINE void QKTile(const float* q, int64_t rows, int64_t D, const float* kt, int64_t np, float scale, float* s,
                       int64_t lds, bool add) {
  const int64_t N = hn::Lanes(DF());
  ForTile(rows, np, [&](int64_t r, int64_t j, int64_t mr, int64_t nv) {
    QK(mr, nv, q + r * D, D, kt + j * D * N, D * N, D, scale, s + r * lds + j * N, lds, add);
  });
}

// O (rows, Dvp) = α ⊙ O + P (rows, n) · V (n, Dvp), blocked kMR x kNV; alpha may be nullptr. V's elements
// E are read by load; pf_rows: prefetch V pf_rows rows ahead (PVBlock), on the first block of rows.
template <typename E = float, class Load = LoadF32>
HWY_INLINE void PVTile(const float* p, int64_t rows, int64_t ldp, const E* v, int64_t ldv, int64_t n,
                       float* o, int64_t Dvp, const float* alpha, Load load = Load(), int64_t pf_rows = 0) {
  const int64_t N = hn::Lanes(DF());
  ForTile(rows, Dvp / N, [&](int64_t r, int64_t c, int64_t mr, int64_t nv) {
    PV(mr, nv, p + r * ldp, ldp, v + c * N, ldv, n, o + r * Dvp + c * N, Dvp, alpha ? alpha + r : nullptr, load,
       r == 0 ? pf_rows : 0);
  });
}

// QKTile over bf16 pairs: S (rows, lds) = qscale · Q (rows, D2 pairs) · Kᵀ pair panels (+ S if add).
template <int NV = kNV>  // a template, so that only a kDpTarget caller instantiates DpBlock
HWY_INLINE void QK16Tile(const uint32_t* q, int64_t rows, int64_t D2, const uint32_t* kt, int64_t np, float qscale,
                         float* s, int64_t lds, bool add) {
  const int64_t N = hn::Lanes(DF());
  ForTile(rows, np, [&](int64_t r, int64_t j, int64_t mr, int64_t nv) {
    RunBlock<QK16Op, kMR, NV>(mr, nv, q + r * D2, D2, kt + j * D2 * N, D2 * N, D2, qscale, s + r * lds + j * N,
                              lds, add);
  });
}

// PVTile over bf16 pairs: O (rows, Dvp) = α ⊙ O + P (rows, n2 pairs, ldp apart) · V pair rows (ldv = Dvp).
template <int NV = kNV>
HWY_INLINE void PV16Tile(const uint32_t* p, int64_t rows, int64_t ldp, const uint32_t* v, int64_t n2, float* o,
                         int64_t Dvp, const float* alpha) {
  const int64_t N = hn::Lanes(DF());
  ForTile(rows, Dvp / N, [&](int64_t r, int64_t c, int64_t mr, int64_t nv) {
    RunBlock<PV16Op<>, kMR, NV>(mr, nv, p + r * ldp, ldp, v + c * N, Dvp, n2, o + r * Dvp + c * N, Dvp,
                                alpha ? alpha + r : nullptr);
  });
}

}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_FLASH_COMMON_TOGGLE
