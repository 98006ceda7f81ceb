// `attn bench`: attention time, GFLOP/s, fraction of this run's sgemm rate and of the measured FMA peak,
// and peak memory, for the reference and flash backends over growing L (with --backward, the flash
// backward too); with --ring, ring attention over the ranks of mpirun beside
// the single-process flash kernel at the same per-rank work. A measurement tool, not a test: numbers go to
// BENCHMARKS.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "attn/gemm.h"
#include "attn/info.h"
#include "attn/memstat.h"
#include "attn/param.h"
#include "attn/rng.h"
#include "attn/sdpa.h"
#include "attn/threads.h"
#include "cli.h"
#ifdef ATTN_HAVE_MPI
#include "attn/ring_attention.h"
#endif

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;

// Median wall time of `reps` runs of f, in seconds, after one warm-up run.
template <typename F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double sgemm_gflops(int reps) {
  const int64_t n = 2048;
  Tensor a = init::randn({n, n}, 1), b = init::randn({n, n}, 2), c({n, n});
  double s =
      median_seconds(reps, [&] { gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); });
  return 2.0 * n * n * n / s * 1e-9;
}

struct Case {
  const char* name;
  int64_t B, H, Hkv, L, S, D;
  Causal causal;
  // --variants: a window, ALiBi, softcap, documents of equal length
  Window window = {};
  bool alibi = false;
  double softcap = 0;
  int64_t docs = 0;
};

// The case's variants on its arguments; slopes and ids are kept by the caller.
void set_variants(const Case& c, SdpaArgs<float>& a, Tensor& slopes, std::vector<int64_t>& ids) {
  a.causal = c.causal, a.window = c.window, a.softcap = c.softcap;
  if (c.alibi) {
    slopes = Tensor({c.H});
    for (int64_t h = 0; h < c.H; ++h) slopes.data()[h] = std::exp2(-8.0f * float(h + 1) / float(c.H));
    a.alibi_slopes = slopes.view();
  }
  if (c.docs) {
    ids.resize(size_t(c.B * c.L));
    for (int64_t i = 0; i < c.B * c.L; ++i) ids[size_t(i)] = (i % c.L) * c.docs / c.L;
    a.documents.ids = View<const int64_t>(ids.data(), {c.B, c.L});
  }
}

// FLOPs of the forward: 4·D per (query, key) pair a query sees, summed over the rows (sdpa_forward_flops'
// count, exact for windows and documents: the pairs outside them are not work).
double forward_flops(const Case& c) {
  if (!c.window.given() && !c.docs) return sdpa_forward_flops(c.B, c.H, c.L, c.S, c.D, c.causal);
  Tensor q({1, 1, c.L, 1}), k({1, 1, c.S, 1}), o({1, 1, c.L, 1}), slopes;
  std::vector<int64_t> ids;
  SdpaArgs<float> a{q, k, k};
  Case one = c;
  one.B = 1, one.H = 1, one.alibi = false;
  set_variants(one, a, slopes, ids);
  const SdpaProblem<float> p = make_problem(a, SdpaOut<float>{o});
  double pairs = 0;
  for (int64_t l = 0; l < c.L; ++l) pairs += double(p.keys(0, l).end - p.keys(0, l).begin);
  return 4.0 * double(c.B) * double(c.H) * pairs * double(c.D);
}

// "97%": the share of (query, key) tiles the flash forward never computes (causal, windows, documents).
std::string skipped(const SdpaArgs<float>& a, const SdpaOut<float>& o) {
  return cat(flash_tile_count(make_problem(a, o)).skipped_percent(), "%");
}

// The two ceilings a kernel's rate is stated against: this run's sgemm and the FMA peak.
struct Ceilings {
  double sgemm, fma;  // GFLOP/s
};

// One row of the table: seconds, GFLOP/s against both ceilings, MB beyond inputs and outputs, and the share
// of tiles never computed (variants).
void print_row(const Case& c, const char* backend, double s, double gf, const Ceilings& peak, double extra_mb,
               const std::string& skip = "-") {
  std::printf("%-10s %6lld %6lld %3lld/%-3lld %4lld  %-9s %10.2f %8.1f %6.0f%% %5.0f%% %9.1f %8s\n", c.name,
              (long long)c.L, (long long)c.S, (long long)c.H, (long long)c.Hkv, (long long)c.D, backend, s * 1e3,
              gf, 100 * gf / peak.sgemm, 100 * gf / peak.fma, extra_mb, skip.c_str());
  std::fflush(stdout);
}

void run_case(const Case& c, Backend backend, const Ceilings& peak, int reps) {
  Tensor q = init::randn({c.B, c.H, c.L, c.D}, 3), k = init::randn({c.B, c.Hkv, c.S, c.D}, 4),
         v = init::randn({c.B, c.Hkv, c.S, c.D}, 5), out({c.B, c.H, c.L, c.D}), slopes;
  std::vector<int64_t> ids;
  SdpaArgs<float> args{q, k, v};
  set_variants(c, args, slopes, ids);
  SdpaOut<float> o{out};
  const int64_t base = rss_bytes();
  reset_peak_rss();
  double s = median_seconds(reps, [&] { sdpa(args, o, {backend, false}); });
  double extra_mb = double(std::max<int64_t>(0, peak_rss_bytes() - base)) / 1e6;
  double gf = forward_flops(c) / s * 1e-9;
  print_row(c, to_string(backend), s, gf, peak, extra_mb, backend == Backend::flash ? skipped(args, o) : "-");
}

// The flash backward of case c: time, GFLOP/s (2.5x the forward's FLOPs: five products instead of two)
// and the peak memory beyond its inputs (Q, K, V, out, LSE, dO) and outputs (dQ, dK, dV), all allocated
// and written before the high-water mark is reset: the kernel's own scratch.
void run_backward_case(const Case& c, const Ceilings& peak, int reps) {
  Tensor q = init::randn({c.B, c.H, c.L, c.D}, 3), k = init::randn({c.B, c.Hkv, c.S, c.D}, 4),
         v = init::randn({c.B, c.Hkv, c.S, c.D}, 5), dout = init::randn({c.B, c.H, c.L, c.D}, 6);
  Tensor out({c.B, c.H, c.L, c.D}), lse({c.B, c.H, c.L}), dq({c.B, c.H, c.L, c.D}), dk({c.B, c.Hkv, c.S, c.D}),
         dv({c.B, c.Hkv, c.S, c.D}), slopes;
  std::vector<int64_t> ids;
  SdpaArgs<float> args{q, k, v};
  set_variants(c, args, slopes, ids);
  sdpa(args, SdpaOut<float>{out, {}, lse}, {Backend::flash, false});
#ifdef __GLIBC__
  malloc_trim(0);  // the forward's freed scratch back to the OS, else the backward reuses it unseen
#endif
  const int64_t base = rss_bytes();
  reset_peak_rss();
  double s = median_seconds(reps, [&] {
    sdpa_backward<float>(args, out, lse, dout, {dq, dk, dv}, {Backend::flash, false});
  });
  double extra_mb = double(std::max<int64_t>(0, peak_rss_bytes() - base)) / 1e6;
  double gf = 2.5 * forward_flops(c) / s * 1e-9;  // five products instead of two
  print_row(c, "flash-bwd", s, gf, peak, extra_mb, skipped(args, SdpaOut<float>{out, {}, lse}));
}

// Time to read K and V once (the floor for a decode step): a sum over the same bytes on every thread,
// with 16 independent partial sums so that it runs at the memory's bandwidth, not at the latency of one
// chain of float adds (a single running sum took longer than the flash decode kernel itself).
double read_kv_seconds(const Case& c, int reps) {
  Tensor k = init::randn({c.B, c.Hkv, c.S, c.D}, 4), v = init::randn({c.B, c.Hkv, c.S, c.D}, 5);
  volatile float sink = 0;
  constexpr int64_t kLanes = 16;
  return median_seconds(reps, [&] {
    const int64_t n = k.numel() / kLanes;  // blocks of kLanes floats (D = 128: no remainder)
    std::vector<float> acc(size_t(num_threads()), 0.f);
    parallel_for(n, grain_for(2 * kLanes), [&](int64_t b, int64_t e, int w) {
      float x[kLanes] = {};
      const float *kp = k.data() + b * kLanes, *vp = v.data() + b * kLanes;
      for (int64_t i = 0; i < (e - b) * kLanes; i += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) x[j] += kp[i + j] + vp[i + j];
      for (int64_t j = 0; j < kLanes; ++j) acc[size_t(w)] += x[j];
    });
    sink = acc[0];
  });
}

#ifdef ATTN_HAVE_MPI
// ---- attn bench --ring ----

// One rank's numbers for one L (gathered on rank 0 as doubles).
struct RingRow {
  double rows, pairs, base_keys;                  // L_r, (query, key) pairs it computes, the baseline's S
  double ring_fwd, base_fwd, ring_bwd, base_bwd;  // median seconds
  double wait_fwd, wait_bwd;                      // median seconds waiting for blocks
  double fwd_ratio, bwd_ratio;                    // median over rounds of ring GFLOP/s / baseline GFLOP/s
  double peak_mb, scratch_mb;                     // peak RSS growth of a ring forward + backward; the ring's scratch
};

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The (query, key) pairs rank r computes: L_r·L, or under top-left causal masking Σ over its ranges of
// size·begin + size·(size + 1)/2 (query l sees keys 0..l).
double ring_pairs(int64_t L, int r, int n, RingLayout layout, bool causal) {
  double pairs = 0;
  for (const RowRange& g : ring_rows(L, r, n, layout))
    pairs += causal ? double(g.size) * double(g.begin) + double(g.size) * double(g.size + 1) / 2
                    : double(g.size) * double(L);
  return pairs;
}

RingRow ring_case(const BenchOptions& opt, int64_t L, RingLayout layout, int64_t H, int64_t Hkv, int64_t D) {
  MPI_Comm comm = dist::world();
  const int r = dist::rank(comm), n = dist::size(comm);
  RingRow row{};
  const int64_t Lr = ring_local_length(L, r, n, layout);
  row.rows = double(Lr), row.pairs = ring_pairs(L, r, n, layout, opt.causal);
  // The baseline: the flash kernel in this process alone, non-causal, Q of the rank's L_r rows against as many
  // keys as give the same number of pairs (L under no mask, about L/2 per query row under causal zigzag).
  const int64_t S = std::max<int64_t>(1, int64_t(row.pairs / std::max<int64_t>(1, Lr) + 0.5));
  row.base_keys = double(S);
  const int64_t rss0 = rss_bytes();
  reset_peak_rss();
  {
    Tensor q = init::randn({1, H, Lr, D}, 3 + uint64_t(r)), k = init::randn({1, Hkv, Lr, D}, 40 + uint64_t(r)),
           v = init::randn({1, Hkv, Lr, D}, 80 + uint64_t(r)), dout = init::randn({1, H, Lr, D}, 120 + uint64_t(r));
    Tensor out({1, H, Lr, D}), lse({1, H, Lr}), dq({1, H, Lr, D}), dk({1, Hkv, Lr, D}), dv({1, Hkv, Lr, D});
    SdpaArgs<float> a{q, k, v};
    a.causal = opt.causal ? Causal::top_left : Causal::none;
    RingStats fs, bs;
    auto fwd = [&] { ring_sdpa(a, SdpaOut<float>{out, {}, lse}, comm, layout, &fs); };
    auto bwd = [&] { ring_sdpa_backward(a, out, lse, dout, {dq, dk, dv}, comm, layout, &bs); };
    fwd();  // warm-up, and the memory of one forward + backward
    if (opt.backward) bwd();
    row.peak_mb = double(peak_rss_bytes() - rss0) / 1e6;
    row.scratch_mb = double(std::max(fs.scratch_bytes, bs.scratch_bytes)) / 1e6;
    // The baseline's tensors: Q as the ring's, K and V of S rows.
    Tensor bk = init::randn({1, Hkv, S, D}, 200), bv = init::randn({1, Hkv, S, D}, 201);
    Tensor bout({1, H, Lr, D}), blse({1, H, Lr}), bdk({1, Hkv, S, D}), bdv({1, Hkv, S, D});
    const SdpaArgs<float> b{q, bk, bv};
    const SdpaOptions flash{Backend::flash, false};
    auto base_fwd = [&] { sdpa(b, SdpaOut<float>{bout, {}, blse}, flash); };
    auto base_bwd = [&] { sdpa_backward<float>(b, bout, blse, dout, {dq, bdk, bdv}, flash); };
    base_fwd();
    if (opt.backward) base_bwd();
    // Interleaved rounds, ring first in even rounds and baseline first in odd ones, every timing started on
    // all ranks together (a barrier), so the baseline runs beside the same number of busy processes as the
    // ring. The ratio of a round compares two neighbouring runs (the load of a shared machine drifts).
    // ratio: ring GFLOP/s over the baseline's (their pairs differ by the rounding of S only)
    auto timed = [&](auto&& f) {
      MPI_Barrier(comm);
      const auto t0 = Clock::now();
      f();
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    auto ratio = [&](double ring_s, double base_s) {
      return (base_s / (row.rows * row.base_keys)) / (ring_s / row.pairs);
    };
    std::vector<double> rf, bf, rb, bb, wf, wb, fr, br;
    for (int i = 0; i < opt.repeats; ++i) {
      const bool ring_first = i % 2 == 0;
      if (!ring_first) bf.push_back(timed(base_fwd));
      rf.push_back(timed(fwd)), wf.push_back(fs.wait_s);
      if (ring_first) bf.push_back(timed(base_fwd));
      fr.push_back(ratio(rf.back(), bf.back()));
      if (!opt.backward) continue;
      if (!ring_first) bb.push_back(timed(base_bwd));
      rb.push_back(timed(bwd)), wb.push_back(bs.wait_s);
      if (ring_first) bb.push_back(timed(base_bwd));
      br.push_back(ratio(rb.back(), bb.back()));
    }
    row.ring_fwd = median(rf), row.base_fwd = median(bf), row.wait_fwd = median(wf), row.fwd_ratio = median(fr);
    if (opt.backward)
      row.ring_bwd = median(rb), row.base_bwd = median(bb), row.wait_bwd = median(wb), row.bwd_ratio = median(br);
  }
  return row;
}

int run_ring_bench(const BenchOptions& opt) {
  MPI_Comm comm = dist::world();
  const int r = dist::rank(comm), n = dist::size(comm);
  const RingLayout layout = opt.layout == "contiguous" ? RingLayout::contiguous : RingLayout::zigzag;
  const int64_t H = opt.heads, Hkv = opt.kv_heads ? opt.kv_heads : H, D = opt.dim;
  ATTN_CHECK(H % Hkv == 0, "Expected --heads a multiple of --kv-heads, but got ", H, " and ", Hkv, " instead");
  // Threads per rank: --threads, else this process's CPUs shared among the ranks (all on this machine).
  const int cpus = share_threads(n);
  if (opt.threads) set_num_threads(opt.threads);
  for (int64_t L : opt.lengths) {
    // Per rank: Q, K, V, out, dout, dQ, dK, dV of about L/N rows, the ring's scratch (2 K/V blocks, 2 dK/dV
    // accumulators), and the baseline's K/V (and their gradients) of up to L rows.
    const double rows = double(L) / n + 1, per_row = double(H + Hkv) * D * 4;
    check_fits_in_memory(n * (rows * per_row * 4 + rows * Hkv * D * 4 * 10 + double(L) * Hkv * D * 4 * 4),
                         cat("--ring --lengths ", L, " over ", n, " ranks"));
  }
  if (r == 0) {
    std::fputs(to_string(runtime_info()).c_str(), stdout);
    std::printf(
        "ring attention: %d ranks, %d threads each (%d CPUs here%s), layout %s, B 1, H %lld, Hkv %lld, D %lld, %s\n", n,
        num_threads(), cpus, n * num_threads() > cpus ? ": oversubscribed" : "", to_string(layout), (long long)H,
        (long long)Hkv, (long long)D, opt.causal ? "causal (top-left)" : "no mask");
    std::printf("baseline: the flash kernel in one process, non-causal, Q of the rank's rows against S keys (the same "
                "pairs); ratio: median over %d interleaved rounds of ring GFLOP/s / baseline GFLOP/s\n", opt.repeats);
    std::printf("%7s %4s %6s %6s %9s %9s %6s %9s %9s %6s %8s %8s %9s %9s %9s\n", "L", "rank", "L_r", "S", "ring ms",
                "base ms", "ratio", "bwd ms", "base ms", "ratio", "wait ms", "bwd wait", "peak MB", "inputs/N",
                "scratch");
  }
  for (int64_t L : opt.lengths) {
    const RingRow mine = ring_case(opt, L, layout, H, Hkv, D);
    std::vector<RingRow> all(static_cast<size_t>(n));
    dist::check(MPI_Gather(&mine, sizeof(RingRow), MPI_BYTE, all.data(), sizeof(RingRow), MPI_BYTE, 0, comm),
                "MPI_Gather of the ring bench rows");
    if (r != 0) continue;
    // What one process would hold for the whole sequence: Q, out, dout, dQ (H heads) and K, V, dK, dV (Hkv).
    const double inputs_mb = double(L) * D * 4 * (4.0 * H + 4.0 * Hkv) / 1e6 / (opt.backward ? 1 : 2);
    for (int i = 0; i < n; ++i) {
      const RingRow& w = all[size_t(i)];
      std::printf("%7lld %4d %6.0f %6.0f %9.1f %9.1f %6.3f %9.1f %9.1f %6.3f %8.1f %8.1f %9.1f %9.1f %9.1f\n",
                  (long long)L, i, w.rows, w.base_keys, w.ring_fwd * 1e3, w.base_fwd * 1e3, w.fwd_ratio,
                  w.ring_bwd * 1e3, w.base_bwd * 1e3, w.bwd_ratio, w.wait_fwd * 1e3, w.wait_bwd * 1e3, w.peak_mb,
                  inputs_mb / n, w.scratch_mb);
    }
    double gf = 0;
    for (const RingRow& w : all) gf += 4.0 * H * w.pairs * D / w.ring_fwd * 1e-9;
    std::printf("L %lld: forward %.1f GFLOP/s over all ranks (4·H·pairs·D); single-process inputs %.1f MB\n",
                (long long)L, gf, inputs_mb);
    std::fflush(stdout);
  }
  return 0;
}
#endif

}  // namespace

int run_bench(const BenchOptions& opt) {
  if (opt.ring) {
#ifdef ATTN_HAVE_MPI
    return run_ring_bench(opt);
#else
    throw Error(
        "Expected attn built with MPI for --ring, but got a build without it (install libopenmpi-dev, reconfigure)");
#endif
  }
  // Every length is checked before the first timing: Q, K, V and out of (1, 8, L, 64), and the reference's
  // (L, L) scores per head up to --reference-max.
  for (int64_t L : opt.lengths) {
    const double inputs = (opt.backward_rows ? 9.0 : 4.0) * 8 * double(L) * 64 * 4,
                 scores = L <= opt.reference_max ? 8.0 * double(L) * double(L) * 4 : 0;
    check_fits_in_memory(inputs + scores, cat("--lengths ", L, " (Q, K, V, out of (1, 8, L, 64)",
                                              scores > 0 ? " and the reference's scores" : "", ")"));
  }
  std::fputs(to_string(runtime_info()).c_str(), stdout);
  const Ceilings peak{sgemm_gflops(opt.repeats), fma_peak_gflops(opt.repeats)};
  std::printf("threads %d; attn gemm 2048^3: %.1f GFLOP/s (%%sgemm below); FMA peak, measured: %.1f GFLOP/s (%%fma)\n",
              num_threads(), peak.sgemm, peak.fma);
  std::printf("%-10s %6s %6s %7s %4s  %-9s %10s %8s %7s %6s %9s %8s\n", "case", "L", "S", "H/Hkv", "D", "backend",
              "time ms", "GFLOP/s", "%sgemm", "%fma", "extra MB", "skipped");
  if (opt.variants) {  // GFLOP/s of the variants count the (query, key) pairs each query sees
    for (int64_t L : opt.lengths) {
      const Case base{"causal", 1, 8, 8, L, L, 64, Causal::top_left};
      Case window = base, alibi = base, softcap = base, docs = base;
      window.name = "window", window.window = {opt.window, 0};
      alibi.name = "alibi", alibi.alibi = true;
      softcap.name = "softcap", softcap.softcap = 50;
      docs.name = "docs x8", docs.docs = 8;
      for (const Case& c : {base, window, alibi, softcap, docs}) {
        run_case(c, Backend::flash, peak, opt.repeats);
        if (opt.backward_rows) run_backward_case(c, peak, opt.repeats);
      }
    }
    return 0;
  }
  for (int64_t L : opt.lengths) {
    for (Causal causal : {Causal::none, Causal::top_left}) {
      Case c{causal == Causal::none ? "mha" : "causal", 1, 8, 8, L, L, 64, causal};
      if (L <= opt.reference_max) run_case(c, Backend::reference, peak, opt.repeats);
      run_case(c, Backend::flash, peak, opt.repeats);
      if (opt.backward_rows) run_backward_case(c, peak, opt.repeats);
    }
  }
  // The GQA row at the largest --lengths up to 4096, the decode rows over the largest (16384 by default).
  const int64_t longest = *std::max_element(opt.lengths.begin(), opt.lengths.end());
  Case gqa{"gqa", 1, 32, 8, std::min<int64_t>(longest, 4096), std::min<int64_t>(longest, 4096), 128, Causal::none};
  run_case(gqa, Backend::flash, peak, opt.repeats);
  Case decode{"decode", 1, 32, 8, 1, longest, 128, Causal::none};
  run_case(decode, Backend::reference, peak, opt.repeats);
  run_case(decode, Backend::flash, peak, opt.repeats);
  const double floor = read_kv_seconds(decode, opt.repeats), mb = 2.0 * decode.Hkv * decode.S * decode.D * 4 / 1e6;
  std::printf("decode floor: reading K and V once (%.0f MB) takes %.3f ms (%.1f GB/s on %d threads)\n", mb,
              floor * 1e3, mb / 1e3 / floor, num_threads());
  return 0;
}

}  // namespace attn
