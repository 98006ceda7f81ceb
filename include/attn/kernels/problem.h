// The kernel interface: what an attention kernel is given (SdpaProblem, checked by make_problem) and the
// kernel entry points. The one home of attention semantics every kernel shares: the GQA head mapping,
// the key range of a query (causal, sliding window, packed documents) and query range of a key, the score
// modifications (softcap, ALiBi, T5's relative bias), the per-element mask value, and the dropout element
// index, threshold and keep scale. Kernels include this header and nothing of the attention layer;
// attn/sdpa.h (the entry point sdpa(), backend choice) includes it, not the other way.
// Also the argument checks every kernel relies on (make_problem, src/kernels/problem.cpp); not any math.
//
// Layout: Q (B, H, L, D), K (B, Hkv, S, D), V (B, Hkv, S, Dv), out (B, H, L, Dv), all strided views:
// MultiheadAttention's (B, L, E) projections are passed as (B, H, L, D) views without a copy.
// GQA/MQA: query head h reads KV head kv_head(h); K and V are never repeated.
//
// How a kernel uses it (see docs/kernels.md), in one order everywhere (FlashAttention 2's):
//   x = q·k·scale;  x = softcap·tanh(x/softcap);  x += position_bias(b, h, l, s) + bias(b, h, l, s)
//   scores(b, h, l, s) = x for s in keys(b, l) = [begin, end), -inf outside (causal, window, documents)
//   P = softmax(scores); P_dropped = P · keep_weight(b, h, l, s)  (keep_scale or 0 per element)
//   out = P_dropped · V;  lse = log Σ exp(scores), -inf on a fully masked row (output and gradient 0)
// Flash kernels apply these per row through src/kernels/mask.h, score_mod.h and dropout.h, which call only
// this; a key tile outside every row's range is never computed.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attn/check.h"
#include "attn/mask.h"
#include "attn/precision.h"
#include "attn/rng.h"
#include "attn/tensor.h"

namespace attn {

// The causal rule, its one home: query l of L sees keys [0, causal_key_end(causal, l, L, S)) of S. None:
// all S; top-left (PyTorch's is_causal): s <= l; bottom-right (a KV cache's): s <= l + S - L.
inline int64_t causal_key_end(Causal causal, int64_t l, int64_t L, int64_t S) {
  if (causal == Causal::none) return S;
  const int64_t end = l + 1 + (causal == Causal::bottom_right ? S - L : 0);
  return end < 0 ? 0 : (end > S ? S : end);
}

// A sliding window, FlashAttention 2's window_size: query l sees keys s with
// l + S - L - left <= s <= l + S - L + right (bottom-right aligned, as its causal); -1: unbounded on that
// side. (left, 0) is a causal sliding window of left + 1 keys (Mistral's sliding_window = left + 1).
struct Window {
  int64_t left = -1, right = -1;
  bool given() const { return left >= 0 || right >= 0; }
};

// T5's learned relative position bias: score (l, s) gets table[bucket(s - l), h], the bucket of the
// distance as transformers' T5Attention._relative_position_bucket computes it (exact below
// num_buckets/2, or /4 when bidirectional, logarithmic up to max_distance, one bucket beyond). The
// distance is bottom-right aligned as ALiBi's (a KV cache's queries are its last positions).
template <typename T>
struct RelativeBias {
  View<const T> table;       // (num_buckets, H)
  bool bidirectional = true;  // encoders; false for a decoder's self-attention (only s <= l has buckets)
  int64_t max_distance = 128;
  bool given() const { return !table.empty(); }
};

// Packed documents: a query sees only keys of its own document, and causal, windows and positions count
// within it (causal within each document). Either document ids of self-attention (L == S), each document
// one run of positions, or FlashAttention's varlen cumulative lengths (B == 1): document i holds queries
// [cu_seqlens_q[i], cu_seqlens_q[i + 1]) and keys [cu_seqlens_k[i], cu_seqlens_k[i + 1]).
struct Documents {
  View<const int64_t> ids;           // (B, L)
  View<const int64_t> cu_seqlens_q;  // (n + 1,): 0, ..., L
  View<const int64_t> cu_seqlens_k;  // (n + 1,): 0, ..., S
  bool given() const { return !ids.empty() || !cu_seqlens_q.empty() || !cu_seqlens_k.empty(); }
};

template <typename T>
struct SdpaArgs {
  View<const T> q;  // (B, H, L, D)
  View<const T> k;  // (B, Hkv, S, D)
  View<const T> v;  // (B, Hkv, S, Dv)
  Mask<T> attn_mask;              // broadcastable to (B, H, L, S), right-aligned as in PyTorch
  Mask<T> key_padding;            // (B, S)
  Causal causal = Causal::none;   // combines with both masks
  std::optional<double> scale;    // default 1/sqrt(D)
  double dropout_p = 0;           // dropout on the weights; the caller passes 0 in eval mode
  uint64_t seed = 0;              // dropout keep bit of weight (b, h, l, s) = f(seed, index)
  int64_t dropout_batch_offset = 0;  // Q's rows are batches b0... of a larger batch: b hashes as b0 + b
  // Variants (FlashAttention 2's names), combinable with each other and with everything above:
  Window window;                  // sliding window, with causal or alone
  View<const T> alibi_slopes;     // (H) or (B, H): score (l, s) gets -slope·|l + S - L - s|
  double softcap = 0;             // > 0: x = softcap·tanh(x/softcap) before biases and masks (Gemma 2)
  RelativeBias<T> relative_bias;  // T5
  Documents documents;            // packed documents / varlen
};

template <typename T>
struct SdpaOut {
  View<T> out;      // (B, H, L, Dv), any strides
  View<T> weights;  // (B, H, L, S), optional: the weights after dropout, as PyTorch returns them
  View<T> lse;      // (B, H, L), optional: log-sum-exp of the scaled masked scores; -inf on a fully masked row
};

// Gradients of sdpa; dk and dv are summed over the query heads of a GQA group.
template <typename T>
struct SdpaGrads {
  View<T> dq;  // (B, H, L, D)
  View<T> dk;  // (B, Hkv, S, D)
  View<T> dv;  // (B, Hkv, S, Dv)
  // Optional: dLoss/d(attn_mask) of an additive attn_mask, which is dS = dLoss/dscores, per element of
  // (B, H, L, S) (the caller sums it over the dims its mask broadcasts). The reference writes it.
  View<T> dmask;  // (B, H, L, S)
  // Optional: dLoss/d(relative_bias.table) (num_buckets, H), when the problem has a relative bias.
  View<T> drelative_bias;
};

// A mask resolved against (B, H, L, S): element strides, 0 on broadcast dims.
template <typename T>
struct MaskRef {
  typename Mask<T>::Kind kind = Mask<T>::Kind::none;
  const uint8_t* bools = nullptr;
  const T* bias = nullptr;
  int64_t sb = 0, sh = 0, sl = 0, ss = 0;

  bool given() const { return kind != Mask<T>::Kind::none; }
  // What the mask adds to score (b, h, l, s): 0, -inf, or the additive value.
  T at(int64_t b, int64_t h, int64_t l, int64_t s) const {
    if (kind == Mask<T>::Kind::none) return T(0);
    return value(b * sb + h * sh + l * sl + s * ss);
  }
  // dst[j·ds] += factor·at(b, h, l, s0 + j) for j < n (a bool mask adds -inf where masked, so a NaN
  // score stays NaN): one row read through its pointer and stride, no index arithmetic per element.
  void add_row(int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n, T factor, T* dst, int64_t ds) const {
    if (kind == Mask<T>::Kind::none) return;
    const int64_t off = b * sb + h * sh + l * sl + s0 * ss;
    if (kind == Mask<T>::Kind::additive) {
      for (int64_t j = 0; j < n; ++j) dst[j * ds] += factor * bias[off + j * ss];
    } else {
      for (int64_t j = 0; j < n; ++j)
        if (masked(off + j * ss)) dst[j * ds] += -std::numeric_limits<T>::infinity();
    }
  }

 private:
  bool masked(int64_t off) const { return (bools[off] != 0) == (kind == Mask<T>::Kind::drop); }
  T value(int64_t off) const {
    if (kind == Mask<T>::Kind::additive) return bias[off];
    return masked(off) ? -std::numeric_limits<T>::infinity() : T(0);
  }
};

// A run of positions of one document: queries [q0, q1), keys [k0, k1).
struct Segment {
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
};

// Positions [begin, end) (keys of a query, or queries of a key); empty when begin == end.
struct Range {
  int64_t begin = 0, end = 0;
};

// T5's bucket of distance d = s - l (transformers' _relative_position_bucket, its float32 logarithm).
int64_t relative_position_bucket(int64_t d, bool bidirectional, int64_t num_buckets, int64_t max_distance);

// A checked attention problem: the arguments, where the results go, the sizes, resolved masks and the
// semantics derived from them once. Every kernel (reference, flash; forward, backward) takes one, so
// tests and benchmarks loop over backends.
template <typename T>
struct SdpaProblem {
  SdpaArgs<T> args;
  SdpaOut<T> out;
  int64_t B = 0, H = 0, Hkv = 0, L = 0, S = 0, D = 0, Dv = 0;
  int64_t G = 1;                // query heads per KV head, H / Hkv
  double scale = 0;
  MaskRef<T> mask;              // args.attn_mask
  MaskRef<T> padding;           // args.key_padding, as a (B, 1, 1, S) mask
  uint32_t drop_threshold = 0;  // element kept iff its 32 random bits >= drop_threshold
  T keep_scale = T(1);          // 1/(1 - dropout_p): what a kept weight is multiplied by; 0 when p = 1
  // Documents, resolved: segments of every batch, and each query's and key's segment (empty: one segment
  // {0, L, 0, S} per batch).
  std::vector<Segment> segments;
  std::vector<int32_t> q_segment;  // (B, L) index into segments
  std::vector<int32_t> k_segment;  // (B, S)
  // ALiBi's slope of (b, h) at alibi[b·alibi_sb + h·alibi_sh]; relative bias by distance, (H, L + S - 1):
  // the table's value for d = s' - l' - (S' - L') at [h·(L + S - 1) + d + S - 1] (d in [1 - S, L - 1]),
  // and the bucket of each distance (L + S - 1).
  const T* alibi = nullptr;
  int64_t alibi_sb = 0, alibi_sh = 0;
  std::vector<T> relative;
  std::vector<int32_t> relative_bucket;

  // ---- GQA: query head h reads KV head kv_head(h); KV head kvh serves heads [first_head(kvh), + G). ----
  int64_t kv_head(int64_t h) const { return h / G; }
  int64_t first_head(int64_t kvh) const { return kvh * G; }
  // The flash kernels' tiles put a position's G query heads of one KV head in consecutive rows: row r
  // (from the tile's first position) is position row_position(r), query head row_head(kvh, r).
  int64_t row_position(int64_t r) const { return r / G; }
  int64_t row_head(int64_t kvh, int64_t r) const { return first_head(kvh) + r % G; }

  // ---- Which keys a query sees: causal, window and documents ----
  // The document (segment) of query (b, l) and of key (b, s).
  Segment segment_of_query(int64_t b, int64_t l) const {
    return q_segment.empty() ? Segment{0, L, 0, S} : segments[size_t(q_segment[size_t(b * L + l)])];
  }
  Segment segment_of_key(int64_t b, int64_t s) const {
    return k_segment.empty() ? Segment{0, L, 0, S} : segments[size_t(k_segment[size_t(b * S + s)])];
  }
  // Query (b, l) sees keys [begin, end): within its document, before its causal edge, inside the window.
  // begin and end never decrease as l grows (within a batch): kernels bound a tile of queries by the
  // ranges of its first and last query.
  Range keys(int64_t b, int64_t l) const {
    const Segment g = segment_of_query(b, l);
    const int64_t lq = l - g.q0, Lg = g.q1 - g.q0, Sg = g.k1 - g.k0, off = Sg - Lg;
    int64_t lo = 0, hi = causal_key_end(args.causal, lq, Lg, Sg);
    if (args.window.left >= 0) lo = std::max(lo, lq + off - args.window.left);
    if (args.window.right >= 0) hi = std::min(hi, lq + off + args.window.right + 1);
    hi = clamp(hi, 0, Sg), lo = clamp(lo, 0, hi);
    return {g.k0 + lo, g.k0 + hi};
  }
  // Key (b, s) is seen by queries [begin, end): the inverse of keys() (s in keys(b, l) iff l in queries(b, s)).
  Range queries(int64_t b, int64_t s) const {
    const Segment g = segment_of_key(b, s);
    const int64_t sk = s - g.k0, Lg = g.q1 - g.q0, Sg = g.k1 - g.k0, off = Sg - Lg;
    int64_t lo = 0, hi = Lg;  // hi(l) > sk from lo on (causal, right), lo(l) <= sk before hi (left)
    if (args.causal == Causal::top_left) lo = std::max(lo, sk);
    if (args.causal == Causal::bottom_right) lo = std::max(lo, sk - off);
    if (args.window.right >= 0) lo = std::max(lo, sk - off - args.window.right);
    if (args.window.left >= 0) hi = std::min(hi, sk - off + args.window.left + 1);
    lo = clamp(lo, 0, Lg), hi = clamp(hi, lo, Lg);
    return {g.q0 + lo, g.q0 + hi};
  }
  // Does some query see fewer than all keys beyond what causal says? (window or documents)
  bool ranged() const { return args.window.given() || !segments.empty(); }

  // ---- Score modifications: softcap, then the position biases (ALiBi, T5), in natural units ----
  bool has_softcap() const { return args.softcap > 0; }
  bool has_position_bias() const { return alibi != nullptr || !relative.empty(); }
  bool has_score_mod() const { return has_softcap() || has_position_bias(); }
  T softcapped(T x) const { return has_softcap() ? T(args.softcap) * std::tanh(x / T(args.softcap)) : x; }
  // The distance of key s from query l of one document, bottom-right aligned: s' - l' - (S' - L').
  int64_t distance(int64_t b, int64_t l, int64_t s) const {
    const Segment g = segment_of_query(b, l);
    return (s - l) - ((g.k1 - g.q1));
  }
  T alibi_slope(int64_t b, int64_t h) const { return alibi ? alibi[b * alibi_sb + h * alibi_sh] : T(0); }
  // The relative bias of head h by distance, from d = 1 - S on ((L + S - 1) values), or nullptr.
  const T* relative_row(int64_t h) const { return relative.empty() ? nullptr : relative.data() + h * (L + S - 1); }
  // What ALiBi and the relative bias add to score (b, h, l, s), s a key of l's document.
  T position_bias(int64_t b, int64_t h, int64_t l, int64_t s) const {
    const int64_t d = distance(b, l, s);
    T x = T(0);
    if (alibi) x += -alibi_slope(b, h) * T(d < 0 ? -d : d);
    if (!relative.empty()) x += relative_row(h)[d + S - 1];
    return x;
  }

  // ---- One row of scores, the plain form (the reference, weights_from_lse, the backward's columns) ----
  // x[j·ds] for keys [s0, s0 + n) of row (b, h, l): in, raw scores scale·q·k times `unit` (1, or log2(e) for
  // the log2 domain); out, the scores: softcapped, position bias and masks added (times unit), -inf outside
  // the row's keys. A NaN score stays NaN.
  void score_row(int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n, T unit, T* x, int64_t ds) const {
    const Range r = keys(b, l);
    const int64_t a = clamp(r.begin - s0, 0, n), e = clamp(r.end - s0, a, n);
    for (int64_t j = 0; j < a; ++j) x[j * ds] = -std::numeric_limits<T>::infinity();
    for (int64_t j = e; j < n; ++j) x[j * ds] = -std::numeric_limits<T>::infinity();
    if (has_softcap()) {
      const T c = T(args.softcap) * unit;
      for (int64_t j = a; j < e; ++j) x[j * ds] = c * std::tanh(x[j * ds] / c);
    }
    if (has_position_bias())
      for (int64_t j = a; j < e; ++j) x[j * ds] += unit * position_bias(b, h, l, s0 + j);
    add_bias_row(b, h, l, s0 + a, e - a, unit, x + a * ds, ds);
  }

  // ---- Masks (the key ranges are not included: see keys) ----
  bool has_bias() const { return mask.given() || padding.given(); }
  // Sum of what both masks add to score (b, h, l, s).
  T bias(int64_t b, int64_t h, int64_t l, int64_t s) const { return mask.at(b, h, l, s) + padding.at(b, h, l, s); }
  // dst[j·ds] += factor·bias(b, h, l, s0 + j) for j < n; -inf where a bool mask masks.
  void add_bias_row(int64_t b, int64_t h, int64_t l, int64_t s0, int64_t n, T factor, T* dst, int64_t ds) const {
    padding.add_row(b, h, l, s0, n, factor, dst, ds);
    mask.add_row(b, h, l, s0, n, factor, dst, ds);
  }

  // ---- Dropout on the weights (b, h, l, s) ----
  bool dropout() const { return args.dropout_p > 0; }
  // The element index the keep bit hashes: the position of (b, h, l, s) in a dense (B, H, L, S) tensor
  // (of the larger batch whose batches b0... these are, with args.dropout_batch_offset b0).
  uint64_t dropout_index(int64_t b, int64_t h, int64_t l, int64_t s) const {
    return static_cast<uint64_t>((((b + args.dropout_batch_offset) * H + h) * L + l) * S + s);
  }
  bool kept(int64_t b, int64_t h, int64_t l, int64_t s) const {
    return dropout_keep(args.seed, dropout_index(b, h, l, s), drop_threshold);
  }
  // What weight (b, h, l, s) is multiplied by after the softmax: keep_scale or 0 (1 without dropout).
  T keep_weight(int64_t b, int64_t h, int64_t l, int64_t s) const {
    if (!dropout()) return T(1);
    return kept(b, h, l, s) ? keep_scale : T(0);
  }

 private:
  static int64_t clamp(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }
};

// ---- Argument checks: make_problem's, and the entry points' (sdpa.cpp) for what they add ----

// "names = (2, 4, 7, 8)": a shape with the letters of its dims.
inline std::string dims_str(const char* names, const Shape& shape) { return cat(names, " = ", to_string(shape)); }

// An Error naming `arg` unless v is given and of rank 4 ("Expected query (B, H, L, D), but got nothing").
template <typename V>
void check_rank4(const char* arg, const char* dims, const V& v) {
  ATTN_CHECK(!v.empty(), "Expected ", arg, " ", dims, ", but got nothing instead");
  ATTN_CHECK(v.rank() == 4, "Expected ", arg, " of rank 4 ", dims, ", but got shape ", to_string(v.shape),
             " instead");
}

// An Error naming `arg` and both shapes unless v's shape is `want`.
template <typename V>
void check_shape(const char* arg, const char* dims, const V& v, const Shape& want) {
  ATTN_CHECK(v.shape == want, "Expected ", arg, " of shape ", dims_str(dims, want), ", but got ",
             to_string(v.shape), " instead");
}

// Checks every argument (ranks, shapes, GQA ratio, mask broadcast, scale, dropout) and names the
// argument and both shapes in the error; derives G, scale, the dropout threshold and keep scale.
// `out` views that are empty are not requested (out.out is required). Defined in src/kernels/problem.cpp.
template <typename T>
SdpaProblem<T> make_problem(const SdpaArgs<T>& args, const SdpaOut<T>& out);

// ---- Kernels (arguments already checked by make_problem) ----

// The oracle: obvious code, materializes each row of scores, float or double.
template <typename T>
void reference_forward(const SdpaProblem<T>& p);
// FlashAttention-2 forward, fp32 only: never materializes the weights (p.out.weights must be empty),
// writes out and, if requested, LSE. Same result for any thread count. precision bf16: Q·Kᵀ and P·V over
// bf16 pairs (Q, K, V and P rounded to bf16, fp32 sums, scale, softmax state and output; AMX's arithmetic:
// AMX, VDPBF16PS or their exact emulation, the same bits on every FMA CPU); decoding shapes (flash_decode)
// stay fp32.
void flash_forward(const SdpaProblem<float>& p, Precision precision);
inline void flash_forward(const SdpaProblem<float>& p) { flash_forward(p, Precision::f32); }
// The weights p.out.weights (B, H, L, S) of a forward whose p.out.lse is written (flash_forward's):
// keep ∘ exp(Q·Kᵀ·scale + bias − lse), one GEMM per head. Needs unit column strides of Q, K and weights.
void weights_from_lse(const SdpaProblem<float>& p);
// Tile sizes of flash_forward: keys per tile (a multiple of 64, the widest microkernel block; a constant
// of the algorithm, since the online softmax rescales at each key tile and so the keys decide the bits)
// and query rows per tile (about; rounded to whole GQA groups; they change no bits). set_flash_tiles
// forces a configuration (tests, benchmarks; forced keys give other bits), {} derives them again.
struct FlashTiles {
  int64_t keys = 0, rows = 0;
  int64_t scratch = 0;  // flash_backward only: floats of packed query rows and dQ partials held at once
};
// target: the Highway target whose tuning applies (attn/tune.h); 0 = the one dispatch chooses now.
FlashTiles flash_tiles(int64_t target = 0);
void set_flash_tiles(FlashTiles t);
// The backward oracle: recomputes the weights (reads neither p.out.out nor p.out.lse), float or double.
// dout (B, H, L, Dv); dk and dv are summed over the query heads of a GQA group.
template <typename T>
void reference_backward(const SdpaProblem<T>& p, View<const T> dout, const SdpaGrads<T>& g);
// FlashAttention-2 backward of fp32 tensors: needs p.out.out and p.out.lse from the forward. dout (B, H, L, Dv).
// Same result for any thread count. precision bf16: the five products over bf16 pairs (Q, K, V, dO, P and dS
// rounded to bf16; fp32 sums, scores, softmax, D = rowsum(dO∘O) and gradients), the same bits on every FMA
// CPU, as flash_forward's; for the LSE and output of flash_forward(p, bf16).
void flash_backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g,
                    Precision precision);
inline void flash_backward(const SdpaProblem<float>& p, View<const float> dout, const SdpaGrads<float>& g) {
  flash_backward(p, dout, g, Precision::f32);
}
// Tile sizes of flash_backward for L queries and S keys: keys per KV block (with the chunk count, it fixes
// dQ's summation order, so it comes from the sizes alone, never from the CPU), queries per tile (rounded
// up to the vector lanes by the kernel) and the scratch budget of a phase (which changes no bits).
// set_flash_backward_tiles forces any of them (tests, benchmarks), {} derives them again.
FlashTiles flash_backward_tiles(int64_t L, int64_t S);
void set_flash_backward_tiles(FlashTiles t);

}  // namespace attn
