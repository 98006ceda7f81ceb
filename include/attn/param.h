// Trainable parameters: one list of (state_dict name, value, gradient) that the optimizer, zero_grad and
// the safetensors checkpoint all iterate, and PyTorch's default initialisations. Not an autograd engine:
// each layer's backward() adds into the gradients itself (see nn.h).
#pragma once
#include <string>
#include <vector>

#include "attn/rng.h"
#include "attn/safetensors.h"
#include "attn/tensor.h"

namespace attn {

// One parameter under its PyTorch state_dict name ("self_attn.in_proj_weight", "linear1.bias", ...).
// value and grad have the same shape; the pointers stay valid for the owning layer's life.
struct Param {
  std::string name;
  Tensor* value;
  Tensor* grad;
};

void zero_grad(const std::vector<Param>& params);           // grad = 0
StateDict state_dict(const std::vector<Param>& params);     // copies of the values, by name
// Every name with its shape; an unknown or missing name or a wrong shape is an Error, and nothing is
// changed on error.
void load_state_dict(const std::vector<Param>& params, const StateDict& sd);

// What every trainable layer has: its parameters under PyTorch's names, and a training flag (dropout on,
// activations saved for backward) that composite layers pass down to their children.
class Layer {
 public:
  virtual ~Layer() = default;
  // Appends the parameters in PyTorch's state_dict order, `prefix` before each name ("layers.0.").
  virtual void parameters(std::vector<Param>& out, const std::string& prefix = "") = 0;
  std::vector<Param> parameter_list() {
    std::vector<Param> p;
    parameters(p, "");
    return p;
  }
  void zero_grad() { attn::zero_grad(parameter_list()); }
  StateDict state_dict() { return attn::state_dict(parameter_list()); }
  void load_state_dict(const StateDict& sd) { attn::load_state_dict(parameter_list(), sd); }
  // Training mode (the default, as a fresh torch module): dropout applies and forward() saves what
  // backward() needs. Eval mode: no dropout, nothing saved, backward() is an error.
  virtual void train(bool on = true) { training_ = on; }
  void eval() { train(false); }
  bool training() const { return training_; }

 protected:
  bool training_ = true;
};

// torch.nn.init, with attn::Rng's numbers (PyTorch's distributions, other values).
namespace init {
// fan_in, fan_out as torch.nn.init._calculate_fan_in_and_fan_out: dims 1 and 0 times dims 2...
std::pair<double, double> fans(const Shape& shape);
void uniform(Tensor& t, double lo, double hi, Rng& rng);
void normal(Tensor& t, double mean, double std, Rng& rng);
// torch.randn: a new tensor of N(0, std²) draws, from `rng` or from a fresh Rng(seed).
Tensor randn(Shape shape, Rng& rng, double std = 1.0);
Tensor randn(Shape shape, uint64_t seed);
void xavier_uniform(Tensor& t, Rng& rng);
void xavier_normal(Tensor& t, Rng& rng);
// kaiming_uniform_(a=sqrt(5)), nn.Linear's weight default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void linear_weight(Tensor& t, Rng& rng);
}  // namespace init

}  // namespace attn
