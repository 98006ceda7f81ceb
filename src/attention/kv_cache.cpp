// KVCache: per-layer K/V buffers (fp32 or 16-bit), append and views of the tokens held; a rolling layer
// writes each token twice so that its last W tokens are one ordered view. No attention math here; the
// rounding to 16 bits is to_half's (src/kernels/flash_decode.cpp).
#include "attn/kv_cache.h"

#include <algorithm>
#include <cstring>

namespace attn {

KVCache::KVCache(int64_t layers, int64_t B, int64_t Hkv, int64_t S_max, int64_t D, int64_t Dv, KvDtype dtype,
                 std::vector<int64_t> windows)
    : B_(B), Hkv_(Hkv), S_max_(S_max), D_(D), Dv_(Dv == 0 ? D : Dv), dtype_(dtype) {
  ATTN_CHECK(layers > 0 && B > 0 && Hkv > 0 && S_max > 0 && D > 0 && Dv_ > 0,
             "Expected layers, B, Hkv, S_max, D > 0 for KVCache, but got layers = ", layers, ", B = ", B,
             ", Hkv = ", Hkv, ", S_max = ", S_max, ", D = ", D, ", Dv = ", Dv_, " instead");
  ATTN_CHECK(windows.empty() || int64_t(windows.size()) == layers, "Expected windows for KVCache empty or one per ",
             "layer (", layers, "), but got ", windows.size(), " instead");
  rolling_.assign(size_t(layers), 0);
  for (size_t i = 0; i < windows.size(); ++i) {
    ATTN_CHECK(windows[i] >= 0, "Expected windows >= 0 for KVCache, but got ", windows[i], " for layer ", i,
               " instead");
    if (windows[i] < S_max) rolling_[i] = windows[i];  // else every token it is given stays in the window
  }
  for (size_t i = 0; i < size_t(layers); ++i) {
    const int64_t n = slots(i);
    if (dtype_ == KvDtype::f32) {
      k_.emplace_back(Shape{B, Hkv, n, D});
      v_.emplace_back(Shape{B, Hkv, n, Dv_});
    } else {
      k16_.emplace_back(size_t(numel({B, Hkv, n, D})), uint16_t(0));  // numel: an Error where it overflows
      v16_.emplace_back(size_t(numel({B, Hkv, n, Dv_})), uint16_t(0));
    }
  }
  len_.assign(size_t(layers), 0);
}

void KVCache::append(int64_t layer, View<const float> k, View<const float> v) {
  ATTN_CHECK(layer >= 0 && layer < layers(), "Expected layer in [0, ", layers(), "), but got ", layer, " instead");
  const int64_t T = k.rank() == 4 ? k.size(2) : -1, S = len_[size_t(layer)];
  ATTN_CHECK(k.rank() == 4 && k.shape == Shape({B_, Hkv_, T, D_}), "Expected k of shape (B, Hkv, T, D) = ",
             to_string({B_, Hkv_, T < 0 ? 0 : T, D_}), ", but got ", to_string(k.shape), " instead");
  ATTN_CHECK(v.shape == Shape({B_, Hkv_, T, Dv_}), "Expected v of shape (B, Hkv, T, Dv) = ",
             to_string({B_, Hkv_, T, Dv_}), " (k ", to_string(k.shape), "), but got ", to_string(v.shape), " instead");
  const size_t i = size_t(layer);
  const int64_t W = rolling_[i], n = slots(i);
  ATTN_CHECK(W > 0 || S + T <= S_max_, "Expected at most S_max = ", S_max_, " tokens in KVCache layer ", layer,
             ", but got ", S, " cached + ", T, " new instead");
  std::vector<float> row;  // one token's (d,) values, gathered from any strides
  // Token t (position S + t) goes to slot S + t, or to slots (S + t) % W and + W of a rolling layer; of
  // those, only the last W tokens stay in the window.
  auto copy = [&](float* dst32, uint16_t* dst16, View<const float> src, int64_t d) {  // dst (B, Hkv, n, d)
    row.resize(size_t(d));
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t h = 0; h < Hkv_; ++h)
        for (int64_t t = W > 0 ? std::max<int64_t>(0, T - W) : 0; t < T; ++t) {
          const float* in = src.data + b * src.stride(0) + h * src.stride(1) + t * src.stride(2);
          for (int64_t e = 0; e < d; ++e) row[size_t(e)] = in[e * src.stride(3)];
          const int64_t slot = W > 0 ? (S + t) % W : S + t;
          for (int64_t s = slot; s < (W > 0 ? 2 * W : slot + 1); s += (W > 0 ? W : 1)) {
            const int64_t o = ((b * Hkv_ + h) * n + s) * d;
            if (dst32) std::memcpy(dst32 + o, row.data(), size_t(d) * sizeof(float));
            else to_half(dtype_, row.data(), d, dst16 + o);
          }
        }
  };
  if (dtype_ == KvDtype::f32) {
    copy(k_[i].data(), nullptr, k, D_);
    copy(v_[i].data(), nullptr, v, Dv_);
  } else {
    copy(nullptr, k16_[i].data(), k, D_);
    copy(nullptr, v16_[i].data(), v, Dv_);
  }
  len_[i] = S + T;
}

int64_t KVCache::stored(int64_t layer) const {
  const int64_t n = len_.at(size_t(layer)), W = rolling_[size_t(layer)];
  return W > 0 ? std::min(n, W) : n;
}

int64_t KVCache::first_slot(size_t layer) const {
  const int64_t W = rolling_[layer];
  return W > 0 ? (len_[layer] - stored(int64_t(layer))) % W : 0;
}

int64_t KVCache::max_length() const {
  for (int64_t W : rolling_)
    if (W == 0) return S_max_;
  return std::numeric_limits<int64_t>::max();
}

View<const float> KVCache::keys(int64_t layer) const {
  ATTN_CHECK(dtype_ == KvDtype::f32, "Expected an f32 KVCache for keys(), but got ", to_string(dtype_),
             " instead (use half())");
  const size_t i = size_t(layer);
  const Tensor& t = k_.at(i);
  return {t.data() + first_slot(i) * D_, {B_, Hkv_, stored(layer), D_}, strides(i, D_)};
}

View<const float> KVCache::values(int64_t layer) const {
  ATTN_CHECK(dtype_ == KvDtype::f32, "Expected an f32 KVCache for values(), but got ", to_string(dtype_),
             " instead (use half())");
  const size_t i = size_t(layer);
  const Tensor& t = v_.at(i);
  return {t.data() + first_slot(i) * Dv_, {B_, Hkv_, stored(layer), Dv_}, strides(i, Dv_)};
}

HalfKV KVCache::half(int64_t layer) const {
  ATTN_CHECK(dtype_ != KvDtype::f32, "Expected an f16 or bf16 KVCache for half(), but got f32 instead (use keys())");
  const size_t i = size_t(layer);
  const int64_t S = stored(layer), f = first_slot(i);
  return {dtype_, View<const uint16_t>(k16_.at(i).data() + f * D_, {B_, Hkv_, S, D_}, strides(i, D_)),
          View<const uint16_t>(v16_.at(i).data() + f * Dv_, {B_, Hkv_, S, Dv_}, strides(i, Dv_))};
}

int64_t KVCache::length(int64_t layer) const { return len_.at(size_t(layer)); }

void KVCache::clear() { len_.assign(len_.size(), 0); }

void KVCache::grow(int64_t capacity) {
  ATTN_CHECK(capacity >= S_max_, "Expected a KVCache capacity >= S_max = ", S_max_, ", but got ", capacity, " instead");
  if (capacity == S_max_) return;
  // each (b, h) row of S_max · d values keeps its first len tokens at the start of a row of capacity · d
  auto moved = [&](const auto* src, auto* dst, int64_t d, int64_t len) {
    for (int64_t r = 0; r < B_ * Hkv_; ++r) std::copy_n(src + r * S_max_ * d, len * d, dst + r * capacity * d);
  };
  for (size_t i = 0; i < len_.size(); ++i) {
    if (rolling_[i] > 0) continue;  // its 2·W slots hold its window at any length
    if (dtype_ == KvDtype::f32) {
      Tensor k(Shape{B_, Hkv_, capacity, D_}), v(Shape{B_, Hkv_, capacity, Dv_});
      moved(k_[i].data(), k.data(), D_, len_[i]);
      moved(v_[i].data(), v.data(), Dv_, len_[i]);
      k_[i] = std::move(k);
      v_[i] = std::move(v);
    } else {
      std::vector<uint16_t> k(size_t(numel({B_, Hkv_, capacity, D_}))), v(size_t(numel({B_, Hkv_, capacity, Dv_})));
      moved(k16_[i].data(), k.data(), D_, len_[i]);
      moved(v16_[i].data(), v.data(), Dv_, len_[i]);
      k16_[i] = std::move(k);
      v16_[i] = std::move(v);
    }
  }
  S_max_ = capacity;
}

}  // namespace attn
