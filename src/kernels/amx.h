// AMX-BF16 through the assembler (the compiler is not asked for the feature: code runs it only where
// cpu_info().amx says the CPU has it and the OS granted the tiles): the tile configuration of a thread and
// the one block product that the bf16 GEMM (gemm_bf16.cpp) and the bf16 flash tiles (flash_common.h) run.
// Plain C++, x86-64 only; TDPBF16PS's arithmetic is register_block.h's GroupBlock (docs/kernels.md). Under
// emulate_cpu_amx (tests) the block is computed in software by that definition instead (Emulated), so the AMX
// paths run, and are checked, on any CPU with AVX512_BF16.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

#include "attn/cpu.h"

namespace attn::amx {

// Eight tiles of 16 rows x 64 bytes: tmm0-3 C (row tile i, column tile j in tmm 2i + j), tmm4-5 A, tmm6-7 B.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// The tiles configured for this thread while alive, released after (so a context switch saves no tile data);
// none under emulate_cpu_amx.
class Tiles {
 public:
  Tiles() : hardware_(!cpu_info().amx_emulated) {
    static const TileConfig config;
    if (hardware_) asm volatile("ldtilecfg %0" ::"m"(config));
  }
  ~Tiles() {
    if (hardware_) asm volatile("tilerelease" ::: "memory");
  }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;

 private:
  bool hardware_;
};

template <int T>
inline void Zero() { asm volatile("tilezero %%tmm%c0" ::"i"(T)); }
template <int T>
inline void Load(const void* p, int64_t stride_bytes) {
  asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(stride_bytes), "i"(T) : "memory");
}
template <int T>
inline void Store(void* p, int64_t stride_bytes) {
  asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(stride_bytes), "i"(T) : "memory");
}
template <int C, int A, int B>
inline void Dp() { asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B)); }

// Where a block reads its operand tiles, in 32-bit words (pair words), for group g (16 pairs of k):
// A's row tile i (16 rows of the group's 16 words, rows ld apart) at a + i·16·ld + g·group;
// B's column tile j (the group's 16 pair rows of 16 columns, rows ld apart) at b + j·col + g·group.
struct ATiles {
  const uint32_t* a;
  int64_t ld, group;
};
struct BTiles {
  const uint32_t* b;
  int64_t ld, group, col;
};

// x with a subnormal flushed to a zero of its sign, as TDPBF16PS flushes its inputs and sums.
inline float Flushed(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return u & 0x7F800000u ? x : std::bit_cast<float>(u & 0x80000000u);
}
// The bf16 in a pair word's low (k = 2q) or high (2q + 1) half, as an fp32, flushed.
inline float Half(uint32_t word, bool high) {
  return Flushed(std::bit_cast<float>(high ? word & 0xFFFF0000u : word << 16));
}

// Block in software, by TDPBF16PS's definition (docs/kernels.md): per element of C and group, E over the products
// of the words' low halves and O over their high halves, in pair order from +0, each add rounded once (a product
// of two bf16 is exact in fp32), then C + (E + O); inputs and sums flushed. Reads what the tile loads read.
template <int NC>
void Emulated(ATiles A, BTiles B, int64_t groups, float* c, int64_t ldc, bool zero) {
  for (int64_t r = 0; r < 32; ++r)  // row r: row r % 16 of A's row tile r / 16
    for (int64_t n = 0; n < 16 * NC; ++n) {
      float acc = zero ? 0.f : c[r * ldc + n];
      for (int64_t g = 0; g < groups; ++g) {
        const uint32_t* a = A.a + r * A.ld + g * A.group;                // the row's 16 pair words
        const uint32_t* b = B.b + n / 16 * B.col + g * B.group + n % 16;  // pair row k at b[k·ld]
        float e = 0.f, o = 0.f;
        for (int64_t k = 0; k < 16; ++k) {
          e = Flushed(std::fma(Half(a[k], false), Half(b[k * B.ld], false), e));
          o = Flushed(std::fma(Half(a[k], true), Half(b[k * B.ld], true), o));
        }
        acc = Flushed(Flushed(acc) + Flushed(e + o));
      }
      c[r * ldc + n] = acc;
    }
}

// C (32, 16·NC) at c (rows ldc floats apart) = C0 + A·B over `groups` groups, one TDPBF16PS per C tile and
// group; C0 = 0 where `zero`, else C.
template <int NC>
inline void Block(ATiles A, BTiles B, int64_t groups, float* c, int64_t ldc, bool zero) {
  static_assert(NC == 1 || NC == 2);
  if (cpu_info().amx_emulated) return Emulated<NC>(A, B, groups, c, ldc, zero);
  const int64_t cs = ldc * 4, as = A.ld * 4, bs = B.ld * 4;
  float* c1 = c + 16 * ldc;
  if (zero) {
    Zero<0>(), Zero<2>();
    if constexpr (NC == 2) Zero<1>(), Zero<3>();
  } else {
    Load<0>(c, cs), Load<2>(c1, cs);
    if constexpr (NC == 2) Load<1>(c + 16, cs), Load<3>(c1 + 16, cs);
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint32_t* a = A.a + g * A.group;
    const uint32_t* b = B.b + g * B.group;
    Load<4>(a, as), Load<5>(a + 16 * A.ld, as), Load<6>(b, bs);
    if constexpr (NC == 2) Load<7>(b + B.col, bs);
    Dp<0, 4, 6>(), Dp<2, 5, 6>();
    if constexpr (NC == 2) Dp<1, 4, 7>(), Dp<3, 5, 7>();
  }
  Store<0>(c, cs), Store<2>(c1, cs);
  if constexpr (NC == 2) Store<1>(c + 16, cs), Store<3>(c1 + 16, cs);
}

}  // namespace attn::amx
