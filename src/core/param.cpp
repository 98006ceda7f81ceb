// Parameter lists (zero_grad, state_dict I/O by name) and torch.nn.init's distributions.
#include "attn/param.h"

#include <cmath>
#include <cstring>

namespace attn {

void zero_grad(const std::vector<Param>& params) {
  for (const Param& p : params)
    if (p.grad) std::memset(p.grad->data(), 0, sizeof(float) * size_t(p.grad->numel()));
}

StateDict state_dict(const std::vector<Param>& params) {
  StateDict sd;
  for (const Param& p : params) sd.emplace(p.name, Tensor::copy_of(p.value->view()));
  return sd;
}

void load_state_dict(const std::vector<Param>& params, const StateDict& sd) {
  std::string expected;
  for (const Param& p : params) expected += (expected.empty() ? "" : ", ") + p.name;
  for (auto& [name, t] : sd) {
    bool known = false;
    for (const Param& p : params) known |= p.name == name;
    ATTN_CHECK(known, "Expected state_dict names in {", expected, "}, but got unknown name '", name, "' instead");
  }
  std::vector<const Tensor*> src;  // check all before changing anything
  for (const Param& p : params) src.push_back(&expect_tensor(sd, p.name, p.value->shape()));
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor copy = Tensor::copy_of(src[i]->view());  // any layout in, ours contiguous
    std::memcpy(params[i].value->data(), copy.data(), sizeof(float) * size_t(copy.numel()));
  }
}

namespace init {

std::pair<double, double> fans(const Shape& s) {
  double receptive = 1;
  for (size_t i = 2; i < s.size(); ++i) receptive *= double(s[i]);
  const double in = s.size() > 1 ? double(s[1]) : double(s[0]);
  return {in * receptive, double(s[0]) * receptive};
}

void uniform(Tensor& t, double lo, double hi, Rng& rng) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = float(rng.uniform(lo, hi));
}

void normal(Tensor& t, double mean, double std, Rng& rng) {
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = float(mean + std * rng.normal());
}

Tensor randn(Shape shape, Rng& rng, double std) {
  Tensor t(std::move(shape));
  normal(t, 0.0, std, rng);
  return t;
}

Tensor randn(Shape shape, uint64_t seed) {
  Rng rng(seed);
  return randn(std::move(shape), rng);
}

void xavier_uniform(Tensor& t, Rng& rng) {
  auto [in, out] = fans(t.shape());
  const double bound = std::sqrt(6.0 / (in + out));
  uniform(t, -bound, bound, rng);
}

void xavier_normal(Tensor& t, Rng& rng) {
  auto [in, out] = fans(t.shape());
  normal(t, 0.0, std::sqrt(2.0 / (in + out)), rng);
}

// kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + a²)) · sqrt(3 / fan_in) = 1/sqrt(fan_in).
void linear_weight(Tensor& t, Rng& rng) {
  const double bound = 1.0 / std::sqrt(fans(t.shape()).first);
  uniform(t, -bound, bound, rng);
}

}  // namespace init
}  // namespace attn
