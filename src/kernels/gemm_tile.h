// The C side of attn's GEMM microkernels (gemm.cpp, gemm_bf16.cpp): where a chain starts, and an edge
// block of C computed as a whole one through a copy. Per Highway target: include it after
// <hwy/highway.h> in a translation unit that re-includes itself through <hwy/foreach_target.h>.
#if defined(ATTN_GEMM_TILE_TOGGLE) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_GEMM_TILE_TOGGLE
#undef ATTN_GEMM_TILE_TOGGLE
#else
#define ATTN_GEMM_TILE_TOGGLE
#endif

#include <algorithm>
#include <cstdint>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::gemm_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Where a microkernel's chain starts: 0 (C not read), beta·C, or C itself (a later K block, or beta = 1).
enum class Start { zero, scaled, c };

// An edge block, mr <= rows and nr <= w elements of C, through a (rows, w) copy of its part of C:
// block(tile, w) computes the whole block there (the same chains on the same values), and the copy's
// extra rows and columns are dropped. The microkernels then run whole blocks only, with nothing
// conditional around their k loop (GCC 12 kept 4 of 6 accumulators of a narrow block on the stack when
// C's loads and stores depended on mr and nr). Out of line, so the tile loop keeps a small frame.
template <typename T, int64_t kMaxElems, class Block>
HWY_NOINLINE void EdgeThroughCopy(T* HWY_RESTRICT c, int64_t ldc, int64_t mr, int64_t nr, int64_t rows, int64_t w,
                                  Start start, const Block& block) {
  HWY_ALIGN T tile[kMaxElems];  // (rows, w); not read when the chains start from 0
  if (start != Start::zero) {
    std::fill(tile, tile + rows * w, T(0));
    for (int64_t r = 0; r < mr; ++r) std::copy(c + r * ldc, c + r * ldc + nr, tile + r * w);
  }
  block(tile, w);
  for (int64_t r = 0; r < mr; ++r) std::copy(tile + r * w, tile + r * w + nr, c + r * ldc);
}

}  // namespace attn::gemm_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // ATTN_GEMM_TILE_TOGGLE
