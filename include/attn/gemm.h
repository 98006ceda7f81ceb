// Dense matrix products, row-major, for projections (Linear, MHA in/out projections, the LM head):
// attn's own packed GEMM, its SIMD target chosen from the CPU when the program runs, the same bits for
// any thread count. Not for the attention inner loops: those use the flash kernel's own microkernels.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn/gemv.h"  // WeightLayout
#include "attn/precision.h"
#include "attn/tensor.h"

namespace attn {

// C (M, N) = alpha · op(A) (M, K) · op(B) (K, N) + beta · C, row-major with leading dimensions; op =
// transpose if set. beta == 0: C is not read (it may hold NaN). Bitwise the same for any thread count.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// op(B) (K, N) packed once as the GEMM's B panels, for many products with the same B (a pretrained
// encoder's weights: x·Wᵀ then neither transposes nor copies W per call; ONNX Runtime packs its weights
// when a session starts). gemm() over it gives the bits of gemm() over B: the panels only decide where the
// values are read from. They are cut for the SIMD target, register block and K block of packing time; a
// product under another target (a test forcing one) or block (attn tune) packs from B itself, so B must
// outlive the PackedB. Immutable once made: share it between threads.
struct PackedB {
  bool trans_b = false;
  int64_t K = 0, N = 0;
  const float* B = nullptr;  // op(B)'s source, row-major, rows ldb apart
  int64_t ldb = 0;
  int64_t kc = 0, nr = 0;    // the K block and the panel width they were cut at (0: nothing packed)
  std::shared_ptr<const float> panels;  // K·ceil(N / nr)·nr floats; the block at k = pc from pc·ceil(N / nr)·nr
};
PackedB pack_b(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb);
// C (M, N) = alpha · op(A) (M, K) · op(B) (K, N) + beta · C with op(B) packed: gemm()'s bits.
void gemm(bool trans_a, int64_t M, float alpha, const float* A, int64_t lda, const PackedB& B, float beta, float* C,
          int64_t ldc);

// bf16 products. A bf16 number is stored as the upper 16 bits of an fp32 (attn/kernels/half_kv.h's
// to_half converts). C (M, N) = op(A) (M, K) · op(B) (K, N) + beta · C, fp32 C, in the arithmetic of
// AMX's TDPBF16PS: A and B in bf16 (fp32 operands are rounded to nearest even as they are packed); k in
// groups of 32 from 0 (the last one zero-padded); per group and C element two fp32 chains from 0, one
// over the even k's products and one over the odd k's, then C = C + (even + odd); each sum rounded to
// nearest even, subnormal inputs and sums flushed to zero; beta·C first where beta is not 0 or 1. AMX
// where the CPU and OS have it, else AVX512_BF16's VDPBF16PS on reordered pairs, else FMAs (a product of
// two bf16 is exact in fp32): the same bits on every CPU and thread count, NaN payloads aside (targets
// without FMA, SSE4 and older: products below 2^-126 are flushed as well).
// beta == 0: C is not read.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
// bf16 C (torch.mm on bfloat16 tensors): C = bf16(op(A) · op(B) + beta · C), the fp32 C of the overload
// above from C widened to fp32, rounded to nearest even once at the end (written as bf16 only: no fp32 copy of
// C where K is one K block and beta is 0).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
               const uint16_t* B, int64_t ldb, float beta, uint16_t* C, int64_t ldc);

// op(B) (K, N) of bf16 values packed once as gemm_bf16's B panels (a bf16 encoder's weights, as PackedB for
// fp32): the pair words of the kernel that runs (AMX, VDPBF16PS) or the emulation's fp32, cut for the SIMD
// target and that kernel at packing time; a product under another (a test forcing one) packs from B itself,
// so B must outlive the PackedB16. gemm_bf16 over it gives the bits of gemm_bf16 over B. Immutable once made.
struct PackedB16 {
  bool trans_b = false;
  int64_t K = 0, N = 0;
  const uint16_t* B = nullptr;  // op(B)'s source, row-major, rows ldb apart
  int64_t ldb = 0;
  int64_t kc = 0;       // pairs per K block
  int64_t layout = 0;   // the target and kernel they were cut for (0: nothing packed)
  std::shared_ptr<const void> panels;  // each K block's panels, as gemm_bf16 packs them per call
};
PackedB16 pack_b_bf16(bool trans_b, int64_t K, int64_t N, const uint16_t* B, int64_t ldb);
void gemm_bf16(bool trans_a, int64_t M, const float* A, int64_t lda, const PackedB16& B, float beta, float* C,
               int64_t ldc);
void gemm_bf16(bool trans_a, int64_t M, const uint16_t* A, int64_t lda, const PackedB16& B, float beta, float* C,
               int64_t ldc);

// Which bf16 GEMM runs, for `attn info`: "AMX TDPBF16PS, AVX3 32x32", "VDPBF16PS, AVX3 6x32" or
// "emulated with FMA (no AVX512_BF16), AVX2 6x16".
std::string gemm_bf16_kernel();

// The float GEMM's register blocks on the SIMD target now chosen, rows x columns of C per microkernel, the
// derived one first: Tuning::gemm_mr (attn/tune.h) picks one by its rows. None changes a bit.
struct RegisterBlock {
  int64_t rows, cols;
};
std::vector<RegisterBlock> gemm_register_blocks();

// Which GEMM runs, for `attn info`: "attn packed GEMM, AVX3 6x64 (float), 6x32 (double), max KC ...".
// Changes with the SIMD target Highway chooses.
std::string gemm_kernel();

// What linear() and linear_backward() multiply in: matmul_precision() (attn/precision.h), f32 unless an
// Autocast(Precision::bf16) is alive on the thread: then gemm_bf16, x, W and dy rounded to bf16 as they are
// packed (weights, outputs, gradients and bias stay fp32).
// Throws attn::Error if bf16 products would run emulated here (no AVX512_BF16): --strict's refusal.
void check_bf16_native();

// y (N, out) = x (N, in) · Wᵀ (in, out) + bias (out): torch.nn.functional.linear. x and y may have
// any row stride (a column slice of a wider matrix) but unit column stride; bias may be empty. W (out, in),
// or (in, out) read in place with WeightLayout::in_out (GPT-2's Conv1D): y = x · W + bias.
template <typename T>
void linear(View<const T> x, View<const T> weight, View<const T> bias, View<T> y,
            WeightLayout layout = WeightLayout::out_in);
// The same over a weight of bf16 bits (a bf16 model's, rounded once when loaded): gemm_bf16 whatever the
// thread's precision, the bits of the float overload under Autocast(bf16) on the widened weight.
void linear(View<const float> x, View<const uint16_t> weight, View<const float> bias, View<float> y,
            WeightLayout layout = WeightLayout::out_in);

// The same over W (out, in) and its panels packed once (pack_b(true, in, out, W, in)), which fp32 products read
// instead of packing W per call: the bits of the overloads above.
void linear(View<const float> x, View<const float> weight, const PackedB& packed, View<const float> bias,
            View<float> y);
// And over bf16 W (out, in) and its panels packed once (pack_b_bf16(true, in, out, W, in)).
void linear(View<const float> x, View<const uint16_t> weight, const PackedB16& packed, View<const float> bias,
            View<float> y);

// Backward of linear: dx (N, in) = dy · W (overwritten; skipped if empty), dw (out, in) += dyᵀ · x,
// db (out) += column sums of dy (skipped if empty). Rows of x, dy and dx may be strided.
void linear_backward(View<const float> x, View<const float> weight, View<const float> dy, View<float> dx,
                     View<float> dw, View<float> db);

}  // namespace attn
