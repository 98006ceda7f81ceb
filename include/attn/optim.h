// Optimisation: AdamW with torch.optim.AdamW's exact update, clipping by global gradient norm as
// torch.nn.utils.clip_grad_norm_, and nanoGPT's warmup + cosine learning-rate schedule. Not a general
// optimizer library: one optimizer, float32 parameters.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attn/param.h"
#include "attn/safetensors.h"

namespace attn {

struct AdamWOptions {  // torch.optim.AdamW's defaults
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // for the parameters that decay (see AdamW's constructor)
};

// nanoGPT's parameter groups: matrices of matmuls and embeddings (rank >= 2) decay; biases and
// LayerNorm parameters (rank 1) do not. With decay_embeddings = false, names containing "wte" or "wpe"
// do not decay either.
bool nanogpt_decays(const Param& p, bool decay_embeddings = true);

class AdamW {
 public:
  // decays(p): whether weight_decay applies to p (nanogpt_decays by default).
  AdamW(std::vector<Param> params, const AdamWOptions& options,
        const std::function<bool(const Param&)>& decays = [](const Param& p) { return nanogpt_decays(p); });

  // One update with learning rate `lr` (the schedule's value for this step), from the current gradients:
  //   step += 1;  θ ← θ·(1 − lr·λ);  m ← lerp(m, g, 1 − β1);  v ← β2·v + (1 − β2)·g²
  //   θ ← θ − lr/(1 − β1^step) · m / (sqrt(v)/sqrt(1 − β2^step) + ε)
  // in float32 with torch's operation order (eps added after the bias correction of sqrt(v)).
  // grad_scale: clipping folded into the same pass, g·grad_scale used for g (clip_coefficient(); the
  // bits of clip_grad_norm then step, without a pass that writes the scaled gradients back).
  void step(double lr, float grad_scale = 1.0f);
  void step() { step(options_.lr); }
  void zero_grad() { attn::zero_grad(params_); }

  int64_t steps() const { return step_; }
  const AdamWOptions& options() const { return options_; }
  const std::vector<Param>& params() const { return params_; }
  bool decays(size_t i) const { return decay_[i]; }

  // "<prefix>exp_avg.<name>" and "<prefix>exp_avg_sq.<name>" per parameter; the step count travels
  // separately (checkpoint metadata). load_state checks every name and shape; nothing changes on error.
  void save_state(StateDict& out, const std::string& prefix = "optim.") const;
  void load_state(const StateDict& in, int64_t step, const std::string& prefix = "optim.");

 private:
  std::vector<Param> params_;
  std::vector<bool> decay_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // same shapes as the parameters
  std::vector<int64_t> offsets_ = {0};         // parameter i is [offsets_[i], offsets_[i + 1]) of one pass
  AdamWOptions options_;
  int64_t step_ = 0;
};

// Scales every gradient by min(1, max_norm / (norm + 1e-6)) where norm is the L2 norm of all gradients
// together, as torch.nn.utils.clip_grad_norm_; returns that norm (before clipping). max_norm <= 0: no
// clipping, the norm is still returned.
double clip_grad_norm(const std::vector<Param>& params, double max_norm);
// Its two halves, for the trainer's fused clip + AdamW: the global L2 norm of the gradients (in parallel,
// in an order that depends on the gradients' sizes only), and the scale min(1, max_norm / (norm + 1e-6))
// as the float the gradients are multiplied by (1 when max_norm <= 0).
double grad_norm(const std::vector<Param>& params);
float clip_coefficient(double norm, double max_norm);

// nanoGPT's get_lr: linear warmup lr·(it+1)/(warmup+1) for it < warmup, cosine from lr down to min_lr
// until decay_steps, then min_lr.
struct LrSchedule {
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 100, decay_steps = 2000;
  double at(int64_t it) const;
};

}  // namespace attn
