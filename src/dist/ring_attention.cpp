// Ring attention over MPI: the layouts, the collective argument checks, the K/V ring and the LSE merge.
// No attention math of its own: every (query rows, key rows) block runs through sdpa() / sdpa_backward()
// on the flash kernel with the block's causal alignment; this file decides which blocks, moves them, and
// merges or sums what comes back.
#include "attn/ring_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "attn/sdpa.h"
#include "attn/threads.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;
constexpr float kInf = std::numeric_limits<float>::infinity();
// Message tags: K, V and key padding of a block; its dK and dV accumulators (backward).
enum Tag { kTagK = 1, kTagV, kTagMask, kTagDk, kTagDv };

// Part i of L rows split into m parts whose sizes differ by at most one (the first L % m get one more).
RowRange part(int64_t L, int64_t m, int64_t i) {
  const int64_t base = L / m, extra = L % m;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// ---- The collective checks ----

// What each rank says about its arguments, gathered on every rank so that all of them reach the same
// verdict (and throw the same error) before any block moves.
struct Signature {
  int64_t q[4], k[4], v[4];
  int64_t causal, padding, has_scale;
  double scale;
  char error[600];  // this rank's local check that failed, "" if none
};

std::string shape_of(const int64_t* s) { return to_string(Shape(s, s + 4)); }

// Everything the ring needs about the global problem, the same on every rank.
struct Plan {
  MPI_Comm comm;
  int n = 1, r = 0;
  RingLayout layout;
  int64_t B = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  std::vector<int64_t> rows;  // L_r of every rank
  int64_t L = 0, max_rows = 0, max_part = 0;
  Causal causal = Causal::none;
  typename Mask<float>::Kind padding = Mask<float>::Kind::none;

  int next() const { return (r + 1) % n; }
  int prev() const { return (r + n - 1) % n; }
  int source(int step) const { return (r + n - step % n) % n; }  // whose K/V block this rank holds at a step
};

// The local checks ring_sdpa and ring_sdpa_backward share: make_problem's (shapes, GQA, masks, scale) and
// what the ring adds (self-attention rows, no attn_mask, dropout or weights).
void check_local(const SdpaArgs<float>& a, const SdpaOut<float>& o) {
  ATTN_CHECK(!a.attn_mask.given(), "Expected no attn_mask in ring attention (a key padding mask travels with its ",
             "K/V; a (L, S) mask would not), but got attn_mask of shape ", to_string(a.attn_mask.shape()), " instead");
  ATTN_CHECK(a.dropout_p == 0, "Expected dropout_p = 0 in ring attention, but got ", a.dropout_p, " instead");
  // Variants that depend on where a query and a key are in the whole sequence: a block sees local
  // positions only. (softcap, a function of each score alone, is taken.)
  ATTN_CHECK(!a.window.given() && a.alibi_slopes.empty() && !a.relative_bias.given() && !a.documents.given(),
             "Expected no window, alibi_slopes, relative_bias or documents in ring attention (its blocks see ",
             "positions within a block, not the sequence's), but got ",
             a.window.given() ? "a window" : !a.alibi_slopes.empty() ? "alibi_slopes" :
             a.relative_bias.given() ? "a relative_bias" : "documents", " instead (softcap is supported)");
  ATTN_CHECK(o.weights.empty(), "Expected no weights output from ring attention (flash never materializes them), ",
             "but got weights of shape ", to_string(o.weights.shape), " instead");
  make_problem(a, o);
  ATTN_CHECK(a.k.size(2) == a.q.size(2), "Expected key rows L_r = ", a.q.size(2), " as in query ", to_string(a.q.shape),
             " (ring attention splits one sequence: each rank's K/V rows are its Q rows), but got key ",
             to_string(a.k.shape), " instead");
}

template <typename V>
void check_like(const char* arg, const V& v, const char* like_arg, const Shape& like) {
  ATTN_CHECK(!v.empty() && v.shape == like, "Expected ", arg, " of shape ", to_string(like), " as ", like_arg,
             ", but got ", v.empty() ? std::string("nothing") : to_string(v.shape), " instead");
}

// Runs `local_checks` on this rank, gathers every rank's signature and checks them against each other
// and the layout. Collective: the same Error on every rank, or the same Plan.
template <typename F>
Plan make_plan(const SdpaArgs<float>& a, MPI_Comm comm, RingLayout layout, F&& local_checks) {
  Plan p;
  p.comm = comm, p.layout = layout, p.n = dist::size(comm), p.r = dist::rank(comm);
  Signature mine{};
  try {
    local_checks();
  } catch (const Error& e) {
    std::strncpy(mine.error, e.what(), sizeof(mine.error) - 1);
  }
  for (int i = 0; i < 4; ++i) {
    mine.q[i] = a.q.rank() == 4 ? a.q.shape[i] : -1;
    mine.k[i] = a.k.rank() == 4 ? a.k.shape[i] : -1;
    mine.v[i] = a.v.rank() == 4 ? a.v.shape[i] : -1;
  }
  mine.causal = int64_t(a.causal == Causal::none ? 0 : 1);  // bottom_right is top_left when L = S
  mine.padding = int64_t(a.key_padding.kind);
  mine.has_scale = a.scale.has_value(), mine.scale = a.scale.value_or(0);
  std::vector<Signature> all(size_t(p.n));
  dist::check(MPI_Allgather(&mine, sizeof(Signature), MPI_BYTE, all.data(), sizeof(Signature), MPI_BYTE, comm),
              "ring attention: MPI_Allgather of the local shapes");
  for (int i = 0; i < p.n; ++i)
    ATTN_CHECK(all[i].error[0] == 0, "ring attention: rank ", i, " of ", p.n, ": ", all[i].error);
  const Signature& s0 = all[0];
  for (int i = 1; i < p.n; ++i) {
    const Signature& s = all[i];
    ATTN_CHECK(
        s.q[0] == s0.q[0] && s.q[1] == s0.q[1] && s.q[3] == s0.q[3] && s.k[1] == s0.k[1] && s.v[3] == s0.v[3],
        "ring attention: Expected the same B, H, Hkv, D and Dv on every rank (only L_r may differ), but got query ",
        shape_of(s.q), ", key ", shape_of(s.k), ", value ", shape_of(s.v), " on rank ", i, " and query ",
        shape_of(s0.q), ", key ", shape_of(s0.k), ", value ", shape_of(s0.v), " on rank 0 instead");
    ATTN_CHECK(s.causal == s0.causal && s.padding == s0.padding && s.has_scale == s0.has_scale && s.scale == s0.scale,
               "ring attention: Expected the same causal, key padding kind and scale on every rank, but got causal ",
               s.causal, ", padding kind ", s.padding, ", scale ", s.has_scale ? std::to_string(s.scale) : "default",
               " on rank ", i, " and ", s0.causal, ", ", s0.padding, ", ",
               s0.has_scale ? std::to_string(s0.scale) : "default", " on rank 0 instead");
  }
  p.B = s0.q[0], p.H = s0.q[1], p.D = s0.q[3], p.Hkv = s0.k[1], p.Dv = s0.v[3];
  for (const Signature& s : all) p.rows.push_back(s.q[2]), p.L += s.q[2];
  for (int i = 0; i < p.n; ++i) {
    const int64_t want = ring_local_length(p.L, i, p.n, layout);
    ATTN_CHECK(p.rows[i] == want, "ring attention: Expected rank ", i, " of ", p.n, " to hold L_r = ", want,
               " rows of the ", to_string(layout), " layout of L = ", p.L,
               " rows (the sum over the ranks), but got query ", shape_of(all[i].q), " instead");
  }
  p.max_rows = *std::max_element(p.rows.begin(), p.rows.end());
  for (int i = 0; i < p.n; ++i)
    for (const RowRange& g : ring_rows(p.L, i, p.n, layout)) p.max_part = std::max(p.max_part, g.size);
  const int64_t biggest = p.B * p.Hkv * p.max_rows * std::max(p.D, p.Dv);
  ATTN_CHECK(biggest <= std::numeric_limits<int>::max(),
             "ring attention: Expected K/V blocks of at most 2^31 - 1 elements (one MPI ",
             "message each), but got (B, Hkv, L_r, D) = ", to_string({p.B, p.Hkv, p.max_rows, std::max(p.D, p.Dv)}),
             " instead");
  p.causal = s0.causal ? Causal::top_left : Causal::none;
  p.padding = a.key_padding.kind;
  return p;
}

// ---- Which blocks of (query rows, key rows) are computed ----

// One kernel call: query rows [q.begin, +q.size) of this rank's Q against rows [k.begin, +k.size) of the
// K/V block in hand, both in local row numbers, with the causal alignment that block needs.
struct Pair {
  RowRange q, k;
  Causal causal;
};

// The visible pairs of global row ranges. Ranges of one layout are equal or disjoint, so under causal
// masking a pair is fully visible (every key before every query), fully masked (skipped) or the same
// range on both sides (causal within it, top-left). Fixed order: this rank's ranges, then the block's.
std::vector<Pair> visible_pairs(const std::vector<RowRange>& qs, const std::vector<RowRange>& ks, Causal causal) {
  std::vector<Pair> pairs;
  int64_t qo = 0;
  for (const RowRange& q : qs) {
    int64_t ko = 0;
    for (const RowRange& k : ks) {
      const RowRange ql{qo, q.size}, kl{ko, k.size};
      ko += k.size;
      if (q.size == 0 || k.size == 0) continue;
      if (causal == Causal::none || k.begin + k.size <= q.begin + 1) pairs.push_back({ql, kl, Causal::none});
      else if (k.begin == q.begin && k.size == q.size) pairs.push_back({ql, kl, Causal::top_left});
      else if (k.begin < q.begin + q.size) throw Error("ring attention: internal error, ranges that overlap in part");
    }
    qo += q.size;
  }
  return pairs;
}

// ---- The K/V block in flight ----

// One rank's K/V rows and key padding, contiguous: k (B, Hkv, rows, D), v (B, Hkv, rows, Dv), padding
// (B, rows) as bools or floats, in buffers sized for the largest L_r.
struct Block {
  Tensor k, v, bias;
  TensorT<uint8_t> bools;
  int64_t rows = 0;

  explicit Block(const Plan& p)
      : k(Tensor::uninitialized({p.B * p.Hkv * p.max_rows * p.D})),
        v(Tensor::uninitialized({p.B * p.Hkv * p.max_rows * p.Dv})),
        bias(Tensor::uninitialized({p.padding == Mask<float>::Kind::additive ? p.B * p.max_rows : 0})),
        bools(TensorT<uint8_t>::uninitialized(
            {p.padding == Mask<float>::Kind::keep || p.padding == Mask<float>::Kind::drop ? p.B * p.max_rows : 0})) {}

  int64_t bytes() const { return 4 * (k.numel() + v.numel() + bias.numel()) + bools.numel(); }
  View<float> kv(const Tensor& t, const Plan& p, int64_t d) const {
    return {const_cast<float*>(t.data()), {p.B, p.Hkv, rows, d}};
  }
  View<float> keys(const Plan& p) const { return kv(k, p, p.D); }
  View<float> values(const Plan& p) const { return kv(v, p, p.Dv); }
  // The key padding of key rows [k.begin, +k.size) of the block, of the plan's kind.
  Mask<float> padding(const Plan& p, RowRange r) const {
    const Shape shape = {p.B, r.size}, strides = {rows, 1};
    switch (p.padding) {
      case Mask<float>::Kind::keep: return Mask<float>::keep({bools.data() + r.begin, shape, strides});
      case Mask<float>::Kind::drop: return Mask<float>::drop({bools.data() + r.begin, shape, strides});
      case Mask<float>::Kind::additive: return Mask<float>::additive({bias.data() + r.begin, shape, strides});
      case Mask<float>::Kind::none: break;
    }
    return {};
  }

  void load(const SdpaArgs<float>& a, const Plan& p) {
    rows = a.k.size(2);
    copy(a.k, keys(p));
    copy(a.v, values(p));
    const Mask<float>& m = a.key_padding;
    if (m.kind == Mask<float>::Kind::additive) copy(m.bias, View<float>(bias.data(), {p.B, rows}));
    else if (m.given()) copy(m.bools, View<uint8_t>(bools.data(), {p.B, rows}));
  }
};

// Non-blocking sends and receives of one step, waited for together.
struct Requests {
  std::vector<MPI_Request> reqs;
  RingStats* stats;

  template <typename T>
  void send(const T* data, int64_t count, int to, int tag, MPI_Comm comm) {
    reqs.emplace_back();
    dist::check(MPI_Isend(data, int(count * sizeof(T)), MPI_BYTE, to, tag, comm, &reqs.back()),
                "ring attention: MPI_Isend");
    if (stats) stats->sent_bytes += count * int64_t(sizeof(T));
  }
  template <typename T>
  void recv(T* data, int64_t count, int from, int tag, MPI_Comm comm) {
    reqs.emplace_back();
    dist::check(MPI_Irecv(data, int(count * sizeof(T)), MPI_BYTE, from, tag, comm, &reqs.back()),
                "ring attention: MPI_Irecv");
  }
  void wait() {
    const auto t0 = Clock::now();
    if (!reqs.empty())
      dist::check(MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "ring attention: MPI_Waitall");
    reqs.clear();
    if (stats) stats->wait_s += std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

// Sends `from` to the next rank and receives the previous rank's block (of rows `rows`) into `to`.
void pass_block(const Plan& p, const Block& from, Block& to, int64_t rows, Requests& req) {
  to.rows = rows;
  req.send(from.k.data(), p.B * p.Hkv * from.rows * p.D, p.next(), kTagK, p.comm);
  req.send(from.v.data(), p.B * p.Hkv * from.rows * p.Dv, p.next(), kTagV, p.comm);
  req.recv(to.k.data(), p.B * p.Hkv * rows * p.D, p.prev(), kTagK, p.comm);
  req.recv(to.v.data(), p.B * p.Hkv * rows * p.Dv, p.prev(), kTagV, p.comm);
  if (p.padding == Mask<float>::Kind::additive) {
    req.send(from.bias.data(), p.B * from.rows, p.next(), kTagMask, p.comm);
    req.recv(to.bias.data(), p.B * rows, p.prev(), kTagMask, p.comm);
  } else if (p.padding != Mask<float>::Kind::none) {
    req.send(from.bools.data(), p.B * from.rows, p.next(), kTagMask, p.comm);
    req.recv(to.bools.data(), p.B * rows, p.prev(), kTagMask, p.comm);
  }
}

// The arguments of one kernel call: query rows pair.q of this rank, key rows pair.k of the block.
SdpaArgs<float> pair_args(const SdpaArgs<float>& local, const Plan& p, const Block& blk, const Pair& pr) {
  SdpaArgs<float> a;
  a.q = local.q.narrow(2, pr.q.begin, pr.q.size);
  a.k = View<const float>(blk.keys(p)).narrow(2, pr.k.begin, pr.k.size);
  a.v = View<const float>(blk.values(p)).narrow(2, pr.k.begin, pr.k.size);
  a.key_padding = blk.padding(p, pr.k);
  a.causal = pr.causal;
  a.scale = local.scale;
  a.softcap = local.softcap;  // a function of each score alone: the same in every block
  return a;
}

// (B, X, rows, d) at the start of a contiguous scratch buffer.
View<float> scratch(Tensor& t, int64_t B, int64_t X, int64_t rows, int64_t d) { return {t.data(), {B, X, rows, d}}; }

template <typename T>
T* row_ptr(const View<T>& v, int64_t b, int64_t h, int64_t l) {
  return v.data + b * v.strides[0] + h * v.strides[1] + l * v.strides[2];
}

// (o, lse) ← the log-sum-exp merge of (o, lse) and (o2, lse2), per row of (B, H, rows):
//   m = max(lse, lse2); lse = m + log(e^(lse − m) + e^(lse2 − m)); o = (e^(lse − m)·o + e^(lse2 − m)·o2) / Σ
// the LSE form of flash's MergeChunks. Both −inf (no visible key yet): o 0, lse −inf.
void merge(View<float> o, View<float> lse, View<const float> o2, View<const float> lse2) {
  const int64_t B = o.shape[0], H = o.shape[1], rows = o.shape[2], Dv = o.shape[3];
  parallel_items(B * H, rows * (Dv * 3 + 20), [&](int64_t bh, int) {  // per row: 2 exps, a log, 3 flops per column
    const int64_t b = bh / H, h = bh % H;
    for (int64_t l = 0; l < rows; ++l) {
      float* lp = lse.data + b * lse.strides[0] + h * lse.strides[1] + l * lse.strides[2];
      const float la = *lp, lb = lse2.data[b * lse2.strides[0] + h * lse2.strides[1] + l * lse2.strides[2]];
      const float m = std::max(la, lb);
      float* dst = row_ptr(o, b, h, l);
      const float* src = row_ptr(o2, b, h, l);
      if (m == -kInf) {  // fully masked so far: −inf − −inf would be NaN; keep out 0, lse −inf
        for (int64_t e = 0; e < Dv; ++e) dst[e * o.strides[3]] = 0.f;
        continue;
      }
      const float wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
      const float ca = wa / sum, cb = wb / sum;
      for (int64_t e = 0; e < Dv; ++e) dst[e * o.strides[3]] = ca * dst[e * o.strides[3]] + cb * src[e * o2.strides[3]];
      *lp = m + std::log(sum);
    }
  });
}

// dst += src, elementwise over (B, X, rows, d) views.
void add_into(View<float> dst, View<const float> src) {
  const int64_t B = dst.shape[0], X = dst.shape[1], rows = dst.shape[2], d = dst.shape[3];
  parallel_items(B * X, rows * d, [&](int64_t bx, int) {  // one add per element
    const int64_t b = bx / X, x = bx % X;
    for (int64_t l = 0; l < rows; ++l) {
      float* o = row_ptr(dst, b, x, l);
      const float* s = row_ptr(src, b, x, l);
      for (int64_t e = 0; e < d; ++e) o[e * dst.strides[3]] += s[e * src.strides[3]];
    }
  });
}

void fill(View<float> v, float x) {
  for (int64_t a = 0; a < v.shape[0]; ++a)
    for (int64_t b = 0; b < v.shape[1]; ++b)
      for (int64_t c = 0; c < v.shape[2]; ++c) {
        float* row = v.data + a * v.strides[0] + b * v.strides[1] + c * v.strides[2];
        for (int64_t d = 0; d < v.shape[3]; ++d) row[d * v.strides[3]] = x;
      }
}

// A (B, H, L) view as (B, H, L, 1), so the helpers above take it.
template <typename T>
View<T> as4(View<T> lse) {
  return {lse.data, {lse.shape[0], lse.shape[1], lse.shape[2], 1}, {lse.strides[0], lse.strides[1], lse.strides[2], 1}};
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const SdpaOptions kFlash{Backend::flash, false};

}  // namespace

const char* to_string(RingLayout layout) { return layout == RingLayout::zigzag ? "zigzag" : "contiguous"; }

std::vector<RowRange> ring_rows(int64_t L, int rank, int n, RingLayout layout) {
  ATTN_CHECK(n > 0 && rank >= 0 && rank < n && L >= 0,
             "Expected a rank in [0, n) of n > 0 ranks and L >= 0, but got rank ", rank, " of ", n, " and L = ", L,
             " instead");
  if (layout == RingLayout::contiguous) return {part(L, n, rank)};
  return {part(L, 2 * n, rank), part(L, 2 * n, 2 * n - 1 - rank)};
}

int64_t ring_local_length(int64_t L, int rank, int n, RingLayout layout) {
  int64_t rows = 0;
  for (const RowRange& r : ring_rows(L, rank, n, layout)) rows += r.size;
  return rows;
}

template <typename T>
void ring_take(View<const T> full, View<T> local, int seq_dim, int rank, int n, RingLayout layout) {
  int64_t at = 0;
  for (const RowRange& r : ring_rows(full.size(seq_dim), rank, n, layout)) {
    copy(full.narrow(seq_dim, r.begin, r.size), local.narrow(seq_dim, at, r.size));
    at += r.size;
  }
  ATTN_CHECK(at == local.size(seq_dim), "Expected local rows L_r = ", at, " along dim ", seq_dim, ", but got shape ",
             to_string(local.shape), " instead");
}

template <typename T>
void ring_put(View<const T> local, View<T> full, int seq_dim, int rank, int n, RingLayout layout) {
  int64_t at = 0;
  for (const RowRange& r : ring_rows(full.size(seq_dim), rank, n, layout)) {
    copy(local.narrow(seq_dim, at, r.size), full.narrow(seq_dim, r.begin, r.size));
    at += r.size;
  }
  ATTN_CHECK(at == local.size(seq_dim), "Expected local rows L_r = ", at, " along dim ", seq_dim, ", but got shape ",
             to_string(local.shape), " instead");
}

template void ring_take(View<const float>, View<float>, int, int, int, RingLayout);
template void ring_take(View<const double>, View<double>, int, int, int, RingLayout);
template void ring_take(View<const uint8_t>, View<uint8_t>, int, int, int, RingLayout);
template void ring_put(View<const float>, View<float>, int, int, int, RingLayout);
template void ring_put(View<const double>, View<double>, int, int, int, RingLayout);
template void ring_put(View<const uint8_t>, View<uint8_t>, int, int, int, RingLayout);

// Forward. Step t: this rank holds the K/V block of rank source(t); it passes that block on while it
// runs the flash kernel on the block's visible pairs and merges each (o, lse) into the running result.
void ring_sdpa(const SdpaArgs<float>& local, const SdpaOut<float>& out, MPI_Comm comm, RingLayout layout,
               RingStats* stats) {
  const Plan p = make_plan(local, comm, layout, [&] { check_local(local, out); });
  RingStats st;
  Block blocks[2] = {Block(p), Block(p)};
  Tensor o_s = Tensor::uninitialized({p.B * p.H * p.max_part * p.Dv}),
         lse_s = Tensor::uninitialized({p.B * p.H * p.max_part});
  Tensor lse_own = Tensor::uninitialized({out.lse.empty() ? p.B * p.H * p.rows[p.r] : 0});
  st.scratch_bytes = 2 * blocks[0].bytes() + 4 * (o_s.numel() + lse_s.numel() + lse_own.numel());
  const View<float> lse = out.lse.empty() ? View<float>(lse_own.data(), {p.B, p.H, p.rows[p.r]}) : out.lse;
  fill(out.out, 0.f);
  fill(as4(lse), -kInf);
  blocks[0].load(local, p);
  const std::vector<RowRange> mine = ring_rows(p.L, p.r, p.n, layout);
  Requests req{{}, &st};
  for (int t = 0, cur = 0; t < p.n; ++t, cur ^= 1) {
    if (t + 1 < p.n) pass_block(p, blocks[cur], blocks[cur ^ 1], p.rows[p.source(t + 1)], req);
    const auto t0 = Clock::now();
    for (const Pair& pr : visible_pairs(mine, ring_rows(p.L, p.source(t), p.n, layout), p.causal)) {
      const View<float> o2 = scratch(o_s, p.B, p.H, pr.q.size, p.Dv), l2(lse_s.data(), {p.B, p.H, pr.q.size});
      sdpa(pair_args(local, p, blocks[cur], pr), SdpaOut<float>{o2, {}, l2}, kFlash);
      merge(out.out.narrow(2, pr.q.begin, pr.q.size), as4(lse.narrow(2, pr.q.begin, pr.q.size)), o2, as4(l2));
    }
    st.compute_s += since(t0);
    req.wait();
  }
  if (stats) *stats = st;
}

// Backward, FlashAttention-2 style from the global out and lse: P of every block is exact from them, so
// each pair's sdpa_backward gives its share of dQ, dK and dV. dQ stays; the block's dK/dV accumulator
// arrives from the previous rank, gets this rank's share, and goes on to the next; after N steps it is home.
void ring_sdpa_backward(const SdpaArgs<float>& local, View<const float> out, View<const float> lse,
                        View<const float> dout, const SdpaGrads<float>& grads, MPI_Comm comm, RingLayout layout,
                        RingStats* stats) {
  auto writable = [](View<const float> x) { return View<float>(const_cast<float*>(x.data), x.shape, x.strides); };
  const Plan p = make_plan(local, comm, layout, [&] {
    ATTN_CHECK(!lse.empty(), "Expected lse (B, H, L_r) from ring_sdpa, but got nothing instead");
    check_local(local, {writable(out), {}, writable(lse)});
    check_like("dout", dout, "out", out.shape);
    check_like("dq", grads.dq, "query", local.q.shape);
    check_like("dk", grads.dk, "key", local.k.shape);
    check_like("dv", grads.dv, "value", local.v.shape);
  });
  RingStats st;
  Block blocks[2] = {Block(p), Block(p)};
  const int64_t kv_k = p.B * p.Hkv * p.max_rows * p.D, kv_v = p.B * p.Hkv * p.max_rows * p.Dv;
  // acc: the dK/dV accumulators in flight (one received, one being sent); dq_s, dk_s, dv_s: one pair's
  // gradients (the kernel writes, it does not add).
  Tensor acc_k[2] = {Tensor::uninitialized({kv_k}), Tensor::uninitialized({kv_k})};
  Tensor acc_v[2] = {Tensor::uninitialized({kv_v}), Tensor::uninitialized({kv_v})};
  Tensor dq_s = Tensor::uninitialized({p.B * p.H * p.max_part * p.D});
  Tensor dk_s = Tensor::uninitialized({p.B * p.Hkv * p.max_part * p.D}),
         dv_s = Tensor::uninitialized({p.B * p.Hkv * p.max_part * p.Dv});
  st.scratch_bytes = 2 * blocks[0].bytes() + 4 * (2 * (kv_k + kv_v) + dq_s.numel() + dk_s.numel() + dv_s.numel());
  fill(grads.dq, 0.f);
  blocks[0].load(local, p);
  const std::vector<RowRange> mine = ring_rows(p.L, p.r, p.n, layout);
  Requests req{{}, &st}, acc_req{{}, &st}, acc_sent{{}, &st};
  for (int t = 0, cur = 0; t < p.n; ++t, cur ^= 1) {
    const int src = p.source(t);
    const int64_t rows = p.rows[src];
    const View<float> ak = scratch(acc_k[t % 2], p.B, p.Hkv, rows, p.D),
                      av = scratch(acc_v[t % 2], p.B, p.Hkv, rows, p.Dv);
    if (t + 1 < p.n) pass_block(p, blocks[cur], blocks[cur ^ 1], p.rows[p.source(t + 1)], req);
    if (t > 0) {
      acc_req.recv(ak.data, ak.numel(), p.prev(), kTagDk, p.comm);
      acc_req.recv(av.data, av.numel(), p.prev(), kTagDv, p.comm);
    }
    // acc = what the ranks before this one summed (in ring order from the block's home; 0 at home), then
    // this rank's shares added in pair order. It is awaited after the first kernel call, so it arrives
    // while that runs.
    bool have_acc = false;
    auto await_acc = [&] {
      if (have_acc) return;
      have_acc = true;
      if (t > 0) return acc_req.wait();
      fill(ak, 0.f);
      fill(av, 0.f);
    };
    const auto t0 = Clock::now();
    const double waited = st.wait_s;
    for (const Pair& pr : visible_pairs(mine, ring_rows(p.L, src, p.n, layout), p.causal)) {
      const View<float> dq2 = scratch(dq_s, p.B, p.H, pr.q.size, p.D);
      const View<float> dk2 = scratch(dk_s, p.B, p.Hkv, pr.k.size, p.D),
                        dv2 = scratch(dv_s, p.B, p.Hkv, pr.k.size, p.Dv);
      sdpa_backward(pair_args(local, p, blocks[cur], pr), out.narrow(2, pr.q.begin, pr.q.size),
                    lse.narrow(2, pr.q.begin, pr.q.size), dout.narrow(2, pr.q.begin, pr.q.size), {dq2, dk2, dv2},
                    kFlash);
      add_into(grads.dq.narrow(2, pr.q.begin, pr.q.size), dq2);
      await_acc();
      add_into(ak.narrow(2, pr.k.begin, pr.k.size), dk2);
      add_into(av.narrow(2, pr.k.begin, pr.k.size), dv2);
    }
    await_acc();  // a block with no visible pair passes its accumulator on as it came
    st.compute_s += since(t0) - (st.wait_s - waited);
    acc_sent.wait();  // the other accumulator's send (step t - 1), before it receives at step t + 1
    acc_sent.send(ak.data, ak.numel(), p.next(), kTagDk, p.comm);
    acc_sent.send(av.data, av.numel(), p.next(), kTagDv, p.comm);
    req.wait();
  }
  // This rank's own block comes home from the previous rank, every rank's share added.
  const View<float> hk = scratch(acc_k[p.n % 2], p.B, p.Hkv, p.rows[p.r], p.D),
                    hv = scratch(acc_v[p.n % 2], p.B, p.Hkv, p.rows[p.r], p.Dv);
  acc_req.recv(hk.data, hk.numel(), p.prev(), kTagDk, p.comm);
  acc_req.recv(hv.data, hv.numel(), p.prev(), kTagDv, p.comm);
  acc_req.wait();
  acc_sent.wait();
  copy(View<const float>(hk), grads.dk);
  copy(View<const float>(hv), grads.dv);
  if (stats) *stats = st;
}

}  // namespace attn
