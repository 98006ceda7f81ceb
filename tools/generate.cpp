// `attn generate`: continue a prompt with a trained checkpoint, one token at a time through the KV cache
// (the flash decode path), printing each character as it is drawn. Not a chat loop.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "attn/threads.h"
#include "attn/train.h"
#include "cli.h"
#include "flags.h"

namespace attn {

CLI::App* add_generate_command(CLI::App& app, GenerateCli& cli) {
  auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint of attn train");
  cmd->add_option("--ckpt", cli.ckpt, "checkpoint directory (attn train --out)")->required();
  cmd->add_option("--prompt", cli.prompt, "text to continue (default: a newline, or the first character)");
  cmd->add_option("-n,--tokens", cli.n, "characters to generate")->check(number_of<int64_t>())->check(non_negative());
  cmd->add_option("--temperature", cli.temperature, "softmax temperature; 0 = greedy")
      ->check(number_of<double>())->check(non_negative());
  cmd->add_option("--top-k", cli.top_k, "sample among the k likeliest (0: all)")->check(number_of<int64_t>())->check(non_negative());
  cmd->add_option("--seed", cli.seed, "sampling seed")->check(number_of<uint64_t>());
  add_threads_flag(cmd, cli.threads);
  cmd->add_option("--kv-dtype", cli.kv_dtype, "KV cache storage: f32, or f16/bf16 (half the bytes per decode step)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  return cmd;
}

int run_generate(const GenerateCli& cli) {
  set_num_threads(cli.threads);
  LoadedModel m = load_model(cli.ckpt);
  std::vector<int64_t> prompt;
  if (cli.prompt.empty()) {
    const auto& v = m.tokenizer.vocab();
    const auto nl = std::find(v.begin(), v.end(), U'\n');
    prompt.push_back(nl != v.end() ? int64_t(nl - v.begin()) : 0);
  } else {
    for (int32_t id : m.tokenizer.encode(cli.prompt)) prompt.push_back(id);
  }
  std::vector<int32_t> p32(prompt.begin(), prompt.end());
  std::fputs(m.tokenizer.decode(p32).c_str(), stdout);
  SampleOptions o;
  o.max_new_tokens = cli.n;
  o.temperature = cli.temperature;
  o.top_k = cli.top_k;
  o.seed = cli.seed;
  o.kv_dtype = parse_kv_dtype(cli.kv_dtype.c_str());
  o.on_token = [&](int64_t tok) {
    const int32_t id = int32_t(tok);
    std::fputs(m.tokenizer.decode(&id, 1).c_str(), stdout);
    std::fflush(stdout);
  };
  const auto t0 = std::chrono::steady_clock::now();
  generate(*m.model, prompt, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n");
  std::fflush(stdout);  // the text and its newline first: with 2>&1 the stats line comes after it
  std::fprintf(stderr, "(%lld characters in %.2f s, %.0f per second, checkpoint step %lld)\n", (long long)cli.n, s,
               s > 0 ? double(cli.n) / s : 0.0, (long long)m.step);
  return 0;
}

}  // namespace attn
