// The `attn` command line: its subcommands (demo, info, tune, bench, train, generate, viz, embed), parsed and the
// one given run, any error one line and exit 2. info, tune and bench are declared here, the others in their own
// files (tools/train.cpp, ...); what they run is the library's.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "attn/check.h"
#include "attn/info.h"
#include "attn/simd.h"
#include "attn/threads.h"
#include "attn/tune.h"
#include "attn/version.h"
#include "cli.h"
#include "flags.h"

namespace {

struct InfoCli {
  bool strict = false;
  int threads = 0;
};
CLI::App* add_info_command(CLI::App& app, InfoCli& cli) {
  auto* info = app.add_subcommand("info", "the CPU, SIMD target, GEMM kernel and threads attn runs with here");
  info->add_flag("--strict", cli.strict, "exit 2 if the kernels run a fallback (no AVX2, or AVX-512 unused)");
  attn::add_threads_flag(info, cli.threads, "thread count to report (0: the CPUs this process may use)");
  return info;
}
int run_info(const InfoCli& cli) {
  std::fputs(attn::to_string(attn::runtime_info()).c_str(), stdout);
  if (cli.strict) attn::check_no_simd_fallback();
  return 0;
}

struct TuneCli {
  int threads = 0;
  double seconds = 3;
};
CLI::App* add_tune_command(CLI::App& app, TuneCli& cli) {
  auto* tune = app.add_subcommand("tune", "measure the GEMM and flash blocking on this CPU, keep the fastest "
                                  "for later runs (per user; changes no bits)");
  attn::add_threads_flag(tune, cli.threads, "threads to measure with (0: the CPUs this process may use)");
  tune->add_option("--seconds", cli.seconds, "about how long to measure")->check(CLI::Range(0.5, 600.0));
  return tune;
}
int run_tune(const TuneCli& cli) {
  std::fputs(attn::to_string(attn::runtime_info()).c_str(), stdout);
  std::fputs(attn::to_string(attn::tune({cli.seconds})).c_str(), stdout);
  return 0;
}

CLI::App* add_bench_command(CLI::App& app, attn::BenchOptions& opt) {
  auto* bench = app.add_subcommand("bench", "time reference vs flash attention over growing L");
  attn::add_threads_flag(bench, opt.threads);
  bench->add_option("--repeats", opt.repeats, "timed runs per row (median)")->check(attn::number_of<int>())
      ->check(attn::positive());
  bench->add_option("--lengths", opt.lengths, "sequence lengths L = S")->delimiter(',')
      ->check(attn::number_of<int64_t>())->check(attn::positive());
  bench->add_option("--reference-max", opt.reference_max, "largest L for the reference backend")
      ->check(attn::number_of<int64_t>());
  bench->add_flag("--ring", opt.ring, "ring attention over the ranks of mpirun (scripts/mpirun-local -np N "
                  "build/attn bench --ring) beside the single-process flash kernel at the same per-rank work");
  bench->add_option("--layout", opt.layout, "--ring: which rows each rank holds")
      ->check(CLI::IsMember({"zigzag", "contiguous"}));
  bench->add_option("--heads", opt.heads, "--ring: query heads H")->check(attn::number_of<int64_t>())
      ->check(attn::positive());
  bench->add_option("--kv-heads", opt.kv_heads, "--ring: key/value heads Hkv (0: H)")
      ->check(attn::number_of<int64_t>())->check(attn::non_negative());
  bench->add_option("--dim", opt.dim, "--ring: head dim D = Dv")->check(attn::number_of<int64_t>())
      ->check(attn::positive());
  bench->add_option("--causal", opt.causal, "--ring: causal (top-left) or not");
  bench
      ->add_option("--backward", opt.backward,
                   "time the backward too (without --ring: flash backward rows "
                   "with their scratch beyond inputs and outputs)")
      ->expected(0, 1)
      ->option_text(
          "BOOLEAN=off; on with --ring");  // not default_str: CLI11 takes it as the value of a bare --backward
  bench->add_flag("--variants", opt.variants, "rows of the attention variants beside full causal (sliding window, "
                  "ALiBi, softcap, 8 packed documents), with the (query, key) tiles the kernel never computes");
  bench->add_option("--window", opt.window, "--variants: the sliding window's W (keys l - W .. l)")
      ->check(attn::number_of<int64_t>())->check(attn::positive());
  return bench;
}

// Nothing throws past main: a bad flag, a bad file or an exhausted machine is one line and exit 2.
template <class F>
int reporting_errors(F run) {
  auto fail = [](const char* what) {
    std::fprintf(stderr, "error: %s\n", what);
    return 2;
  };
  try {
    return run();
  } catch (const attn::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("Expected enough memory for this run, but got an allocation failure instead (std::bad_alloc)");
  } catch (const std::exception& e) {
    return fail(e.what());
  } catch (...) {
    return fail("Expected to finish, but got an unknown exception instead");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attn: multi-head attention from the formula to a trained model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "attn " ATTN_VERSION);
  app.option_defaults()->always_capture_default();  // every --help shows each option's default
  auto* demo =
      app.add_subcommand("demo", "walk through attention step by step, then train a tiny GPT (seconds, no data)");
  InfoCli info_opt;
  auto* info = add_info_command(app, info_opt);
  TuneCli tune_opt;
  auto* tune = add_tune_command(app, tune_opt);
  attn::BenchOptions bench_opt;
  auto* bench = add_bench_command(app, bench_opt);
  attn::TrainCli train_opt;
  auto* train = attn::add_train_command(app, train_opt);
  attn::GenerateCli generate_opt;
  auto* generate = attn::add_generate_command(app, generate_opt);
  attn::VizCli viz_opt;
  auto* viz = attn::add_viz_command(app, viz_opt);
  attn::EmbedCli embed_opt;
  auto* embed = attn::add_embed_command(app, embed_opt);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return attn::report_parse_error(app, e, argc, argv);
  }
  return reporting_errors([&] {
    // The thread count, set here once from the command's --threads (tools/flags.h, add_threads_flag). attn
    // train's is its run's own (TrainOptions::threads, kept with the checkpoint): the Trainer sets it.
    const int threads = *info ? info_opt.threads : *tune ? tune_opt.threads : *bench ? bench_opt.threads
                        : *generate ? generate_opt.threads : *viz ? viz_opt.threads : *embed ? embed_opt.threads : -1;
    if (threads >= 0) attn::set_num_threads(threads);
    if (*demo) return attn::run_demo();
    if (*info) return run_info(info_opt);
    if (*tune) return run_tune(tune_opt);
    if (*bench) {
      bench_opt.backward_rows = bench->count("--backward") > 0 && bench_opt.backward;
      return attn::run_bench(bench_opt);
    }
    if (*train) return attn::run_train(train_opt);
    if (*generate) return attn::run_generate(generate_opt);
    if (*viz) return attn::run_viz(viz_opt);
    if (*embed) return attn::run_embed(embed_opt);
    return 0;
  });
}
