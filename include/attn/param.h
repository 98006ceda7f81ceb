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

class Layer;

// A sub-layer as its parent lists it: `prefix` before its parameters' names ("self_attn.", or "" where
// PyTorch puts them directly under the parent's), and `stream`: reseed(seed) gives it seed ^ stream.
struct Child {
  std::string prefix;
  Layer* layer;
  uint64_t stream = 0;
};

// What every trainable layer has: its parameters under PyTorch's names, a training flag (dropout on,
// activations saved for backward) and dropout streams. A composite lists its sub-layers once, in
// children(); parameters(), train(), reseed() and set_batch_offset() walk that list unless overridden.
class Layer {
 public:
  virtual ~Layer() = default;
  // The sub-layers in PyTorch's state_dict order; none for a leaf.
  virtual std::vector<Child> children() { return {}; }
  // Appends the parameters in PyTorch's state_dict order, `prefix` before each name ("layers.0."): a
  // leaf's own, else its children's under their prefixes.
  virtual void parameters(std::vector<Param>& out, const std::string& prefix = "") {
    for (const Child& c : children()) c.layer->parameters(out, prefix + c.prefix);
  }
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
  virtual void train(bool on = true) {
    training_ = on;
    for (const Child& c : children()) c.layer->train(on);
  }
  void eval() { train(false); }
  bool training() const { return training_; }
  // The next forwards' dropout draws as a fresh layer seeded from `seed` would (per-step streams, for a
  // bit-exact resume): each child gets seed ^ its stream; the layers that draw override it.
  virtual void reseed(uint64_t seed) {
    for (const Child& c : children()) c.layer->reseed(seed ^ c.stream);
  }
  // The next training forwards' rows are rows b0... (along the batch dim) of a larger batch: every
  // dropout draws the masks the whole batch would draw for those rows (Dropout::set_batch_offset).
  virtual void set_batch_offset(int64_t b0) {
    for (const Child& c : children()) c.layer->set_batch_offset(b0);
  }

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
