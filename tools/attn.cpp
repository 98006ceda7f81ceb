// The `attn` command line: demo, bench, and (as they land) train, generate, viz.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "attn/check.h"
#include "cli.h"
#include "flags.h"

int main(int argc, char** argv) {
  CLI::App app{"attn: multi-head attention from the formula to a trained model"};
  app.require_subcommand(1);
  auto* demo = app.add_subcommand("demo", "walk through attention on the seed's configuration");

  attn::BenchOptions bench_opt;
  auto* bench = app.add_subcommand("bench", "time reference vs flash attention over growing L");
  bench->add_option("--threads", bench_opt.threads, "threads for attn and OpenBLAS")->check(attn::number_of<int>())
      ->check(CLI::PositiveNumber);
  bench->add_option("--repeats", bench_opt.repeats, "timed runs per row (median)")->check(attn::number_of<int>())
      ->check(CLI::PositiveNumber);
  bench->add_option("--lengths", bench_opt.lengths, "sequence lengths L = S")->delimiter(',')
      ->check(attn::number_of<int64_t>())->check(CLI::PositiveNumber);
  bench->add_option("--reference-max", bench_opt.reference_max, "largest L for the reference backend")
      ->check(attn::number_of<int64_t>());

  attn::TrainCli train_opt;
  auto* train = attn::add_train_command(app, train_opt);
  attn::GenerateCli generate_opt;
  auto* generate = attn::add_generate_command(app, generate_opt);
  attn::VizCli viz_opt;
  auto* viz = attn::add_viz_command(app, viz_opt);

  // Nothing throws past main: a bad flag, a bad file or an exhausted machine is one line and exit 2.
  auto fail = [](const char* what) {
    std::fprintf(stderr, "error: %s\n", what);
    return 2;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(e.what());
  }
  try {
    if (*demo) return attn::run_demo();
    if (*bench) return attn::run_bench(bench_opt);
    if (*train) return attn::run_train(train_opt);
    if (*generate) return attn::run_generate(generate_opt);
    if (*viz) return attn::run_viz(viz_opt);
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
