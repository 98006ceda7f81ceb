// The C side of attn's GEMM microkernels (gemm.cpp, gemm_bf16.cpp): where a chain starts, and C rows
// read and written as whole vectors, edge tiles included. Per Highway target: include it after
// <hwy/highway.h> in a translation unit that re-includes itself through <hwy/foreach_target.h>.
#if defined(ATTN_GEMM_TILE_TOGGLE) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_GEMM_TILE_TOGGLE
#undef ATTN_GEMM_TILE_TOGGLE
#else
#define ATTN_GEMM_TILE_TOGGLE
#endif

#include <cstdint>

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::gemm_detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// C[0, cols) (cols <= lanes) as one vector and back: a partial vector goes through a lane buffer (lanes
// past cols are 0 and never stored), so edge tiles run the instructions of full ones.
template <class D, typename T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadC(D d, const T* HWY_RESTRICT c, int64_t cols) {
  if (cols >= int64_t(hn::Lanes(d))) return hn::LoadU(d, c);
  HWY_ALIGN T lane[hn::MaxLanes(d)] = {};
  for (int64_t j = 0; j < cols; ++j) lane[j] = c[j];
  return hn::Load(d, lane);
}
template <class D, class V = hn::Vec<D>, typename T = hn::TFromD<D>>
HWY_INLINE void StoreC(D d, V v, T* HWY_RESTRICT c, int64_t cols) {
  if (cols >= int64_t(hn::Lanes(d))) return hn::StoreU(v, d, c);
  HWY_ALIGN T lane[hn::MaxLanes(d)];
  hn::Store(v, d, lane);
  for (int64_t j = 0; j < cols; ++j) c[j] = lane[j];
}

// Where a microkernel's chain starts: 0 (C not read), beta·C, or C itself (a later K block, or beta = 1).
enum class Start { zero, scaled, c };

}  // namespace attn::gemm_detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // ATTN_GEMM_TILE_TOGGLE
