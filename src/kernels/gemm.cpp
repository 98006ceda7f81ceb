// attn's dense matrix product: a BLIS-style packed GEMM on Highway microkernels, float and double, one
// copy per SIMD target (AVX-512, AVX2, SSE4, SCALAR), chosen when the program runs; plus linear and
// linear_backward on top of it. Not a general BLAS (row-major only, no complex, no batched strides) and
// not the attention tiles (flash_common.h; both run register_block.h's microkernel).
//
// C (M, N) = alpha · op(A) (M, K) · op(B) (K, N) + beta · C, in K blocks of KC:
//   for each K block [pc, pc + kc):
//     pack op(B)[pc.., :] as NR-wide panels (kc, NR), zero columns past N      (in parallel, by panels)
//     pack alpha·op(A)[:, pc..] as MR-tall panels (kc, MR), zero rows past M   (in parallel, by panels)
//     for each output tile (MC rows x NT columns), one thread per tile:        (parallel_for)
//       for each MR panel of A (stays in L1), for each NR panel of B (streams from L2): microkernel
//       (or, where attn tune measured it faster, B's panel outer, kept in L1, and A's streaming: keep_b)
//   microkernel: acc (MR, NR) = C0; acc = fma(a[:, k], b[k, :], acc) for k in order; C = acc, where
//                C0 = 0 (first block, beta = 0: C is not read), beta·C (first block), C (later blocks).
// Determinism: every C element is ONE chain of FMAs over k = 0 … K-1 in order, from beta·C (or 0), with
// the products (alpha·a)·b: a later K block continues from the partial sum the earlier one stored, so
// KC, MC/NT, the register block, the SIMD width (each lane is one element), the tiles and the threads
// decide who computes an element and when, never its value. On every target with FMA (AVX2, AVX-512)
// the bits are those of the scalar loop `c = fma(alpha·a, b, c)`; tests/test_bits.cpp checks it under
// forced targets and forced cache sizes. Edge tiles run the same code on zero-padded panels (extra
// zero products leave the sum unchanged) and on a copy of their part of C (MicroTile).
// op(B) may come packed once (PackedB: an encoder's weights), its panels read instead of made; few rows
// under a transposed B that is not packed run as Cᵀ = B·op(A)ᵀ (GemmTransposed).
// Blocking as measured on this CPU (attn tune: attn/tune.h) or, where nothing was measured, from cpu_info()
// at run time: an A panel (kc x MR) fills at most 1/4 of L1d, the B panels of one tile (kc x NT) at most
// 1/2 of L2, tiles of about 128 rows.
#include "attn/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/check.h"
#include "attn/cpu.h"
#include "attn/threads.h"
#include "attn/tune.h"
#include "gemm_args.h"
#include "gemm_blocking.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/gemm.cpp"  // found through include/; src/ is not on the path
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "gemm_tile.h"  // Start
#include "register_block.h"
#include "transpose16.h"

HWY_BEFORE_NAMESPACE();
namespace attn::gemm_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The microkernel: register_block.h.
using namespace regblock::HWY_NAMESPACE;
// A transposed B's blocks of kTB x kTB floats (rows rs apart) transposed in registers into rows ld apart, on
// the targets that have them (transpose16.h). Moved one at a time, x·Wᵀ ran 1.09-1.28x slower at 64-128 rows
// (W 512x512, 1536x512; a Zen 4, its AVX-512 kernel and its AVX2 one), 1.03-1.09x at 768.
#undef ATTN_GEMM_TRANSPOSE_B  // defined again for each target this file is compiled for
#if ATTN_AVX512_TARGET(HWY_TARGET)
#define ATTN_GEMM_TRANSPOSE_B 1
constexpr int64_t kTB = 16;
HWY_INLINE void TransposeBlock(const float* src, int64_t rs, float* dst, int64_t ld) {
  transpose::HWY_NAMESPACE::Transpose16(src, rs, 16, 16, 1.f, dst, ld);
}
#elif HWY_TARGET == HWY_AVX2
#define ATTN_GEMM_TRANSPOSE_B 1
constexpr int64_t kTB = 8;
HWY_INLINE void TransposeBlock(const float* src, int64_t rs, float* dst, int64_t ld) {
  transpose::HWY_NAMESPACE::Transpose8(src, rs, dst, ld);
}
#else
#define ATTN_GEMM_TRANSPOSE_B 0
#endif

// A register block: MR rows x NV vectors of C's accumulators, and per k NV vectors of B loaded and MR values
// of A broadcast.
template <int MR_, int NV_>
struct RegBlock {
  static constexpr int MR = MR_, NV = NV_;
};
template <class... B>
struct Blocks {};
// The float GEMM's register blocks on this target, the derived one first (attn tune measures the others:
// Tuning::gemm_mr). Each fills the register file (32 vectors on AVX-512: 24 accumulators; 16 elsewhere: 12) in
// another balance of what a k costs: NV vectors of B, read from the B panel streaming through L2, against MR
// broadcasts from the A panel in L1. 6 x 4 loads 4 B vectors per 24 FMAs, 12 x 2 two (BLIS's rate, whose
// Skylake-X kernel broadcasts B instead: the same product over Cᵀ). Which one a CPU runs fastest depends on
// its L2's bandwidth against its FMA rate, hence measured. The double GEMM runs the first block only.
using Derived = RegBlock<kMR, kNV>;
#if ATTN_AVX512_TARGET(HWY_TARGET)
using FloatBlocks = Blocks<Derived, RegBlock<8, 3>, RegBlock<12, 2>>;
#else
using FloatBlocks = Blocks<Derived, RegBlock<4, 3>>;
#endif

// f(B()) for the float block chosen: the tuned rows where they are one of this target's blocks, else the first.
template <class F, class... B>
HWY_INLINE void OnChosenBlock(Blocks<B...>, F&& f) {
  const Tuning* t = tuned_for(HWY_TARGET);
  const int64_t rows = t ? t->gemm_mr : 0;
  const bool known = ((B::MR == rows) || ...);
  bool done = false;
  const auto run = [&](auto b) {
    if (!done && (!known || decltype(b)::MR == rows)) f(b), done = true;
  };
  (run(B()), ...);
}

template <typename T, int NV>
int64_t NR() {
  return NV * static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>()));
}

// A microkernel reads its rows of alpha·op(A) as ARows: a packed panel (alpha folded in), or A itself
// when packing would not pay (alpha = 1).

// The packed B panels are 64-byte aligned.
struct LoadAligned {
  template <typename T>
  HWY_INLINE hn::Vec<hn::ScalableTag<T>> operator()(const T* HWY_RESTRICT p) const {
    return hn::Load(hn::ScalableTag<T>(), p);
  }
};

// Where the next block's C is (its rows at next.p + r·next.ld), for Micro to prefetch; p = nullptr: none.
// Prefetched also where the chains start from 0 and C is only written: a product of one K block
// (4096x512x128) stored into lines missing from L1 ran 1.07-1.10x slower on a Zen 4, 1 and 2 threads.
template <typename T>
struct NextC {
  const T* p;
  int64_t ld;
};

// The last kPrefetchK values of k of a block run after the prefetch of the next block's C: late enough
// that the B panel streaming through L1 (kc x NR: 64 KiB at kc = 256 on AVX-512) does not evict those
// lines first, early enough (~32 x 24 FMAs) to hide a miss to L3. Loading C at a block's start stalled
// 11% of the microkernel's time at 2048³ on a Zen 4 (perf: the samples on the loads of C; kc = 293).
inline constexpr int64_t kPrefetchK = 32;

// Micro's k loop: acc += A (rows of MR, kc) · Bp (kc, NV·N), in two parts with the prefetch of `next` between them
// (the same FMAs in the same order, one chain per element).
template <int MR, int NV, class D, typename T>
HWY_INLINE void MicroK(D d, hn::Vec<D> (&acc)[MR][NV], ARows<T> A, int64_t rows, const T* HWY_RESTRICT bp,
                       int64_t ldbp, int64_t kc, NextC<T> next) {
  const int64_t N = hn::Lanes(d);
  const int64_t k1 = next.p ? std::max<int64_t>(0, kc - kPrefetchK) : kc;
  FmaBlock<MR, NV>(d, acc, A, rows, BRows<T>{bp, ldbp, N}, k1, LoadAligned());
  if (k1 < kc) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
      PrefetchRow(next.p, r * next.ld * int64_t(sizeof(T)), NV * N * int64_t(sizeof(T)));
    FmaBlock<MR, NV>(d, acc, ARows<T>{A.a + k1 * A.ks, A.rs, A.ks}, rows, BRows<T>{bp + k1 * ldbp, ldbp, N}, kc - k1,
                     LoadAligned());
  }
}

// C (MR, NV·N) = C0 + A (MR, kc) · Bp (kc, NV·N), C0 per `start`; A's rows past mr are read as row 0.
// bp: element (k, j) at k·ldbp + j. A whole block of C, read and written by full vectors, nothing
// conditional around the k loop (GCC 12 kept 4 of the 6 accumulators of NV = 1 on the stack, loaded and
// stored every k, when the loads and stores of C depended on mr and nr). The k loop runs in two parts
// with the prefetch of `next` between them: the same FMAs in the same order (one chain per element).
template <typename T, int MR, int NV>
HWY_NOINLINE void Micro(ARows<T> A, int64_t mr, const T* HWY_RESTRICT bp, int64_t ldbp, int64_t kc,
                        T* HWY_RESTRICT c, int64_t ldc, Start start, T beta, NextC<T> next) {
  const hn::ScalableTag<T> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t N = hn::Lanes(d);
  V acc[MR][NV];
  ForBlock<MR, NV>([&](int r, int j) {
    acc[r][j] = start == Start::zero ? hn::Zero(d) : hn::LoadU(d, c + r * ldc + j * N);
    if (start == Start::scaled) acc[r][j] = hn::Mul(hn::Set(d, beta), acc[r][j]);
  });
  // A's rows 1 apart (a packed panel, or a transposed A) and all MR of them: the offsets of the rows are the
  // constants 0 … MR-1, not MR registers (12 rows on AVX-512 left 3 of them in vector registers, moved back
  // per k on the FMA ports)
  if (A.rs == 1 && mr == MR) MicroK<MR, NV>(d, acc, ARows<T>{A.a, 1, A.ks}, MR, bp, ldbp, kc, next);
  else MicroK<MR, NV>(d, acc, A, mr, bp, ldbp, kc, next);
  ForBlock<MR, NV>([&](int r, int j) { hn::StoreU(acc[r][j], d, c + r * ldc + j * N); });
}

// C (mr, nr) = C0 + A · Bp for mr <= MR, nr <= NV·N: a full block in place, an edge block through a copy
// (gemm_tile.h's EdgeThroughCopy).
// Each accumulator is one FMA chain over k in order, whatever MR and NV are or where A is read from: a
// smaller or an edge block computes its elements exactly as the largest one would.
template <typename T, int MR, int NV>
HWY_INLINE void MicroTile(ARows<T> A, int64_t mr, int64_t nr, const T* bp, int64_t ldbp, int64_t kc, T* c,
                          int64_t ldc, Start start, T beta, NextC<T> next) {
  const hn::ScalableTag<T> d;
  const int64_t w = NV * static_cast<int64_t>(hn::Lanes(d));
  if (mr == MR && nr == w) return Micro<T, MR, NV>(A, mr, bp, ldbp, kc, c, ldc, start, beta, next);
  EdgeThroughCopy<T, MR * NV * hn::MaxLanes(d)>(c, ldc, mr, nr, MR, w, start, [&](T* tile, int64_t ldt) {
    Micro<T, MR, NV>(A, mr, bp, ldbp, kc, tile, ldt, start, beta, next);
  });
}

// Rows of a block read in place: MR, or where fewer are left, 6, 4 or 2 (MicroCols). Two 6-row blocks for a
// sentence's 8 rows computed 12, 4 of them past M. A 2-row block keeps only 2·NV chains in flight (the FMA
// units half idle on AVX2 at NV = 2) and costs what a 4-row one does, so 8 rows run as 4 + 4, not 6 + 2,
// and 14 as 4 + 6 + 4. BlockRows<MR>(r): the rows of the next block, with r rows left.
template <int MR>
int64_t BlockRows(int64_t r) {
  return r <= MR ? r : r % MR == 1 || r % MR == 2 ? 4 : MR;
}

// The narrowest instance that covers nr columns (a last, partial panel computes no extra vectors), and
// the shortest of 2, 4, 6 and MR rows that covers mr.
template <typename T, int MR, int NV>
HWY_INLINE void MicroCols(int64_t nr, ARows<T> a, const T* bp, int64_t ldbp, int64_t kc, T* c, int64_t ldc,
                          int64_t mr, Start start, T beta, NextC<T> next) {
  if constexpr (NV > 1)
    if (nr <= (NV - 1) * static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>())))
      return MicroCols<T, MR, NV - 1>(nr, a, bp, ldbp, kc, c, ldc, mr, start, beta, next);
  if (mr <= 2) return MicroTile<T, 2, NV>(a, mr, nr, bp, ldbp, kc, c, ldc, start, beta, next);
  if (mr <= 4) return MicroTile<T, 4, NV>(a, mr, nr, bp, ldbp, kc, c, ldc, start, beta, next);
  if constexpr (MR > 6)
    if (mr <= 6) return MicroTile<T, 6, NV>(a, mr, nr, bp, ldbp, kc, c, ldc, start, beta, next);
  MicroTile<T, MR, NV>(a, mr, nr, bp, ldbp, kc, c, ldc, start, beta, next);
}

// Elements from one packed A panel of MR rows to the next: kc·MR plus one cache line, so that panels are never
// a multiple of 4 KiB apart (kc = 512: 12 KiB), which put every panel's k-th row in the same L1 set and
// made the transposed packing, writing all panels at once, miss on every store.
template <typename T, int MR>
int64_t PanelStride(int64_t kc) {
  return kc * MR + 64 / static_cast<int64_t>(sizeof(T));
}

// Panels of alpha·op(A)[:, pc .. pc+kc): panel p is rows [p·MR, p·MR + MR) as (kc, MR), at dst + p·ps
// (PanelStride); rows past M zero. Not transposed: panels [b, e). Transposed: k in [b, e) of every panel (rows pc + k
// of A), so that each row of A is read once, start to end (a stream the prefetcher follows).
template <typename T, int MR>
void PackA(const Args<T>& g, int64_t b, int64_t e, int64_t pc, int64_t kc, T* HWY_RESTRICT dst) {
  const int64_t ps = PanelStride<T, MR>(kc);
  const int64_t mp = ceil_div(g.M, MR), full = g.M / MR;  // panels; those with all MR rows inside M
  if (g.ta) {  // op(A)(i, k) = A[k·lda + i]: rows of A run along i
    for (int64_t k = b; k < e; ++k) {
      const T* src = g.A + (pc + k) * g.lda;
      for (int64_t p = 0; p < full; ++p)
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) dst[p * ps + k * MR + r] = src[p * MR + r];  // constant count: moves
      for (int64_t p = full; p < mp; ++p)
        for (int64_t r = 0; r < MR; ++r) {
          const int64_t i = p * MR + r;
          dst[p * ps + k * MR + r] = i < g.M ? src[i] : T(0);
        }
      if (g.alpha != T(1))
        for (int64_t p = 0; p < mp; ++p)
          for (int64_t r = 0; r < MR; ++r) dst[p * ps + k * MR + r] *= g.alpha;
    }
    return;
  }
  for (int64_t p = b; p < e; ++p) {  // op(A)(i, k) = A[i·lda + k]
    T* d = dst + p * ps;
    const int64_t rows = std::min<int64_t>(MR, g.M - p * MR);
    if (rows == MR) {  // k outer: the panel written in order, its MR rows read as MR streams (row by
                        // row, below, the stores were MR floats apart: 1-4% slower GEMMs on a Zen 4)
      const T* src = g.A + p * MR * g.lda + pc;
      const int64_t lda = g.lda;
      for (int64_t k = 0; k < kc; ++k)
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) d[k * MR + r] = src[r * lda + k];
    } else {  // the last, short panel: its rows, then zeros
      for (int64_t r = 0; r < rows; ++r) {
        const T* src = g.A + (p * MR + r) * g.lda + pc;
        for (int64_t k = 0; k < kc; ++k) d[k * MR + r] = src[k];
      }
      for (int64_t r = rows; r < MR; ++r)
        for (int64_t k = 0; k < kc; ++k) d[k * MR + r] = T(0);
    }
    if (g.alpha != T(1))
      for (int64_t i = 0; i < kc * MR; ++i) d[i] *= g.alpha;
  }
}

// op(B)[pc .. pc+kc, j0 .. j0+nr) -> (kc, nr), columns past N zero.
template <typename T>
void PackB(const Args<T>& g, int64_t j0, int64_t pc, int64_t kc, int64_t nr, T* HWY_RESTRICT dst) {
  const int64_t cols = std::min(nr, g.N - j0);
  if (g.tb) {  // op(B)(k, j) = B[j·ldb + k]: rows of B run along k; one cache line of each row at a
               // time (kb values of k), so the writes stay in kb rows of the panel, in L1
    constexpr int64_t kb = 64 / sizeof(T);
    for (int64_t k0 = 0; k0 < kc; k0 += kb) {
      const int64_t k1 = std::min(kc, k0 + kb);
      int64_t j = 0;
#if ATTN_GEMM_TRANSPOSE_B
      if constexpr (std::is_same_v<T, float>)  // whole blocks in registers (TransposeBlock), the edges below
        for (; k1 - k0 == kb && j + kTB <= cols; j += kTB)
          for (int64_t k = k0; k < k1; k += kTB)
            TransposeBlock(g.B + (j0 + j) * g.ldb + pc + k, g.ldb, dst + k * nr + j, nr);
#endif
      for (; j < cols; ++j) {
        const T* src = g.B + (j0 + j) * g.ldb + pc;
        for (int64_t k = k0; k < k1; ++k) dst[k * nr + j] = src[k];
      }
    }
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t j = cols; j < nr; ++j) dst[k * nr + j] = T(0);
  } else if (cols == nr) {  // op(B)(k, j) = B[k·ldb + j], a whole panel: a row's nr values by vectors (memcpy
                            // of nr values, a library call per row, was 3-6% of 128x512x4096 TN)
    const hn::ScalableTag<T> d;
    const int64_t N = hn::Lanes(d);
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = g.B + (pc + k) * g.ldb + j0;
      for (int64_t j = 0; j < nr; j += N) hn::Store(hn::LoadU(d, src + j), d, dst + k * nr + j);
    }
  } else {  // a last, partial panel
    for (int64_t k = 0; k < kc; ++k) {
      const T* src = g.B + (pc + k) * g.ldb + j0;
      std::memcpy(dst + k * nr, src, static_cast<size_t>(cols) * sizeof(T));
      for (int64_t j = cols; j < nr; ++j) dst[k * nr + j] = T(0);
    }
  }
}

// op(B)[pc .. pc+kc, :] as np panels of nr columns, panel p at dst + p·nr·kc (in parallel, by panels).
template <typename T>
void PackPanels(const Args<T>& g, int64_t pc, int64_t kc, int64_t nr, int64_t np, T* HWY_RESTRICT dst) {
  parallel_for(np, grain_for(kc * nr), [&](int64_t b, int64_t e, int) {
    for (int64_t p = b; p < e; ++p) PackB(g, p * nr, pc, kc, nr, dst + p * nr * kc);
  });
}

template <typename T, int MR, int NV>
void Gemm(const Args<T>& g);

// Few rows: up to this many, a product with a transposed B is computed transposed (GemmTransposed), or with
// B packed once (PackedB) reads A in place in one pass. Measured on a Zen 3 (BENCHMARKS.md, issue 40), x·Wᵀ
// with W 384x384, 1536x384, 384x1536 transposed: 1.4-10x faster at M 4-48, 0.8-1.3x at 64, slower on some
// shapes from 96 rows.
constexpr int64_t kFewRows = 48;

// C = op(A)·Bᵀ with few rows (linear's x·Wᵀ over one sentence, M ≈ 10): packing Bᵀ moves all K·N weights,
// one at a time, on every call, more work than the product itself. Computed as Cᵀ (N, M) = B·op(A)ᵀ into
// scratch instead: B read in place as the A operand (pack_a stays off: it meets at most three panels), op(A)'s
// M rows packed as the B panels, then Cᵀ stored back into C. Every element is the same FMA chain from the
// same start with its factors swapped, fma(b, a, c) = fma(a, b, c): not a bit changes. alpha = 1 only
// (alpha scales the A operand's factor).
template <typename T, int MR, int NV>
bool GemmTransposed(const Args<T>& g) {
  const int64_t M = g.M, N = g.N;
  if (!g.tb || g.alpha != T(1) || M > kFewRows || N <= M) return false;
  T* ct = static_cast<T*>(scratch(3, static_cast<size_t>(M * N) * sizeof(T)));  // Cᵀ (N, M)
  if (g.beta != T(0) || g.bias)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) ct[j * M + i] = g.bias ? g.bias[j] : g.C[i * g.ldc + j];
  Gemm<T, MR, NV>(Args<T>{false, !g.ta, N, M, g.K, T(1), g.B, g.ldb, g.A, g.lda, g.bias ? T(1) : g.beta, ct, M,
                          nullptr, 0, 0});
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) g.C[i * g.ldc + j] = ct[j * M + i];
  return true;
}

template <typename T, int MR, int NV>
void Gemm(const Args<T>& g) {
  const int64_t M = g.M, N = g.N, K = g.K, nr = NR<T, NV>();
  const bool packed = g.packed && g.packed_nr == nr;  // B's panels cut for this target: read, not made
  if (!packed && GemmTransposed<T, MR, NV>(g)) return;
  const Blocking bl = blocking(M, N, K, MR, nr, sizeof(T), tuned_for(HWY_TARGET), g.ta, packed ? g.packed_kc : 0);
  const int64_t mp = ceil_div(M, MR), np = ceil_div(N, nr);  // panels of A and of B
  // A is packed where its panels meet enough B panels to repay the copy (or alpha must be folded in), but
  // not as few rows under B packed once (one pass, below); else the microkernels read it where it is. Either
  // way the same products in the same order.
  const bool one_pass = packed && !g.ta && M <= kFewRows && g.alpha == T(1);
  const bool pack_a = (bl.pack_a && !one_pass) || g.alpha != T(1);
  T* ap = pack_a ? static_cast<T*>(scratch(0, static_cast<size_t>(mp * PanelStride<T, MR>(bl.kc)) * sizeof(T)))
                 : nullptr;  // (mp, kc, MR)
  T* bp = packed ? nullptr  // (np, kc, nr)
                 : static_cast<T*>(scratch(1, static_cast<size_t>(np * nr * bl.kc) * sizeof(T)));
  const int64_t tm = ceil_div(M, bl.mc), tn = ceil_div(N, bl.nt);
  // Tile t's K block [pc, pc + kc) over B's panels of that block: its microkernels.
  auto tile = [&](int64_t t, int64_t pc, int64_t kc, const T* panels) {
    // the chain of each C element: from 0 or beta·C in the first K block; later blocks continue it
    const Start start = pc > 0 || g.beta == T(1) || g.bias ? Start::c  // the bias: written into C below
                        : g.beta == T(0)                     ? Start::zero
                                                             : Start::scaled;
    const int64_t i0 = (t % tm) * bl.mc, j0 = (t / tm) * bl.nt;  // tiles sharing B panels run together
    const int64_t i1 = std::min(M, i0 + bl.mc), j1 = std::min(N, j0 + bl.nt);
    // rows [i, i + mr) of alpha·op(A)[:, pc ..] (their packed panel, or A in place) times B's panel at column j;
    // (ni, nj): the block after it in the tile, whose C is prefetched
    const auto block = [&](int64_t i, int64_t mr, int64_t j, int64_t ni, int64_t nj) {
      const ARows<T> a = pack_a ? ARows<T>{ap + i / MR * PanelStride<T, MR>(kc), 1, MR}
                         : g.ta ? ARows<T>{g.A + pc * g.lda + i, 1, g.lda}
                                : ARows<T>{g.A + i * g.lda + pc, g.lda, 1};
      const NextC<T> next{ni < i1 && nj < j1 ? g.C + ni * g.ldc + nj : nullptr, g.ldc};
      const int64_t cols = std::min(nr, j1 - j);
      if (pc == 0 && g.bias)  // the block's C0, written where its chains read it (no pass over C before)
        bias_rows(g.bias + j, mr, cols, g.C + i * g.ldc + j, g.ldc);
      MicroCols<T, MR, NV>(cols, a, panels + j * kc, nr, kc, g.C + i * g.ldc + j, g.ldc, mr, start,
                           g.beta, next);
    };
    const auto rows = [&](int64_t i) { return pack_a ? std::min<int64_t>(MR, i1 - i) : BlockRows<MR>(i1 - i); };
    if (bl.keep_b) {  // B's panel stays in L1 while the tile's rows of A stream past it
      for (int64_t j = j0; j < j1; j += nr)
        for (int64_t i = i0, mr; i < i1; i += mr) {
          mr = rows(i);
          block(i, mr, j, i + mr < i1 ? i + mr : i0, i + mr < i1 ? j : j + nr);
        }
      return;
    }
    for (int64_t i = i0, mr; i < i1; i += mr) {  // A's panel stays in L1 while B's panels stream past it
      mr = rows(i);
      for (int64_t j = j0; j < j1; j += nr) block(i, mr, j, j + nr < j1 ? i : i + mr, j + nr < j1 ? j + nr : j0);
    }
  };
  // one tile per item, but tiles of a small product in one chunk: below ~32k multiply-adds per
  // chunk, waking a thread costs more than it saves (and a busy machine may not give it back soon)
  const int64_t tile_rows_cols = std::min(M, bl.mc) * std::min(N, bl.nt);
  if (one_pass) {  // nothing to pack per K block: each tile runs its K blocks in order (the same chains), in one
                   // parallel_for instead of one per block (a sentence's 8 rows over K 1536 had 8, each a wake-up)
    parallel_for(tm * tn, grain_for(tile_rows_cols * K), [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t pc = 0; pc < K; pc += bl.kc) tile(t, pc, std::min(bl.kc, K - pc), g.packed + pc * np * nr);
    });
    return;
  }
  for (int64_t pc = 0; pc < K; pc += bl.kc) {
    const int64_t kc = std::min(bl.kc, K - pc);
    if (!packed) PackPanels(g, pc, kc, nr, np, bp);
    if (pack_a && g.ta)  // chunks of k: rows of A (see PackA)
      parallel_for(kc, grain_for(M), [&](int64_t b, int64_t e, int) { PackA<T, MR>(g, b, e, pc, kc, ap); });
    else if (pack_a)
      parallel_for(mp, grain_for(kc * MR), [&](int64_t b, int64_t e, int) { PackA<T, MR>(g, b, e, pc, kc, ap); });
    const T* panels = packed ? g.packed + pc * np * nr : bp;
    parallel_for(tm * tn, grain_for(tile_rows_cols * kc), [&](int64_t t0, int64_t t1, int) {
      for (int64_t t = t0; t < t1; ++t) tile(t, pc, kc, panels);
    });
  }
}

void GemmF32(const Args<float>& g) {
  OnChosenBlock(FloatBlocks(), [&](auto b) { Gemm<float, b.MR, b.NV>(g); });
}
void GemmF64(const Args<double>& g) { Gemm<double, Derived::MR, Derived::NV>(g); }

// pack_b() on this target: op(B)'s panels of every K block at the K block a product would cut (it depends
// on K, the register block and the tuning only), block pc at pc·np·nr as Gemm reads them.
PackedB PackF32(bool tb, int64_t K, int64_t N, const float* B, int64_t ldb) {
  PackedB p;
  OnChosenBlock(FloatBlocks(), [&](auto b) {
    const int64_t nr = NR<float, b.NV>(), np = ceil_div(N, nr);
    p = {tb, K, N, B, ldb, blocking(1, N, K, b.MR, nr, sizeof(float), tuned_for(HWY_TARGET)).kc, nr, nullptr};
    float* dst = static_cast<float*>(aligned_bytes(static_cast<uint64_t>(K * np * nr) * sizeof(float)));
    p.panels = std::shared_ptr<const float>(dst, [](const float* q) { std::free(const_cast<float*>(q)); });
    const Args<float> g{false, tb, 0, N, K, 1.f, nullptr, 0, B, ldb, 0.f, nullptr, 0, nullptr, 0, 0};
    for (int64_t pc = 0; pc < K; pc += p.kc) PackPanels(g, pc, std::min(p.kc, K - pc), nr, np, dst + pc * np * nr);
  });
  return p;
}

// The float GEMM's register blocks on this target, rows x columns, the derived one first.
std::vector<RegisterBlock> RegisterBlocks() {
  std::vector<RegisterBlock> out;
  [&]<class... B>(Blocks<B...>) { (out.push_back({B::MR, NR<float, B::NV>()}), ...); }(FloatBlocks());
  return out;
}

// "AVX3 6x64 (float), 6x32 (double), 2048³ blocked KC 512 x 126 x 1024 (derived)": the target, its
// register blocks (the float one as chosen) and the float blocking of a 2048³ product at the current thread count.
std::string Describe() {
  const Tuning* t = tuned_for(HWY_TARGET);
  std::string s;
  OnChosenBlock(FloatBlocks(), [&](auto b) {
    const Blocking bl = blocking(2048, 2048, 2048, b.MR, NR<float, b.NV>(), sizeof(float), t);
    s = std::string(hwy::TargetName(HWY_TARGET)) + " " + std::to_string(b.MR) + "x" +
        std::to_string(NR<float, b.NV>()) + " (float), " + std::to_string(Derived::MR) + "x" +
        std::to_string(NR<double, Derived::NV>()) + " (double), 2048³ blocked KC " + std::to_string(bl.kc) + " x " +
        std::to_string(bl.mc) + " x " + std::to_string(bl.nt) + (t ? " (tuned)" : " (derived)");
  });
  return s;
}

}  // namespace attn::gemm_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace gemm_detail {
HWY_EXPORT(GemmF32);
HWY_EXPORT(GemmF64);
HWY_EXPORT(PackF32);
HWY_EXPORT(RegisterBlocks);
HWY_EXPORT(Describe);
}  // namespace gemm_detail

std::string gemm_kernel() {
  const CpuInfo& cpu = cpu_info();
  return "attn packed GEMM, " + HWY_DYNAMIC_DISPATCH(gemm_detail::Describe)() + " (L1d " +
         std::to_string(cpu.l1d >> 10) + " KiB, L2 " + std::to_string(cpu.l2 >> 10) + " KiB" +
         (cpu.caches_read ? "" : ", assumed") + ")";
}

std::vector<RegisterBlock> gemm_register_blocks() { return HWY_DYNAMIC_DISPATCH(gemm_detail::RegisterBlocks)(); }

namespace {
// Every entry: the empty and the scaling-only (or bias-only) products, then the target's Gemm.
template <typename T>
void run_gemm(const gemm_detail::Args<T>& g) {
  if (g.M <= 0 || g.N <= 0) return;
  if (g.K <= 0 || g.alpha == T(0)) return gemm_detail::scale_c(g.M, g.N, g.beta, g.C, g.ldc, g.bias);
  if constexpr (std::is_same_v<T, float>) HWY_DYNAMIC_DISPATCH(gemm_detail::GemmF32)(g);
  else HWY_DYNAMIC_DISPATCH(gemm_detail::GemmF64)(g);
}
// The product over B's panels packed once.
gemm_detail::Args<float> packed_args(bool ta, int64_t M, float alpha, const float* A, int64_t lda, const PackedB& B,
                                     float beta, float* C, int64_t ldc) {
  return {ta, B.trans_b, M, B.N, B.K, alpha, A, lda, B.B, B.ldb, beta, C, ldc, B.panels.get(), B.kc, B.nr};
}
}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  run_gemm<float>({ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, 0, 0});
}

PackedB pack_b(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb) {
  ATTN_CHECK(K > 0 && N > 0 && B, "Expected a B of at least one row and column to pack, but got (", K, ", ", N,
             ") instead");
  return HWY_DYNAMIC_DISPATCH(gemm_detail::PackF32)(trans_b, K, N, B, ldb);
}

void gemm(bool ta, int64_t M, float alpha, const float* A, int64_t lda, const PackedB& B, float beta, float* C,
          int64_t ldc) {
  run_gemm(packed_args(ta, M, alpha, A, lda, B, beta, C, ldc));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  run_gemm<double>({ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, 0, 0});
}

namespace {
// linear()'s body for either weight type W: T (gemm, or gemm_bf16 under a bf16 Autocast) or bf16 bits (gemm_bf16).
// packed: W (out, in) packed once as op(W)'s panels (PackedB for fp32 products, PackedB16 for bf16 W), read
// instead of W.
template <typename W>
using PackedOf = std::conditional_t<std::is_same_v<W, uint16_t>, PackedB16, PackedB>;
template <typename T, typename W>
void linear_of(View<const T> x, View<const W> w, View<const T> bias, View<T> y, WeightLayout layout,
               const PackedOf<W>* packed = nullptr) {
  const bool io = layout == WeightLayout::in_out;  // W (in, out): op(W) = W, read as (K, N) in place
  const int64_t n = x.size(0), in = x.size(1), out = w.size(io ? 1 : 0);
  ATTN_CHECK(x.rank() == 2 && w.rank() == 2 && w.size(io ? 0 : 1) == in, "Expected weight of shape ",
             io ? "(" + std::to_string(in) + ", out)" : "(out, " + std::to_string(in) + ")", " for input ",
             to_string(x.shape), ", but got ", to_string(w.shape), " instead");
  ATTN_CHECK(y.rank() == 2 && y.size(0) == n && y.size(1) == out, "Expected output of shape ",
             to_string({n, out}), ", but got ", to_string(y.shape), " instead");
  ATTN_CHECK(bias.empty() || bias.shape == Shape{out}, "Expected bias of shape ", to_string({out}),
             ", but got ", to_string(bias.shape), " instead");
  ATTN_CHECK(x.stride(1) == 1 && y.stride(1) == 1 && w.is_contiguous(),
             "Expected unit column stride for linear, but got input strides ", to_string(x.strides),
             " and output strides ", to_string(y.strides), " instead");
  if (n == 0) return;
  // The bias is each chain's start: the GEMM writes it into each block of y as it computes the block (a strided
  // bias: y is filled with it first).
  const T* bias0 = !bias.empty() && bias.stride(0) == 1 ? bias.data : nullptr;
  T beta = 0;
  if (!bias.empty() && !bias0) {
    const int64_t ys = y.stride(0), bs = bias.stride(0);  // hoisted: stride() is an out-of-line call
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < out; ++c) y.data[r * ys + c] = bias.data[c * bs];
    beta = 1;
  }
  const int64_t ldw = io ? out : in;
  constexpr bool w16 = std::is_same_v<W, uint16_t>;  // bf16 weights: gemm_bf16 whatever the precision
  if constexpr (std::is_same_v<T, float>) {
    if (w16 || matmul_precision() == Precision::bf16) {  // packed panels of bf16 W are read; fp32 ones are not
      const PackedB16* p16 = nullptr;
      if constexpr (w16) p16 = packed;
      return gemm_detail::run_bf16({false, !io, n, out, in, x.data, false, x.stride(0), w.data, w16, ldw, beta, y.data,
                                    y.stride(0), p16, nullptr, bias0});
    }
    if constexpr (!w16)
      if (packed) {
        auto g = packed_args(false, n, 1.f, x.data, x.stride(0), *packed, beta, y.data, y.stride(0));
        g.bias = bias0;
        return run_gemm(g);
      }
  }
  if constexpr (!w16)
    run_gemm<T>({false, !io, n, out, in, T(1), x.data, x.stride(0), w.data, ldw, beta, y.data, y.stride(0), nullptr, 0,
                 0, bias0});
}
}  // namespace

template <typename T>
void linear(View<const T> x, View<const T> w, View<const T> bias, View<T> y, WeightLayout layout) {
  linear_of(x, w, bias, y, layout);
}
void linear(View<const float> x, View<const uint16_t> w, View<const float> bias, View<float> y, WeightLayout layout) {
  linear_of(x, w, bias, y, layout);
}
namespace {
// linear() over W (out, in) and its panels, checked to be W's.
template <typename W>
void linear_packed(View<const float> x, View<const W> w, const PackedOf<W>& packed, View<const float> bias,
                   View<float> y) {
  ATTN_CHECK(w.rank() == 2 && packed.trans_b && packed.B == w.data && packed.N == w.size(0) && packed.K == w.size(1) &&
                 packed.ldb == w.size(1),
             "Expected the packed panels of weight ", to_string(w.shape), ", but got those of another matrix instead");
  linear_of(x, w, bias, y, WeightLayout::out_in, &packed);
}
}  // namespace
void linear(View<const float> x, View<const float> w, const PackedB& packed, View<const float> bias, View<float> y) {
  linear_packed(x, w, packed, bias, y);
}
void linear(View<const float> x, View<const uint16_t> w, const PackedB16& packed, View<const float> bias,
            View<float> y) {
  linear_packed(x, w, packed, bias, y);
}

void linear_backward(View<const float> x, View<const float> w, View<const float> dy, View<float> dx,
                     View<float> dw, View<float> db) {
  const int64_t N = x.size(0), in = x.size(1), out = w.size(0);
  ATTN_CHECK(dy.rank() == 2 && dy.size(0) == N && dy.size(1) == out, "Expected dy of shape ", to_string({N, out}),
             " for input ", to_string(x.shape), " and weight ", to_string(w.shape), ", but got ", to_string(dy.shape),
             " instead");
  ATTN_CHECK(x.stride(1) == 1 && dy.stride(1) == 1 && w.is_contiguous() && (dx.empty() || dx.stride(1) == 1),
             "Expected unit column strides for linear_backward, but got x strides ", to_string(x.strides),
             " and dy strides ", to_string(dy.strides), " instead");
  const bool bf16 = matmul_precision() == Precision::bf16;
  if (!dx.empty()) {  // dx (N, in) = dy (N, out) · W (out, in)
    ATTN_CHECK(dx.shape == Shape({N, in}), "Expected dx of shape ", to_string({N, in}), ", but got ",
               to_string(dx.shape), " instead");
    if (N > 0 && bf16)
      gemm_bf16(false, false, N, in, out, dy.data, dy.stride(0), w.data, in, 0.0f, dx.data, dx.stride(0));
    else if (N > 0)
      gemm(false, false, N, in, out, 1.0f, dy.data, dy.stride(0), w.data, in, 0.0f, dx.data, dx.stride(0));
  }
  if (N == 0) return;
  ATTN_CHECK(dw.shape == w.shape && dw.is_contiguous(), "Expected dw of the weight's shape ", to_string(w.shape),
             ", contiguous, but got ", to_string(dw.shape), " instead");
  if (bf16)  // dW += dyᵀ·x
    gemm_bf16(true, false, out, in, N, dy.data, dy.stride(0), x.data, x.stride(0), 1.0f, dw.data, in);
  else
    gemm(true, false, out, in, N, 1.0f, dy.data, dy.stride(0), x.data, x.stride(0), 1.0f, dw.data, in);
  if (!db.empty())
    for (int64_t r = 0; r < N; ++r) {  // db += Σ_rows dy, rows in order
      const float* g = dy.data + r * dy.stride(0);
      for (int64_t c = 0; c < out; ++c) db.data[c] += g[c];
    }
}

template void linear(View<const float>, View<const float>, View<const float>, View<float>, WeightLayout);
template void linear(View<const double>, View<const double>, View<const double>, View<double>, WeightLayout);

}  // namespace attn
#endif  // HWY_ONCE
