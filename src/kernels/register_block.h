// The register-blocked FMA microkernel of every product attn computes on the CPU, written once: attn's
// GEMM (gemm.cpp's Micro) and the flash kernels' tile products (flash_common.h's S = Q·Kᵀ and
// O = α⊙O + P·V, forward, backward and decode) run this loop on this block. Not a GEMM (no packing, no
// cache blocking: gemm.cpp) and not a block's start or end (each caller loads and stores its own
// accumulators: zero, β·C, α⊙O; masked columns, a bias added after the sum).
//
// Per-target header: include it after <hwy/highway.h> in a translation unit that re-includes itself
// through <hwy/foreach_target.h>; it defines attn::regblock::HWY_NAMESPACE.
//
// Bits: each accumulator is ONE chain of FMAs over k in order, acc = fma(a(r, k), b(k, j), acc), from
// whatever the caller put in it. The block size, the strides, the row clamp and the SIMD width (each
// lane is its own element) decide who computes an element and when, never its value. DpBlock is the
// same loop over bf16 pairs on VDPBF16PS; GroupBlock runs either in AMX's arithmetic, the one of every bf16
// product (gemm_bf16.cpp's microkernel and the bf16 flash tile products).
#include <algorithm>
#include <type_traits>

#include "../core/hwy_targets.h"  // ATTN_AVX512_TARGET
#include "attn/cpu.h"                // cpu_info: whether the CPU has AVX512_BF16

#if defined(ATTN_REGISTER_BLOCK_TOGGLE) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_REGISTER_BLOCK_TOGGLE
#undef ATTN_REGISTER_BLOCK_TOGGLE
#else
#define ATTN_REGISTER_BLOCK_TOGGLE
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::regblock::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register block: kMR rows x kNV vectors of accumulators, plus kNV B vectors and one broadcast A value.
// AVX-512 has 32 vector registers: 6 x 4 = 24 accumulators. The 16-register targets: 6 x 2 = 12.
#if ATTN_AVX512_TARGET(HWY_TARGET)
inline constexpr int kNV = 4;
#else
inline constexpr int kNV = 2;
#endif
inline constexpr int kMR = 6;

// Where a block reads its rows of A: element (r, k) at a[r·rs + k·ks]. Rows in place (rs = lda, ks = 1),
// transposed (rs = 1, ks = lda), or a packed panel (rs = 1, ks = kMR).
template <typename T>
struct ARows {
  const T* a;
  int64_t rs, ks;
};

// Where it reads B: the vector (k, j), j < NV, at b + k·ks + j·js (a packed panel row: ks = the row
// length, js = the lanes; Kᵀ panels: ks = the lanes, js = one panel).
template <typename E>
struct BRows {
  const E* b;
  int64_t ks, js;
};

// B's vectors as stored (unaligned). A caller with other element types passes a load that converts
// (flash_decode.cpp's LoadKV: fp16/bf16 in registers), or one that knows the alignment (gemm.cpp).
struct LoadU {
  template <typename T>
  HWY_INLINE hn::Vec<hn::ScalableTag<T>> operator()(const T* HWY_RESTRICT p) const {
    return hn::LoadU(hn::ScalableTag<T>(), p);
  }
};

// The cache lines of `bytes` bytes at byte offset `at` from p, towards L1: a hint, so past the end of
// the data it does nothing (the address is formed as an integer, never as an out-of-range pointer).
HWY_INLINE void PrefetchRow(const void* p, int64_t at, int64_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + uintptr_t(at);
  for (int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(reinterpret_cast<const char*>(a + uintptr_t(b)));
}

// f(r, j) for every accumulator of an (MR, NV) block, unrolled: the #pragma GCC unroll keeps the
// accumulators in registers (GCC 12 leaves the array on the stack without it).
template <int MR, int NV, class F>
HWY_INLINE void ForBlock(F&& f) {
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) f(r, j);
}

// The microkernel: acc[r][j] = fma(a(r, k), b(k, j), acc[r][j]) for k = 0 … n-1 in order, a(r, k)
// broadcast to every lane. Rows r >= rows read row 0 (a short block's extra sums, never stored; a
// caller that instantiates MR = rows passes MR). pf: with each k, prefetch the NV·js elements of B's
// row k + pf (0: none; decoding streams V from memory).
template <int MR, int NV, class D, typename T, typename E, class Load>
HWY_INLINE void FmaBlock(D d, hn::Vec<D> (&acc)[MR][NV], ARows<T> A, int64_t rows, BRows<E> B, int64_t n,
                         Load load, int64_t pf = 0) {
  // Row r of A's column k at ak[off[r]], ak advancing by ks: one pointer step per k (six row pointers,
  // each stepped, cost a packed panel 6 adds and a spilled stride per k: 0.885x on 4096x512x512 NT).
  int64_t off[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) off[r] = (r < rows ? r : 0) * A.rs;
  const T* ak = A.a;
  const int64_t ks = A.ks;
  for (int64_t k = 0; k < n; ++k, ak += ks) {
    if (pf) PrefetchRow(B.b, (k + pf) * B.ks * int64_t(sizeof(E)), NV * B.js * int64_t(sizeof(E)));
    hn::Vec<D> b[NV];
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) b[j] = load(B.b + k * B.ks + j * B.js);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const hn::Vec<D> a = hn::Set(d, ak[off[r]]);
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[r][j] = hn::MulAdd(a, b[j], acc[r][j]);
    }
  }
}

// ---- bf16 pairs (AVX512_BF16's operand layout: a 32-bit word holds bf16 k = 2q low, 2q + 1 high) ----

// Whether this target can run VDPBF16PS (a kernel runs it only where cpu_info().bf16 says the CPU has it;
// elsewhere its bf16 products run on FmaBlock over fp32 operands ordered to give the same bits).
#if ATTN_AVX512_TARGET(HWY_TARGET)
inline constexpr bool kDpTarget = true;
#else
inline constexpr bool kDpTarget = false;
#endif
// Whether DpBlock runs here: this target can and the CPU has it (set_cpu_bf16 may say not).
inline bool UseDp() { return kDpTarget && cpu_info().bf16; }

#if ATTN_AVX512_TARGET(HWY_TARGET)
// acc += a · b pairwise: VDPBF16PS, through the assembler (the compiler is not asked for the feature: a
// caller runs it only where cpu_info().bf16 says the CPU has it).
template <class V, class VU>
HWY_INLINE V Dp(V acc, VU a, VU b) {
  asm("vdpbf16ps %2, %1, %0" : "+v"(acc.raw) : "v"(a.raw), "v"(b.raw));
  return acc;
}
#endif

// The pair microkernel, VDPBF16PS on AVX-512 targets only (a caller instantiates it under kDpTarget and
// runs it where UseDp()): acc[r][j] = dp(a(r, q), b(q, j), acc[r][j]) for pairs q = 0 … n-1 in order, where
// dp adds the odd k's product, then the even k's, each sum rounded to nearest even, subnormal inputs and
// sums flushed to zero. A product of two bf16 has at most 16 significant bits, so it is exact in fp32:
// FmaBlock over the same values as fp32, odd k before even, under MXCSR's DAZ and FTZ (pairs.h
// FlushSubnormals) gives the same bits (GroupBlock's two ways of one chain).
// A and B as in FmaBlock, over 32-bit words; rows r >= rows read row 0.
template <int MR, int NV, class D>
HWY_INLINE void DpBlock(D d, hn::Vec<D> (&acc)[MR][NV], ARows<uint32_t> A, int64_t rows, BRows<uint32_t> B,
                        int64_t n) {
#if ATTN_AVX512_TARGET(HWY_TARGET)
  const hn::RebindToUnsigned<D> du;
  using VU = hn::Vec<decltype(du)>;
  int64_t off[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) off[r] = (r < rows ? r : 0) * A.rs;
  const uint32_t* ak = A.a;
  for (int64_t q = 0; q < n; ++q, ak += A.ks) {
    VU b[NV];
#pragma GCC unroll 16
    for (int j = 0; j < NV; ++j) b[j] = hn::LoadU(du, B.b + q * B.ks + j * B.js);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const VU a = hn::Set(du, ak[off[r]]);
#pragma GCC unroll 16
      for (int j = 0; j < NV; ++j) acc[r][j] = Dp(acc[r][j], a, b[j]);
    }
  }
#else
  static_assert(!sizeof(D), "VDPBF16PS runs on AVX-512 targets only: instantiate DpBlock under kDpTarget");
  (void)d, (void)acc, (void)A, (void)rows, (void)B, (void)n;
#endif
}

// ---- Every bf16 product of attn, in AMX's arithmetic (TDPBF16PS's, docs/kernels.md) ----
// k runs in GROUPS of 16 pairs (32 k) from the start of the sum; per group and element of C, two fp32 chains
// from +0, E over the group's even k and O over its odd k, each in order, then C = C + (E + O), every add
// rounded to nearest even, subnormals flushed (the caller's FlushSubnormals). Operands come as T:
// - float: bf16 values as fp32 (a bf16 is an fp32's high half) in k order, 32 positions a group: E runs
//   FmaBlock over the even positions, O over the odd ones (each product is exact in fp32);
// - uint32_t: CHAIN words, 16 a group: word 2s holds k = 4s (high) and 4s + 2 (low), word 2s + 1 k = 4s + 1
//   and 4s + 3 (pairs.h ChainRows), so one VDPBF16PS, which adds a word's high product first, is two
//   steps of one chain: E runs DpBlock over the even words, O over the odd ones.
// AMX itself multiplies plain pair words (gemm_bf16.cpp, flash_common.h's tiles).
inline constexpr int64_t kGroupPairs = 16;
// 32-bit elements per pair of kind T: two floats, or one word; per group.
template <typename T>
inline constexpr int64_t kPairWidth = std::is_same_v<T, float> ? 2 : 1;
template <typename T>
inline constexpr int64_t kGroupPositions = kGroupPairs * kPairWidth<T>;

// C (MR, NV·N) at c (rows ldc apart) = C0 + A·B over n positions along k (whole groups: the depth padded
// with zeros), C0 = 0 where `zero`, else what C holds; A and B as in FmaBlock, position by position (E and O
// step their strides twice). Rows r >= rows read row 0; C is read and written by full vectors, MR rows.
template <int MR, int NV, class D, typename T>
HWY_INLINE void GroupBlock(D d, ARows<T> A, int64_t rows, BRows<T> B, int64_t n, float* HWY_RESTRICT c,
                           int64_t ldc, bool zero) {
  constexpr int64_t G = kGroupPositions<T>;
  const int64_t N = hn::Lanes(d);
  hn::Vec<D> ev[MR][NV], od[MR][NV];
  for (int64_t k = 0; k < n; k += G) {
    ForBlock<MR, NV>([&](int r, int j) { ev[r][j] = od[r][j] = hn::Zero(d); });
    const ARows<T> ae{A.a + k * A.ks, A.rs, 2 * A.ks}, ao{ae.a + A.ks, A.rs, 2 * A.ks};
    const BRows<T> be{B.b + k * B.ks, 2 * B.ks, B.js}, bo{be.b + B.ks, 2 * B.ks, B.js};
    if constexpr (std::is_same_v<T, float>) {
      FmaBlock<MR, NV>(d, ev, ae, rows, be, G / 2, LoadU());
      FmaBlock<MR, NV>(d, od, ao, rows, bo, G / 2, LoadU());
    } else {
      DpBlock<MR, NV>(d, ev, ae, rows, be, G / 2);
      DpBlock<MR, NV>(d, od, ao, rows, bo, G / 2);
    }
    const bool from_zero = zero && k == 0;
    ForBlock<MR, NV>([&](int r, int j) {
      float* p = c + r * ldc + j * N;
      const hn::Vec<D> c0 = from_zero ? hn::Zero(d) : hn::LoadU(d, p);
      hn::StoreU(hn::Add(c0, hn::Add(ev[r][j], od[r][j])), d, p);
    });
  }
}

// ---- bf16 pairs (pairs.h's layout) in registers: the operands of DpBlock, made from fp32 or bf16 ----
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;

// x rounded to bf16 in each lane's high half: bits + 0x7FFF + (bit 16) rounds to nearest even; a NaN is
// truncated instead (the carry could turn it into an infinity), keeping it NaN with its quiet bit. The one
// fp32 -> bf16 rounding of attn: to_half (StoreBf16), the bf16 GEMM's packing and C, the bf16 flash's P run it.
HWY_INLINE VU RoundedBf16(VF x) {
  const DU du;
  const VU bits = hn::BitCast(du, x);
  const VU rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u))));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), bits, rounded);
}

// n floats at src converted by store (a vector to its N outputs at out) to dst: whole vectors, then the tail
// through a padded one, so it converts as they do.
template <typename Out, class Store>
HWY_INLINE void StoreRow(const float* HWY_RESTRICT src, int64_t n, Out* HWY_RESTRICT dst, const Store& store) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) store(hn::LoadU(df, src + i), dst + i);
  if (i < n) {
    HWY_ALIGN float in[hn::MaxLanes(df)] = {};
    HWY_ALIGN Out out[hn::MaxLanes(df)];
    std::copy(src + i, src + n, in);
    store(hn::Load(df, in), out);
    std::copy(out, out + (n - i), dst + i);
  }
}

// n floats at src rounded to bf16 (RoundedBf16) at dst: to_half's bf16 (flash_decode.cpp) and a bf16 C
// (gemm_bf16.cpp).
HWY_INLINE void StoreBf16(const float* HWY_RESTRICT src, int64_t n, uint16_t* HWY_RESTRICT dst) {
  StoreRow(src, n, dst, [](VF v, uint16_t* out) {  // the high halves, narrowed (each fits 16 bits)
    const hn::Rebind<uint16_t, DF> d16;
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<DF>(), hn::ShiftRight<16>(RoundedBf16(v)))), d16, out);
  });
}

// The N pair words of 2N consecutive floats, a then b: word q = bf16(element 2q) | bf16(element 2q + 1) << 16.
HWY_INLINE VU PairWords(VF a, VF b) {
  const DU du;
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(du, hn::GetLane(hn::ShiftRight<16>(RoundedBf16(a))) | (hn::GetLane(RoundedBf16(b)) & 0xFFFF0000u));
#else
  const hn::Repartition<uint16_t, DF> d16;  // the odd halves of each lane are the bf16 values, in order
  return hn::BitCast(du, hn::ConcatOdd(d16, hn::BitCast(d16, RoundedBf16(b)), hn::BitCast(d16, RoundedBf16(a))));
#endif
}

#if ATTN_AVX512_TARGET(HWY_TARGET)
// PairWords by VCVTNE2PS2BF16 (AVX512_BF16: a caller runs it only where cpu_info().bf16), one instruction for
// the dozen of RoundedBf16 twice: the same words for values that are not subnormal and NaN only if quiet (the
// instruction reads a subnormal as 0 and quiets a NaN), as arithmetic under FTZ gives them.
HWY_INLINE VU PairWordsNe(VF a, VF b) {
  VU r;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r.raw) : "v"(b.raw), "v"(a.raw));  // the last source: the low half
  return r;
}
#endif

// The N pair words of two rows where k runs across them: word j = bf16(lo[j]) | bf16(hi[j]) << 16.
HWY_INLINE VU PairAcross(VF lo, VF hi) {
  const DU du;
  return hn::Or(hn::ShiftRight<16>(RoundedBf16(lo)), hn::And(RoundedBf16(hi), hn::Set(du, 0xFFFF0000u)));
}

// The first n <= Lanes(d) elements at p, 0 past them; nothing past p + n is read.
template <class D, typename T>
HWY_INLINE hn::Vec<D> LoadFirst(D d, const T* HWY_RESTRICT p, size_t n) {
  if (n == hn::Lanes(d)) return hn::LoadU(d, p);
  HWY_ALIGN T part[hn::MaxLanes(d)] = {};
  std::copy(p, p + n, part);
  return hn::Load(d, part);
}

// The same from memory: word j = pair of lo[j] and hi[j] for the first n <= N elements (fp32 rounded, bf16
// as is), 0 past n; hi null: a zero row.
HWY_INLINE VU PairAcross(const uint16_t* HWY_RESTRICT lo, const uint16_t* HWY_RESTRICT hi, size_t n) {
  const DU du;
  const hn::Rebind<uint16_t, DU> d16;
  const VU low = hn::PromoteTo(du, LoadFirst(d16, lo, n));
  return hi ? hn::Or(low, hn::ShiftLeft<16>(hn::PromoteTo(du, LoadFirst(d16, hi, n)))) : low;
}
HWY_INLINE VU PairAcross(const float* HWY_RESTRICT lo, const float* HWY_RESTRICT hi, size_t n) {
  const DF df;
  return PairAcross(LoadFirst(df, lo, n), hi ? LoadFirst(df, hi, n) : hn::Zero(df));
}

}  // namespace attn::regblock::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_REGISTER_BLOCK_TOGGLE
