// The `attn` command line: demo, bench, and (as they land) train, generate, viz.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "attn/check.h"
#include "attn/version.h"
#include "cli.h"

int main(int argc, char** argv) {
  CLI::App app{"attn: multi-head attention from the formula to a trained model"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "attn " ATTN_VERSION);
  app.option_defaults()->always_capture_default();  // every --help shows each option's default
  auto* demo = app.add_subcommand("demo", "walk through attention on the seed's configuration");

  attn::BenchOptions bench_opt;
  auto* bench = app.add_subcommand("bench", "time reference vs flash attention over growing L");
  bench->add_option("--threads", bench_opt.threads, "threads for attn and OpenBLAS")->check(attn::positive());
  bench->add_option("--repeats", bench_opt.repeats, "timed runs per row (median)")->check(attn::positive());
  bench->add_option("--lengths", bench_opt.lengths, "sequence lengths L = S")->delimiter(',');
  bench->add_option("--reference-max", bench_opt.reference_max, "largest L for the reference backend");

  attn::TrainCli train_opt;
  auto* train = attn::add_train_command(app, train_opt);
  attn::GenerateCli generate_opt;
  auto* generate = attn::add_generate_command(app, generate_opt);
  attn::VizCli viz_opt;
  auto* viz = attn::add_viz_command(app, viz_opt);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return attn::report_parse_error(app, e, argc, argv);
  }
  try {
    if (*demo) return attn::run_demo();
    if (*bench) return attn::run_bench(bench_opt);
    if (*train) return attn::run_train(train_opt);
    if (*generate) return attn::run_generate(generate_opt);
    if (*viz) return attn::run_viz(viz_opt);
  } catch (const attn::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
