// Blocking by measurement (attn/tune.h): the per-user tuning file, its lookup by the kernels, and the
// measurement of the candidates. Not the kernels (gemm.cpp and flash_forward.cpp read tuned_for()) and
// not a benchmark against peers (bench/): candidates of attn's own blocking, timed against each other.
//
// Within the budget: one run of each shape first says what it affords (plan_tune), and a candidate wins
// only beyond the spread of its rounds (clearly_faster).
//
// File: {"version": 1, "entries": {KEY: {"gemm_mr": …, "gemm_keep_b": …, "gemm_kc": …, "gemm_mc": …, "gemm_nt": …,
// "gemm_pack_a": …, "gemm_pack_at": …, "flash_rows": …, "measured": "2026-12-01 22:50 UTC"}}}, KEY as
// tuning_key(). Entries of other CPUs are kept as they are.
#include "attn/tune.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <hwy/targets.h>

#include "attn/check.h"
#include "attn/cpu.h"
#include "attn/file.h"
#include "attn/gemm.h"
#include "attn/kernels/problem.h"
#include "attn/simd.h"
#include "attn/threads.h"

namespace attn {
namespace {

using json = nlohmann::json;

std::string key_for(int64_t target) {
  const CpuInfo& c = cpu_info();
  return cat(c.name, "|", c.features, "|L1d ", c.l1d >> 10, "K L2 ", c.l2 >> 10, "K L3 ", c.l3 >> 10, "K|",
             hwy::TargetName(target));
}

// The file's entries for this CPU, by target; read once (or again after reload_tuning).
struct Table {
  std::vector<std::pair<int64_t, Tuning>> entries;
};

json read_file(const std::string& path, bool warn) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return json::object();
  try {
    json j = json::parse(read_regular_file(path, "the tuning file", 16u << 20));
    ATTN_CHECK(j.is_object() && j.value("version", 0) == 1 && j.contains("entries") && j["entries"].is_object(),
               "Expected {\"version\": 1, \"entries\": {...}}, but got another document instead");
    return j;
  } catch (const std::exception& e) {
    if (warn) std::fprintf(stderr, "attn: ignoring the tuning file %s: %s\n", path.c_str(), e.what());
    return json::object();
  }
}

Tuning from_json(const json& e) {
  Tuning t;
  auto count = [&](const char* name, int64_t lo, int64_t hi) {
    const int64_t v = e.value(name, int64_t(0));
    ATTN_CHECK(v == 0 || (v >= lo && v <= hi), "Expected ", name, " 0 or in [", lo, ", ", hi, "], but got ", v,
               " instead");
    return v;
  };
  t.gemm_mr = count("gemm_mr", 1, 64);
  t.gemm_keep_b = count("gemm_keep_b", 1, 1);
  t.gemm_kc = count("gemm_kc", 16, 8192);
  t.gemm_mc = count("gemm_mc", 1, 8192);
  t.gemm_nt = count("gemm_nt", 1, 1 << 20);
  t.gemm_pack_a = count("gemm_pack_a", 1, 1 << 30);
  t.gemm_pack_at = count("gemm_pack_at", 1, 1 << 30);
  t.flash_rows = count("flash_rows", 1, 8192);
  t.measured = e.value("measured", std::string());
  return t;
}

Table load() {
  Table t;
  const json j = read_file(tuning_path(), true);
  if (!j.contains("entries")) return t;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const auto it = j["entries"].find(key_for(target));
    if (it == j["entries"].end()) continue;
    try {
      t.entries.push_back({target, from_json(*it)});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attn: ignoring the tuning of %s in %s: %s\n", hwy::TargetName(target),
                   tuning_path().c_str(), e.what());
    }
  }
  return t;
}

std::mutex g_mu;  // guards the table's replacement (reload) and the forced tuning
std::optional<Table> g_table;
std::optional<Tuning> g_forced;

const Table& table() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_table) g_table = load();
  return *g_table;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

void save(const std::string& key, const Tuning& t) {
  const std::string path = tuning_path();
  ATTN_CHECK(!path.empty(), "Expected a home folder for the tuning file (HOME, or the user's entry in the ",
             "password database), but got none instead: set ATTN_TUNE_FILE");
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::shared_ptr<void> lock = lock_writer(path, "the tuning file");  // read, change, write: one at a time
  json j = read_file(path, true);
  if (!j.contains("entries")) j = {{"version", 1}, {"entries", json::object()}};
  j["entries"][key] = {{"gemm_mr", t.gemm_mr}, {"gemm_keep_b", t.gemm_keep_b}, {"gemm_kc", t.gemm_kc},
                       {"gemm_mc", t.gemm_mc}, {"gemm_nt", t.gemm_nt}, {"gemm_pack_a", t.gemm_pack_a},
                       {"gemm_pack_at", t.gemm_pack_at}, {"flash_rows", t.flash_rows}, {"measured", t.measured}};
  write_file_atomic(path, "the tuning file", j.dump(2) + "\n");  // a reader sees the old file or the new one
}

// ---- Measurement ----

using Clock = std::chrono::steady_clock;
constexpr int64_t kNever = int64_t(1) << 30;  // gemm_pack_a: never pack A
constexpr int kMaxRounds = 40;
constexpr int kMaxBlocks = 3;  // the register block stage's candidates on a target with the most (AVX-512)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double seconds_of(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return seconds_since(t0);
}

struct Work {
  std::string name;
  double flops;
  std::function<void()> run;
};

// Interleaved rounds (every candidate, every shape, once per round) after a warm-up run of each: at least
// kTuneMinRounds, then more while another round fits the budget. Each candidate's median rate per shape
// and their geometric mean (score), and the geometric means of its slowest and fastest rounds (lo, hi).
void measure(const std::vector<Tuning>& cands, const std::vector<Work>& work, const char* kernel, double budget,
             TuneReport& r) {
  std::vector<std::vector<std::vector<double>>> t(cands.size(), std::vector<std::vector<double>>(work.size()));
  struct Unforce {  // the file's tuning again however measure() ends, an exception included
    ~Unforce() { clear_forced_tuning(); }
  } unforce;
  const auto start = Clock::now();
  for (int round = 0;; ++round) {
    const auto r0 = Clock::now();
    for (size_t c = 0; c < cands.size(); ++c) {
      force_tuning(cands[c]);
      for (size_t w = 0; w < work.size(); ++w) {
        if (round == 0) work[w].run();  // warm-up: scratch grown, pages touched
        t[c][w].push_back(seconds_of(work[w].run));
      }
    }
    const double spent = seconds_since(start), last = seconds_since(r0);
    if (round + 1 >= kTuneMinRounds && (spent + last > budget || round + 1 >= kMaxRounds)) break;
  }
  for (size_t c = 0; c < cands.size(); ++c) {
    TuneRow row{kernel, cands[c], {}, 0, 0, 0, false};
    double log_sum = 0;
    std::vector<double> round_log(t[c][0].size(), 0.0);  // per round: the sum of log rates over the shapes
    for (size_t w = 0; w < work.size(); ++w) {
      auto x = t[c][w];
      for (size_t i = 0; i < x.size(); ++i) round_log[i] += std::log(work[w].flops / x[i] * 1e-9);
      std::sort(x.begin(), x.end());
      row.gflops.push_back(work[w].flops / x[x.size() / 2] * 1e-9);
      log_sum += std::log(row.gflops.back());
    }
    const double n = double(work.size());
    row.score = std::exp(log_sum / n);
    row.lo = std::exp(*std::min_element(round_log.begin(), round_log.end()) / n);
    row.hi = std::exp(*std::max_element(round_log.begin(), round_log.end()) / n);
    r.rows.push_back(row);
  }
}

struct GemmOperands {
  int64_t M, N, K;
  bool ta, tb;
  std::vector<float> a, b, c;
  GemmOperands(int64_t M_, int64_t N_, int64_t K_, bool ta_, bool tb_) : M(M_), N(N_), K(K_), ta(ta_), tb(tb_) {
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(-1, 1);
    a.resize(size_t(M * K)), b.resize(size_t(K * N)), c.resize(size_t(M * N));
    for (float& x : a) x = u(gen);
    for (float& x : b) x = u(gen);
  }
  double flops() const { return 2.0 * double(M * N * K); }
  void run() {
    gemm(ta, tb, M, N, K, 1.f, a.data(), ta ? M : K, b.data(), tb ? K : N, 0.f, c.data(), N);
  }
};

// The flash forward through the kernel interface (kernels/problem.h), not the attention layer's sdpa().
struct FlashOperands {
  int64_t H, L, D;
  std::vector<float> q, k, v, o;
  FlashOperands(int64_t H_, int64_t L_, int64_t D_) : H(H_), L(L_), D(D_) {
    std::mt19937 gen(2);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto* x : {&q, &k, &v}) {
      x->resize(size_t(H * L * D));
      for (float& e : *x) e = u(gen);
    }
    o.resize(size_t(H * L * D));
  }
  double flops() const { return 4.0 * double(H * L * L * D); }
  void run() {
    const SdpaArgs<float> a{{q.data(), {1, H, L, D}}, {k.data(), {1, H, L, D}}, {v.data(), {1, H, L, D}}};
    flash_forward(make_problem(a, SdpaOut<float>{{o.data(), {1, H, L, D}}, {}, {}}));
  }
};

}  // namespace

std::string tuning_path() {
  if (const char* p = std::getenv("ATTN_TUNE_FILE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/attn/tune.json";
  std::string home;
  if (const char* h = std::getenv("HOME"); h && *h) {
    home = h;
  } else {  // no HOME (a service, `env -i`): the user's own home, never a folder shared with other users
    std::vector<char> buf(16384);
    passwd pw, *found = nullptr;
    if (::getpwuid_r(::getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found && found->pw_dir && *found->pw_dir)
      home = found->pw_dir;
  }
  return home.empty() ? std::string() : home + "/.cache/attn/tune.json";
}

std::string tuning_key() { return key_for(simd_target_bits()); }

const Tuning* tuned_for(int64_t target) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_forced) return &*g_forced;
  }
  if (cpu_info().caches_forced) return nullptr;  // another CPU's caches: its blocking is derived
  for (const auto& [t, tuning] : table().entries)
    if (t == target) return &tuning;
  return nullptr;
}

void reload_tuning() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_table.reset();
}

void force_tuning(const Tuning& t) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_forced = t;
}

void clear_forced_tuning() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_forced.reset();
}

bool clearly_faster(const TuneRow& a, const TuneRow& b) { return a.lo > b.hi; }

TunePlan plan_tune(const std::vector<double>& gemm_run_s, double flash512_s, double seconds) {
  ATTN_CHECK(!gemm_run_s.empty(), "Expected the time of at least one GEMM shape, but got none instead");
  constexpr int kRuns = 1 + kTuneMinRounds;  // each candidate's warm-up and its rounds
  const double gemm_share = seconds * kTuneGemmCandidates / (kTuneGemmCandidates + kTuneFlashCandidates);
  TunePlan p;
  double per_round = 0;  // one run of each chosen shape
  for (size_t i = 0; i < gemm_run_s.size(); ++i) {
    if (i > 0 && (per_round + gemm_run_s[i]) * kTuneGemmCandidates * kRuns > gemm_share) break;
    per_round += gemm_run_s[i];
    p.gemm_shapes = i + 1;
  }
  const double gemm_s = per_round * kTuneGemmCandidates * kRuns, flash_budget = seconds - gemm_s;
  const auto flash_s = [&](int64_t L) {
    return flash512_s * double(L * L) / (512.0 * 512.0) * kTuneFlashCandidates * kRuns;
  };
  p.flash_length = 64;
  for (int64_t L : {1024, 512, 256, 128})
    if (flash_s(L) <= flash_budget) {
      p.flash_length = L;
      break;
    }
  p.seconds = gemm_s + flash_s(p.flash_length);
  return p;
}

TuneReport tune(const TuneOptions& o) {
  const auto start = Clock::now();
  TuneReport r;
  r.key = tuning_key();
  r.path = tuning_path();
  r.budget = o.seconds;
  std::vector<std::string> notes;
  double load = 0;
  if (std::ifstream f("/proc/loadavg"); f >> load && load > double(max_threads()) * 0.75)
    notes.push_back(cat("the machine is busy (load average ", load, " on ", max_threads(),
                        " CPUs): the rates are shared with other work; run attn tune again when it is quiet"));
  // The GEMM on the training shapes (M = B·T against N, K in {128, 512}; dW's K = B·T: the TN shape) and
  // the large ones, in the order the budget takes them (the cheapest first). The first is always measured:
  // a quick run puts its TN shape first, so that every stage runs however slow the build (ASan).
  std::vector<GemmOperands> g;
  if (o.quick) g = {{64, 64, 700, true, false}, {96, 80, 300, false, false}};
  else
    g = {{768, 512, 128, false, false}, {512, 128, 4096, true, false}, {768, 128, 512, false, true},
         {4096, 128, 512, false, true}, {1024, 1024, 1024, false, false}, {4096, 512, 512, false, true}};
  // One run of each with the derived blocking (after a warm-up) says what the budget affords; the shapes
  // after one that cannot fit are not tried. The plan takes kPlanned of the budget: the rest is for this,
  // the warm-ups, saving, and rounds slower than the first (a busy machine).
  constexpr double kPlanned = 0.8;
  const double planned = o.seconds * kPlanned;
  std::vector<double> cost;
  double round = 0;
  for (auto& x : g) {
    x.run();
    cost.push_back(seconds_of([&x] { x.run(); }));
    round += cost.back();
    if (round * kTuneGemmCandidates * (1 + kTuneMinRounds) > planned) break;
  }
  FlashOperands probe(8, o.quick ? 128 : 512, 64);
  probe.run();
  const double flash512 = seconds_of([&probe] { probe.run(); }) * (o.quick ? 16.0 : 1.0);
  const TunePlan plan = plan_tune(cost, flash512, std::max(0.0, planned - seconds_since(start)));
  if (plan.gemm_shapes < g.size())
    notes.push_back(cat("a budget of ", o.seconds, " s measures ", plan.gemm_shapes, " of the ", g.size(),
                        " GEMM shapes, the cheapest (a longer --seconds measures the larger ones too)"));
  g.erase(g.begin() + std::ptrdiff_t(plan.gemm_shapes), g.end());
  std::vector<Work> gw;
  bool transposed_a = false;
  for (auto& x : g) {
    r.gemm_shapes.push_back(cat(x.M, "x", x.N, "x", x.K, " ", x.ta ? "T" : "N", x.tb ? "T" : "N"));
    gw.push_back({r.gemm_shapes.back(), x.flops(), [&x] { x.run(); }});
    transposed_a |= x.ta;
  }
  // Stages, each keeping the best of the ones before: register block (the others of this target's after the
  // derived one; the blockings below are derived from it), which panel a tile keeps in L1 (A's or B's), K
  // block, tile rows, tile columns, packing of A (read along its rows: the NN and NT shapes), packing of a
  // transposed A (the TN shape, where measured); then the flash forward's query tile, with the GEMM as chosen.
  // Each stage's share of the time left is its share of the candidates.
  Tuning t;
  int left = kTuneGemmCandidates + kTuneFlashCandidates;
  auto run_stage = [&](const char* kernel, const std::vector<Work>& work, const std::vector<int64_t>& values,
                       int64_t Tuning::*field) -> TuneRow& {
    std::vector<Tuning> cands;
    for (int64_t v : values) {
      Tuning c = t;
      c.*field = v;
      cands.push_back(c);
    }
    const double budget = (planned - seconds_since(start)) * double(values.size()) / double(left);
    left -= int(values.size());
    measure(cands, work, kernel, budget, r);
    // values[0] (what the stages before kept) stays unless another is faster beyond the noise
    TuneRow* keep = &r.rows[r.rows.size() - cands.size()];
    for (size_t i = r.rows.size() - cands.size() + 1; i < r.rows.size(); ++i)
      if (clearly_faster(r.rows[i], r.rows[r.rows.size() - cands.size()]) && r.rows[i].score > keep->score)
        keep = &r.rows[i];
    t.*field = keep->t.*field;
    return *keep;
  };
  const std::vector<RegisterBlock> blocks = gemm_register_blocks();
  std::vector<int64_t> rows{0};
  for (size_t i = 1; i < blocks.size(); ++i) rows.push_back(blocks[i].rows);
  left -= kMaxBlocks - int(rows.size());  // the planner counted the most blocks a target has
  run_stage("gemm", gw, rows, &Tuning::gemm_mr);
  run_stage("gemm", gw, {0, 1}, &Tuning::gemm_keep_b);
  run_stage("gemm", gw, {0, 128, 192, 256, 384, 512, 768, 1024}, &Tuning::gemm_kc);
  run_stage("gemm", gw, {0, 48, 72, 192, 384}, &Tuning::gemm_mc);
  run_stage("gemm", gw, {0, 256, 1024, 4096}, &Tuning::gemm_nt);
  TuneRow* gemm_choice = &run_stage("gemm", gw, {0, 1, 2, 8, kNever}, &Tuning::gemm_pack_a);
  if (transposed_a) gemm_choice = &run_stage("gemm", gw, {0, 2, 4, kNever}, &Tuning::gemm_pack_at);
  else left -= 4;  // no TN shape measured: packing a transposed A stays derived
  gemm_choice->chosen = true;
  FlashOperands f(8, o.quick ? 128 : plan.flash_length, 64);
  r.flash_shapes.push_back(cat("H ", f.H, ", L = S = ", f.L, ", D ", f.D));
  const std::vector<Work> fw{{r.flash_shapes.back(), f.flops(), [&f] { f.run(); }}};
  run_stage("flash", fw, {0, 64, 128, 512}, &Tuning::flash_rows).chosen = true;
  t.measured = now_utc();
  r.chosen = t;
  save(r.key, t);
  reload_tuning();
  for (const std::string& n : notes) r.note += (r.note.empty() ? "" : "; ") + n;
  r.seconds = seconds_since(start);
  return r;
}

namespace {
// A tuned value as the tables print it.
std::string value(int64_t x) { return x == 0 ? "derived" : x >= kNever ? "never" : std::to_string(x); }

// The register block of Tuning::gemm_mr: "4x24" (its rows x columns), or "derived".
std::string block(int64_t rows) {
  for (const RegisterBlock& b : gemm_register_blocks())
    if (rows && b.rows == rows) return cat(b.rows, "x", b.cols);
  return value(rows);
}

}  // namespace

std::string to_string(const TuneReport& r) {
  const auto& v = value;
  std::string s = cat("tuning for ", r.key, "\n", r.note.empty() ? "" : "note: " + r.note + "\n");
  for (const char* kernel : {"gemm", "flash"}) {
    const auto& shapes = std::string(kernel) == "gemm" ? r.gemm_shapes : r.flash_shapes;
    s += cat("\n", kernel, " candidates, GFLOP/s (median of the rounds; the rounds' range: the noise)\n");
    s += std::string(kernel) == "gemm" ? "   block  keep      kc      mc      nt  pack_a pack_at" : "    rows";
    for (const auto& n : shapes) s += cat(" | ", n);
    s += " | geomean |  rounds\n";
    for (const TuneRow& row : r.rows) {
      if (row.kernel != kernel) continue;
      char buf[64];
      if (row.kernel == "gemm")
        std::snprintf(buf, sizeof buf, "%8s%6s%8s%8s%8s%8s%8s", block(row.t.gemm_mr).c_str(),
                      row.t.gemm_keep_b ? "B" : "A", v(row.t.gemm_kc).c_str(),
                      v(row.t.gemm_mc).c_str(), v(row.t.gemm_nt).c_str(), v(row.t.gemm_pack_a).c_str(),
                      v(row.t.gemm_pack_at).c_str());
      else
        std::snprintf(buf, sizeof buf, "%8s", v(row.t.flash_rows).c_str());
      s += buf;
      for (size_t i = 0; i < row.gflops.size(); ++i) {
        std::snprintf(buf, sizeof buf, " | %*.1f", int(std::max<size_t>(6, shapes[i].size())), row.gflops[i]);
        s += buf;
      }
      std::snprintf(buf, sizeof buf, " | %7.1f | %5.1f-%.1f%s\n", row.score, row.lo, row.hi,
                    row.chosen ? "  <- chosen" : "");
      s += buf;
    }
  }
  char took[160];
  std::snprintf(took, sizeof took,
                "\nmeasured in %.1f s (budget %g s); a candidate replaced the one kept before it only "
                "where its slowest round beat that one's fastest\n",
                r.seconds, r.budget);
  s += took;
  s += cat("saved in ", r.path, "\n");
  return s;
}

std::string tuning_summary() {
  const Tuning* t = tuned_for(simd_target_bits());
  if (!t) {
    if (cpu_info().caches_forced) return "derived from the forced caches (tuning files are per CPU)";
    return cat("derived from the caches (no measurement for ", simd_target(), " in ", tuning_path(),
               ": run `attn tune`)");
  }
  const auto& v = value;
  return cat("gemm block ", block(t->gemm_mr), t->gemm_keep_b ? " keeping B in L1" : "", ", kc ", v(t->gemm_kc),
             ", mc ", v(t->gemm_mc), ", nt ", v(t->gemm_nt),
             ", pack A past ", v(t->gemm_pack_a), " B panels (transposed A past ", v(t->gemm_pack_at), "); flash rows ",
             v(t->flash_rows),
             t->measured.empty() ? " (forced)" : cat(" (measured ", t->measured, ", ", tuning_path(), ")"));
}

}  // namespace attn
