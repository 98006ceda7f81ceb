// FlashAttention building blocks shared by the CPU flash kernels (forward and backward): the
// packing of K (as Kᵀ panels) and V, the register-blocked tile products S = Q·Kᵀ and O = α⊙O + P·V (on
// register_block.h's microkernel, the GEMM's; in fp32, or over bf16 pairs in AMX's arithmetic: AMX tiles
// (amx.h), or register_block.h's GroupBlock on VDPBF16PS or FMAs, the same bits), and a vectorized exp2
// (which can write P as bf16 pairs). Internal to src/kernels; not a kernel by itself (flash_forward.cpp drives
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

#include "amx.h"
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
// polynomial and one rounding of f·ln2 contribute error (within an ulp: 8.2e-8 relative, test_exp2.cpp).
// round(x) without a float->int conversion: t = x + 1.5·2^23 rounds x to an integer (nearest even)
// in t's low mantissa bits, so t - 1.5·2^23 = q exactly and t's bits << 23 = q << 23 (|q| < 2^22).
// kBf16: for the bf16 kernels, whose P is rounded to bf16's 8 significant bits (a relative error up to 2^-9)
// right after, or summed into l beside such P: 2^f by a degree-3 minimax polynomial in f, relative error at
// most 7.6e-5 = 2^-13.7 (flash_pack.h's kExp2Bf16Error, tested): three FMAs where e^r spends ten operations.
template <bool kBf16 = false>
HWY_INLINE VF Exp2(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  const VF magic = hn::Set(d, 12582912.f);  // 1.5·2^23
  const VF t = hn::Add(x, magic);
  const VF f = hn::Sub(x, hn::Sub(t, magic));
  VF y;
  if constexpr (kBf16)
    y = hn::MulAdd(hn::MulAdd(hn::MulAdd(hn::Set(d, 0.0551716685f), f, hn::Set(d, 0.242611125f)), f,
                              hn::Set(d, 0.693260968f)),
                   f, hn::Set(d, 0.999928057f));
  else
    y = hn::Add(hn::impl::ExpImpl<float>().ExpPoly(d, hn::Mul(f, hn::Set(d, kLn2))), hn::Set(d, 1.f));
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

// The lanes of v summed by halves: lane i + lane i + N/2, then the same on the lower half, down to one.
template <class D>
HWY_INLINE float HalvesSum(D, hn::Vec<D> v) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(D()) > 1) {
    const hn::Half<D> dh;
    return HalvesSum(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
#endif
  return hn::GetLane(v);
}

// Σ of the 16 virtual lanes held by acc[0, kSumVecs): halves added until one is left,
// ((l0 + l8) + (l4 + l12)) + ((l2 + l10) + (l6 + l14)) + …, the same tree on every target: whole vectors
// while a half spans them, then within the last one (in registers: the scalar tree was a tenth of the bf16
// flash forward on AMX).
HWY_INLINE float SumLanes(const VF* acc) {
  VF v[kSumVecs];
  for (int64_t i = 0; i < kSumVecs; ++i) v[i] = acc[i];
  for (int64_t n = kSumVecs; n > 1; n /= 2)
    for (int64_t i = 0; i < n / 2; ++i) v[i] = hn::Add(v[i], v[i + n / 2]);
  return HalvesSum(DF(), v[0]);
}

// ---- bf16 pairs as the kernels store them, of two kinds E ----
// uint32_t: pair words (pairs.h's layout: AMX's operands), made by RoundedBf16, PairWords and PairAcross
// (register_block.h); for VDPBF16PS rewritten to chain words after (pairs.h ChainRows). float (the
// emulation): bf16 values as fp32 in k order, a pair row two rows, a pair along a row two elements. Either
// way every depth is padded with zero pairs to whole groups (kGroupPairs), as AMX's tiles need.

// x rounded to bf16 (RoundedBf16), as an fp32.
HWY_INLINE VF Bf16Value(VF x) { return hn::BitCast(DF(), hn::And(RoundedBf16(x), hn::Set(DU(), 0xFFFF0000u))); }

// n rounded up to whole groups of pairs: the padded depth of n k's, in pairs.
inline int64_t GroupPairs(int64_t n) { return round_up((n + 1) / 2, kGroupPairs); }

// 2N elements of a row along k (a, then b) as pairs at out: N pair words, or 2N floats. ne: values computed
// under FTZ (P, dS), which VCVTNE2PS2BF16 may round where the CPU has it (UseNe).
HWY_INLINE bool UseNe() { return UseDp(); }
HWY_INLINE void StorePairs(VF a, VF b, uint32_t* out, bool ne = false) {
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if (ne) return hn::StoreU(PairWordsNe(a, b), DU(), out);
#endif
  (void)ne;
  hn::StoreU(PairWords(a, b), DU(), out);
}
HWY_INLINE void StorePairs(VF a, VF b, float* out, bool = false) {
  hn::StoreU(Bf16Value(a), DF(), out), hn::StoreU(Bf16Value(b), DF(), out + hn::Lanes(DF()));
}

// Two rows where k runs across them (lo: k = 2i, hi: 2i + 1) as the pair row i at out: one row of words, or
// the rows out (lo) and out + ld (hi).
HWY_INLINE void StoreAcross(VF lo, VF hi, uint32_t* out, int64_t) { hn::StoreU(PairAcross(lo, hi), DU(), out); }
HWY_INLINE void StoreAcross(VF lo, VF hi, float* out, int64_t ld) {
  hn::StoreU(Bf16Value(lo), DF(), out), hn::StoreU(Bf16Value(hi), DF(), out + ld);
}

// The pair rows [0, pairs) of `rows` rows of floats (ld apart, width a multiple of the lanes): pair row i of
// out (rows ldo apart) pairs rows 2i and 2i + 1 (StoreAcross), a row past `rows` zero. Kᵀ panels' rows are
// d, so this pairs a panel along D; rows of keys or queries, it pairs them across.
template <typename E>
HWY_INLINE void PairRowsOf(const float* x, int64_t rows, int64_t ld, int64_t width, E* out, int64_t ldo,
                           int64_t pairs) {
  const DF d;
  const int64_t N = hn::Lanes(d), pw = kPairWidth<E>;
  const auto row = [&](int64_t i, int64_t j) { return i < rows ? hn::LoadU(d, x + i * ld + j) : hn::Zero(d); };
  for (int64_t i = 0; i < pairs; ++i)
    for (int64_t j = 0; j < width; j += N) StoreAcross(row(2 * i, j), row(2 * i + 1, j), out + pw * i * ldo + j, ldo);
}

// The pairs [0, pairs) of row x[0, n), zero past n (StorePairs): `pairs` words, or 2·pairs floats (out may
// be x). pairs is a multiple of the lanes.
template <typename E>
HWY_INLINE void PairRow(const float* x, int64_t n, E* out, int64_t pairs) {
  const DF d;
  const int64_t N = hn::Lanes(d), pw = kPairWidth<E>;
  const auto part = [&](int64_t j) {
    return LoadFirst(d, x + std::min(j, std::max<int64_t>(n - 1, 0)),
                     static_cast<size_t>(std::clamp<int64_t>(n - j, 0, N)));
  };
  for (int64_t j = 0; j < 2 * pairs; j += 2 * N) StorePairs(part(j), part(j + N), out + pw * j / 2);
}

// The pair words of `rows` rows (stride apart, n words each; rows a multiple of 2, as whole groups are) as
// VDPBF16PS's chain words where `chain` (pairs.h ChainRows); rows of floats or AMX's words stay.
HWY_INLINE void ChainRowsIf(bool chain, uint32_t* p, int64_t rows, int64_t stride, int64_t n) {
  if (chain) pairs::ChainRows(p, rows, stride, n);
}
HWY_INLINE void ChainRowsIf(bool, float*, int64_t, int64_t, int64_t) {}

// row[j] = 2^(row[j] - m) for j < n (n a multiple of the lanes; Exp2<kBf16>); returns the sum of the new row over
// the virtual lanes (SumLanes). With pairs (bf16): the new row goes to pairs [0, padded) as PairRow writes them
// (zero past n; pair words, not to row; or floats, which may be row itself: it has room for them).
template <bool kBf16 = false, typename E = uint32_t>
HWY_INLINE float Exp2Row(float* row, int64_t n, float m, E* pairs = nullptr, int64_t padded = 0) {
  const DF d;
  const int64_t N = hn::Lanes(d), pw = kPairWidth<E>;
  const VF vm = hn::Set(d, m);
  VF sum[kSumVecs];
  for (int64_t v = 0; v < kSumVecs; ++v) sum[v] = hn::Zero(d);
  if (pairs) {  // vector i of the row goes to virtual lanes i % kSumVecs, in order, as below
    const bool ne = UseNe();
    for (int64_t j = 0; j < 2 * padded; j += 2 * N) {
      VF p0 = hn::Zero(d), p1 = hn::Zero(d);
      if (j < n) {
        p0 = Exp2<kBf16>(d, hn::Sub(hn::LoadU(d, row + j), vm));
        sum[(j / N) % kSumVecs] = hn::Add(sum[(j / N) % kSumVecs], p0);
      }
      if (j + N < n) {
        p1 = Exp2<kBf16>(d, hn::Sub(hn::LoadU(d, row + j + N), vm));
        sum[(j / N + 1) % kSumVecs] = hn::Add(sum[(j / N + 1) % kSumVecs], p1);
      }
      StorePairs(p0, p1, pairs + pw * j / 2, ne);
    }
    return SumLanes(sum);
  }
  for (int64_t j0 = 0; j0 < n; j0 += kSumLanes)
#pragma GCC unroll 16
    for (int64_t v = 0; v < kSumVecs; ++v) {
      const int64_t j = j0 + v * N;
      if (j >= n) break;
      const VF p = Exp2<kBf16>(d, hn::Sub(hn::LoadU(d, row + j), vm));
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
    hn::StoreU(add      ? hn::MulAdd(acc[r][j], vs, hn::LoadU(d, dst))
               : scaled ? hn::Mul(acc[r][j], vs)
                        : acc[r][j],
               d, dst);
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

// S at dst = qscale · x, plus what S holds already if `add` (the mask bias): a bf16 tile's scores from their
// fp32 sums (QK16Block's, QKAmx's).
HWY_INLINE void StoreScores(VF x, VF qscale, float* HWY_RESTRICT dst, bool add) {
  hn::StoreU(add ? hn::MulAdd(x, qscale, hn::LoadU(DF(), dst)) : hn::Mul(x, qscale), DF(), dst);
}

// S (MR, NV·N) = qscale · (Q (MR, n) · Kᵀ (n, NV·N)) over bf16 pairs (GroupBlock: n positions, whole
// groups), plus what S holds already if `add` (the mask bias): q: MR rows of pairs E, ldq apart; kt: NV
// consecutive Kᵀ pair panels ((n, N) elements), ldp apart. The scale is applied to the fp32 sum, as torch's
// bf16 SDPA does.
template <int MR, int NV, typename E>
HWY_NOINLINE void QK16Block(const E* HWY_RESTRICT q, int64_t ldq, const E* HWY_RESTRICT kt, int64_t ldp, int64_t n,
                            float qscale, float* HWY_RESTRICT s, int64_t lds, bool add) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  HWY_ALIGN float acc[MR * NV * hn::MaxLanes(d)];
  GroupBlock<MR, NV>(d, ARows<E>{q, ldq, 1}, MR, BRows<E>{kt, N, ldp}, n, acc, NV * N, true);
  const VF vs = hn::Set(d, qscale);
  ForBlock<MR, NV>([&](int r, int j) {
    StoreScores(hn::Load(d, acc + (r * NV + j) * N), vs, s + r * lds + j * N, add);
  });
}

// Rows [0, rows) of O (width floats, a multiple of the lanes, rows ldo apart) times α per row, in place.
HWY_INLINE void ScaleRows(float* HWY_RESTRICT o, int64_t rows, int64_t width, int64_t ldo,
                          const float* HWY_RESTRICT alpha) {
  const DF d;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; c += static_cast<int64_t>(hn::Lanes(d)))
      hn::StoreU(hn::Mul(hn::LoadU(d, o + r * ldo + c), hn::Set(d, alpha[r])), d, o + r * ldo + c);
}

// O (MR, NV·N) = α ⊙ O + P (MR, n) · V (n, NV·N) over bf16 pairs (GroupBlock: n positions, whole groups); α
// per row, or none. p: MR rows of pairs E along keys, ldp apart, or with TransA P's transpose stored (n,
// ldp) (the backward's dQ = dS·K from dSᵀ's pair rows); v: pair rows of V, ldv apart. o: row stride ldo.
template <int MR, int NV, bool TransA = false, typename E>
HWY_NOINLINE void PV16Block(const E* HWY_RESTRICT p, int64_t ldp, const E* HWY_RESTRICT v, int64_t ldv, int64_t n,
                            float* HWY_RESTRICT o, int64_t ldo, const float* HWY_RESTRICT alpha) {
  const DF d;
  if (alpha) ScaleRows(o, MR, NV * static_cast<int64_t>(hn::Lanes(d)), ldo, alpha);
  const ARows<E> a = TransA ? ARows<E>{p, 1, ldp} : ARows<E>{p, ldp, 1};
  GroupBlock<MR, NV>(d, a, MR, BRows<E>{v, ldv, static_cast<int64_t>(hn::Lanes(d))}, n, o, ldo, false);
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

// f(r, c, mr, nv) for the kMR x NV blocks of a (rows, nvec vectors) tile: vectors [c, c + nv) of rows
// [r, r + mr), column blocks outer, or with RowsOuter row blocks outer.
template <int NV = kNV, bool RowsOuter = false, class F>
HWY_INLINE void ForTile(int64_t rows, int64_t nvec, F&& f) {
  const auto block = [&](int64_t r, int64_t c) {
    f(r, c, std::min<int64_t>(kMR, rows - r), std::min<int64_t>(NV, nvec - c));
  };
  if constexpr (RowsOuter) {
    for (int64_t r = 0; r < rows; r += kMR)
      for (int64_t c = 0; c < nvec; c += NV) block(r, c);
  } else {
    for (int64_t c = 0; c < nvec; c += NV)
      for (int64_t r = 0; r < rows; r += kMR) block(r, c);
  }
}

// Vectors per block of the bf16 tiles: the fp32 block's for floats (E, then O: E waits on the stack), 2 for
// VDPBF16PS's chain words (E and O together, 24 accumulators).
template <typename E>
inline constexpr int kNV16 = std::is_same_v<E, float> ? kNV : 2;

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
// Row blocks outer: a block's kMR rows of P (6 KB at n = 256), which the FMAs take as broadcasts, stay in
// L1 across O's columns, and V streams from L2 as whole vectors. With columns outer P came from L2 once per
// kNV vectors of V: the forward 1-8% slower at D 64 and 128 on a Zen 3 (BENCHMARKS.md, issue 40).
template <typename E = float, class Load = LoadF32>
HWY_INLINE void PVTile(const float* p, int64_t rows, int64_t ldp, const E* v, int64_t ldv, int64_t n,
                       float* o, int64_t Dvp, const float* alpha, Load load = Load(), int64_t pf_rows = 0) {
  const int64_t N = hn::Lanes(DF());
  ForTile<kNV, true>(rows, Dvp / N, [&](int64_t r, int64_t c, int64_t mr, int64_t nv) {
    PV(mr, nv, p + r * ldp, ldp, v + c * N, ldv, n, o + r * Dvp + c * N, Dvp, alpha ? alpha + r : nullptr, load,
       r == 0 ? pf_rows : 0);
  });
}

#if ATTN_AVX512_TARGET(HWY_TARGET)
// ---- The bf16 tiles on AMX (amx.h's Block: 32 rows x 16 or 32 columns, one TDPBF16PS per tile and group) ----
// N is 16 here, so a Kᵀ pair panel ((n, 16) words) is a column of B tiles, each group's 1 KB in one piece.

// S = qscale · Q·Kᵀ (+ S if add), as QK16Tile: the products to a block in L1, scaled (and added) from there.
HWY_INLINE void QKAmx(const uint32_t* q, int64_t rows, int64_t n, const uint32_t* kt, int64_t np, float qscale,
                      float* s, int64_t lds, bool add) {
  const DF d;
  const VF vs = hn::Set(d, qscale);
  HWY_ALIGN float acc[32 * 32];
  for (int64_t j = 0; j < np; j += 2)
    for (int64_t r = 0; r < rows; r += 32) {
      const int64_t nc = std::min<int64_t>(2, np - j);
      const amx::ATiles a{q + r * n, n, kGroupPairs};
      const amx::BTiles b{kt + j * n * 16, 16, kGroupPairs * 16, n * 16};
      if (nc == 2) amx::Block<2>(a, b, n / kGroupPairs, acc, 32, true);
      else amx::Block<1>(a, b, n / kGroupPairs, acc, 32, true);
      for (int64_t i = 0; i < std::min<int64_t>(32, rows - r); ++i)
        for (int64_t c = 0; c < nc * 16; c += 16)
          StoreScores(hn::Load(d, acc + i * 32 + c), vs, s + (r + i) * lds + j * 16 + c, add);
    }
}

// O = α ⊙ O + P·V, as PV16Tile: O's rows scaled in place, then loaded into the C tiles.
HWY_INLINE void PVAmx(const uint32_t* p, int64_t rows, int64_t ldp, const uint32_t* v, int64_t n, float* o,
                      int64_t Dvp, const float* alpha) {
  if (alpha) ScaleRows(o, rows, Dvp, Dvp, alpha);
  for (int64_t c = 0; c < Dvp; c += 32)
    for (int64_t r = 0; r < rows; r += 32) {
      const amx::ATiles a{p + r * ldp, ldp, kGroupPairs};
      const amx::BTiles b{v + c, Dvp, kGroupPairs * Dvp, 16};
      if (Dvp - c >= 32) amx::Block<2>(a, b, n / kGroupPairs, o + r * Dvp + c, Dvp, false);
      else amx::Block<1>(a, b, n / kGroupPairs, o + r * Dvp + c, Dvp, false);
    }
}
#endif

// How the bf16 tiles multiply: AMX tiles (pair words), VDPBF16PS (chain words) or FMAs (floats), the same bits.
enum class Bf16Kernel { amx, dp, emu };

// QKTile over bf16 pairs: S (rows, lds) = qscale · Q (rows, n positions, n apart) · Kᵀ pair panels (+ S if
// add). AMX: 32-row blocks, so Q has rows up to a multiple of 32 (rows past `rows` computed, not stored).
template <typename E>
HWY_INLINE void QK16Tile(Bf16Kernel kernel, const E* q, int64_t rows, int64_t n, const E* kt, int64_t np,
                         float qscale, float* s, int64_t lds, bool add) {
  const int64_t N = hn::Lanes(DF());
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if constexpr (std::is_same_v<E, uint32_t>)
    if (kernel == Bf16Kernel::amx) return QKAmx(q, rows, n, kt, np, qscale, s, lds, add);
#endif
  (void)kernel;
  ForTile<kNV16<E>>(rows, np, [&](int64_t r, int64_t j, int64_t mr, int64_t nv) {
    RunBlock<QK16Op, kMR, kNV16<E>>(mr, nv, q + r * n, n, kt + j * n * N, n * N, n, qscale, s + r * lds + j * N, lds,
                                    add);
  });
}

// PVTile over bf16 pairs: O (rows, Dvp) = α ⊙ O + P (rows, n positions, ldp apart) · V pair rows (ldv = Dvp).
// AMX: 32-row blocks of O and P (rows past `rows` computed from what P and O hold there).
template <typename E>
HWY_INLINE void PV16Tile(Bf16Kernel kernel, const E* p, int64_t rows, int64_t ldp, const E* v, int64_t n, float* o,
                         int64_t Dvp, const float* alpha) {
  const int64_t N = hn::Lanes(DF());
#if ATTN_AVX512_TARGET(HWY_TARGET)
  if constexpr (std::is_same_v<E, uint32_t>)
    if (kernel == Bf16Kernel::amx) return PVAmx(p, rows, ldp, v, n, o, Dvp, alpha);
#endif
  (void)kernel;
  ForTile<kNV16<E>>(rows, Dvp / N, [&](int64_t r, int64_t c, int64_t mr, int64_t nv) {
    RunBlock<PV16Op<>, kMR, kNV16<E>>(mr, nv, p + r * ldp, ldp, v + c * N, Dvp, n, o + r * Dvp + c * N, Dvp,
                                alpha ? alpha + r : nullptr);
  });
}

}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_FLASH_COMMON_TOGGLE
