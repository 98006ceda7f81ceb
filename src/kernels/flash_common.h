// FlashAttention building blocks shared by the CPU flash kernels (forward and backward): the
// packing of K (as Kᵀ panels) and V, the register-blocked tile products S = Q·Kᵀ and O = α⊙O + P·V (on
// register_block.h's microkernel, the GEMM's), and a vectorized exp2. Internal to src/kernels; not a kernel by itself (flash_forward.cpp drives
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
#include "flash_pack.h"

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

// row[j] = 2^(row[j] - m) for j < n (n a multiple of the lanes); returns the sum of the new row over the
// virtual lanes (SumLanes).
HWY_INLINE float Exp2Row(float* HWY_RESTRICT row, int64_t n, float m) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const VF vm = hn::Set(d, m);
  VF sum[kSumVecs];
  for (int64_t v = 0; v < kSumVecs; ++v) sum[v] = hn::Zero(d);
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

// S (MR, NV·N) = Q (MR, D) · Kᵀ (D, NV·N), plus what S holds already if `add` (the mask bias).
// q: MR rows, row stride ldq. kt: NV consecutive Kᵀ panels, ldp floats apart. s: row stride lds.
template <int MR, int NV>
HWY_NOINLINE void QKBlock(const float* HWY_RESTRICT q, int64_t ldq, const float* HWY_RESTRICT kt, int64_t ldp,
                          int64_t D, float* HWY_RESTRICT s, int64_t lds, bool add) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  VF acc[MR][NV];
  ForBlock<MR, NV>([&](int r, int j) { acc[r][j] = hn::Zero(d); });
  FmaBlock<MR, NV>(d, acc, ARows<float>{q, ldq, 1}, MR, BRows<float>{kt, N, ldp}, D, LoadF32());
  ForBlock<MR, NV>([&](int r, int j) {
    float* dst = s + r * lds + j * N;
    hn::StoreU(add ? hn::Add(acc[r][j], hn::LoadU(d, dst)) : acc[r][j], d, dst);
  });
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
  ForBlock<MR, NV>([&](int r, int j) {
    acc[r][j] = hn::LoadU(d, o + r * ldo + j * N);
    if (alpha) acc[r][j] = hn::Mul(acc[r][j], hn::Set(d, alpha[r]));
  });
  const ARows<float> a = TransA ? ARows<float>{p, 1, ldp} : ARows<float>{p, ldp, 1};
  FmaBlock<MR, NV>(d, acc, a, MR, BRows<E>{v, ldv, N}, n, load, pf_rows);
  ForBlock<MR, NV>([&](int r, int j) { hn::StoreU(acc[r][j], d, o + r * ldo + j * N); });
}

// Runtime block sizes (mr <= kMR, nv <= kNV) to the template instance; the tails of a tile use the
// smaller ones.
template <int NV, int MR = kMR, class... Args>
HWY_INLINE void QKRows(int64_t mr, Args... args) {
  if constexpr (MR > 1)
    if (mr < MR) return QKRows<NV, MR - 1>(mr, args...);
  QKBlock<MR, NV>(args...);
}
template <int NV = kNV, class... Args>
HWY_INLINE void QK(int64_t mr, int64_t nv, Args... args) {
  if constexpr (NV > 1)
    if (nv < NV) return QK<NV - 1>(mr, nv, args...);
  QKRows<NV>(mr, args...);
}
template <int NV, int MR = kMR, bool TransA = false, class... Args>
HWY_INLINE void PVRows(int64_t mr, Args... args) {
  if constexpr (MR > 1)
    if (mr < MR) return PVRows<NV, MR - 1, TransA>(mr, args...);
  PVBlock<MR, NV, TransA>(args...);
}
template <int NV = kNV, bool TransA = false, class... Args>
HWY_INLINE void PV(int64_t mr, int64_t nv, Args... args) {
  if constexpr (NV > 1)
    if (nv < NV) return PV<NV - 1, TransA>(mr, nv, args...);
  PVRows<NV, kMR, TransA>(mr, args...);
}

// S (rows, lds) = Q (rows, D) · Kᵀ over np panels (+ S if add), blocked kMR x kNV.
HWY_INLINE void QKTile(const float* q, int64_t rows, int64_t D, const float* kt, int64_t np, float* s,
                       int64_t lds, bool add) {
  const int64_t N = hn::Lanes(DF());
  for (int64_t j = 0; j < np; j += kNV) {
    const int64_t nv = np - j < kNV ? np - j : kNV;
    for (int64_t r = 0; r < rows; r += kMR)
      QK(rows - r < kMR ? rows - r : kMR, nv, q + r * D, D, kt + j * D * N, D * N, D, s + r * lds + j * N, lds, add);
  }
}

// O (rows, Dvp) = α ⊙ O + P (rows, n) · V (n, Dvp), blocked kMR x kNV; alpha may be nullptr. V's elements
// E are read by load; pf_rows: prefetch V pf_rows rows ahead (PVBlock), on the first block of rows.
template <typename E = float, class Load = LoadF32>
HWY_INLINE void PVTile(const float* p, int64_t rows, int64_t ldp, const E* v, int64_t ldv, int64_t n,
                       float* o, int64_t Dvp, const float* alpha, Load load = Load(), int64_t pf_rows = 0) {
  const int64_t N = hn::Lanes(DF());
  const int64_t nvec = Dvp / N;
  for (int64_t c = 0; c < nvec; c += kNV) {
    const int64_t nv = nvec - c < kNV ? nvec - c : kNV;
    for (int64_t r = 0; r < rows; r += kMR)
      PV(rows - r < kMR ? rows - r : kMR, nv, p + r * ldp, ldp, v + c * N, ldv, n, o + r * Dvp + c * N, Dvp,
         alpha ? alpha + r : nullptr, load, r == 0 ? pf_rows : 0);
  }
}

}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_FLASH_COMMON_TOGGLE
