// Checked aligned allocation, private to src/: every buffer of the kernels, the GEMM scratch and Tensor
// comes from here, so an allocation that fails (no memory, an address-space limit, a size no allocator
// can give) is an attn::AllocationError — a std::bad_alloc, MemoryError in Python, exit 2 in the CLI —
// never a null pointer stored through. Not a pool or an arena: one checked call per buffer.
#pragma once
#include <hwy/aligned_allocator.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

namespace attn {

// A failed allocation, with the size that was asked for.
class AllocationError : public std::bad_alloc {
 public:
  explicit AllocationError(uint64_t bytes)
      : what_("Expected to allocate " + std::to_string(bytes) +
              " bytes, but the allocation failed instead (not enough memory or address space)") {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

// n elements of T from Highway's aligned allocator (freed by its unique_ptr); n = 0: a null pointer (the
// allocator asserts on a zero size).
template <typename T>
hwy::AlignedFreeUniquePtr<T[]> allocate_aligned(int64_t n) {
  if (n < 0 || uint64_t(n) > uint64_t(SIZE_MAX) / sizeof(T)) throw AllocationError(uint64_t(n) * sizeof(T));
  if (n == 0) return hwy::AlignedFreeUniquePtr<T[]>(nullptr, hwy::AlignedFreer(nullptr, nullptr));
  auto p = hwy::AllocateAligned<T>(size_t(n));
  if (!p && n > 0) throw AllocationError(uint64_t(n) * sizeof(T));
  return p;
}

// `bytes` (rounded up to 64) with 64-byte alignment, for std::free.
inline void* aligned_bytes(uint64_t bytes) {
  if (bytes > uint64_t(SIZE_MAX) - 63) throw AllocationError(bytes);
  const size_t n = bytes == 0 ? 64 : size_t((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, n);
  if (!p) throw AllocationError(n);
  return p;
}

}  // namespace attn
