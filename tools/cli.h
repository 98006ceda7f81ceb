// Options of the CLI subcommands, shared by tools/attn.cpp (parsing) and each subcommand's file.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "attn/gemm.h"
#include "attn/train.h"

namespace attn {

int run_demo();

// Range checks with a readable message (CLI11's own print the largest double, 309 digits). NaN fails both.
inline CLI::Validator at_least(double lo, bool strict) {
  return CLI::Validator(
      [lo, strict](std::string& s) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(s, v) && (strict ? v > lo : v >= lo)) return {};
        char bound[32];
        std::snprintf(bound, sizeof bound, "%s %g", strict ? ">" : ">=", lo);
        return "Expected a number " + std::string(bound) + ", but got " + s + " instead";
      },
      strict ? "POSITIVE" : "NONNEGATIVE");
}
inline CLI::Validator positive() { return at_least(0, true); }
inline CLI::Validator non_negative() { return at_least(0, false); }

// --dtype f32|bf16 (what the matmuls multiply in, gemm.h Precision) and --strict (refuse bf16 where it
// would run emulated), for the commands that run a model.
inline void add_dtype_options(CLI::App* cmd, std::string& dtype, bool& strict) {
  cmd->add_option("--dtype", dtype, "matmul precision: f32, or bf16 (bf16 products, fp32 sums; emulated exactly on "
                                    "CPUs without AVX512_BF16, see attn info)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_flag("--strict", strict, "with --dtype bf16: exit with an error where bf16 would run emulated");
}
inline Precision dtype_of(const std::string& dtype, bool strict) {
  const Precision p = parse_precision(dtype);
  if (p == Precision::bf16 && strict) check_bf16_native();
  return p;
}

// tools/suggest.cpp: the known name nearest to `word` (a prefix of it, or a few edits away), or "".
std::string nearest(const std::string& word, const std::vector<std::string>& known);
// Prints CLI11's parse error, or "did you mean" for an unknown subcommand or flag; returns the exit code.
int report_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv);

struct BenchOptions {
  int threads = 0;  // the CPUs this process may use
  int repeats = 5;
  std::vector<int64_t> lengths = {512, 1024, 2048, 4096, 8192, 16384};
  int64_t reference_max = 2048;  // the reference is O(L·S) time per head: skip it past this L
  // --ring: ring attention over the ranks of mpirun (tools/bench.cpp, run_ring_bench)
  bool ring = false;
  std::string layout = "zigzag";
  int64_t heads = 2, kv_heads = 0, dim = 64;  // kv_heads 0: = heads
  bool causal = true, backward = true;
  bool backward_rows = false;  // without --ring: --backward given, flash backward rows after the forward ones
  bool variants = false;       // --variants: window, ALiBi, softcap and packed-document rows beside full causal
  int64_t window = 512;        // --window: the window rows' left size W (causal: W + 1 keys)
};
int run_bench(const BenchOptions& opt);

// `attn train` (tools/train.cpp). CLI11 writes the given options into `values`; `apply` copies each one
// that was given into the defaults (the synthetic task's without --data) and returns its flag.
struct TrainCli {
  std::string data, out = "out";
  bool resume = false, untied = false, no_decay_embeddings = false, profile = false, strict = false;
  int64_t log_every = 0;  // the run's: TrainOptions::log_every, given or saved (make_trainer sets it)
  std::vector<int64_t> eval_lengths;  // --eval-lengths: val loss at these context lengths after the run
  TrainOptions values;
  std::vector<std::function<std::string(TrainOptions&)>> apply;
};
CLI::App* add_train_command(CLI::App& app, TrainCli& cli);
int run_train(TrainCli& cli);

// `attn generate` (tools/generate.cpp). Its sampling defaults are nanoGPT's sample.py (200 tokens at
// temperature 0.8 among the top 200, seed 1337), on purpose unlike the library's greedy SampleOptions:
// the command samples text to read, a library call reproduces transformers' greedy output. --help shows them.
struct GenerateCli {
  std::string ckpt, model, prompt;  // exactly one of --ckpt and --model: no hidden default directory
  std::string input;                // --model of an encoder-decoder: the source text
  int64_t n = 200;
  double temperature = 0.8;
  int64_t top_k = 200;
  uint64_t seed = 1337;
  int threads = 0;  // the CPUs this process may use
  std::string kv_dtype = "f32";  // f32, f16 or bf16: how the KV cache stores K and V
  std::string dtype = "f32";     // --model: the matmuls' precision (gemm.h)
  bool strict = false;
};
CLI::App* add_generate_command(CLI::App& app, GenerateCli& cli);
int run_generate(const GenerateCli& cli);

// `attn embed` (tools/embed.cpp): sentence embeddings of a Hugging Face model directory.
struct EmbedCli {
  std::string model, input, out;  // input "": stdin; out "": JSON lines on stdout
  std::string dtype = "f32";      // the matmuls' precision (gemm.h)
  bool strict = false;            // refuse bf16 where it would be emulated
  int64_t batch = 32;
  int threads = 0;
  double progress = 10;  // seconds between progress lines on stderr (0: none)
};
CLI::App* add_embed_command(CLI::App& app, EmbedCli& cli);
int run_embed(const EmbedCli& cli);

// `attn viz` (tools/viz.cpp): no ckpt (or builtin): train the built-in model for at most `seconds` first;
// model: a Hugging Face model directory instead.
struct VizCli {
  std::string ckpt, model, text, out = "out/viz";
  std::string target;      // --model of an encoder-decoder: the target text (empty: its greedy translation)
  bool builtin = false;
  int top_k = -1;          // HTML weights per query row; -1: all up to 64 keys, 16 beyond
  std::string scale = "row";  // the colour scale: row or absolute (viz_model.h)
  int png_max_px = 1024;
  double seconds = 10;
  int threads = 1;
};
CLI::App* add_viz_command(CLI::App& app, VizCli& cli);
int run_viz(const VizCli& cli);
// The last section of `attn demo`: trains the built-in model, writes its views into out_dir, prints the
// untrained and trained mean row entropy.
int demo_attention_views(const std::string& out_dir);

}  // namespace attn
