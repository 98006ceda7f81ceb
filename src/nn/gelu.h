// GELU over float arrays (SIMD, one copy per Highway target): the exact erf form (PyTorch's default) or
// the tanh approximation. Private to src/nn; layers.cpp splits arrays over threads and calls these.
#pragma once
#include <cstdint>

namespace attn {

// y[i] = gelu(x[i])
void gelu_forward(const float* x, float* y, int64_t n, bool approx_tanh);
// dx[i] = dy[i] · gelu'(x[i])
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool approx_tanh);

}  // namespace attn
