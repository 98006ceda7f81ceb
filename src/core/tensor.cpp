// Tensor and View: shapes, strides, checked access, aligned storage.
#include "attn/tensor.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "attn/memstat.h"
#include "aligned.h"

namespace attn {

std::string to_string(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  ATTN_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &r), "Expected ", what,
             " to fit in 64 bits, but got ", a, " * ", b, " instead");
  return r;
}

int64_t numel(const Shape& shape) {
  // A zero anywhere makes the count 0, but a shape whose other sizes overflow is still refused, so no
  // stride computed from it can wrap either.
  int64_t nonzero = 1;
  bool empty = false;
  for (int64_t d : shape) {
    ATTN_CHECK(d >= 0, "Expected non-negative sizes, but got ", to_string(shape), " instead");
    ATTN_CHECK(!__builtin_mul_overflow(nonzero, d ? d : 1, &nonzero), "Expected a shape whose element count fits in ",
               "64 bits, but got ", to_string(shape), " instead");
    empty = empty || d == 0;
  }
  return empty ? 0 : nonzero;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

template <typename T>
int View<T>::wrap(int dim) const {
  int r = rank();
  ATTN_CHECK(dim >= -r && dim < r, "Expected a dim in [", -r, ", ", r, ") for a view of shape ",
             to_string(shape), ", but got ", dim, " instead");
  return dim < 0 ? dim + r : dim;
}

template <typename T>
bool View<T>::is_contiguous() const {
  int64_t s = 1;
  for (int i = rank(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

template <typename T>
View<T> View<T>::transpose(int a, int b) const {
  View v = *this;
  a = wrap(a), b = wrap(b);
  std::swap(v.shape[a], v.shape[b]);
  std::swap(v.strides[a], v.strides[b]);
  return v;
}

template <typename T>
View<T> View<T>::reshape(Shape new_shape) const {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (new_shape[i] == -1) {
      ATTN_CHECK(infer < 0, "Expected at most one -1 in reshape, but got ", to_string(new_shape), " instead");
      infer = static_cast<int64_t>(i);
    } else {
      known *= new_shape[i];
    }
  }
  if (infer >= 0 && known > 0) new_shape[infer] = numel() / known;
  ATTN_CHECK(attn::numel(new_shape) == numel(), "Expected a shape with ", numel(), " elements to reshape ",
             to_string(shape), ", but got ", to_string(new_shape), " instead");
  ATTN_CHECK(is_contiguous(), "Expected a contiguous view to reshape, but got shape ", to_string(shape),
             " with strides ", to_string(strides), " instead");
  return View(data, new_shape);
}

template <typename T>
View<T> View<T>::select(int dim, int64_t index) const {
  int d = wrap(dim);
  ATTN_CHECK(index >= 0 && index < shape[d], "Expected an index in [0, ", shape[d], ") for dim ", dim,
             " of shape ", to_string(shape), ", but got ", index, " instead");
  View v = *this;
  v.data += index * strides[d];
  v.shape.erase(v.shape.begin() + d);
  v.strides.erase(v.strides.begin() + d);
  return v;
}

template <typename T>
View<T> View<T>::narrow(int dim, int64_t begin, int64_t size) const {
  int d = wrap(dim);
  ATTN_CHECK(begin >= 0 && size >= 0 && begin <= shape[d] - size, "Expected a range [begin, begin + size) in [0, ",
             shape[d], "] for dim ", dim, " of shape ", to_string(shape), ", but got [", begin, ", ", begin + size,
             ") instead");
  View v = *this;
  v.data += begin * strides[d];
  v.shape[d] = size;
  return v;
}

template <typename T>
T& View<T>::at(std::initializer_list<int64_t> index) const {
  ATTN_CHECK(static_cast<int>(index.size()) == rank(), "Expected ", rank(), " indices for shape ",
             to_string(shape), ", but got ", index.size(), " instead");
  int64_t off = 0;
  int i = 0;
  for (int64_t ix : index) {
    ATTN_CHECK(ix >= 0 && ix < shape[i], "Expected index ", i, " in [0, ", shape[i], ") for shape ",
               to_string(shape), ", but got ", ix, " instead");
    off += ix * strides[i++];
  }
  return data[off];
}

namespace {

// The blocks of big tensors, kept for the next tensor of their size: a model run over and over (an encoder's
// batches) then touches no fresh pages. Freed to glibc, they were trimmed from its heap after each MiniLM batch
// and faulted in again (16.5k page faults a pass over 256 paragraphs in batches of 32, ~8% of its time). Sizes
// from kMin up are rounded up to an eighth of their power of two (at most 12.5% more), so the next batch's
// slightly different sizes find them; at most kKeep bytes are kept, and a block past that is freed. Not under
// AddressSanitizer, which must see every buffer freed.
class BlockCache {
 public:
  static constexpr uint64_t kMin = uint64_t(1) << 20, kKeep = uint64_t(256) << 20;
  static uint64_t size_class(uint64_t bytes) {
    if (bytes < kMin) return bytes;
    const uint64_t step = uint64_t(1) << (60 - __builtin_clzll(bytes));  // an eighth of the power of two below
    return (bytes + step - 1) / step * step;
  }
  void* take(uint64_t bytes) {
    if (bytes < kMin || kOff) return nullptr;
    std::lock_guard<std::mutex> lock(m_);
    const auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    kept_ -= bytes;
    return p;
  }
  // Keeps p, or frees it.
  void give(void* p, uint64_t bytes) {
    if (bytes >= kMin && !kOff) {
      std::lock_guard<std::mutex> lock(m_);
      if (kept_ + bytes <= kKeep) {
        free_[bytes].push_back(p);
        kept_ += bytes;
        return;
      }
    }
    std::free(p);
  }

 private:
#if defined(__SANITIZE_ADDRESS__)  // GCC's ASan (build-asan)
  static constexpr bool kOff = true;
#elif defined(__has_feature)
  static constexpr bool kOff = __has_feature(address_sanitizer);  // clang's (the fuzz build; clang 14 has no macro)
#else
  static constexpr bool kOff = false;
#endif
  std::mutex m_;
  std::unordered_map<uint64_t, std::vector<void*>> free_;
  uint64_t kept_ = 0;
};

BlockCache& block_cache() {
  static BlockCache* c = new BlockCache;  // never destroyed: a static tensor may be freed after it
  return *c;
}

}  // namespace

template <typename T>
void TensorT<T>::Free::operator()(T* p) const {
  if (!keeper) block_cache().give(p, bytes);
}

template <typename T>
TensorT<T> TensorT<T>::borrow(T* data, Shape shape, std::shared_ptr<const void> keeper) {
  ATTN_CHECK(keeper != nullptr, "Expected a keeper of the borrowed memory, but got none instead");
  attn::numel(shape);  // checks the sizes
  TensorT t;
  t.shape_ = std::move(shape);
  t.buf_ = std::unique_ptr<T[], Free>(data, Free{std::move(keeper)});
  return t;
}

template <typename T>
TensorT<T>::TensorT(Shape shape, bool zero_fill) : shape_(std::move(shape)) {
  const uint64_t n = uint64_t(attn::numel(shape_));  // checks the sizes
  uint64_t bytes;
  ATTN_CHECK(!__builtin_mul_overflow(n, uint64_t(sizeof(T)), &bytes) && bytes <= UINT64_MAX - 63,
             "Expected a tensor whose byte count fits in 64 bits, but got shape ", to_string(shape_), " instead");
  bytes = BlockCache::size_class((bytes + 63) / 64 * 64);
  check_fits_in_memory(double(bytes), cat("a tensor of shape ", to_string(shape_)));
  void* p = block_cache().take(bytes);
  buf_ = std::unique_ptr<T[], Free>(static_cast<T*>(p ? p : aligned_bytes(bytes)), Free{nullptr, bytes});
  if (zero_fill) std::memset(buf_.get(), 0, bytes);
}

template <typename T>
TensorT<T> TensorT<T>::copy_of(View<const T> src) {
  TensorT t = uninitialized(src.shape);  // every element is written below
  copy(src, t.view());
  return t;
}

template <typename T>
void copy(View<const T> src, View<T> dst) {
  ATTN_CHECK(src.shape == dst.shape, "Expected a copy between views of the same shape, but got ", to_string(src.shape),
             " into ", to_string(dst.shape), " instead");
  const int64_t total = src.numel();
  if (total == 0) return;
  if (src.is_contiguous() && dst.is_contiguous()) {  // the common case (saving activations): one memcpy
    std::memcpy(dst.data, src.data, sizeof(T) * size_t(total));
    return;
  }
  // Rows of the last dim, the outer dims walked as an odometer.
  const int r = src.rank();
  const int64_t inner = r ? src.shape[r - 1] : 1, step = r ? src.strides[r - 1] : 0, dstep = r ? dst.strides[r - 1] : 0;
  std::vector<int64_t> idx(r, 0);
  for (int64_t n = 0; n < total; n += inner) {
    int64_t off = 0, doff = 0;
    for (int i = 0; i + 1 < r; ++i) off += idx[i] * src.strides[i], doff += idx[i] * dst.strides[i];
    const T* row = src.data + off;
    T* out = dst.data + doff;
    for (int64_t j = 0; j < inner; ++j) out[j * dstep] = row[j * step];
    for (int i = r - 1; i-- > 0;) {  // odometer increment over the outer dims
      if (++idx[i] < src.shape[i]) break;
      idx[i] = 0;
    }
  }
}

template <typename T>
void TensorT<T>::reshape(Shape shape) {
  shape_ = view().reshape(std::move(shape)).shape;
}

template struct View<float>;
template struct View<const float>;
template struct View<double>;
template struct View<const double>;
template struct View<uint8_t>;
template struct View<const uint8_t>;
template struct View<uint16_t>;
template struct View<const uint16_t>;
template struct View<int64_t>;
template struct View<const int64_t>;
template class TensorT<float>;
template class TensorT<double>;
template class TensorT<uint8_t>;
template void copy(View<const float>, View<float>);
template void copy(View<const double>, View<double>);
template void copy(View<const uint8_t>, View<uint8_t>);

}  // namespace attn
