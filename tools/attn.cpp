// The `attn` command line: demo, bench, and (as they land) train, generate, viz.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "attn/check.h"
#include "attn/info.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "attn/tune.h"
#include "attn/version.h"
#include "cli.h"
#include "flags.h"

int main(int argc, char** argv) {
  CLI::App app{"attn: multi-head attention from the formula to a trained model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "attn " ATTN_VERSION);
  app.option_defaults()->always_capture_default();  // every --help shows each option's default
  auto* demo = app.add_subcommand("demo", "walk through attention step by step, then train a tiny GPT (seconds, no data)");

  bool info_strict = false;
  int info_threads = 0;
  auto* info = app.add_subcommand("info", "the CPU, SIMD target, GEMM kernel and threads attn runs with here");
  info->add_flag("--strict", info_strict, "exit 2 if the kernels run a fallback (no AVX2, or AVX-512 unused)");
  attn::add_threads_flag(info, info_threads, "thread count to report (0: the CPUs this process may use)");

  int tune_threads = 0;
  double tune_seconds = 3;
  auto* tune = app.add_subcommand("tune", "measure the GEMM and flash blocking on this CPU, keep the fastest "
                                  "for later runs (per user; changes no bits)");
  attn::add_threads_flag(tune, tune_threads, "threads to measure with (0: the CPUs this process may use)");
  tune->add_option("--seconds", tune_seconds, "about how long to measure")->check(CLI::Range(0.5, 600.0));

  attn::BenchOptions bench_opt;
  auto* bench = app.add_subcommand("bench", "time reference vs flash attention over growing L");
  attn::add_threads_flag(bench, bench_opt.threads);
  bench->add_option("--repeats", bench_opt.repeats, "timed runs per row (median)")->check(attn::number_of<int>())
      ->check(attn::positive());
  bench->add_option("--lengths", bench_opt.lengths, "sequence lengths L = S")->delimiter(',')
      ->check(attn::number_of<int64_t>())->check(attn::positive());
  bench->add_option("--reference-max", bench_opt.reference_max, "largest L for the reference backend")
      ->check(attn::number_of<int64_t>());
  bench->add_flag("--ring", bench_opt.ring, "ring attention over the ranks of mpirun (scripts/mpirun-local -np N "
                  "build/attn bench --ring) beside the single-process flash kernel at the same per-rank work");
  bench->add_option("--layout", bench_opt.layout, "--ring: which rows each rank holds")
      ->check(CLI::IsMember({"zigzag", "contiguous"}));
  bench->add_option("--heads", bench_opt.heads, "--ring: query heads H")->check(attn::number_of<int64_t>())
      ->check(attn::positive());
  bench->add_option("--kv-heads", bench_opt.kv_heads, "--ring: key/value heads Hkv (0: H)")
      ->check(attn::number_of<int64_t>())->check(attn::non_negative());
  bench->add_option("--dim", bench_opt.dim, "--ring: head dim D = Dv")->check(attn::number_of<int64_t>())
      ->check(attn::positive());
  bench->add_option("--causal", bench_opt.causal, "--ring: causal (top-left) or not");
  bench->add_option("--backward", bench_opt.backward, "time the backward too (without --ring: flash backward rows "
                    "with their scratch beyond inputs and outputs)")->expected(0, 1)
      ->option_text("BOOLEAN=off; on with --ring");  // not default_str: CLI11 takes it as the value of a bare --backward

  attn::TrainCli train_opt;
  auto* train = attn::add_train_command(app, train_opt);
  attn::GenerateCli generate_opt;
  auto* generate = attn::add_generate_command(app, generate_opt);
  attn::VizCli viz_opt;
  auto* viz = attn::add_viz_command(app, viz_opt);
  attn::EmbedCli embed_opt;
  auto* embed = attn::add_embed_command(app, embed_opt);

  // Nothing throws past main: a bad flag, a bad file or an exhausted machine is one line and exit 2.
  auto fail = [](const char* what) {
    std::fprintf(stderr, "error: %s\n", what);
    return 2;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return attn::report_parse_error(app, e, argc, argv);
  }
  try {
    if (*demo) return attn::run_demo();
    if (*info) {
      attn::set_num_threads(info_threads);
      const attn::RuntimeInfo i = attn::runtime_info();
      std::fputs(attn::to_string(i).c_str(), stdout);
      if (info_strict) attn::check_no_simd_fallback();
      return 0;
    }
    if (*tune) {
      attn::set_num_threads(tune_threads);
      std::fputs(attn::to_string(attn::runtime_info()).c_str(), stdout);
      std::fputs(attn::to_string(attn::tune({tune_seconds})).c_str(), stdout);
      return 0;
    }
    if (*bench) {
      bench_opt.backward_rows = bench->count("--backward") > 0 && bench_opt.backward;
      return attn::run_bench(bench_opt);
    }
    if (*train) return attn::run_train(train_opt);
    if (*generate) return attn::run_generate(generate_opt);
    if (*viz) return attn::run_viz(viz_opt);
    if (*embed) return attn::run_embed(embed_opt);
  } catch (const attn::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("Expected enough memory for this run, but got an allocation failure instead (std::bad_alloc)");
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("Expected to finish, but got an unknown exception instead");
  }
  return 0;
}
