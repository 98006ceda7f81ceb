// What a Highway target bit says about the instructions it has, written once: the register blocks
// (src/kernels/register_block.h), AVX-512-only code (flash_backward.cpp's transposes), the FMA-peak loop
// and simd.h's answers (fma_target, avx512_target) all ask these. Macros of a target bit, so that `#if`
// can test the target a translation unit is being compiled for: ATTN_AVX512_TARGET(HWY_TARGET).
// Not the choice of target (Highway's dispatch makes it; simd.h reports it).
//
// Highway numbers the x86 targets from the best (lowest bit) down: every target up to AVX3 is an
// AVX-512 one (AVX3, AVX3_DL, and AVX3_ZEN4 / AVX3_SPR in later Highway versions), every target up
// to AVX2 has FMA; SSE4, EMU128 and SCALAR have neither.
#pragma once
#include <hwy/detect_targets.h>

#define ATTN_AVX512_TARGET(t) (HWY_ARCH_X86 && (t) != 0 && (t) <= HWY_AVX3)
#define ATTN_FMA_TARGET(t) (HWY_ARCH_X86 && (t) != 0 && (t) <= HWY_AVX2)
