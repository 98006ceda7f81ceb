// The `attn` command line: demo, and (as they land) bench, train, generate, viz.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "attn/check.h"

int run_demo();

int main(int argc, char** argv) {
  CLI::App app{"attn: multi-head attention from the formula to a trained model"};
  app.require_subcommand(1);
  auto* demo = app.add_subcommand("demo", "walk through attention on the seed's configuration");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*demo) return run_demo();
  } catch (const attn::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
