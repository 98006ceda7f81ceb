// Checked aligned allocation, private to src/: every buffer of the kernels, the GEMM scratch and Tensor
// comes from here, so an allocation that fails (no memory, an address-space limit, a size no allocator
// can give) is an attn::AllocationError — a std::bad_alloc, MemoryError in Python, exit 2 in the CLI —
// never a null pointer stored through. Not a pool: one checked call per buffer, per thread one kept block of
// kernel scratch (Scratch), and big tensors' blocks kept for the next tensor of their size (tensor.cpp).
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
  if (!p) throw AllocationError(uint64_t(n) * sizeof(T));
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

// One call's scratch, carved into 64-byte aligned arrays (take). Up to kKeep bytes it is the calling
// thread's block, kept between calls and grown to the largest request: a kernel called over and over (every
// layer of a training step) then touches no fresh pages. A few MB allocated and freed per call let glibc trim
// and re-fault them each time: 0.7 of the 1.1 ms of nanoGPT's bf16 flash backward. Larger requests, and a
// second Scratch alive on the same thread, are allocated for the call alone (their work dwarfs the faults).
class Scratch {
 public:
  static constexpr int64_t kKeep = int64_t(16) << 20;
  explicit Scratch(int64_t bytes) : own_(nullptr, hwy::AlignedFreer(nullptr, nullptr)) {
    bytes = (bytes + 63) / 64 * 64;
    Kept& k = kept();
    if (bytes <= kKeep && !k.busy) {
      if (k.size < bytes) k.block = allocate_aligned<uint8_t>(bytes), k.size = bytes;
      k.busy = kept_ = true, base_ = k.block.get();
    } else {
      own_ = allocate_aligned<uint8_t>(bytes), base_ = own_.get();
    }
    size_ = bytes;
  }
  ~Scratch() {
    if (kept_) kept().busy = false;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // The bytes a take of n T's uses: what the constructor is given is the sum of these over its takes.
  template <typename T>
  static int64_t bytes_of(int64_t n) { return (n * int64_t(sizeof(T)) + 63) / 64 * 64; }
  // The next n T's of the block (uninitialized; nullptr for n = 0).
  template <typename T>
  T* take(int64_t n) {
    if (n == 0) return nullptr;
    const int64_t b = bytes_of<T>(n);
    if (used_ + b > size_) throw AllocationError(uint64_t(used_ + b));  // a caller that summed wrong
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += b;
    return p;
  }

 private:
  struct Kept {
    hwy::AlignedFreeUniquePtr<uint8_t[]> block{nullptr, hwy::AlignedFreer(nullptr, nullptr)};
    int64_t size = 0;
    bool busy = false;
  };
  static Kept& kept() {
    thread_local Kept k;
    return k;
  }
  hwy::AlignedFreeUniquePtr<uint8_t[]> own_;
  uint8_t* base_ = nullptr;
  int64_t size_ = 0, used_ = 0;
  bool kept_ = false;
};

}  // namespace attn
