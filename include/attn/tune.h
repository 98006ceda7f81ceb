// Blocking chosen by measurement on the CPU at hand, not by one machine's constants: `attn tune` (or
// attn::tune()) times a few candidates of the GEMM's register block, loop order, K block and output tile and
// of the flash forward's query tile, keeps the fastest in a per-user file keyed by the CPU (model, features,
// caches) and the SIMD target, and every later process of that user on that CPU uses them. Blocking changes no bits
// (gemm.cpp, flash_forward.cpp), so a tuned and an untuned run give the same results, only sooner.
// Where nothing was measured (or the caches are forced, set_cpu_caches), the blocking is derived from the
// cache sizes as before. Not an autotuner of the kernels' code: the float GEMM's register block is chosen among
// the few each target is compiled with; the flash kernels' blocks are fixed per target.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attn {

// What was chosen for one CPU and target; 0 means "derived from the caches".
struct Tuning {
  int64_t gemm_mr = 0;      // rows of the float GEMM's register block, one of gemm_register_blocks() (attn/gemm.h)
  int64_t gemm_keep_b = 0;  // 1: a tile keeps each B panel in L1 and streams A's (columns outer); else A's in L1
  int64_t gemm_kc = 0;      // most of K per block (float)
  int64_t gemm_mc = 0;      // rows per output tile, a multiple of the register block's MR
  int64_t gemm_nt = 0;      // columns per output tile, a multiple of NR
  int64_t gemm_pack_a = 0;  // pack A into panels when it meets more than this many B panels (of NR columns)
  int64_t gemm_pack_at = 0; // the same for a transposed A (op(A) = Aᵀ: read in place, one cache line per k)
  int64_t flash_rows = 0;   // query rows per flash forward tile
  std::string measured;     // when (UTC), empty if never
};

// The per-user file: $ATTN_TUNE_FILE, else $XDG_CACHE_HOME/attn/tune.json, else ~/.cache/attn/tune.json
// (~ from $HOME, else the user's entry in the password database). "" when there is no home: no file is
// read, and saving is refused (a shared folder such as /tmp is never used).
std::string tuning_path();
// The key of this CPU and the SIMD target now chosen: "AMD EPYC|avx2 fma ...|L1d 48K L2 1024K L3 32768K|AVX3".
std::string tuning_key();
// The tuning of this CPU for Highway target `target` (HWY_TARGET of the calling kernel), read from the
// file once per process; nullptr where none was measured, or the caches are forced (set_cpu_caches).
// A malformed file is reported on stderr once and treated as empty.
const Tuning* tuned_for(int64_t target);
// Reads the file again (after it changed: tests, attn tune). Not while kernels run.
void reload_tuning();
// Tests and attn tune: every kernel uses t (zeros: derived from the caches) instead of the file, for any
// target, until clear_forced_tuning(). Not while kernels run.
void force_tuning(const Tuning& t);
void clear_forced_tuning();

struct TuneOptions {
  double seconds = 3;  // the budget, in all: the shapes measured and the rounds are planned to fit it
  bool quick = false;  // small shapes only (tests)
};

// One candidate's measurement: its settings and its rate on each shape, GFLOP/s (median of the rounds).
struct TuneRow {
  std::string kernel;  // "gemm" or "flash"
  Tuning t;
  std::vector<double> gflops;
  double score = 0;    // geometric mean of gflops
  double lo = 0, hi = 0;  // the slowest and the fastest round's geometric mean: the measured spread
  bool chosen = false;
};
struct TuneReport {
  std::string key, path;
  std::string note;  // e.g. that the machine was busy while measuring, or shapes the budget left out
  std::vector<std::string> gemm_shapes, flash_shapes;
  std::vector<TuneRow> rows;
  Tuning chosen;
  double budget = 0, seconds = 0;  // TuneOptions::seconds, and the time tune() took
};

// Whether `a` is faster than `b` beyond the noise: a's slowest round beats b's fastest. A candidate replaces
// the one kept so far (the derived blocking first) only then: two samples of one configuration differ
// by several percent on a busy machine, and noise must not pick a blocking.
bool clearly_faster(const TuneRow& a, const TuneRow& b);

// What fits the budget: tune() times one run of each shape first (`gemm_run_s`, in its order of priority,
// and the flash forward at L = S = 512, `flash512_s`), then measures the first `gemm_shapes` of them and the
// flash forward at `flash_length` (up to 1024, L² times the cost at 512), so that every candidate's warm-up and
// kMinRounds rounds fit `seconds` less what was spent already. At least one GEMM shape and L = 64.
struct TunePlan {
  size_t gemm_shapes = 0;
  int64_t flash_length = 0;
  double seconds = 0;  // the plan's estimate at the minimum rounds
};
inline constexpr int kTuneMinRounds = 3;     // per candidate, after its warm-up: the spread needs some
inline constexpr int kTuneGemmCandidates = 31, kTuneFlashCandidates = 4;  // tune()'s stages, all together, at most
TunePlan plan_tune(const std::vector<double>& gemm_run_s, double flash512_s, double seconds);

// Measures the candidates on this CPU with the current thread count within options.seconds (interleaved
// rounds, medians; a candidate replaces the one kept so far only where clearly_faster), saves the fastest
// under tuning_key() in tuning_path() (atomically, under its lock: attn/file.h's AtomicFile, lock_writer),
// and returns the table.
TuneReport tune(const TuneOptions& options = {});
std::string to_string(const TuneReport& r);
// One line for `attn info`: what the kernels use now and where it came from.
std::string tuning_summary();

}  // namespace attn
