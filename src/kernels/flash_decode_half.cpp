// Decoding over half-precision (fp16 or bf16) K/V, and the fp32 <-> half conversions: few query rows,
// long S, so the step is bound by reading K and V, and the kernel is built to read each once. Not the
// prefill kernel (flash_forward.cpp) and no weights. fp32 K/V run it too: it is flash_forward's decode path.
//
// Work item = (batch b, KV head kvh, chunk c of kChunk keys); its L·G query rows (row r: position r/G,
// head first_head(kvh) + r%G, as in flash_forward.cpp) all read the chunk's K and V rows, each row
// converted to fp32 in registers once. Per item, in the log2 domain (Q pre-scaled by scale·log2e):
//   S (rows, n) = Q·Kᵀ + log2e·mask, -inf past each row's causal edge
//   m = rowmax(S); P = 2^(S − m); l = rowsum(P); O (rows, Dv) = P·V
// The items' (m, l, O) are merged per row in chunk order (softmax.h), so any thread count gives the
// same bits. Memory: O(B·Hkv·S/kChunk·rows·Dv) for the partials.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../src/kernels/flash_decode_half.cpp"  // found through include/
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

#include "attn/check.h"
#include "attn/kernels/half_kv.h"
#include "attn/threads.h"
#include "dropout.h"
#include "flash_common.h"
#include "mask.h"
#include "softmax.h"

HWY_BEFORE_NAMESPACE();
namespace attn::flash::HWY_NAMESPACE {
namespace {

constexpr int64_t kChunk = 512;  // keys per item: fixed, so the merge order never depends on threads
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr int64_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);  // room for one vector of any target

using DH = hn::Rebind<hwy::float16_t, DF>;   // N half lanes, promoted to one float vector
using DB = hn::Rebind<hwy::bfloat16_t, DF>;
using DU16 = hn::Rebind<uint16_t, DF>;
using DU32 = hn::RebindToUnsigned<DF>;

// N halves at src as one float vector.
template <KvDtype T>
HWY_INLINE VF Promote(const uint16_t* HWY_RESTRICT src) {
  const DF df;
  if constexpr (T == KvDtype::f16) {
    return hn::PromoteTo(df, hn::LoadU(DH(), reinterpret_cast<const hwy::float16_t*>(src)));
  } else {  // bf16: the 16 bits are the high half of the float
    const DU32 du;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(DU16(), src))));
  }
}

// N floats to N halves at dst, round to nearest even.
template <KvDtype T>
HWY_INLINE void Demote(VF v, uint16_t* HWY_RESTRICT dst) {
  if constexpr (T == KvDtype::f16) {
    hn::StoreU(hn::DemoteTo(DH(), v), DH(), reinterpret_cast<hwy::float16_t*>(dst));
  } else {
    // bits + 0x7FFF + (bit 16) rounds the high half to nearest even; a NaN is truncated instead (the
    // carry could turn it into an infinity), keeping it NaN with its quiet bit.
    const DU32 du;
    const auto bits = hn::BitCast(du, v);
    const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
    const auto rounded = hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), odd));
    const auto pick = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), bits, rounded);
    hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(hn::RebindToSigned<DF>(), hn::ShiftRight<16>(pick))), DU16(), dst);
  }
}

template <KvDtype T>
void ConvertTo(const float* src, int64_t n, uint16_t* dst) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) Demote<T>(hn::LoadU(df, src + i), dst + i);
  if (i < n) {  // the tail through a padded vector, so it rounds as the body does
    alignas(64) float in[kMaxLanes] = {};
    alignas(64) uint16_t out[kMaxLanes];
    std::copy(src + i, src + n, in);
    Demote<T>(hn::Load(df, in), out);
    std::copy(out, out + (n - i), dst + i);
  }
}

void ToHalf(KvDtype t, const float* src, int64_t n, uint16_t* dst) {
  if (t == KvDtype::f16) ConvertTo<KvDtype::f16>(src, n, dst);
  else ConvertTo<KvDtype::bf16>(src, n, dst);
}

void FromHalf(KvDtype t, const uint16_t* src, int64_t n, float* dst) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(t == KvDtype::f16 ? Promote<KvDtype::f16>(src + i) : Promote<KvDtype::bf16>(src + i), df, dst + i);
  if (i < n) {  // the tail through a padded vector
    alignas(64) uint16_t in[kMaxLanes] = {};
    alignas(64) float out[kMaxLanes];
    std::copy(src + i, src + n, in);
    hn::Store(t == KvDtype::f16 ? Promote<KvDtype::f16>(in) : Promote<KvDtype::bf16>(in), df, out);
    std::copy(out, out + (n - i), dst + i);
  }
}

// Row of n stored elements (halves, or floats with column stride cs) into n floats of dst; dst has room
// for round_up(n, N).
template <KvDtype T>
HWY_INLINE void PromoteRow(const float* HWY_RESTRICT src, int64_t cs, int64_t n, float* HWY_RESTRICT dst) {
  static_assert(T == KvDtype::f32);
  if (cs == 1) std::copy(src, src + n, dst);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i * cs];
}
template <KvDtype T>
HWY_INLINE void PromoteRow(const uint16_t* HWY_RESTRICT src, int64_t /*cs: 1*/, int64_t n, float* HWY_RESTRICT dst) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::Store(Promote<T>(src + i), df, dst + i);
  if (i < n) {  // the tail through a padded vector; dst has room for it
    alignas(64) uint16_t in[kMaxLanes] = {};
    std::copy(src + i, src + n, in);
    hn::Store(Promote<T>(in), df, dst + i);
  }
}

// Per-worker scratch of one item. Dp, Dvp: D, Dv rounded up to N; np: kChunk rounded up to N.
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> buf;
  float *q, *s, *o, *kf, *vf;  // (rows, Dp) Q·scale·log2e; (rows, kChunk) S then P; (rows, Dvp) O; (Dp); (Dvp)
  Scratch(int64_t rows, int64_t Dp, int64_t Dvp)
      : buf(hwy::AllocateAligned<float>(static_cast<size_t>(rows * (Dp + kChunk + Dvp) + Dp + Dvp))) {
    q = buf.get(), s = q + rows * Dp, o = s + rows * kChunk, kf = o + rows * Dvp, vf = kf + Dp;
  }
};

// Dot products of the rows with one key: x[r·kChunk] = q_r·k for r < rows (Dp a multiple of N).
HWY_INLINE void ScoreKey(const float* HWY_RESTRICT q, int64_t rows, int64_t Dp, const float* HWY_RESTRICT k,
                         float* HWY_RESTRICT x) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = q + r * Dp;
    VF a0 = hn::Zero(df), a1 = hn::Zero(df);  // two chains, so the FMA latency is hidden
    int64_t d = 0;
    for (; d + 2 * N <= Dp; d += 2 * N) {
      a0 = hn::MulAdd(hn::Load(df, qr + d), hn::Load(df, k + d), a0);
      a1 = hn::MulAdd(hn::Load(df, qr + d + N), hn::Load(df, k + d + N), a1);
    }
    if (d < Dp) a0 = hn::MulAdd(hn::Load(df, qr + d), hn::Load(df, k + d), a0);
    x[r * kChunk] = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
  }
}

// O_r += p_r·v for r < rows (Dvp a multiple of N).
HWY_INLINE void AccumulateValue(const float* HWY_RESTRICT p, int64_t rows, const float* HWY_RESTRICT v, int64_t Dvp,
                                float* HWY_RESTRICT o) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  for (int64_t r = 0; r < rows; ++r) {
    const float pr = p[r * kChunk];
    if (pr == 0.f) continue;  // masked or past the causal edge (and exp2 underflow): adds nothing
    const VF a = hn::Set(df, pr);
    float* orow = o + r * Dvp;
    for (int64_t e = 0; e < Dvp; e += N) hn::Store(hn::MulAdd(a, hn::Load(df, v + e), hn::Load(df, orow + e)), df, orow + e);
  }
}

// K and V as stored: E = uint16_t (f16, bf16) or float (f32), element strides.
template <typename E>
struct Stored {
  const E* k;
  const E* v;
  const int64_t* ks;  // (4) strides of K (B, Hkv, S, D)
  const int64_t* vs;  // (4) strides of V (B, Hkv, S, Dv)
};

template <KvDtype T, typename E>
void DecodeT(const SdpaProblem<float>& p, const Stored<E>& kv) {
  const DF df;
  const int64_t N = hn::Lanes(df);
  const int64_t rows = p.L * p.G, Dp = round_up(p.D, N), Dvp = round_up(p.Dv, N);
  const int64_t pairs = p.B * p.Hkv, nc = (p.S + kChunk - 1) / kChunk;
  const float qscale = float(p.scale) * kLog2e;
  auto part_m = hwy::AllocateAligned<float>(static_cast<size_t>(std::max<int64_t>(1, pairs * nc * rows)));
  auto part_l = hwy::AllocateAligned<float>(static_cast<size_t>(std::max<int64_t>(1, pairs * nc * rows)));
  auto part_o = hwy::AllocateAligned<float>(static_cast<size_t>(std::max<int64_t>(1, pairs * nc * rows * Dvp)));
  PerWorker<Scratch> scratch;
  parallel_items(pairs * nc, rows * std::min(p.S, kChunk) * (p.D + p.Dv), [&](int64_t item, int worker) {
    Scratch& sc = scratch.get(worker, rows, Dp, Dvp);
    const int64_t pair = item / nc, c = item % nc, b = pair / p.Hkv, kvh = pair % p.Hkv;
    const int64_t s0 = c * kChunk, n = std::min(kChunk, p.S - s0), npad = round_up(n, N);
    // Q rows of the group, scaled into the log2 domain, zero past D
    const auto& Q = p.args.q;
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = Q.data + b * Q.strides[0] + (p.first_head(kvh) + r % p.G) * Q.strides[1] + (r / p.G) * Q.strides[2];
      float* dst = sc.q + r * Dp;
      for (int64_t d = 0; d < p.D; ++d) dst[d] = src[d * Q.strides[3]] * qscale;
      std::fill(dst + p.D, dst + Dp, 0.f);
    }
    std::fill(sc.kf + p.D, sc.kf + Dp, 0.f);
    std::fill(sc.vf + p.Dv, sc.vf + Dvp, 0.f);
    std::fill(sc.o, sc.o + rows * Dvp, 0.f);
    // keys visible to some row: [s0, s_end); the last row (last query) sees the most
    const int64_t s_end = std::min(s0 + n, std::max(s0, p.key_end(p.L - 1)));
    const E* kb = kv.k + b * kv.ks[0] + kvh * kv.ks[1];
    const E* vb = kv.v + b * kv.vs[0] + kvh * kv.vs[1];
    // S = Q·Kᵀ: each K row read and converted once, for all rows
    for (int64_t s = s0; s < s_end; ++s) {
      PromoteRow<T>(kb + s * kv.ks[2], kv.ks[3], p.D, sc.kf);
      ScoreKey(sc.q, rows, Dp, sc.kf, sc.s + (s - s0));
    }
    // + masks, -inf past each row's causal edge; m = rowmax(S); P = 2^(S − m); l = rowsum(P)
    float* pm = part_m.get() + item * rows;
    float* pls = part_l.get() + item * rows;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = sc.s + r * kChunk;
      const int64_t l = r / p.G, h = p.first_head(kvh) + r % p.G, end = VisibleKeys(p, l, s0, s_end - s0);
      std::fill(row + end, row + npad, -kInfF);
      if (p.has_bias()) AddMaskRow(p, b, h, l, s0, end, row, 1);
      const float m = RowMax(row, npad);
      const float m_use = m == -kInfF ? 0.f : m;  // fully masked so far: P = 0, not NaN
      pm[r] = m;
      pls[r] = Exp2Row(row, npad, m_use);
      if (p.dropout()) DropRow(p, b, h, l, s0, end, 1, row);  // after l: the sum stays pre-dropout
    }
    // O = P·V: each V row read and converted once, for all rows
    for (int64_t s = s0; s < s_end; ++s) {
      PromoteRow<T>(vb + s * kv.vs[2], kv.vs[3], p.Dv, sc.vf);
      AccumulateValue(sc.s + (s - s0), rows, sc.vf, Dvp, sc.o);
    }
    std::copy(sc.o, sc.o + rows * Dvp, part_o.get() + item * rows * Dvp);
  });
  // merge per row in chunk order, then out = O/l (softmax.h)
  PerWorker<std::vector<float>> row_o;
  parallel_items(pairs * rows, nc * Dvp, [&](int64_t j, int worker) {
    const int64_t pair = j / rows, r = j % rows;
    float* o = row_o.get(worker, size_t(Dvp)).data();  // (Dvp,)
    float m, lsum;
    MergeChunks(part_m.get() + pair * nc * rows + r, part_l.get() + pair * nc * rows + r,
                part_o.get() + (pair * nc * rows + r) * Dvp, nc, rows, rows * Dvp, Dvp, o, &m, &lsum);
    WriteRow(p, pair / p.Hkv, p.first_head(pair % p.Hkv) + r % p.G, r / p.G, o, m, lsum);
  });
}

void Decode(const SdpaProblem<float>& p, const HalfKV& kv) {
  if (p.B == 0 || p.H == 0 || p.L == 0) return;
  const Stored<uint16_t> st{kv.k.data, kv.v.data, kv.k.strides.data(), kv.v.strides.data()};
  if (kv.dtype == KvDtype::f16) DecodeT<KvDtype::f16>(p, st);
  else DecodeT<KvDtype::bf16>(p, st);
}

void DecodeF32(const SdpaProblem<float>& p) {
  if (p.B == 0 || p.H == 0 || p.L == 0) return;
  const auto& a = p.args;
  DecodeT<KvDtype::f32>(p, Stored<float>{a.k.data, a.v.data, a.k.strides.data(), a.v.strides.data()});
}

}  // namespace
}  // namespace attn::flash::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn {
namespace flash {
HWY_EXPORT(Decode);
HWY_EXPORT(DecodeF32);
HWY_EXPORT(ToHalf);
HWY_EXPORT(FromHalf);
}  // namespace flash

const char* to_string(KvDtype t) {
  switch (t) {
    case KvDtype::f32: return "f32";
    case KvDtype::f16: return "f16";
    case KvDtype::bf16: return "bf16";
  }
  return "?";
}

KvDtype parse_kv_dtype(const char* s) {
  const std::string x = s;
  if (x == "f32") return KvDtype::f32;
  if (x == "f16") return KvDtype::f16;
  if (x == "bf16") return KvDtype::bf16;
  ATTN_CHECK(false, "Expected a KV dtype f32, f16 or bf16, but got '", x, "' instead");
  return KvDtype::f32;
}

double kv_unit_roundoff(KvDtype t) {
  return t == KvDtype::f16 ? std::ldexp(1.0, -11) : t == KvDtype::bf16 ? std::ldexp(1.0, -8) : 0.0;
}

void to_half(KvDtype t, const float* src, int64_t n, uint16_t* dst) {
  ATTN_CHECK(t != KvDtype::f32, "Expected f16 or bf16 for to_half, but got f32 instead");
  HWY_DYNAMIC_DISPATCH(flash::ToHalf)(t, src, n, dst);
}

void from_half(KvDtype t, const uint16_t* src, int64_t n, float* dst) {
  ATTN_CHECK(t != KvDtype::f32, "Expected f16 or bf16 for from_half, but got f32 instead");
  HWY_DYNAMIC_DISPATCH(flash::FromHalf)(t, src, n, dst);
}

void flash_decode_half(const SdpaProblem<float>& p, const HalfKV& kv) { HWY_DYNAMIC_DISPATCH(flash::Decode)(p, kv); }
void flash_decode(const SdpaProblem<float>& p) { HWY_DYNAMIC_DISPATCH(flash::DecodeF32)(p); }

}  // namespace attn
#endif  // HWY_ONCE
