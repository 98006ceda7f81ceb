// Ring attention (context parallelism) over MPI: SDPA whose Q, K and V are split along the sequence
// across the ranks of a communicator. Each rank keeps its Q rows; the K/V blocks (with their key padding)
// travel around the ring, one step per rank, sent and received without blocking while the flash kernel
// runs on the block in hand, and each rank merges its partial (out, LSE) pairs with the log-sum-exp.
// The backward (FlashAttention-2 style, from the global out and LSE) keeps dQ at home and sends dK/dV
// around the ring with their K/V; they arrive home after N steps. Not a kernel: every block runs through
// sdpa() / sdpa_backward() on the flash backend, so the semantics are SdpaProblem's.
//
// Self-attention over one sequence of L rows: every rank's K/V rows are the same global rows as its Q
// rows (L = S). The layout says which rows a rank holds (ring_rows); zigzag balances causal work.
// Present only when attn was built with MPI (attn/dist.h).
#pragma once
#include <cstdint>
#include <vector>

#include "attn/dist.h"
#include "attn/kernels/problem.h"

namespace attn {

// contiguous: rank r holds the r-th of N near-equal parts of the sequence (causal work grows with r).
// zigzag: the sequence in 2N near-equal parts; rank r holds parts r and 2N-1-r, so with causal masking
// every rank sees the same number of (query, key) pairs. Parts differ in size by at most one row.
enum class RingLayout { contiguous, zigzag };
const char* to_string(RingLayout layout);

// Global rows [begin, begin + size).
struct RowRange {
  int64_t begin = 0, size = 0;
};

// The global rows rank `rank` of `n` holds, in local order (local row 0 is the first range's begin).
std::vector<RowRange> ring_rows(int64_t L, int rank, int n, RingLayout layout);
// Σ size of ring_rows: how many rows L_r that rank holds.
int64_t ring_local_length(int64_t L, int rank, int n, RingLayout layout);

// Copies the rows a rank holds of `full` (the global sequence along dim `seq_dim`, L rows) into `local`
// (L_r rows along that dim, other dims equal), and back: for tests and for users who start from whole
// tensors. T: float, double, uint8_t (bool masks).
template <typename T>
void ring_take(View<const T> full, View<T> local, int seq_dim, int rank, int n, RingLayout layout);
template <typename T>
void ring_put(View<const T> local, View<T> full, int seq_dim, int rank, int n, RingLayout layout);

// Where the time of one call went, on this rank (for `attn bench --ring`).
struct RingStats {
  double compute_s = 0;   // in sdpa()/sdpa_backward() and the merges
  double wait_s = 0;      // waiting for blocks that had not arrived (communication not hidden by compute)
  int64_t sent_bytes = 0;
  int64_t scratch_bytes = 0;  // buffers allocated beyond the caller's tensors
};

// Collective over `comm`: every rank calls it with its local rows (L_r = ring_local_length(L, rank, N,
// layout), L = Σ L_r over the ranks):
//   local.q (B, H, L_r, D), local.k (B, Hkv, L_r, D), local.v (B, Hkv, L_r, Dv), and optionally
//   local.key_padding (B, L_r) (any mask kind; it travels with its K/V);
//   out.out (B, H, L_r, Dv) and optionally out.lse (B, H, L_r) get this rank's rows of sdpa() over the
//   whole sequence. causal: none or top_left (bottom_right is the same here, as L = S).
// Not supported (an error): attn_mask (use key_padding), dropout, weights. Float32 on the flash kernel.
// Bad input on any rank (a local shape, or local shapes that disagree between ranks or with the layout)
// gives the same attn::Error on every rank, before any block is sent.
void ring_sdpa(const SdpaArgs<float>& local, const SdpaOut<float>& out, MPI_Comm comm,
               RingLayout layout = RingLayout::zigzag, RingStats* stats = nullptr);

// Gradients of ring_sdpa: as sdpa_backward with this rank's rows of out and lse (B, H, L_r) from
// ring_sdpa, dout (B, H, L_r, Dv); grads.dq (B, H, L_r, D), dk (B, Hkv, L_r, D), dv (B, Hkv, L_r, Dv)
// get this rank's rows of the gradients over the whole sequence. Collective, same checks as ring_sdpa.
// Each rank's partial dK/dV are summed in ring order starting at their home rank, so the bits do not
// depend on timing or thread count.
void ring_sdpa_backward(const SdpaArgs<float>& local, View<const float> out, View<const float> lse,
                        View<const float> dout, const SdpaGrads<float>& grads, MPI_Comm comm,
                        RingLayout layout = RingLayout::zigzag, RingStats* stats = nullptr);

}  // namespace attn
