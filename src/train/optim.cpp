// AdamW, gradient clipping and the learning-rate schedule. The AdamW update copies the operation order
// of torch.optim.AdamW's single-tensor CPU path (torch/optim/adam.py with decoupled weight decay) so the
// trajectories agree to float32 rounding. Not a second copy of the parameters: it updates them in place.
#include "attn/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "attn/check.h"
#include "attn/threads.h"
#include "adamw_update.h"

namespace attn {
bool nanogpt_decays(const Param& p, bool decay_embeddings) {
  if (p.value->shape().size() < 2) return false;
  if (!decay_embeddings && (p.name.find("wte") != std::string::npos || p.name.find("wpe") != std::string::npos))
    return false;
  return true;
}

AdamW::AdamW(std::vector<Param> params, const AdamWOptions& o, const std::function<bool(const Param&)>& decays)
    : params_(std::move(params)), options_(o) {
  ATTN_CHECK(o.lr >= 0, "Expected lr >= 0, but got ", o.lr, " instead");
  ATTN_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "Expected betas in [0, 1), but got (",
             o.beta1, ", ", o.beta2, ") instead");
  ATTN_CHECK(o.eps >= 0, "Expected eps >= 0, but got ", o.eps, " instead");
  ATTN_CHECK(o.weight_decay >= 0, "Expected weight_decay >= 0, but got ", o.weight_decay, " instead");
  for (const Param& p : params_) {
    ATTN_CHECK(p.grad && p.grad->shape() == p.value->shape(), "Expected a gradient of shape ",
               to_string(p.value->shape()), " for parameter '", p.name, "', but got ",
               p.grad ? to_string(p.grad->shape()) : std::string("none"), " instead");
    decay_.push_back(decays(p));
    exp_avg_.emplace_back(p.value->shape());
    exp_avg_sq_.emplace_back(p.value->shape());
    offsets_.push_back(offsets_.back() + p.value->numel());
  }
}

void AdamW::step(double lr, float grad_scale) {
  ++step_;
  const double beta1 = options_.beta1, beta2 = options_.beta2;
  // Python floats (double) in torch, turned into float32 scalars where they meet a float tensor.
  const double bias_correction1 = 1 - std::pow(beta1, double(step_));
  const double bias_correction2 = 1 - std::pow(beta2, double(step_));
  const float step_size = float(lr / bias_correction1);
  const float bc2_sqrt = float(std::sqrt(bias_correction2));
  const float w1 = float(1 - beta1), b2 = float(beta2), w2 = float(1 - beta2), eps = float(options_.eps);
  const float shrink = float(1 - lr * options_.weight_decay);
  // One pass over all parameters as one index space [0, offsets_.back()): one parallel_for, not one per
  // parameter (most are small: a LayerNorm's F values). Elementwise, so any split gives the same bits;
  // ~20 operations per element.
  parallel_for(offsets_.back(), grain_for(20), [&](int64_t b, int64_t e, int) {
    size_t i = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), b) - offsets_.begin()) - 1;
    for (; b < e; ++i) {  // the part of parameter i in [b, e)
      const int64_t o = offsets_[i], end = std::min(e, offsets_[i + 1]);
      const float decay = decay_[i] ? shrink : 1.0f;  // θ·1 is exact: no branch in the loop
      const AdamWScalars sc{decay, w1, b2, w2, bc2_sqrt, eps, step_size, grad_scale};
      adamw_update(end - b, params_[i].value->data() + (b - o), params_[i].grad->data() + (b - o),
                   exp_avg_[i].data() + (b - o), exp_avg_sq_[i].data() + (b - o), sc);  // SIMD (adamw_update.cpp)
      b = end;
    }
  });
}

void AdamW::save_state(StateDict& out, const std::string& prefix) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace(prefix + "exp_avg." + params_[i].name, Tensor::copy_of(exp_avg_[i].view()));
    out.emplace(prefix + "exp_avg_sq." + params_[i].name, Tensor::copy_of(exp_avg_sq_[i].view()));
  }
}

void AdamW::load_state(const StateDict& in, int64_t step, const std::string& prefix) {
  ATTN_CHECK(step >= 0, "Expected an optimizer step count >= 0, but got ", step, " instead");
  std::vector<const Tensor*> m, v;  // check everything first: nothing changes on error
  for (const Param& p : params_) {
    m.push_back(&expect_tensor(in, prefix + "exp_avg." + p.name, p.value->shape()));
    v.push_back(&expect_tensor(in, prefix + "exp_avg_sq." + p.name, p.value->shape()));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    exp_avg_[i] = Tensor::copy_of(m[i]->view());
    exp_avg_sq_[i] = Tensor::copy_of(v[i]->view());
  }
  step_ = step;
}

namespace {
constexpr int64_t kNormBlock = 4096;  // elements per partial sum of the norm: fixed, so is the order

// Σ g² over n values in double, in 8 fixed lanes (vectorisable; the tail in lane 0), lanes added 0..7.
double sum_squares(const float* g, int64_t n) {
  double lanes[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += double(g[j + l]) * g[j + l];
  for (; j < n; ++j) lanes[0] += double(g[j]) * g[j];
  double sum = 0;
  for (double l : lanes) sum += l;
  return sum;
}
}  // namespace

double grad_norm(const std::vector<Param>& params) {
  // Blocks of kNormBlock values of each gradient in order, a partial sum each (in parallel), the partials
  // added in block order: the same bits for any thread count.
  std::vector<std::pair<const float*, int64_t>> blocks;
  for (const Param& p : params)
    for (int64_t b = 0; b < p.grad->numel(); b += kNormBlock)
      blocks.push_back({p.grad->data() + b, std::min(kNormBlock, p.grad->numel() - b)});
  std::vector<double> part(blocks.size());
  parallel_for(int64_t(blocks.size()), grain_for(2 * kNormBlock), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) part[size_t(i)] = sum_squares(blocks[size_t(i)].first, blocks[size_t(i)].second);
  });
  double sum = 0;
  for (double s : part) sum += s;
  return std::sqrt(sum);
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1 ? float(coef) : 1.0f;
}

double clip_grad_norm(const std::vector<Param>& params, double max_norm) {
  const double norm = grad_norm(params);
  const float c = clip_coefficient(norm, max_norm);
  if (c != 1.0f)
    for (const Param& p : params) {
      float* g = p.grad->data();
      const int64_t n = p.grad->numel();
      parallel_for(n, grain_for(1), [&](int64_t b, int64_t e, int) {
        for (int64_t j = b; j < e; ++j) g[j] *= c;
      });
    }
  return norm;
}

double LrSchedule::at(int64_t it) const {
  if (it < warmup) return lr * double(it + 1) / double(warmup + 1);
  if (it > decay_steps) return min_lr;
  const double ratio = decay_steps > warmup ? double(it - warmup) / double(decay_steps - warmup) : 1.0;
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));  // 1 -> 0
  return min_lr + coeff * (lr - min_lr);
}

}  // namespace attn
