// The arguments of attn's packed GEMMs as their entries take them: gemm.cpp's Args (float, double) and
// gemm_bf16.cpp's Bf16Args, which linear() (gemm.cpp) builds too, with the bias its chains start from.
// Internal to src/kernels.
#pragma once
#include <cstdint>

#include "attn/gemm.h"  // PackedB16

namespace attn::gemm_detail {

// Everything one product needs, for either element type.
template <typename T>
struct Args {
  bool ta, tb;
  int64_t M, N, K;
  T alpha;
  const T* A;
  int64_t lda;
  const T* B;
  int64_t ldb;
  T beta;
  T* C;
  int64_t ldc;
  const T* packed;  // op(B) as panels cut at (packed_kc, packed_nr) (PackedB), or null: pack B per call
  int64_t packed_kc, packed_nr;
  const T* bias = nullptr;  // N values, every row's C0 instead of beta·C (beta 0): linear's bias
};

// One bf16 product: each operand fp32 (rounded when packed) or bf16 bits.
struct Bf16Args {
  bool ta, tb;
  int64_t M, N, K;
  const void* A;
  bool a16;  // A holds bf16 bits (uint16_t), else float
  int64_t lda;
  const void* B;
  bool b16;
  int64_t ldb;
  float beta;
  float* C;  // nullptr where C16 is the result
  int64_t ldc;
  const PackedB16* packed = nullptr;  // op(B)'s panels packed once (read where cut for this target and kernel)
  uint16_t* C16 = nullptr;  // a bf16 C (rows ldc apart): the fp32 result rounded once
  const float* bias = nullptr;  // as Args' (an fp32 C)
};

// gemm_bf16's entry (gemm_bf16.cpp): the empty products, then the target's.
void run_bf16(const Bf16Args& g);

}  // namespace attn::gemm_detail
