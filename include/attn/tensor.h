// Tensor core: an owning tensor with aligned storage, and non-owning strided views over any memory.
// Not a math library: kernels take a View's pointer and strides and loop themselves. A transpose or a
// head split is a new View of the same bytes; a copy is always explicit (Tensor::copy_of).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/check.h"

namespace attn {

using Shape = std::vector<int64_t>;

// "(2, 8, 10, 64)", as PyTorch prints a shape.
std::string to_string(const Shape& shape);
// The element count; an Error for a negative size or a count that does not fit in int64 (never wraps).
int64_t numel(const Shape& shape);
// a * b for sizes >= 0, or an Error naming `what` when the product does not fit in int64.
int64_t checked_mul(int64_t a, int64_t b, const char* what);
Shape contiguous_strides(const Shape& shape);

// A non-owning view: data, shape and strides in elements. An empty view (data == nullptr) means
// "not given" wherever a View is optional.
template <typename T>
struct View {
  T* data = nullptr;
  Shape shape;
  Shape strides;

  View() = default;
  View(T* data, Shape shape) : data(data), shape(shape), strides(contiguous_strides(shape)) {}
  View(T* data, Shape shape, Shape strides) : data(data), shape(std::move(shape)), strides(std::move(strides)) {}
  // A view of T is also a view of const T.
  operator View<const T>() const requires(!std::is_const_v<T>) { return {data, shape, strides}; }

  bool empty() const { return data == nullptr; }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const { return attn::numel(shape); }
  // Negative dims count from the end, as in PyTorch.
  int64_t size(int dim) const { return shape[wrap(dim)]; }
  int64_t stride(int dim) const { return strides[wrap(dim)]; }
  bool is_contiguous() const;

  View transpose(int a, int b) const;
  // Same bytes, new shape; needs a contiguous view (one dim may be -1).
  View reshape(Shape new_shape) const;
  // Drop dim `dim` by fixing its index.
  View select(int dim, int64_t index) const;
  // Indices [begin, begin + size) of dim `dim`, same rank and strides.
  View narrow(int dim, int64_t begin, int64_t size) const;
  // Reads and writes with every index checked against the shape.
  T& at(std::initializer_list<int64_t> index) const;

 private:
  int wrap(int dim) const;
};

// Copies every element of src into dst (same shape, any strides of either).
template <typename T>
void copy(View<const T> src, View<T> dst);

template <typename T>
class TensorT {
 public:
  TensorT() = default;
  // Zero-filled (unless told not), 64-byte aligned. An Error (before allocating) for a negative size, a
  // byte count that does not fit in 64 bits, or more bytes than the machine's physical memory.
  explicit TensorT(Shape shape, bool zero_fill = true);
  // Not zero-filled: for a buffer the caller writes in full before reading it (layer outputs, gradients
  // that a GEMM with beta = 0 or a loop overwrites). Reading it first is reading garbage.
  static TensorT uninitialized(Shape shape) { return TensorT(std::move(shape), false); }
  static TensorT copy_of(View<const T> src);  // contiguous copy of a (possibly strided) view
  // A tensor over memory it does not own (a mapped file): `keeper` is held, and the memory left alone,
  // until the tensor is gone. data needs T's alignment only, not 64 bytes.
  static TensorT borrow(T* data, Shape shape, std::shared_ptr<const void> keeper);
  TensorT(TensorT&&) noexcept = default;
  TensorT& operator=(TensorT&&) noexcept = default;
  TensorT(const TensorT&) = delete;  // no hidden copies: use copy_of
  TensorT& operator=(const TensorT&) = delete;

  T* data() { return buf_.get(); }
  const T* data() const { return buf_.get(); }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return attn::numel(shape_); }
  int64_t size(int dim) const { return view().size(dim); }
  View<T> view() { return {data(), shape_}; }
  View<const T> view() const { return {data(), shape_}; }
  operator View<T>() { return view(); }
  operator View<const T>() const { return view(); }
  // Same storage, new shape (numel must match).
  void reshape(Shape shape);

 private:
  struct Free {
    std::shared_ptr<const void> keeper;  // set: borrowed memory, not freed here
    uint64_t bytes = 0;                  // the block's size (big blocks are kept for the next tensor: tensor.cpp)
    void operator()(T* p) const;
  };
  std::unique_ptr<T[], Free> buf_;
  Shape shape_;
};

using Tensor = TensorT<float>;
using TensorD = TensorT<double>;

}  // namespace attn
