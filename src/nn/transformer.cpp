// torch.nn.TransformerEncoderLayer and TransformerDecoderLayer: the order of sublayers, residuals and
// norms (post-LN or pre-LN), forward and backward. Each sublayer saves its own activations, so these
// layers only wire them together; the backward is the forward read bottom-up, a residual passing its
// gradient to both sides. No attention or matrix math here.
#include "attn/nn.h"
#include "attn/profile.h"

namespace attn {
namespace {

// The layers' random streams by name: child seeds are mix64(options.seed ^ k). Values as first released
// (renumbering changes every initialisation and dropout mask).
namespace streams {
constexpr uint64_t kEncSelfAttn = 11, kEncFeedForward = 12, kEncDropout1 = 13, kEncDropout2 = 14;
constexpr uint64_t kDecSelfAttn = 21, kDecCrossAttn = 22, kDecFeedForward = 23;
constexpr uint64_t kDecDropout1 = 24, kDecDropout2 = 25, kDecDropout3 = 26;
// reseed(seed): child streams seed ^ k. The encoder's are the GPT's since its first checkpoints; all are
// below 16, so a parent may give its layer i the seed seed ^ (16·i) (Gpt::children).
constexpr uint64_t kReseedDropout1 = 2, kReseedDropout2 = 3, kReseedFeedForward = 4, kReseedSelfAttn = 5;
constexpr uint64_t kReseedCrossAttn = 6, kReseedDropout3 = 7;
}  // namespace streams

MhaOptions attention_options(const TransformerOptions& o, uint64_t seed) {
  MhaOptions m;
  m.embed_dim = o.d_model;
  m.num_heads = o.nhead;
  m.dropout = o.dropout;
  m.bias = o.bias;
  m.batch_first = o.batch_first;
  m.num_kv_heads = o.num_kv_heads;
  m.seed = seed;
  return m;
}

MhaArgs attend_args(const Mask<float>& mask, const Mask<float>& padding, bool causal, const AttnVariants& v = {}) {
  MhaArgs a;
  a.key_padding_mask = padding;
  a.need_weights = false;
  a.attn_mask = mask;
  a.is_causal = causal;
  a.variants = v;
  return a;
}

Tensor attend(MultiheadAttention& mha, View<const float> q, View<const float> kv, const Mask<float>& mask,
              const Mask<float>& padding, bool causal, const AttnVariants& v = {}) {
  return std::move(mha.forward(q, kv, kv, attend_args(mask, padding, causal, v)).output);
}

// Self-attention on a temporary x (a norm's output), which the attention keeps instead of a copy.
Tensor attend_self(MultiheadAttention& mha, Tensor&& x, const Mask<float>& mask, const Mask<float>& padding,
                   bool causal, const AttnVariants& v) {
  return std::move(mha.forward_self(std::move(x), attend_args(mask, padding, causal, v)).output);
}

// x + y, the residual connection, written over the branch's output y (no copy of x). Float addition
// commutes exactly, so y + x has the bits of x + y.
Tensor plus(View<const float> x, Tensor&& y) {
  add_(y.view(), x);
  return std::move(y);
}

// The gradient through a branch's dropout: g itself where the dropout is the identity (p = 0: no copy),
// else the masked gradient, kept in `storage`.
View<const float> through(Dropout& d, const Tensor& g, Tensor& storage) {
  if (d.p == 0) return g.view();
  storage = d.backward(g.view());
  return storage.view();
}

// Self-attention gets one input three times: its gradient is the sum of the three.
Tensor sum3(MhaGrads g) {
  add_(g.dquery.view(), g.dkey.view());
  add_(g.dquery.view(), g.dvalue.view());
  return std::move(g.dquery);
}

// The gradient of a residual x + f(x) is g + f'ᵀ(g): adds the branch's gradient into g.
void accumulate(Tensor& g, const Tensor& branch) { add_(g.view(), branch.view()); }

}  // namespace

// ---- Encoder ----

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerOptions& o)
    : options(o),
      self_attn(attention_options(o, mix64(o.seed ^ streams::kEncSelfAttn))),
      ff(o.d_model, o.dim_feedforward, o.activation, o.dropout, o.bias, mix64(o.seed ^ streams::kEncFeedForward)),
      norm1(o.d_model, o.layer_norm_eps, true, o.bias),
      norm2(o.d_model, o.layer_norm_eps, true, o.bias),
      dropout1(o.dropout, mix64(o.seed ^ streams::kEncDropout1)),
      dropout2(o.dropout, mix64(o.seed ^ streams::kEncDropout2)) {}

std::vector<Child> TransformerEncoderLayer::children() {
  using namespace streams;
  return {{"self_attn.", &self_attn, kReseedSelfAttn}, {"", &ff, kReseedFeedForward}, {"norm1.", &norm1},
          {"norm2.", &norm2}, {"dropout1.", &dropout1, kReseedDropout1}, {"dropout2.", &dropout2, kReseedDropout2}};
}

Tensor TransformerEncoderLayer::forward(View<const float> src, const EncoderArgs& a) {
  auto sa = [&](View<const float> x) {  // dropout1(self_attn(x, x, x))
    return dropout1.apply(attend(self_attn, x, x, a.src_mask, a.src_key_padding_mask, a.is_causal, a.variants));
  };
  auto ffb = [&](View<const float> x) { return dropout2.apply(ff.forward(x)); };
  if (options.norm_first) {  // x = x + sa(norm1(x)); x = x + ff(norm2(x))
    Tensor x1;
    {
      profile::Scope p("attention");
      // dropout1(self_attn(norm1(src))), the norm's output handed to the attention to keep
      x1 = dropout1.apply(
          attend_self(self_attn, norm1.forward(src), a.src_mask, a.src_key_padding_mask, a.is_causal, a.variants));
    }
    profile::Scope p("mlp");
    Tensor h = norm2.forward_add(x1, src);  // x1 += src (the residual), then norm2(x1), in one pass
    return plus(x1.view(), ffb(h.view()));
  }
  // x = norm1(x + sa(x)); x = norm2(x + ff(x))
  Tensor x1 = norm1.forward(plus(src, sa(src)).view());
  return norm2.forward(plus(x1.view(), ffb(x1.view())).view());
}

Tensor TransformerEncoderLayer::backward(View<const float> dout) { return run_backward(dout, nullptr); }
Tensor TransformerEncoderLayer::backward(Tensor&& dout) { return run_backward(dout.view(), &dout); }

// owner: the tensor dout views, whose buffer pre-LN may take as the residual stream's gradient.
Tensor TransformerEncoderLayer::run_backward(View<const float> dout, Tensor* owner) {
  auto sa = [&](const Tensor& g) {
    Tensor t;
    return sum3(self_attn.backward(through(dropout1, g, t)));
  };
  auto ffb = [&](const Tensor& g) {
    Tensor t;
    return ff.backward(through(dropout2, g, t));
  };
  if (options.norm_first) {
    Tensor g1 = owner ? std::move(*owner) : Tensor::copy_of(dout);  // d x1, accumulated in place
    {
      profile::Scope p("mlp");
      norm2.backward_add(ffb(g1).view(), g1);  // g1 += norm2'ᵀ(...), the residual's sum fused in
    }
    profile::Scope p("attention");
    norm1.backward_add(sa(g1).view(), g1);  // d src
    return g1;
  }
  Tensor g = norm2.backward(dout);  // d (x1 + ff(x1))
  accumulate(g, ffb(g));
  g = norm1.backward(g.view());     // d (src + sa(src))
  accumulate(g, sa(g));
  return g;
}

Tensor TransformerEncoderLayer::forward_cached(View<const float> x, KVCache& cache, int64_t layer,
                                               const AttnVariants& variants) {
  ATTN_CHECK(!training_, "Expected eval mode for forward_cached (incremental decoding), but got training mode "
             "instead");
  if (options.norm_first) {
    Tensor x1 = plus(x, self_attn.forward_cached(norm1.forward(x).view(), cache, layer, variants));
    return plus(x1.view(), ff.forward(norm2.forward(x1.view()).view()));
  }
  Tensor x1 = norm1.forward(plus(x, self_attn.forward_cached(x, cache, layer, variants)).view());
  return norm2.forward(plus(x1.view(), ff.forward(x1.view())).view());
}

Tensor TransformerEncoderLayer::attention_weights(View<const float> src, const EncoderArgs& a) {
  ATTN_CHECK(!training_, "Expected eval mode for attention_weights, but got training mode instead");
  MhaArgs m = attend_args(a.src_mask, a.src_key_padding_mask, a.is_causal, a.variants);
  m.need_weights = true;
  m.average_attn_weights = false;
  if (!options.norm_first) return std::move(self_attn.forward(src, src, src, m).weights);
  Tensor n = norm1.forward(src);
  return std::move(self_attn.forward(n.view(), n.view(), n.view(), m).weights);
}

// ---- Decoder ----

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerOptions& o)
    : options(o),
      self_attn(attention_options(o, mix64(o.seed ^ streams::kDecSelfAttn))),
      multihead_attn(attention_options(o, mix64(o.seed ^ streams::kDecCrossAttn))),
      ff(o.d_model, o.dim_feedforward, o.activation, o.dropout, o.bias, mix64(o.seed ^ streams::kDecFeedForward)),
      norm1(o.d_model, o.layer_norm_eps, true, o.bias),
      norm2(o.d_model, o.layer_norm_eps, true, o.bias),
      norm3(o.d_model, o.layer_norm_eps, true, o.bias),
      dropout1(o.dropout, mix64(o.seed ^ streams::kDecDropout1)),
      dropout2(o.dropout, mix64(o.seed ^ streams::kDecDropout2)),
      dropout3(o.dropout, mix64(o.seed ^ streams::kDecDropout3)) {}

std::vector<Child> TransformerDecoderLayer::children() {
  using namespace streams;
  return {{"self_attn.", &self_attn, kReseedSelfAttn}, {"multihead_attn.", &multihead_attn, kReseedCrossAttn},
          {"", &ff, kReseedFeedForward}, {"norm1.", &norm1}, {"norm2.", &norm2}, {"norm3.", &norm3},
          {"dropout1.", &dropout1, kReseedDropout1}, {"dropout2.", &dropout2, kReseedDropout2},
          {"dropout3.", &dropout3, kReseedDropout3}};
}

Tensor TransformerDecoderLayer::forward(View<const float> tgt, View<const float> memory, const DecoderArgs& a) {
  auto sa = [&](View<const float> x) {
    return dropout1.apply(attend(self_attn, x, x, a.tgt_mask, a.tgt_key_padding_mask, a.tgt_is_causal));
  };
  auto mha = [&](View<const float> x) {
    return dropout2.apply(
        attend(multihead_attn, x, memory, a.memory_mask, a.memory_key_padding_mask, a.memory_is_causal));
  };
  auto ffb = [&](View<const float> x) { return dropout3.apply(ff.forward(x)); };
  if (options.norm_first) {  // x += sa(norm1(x)); x += mha(norm2(x), memory); x += ff(norm3(x))
    Tensor x1 = sa(norm1.forward(tgt).view());
    Tensor n2 = norm2.forward_add(x1, tgt);  // x1 += tgt, then norm2(x1)
    Tensor x2 = mha(n2.view());
    Tensor n3 = norm3.forward_add(x2, x1.view());  // x2 += x1, then norm3(x2)
    return plus(x2.view(), ffb(n3.view()));
  }
  // x = norm1(x + sa(x)); x = norm2(x + mha(x, memory)); x = norm3(x + ff(x))
  Tensor x1 = norm1.forward(plus(tgt, sa(tgt)).view());
  Tensor x2 = norm2.forward(plus(x1.view(), mha(x1.view())).view());
  return norm3.forward(plus(x2.view(), ffb(x2.view())).view());
}

DecoderGrads TransformerDecoderLayer::backward(View<const float> dout) {
  auto sa = [&](const Tensor& g) {
    Tensor t;
    return sum3(self_attn.backward(through(dropout1, g, t)));
  };
  Tensor dmemory;
  auto mha = [&](const Tensor& g) {  // d query; d key + d value go to memory
    Tensor t;
    MhaGrads m = multihead_attn.backward(through(dropout2, g, t));
    add_(m.dkey.view(), m.dvalue.view());
    dmemory = std::move(m.dkey);
    return std::move(m.dquery);
  };
  auto ffb = [&](const Tensor& g) {
    Tensor t;
    return ff.backward(through(dropout3, g, t));
  };
  if (options.norm_first) {
    Tensor g = Tensor::copy_of(dout);  // d x2
    norm3.backward_add(ffb(g).view(), g);
    norm2.backward_add(mha(g).view(), g);  // d x1
    norm1.backward_add(sa(g).view(), g);   // d tgt
    return {std::move(g), std::move(dmemory)};
  }
  Tensor g = norm3.backward(dout);  // d (x2 + ff(x2))
  accumulate(g, ffb(g));
  g = norm2.backward(g.view());     // d (x1 + mha(x1))
  accumulate(g, mha(g));
  g = norm1.backward(g.view());     // d (tgt + sa(tgt))
  accumulate(g, sa(g));
  return {std::move(g), std::move(dmemory)};
}

}  // namespace attn
