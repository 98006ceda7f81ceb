// The GPT model: embeddings, a stack of nn.h's pre-norm TransformerEncoderLayers, the final LayerNorm and
// the (tied) head; cross-entropy; sampling through the KV cache. No layer math here beyond the head's
// matmul and the loss: each block's forward/backward is nn's.
#include "attn/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "attn/check.h"
#include "attn/gemm.h"
#include "attn/memstat.h"
#include "attn/profile.h"
#include "attn/rng.h"
#include "attn/threads.h"

namespace attn {
namespace {

TransformerOptions block_options(const GptConfig& c, uint64_t seed) {
  TransformerOptions o;
  o.d_model = c.n_embd;
  o.nhead = c.n_head;
  o.dim_feedforward = 4 * c.n_embd;
  o.dropout = c.dropout;
  o.activation = Activation::gelu;
  o.layer_norm_eps = 1e-5;
  o.batch_first = true;
  o.norm_first = true;
  o.bias = c.bias;
  o.num_kv_heads = c.n_kv_head;
  o.seed = seed;
  return o;
}

// The model's random streams by name. The constructor derives each from the model seed as
// mix64(seed ^ k), reseed() each dropout stream from the step's seed as seed ^ k. The values are the ones
// every checkpoint and golden run was made with: renaming is free, renumbering changes every stream.
namespace streams {
constexpr uint64_t kWte = 1, kWpe = 2, kEmbedDropout = 3, kLmHead = 4, kInit = 5, kFirstReseed = 6;
constexpr uint64_t kBlock0 = 100;  // block i's TransformerOptions::seed: kBlock0 + i
// reseed(seed): the embedding dropout seed ^ 1; block i seed ^ (kPerBlock·i), whose streams are that ^ k
// for k in 2...5 (TransformerEncoderLayer's, each below kPerBlock: as seed ^ (kPerBlock·i + k) before)
constexpr uint64_t kReseedEmbedDropout = 1, kPerBlock = 16;
}  // namespace streams

}  // namespace

GptConfig check_gpt_config(GptConfig c) {
  ATTN_CHECK(c.vocab_size > 0, "Expected vocab_size > 0, but got ", c.vocab_size, " instead");
  ATTN_CHECK(c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
             "Expected block_size, n_layer, n_head, n_embd > 0, but got ", c.block_size, ", ", c.n_layer, ", ",
             c.n_head, ", ", c.n_embd, " instead");
  ATTN_CHECK(c.n_embd % c.n_head == 0, "Expected n_embd divisible by n_head, but got n_embd ", c.n_embd,
             " and n_head ", c.n_head, " instead");
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
  ATTN_CHECK(c.n_kv_head > 0 && c.n_head % c.n_kv_head == 0, "Expected n_kv_head dividing n_head ", c.n_head,
             ", but got ", c.n_kv_head, " instead");
  check_dropout_p("dropout", c.dropout);
  ATTN_CHECK(c.position == "learned" || c.position == "rope" || c.position == "alibi",
             "Expected position \"learned\", \"rope\" or \"alibi\", but got \"", c.position, "\" instead");
  ATTN_CHECK(c.position != "rope" || (c.n_embd / c.n_head) % 2 == 0, "Expected an even head dim n_embd / n_head for ",
             "position \"rope\", but got ", c.n_embd / c.n_head, " instead");
  ATTN_CHECK(c.window >= 0, "Expected window >= 0 (0: none), but got ", c.window, " instead");
  // Before any allocation (n_layer 1e8 failed in h.reserve with std::bad_alloc): the parameters and
  // their gradients must fit.
  check_fits_in_memory(8 * gpt_parameter_estimate(c),
                       cat("a model of vocab_size ", c.vocab_size, ", block_size ", c.block_size, ", n_layer ",
                           c.n_layer, ", n_embd ", c.n_embd, " (", gpt_parameter_estimate(c),
                           " parameters and their gradients)"));
  return c;
}

namespace {

// The profile's name of block i ("block 0"), interned once.
const char* block_name(size_t i) { return profile::part_name(cat("block ", i)); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// (B, T, E) -> (T, E): sum over the batch, the position embedding's gradient.
Tensor sum_batch(View<const float> x) {
  const int64_t B = x.size(0), T = x.size(1), E = x.size(2);
  Tensor s({T, E});
  for (int64_t b = 0; b < B; ++b) {
    const float* src = x.data + b * T * E;
    for (int64_t i = 0; i < T * E; ++i) s.data()[i] += src[i];
  }
  return s;
}

}  // namespace

GptConfig gpt_config(const std::string& name) {
  GptConfig c;
  if (name == "tiny") {
    c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.block_size = 64;
  } else if (name == "nanogpt-cpu") {
    c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.block_size = 64, c.bias = false;
  } else if (name == "gpt2-small") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.block_size = 1024;
  } else {
    ATTN_CHECK(false, "Expected a model configuration tiny, nanogpt-cpu or gpt2-small, but got '", name, "' instead");
  }
  return c;
}

std::vector<std::string> gpt_config_names() { return {"tiny", "nanogpt-cpu", "gpt2-small"}; }

float cross_entropy(View<const float> logits, const int64_t* targets, View<float> dlogits) {
  ATTN_CHECK(logits.rank() == 2 && logits.stride(1) == 1, "Expected logits (N, V) with unit column stride, but got ",
             to_string(logits.shape), " instead");
  const int64_t count = scored_tokens(targets, logits.size(0));
  const double total = cross_entropy_sum(logits, targets, dlogits, count);
  return count == 0 ? 0.0f : float(total / double(count));
}

int64_t scored_tokens(const int64_t* targets, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += targets[i] >= 0;
  return count;
}

double cross_entropy_sum(View<const float> logits, const int64_t* targets, View<float> dlogits, int64_t denominator) {
  ATTN_CHECK(logits.rank() == 2 && logits.stride(1) == 1, "Expected logits (N, V) with unit column stride, but got ",
             to_string(logits.shape), " instead");
  const int64_t N = logits.size(0), V = logits.size(1);
  ATTN_CHECK(dlogits.empty() || (dlogits.shape == logits.shape && dlogits.stride(1) == 1),
             "Expected dlogits of shape ", to_string(logits.shape), ", but got ", to_string(dlogits.shape), " instead");
  for (int64_t n = 0; n < N; ++n)
    ATTN_CHECK(targets[n] >= -1 && targets[n] < V, "Expected targets in [0, ", V, ") or -1 (ignored), but got ",
               targets[n], " at position ", n, " instead");
  // rows of a larger batch: the whole batch's mean
  const int64_t count = denominator > 0 ? denominator : scored_tokens(targets, N);
  if (count == 0) {
    for (int64_t n = 0; n < N && !dlogits.empty(); ++n) std::fill_n(dlogits.data + n * dlogits.stride(0), V, 0.0f);
    return 0;
  }
  const float inv = 1.0f / float(count);
  std::vector<double> row_loss(size_t(N), 0.0);  // summed in order below: the same loss for any thread count
  parallel_for(N, grain_for(3 * V), [&](int64_t n0, int64_t n1, int) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* x = logits.data + n * logits.stride(0);
      float* d = dlogits.empty() ? nullptr : dlogits.data + n * dlogits.stride(0);  // may alias x
      if (targets[n] < 0) {
        if (d) std::fill_n(d, V, 0.0f);
        continue;
      }
      // loss = logsumexp(x) - x[t], with the max subtracted so exp never overflows
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(x[v] - m));
      row_loss[size_t(n)] = double(m) + std::log(sum) - double(x[targets[n]]);
      if (d) {  // d = (softmax(x) - onehot(t)) / count
        const float scale = float(1.0 / sum) * inv;
        for (int64_t v = 0; v < V; ++v) d[v] = std::exp(x[v] - m) * scale;
        d[targets[n]] -= inv;
      }
    }
  });
  double total = 0;
  for (double l : row_loss) total += l;
  return total;
}

double gpt_parameter_estimate(const GptConfig& c) {
  const double E = double(c.n_embd), H = double(c.n_head), Hkv = double(c.n_kv_head ? c.n_kv_head : c.n_head);
  const double kv = H > 0 ? E * Hkv / H : E;
  const double per_layer = E * (E + 2 * kv) + E * E + 8 * E * E + (E + 2 * kv) + 13 * E;  // attention, MLP, 2 LN
  return double(c.vocab_size) * E * (c.tie_weights ? 1 : 2) + (c.position == "learned" ? double(c.block_size) * E : 0) +
         double(c.n_layer) * per_layer + 2 * E;
}

double gpt_training_bytes_estimate(const GptConfig& c, double B, double T) {
  const double activations = B * T * (double(c.n_layer) * 20 * double(c.n_embd) + 2 * double(c.vocab_size));
  return 4 * (4 * gpt_parameter_estimate(c) + activations) + 16 * B * T;  // floats, and the int64 x, y
}

// ---- Gpt ----

Gpt::Gpt(const GptConfig& config, uint64_t seed)
    : wte(check_gpt_config(config).vocab_size, config.n_embd, mix64(seed ^ streams::kWte)),
      wpe(config.position == "learned" ? config.block_size : 1, config.n_embd, mix64(seed ^ streams::kWpe)),
      drop(config.dropout, mix64(seed ^ streams::kEmbedDropout)),
      ln_f(config.n_embd, 1e-5, true, config.bias),
      lm_head(config.tie_weights ? 1 : config.n_embd, config.tie_weights ? 1 : config.vocab_size, false,
              mix64(seed ^ streams::kLmHead)),
      c_(check_gpt_config(config)) {
  h.reserve(size_t(c_.n_layer));
  for (int64_t i = 0; i < c_.n_layer; ++i)
    h.emplace_back(block_options(c_, mix64(seed ^ (streams::kBlock0 + uint64_t(i)))));
  // nanoGPT's _init_weights and its scaled init of c_proj (our out_proj and linear2).
  Rng rng(mix64(seed ^ streams::kInit));
  const double std_resid = 0.02 / std::sqrt(2.0 * double(c_.n_layer));
  for (const Param& p : parameter_list()) {
    if (p.value->shape().size() >= 2) {
      const bool resid = ends_with(p.name, "out_proj.weight") || ends_with(p.name, "linear2.weight");
      init::normal(*p.value, 0.0, resid ? std_resid : 0.02, rng);
    } else if (!ends_with(p.name, "weight")) {  // biases (LayerNorm weights stay 1)
      std::fill_n(p.value->data(), p.value->numel(), 0.0f);
    }
  }
  reseed(mix64(seed ^ streams::kFirstReseed));
  if (c_.position == "alibi") alibi_slopes_ = alibi_slopes(c_.n_head);
  if (c_.position == "rope") rope_ = std::make_unique<Rope>(c_.n_embd / c_.n_head, 10000.0, c_.block_size);
}

Tensor alibi_slopes(int64_t H) {
  // BLOOM's build_alibi_tensor: for the largest power of two n <= H, slopes base^1..n with base =
  // 2^(-8/n); the heads beyond n take every other slope of 2n heads' (base' = 2^(-4/n))
  int64_t n = 1;
  while (2 * n <= H) n *= 2;
  Tensor s({H});
  for (int64_t h = 0; h < n; ++h) s.data()[h] = float(std::pow(2.0, -8.0 / double(n) * double(h + 1)));
  for (int64_t h = n; h < H; ++h) s.data()[h] = float(std::pow(2.0, -4.0 / double(n) * double(2 * (h - n) + 1)));
  return s;
}

void Gpt::rotate(View<float> x, int64_t heads, int64_t first, bool inverse) {
  const int64_t B = x.size(0), T = x.size(1);
  if (first + T > rope_->max_positions())  // a longer sequence than any before: a larger table
    rope_ = std::make_unique<Rope>(rope_->head_dim(), 10000.0, std::max(first + T, 2 * rope_->max_positions()));
  std::vector<int64_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), first);
  for (int64_t b = 0; b < B; ++b) rope_->apply(x.data + b * x.strides[0], T, x.strides[1], heads, pos.data(), inverse);
}

AttnVariants Gpt::variants() {
  AttnVariants v;
  if (c_.window > 0) v.window = {c_.window, 0};
  if (alibi_slopes_.data()) v.alibi_slopes = alibi_slopes_.view();
  if (rope_)
    v.rotate = [this](View<float> q, View<float> k, int64_t first, bool inverse) {
      rotate(q, c_.n_head, first, inverse);
      rotate(k, c_.n_kv_head, first, inverse);
    };
  return v;
}

std::vector<Child> Gpt::children() {
  using namespace streams;
  std::vector<Child> c = {{"transformer.wte.", &wte}};
  if (c_.position == "learned") c.push_back({"transformer.wpe.", &wpe});
  c.push_back({"transformer.drop.", &drop, kReseedEmbedDropout});
  for (size_t i = 0; i < h.size(); ++i) c.push_back({cat("transformer.h.", i, "."), &h[i], kPerBlock * i});
  c.push_back({"transformer.ln_f.", &ln_f});
  if (!c_.tie_weights) c.push_back({"lm_head.", &lm_head});
  return c;
}

void Gpt::train(bool on) {
  Layer::train(on);
  if (!on) y_ = Tensor();
}

int64_t Gpt::num_parameters() {
  int64_t n = 0;
  for (const Param& p : parameter_list()) n += p.value->numel();
  return n;
}

Tensor Gpt::embed(const int64_t* idx, int64_t B, int64_t T, int64_t pos0) {
  ATTN_CHECK(B > 0 && T > 0, "Expected idx (B, T) with B, T > 0, but got (", B, ", ", T, ") instead");
  const bool learned = c_.position == "learned";
  ATTN_CHECK(!learned || pos0 + T <= c_.block_size, "Expected at most block_size = ", c_.block_size,
             " positions (learned position embeddings; rope or alibi have no such limit), but got ", pos0 + T,
             " instead");
  Tensor x = wte.forward(idx, {B, T});  // (B, T, E)
  if (learned) {
    std::vector<int64_t> pos(static_cast<size_t>(T));
    std::iota(pos.begin(), pos.end(), pos0);
    Tensor p = wpe.forward(pos.data(), {T});  // (T, E)
    for (int64_t b = 0; b < B; ++b) add_(x.view().select(0, b), p.view());
  }
  if (c_.dropout > 0) x = drop.forward(x.view());
  return x;
}

Tensor Gpt::forward(const int64_t* idx, int64_t B, int64_t T) {
  profile::Scope part("forward");
  Tensor x;
  {
    profile::Scope p("embed");
    x = embed(idx, B, T, 0);
  }
  EncoderArgs args;
  args.is_causal = true;
  args.variants = variants();
  for (size_t i = 0; i < h.size(); ++i) {
    profile::Scope p(block_name(i));
    x = h[i].forward(x.view(), args);
  }
  const int64_t V = c_.vocab_size, E = c_.n_embd;
  Tensor y;
  {
    profile::Scope p("ln_f");
    y = ln_f.forward(x.view());  // (B, T, E)
  }
  profile::Scope p("lm_head");
  Tensor logits = Tensor::uninitialized({B, T, V});  // the gemm's beta = 0 writes every element
  linear<float>(y.view().reshape({B * T, E}), head_weight(), {}, logits.view().reshape({B * T, V}));
  if (training_) {
    y_ = std::move(y);
    B_ = B, T_ = T;
  }
  return logits;
}

void Gpt::backward(View<const float> dlogits) {
  ATTN_CHECK(training_ && y_.data(), "Expected a training-mode forward before Gpt::backward, but got none instead");
  const int64_t B = B_, T = T_, V = c_.vocab_size, E = c_.n_embd;
  ATTN_CHECK(dlogits.shape == Shape({B, T, V}), "Expected dlogits of shape ", to_string({B, T, V}), ", but got ",
             to_string(dlogits.shape), " instead");
  profile::Scope part("backward");
  Tensor dlog = dlogits.is_contiguous() ? Tensor() : Tensor::copy_of(dlogits);
  const float* dl = dlog.data() ? dlog.data() : dlogits.data;
  // The head: logits = y · Wᵀ, so dy = dlogits · W and dW += dlogitsᵀ · y.
  Tensor dy = Tensor::uninitialized({B, T, E});  // the gemm's beta = 0 writes every element
  Tensor& dw = c_.tie_weights ? wte.weight_grad : lm_head.weight_grad;
  {
    profile::Scope p("lm_head");
    linear_backward(y_.view().reshape({B * T, E}), head_weight(), View<const float>(dl, {B * T, V}),
                    dy.view().reshape({B * T, E}), dw.view(), {});
  }
  size_t group = 0;  // grad_groups()'s index of the next group to finish
  auto finished = [&] {
    if (on_grads_final) on_grads_final(group);
    ++group;
  };
  if (!c_.tie_weights) finished();
  Tensor dx;
  {
    profile::Scope p("ln_f");
    dx = ln_f.backward(dy.view());
  }
  finished();
  for (size_t i = h.size(); i-- > 0;) {
    {
      profile::Scope p(block_name(i));
      dx = h[i].backward(std::move(dx));  // the block accumulates over dx's buffer
    }
    finished();
  }
  {
    profile::Scope p("embed");
    if (c_.dropout > 0) dx = drop.backward(dx.view());
    wte.backward(dx.view());
    if (c_.position == "learned") wpe.backward(sum_batch(dx.view()).view());
  }
  y_ = Tensor();
  finished();
}

std::vector<std::vector<Param>> Gpt::grad_groups() {
  // children() reversed is backward()'s order of finished() calls, with wte and wpe one group (their
  // gradients are final together, last) and the dropout (no parameters) none.
  std::vector<std::vector<Param>> g;
  for (const Child& c : children()) {
    std::vector<Param> p;
    c.layer->parameters(p, c.prefix);
    if (c.layer == &wpe) g.back().insert(g.back().end(), p.begin(), p.end());
    else if (!p.empty()) g.push_back(std::move(p));
  }
  std::reverse(g.begin(), g.end());
  return g;
}

void Gpt::set_batch_offset(int64_t b0) {
  ATTN_CHECK(b0 >= 0, "Expected a batch offset >= 0, but got ", b0, " instead");
  Layer::set_batch_offset(b0);
}

float Gpt::forward_backward(const int64_t* idx, const int64_t* targets, int64_t B, int64_t T) {
  const int64_t count = scored_tokens(targets, B * T);
  const double sum = forward_backward_sum(idx, targets, B, T, count);
  return count == 0 ? 0.0f : float(sum / double(count));  // cross_entropy's mean
}

double Gpt::forward_backward_sum(const int64_t* idx, const int64_t* targets, int64_t B, int64_t T, int64_t count) {
  ATTN_CHECK(training_, "Expected training mode for forward_backward, but got eval mode instead");
  Tensor logits = forward(idx, B, T);
  View<float> rows = logits.view().reshape({B * T, c_.vocab_size});
  double sum;
  {
    profile::Scope p("cross_entropy");
    sum = cross_entropy_sum(rows, targets, rows, count);  // dlogits overwrite the logits in place
  }
  backward(logits.view());
  return sum;
}

float Gpt::evaluate(const int64_t* idx, const int64_t* targets, int64_t B, int64_t T) {
  ATTN_CHECK(!training_, "Expected eval mode for evaluate, but got training mode instead");
  Tensor logits = forward(idx, B, T);
  return cross_entropy(logits.view().reshape({B * T, c_.vocab_size}), targets);
}

KVCache Gpt::new_cache(int64_t B, KvDtype dtype) const {
  return KVCache(c_.n_layer, B, c_.n_kv_head, c_.block_size, c_.n_embd / c_.n_head, 0, dtype);
}

Tensor Gpt::forward_cached(const int64_t* idx, int64_t B, int64_t T, KVCache& cache) {
  ATTN_CHECK(!training_, "Expected eval mode for forward_cached, but got training mode instead");
  ATTN_CHECK(cache.layers() == c_.n_layer, "Expected a KV cache of ", c_.n_layer, " layers, but got ",
             cache.layers(), " instead");
  Tensor x = embed(idx, B, T, cache.length(0));
  const AttnVariants v = variants();
  for (size_t i = 0; i < h.size(); ++i) x = h[i].forward_cached(x.view(), cache, int64_t(i), v);
  Tensor y = ln_f.forward(x.view());
  Tensor logits({B, T, c_.vocab_size});
  linear<float>(y.view().reshape({B * T, c_.n_embd}), head_weight(), {},
                logits.view().reshape({B * T, c_.vocab_size}));
  return logits;
}

std::vector<Tensor> Gpt::attention_weights(const int64_t* idx, int64_t B, int64_t T) {
  const bool was_training = training_;
  train(false);
  std::vector<Tensor> weights;
  Tensor x = embed(idx, B, T, 0);
  EncoderArgs args;
  args.is_causal = true;
  args.variants = variants();
  for (auto& block : h) {
    weights.push_back(block.attention_weights(x.view(), args));  // (B, H, T, T)
    x = block.forward(x.view(), args);
  }
  train(was_training);
  return weights;
}

// ---- Sampling ----

std::vector<int64_t> generate(Gpt& model, const std::vector<int64_t>& prompt, const SampleOptions& o) {
  model.eval();
  const int64_t V = model.config().vocab_size;
  KVCache cache = model.new_cache(1, o.kv_dtype);
  Tensor logits;  // (1, n, V) of the last step
  return sample_loop(prompt, o, V, model.config().block_size, [&](const int64_t* ids, int64_t n, bool restart) {
    if (restart) cache.clear();
    logits = model.forward_cached(ids, 1, n, cache);
    return logits.data() + (n - 1) * V;
  });
}

}  // namespace attn
