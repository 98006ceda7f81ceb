// Half-precision K/V for decoding: the storage types (fp16, bf16), their conversion to and from fp32,
// and the decode kernel that reads them. Part of the kernel interface (attn/kernels/problem.h holds the
// problem it takes). Not a general half-precision tensor type and not training: fp32 everywhere else.
//
// Conversion: fp16 by F16C (Highway's PromoteTo/DemoteTo), round to nearest even; values beyond
// ±65504 become ±inf. bf16 keeps fp32's range: promoted by a shift, demoted with round to nearest even
// by integer ops (no bf16 instructions assumed). Relative error of one stored element: at most
// u = 2^-11 (fp16, normal range) or 2^-8 (bf16); kv_unit_roundoff() returns it.
#pragma once
#include <cstdint>

#include "attn/kernels/problem.h"

namespace attn {

enum class KvDtype { f32, f16, bf16 };
const char* to_string(KvDtype t);
// "f32", "f16", "bf16"; throws on anything else, naming it.
KvDtype parse_kv_dtype(const char* s);
// The unit roundoff of storing an fp32 value as t: 0 for f32.
double kv_unit_roundoff(KvDtype t);

// dst[i] = src[i] rounded to t (f16 or bf16), i < n; and back.
void to_half(KvDtype t, const float* src, int64_t n, uint16_t* dst);
void from_half(KvDtype t, const uint16_t* src, int64_t n, float* dst);

// K (B, Hkv, S, D) and V (B, Hkv, S, Dv) stored as 16-bit t, unit column stride.
struct HalfKV {
  KvDtype dtype = KvDtype::f16;
  View<const uint16_t> k, v;
};

// Decoding over half-precision K/V: out (and lse if requested) of problem p, whose args.k and args.v
// give the shapes of kv.k and kv.v only (their data are not read). Bandwidth-bound by design: keys are
// split into chunks of a fixed size; each chunk's K and V rows are read once, converted in registers,
// and used by all L·G query rows of their GQA group; the chunks' (max, sum, O) triples are merged in
// chunk order, so any thread count gives the same bits. No dropout, no weights (checked by the caller).
void flash_decode_half(const SdpaProblem<float>& p, const HalfKV& kv);
// The same kernel over p's fp32 K and V (any strides): flash_forward's decode path.
void flash_decode(const SdpaProblem<float>& p);

}  // namespace attn
