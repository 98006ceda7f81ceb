// MultiheadAttention: checks, PyTorch's initialisation, state_dict I/O, and a forward that is a
// sequence of readable steps (project, split heads by strides, sdpa, concat by strides, project); the
// backward is the same steps in reverse (sdpa_backward, linear_backward), and forward_cached the forward
// over a KV cache. No attention math here: that is sdpa()'s job.
#include "attn/mha.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>

#include "attn/gemm.h"
#include "attn/param.h"
#include "attn/profile.h"
#include "attn/rng.h"
#include "attn/sdpa.h"

namespace attn {
namespace {

// ---- Views ----

// PyTorch's layouts as (B, T, C) views of the same bytes: (T, B, C) transposed, unbatched (T, C) as B = 1.
template <typename T>
View<T> as_btc(View<T> x, bool seq_first) {
  if (x.rank() == 2) return {x.data, {1, x.size(0), x.size(1)}, {x.size(0) * x.stride(0), x.stride(0), x.stride(1)}};
  return seq_first ? x.transpose(0, 1) : x;
}

// A buffer stored in the input's layout, (T, B, C) when seq_first else (B, T, C), so one gemm covers all
// rows and the result is already in PyTorch's output layout. Zeroed unless `written` says that every
// element is written before it is read (a gemm output with beta = 0).
Tensor new_buffer(bool seq_first, int64_t B, int64_t T, int64_t C, bool written = false) {
  return seq_first ? Tensor({T, B, C}, !written) : Tensor({B, T, C}, !written);
}
View<float> btc(Tensor& t, bool seq_first) { return seq_first ? t.view().transpose(0, 1) : t.view(); }

// (B, T, heads·D) -> (B, heads, T, D): a strided view of the same bytes (no hidden copy).
template <typename T>
View<T> split_heads(View<T> x, int64_t heads) {
  const int64_t d = x.size(2) / heads;
  return {x.data, {x.size(0), heads, x.size(1), d}, {x.stride(0), d * x.stride(2), x.stride(1), x.stride(2)}};
}

// Rows [begin, begin + n) of a contiguous matrix or vector: a slice of a packed parameter.
View<const float> rows(const Tensor& t, int64_t begin, int64_t n) {
  if (!t.data()) return {};
  const int64_t width = t.shape().size() > 1 ? t.size(1) : 1;
  Shape shape = t.shape();
  shape[0] = n;
  return {t.data() + begin * width, shape};
}

// The gradient slice of rows(t, begin, n), writable; empty when the parameter is absent.
View<float> grad_rows(Tensor& t, int64_t begin, int64_t n) {
  View<const float> r = rows(t, begin, n);
  return {const_cast<float*>(r.data), r.shape, r.strides};
}

// y (B, T, out) = x (B, T, in) · Wᵀ + bias. One gemm over all B·T rows when both views step through
// their rows with one stride, else one gemm per batch. Copies x once if gemm can't read it in place.
void project(View<const float> x, View<const float> w, View<const float> bias, View<float> y) {
  const int64_t B = x.size(0), T = x.size(1), in = x.size(2), out = y.size(2);
  // No rows: nothing to write. (An empty view's strides may be anything: a contiguous (0, T, in) has
  // stride 0 in dim 0, which rows_ok rejects, and copying it again would never end.)
  if (B * T == 0) return;
  auto rows_ok = [](const auto& v) {  // unit last stride, row strides gemm accepts (lda >= columns)
    return v.stride(2) == 1 && (v.size(0) == 1 || v.stride(0) >= v.size(2)) &&
           (v.size(1) == 1 || v.stride(1) >= v.size(2));
  };
  if (!rows_ok(x)) {
    Tensor copy = Tensor::copy_of(x);
    return project(copy.view(), w, bias, y);
  }
  auto collapses = [](const auto& v, int outer, int inner) {
    return v.stride(outer) == v.size(inner) * v.stride(inner);
  };
  for (auto [outer, inner] : {std::pair{0, 1}, std::pair{1, 0}}) {
    if (collapses(x, outer, inner) && collapses(y, outer, inner) && x.stride(inner) >= in) {
      linear<float>({x.data, {B * T, in}, {x.stride(inner), 1}}, w, bias, {y.data, {B * T, out}, {y.stride(inner), 1}});
      return;
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    View<const float> xb{x.data + b * x.stride(0), {T, in}, {T > 1 ? x.stride(1) : in, 1}};  // (T, in)
    linear<float>(xb, w, bias, y.select(0, b));
  }
}

// Backward of project() over views with unit last stride: dx (B, T, in) = dy · W, dW += dyᵀ · x,
// db += Σ dy. One linear_backward over all B·T rows when every view steps through its rows with one
// stride, else one per batch.
void project_backward(View<const float> x, View<const float> w, View<const float> dy, View<float> dx, View<float> dw,
                      View<float> db) {
  const int64_t B = x.size(0), T = x.size(1);
  if (B * T == 0) return;  // no rows: dx is empty and nothing adds into dW, db
  auto collapses = [](const auto& v, int outer, int inner) {
    return v.stride(outer) == v.size(inner) * v.stride(inner);
  };
  auto matrix = [](auto v, int64_t n, int64_t row_stride) {  // (n, C)
    return decltype(v){v.data, {n, v.size(2)}, {row_stride, 1}};
  };
  for (auto [outer, inner] : {std::pair{0, 1}, std::pair{1, 0}}) {
    if (collapses(x, outer, inner) && collapses(dy, outer, inner) && collapses(dx, outer, inner)) {
      linear_backward(matrix(x, B * T, x.stride(inner)), w, matrix(dy, B * T, dy.stride(inner)),
                      matrix(dx, B * T, dx.stride(inner)), dw, db);
      return;
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    auto batch = [&](auto v) {  // (T, C) of batch b
      return decltype(v){v.data + b * v.stride(0), {T, v.size(2)}, {T > 1 ? v.stride(1) : v.size(2), 1}};
    };
    linear_backward(batch(x), w, batch(dy), batch(dx), dw, db);
  }
}

// ---- Masks ----

// f(view) on the view a mask holds (bools or additive values), to reshape it by strides.
template <typename F>
void with_view(Mask<float>& m, F f) {
  if (m.kind == Mask<float>::Kind::additive) f(m.bias);
  else f(m.bools);
}

// What sdpa gets for one mask: a view of the caller's mask, or (with add_bias_kv / add_zero_attn) a
// padded additive copy, since a column can't be appended to a view.
struct MaskArg {
  Mask<float> mask;
  Tensor storage;  // (..., S') when padded
};

// PyTorch's pad(mask, (0, extra)): `extra` trailing columns that mask nothing. With `causal`, the top-left
// triangle over the first S columns is folded in (the padded columns stay visible, as in PyTorch).
// `m` may be absent (kind none): then it is the (L, S) causal mask alone. The copy is additive:
// MaskRef::at already turns each kind into what it adds.
MaskArg pad_mask(const Mask<float>& m, const Shape& shape /* (..., L, S) */, int64_t extra, bool causal) {
  const int r = int(shape.size());
  Shape shape4(4 - r, 1), strides4(4 - r, 0);  // rank 4, leading dims broadcast
  shape4.insert(shape4.end(), shape.begin(), shape.end());
  const Shape& st = m.kind == Mask<float>::Kind::additive ? m.bias.strides : m.bools.strides;
  for (int i = 0; i < r; ++i) strides4.push_back(m.given() ? st[i] : 0);
  MaskRef<float> src{m.kind, m.bools.data, m.bias.data, strides4[0], strides4[1], strides4[2], strides4[3]};
  const int64_t S = shape4[3], S2 = S + extra;
  Shape padded = shape;
  padded.back() = S2;
  MaskArg a{{}, Tensor(padded)};
  float* dst = a.storage.data();  // (d0, d1, L, S') contiguous
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t L = shape4[2];
  for (int64_t i0 = 0; i0 < shape4[0]; ++i0)
    for (int64_t i1 = 0; i1 < shape4[1]; ++i1)
      for (int64_t l = 0; l < L; ++l, dst += S2) {
        // is_causal: PyTorch's top-left rule over the S keys given (not bias_k or the zero column)
        const int64_t end = causal ? causal_key_end(Causal::top_left, l, L, S) : S;
        for (int64_t s = 0; s < S; ++s) dst[s] = s < end ? src.at(i0, i1, l, s) : -kInf;
      }
  a.mask = Mask<float>::additive(a.storage.view());
  return a;
}

// A mask that outlives the forward, for backward: the padded storage moved in, or a copy of the
// caller's view (they may reuse their buffer).
Mask<float> keep_mask(MaskArg&& a, Tensor& bias, TensorT<uint8_t>& bools) {
  if (!a.mask.given()) return {};
  if (a.storage.data()) {  // the mask already views this storage; moving keeps the bytes in place
    bias = std::move(a.storage);
    return a.mask;
  }
  if (a.mask.kind == Mask<float>::Kind::additive) {
    bias = Tensor::copy_of(a.mask.bias);
    return Mask<float>::additive(bias.view());
  }
  bools = TensorT<uint8_t>::copy_of(a.mask.bools);
  Mask<float> m = a.mask;
  m.bools = bools.view();
  return m;
}

bool same_view(const View<const float>& a, const View<const float>& b) {
  return a.data == b.data && a.shape == b.shape && a.strides == b.strides;
}

const char* layout_name(bool batched, bool batch_first) {
  return !batched ? "(L, E)" : batch_first ? "(N, L, E)" : "(L, N, E)";
}

// ---- The forward's steps ----

// The inputs as (B, T, C) views, checked against each other and the options.
struct MhaInputs {
  View<const float> xq, xk, xv;  // (B, L, E), (B, S, kdim), (B, S, vdim)
  bool batched, seq_first;
  int64_t B, L, S;
};

MhaInputs read_inputs(const MhaOptions& o, View<const float> query, View<const float> key, View<const float> value) {
  const bool batched = query.rank() == 3;
  ATTN_CHECK(query.rank() == 2 || batched, "Expected query of rank 3 ", layout_name(true, o.batch_first),
             " or rank 2 (L, E), but got shape ", to_string(query.shape), " instead");
  ATTN_CHECK(key.rank() == query.rank() && value.rank() == query.rank(), "Expected key and value of rank ",
             query.rank(), " like query ", to_string(query.shape), ", but got key ", to_string(key.shape),
             " and value ", to_string(value.shape), " instead");
  const bool seq_first = batched && !o.batch_first;
  MhaInputs in{as_btc(query, seq_first), as_btc(key, seq_first), as_btc(value, seq_first), batched, seq_first, 0, 0, 0};
  in.B = in.xq.size(0), in.L = in.xq.size(1), in.S = in.xk.size(1);
  ATTN_CHECK(in.xq.size(2) == o.embed_dim, "Expected query ", layout_name(batched, o.batch_first), " with E = ",
             o.embed_dim, ", but got shape ", to_string(query.shape), " instead");
  ATTN_CHECK(in.xk.size(0) == in.B && in.xk.size(2) == o.kdim, "Expected key with N = ", in.B, " and kdim = ", o.kdim,
             " (query ", to_string(query.shape), "), but got shape ", to_string(key.shape), " instead");
  ATTN_CHECK(in.xv.size(0) == in.B && in.xv.size(1) == in.S && in.xv.size(2) == o.vdim, "Expected value with N = ",
             in.B, ", S = ", in.S, " and vdim = ", o.vdim, " (key ", to_string(key.shape), "), but got shape ",
             to_string(value.shape), " instead");
  return in;
}

// The masks as sdpa takes them, and its causal alignment.
struct MhaMasks {
  MaskArg padding, mask;
  Causal causal = Causal::none;
};

// key_padding_mask (N, S); attn_mask (L, S) or (N·H, L, S), whose dim 0 splits into (N, H) by strides.
// Without extra columns they are passed on as views; with them (add_bias_kv, add_zero_attn), as padded
// copies with the causal triangle folded into the attn_mask.
MhaMasks read_masks(const MhaArgs& a, const MhaInputs& in, int64_t H, int64_t extra) {
  const int64_t B = in.B, L = in.L, S = in.S;
  MhaMasks m{{a.key_padding_mask, {}}, {a.attn_mask, {}}, a.is_causal ? Causal::top_left : Causal::none};
  if (m.padding.mask.given()) {
    const Shape want = in.batched ? Shape{B, S} : Shape{S};
    ATTN_CHECK(m.padding.mask.shape() == want, "Expected key_padding_mask of shape ",
               in.batched ? "(N, S) = " : "(S,) = ", to_string(want), ", but got ",
               to_string(m.padding.mask.shape()), " instead");
    if (!in.batched)
      with_view(m.padding.mask, [](auto& v) { v = {v.data, {1, v.shape[0]}, {0, v.strides[0]}}; });  // (1, S)
  }
  if (m.mask.mask.given()) {
    const Shape shape = m.mask.mask.shape();
    const bool ok = shape == Shape{L, S} || shape == Shape{B * H, L, S};
    ATTN_CHECK(ok, "Expected attn_mask of shape (L, S) = ", to_string({L, S}), " or (N·H, L, S) = ",
               to_string({B * H, L, S}), ", but got ", to_string(shape), " instead");
    if (shape.size() == 3)  // (N·H, L, S) -> (N, H, L, S)
      with_view(m.mask.mask, [&](auto& v) {
        v = {v.data, {B, H, L, S}, {H * v.strides[0], v.strides[0], v.strides[1], v.strides[2]}};
      });
  }
  if (extra > 0) {
    if (m.padding.mask.given()) m.padding = pad_mask(m.padding.mask, m.padding.mask.shape(), extra, false);
    if (m.mask.mask.given() || a.is_causal)
      m.mask = pad_mask(m.mask.mask, m.mask.mask.given() ? m.mask.mask.shape() : Shape{L, S}, extra, a.is_causal);
    m.causal = Causal::none;
  }
  return m;
}

// weights (B, H, L, S') -> their mean over the heads (B, L, S').
Tensor head_mean(const Tensor& weights) {
  const int64_t B = weights.size(0), H = weights.size(1), LS = weights.size(2) * weights.size(3);
  Tensor mean({B, weights.size(2), weights.size(3)});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < LS; ++i) mean.data()[b * LS + i] += weights.data()[(b * H + h) * LS + i];
  for (int64_t i = 0; i < mean.numel(); ++i) mean.data()[i] /= float(H);
  return mean;
}

}  // namespace

// ---- Construction and parameters ----

MultiheadAttention::MultiheadAttention(const MhaOptions& options) : o_(options) {
  ATTN_CHECK(o_.embed_dim > 0 && o_.num_heads > 0, "Expected embed_dim and num_heads > 0, but got embed_dim = ",
             o_.embed_dim, " and num_heads = ", o_.num_heads, " instead");
  ATTN_CHECK(o_.embed_dim % o_.num_heads == 0, "Expected embed_dim divisible by num_heads, but got embed_dim = ",
             o_.embed_dim, " and num_heads = ", o_.num_heads, " instead");
  if (o_.num_kv_heads == 0) o_.num_kv_heads = o_.num_heads;
  if (o_.kdim == 0) o_.kdim = o_.embed_dim;
  if (o_.vdim == 0) o_.vdim = o_.embed_dim;
  ATTN_CHECK(o_.num_kv_heads > 0 && o_.num_heads % o_.num_kv_heads == 0,
             "Expected num_heads divisible by num_kv_heads, but got num_heads = ", o_.num_heads,
             " and num_kv_heads = ", o_.num_kv_heads, " instead");
  ATTN_CHECK(o_.kdim > 0 && o_.vdim > 0, "Expected kdim and vdim > 0, but got kdim = ", o_.kdim, " and vdim = ",
             o_.vdim, " instead");
  check_dropout_p("dropout", o_.dropout);

  const int64_t E = o_.embed_dim, KV = o_.num_kv_heads * head_dim();  // KV = Hkv·D
  const bool packed = o_.kdim == E && o_.vdim == E && o_.num_kv_heads == o_.num_heads;
  Rng rng(o_.seed);
  if (packed) {
    in_proj_weight_ = Tensor({3 * E, E});
    init::xavier_uniform(in_proj_weight_, rng);  // one (3E, E) tensor: fan_out 3E, as PyTorch
  } else {
    q_proj_weight_ = Tensor({E, E});
    k_proj_weight_ = Tensor({KV, o_.kdim});
    v_proj_weight_ = Tensor({KV, o_.vdim});
    for (Tensor* w : {&q_proj_weight_, &k_proj_weight_, &v_proj_weight_}) init::xavier_uniform(*w, rng);
  }
  out_proj_weight_ = Tensor({E, E});
  init::linear_weight(out_proj_weight_, rng);  // NonDynamicallyQuantizableLinear's default
  if (o_.bias) {  // zero, as _reset_parameters leaves them
    in_proj_bias_ = Tensor({E + 2 * KV});
    out_proj_bias_ = Tensor({E});
  }
  if (o_.add_bias_kv) {
    bias_k_ = Tensor({1, 1, KV});
    bias_v_ = Tensor({1, 1, KV});
    init::xavier_normal(bias_k_, rng);
    init::xavier_normal(bias_v_, rng);
  }
  dropout_seed_ = rng.next();
  for (Param& p : parameter_list()) *p.grad = Tensor(p.value->shape());
}

void MultiheadAttention::reseed(uint64_t seed) { dropout_seed_ = mix64(seed); }

void MultiheadAttention::parameters(std::vector<Param>& out, const std::string& prefix) {
  auto add = [&](const char* name, Tensor& t, Tensor& g) {  // absent parameters are empty tensors
    if (t.data()) out.push_back({prefix + name, &t, &g});
  };
  add("in_proj_weight", in_proj_weight_, in_proj_weight_grad_);
  add("q_proj_weight", q_proj_weight_, q_proj_weight_grad_);
  add("k_proj_weight", k_proj_weight_, k_proj_weight_grad_);
  add("v_proj_weight", v_proj_weight_, v_proj_weight_grad_);
  add("in_proj_bias", in_proj_bias_, in_proj_bias_grad_);
  add("bias_k", bias_k_, bias_k_grad_);
  add("bias_v", bias_v_, bias_v_grad_);
  add("out_proj.weight", out_proj_weight_, out_proj_weight_grad_);
  add("out_proj.bias", out_proj_bias_, out_proj_bias_grad_);
}

StateDict MultiheadAttention::state_dict() const {
  return attn::state_dict(const_cast<MultiheadAttention*>(this)->parameter_list());  // only reads them
}
void MultiheadAttention::load_state_dict(const StateDict& sd) { attn::load_state_dict(parameter_list(), sd); }
void MultiheadAttention::save(const std::string& path) const { save_safetensors(path, state_dict()); }
void MultiheadAttention::load(const std::string& path) { load_state_dict(load_safetensors(path)); }

// ---- Forward ----

MhaOutput MultiheadAttention::forward(View<const float> query, View<const float> key, View<const float> value,
                                      const MhaArgs& a) {
  // 1. Inputs: PyTorch's (L, N, E), (N, L, E) or unbatched (L, E), read as (B, L, E) views.
  const MhaInputs in = read_inputs(o_, query, key, value);
  const int64_t B = in.B, L = in.L, S = in.S, E = o_.embed_dim, H = o_.num_heads, Hkv = o_.num_kv_heads,
                D = head_dim(), KV = Hkv * D;
  const int64_t extra = int64_t(o_.add_bias_kv) + int64_t(o_.add_zero_attn), S2 = S + extra;  // S2 = S'
  const bool seq_first = in.seq_first;

  // 2. Masks, as sdpa takes them (with the causal triangle folded in where columns are appended).
  MhaMasks masks = read_masks(a, in, H, extra);
  ATTN_CHECK(!extra || !a.variants.given(), "Expected no window, alibi_slopes, softcap, document_ids or rotation ",
             "with add_bias_kv or add_zero_attn (the key they append has no position), but got them together instead");

  // 3. In-projections into buffers in the input's layout. K and V get S' rows: the extra ones are the
  // bias_k / bias_v row, then (add_zero_attn) a zero row, left as the buffer's zero fill.
  const bool packed = in_proj_weight_.data() != nullptr;
  auto weight = [&](int i, const Tensor& separate) {
    return packed ? rows(in_proj_weight_, i * E, E) : separate.view();
  };
  Tensor q_buf = new_buffer(seq_first, B, L, E, true), k_buf = new_buffer(seq_first, B, S2, KV, extra == 0),
         v_buf = new_buffer(seq_first, B, S2, KV, extra == 0);
  View<float> q = btc(q_buf, seq_first);  // (B, L, E)
  View<float> k = btc(k_buf, seq_first);  // (B, S', Hkv·D)
  View<float> v = btc(v_buf, seq_first);  // (B, S', Hkv·D)
  View<float> k_rows = k, v_rows = v;     // (B, S, Hkv·D): the projected rows
  k_rows.shape[1] = v_rows.shape[1] = S;
  project(in.xq, weight(0, q_proj_weight_), rows(in_proj_bias_, 0, E), q);
  project(in.xk, weight(1, k_proj_weight_), rows(in_proj_bias_, E, KV), k_rows);
  project(in.xv, weight(2, v_proj_weight_), rows(in_proj_bias_, E + KV, KV), v_rows);
  if (a.variants.rotate) a.variants.rotate(q, k_rows, 0, false);  // RoPE: positions 0... (extra keys refused below)
  if (o_.add_bias_kv) {
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(&k.at({b, S, 0}), bias_k_.data(), sizeof(float) * size_t(KV));
      std::memcpy(&v.at({b, S, 0}), bias_v_.data(), sizeof(float) * size_t(KV));
    }
  }

  // 4. Attention per head: Q (B, H, L, D), K and V (B, Hkv, S', D), all views of the buffers above;
  // the context is written straight into (B, L, E), which is the concat of the heads.
  SdpaArgs<float> args;
  args.q = split_heads(q, H);
  args.k = split_heads(k, Hkv);
  args.v = split_heads(v, Hkv);
  args.attn_mask = masks.mask.mask;
  args.key_padding = masks.padding.mask;
  args.causal = masks.causal;
  const AttnVariants& var = a.variants;
  args.window = var.window, args.alibi_slopes = var.alibi_slopes, args.softcap = var.softcap;
  args.documents.ids = var.document_ids;
  if (training_ && o_.dropout > 0) {
    args.dropout_p = o_.dropout;
    args.seed = dropout_seed_++;
    args.dropout_batch_offset = dropout_batch_offset_;
  }
  Tensor ctx_buf = new_buffer(seq_first, B, L, E);
  View<float> ctx = btc(ctx_buf, seq_first);             // (B, L, E)
  Tensor weights = a.need_weights ? Tensor({B, H, L, S2}) : Tensor();  // (B, H, L, S')
  Tensor lse = training_ ? Tensor({B, H, L}) : Tensor();              // (B, H, L), for backward
  SdpaOut<float> out{split_heads(ctx, H), a.need_weights ? weights.view() : View<float>{},
                     training_ ? lse.view() : View<float>{}};
  SdpaOptions opt;  // the thread's precision (an Autocast), which the backward then takes too; weights
  if (a.need_weights) opt.precision = Precision::f32;  // keep sdpa fp32 (they must agree with its output)
  {
    profile::Scope p("sdpa kernel");
    sdpa(args, out, opt);
  }

  // 5. Output projection, into PyTorch's layout.
  Tensor output = new_buffer(seq_first, B, L, E, true);
  project(ctx, out_proj_weight_.view(), out_proj_bias_.data() ? out_proj_bias_.view() : View<const float>{},
          btc(output, seq_first));

  // 6. Weights averaged over heads if asked; unbatched results drop N.
  if (a.need_weights && a.average_attn_weights) weights = head_mean(weights);
  if (!in.batched) {
    output.reshape({L, E});
    if (a.need_weights) {
      Shape w = weights.shape();
      weights.reshape(Shape(w.begin() + 1, w.end()));
    }
  }

  // 7. The trace: every shape above, in order, and the backend sdpa ran and why.
  if (a.trace) {
    std::ostream& t = *a.trace;
    t << "MultiheadAttention: E = " << E << ", H = " << H << ", Hkv = " << Hkv << ", D = " << D
      << (in.batched ? (o_.batch_first ? ", batch_first" : ", seq_first") : ", unbatched") << "\n"
      << "Q after projection (B, L, E): " << to_string(q.shape) << "\n"
      << "K after projection (B, S, Hkv·D): " << to_string(k_rows.shape) << "\n"
      << "V after projection (B, S, Hkv·D): " << to_string(v_rows.shape) << "\n";
    if (extra) t << "K, V with add_bias_kv/add_zero_attn (B, S', Hkv·D): " << to_string(k.shape) << "\n";
    t << "Q after head split (B, H, L, D): " << to_string(args.q.shape) << "\n"
      << "K after head split (B, Hkv, S, D): " << to_string(args.k.shape) << "\n"
      << "V after head split (B, Hkv, S, Dv): " << to_string(args.v.shape) << "\n"
      << "scores (B, H, L, S): " << to_string({B, H, L, S2}) << "\n";
    BackendChoice choice = explain(args, out);
    t << "sdpa backend: " << to_string(choice.backend) << " (" << choice.reason << ")\n"
      << "context (B, H, L, Dv): " << to_string(out.out.shape) << "\n"
      << "context after concat (B, L, E): " << to_string(ctx.shape) << "\n"
      << "output " << layout_name(in.batched, o_.batch_first) << ": " << to_string(output.shape()) << "\n";
    if (a.need_weights)
      t << "weights " << (a.average_attn_weights ? "(N, L, S)" : "(N, H, L, S)") << (in.batched ? "" : " without N")
        << ": " << to_string(weights.shape()) << "\n";
  }

  // 8. Training: keep the inputs, buffers, LSE and sdpa's arguments for backward. The buffers move with
  // their bytes, so args' views of them stay valid; the masks are kept as copies the args then view.
  saved_ = Saved{};
  if (training_) {
    Saved& s = saved_;
    s.seq_first = seq_first;
    s.query_shape = query.shape, s.key_shape = key.shape, s.value_shape = value.shape;
    s.xq = owner_ && query.is_contiguous() ? std::move(*owner_) : Tensor::copy_of(query);
    if (!same_view(key, query)) s.xk = Tensor::copy_of(key);
    if (!same_view(value, query)) s.xv = Tensor::copy_of(value);
    s.q = std::move(q_buf), s.k = std::move(k_buf), s.v = std::move(v_buf);
    s.ctx = std::move(ctx_buf), s.lse = std::move(lse), s.precision = opt.precision;
    s.args = args;
    s.args.attn_mask = keep_mask(std::move(masks.mask), s.mask_bias, s.mask_bools);
    s.args.key_padding = keep_mask(std::move(masks.padding), s.padding_bias, s.padding_bools);
    s.rotate = var.rotate;
    if (!var.alibi_slopes.empty()) s.args.alibi_slopes = (s.alibi_slopes = Tensor::copy_of(var.alibi_slopes)).view();
    if (const View<const int64_t>& ids = var.document_ids; !ids.empty()) {
      for (int64_t b = 0; b < ids.size(0); ++b)
        for (int64_t l = 0; l < ids.size(1); ++l)
          s.document_ids.push_back(ids.data[b * ids.strides[0] + l * ids.strides[1]]);
      s.args.documents.ids = View<const int64_t>(s.document_ids.data(), ids.shape);
    }
    s.valid = true;
  }
  return {std::move(output), std::move(weights)};
}

MhaOutput MultiheadAttention::forward_self(Tensor&& x, const MhaArgs& a) {
  owner_ = &x;
  struct Reset {
    Tensor*& p;
    ~Reset() { p = nullptr; }
  } reset{owner_};  // also when forward throws
  return forward(x.view(), x.view(), x.view(), a);
}

// ---- Training: backward ----

MhaGrads MultiheadAttention::backward(View<const float> dout) {
  Saved& s = saved_;
  ATTN_CHECK(s.valid, "Expected a forward in training mode before MultiheadAttention.backward, but got none instead");
  ATTN_CHECK(dout.shape == s.query_shape, "Expected dout of the output's shape ", to_string(s.query_shape),
             " in MultiheadAttention.backward, but got ", to_string(dout.shape), " instead");
  const bool sf = s.seq_first;
  const View<const float> xq = as_btc(s.xq.view(), sf);                             // (B, L, E)
  const View<const float> xk = s.xk.data() ? as_btc(s.xk.view(), sf) : xq;          // (B, S, kdim)
  const View<const float> xv = s.xv.data() ? as_btc(s.xv.view(), sf) : xq;          // (B, S, vdim)
  const int64_t B = xq.size(0), L = xq.size(1), S = xk.size(1), E = o_.embed_dim, H = o_.num_heads,
                Hkv = o_.num_kv_heads, KV = Hkv * head_dim();
  const int64_t S2 = S + int64_t(o_.add_bias_kv) + int64_t(o_.add_zero_attn);  // S'
  Tensor dy_buf = dout.is_contiguous() ? Tensor() : Tensor::copy_of(dout);  // read in place when contiguous
  const View<const float> dy = as_btc(dy_buf.data() ? dy_buf.view() : dout, sf);  // (B, L, E)

  // 1. Output projection: dctx = dy · W_out, dW_out += dyᵀ · ctx, db_out += Σ dy.
  Tensor dctx_buf = new_buffer(sf, B, L, E, true);
  View<float> dctx = btc(dctx_buf, sf);  // (B, L, E)
  project_backward(btc(s.ctx, sf), out_proj_weight_.view(), dy, dctx, out_proj_weight_grad_.view(),
                   grad_rows(out_proj_bias_grad_, 0, E));

  // 2. Attention: the forward's arguments; sdpa_backward recomputes the weights from the LSE.
  const SdpaArgs<float>& args = s.args;
  Tensor dq_buf = new_buffer(sf, B, L, E), dk_buf = new_buffer(sf, B, S2, KV), dv_buf = new_buffer(sf, B, S2, KV);
  View<float> dq = btc(dq_buf, sf), dk = btc(dk_buf, sf), dv = btc(dv_buf, sf);  // (B, L, E), (B, S', Hkv·D) ×2
  {
    profile::Scope p("sdpa kernel");
    SdpaOptions opt;
    opt.precision = s.precision;  // the forward's, whatever the thread's is now
    sdpa_backward<float>(args, split_heads(btc(s.ctx, sf), H), s.lse.view(), split_heads<const float>(dctx, H),
                         {split_heads(dq, H), split_heads(dk, Hkv), split_heads(dv, Hkv)}, opt);
  }
  if (s.rotate) s.rotate(dq, dk, 0, true);  // the gradients of the rotated Q and K, back before the rotation

  // 3. In-projections over the S projected rows of dK, dV; row S (bias_k / bias_v) sums over the batch,
  // the add_zero_attn row has no parameter.
  const bool packed = in_proj_weight_.data() != nullptr;
  auto weight = [&](int i, const Tensor& separate) {
    return packed ? rows(in_proj_weight_, i * E, E) : separate.view();
  };
  auto weight_grad = [&](int i, Tensor& separate) {
    return packed ? grad_rows(in_proj_weight_grad_, i * E, E) : separate.view();
  };
  MhaGrads g{Tensor::uninitialized(s.query_shape), Tensor::uninitialized(s.key_shape),
             Tensor::uninitialized(s.value_shape)};  // every row written by project_backward's beta = 0 gemm
  View<float> dk_rows = dk, dv_rows = dv;  // (B, S, Hkv·D)
  dk_rows.shape[1] = dv_rows.shape[1] = S;
  project_backward(xq, weight(0, q_proj_weight_), dq, as_btc(g.dquery.view(), sf), weight_grad(0, q_proj_weight_grad_),
                   grad_rows(in_proj_bias_grad_, 0, E));
  project_backward(xk, weight(1, k_proj_weight_), dk_rows, as_btc(g.dkey.view(), sf),
                   weight_grad(1, k_proj_weight_grad_), grad_rows(in_proj_bias_grad_, E, KV));
  project_backward(xv, weight(2, v_proj_weight_), dv_rows, as_btc(g.dvalue.view(), sf),
                   weight_grad(2, v_proj_weight_grad_), grad_rows(in_proj_bias_grad_, E + KV, KV));
  if (o_.add_bias_kv)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < KV; ++e) {
        bias_k_grad_.data()[e] += dk.at({b, S, e});
        bias_v_grad_.data()[e] += dv.at({b, S, e});
      }
  return g;
}

// ---- Incremental decoding ----

Tensor MultiheadAttention::forward_cached(View<const float> x, KVCache& cache, int64_t layer,
                                         const AttnVariants& variants) {
  ATTN_CHECK(!training_, "Expected eval mode for MultiheadAttention.forward_cached, but got training mode instead");
  ATTN_CHECK(!o_.add_bias_kv && !o_.add_zero_attn && o_.kdim == o_.embed_dim && o_.vdim == o_.embed_dim,
             "Expected self-attention without add_bias_kv / add_zero_attn for forward_cached, but got add_bias_kv = ",
             o_.add_bias_kv, ", add_zero_attn = ", o_.add_zero_attn, ", kdim = ", o_.kdim, ", vdim = ", o_.vdim,
             " instead");
  const bool batched = x.rank() == 3;
  ATTN_CHECK(x.rank() == 2 || batched, "Expected x of rank 3 ", layout_name(true, o_.batch_first),
             " or rank 2 (L, E), but got shape ", to_string(x.shape), " instead");
  const bool sf = batched && !o_.batch_first;
  const View<const float> xq = as_btc(x, sf);  // (B, T, E)
  const int64_t B = xq.size(0), T = xq.size(1), E = o_.embed_dim, H = o_.num_heads, Hkv = o_.num_kv_heads,
                D = head_dim(), KV = Hkv * D;
  ATTN_CHECK(xq.size(2) == E, "Expected x ", layout_name(batched, o_.batch_first), " with E = ", E, ", but got shape ",
             to_string(x.shape), " instead");
  ATTN_CHECK(cache.window(layer) == 0, "Expected a KVCache layer that keeps every token for ",
             "MultiheadAttention.forward_cached (it has no sliding window), but got layer ", layer,
             " keeping the last ", cache.window(layer), " instead");
  const int64_t cached_b = cache.dtype() == KvDtype::f32 ? cache.keys(layer).size(0) : cache.half(layer).k.shape[0];
  ATTN_CHECK(cached_b == B && cache.heads() == Hkv && cache.head_dim() == D,
             "Expected a KVCache of (B, Hkv, S_max, D) = ", to_string({B, Hkv, cache.capacity(), D}), ", but got ",
             to_string({cached_b, cache.heads(), cache.capacity(), cache.head_dim()}), " instead");
  // 1. Project the new tokens; their K and V join the cache.
  const bool packed = in_proj_weight_.data() != nullptr;
  auto weight = [&](int i, const Tensor& separate) {
    return packed ? rows(in_proj_weight_, i * E, E) : separate.view();
  };
  Tensor q_buf = new_buffer(sf, B, T, E), k_buf = new_buffer(sf, B, T, KV), v_buf = new_buffer(sf, B, T, KV);
  View<float> q = btc(q_buf, sf), k = btc(k_buf, sf), v = btc(v_buf, sf);  // (B, T, E), (B, T, Hkv·D) ×2
  project(xq, weight(0, q_proj_weight_), rows(in_proj_bias_, 0, E), q);
  project(xq, weight(1, k_proj_weight_), rows(in_proj_bias_, E, KV), k);
  project(xq, weight(2, v_proj_weight_), rows(in_proj_bias_, E + KV, KV), v);
  if (variants.rotate) variants.rotate(q, k, cache.length(layer), false);  // at their positions, before caching
  cache.append(layer, split_heads<const float>(k, Hkv), split_heads<const float>(v, Hkv));
  // 2. The T queries against all S cached keys, bottom-right causal: query t sees keys s <= S - T + t.
  //    A 16-bit cache goes to the half-precision decode kernel, an fp32 one to sdpa's flash kernel.
  SdpaArgs<float> args;
  args.q = split_heads(q, H);
  args.causal = Causal::bottom_right;
  args.window = variants.window, args.alibi_slopes = variants.alibi_slopes, args.softcap = variants.softcap;
  Tensor ctx_buf = new_buffer(sf, B, T, E);
  View<float> ctx = btc(ctx_buf, sf);  // (B, T, E)
  if (cache.dtype() == KvDtype::f32) {
    args.k = cache.keys(layer);    // (B, Hkv, S, D)
    args.v = cache.values(layer);  // (B, Hkv, S, D)
    sdpa(args, SdpaOut<float>{split_heads(ctx, H), {}, {}});
  } else {
    sdpa(args, cache.half(layer), SdpaOut<float>{split_heads(ctx, H), {}, {}});
  }
  // 3. Output projection, in x's layout.
  Tensor output = new_buffer(sf, B, T, E);
  project(ctx, out_proj_weight_.view(), out_proj_bias_.data() ? out_proj_bias_.view() : View<const float>{},
          btc(output, sf));
  if (!batched) output.reshape({T, E});
  return output;
}

}  // namespace attn
