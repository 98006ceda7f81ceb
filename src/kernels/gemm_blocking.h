// The blocking of attn's packed GEMMs (gemm.cpp: float and double; gemm_bf16.cpp: bf16 pairs), derived
// from the caches and the register block, or as attn tune measured; their per-thread scratch; and C = beta·C
// where a product has nothing to multiply. Internal
// to src/kernels. None of it decides a bit of a result, only who computes it and when.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "attn/cpu.h"
#include "attn/threads.h"
#include "attn/tune.h"
#include "../core/aligned.h"  // aligned_bytes: every buffer checked

namespace attn::gemm_detail {

// Blocking of one product, derived from the caches, the target's register block and the shape.
struct Blocking {
  int64_t kc;      // K block: the summed dimension is cut here, the same for any thread count
  int64_t mc, nt;  // output tile: mc rows (multiple of MR) x nt columns (multiple of NR)
  bool pack_a;     // copy op(A) into panels (each meets ceil(N / NR) B panels), or read it in place
  bool keep_b = false;  // a tile runs B's panels outer (each stays in L1 while the rows of A stream), else A's
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Largest K block for an (MR, elem)-sized A panel: kc·MR·elem <= L1d/2 (the A panel stays in L1 while
// the B panels stream past it), between 64 and 512. Each K block loads and stores C again, and K 512 (the
// training shapes' E·4 and dW's) was two blocks of 256 under L1d/4 on a 32 KiB L1d: a Zen 4, 2 threads,
// interleaved in one process, kc 512 or 680 against 256-293: 1.06-1.18x at K 512 and N 128 (x·Wᵀ and dy·W),
// 1.02-1.07x at 2048³, the rest 0.98-1.12x; its AVX2 kernel alike (1.11-1.17x at K 512, N 128). Past 512 it
// measured the same (1024 in attn tune), so the cap leaves a 48 KiB L1d (Zen 5, Intel's Xeons) at L1d/4's 512.
inline int64_t max_kc(int64_t mr, int64_t elem) {
  return std::clamp<int64_t>(cpu_info().l1d / 2 / (mr * elem) / 8 * 8, 64, 512);
}

// K cut into equal blocks no larger than the most (tuned, or max_kc); tiles as tuned, or kc x nt of packed
// B in at most half of L2 and up to ~128 rows (A panels re-read per tile). t: the tuning of the calling
// target (float only), or nullptr; ta: op(A) = Aᵀ (only pack_a depends on it); kc > 0: the K block B's
// panels were packed at (PackedB). None of it changes a bit of the result.
inline Blocking blocking(int64_t M, int64_t N, int64_t K, int64_t mr, int64_t nr, int64_t elem, const Tuning* t,
                         bool ta = false, int64_t kc = 0) {
  if (elem != 4) t = nullptr;
  Blocking b;
  b.kc = kc > 0 ? kc : ceil_div(K, ceil_div(K, t && t->gemm_kc ? t->gemm_kc : max_kc(mr, elem)));
  int64_t nt = t && t->gemm_nt ? ceil_div(t->gemm_nt, nr) * nr
                               : std::max<int64_t>(1, cpu_info().l2 / 2 / (b.kc * elem) / nr) * nr;
  int64_t mc = t && t->gemm_mc ? ceil_div(t->gemm_mc, mr) * mr : std::max<int64_t>(1, 128 / mr) * mr;
  nt = std::min(nt, ceil_div(N, nr) * nr);
  mc = std::min(mc, ceil_div(M, mr) * mr);
  // Enough tiles to keep every thread busy (>= 4 per thread), cutting the longer side. The tiles only
  // decide which thread computes an element, not its value.
  const int64_t threads = num_threads(), want = threads > 1 ? 4 * threads : 1;
  while (ceil_div(M, mc) * ceil_div(N, nt) < want && (mc > mr || nt > nr)) {
    if (mc / mr >= nt / nr) mc = std::max(mr, (mc / mr / 2) * mr);
    else nt = std::max(nr, (nt / nr / 2) * nr);
  }
  // ... and a whole number of tiles per thread where a few more row tiles give it: 768 rows at mc = 60 were
  // 13 tiles, 7 for one thread and 6 for the other (the last tile waited for). Rows cut into tm runs of
  // equal panels, tm the first count from here up to twice it whose tiles divide among the threads.
  if (threads > 1 && ceil_div(M, mc) * ceil_div(N, nt) % threads != 0) {
    const int64_t mp = ceil_div(M, mr), tn = ceil_div(N, nt), tm0 = ceil_div(M, mc);
    for (int64_t tm = tm0; tm <= std::min(mp, 2 * tm0); ++tm) {
      const int64_t panels = ceil_div(mp, tm);
      if (ceil_div(mp, panels) * tn % threads == 0) {
        mc = panels * mr;
        break;
      }
    }
  }
  b.mc = mc, b.nt = nt;
  // A panel is read once per B panel; packing it costs about one read and one write of A, against the N
  // FMAs each of A's values meets. Derived: pack when it meets more than kPackAColumns columns of B (AVX-512,
  // NR 64, a Zen 4: 4 panels, 4096x128x512 NT +26% in place; AVX2, NR 16, a Zen 3, 2048 x N x 512 NT in place
  // against packed: +8% at N 128, +6% at 256, +-1% at 512-1024, -4% from 1536). A transposed A read in place
  // costs more per read: each k is another cache line (stride lda) of which the block uses MR values, and at
  // lda = 512 floats a panel's kc lines fall into 2 of L1's 64 sets, so every B panel fetches them from L2
  // again; packed, it is one stream. Derived: pack it whenever it meets more than one B panel (Zen 4,
  // 512x128x4096 TN, 1 thread: 76 GFLOP/s in place, 95 packed; Zen 5's tune table: within 2% either way).
  constexpr int64_t kPackAColumns = 256, kPackATPanels = 1;
  const int64_t past = ta ? (t && t->gemm_pack_at ? t->gemm_pack_at : kPackATPanels)
                          : (t && t->gemm_pack_a ? t->gemm_pack_a : std::max<int64_t>(1, kPackAColumns / nr));
  b.pack_a = ceil_div(N, nr) > past;
  // A's panel kept in L1, B's streaming from L2, unless measured otherwise: on a Zen 3 (1 thread, 2048³ and three
  // training shapes) either order ran at the same rate (0.91-1.04x, the noise). Per k, 6x16 streams 16 floats of
  // B for 12 FMAs, the other order 6 of A: the choice for a CPU whose L2 cannot keep up with its FMAs.
  b.keep_b = t && t->gemm_keep_b == 1;
  return b;
}

// Grow-only, 64-byte aligned scratch per calling thread (a gemm inside a parallel_for body runs
// serially on that worker, so it never shares a buffer). which: 0 = packed A, 1 = packed B, 2 = the
// bf16 emulation's widened B, 3 = Cᵀ of a product computed transposed, 4 = a bf16 C's fp32 sums.
inline void* scratch(int which, size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[5];
  Buf& b = bufs[which];
  if (b.n < bytes) {
    std::free(b.p);
    b.n = 0;
    b.p = aligned_bytes(bytes);  // checked
    b.n = bytes;
  }
  return b.p;
}

// Every one of `rows` rows of C (ldc apart) = the bias's N values: the chains' start of a block (linear's bias).
template <typename T>
void bias_rows(const T* bias, int64_t rows, int64_t N, T* C, int64_t ldc) {
  for (int64_t i = 0; i < rows; ++i) std::copy(bias, bias + N, C + i * ldc);
}

// C (M, N) = beta·C where there is nothing to multiply (K == 0, or alpha == 0); beta == 0 writes zeros
// (C is not read); with a bias (N values), every row is the bias.
template <typename T>
void scale_c(int64_t M, int64_t N, T beta, T* C, int64_t ldc, const T* bias = nullptr) {
  if (bias) return bias_rows(bias, M, N, C, ldc);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T& c = C[i * ldc + j];
      c = beta == T(0) ? T(0) : beta * c;
    }
}

}  // namespace attn::gemm_detail
