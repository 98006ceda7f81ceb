// `attn viz`: what a trained model's heads attend to, as files: OUT/attention.html (every layer and head,
// interactive, no network) and OUT/layer<i>.png (each layer's heads in a grid), for a text the user gives;
// the model is an attn checkpoint (--ckpt) or a Hugging Face model directory (--model, e.g. MiniLM).
// Also the last section of `attn demo`: train the built-in model, then show its views and how much
// sharper its heads are than untrained ones. The views and the entropy are include/attn/viz_model.h's.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

#include "attn/threads.h"
#include "attn/viz_model.h"
#include "cli.h"
#include "flags.h"

namespace attn {
namespace {

// A training-shaped input of the reverse task (k = 8 distinct letters, '|', the first 7 reversed): the
// model sees it when predicting the last letter, so its reversal head reads the anti-diagonal.
constexpr const char* kExampleText = "sunlight|thgilnu";

// The tiny GPT on the built-in reverse task, untrained (synthetic_defaults: seed 1337), on `threads` threads
// (the Trainer sets them: one is enough for its small matmuls).
std::unique_ptr<Trainer> builtin_trainer(int threads = 1) {
  TrainOptions o = synthetic_defaults();
  o.threads = threads;
  return std::make_unique<Trainer>(o, Dataset::reverse_task());
}

// Trains `t` until its last step (synthetic_defaults: 200, under 2 s on one core) or for `seconds`,
// whichever comes first. Prints the loss every `log_every` steps (0: never) and a summary line.
void train_for(Trainer& t, double seconds, int64_t log_every) {
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  float first = 0, last = 0;
  while (t.step_count() < t.options().steps && elapsed() < seconds) {
    last = t.step().loss;
    if (t.step_count() == 1) first = last;
    if (log_every > 0 && (t.step_count() == 1 || t.step_count() % log_every == 0)) {
      std::printf("  step %4lld  loss %.4f\n", (long long)t.step_count(), last);
      std::fflush(stdout);
    }
  }
  std::printf("trained the built-in model (%lld parameters): %lld steps in %.1f s, loss %.3f -> %.4f\n",
              (long long)t.model().num_parameters(), (long long)t.step_count(), elapsed(), first, last);
}

// The built-in model as the PNG titles name it.
std::string builtin_source(const Trainer& t) { return cat("built-in model, ", t.step_count(), " steps"); }

void print_views(const viz::ModelViews& v) {
  std::printf("%s\n", v.html.c_str());
  for (const std::string& p : v.more_html) std::printf("%s\n", p.c_str());
  for (const std::string& p : v.pngs) std::printf("%s\n", p.c_str());
}

// Mean row entropy (viz::mean_row_entropy) of each layer for inputs x (B, T), and over all layers last.
std::vector<double> layer_entropies(Gpt& model, const std::vector<int64_t>& x, int64_t B, int64_t T) {
  std::vector<double> e;
  double all = 0;
  for (const Tensor& w : model.attention_weights(x.data(), B, T)) {  // each (B, H, T, T)
    e.push_back(viz::mean_row_entropy(w.view()));
    all += e.back();
  }
  e.push_back(all / double(e.size()));  // every layer has H heads: the mean of the layers is the mean of the rows
  return e;
}

}  // namespace

CLI::App* add_viz_command(CLI::App& app, VizCli& cli) {
  auto* cmd = app.add_subcommand("viz", "attention views (HTML + one PNG per layer) of a model on a text");
  auto* ckpt =
      cmd->add_option("--ckpt", cli.ckpt, "checkpoint directory (attn train --out); none: train the built-in model")
          ->check(not_empty("a checkpoint directory"));
  auto* model = cmd->add_option("--model", cli.model, "a Hugging Face model directory (config.json, model.safetensors, "
                                "tokenizer.json): its heads on the tokenizer's tokens")
                    ->excludes(ckpt)->check(not_empty("a model directory"));
  cmd->add_flag("--builtin", cli.builtin, "train the built-in reverse-task model for a few seconds and show it")
      ->excludes(ckpt)->excludes(model);
  cmd->add_option("--text", cli.text, std::string("the text to run (--ckpt: characters of the model's vocabulary, at "
                                                  "most block_size; --model: any text, tokenized with its special "
                                                  "tokens); default with --builtin: ") + kExampleText);
  cmd->add_option("--out", cli.out, "output directory (created)");
  cmd->add_option("--top-k", cli.top_k, "weights kept per query row in the HTML (0: all; default: all up to 64 keys)")
      ->check(number_of<int>())->check(non_negative())->option_text("INT:NONNEGATIVE=all up to 64 keys");
  cmd->add_option("--scale", cli.scale, "colours: row (each query row relative to its largest weight) or absolute (0 "
                  "to 1, bertviz's; the PNGs too); the page switches between them")
      ->check(CLI::IsMember({"row", "absolute"}));
  cmd->add_option("--png-max-px", cli.png_max_px, "longest side of one head's matrix in the PNGs, pixels")
      ->check(number_of<int>())->check(at_least(16, false));  // write_heatmap_png's smallest
  cmd->add_option("--target", cli.target, "--model of an encoder-decoder: the target text whose attention to show "
                  "(default: the model's greedy translation of --text)");
  cmd->add_option("--seconds", cli.seconds, "training time of the built-in model at most")
      ->check(number_of<double>())
      ->check(positive());
  add_threads_flag(cmd, cli.threads, "threads for the forward pass (one sequence: 1 is enough; 0: all CPUs)");
  return cmd;
}

int run_viz(const VizCli& cli) {
  viz::ModelViewOptions vo;
  vo.top_k = cli.top_k;
  vo.scale = cli.scale;
  vo.png_max_px = cli.png_max_px;
  if (!cli.model.empty()) {
    ATTN_CHECK(!cli.text.empty(), "Expected --text with --model (the text to tokenize and run), but got none instead");
    Pretrained m = Pretrained::load(cli.model);
    vo.source = cli.model;
    vo.target = cli.target;
    print_views(viz::write_pretrained_views(cli.out, m, cli.text, vo));
    return 0;
  }
  if (cli.ckpt.empty()) {
    std::unique_ptr<Trainer> t = builtin_trainer(cli.threads);
    train_for(*t, cli.seconds, 0);
    vo.source = builtin_source(*t);
    print_views(viz::write_model_views(cli.out, t->model(), t->data().tokenizer(),
                                       cli.text.empty() ? kExampleText : cli.text, vo));
    return 0;
  }
  ATTN_CHECK(!cli.text.empty(),
             "Expected --text with --ckpt (the characters to run through the model), but got none instead");
  LoadedModel m = load_model(cli.ckpt);
  vo.source = cli.ckpt;
  print_views(viz::write_model_views(cli.out, *m.model, m.tokenizer, cli.text, vo));
  return 0;
}

int demo_attention_views(const std::string& out_dir) {
  std::unique_ptr<Trainer> t = builtin_trainer();
  const Dataset& data = t->data();
  const int64_t B = 32, T = data.seq_len(), k = data.task_length();
  std::vector<int64_t> x(size_t(B * T)), y(size_t(B * T));  // (B, T): validation examples for the entropy
  Rng rng(7);
  data.batch(1, B, T, rng, x.data(), y.data());
  const std::vector<double> before = layer_entropies(t->model(), x, B, T);

  std::printf("Training the tiny GPT to reverse %lld letters (abcdefgh|hgfedcba); loss on the reversed half, "
              "guessing scores ln 26 = 3.26:\n", (long long)k);
  train_for(*t, 10.0, 25);
  const std::vector<double> after = layer_entropies(t->model(), x, B, T);

  const std::string text = kExampleText, prompt = text.substr(0, size_t(k + 1));
  const std::string want(prompt.rbegin() + 1, prompt.rend());  // the letters reversed
  std::vector<int64_t> ids;
  for (int32_t id : data.tokenizer().encode(prompt)) ids.push_back(id);
  SampleOptions greedy;
  greedy.max_new_tokens = k;
  greedy.temperature = 0;
  std::vector<int64_t> got = generate(t->model(), ids, greedy);
  const std::string answer = data.tokenizer().decode(std::vector<int32_t>(got.begin(), got.end()));
  std::printf("greedy sample: %s%s  (%s)\n", prompt.c_str(), answer.c_str(),
              answer == want ? "correct" : ("want " + want).c_str());

  std::printf("Attention of the trained model on \"%s\" (open the HTML in a browser):\n", text.c_str());
  print_views(viz::write_model_views(out_dir, t->model(), data.tokenizer(), text,
                                     {.source = builtin_source(*t)}));
  std::printf("Mean row entropy of the attention over %lld validation sequences (rows with >= 4 keys, divided by "
              "log #keys: 1 = uniform):\n", (long long)B);
  for (size_t l = 0; l + 1 < before.size(); ++l)
    std::printf("  layer %zu: untrained %.4f, trained %.4f\n", l, before[l], after[l]);
  std::printf("  all:     untrained %.4f, trained %.4f: random heads spread their weight almost evenly, trained "
              "heads pick a few keys\n", before.back(), after.back());
  return 0;
}

}  // namespace attn
