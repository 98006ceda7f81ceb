// The elementary layers of nn.h: Linear, LayerNorm, Dropout, ReLU/GELU, Embedding and the feed-forward
// block, forward and backward. Row-wise loops are split over rows by parallel_for (threads.h), the SIMD ones
// in gelu.cpp and layernorm.cpp; reductions into parameter gradients (split over features, if at all) sum
// the rows in order, so results do not depend on the thread count.
// Not the Transformer layers (transformer.cpp) and no attention (attention/).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "attn/gemm.h"
#include "attn/kernels/half_kv.h"  // to_half: use_bf16_weights
#include "attn/nn.h"
#include "attn/threads.h"
#include "gelu.h"
#include "layernorm.h"

namespace attn {
namespace {

// x as (N, F) rows: a view of x when contiguous, else of a copy kept in `storage`.
View<const float> as_rows(View<const float> x, Tensor& storage) {
  ATTN_CHECK(x.rank() >= 1, "Expected an input of rank >= 1 (..., F), but got shape ", to_string(x.shape), " instead");
  const int64_t F = x.size(-1), N = F == 0 ? 0 : x.numel() / F;
  if (!x.is_contiguous()) {
    storage = Tensor::copy_of(x);
    x = storage.view();
  }
  return {x.data, {N, F}};
}

// The saved tensor as rows, or an error naming the layer when no training forward came first.
void check_saved(bool saved, const char* layer) {
  ATTN_CHECK(saved, "Expected a forward in training mode before ", layer, ".backward, but got none instead");
}

void check_dout(View<const float> dout, const Shape& want, const char* layer) {
  ATTN_CHECK(dout.shape == want, "Expected dout of the output's shape ", to_string(want), " in ", layer,
             ".backward, but got ", to_string(dout.shape), " instead");
}

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

// An optional parameter: empty when absent (bias=False).
View<float> opt(Tensor& t) { return t.data() ? t.view() : View<float>{}; }

}  // namespace

// ---- Shared math ----

void add_(View<float> y, View<const float> x) {
  ATTN_CHECK(y.shape == x.shape && y.is_contiguous() && x.is_contiguous(),
             "Expected two contiguous tensors of one shape to add, but got ", to_string(y.shape), " and ",
             to_string(x.shape), " instead");
  const int64_t n = y.numel();
  float* __restrict py = y.data;
  const float* __restrict px = x.data;
  parallel_for(n, grain_for(1), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) py[i] += px[i];
  });
}

// ---- Linear ----

Linear::Linear(int64_t in_features, int64_t out_features, bool has_bias, uint64_t seed) {
  ATTN_CHECK(in_features > 0 && out_features > 0, "Expected in_features and out_features > 0, but got ",
             in_features, " and ", out_features, " instead");
  Rng rng(seed);
  weight = Tensor({out_features, in_features});
  weight_grad = Tensor({out_features, in_features});
  init::linear_weight(weight, rng);
  if (has_bias) {
    bias = Tensor({out_features});
    bias_grad = Tensor({out_features});
    const double bound = 1.0 / std::sqrt(double(in_features));
    init::uniform(bias, -bound, bound, rng);
  }
}

void Linear::parameters(std::vector<Param>& out, const std::string& prefix) {
  out.push_back({prefix + "weight", &weight, &weight_grad});
  if (bias.data()) out.push_back({prefix + "bias", &bias, &bias_grad});
}

Tensor Linear::forward(View<const float> x) { return run(x, nullptr); }
Tensor Linear::forward(Tensor&& x) { return run(x.view(), &x); }

// owner: the tensor x views, which may be kept as the saved input instead of a copy (nullptr: copy).
Linear::Linear(Tensor w, Tensor b, WeightLayout layout)
    : weight(std::move(w)), bias(std::move(b)), layout(layout), given_(true) {
  const bool io = layout == WeightLayout::in_out;
  ATTN_CHECK(weight.shape().size() == 2 && weight.numel() > 0, "Expected a Linear weight ",
             io ? "(in, out)" : "(out, in)", ", but got ", to_string(weight.shape()), " instead");
  const int64_t out = weight.size(io ? 1 : 0);
  ATTN_CHECK(!bias.data() || bias.shape() == Shape{out}, "Expected a Linear bias of shape ", to_string({out}),
             ", but got ", to_string(bias.shape()), " instead");
}

Tensor Linear::run(View<const float> x, Tensor* owner) {
  const bool io = layout == WeightLayout::in_out;
  const int64_t in = weight.size(io ? 0 : 1), out = weight.size(io ? 1 : 0);
  ATTN_CHECK(x.rank() >= 1 && x.size(-1) == in, "Expected input (..., in_features) with in_features = ", in,
             ", but got shape ", to_string(x.shape), " instead");
  Tensor storage;
  View<const float> rows = as_rows(x, storage);  // (N, in)
  if (training_) {
    x_ = storage.data() ? std::move(storage) : owner ? std::move(*owner) : Tensor::copy_of(x);
    rows = {x_.data(), rows.shape};
  } else {
    x_ = Tensor();
  }
  Tensor y = Tensor::uninitialized(with_last(x.shape, out));  // (..., out): every element written below
  const int64_t n = rows.size(0);
  const View<const float> b = bias.data() ? bias.view() : View<const float>{};
  View<float> yr = y.view().reshape({n, out});
  if (!weight16_.empty() && matmul_precision() == Precision::bf16) {
    const View<const uint16_t> w16(weight16_.data(), weight.shape());
    if (given_ && n <= kGemvRows) linear_rows(rows, w16, layout, b, yr);
    else if (packed16_.panels) linear(rows, w16, packed16_, b, yr);
    else linear(rows, w16, b, yr, layout);
  } else if (given_ && n <= kGemvRows) {
    linear_rows(rows, weight.view(), layout, b, yr);
  } else if (packed_.panels) {
    linear(rows, weight.view(), packed_, b, yr);
  } else {
    linear<float>(rows, weight.view(), b, yr, layout);  // a bf16 Autocast's matmuls too, either layout
  }
  return y;
}

void Linear::use_bf16_weights() {
  weight16_.resize(size_t(weight.numel()));
  to_half(KvDtype::bf16, weight.data(), weight.numel(), weight16_.data());
  if (packed_.panels) pack_weight();  // the bf16 weight's panels instead
}

void Linear::pack_weight() {
  ATTN_CHECK(layout == WeightLayout::out_in, "Expected a Linear weight (out, in) to pack, but got (in, out) instead");
  const int64_t in = weight.size(1), out = weight.size(0);
  if (weight16_.empty()) {
    packed_ = pack_b(true, in, out, weight.data(), in);
  } else {  // forward reads the bf16 weight: its panels, and no fp32 ones
    packed16_ = pack_b_bf16(true, in, out, weight16_.data(), in);
    packed_ = PackedB();
  }
}

Tensor Linear::backward(View<const float> dout) { return backward(dout, true); }

Tensor Linear::backward(View<const float> dout, bool add_bias_grad) {
  check_saved(x_.data() != nullptr, "Linear");
  ATTN_CHECK(layout == WeightLayout::out_in,
             "Expected a Linear weight (out, in) for backward, but got (in, out) instead");
  const int64_t in = weight.size(1), out = weight.size(0), N = x_.numel() / in;
  check_dout(dout, with_last(x_.shape(), out), "Linear");
  Tensor storage;
  View<const float> dy = as_rows(dout, storage);  // (N, out)
  Tensor dx = Tensor::uninitialized(x_.shape());  // (..., in): the gemm's beta = 0 overwrites it
  linear_backward({x_.data(), {N, in}}, weight.view(), dy, dx.view().reshape({N, in}), weight_grad.view(),
                  add_bias_grad ? opt(bias_grad) : View<float>{});
  return dx;
}

// ---- RMSNorm ----

RMSNorm::RMSNorm(Tensor w, double eps) : LayerNorm(std::move(w), Tensor(), eps) {
  ATTN_CHECK(weight.data(), "Expected an RMSNorm weight (F), but got none instead");
  rms_ = true;
}

// ---- Rope ----

struct Rope::Table {
  std::shared_mutex mutex;
  int64_t rows = 0;               // positions [0, rows) computed
  std::vector<float> cos, sin;    // (rows, D/2)
};

Rope::Rope(int64_t D, double theta, int64_t P) : D_(D), P_(P), theta_(theta), table_(std::make_shared<Table>()) {
  ATTN_CHECK(D > 0 && D % 2 == 0 && P > 0 && std::isfinite(theta) && theta > 0, "Expected an even head_dim > 0, "
             "max_positions > 0 and a finite rope_theta > 0, but got ", D, ", ", P, " and ", theta, " instead");
}

void Rope::apply(float* x, int64_t T, int64_t row_stride, int64_t heads, const int64_t* pos, bool inverse) const {
  const int64_t h = D_ / 2;
  int64_t need = 0;  // rows of the table this call reads
  for (int64_t t = 0; t < T; ++t) {
    ATTN_CHECK(pos[t] >= 0 && pos[t] < P_, "Expected positions in [0, ", P_, ") (max_position_embeddings), but got ",
               pos[t], " at row ", t, " instead");
    need = std::max(need, pos[t] + 1);
  }
  Table& tab = *table_;
  std::shared_lock<std::shared_mutex> read(tab.mutex);
  if (tab.rows < need) {
    read.unlock();
    {
      std::unique_lock<std::shared_mutex> write(tab.mutex);
      const int64_t old = tab.rows, rows = std::min(P_, std::max(need, 2 * old));
      if (old < need) {  // (another call may have grown it meanwhile)
        const size_t n = size_t(checked_mul(rows, h, "RoPE's table (positions * head_dim / 2)"));
        tab.cos.resize(n);
        tab.sin.resize(n);
        // transformers: inv_freq = 1 / theta^(arange(0, D, 2).float() / D), angles = pos.float() · inv_freq,
        // all float32; cos and sin of the float32 angle
        for (int64_t i = 0; i < h; ++i) {
          const float e = float(2 * i) / float(D_);
          const float inv = 1.0f / float(std::pow(theta_, double(e)));
          for (int64_t p = old; p < rows; ++p) {
            const float a = float(p) * inv;
            tab.cos[size_t(p * h + i)] = float(std::cos(double(a)));
            tab.sin[size_t(p * h + i)] = float(std::sin(double(a)));
          }
        }
        tab.rows = rows;
      }
    }
    read.lock();
  }
  parallel_for(T * heads, grain_for(3 * D_), [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = r / heads, hd = r % heads;
      float* v = x + t * row_stride + hd * D_;
      const float* c = tab.cos.data() + pos[t] * h;
      const float* s = tab.sin.data() + pos[t] * h;
      if (inverse) {
        for (int64_t i = 0; i < h; ++i) {  // (x1, x2) -> (x1·c + x2·s, x2·c - x1·s)
          const float x1 = v[i], x2 = v[i + h];
          v[i] = x1 * c[i] + x2 * s[i];
          v[i + h] = x2 * c[i] - x1 * s[i];
        }
        continue;
      }
      for (int64_t i = 0; i < h; ++i) {  // (x1, x2) -> (x1·c - x2·s, x2·c + x1·s), each product rounded
        const float x1 = v[i], x2 = v[i + h];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + h] = x2 * c[i] + x1 * s[i];
      }
    }
  });
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(int64_t normalized_shape, double eps, bool elementwise_affine, bool has_bias) : eps(eps) {
  ATTN_CHECK(normalized_shape > 0, "Expected normalized_shape > 0, but got ", normalized_shape, " instead");
  if (!elementwise_affine) return;
  weight = Tensor({normalized_shape});
  weight_grad = Tensor({normalized_shape});
  for (int64_t i = 0; i < normalized_shape; ++i) weight.data()[i] = 1.0f;
  if (has_bias) {
    bias = Tensor({normalized_shape});
    bias_grad = Tensor({normalized_shape});
  }
}

LayerNorm::LayerNorm(Tensor w, Tensor b, double eps) : weight(std::move(w)), bias(std::move(b)), eps(eps) {
  ATTN_CHECK(weight.shape().size() == 1 && weight.numel() > 0, "Expected a LayerNorm weight (F), but got ",
             to_string(weight.shape()), " instead");
  ATTN_CHECK(!bias.data() || bias.shape() == weight.shape(), "Expected a LayerNorm bias of shape ",
             to_string(weight.shape()), ", but got ", to_string(bias.shape()), " instead");
}

void LayerNorm::parameters(std::vector<Param>& out, const std::string& prefix) {
  if (weight.data()) out.push_back({prefix + "weight", &weight, &weight_grad});
  if (bias.data()) out.push_back({prefix + "bias", &bias, &bias_grad});
}

Tensor LayerNorm::forward(View<const float> x) { return run(x, {}); }

Tensor LayerNorm::forward_add(Tensor& x, View<const float> residual) {
  ATTN_CHECK(residual.shape == x.shape() && residual.is_contiguous(), "Expected a contiguous residual of x's shape ",
             to_string(x.shape()), " for LayerNorm.forward_add, but got ", to_string(residual.shape), " instead");
  return run(x.view(), residual);
}

// add: empty, or the residual added into x (then x is a Tensor's contiguous, writable buffer) first.
Tensor LayerNorm::run(View<const float> x, View<const float> add) {
  Tensor storage;
  View<const float> rows = as_rows(x, storage);  // (N, F); a view of x itself when add is given
  const int64_t N = rows.size(0), F = rows.size(1);
  ATTN_CHECK(!weight.data() || F == weight.size(0), "Expected input (..., F) with F = ", weight.size(0),
             ", but got shape ", to_string(x.shape), " instead");
  Tensor y = Tensor::uninitialized(x.shape);  // y, xhat and rstd: every row is written below
  if (training_) {
    xhat_ = Tensor::uninitialized(x.shape);
    rstd_ = Tensor::uninitialized({N});
  } else {
    xhat_ = Tensor();
    rstd_ = Tensor();
  }
  // Written only when add is given: x is then forward_add's Tensor& (non-const, contiguous).
  float* px = const_cast<float*>(rows.data);
  parallel_for(N, grain_for(8 * F), [&](int64_t r0, int64_t r1, int) {  // SIMD rows (layernorm.cpp)
    layernorm_forward(r0, r1, F, px, add.data, eps, weight.data(), bias.data(), y.data(), xhat_.data(), rstd_.data(),
                      rms_);
  });
  return y;
}

Tensor LayerNorm::backward(View<const float> dout) {
  Tensor dx = Tensor::uninitialized(xhat_.data() ? xhat_.shape() : dout.shape);  // every row written
  run_backward(dout, dx.data(), false);
  return dx;
}

void LayerNorm::backward_add(View<const float> dout, Tensor& dx) {
  ATTN_CHECK(dx.shape() == dout.shape, "Expected a gradient of dout's shape ", to_string(dout.shape),
             " to add LayerNorm's input gradient to, but got ", to_string(dx.shape()), " instead");
  run_backward(dout, dx.data(), true);
}

// dx (N, F) contiguous: written, or added to when accumulate.
void LayerNorm::run_backward(View<const float> dout, float* dx, bool accumulate) {
  ATTN_CHECK(!rms_, "Expected a LayerNorm for backward, but got an RMSNorm (inference only) instead");
  check_saved(xhat_.data() != nullptr, "LayerNorm");
  check_dout(dout, xhat_.shape(), "LayerNorm");
  Tensor storage;
  View<const float> dy = as_rows(dout, storage);  // (N, F)
  const int64_t N = dy.size(0), F = dy.size(1);
  const float* xhat = xhat_.data();
  // dx = rstd · (g - mean(g) - xhat · mean(g · xhat)), g = dy · weight: SIMD rows (layernorm.cpp)
  parallel_for(N, grain_for(8 * F), [&](int64_t r0, int64_t r1, int) {
    layernorm_backward(r0, r1, F, dy.data, xhat, rstd_.data(), weight.data(), dx, accumulate);
  });
  // dweight += Σ_rows dy · xhat, dbias += Σ_rows dy: split over groups of 16 features (whole vectors: a
  // split inside one would send its features down the scalar tail), each summed over rows in order
  constexpr int64_t kGroup = 16;
  if (weight.data() || bias.data())
    parallel_for((F + kGroup - 1) / kGroup, grain_for(2 * N * kGroup), [&](int64_t g0, int64_t g1, int) {
      layernorm_param_grads(g0 * kGroup, std::min(F, g1 * kGroup), N, F, dy.data, xhat,
                            weight.data() ? weight_grad.data() : nullptr, bias.data() ? bias_grad.data() : nullptr);
    });
}

// ---- Dropout ----

Dropout::Dropout(double p, uint64_t seed) : p(p), seed_(mix64(seed)), last_seed_(0) {
  check_dropout_p("dropout probability", p);
}

void Dropout::reseed(uint64_t seed) { seed_ = mix64(seed); }

namespace {
// y[i] = keep(seed, index0 + i) ? x[i] / (1 - p) : 0, the forward and the backward alike.
Tensor apply_dropout(View<const float> x, double p, uint64_t seed, uint64_t index0) {
  Tensor storage;
  View<const float> rows = as_rows(x, storage);
  if (p >= 1) return Tensor(x.shape);  // everything dropped (zeros); 1/(1 - p) would be inf
  Tensor y = Tensor::uninitialized(x.shape);
  const int64_t n = y.numel();
  const uint32_t threshold = dropout_threshold(p);
  const float scale = dropout_keep_scale<float>(p);
  const float* px = rows.data;
  float* py = y.data();
  parallel_for(n, grain_for(4), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) py[i] = dropout_keep(seed, index0 + uint64_t(i), threshold) ? px[i] * scale : 0.0f;
  });
  return y;
}
}  // namespace

Tensor Dropout::forward(View<const float> x) {
  saved_ = training_;
  if (!training_ || p == 0) {
    Tensor storage;
    as_rows(x, storage);  // checks the rank
    return Tensor::copy_of(x);
  }
  last_seed_ = seed_++;
  const int64_t n = x.numel(), rows = x.rank() > 0 ? x.size(0) : 1;
  last_index0_ = rows > 0 ? uint64_t(batch_offset_) * uint64_t(n / rows) : 0;
  return apply_dropout(x, p, last_seed_, last_index0_);
}

Tensor Dropout::backward(View<const float> dout) {
  check_saved(saved_, "Dropout");
  if (p == 0) return Tensor::copy_of(dout);
  return apply_dropout(dout, p, last_seed_, last_index0_);
}

// The identity costs nothing: no copy, and the seed stream does not advance (as in forward()).
Tensor Dropout::apply(Tensor&& x) { return training_ && p > 0 ? forward(x.view()) : std::move(x); }
Tensor Dropout::apply_backward(Tensor&& dout) { return p > 0 ? backward(dout.view()) : std::move(dout); }

// ---- Activations ----

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu_tanh" || name == "tanh") return Activation::gelu_tanh;
  ATTN_CHECK(false, "Expected activation relu, gelu or gelu_tanh, but got '", name, "' instead");
  return Activation::relu;
}

const char* to_string(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}

GELU::GELU(const std::string& approximate)
    : ActivationLayer(approximate == "tanh" ? Activation::gelu_tanh : Activation::gelu) {
  ATTN_CHECK(approximate == "none" || approximate == "tanh", "Expected approximate 'none' or 'tanh', but got '",
             approximate, "' instead");
}

Tensor ActivationLayer::forward(View<const float> x) { return run(x, nullptr); }
Tensor ActivationLayer::forward(Tensor&& x) { return run(x.view(), &x); }
Tensor ActivationLayer::backward(View<const float> dout) { return run_backward(dout, nullptr); }
Tensor ActivationLayer::backward(Tensor&& dout) { return run_backward(dout.view(), &dout); }
Tensor ActivationLayer::backward_before(Linear& linear, Tensor&& dout) {
  ATTN_CHECK(linear.bias.data() && dout.shape().back() == linear.bias.size(0), "Expected a Linear with a bias of ",
             dout.shape().back(), " features before the activation, but got ",
             linear.bias.data() ? to_string(linear.bias.shape()) : std::string("none"), " instead");
  return run_backward(dout.view(), &dout, linear.bias_grad.data());
}

namespace {
// y[i] = act(x[i]) for n values: the one home of the activations' forward arithmetic.
void activate(Activation kind, const float* x, float* y, int64_t n) {
  if (kind == Activation::relu)
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
  else
    gelu_forward(x, y, n, kind == Activation::gelu_tanh);
}

// dx[i] = dy[i]·act'(x[i]) (dx may be dy): the backward's one home. ReLU's gradient is 0 at x = 0, as PyTorch.
void activate_backward(Activation kind, const float* x, const float* dy, float* dx, int64_t n) {
  if (kind == Activation::relu)
    for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0 ? dy[i] : 0.0f;
  else
    gelu_backward(x, dy, dx, n, kind == Activation::gelu_tanh);
}
}  // namespace

// owner: the tensor x views, kept as the saved input instead of a copy (nullptr: copy); in eval, y is written
// over it, as the backward writes dx over dout. An MLP's activation in inference then needs no second (tokens,
// 4E) buffer: a MiniLM pass over 256 paragraphs took 97k page faults with it, 16.5k without.
Tensor ActivationLayer::run(View<const float> x, Tensor* owner) {
  Tensor storage;
  View<const float> rows = as_rows(x, storage);
  Tensor y = !training_ && owner && !storage.data() ? std::move(*owner)  // every element written below
                                                    : Tensor::uninitialized(x.shape);
  const int64_t n = y.numel();
  const float* px = rows.data;
  float* py = y.data();
  parallel_for(n, grain_for(kind == Activation::relu ? 1 : 16),
               [&](int64_t b, int64_t e, int) { activate(kind, px + b, py + b, e - b); });
  x_ = !training_ ? Tensor() : storage.data() ? std::move(storage) : owner ? std::move(*owner) : Tensor::copy_of(x);
  return y;
}

// owner: the tensor dout views; dx is written over it when it is contiguous (nullptr: a new dx).
Tensor ActivationLayer::run_backward(View<const float> dout, Tensor* owner, float* bias_grad) {
  check_saved(x_.data() != nullptr, to_string(kind));
  check_dout(dout, x_.shape(), to_string(kind));
  Tensor storage;
  View<const float> dy = as_rows(dout, storage);
  Tensor dx = owner && !storage.data() ? std::move(*owner) : Tensor::uninitialized(x_.shape());  // all written
  const int64_t n = dx.numel();
  const float* px = x_.data();
  const float* pg = dy.data;
  float* pd = dx.data();
  if (!bias_grad) {
    parallel_for(n, grain_for(kind == Activation::relu ? 1 : 16),
                 [&](int64_t b, int64_t e, int) { activate_backward(kind, px + b, pg + b, pd + b, e - b); });
    return dx;
  }
  // With the bias gradient of the Linear before: split over groups of kGroup columns, each group row by
  // row (dx while in L1, then its column sums), so each column sums its rows in order as linear_backward.
  const int64_t cols = dy.size(1), rows = dy.size(0);
  constexpr int64_t kGroup = 128;
  parallel_for((cols + kGroup - 1) / kGroup, grain_for(16 * rows * kGroup), [&](int64_t g0, int64_t g1, int) {
    const int64_t c0 = g0 * kGroup, c1 = std::min(cols, g1 * kGroup);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = r * cols + c0;
      activate_backward(kind, px + at, pg + at, pd + at, c1 - c0);
      for (int64_t c = c0; c < c1; ++c) bias_grad[c] += pd[r * cols + c];
    }
  });
  return dx;
}

// ---- Embedding ----

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, uint64_t seed) {
  ATTN_CHECK(num_embeddings > 0 && embedding_dim > 0, "Expected num_embeddings and embedding_dim > 0, but got ",
             num_embeddings, " and ", embedding_dim, " instead");
  Rng rng(seed);
  weight = Tensor({num_embeddings, embedding_dim});
  weight_grad = Tensor({num_embeddings, embedding_dim});
  init::normal(weight, 0.0, 1.0, rng);
}

Embedding::Embedding(Tensor w) : weight(std::move(w)) {
  ATTN_CHECK(weight.shape().size() == 2 && weight.numel() > 0, "Expected an Embedding table (V, E), but got ",
             to_string(weight.shape()), " instead");
}

void Embedding::parameters(std::vector<Param>& out, const std::string& prefix) {
  out.push_back({prefix + "weight", &weight, &weight_grad});
}

Tensor Embedding::forward(const int64_t* ids, const Shape& shape) {
  const int64_t V = weight.size(0), E = weight.size(1), n = numel(shape);
  for (int64_t i = 0; i < n; ++i)
    ATTN_CHECK(ids[i] >= 0 && ids[i] < V, "Expected indices in [0, ", V, ") for Embedding, but got ", ids[i],
               " at position ", i, " instead");
  Shape out_shape = shape;
  out_shape.push_back(E);
  Tensor y = Tensor::uninitialized(out_shape);  // (shape..., E): every row copied below
  for (int64_t i = 0; i < n; ++i) std::memcpy(y.data() + i * E, weight.data() + ids[i] * E, sizeof(float) * size_t(E));
  ids_.clear();
  saved_shape_.clear();
  if (training_) {
    ids_.assign(ids, ids + n);
    saved_shape_ = out_shape;
  }
  return y;
}

void Embedding::backward(View<const float> dout) {
  check_saved(!saved_shape_.empty(), "Embedding");
  check_dout(dout, saved_shape_, "Embedding");
  Tensor storage;
  View<const float> dy = as_rows(dout, storage);  // (n, E)
  const int64_t E = weight.size(1);
  for (size_t i = 0; i < ids_.size(); ++i) {  // in order: repeated ids add up deterministically
    float* g = weight_grad.data() + ids_[i] * E;
    const float* d = dy.data + int64_t(i) * E;
    for (int64_t e = 0; e < E; ++e) g[e] += d[e];
  }
}

// ---- FeedForward ----

namespace {
constexpr uint64_t kLinear1Stream = 1, kLinear2Stream = 2, kDropoutStream = 3;
}  // namespace

FeedForward::FeedForward(int64_t d_model, int64_t dim_feedforward, Activation act_kind, double p, bool has_bias,
                         uint64_t seed)
    // The children's streams, mix64(seed ^ k) for k = 1 (linear1), 2 (linear2), 3 (dropout): values as
    // first released, so every initialisation stays.
    : linear1(d_model, dim_feedforward, has_bias, mix64(seed ^ kLinear1Stream)),
      linear2(dim_feedforward, d_model, has_bias, mix64(seed ^ kLinear2Stream)),
      activation(act_kind),
      dropout(p, mix64(seed ^ kDropoutStream)) {}

std::vector<Child> FeedForward::children() {
  return {{"linear1.", &linear1}, {"linear2.", &linear2}, {"activation.", &activation}, {"dropout.", &dropout}};
}

// Each intermediate is handed on as a temporary, so the layer that saves it keeps it (no copies).
Tensor FeedForward::forward(View<const float> x) {
  return linear2.forward(dropout.apply(activation.forward(linear1.forward(x))));
}

// With a bias, linear1's bias gradient is summed in the activation's backward pass (backward_before).
Tensor FeedForward::backward(View<const float> dout) {
  Tensor g = dropout.apply_backward(linear2.backward(dout));
  if (!linear1.bias.data()) return linear1.backward(activation.backward(std::move(g)).view());  // in place
  g = activation.backward_before(linear1, std::move(g));  // in place; adds linear1.bias_grad
  return linear1.backward(g.view(), false);
}

}  // namespace attn
