// What attn's products multiply in, as torch.autocast chooses for its ops: f32, or bf16 products with
// fp32 sums. Per thread, f32 unless an Autocast is alive on it. Read by linear()/linear_backward()
// (gemm.h: x, W and dy rounded to bf16 as they are packed) and by sdpa() (sdpa.h SdpaOptions: Q·Kᵀ and
// P·V of the flash forward); weights, outputs, gradients, biases, softmax state and every reduction stay
// fp32, and double is always double.
#pragma once
#include <string>

namespace attn {

enum class Precision { f32, bf16 };
const char* to_string(Precision p);
// "f32"/"float32" or "bf16"/"bfloat16"; an Error naming anything else.
Precision parse_precision(const std::string& s);
Precision matmul_precision();

class Autocast {
 public:
  explicit Autocast(Precision p);  // for this scope, on this thread
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  Precision saved_;
};

}  // namespace attn
