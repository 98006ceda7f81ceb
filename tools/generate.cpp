// `attn generate`: continue a prompt with a trained checkpoint (--ckpt) or a Hugging Face decoder directory
// (--model: GPT-2, Llama, Mistral, Qwen2, Gemma 2, BLOOM; attn/hf.h), one token at a time through the KV cache
// (the flash decode path), printing the text as it is drawn; or translate --input with an encoder-decoder
// directory (--model: T5, BART): the source encoded once, the target printed as it is drawn. Not a chat loop.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "attn/hf.h"
#include "attn/threads.h"
#include "attn/train.h"
#include "cli.h"
#include "flags.h"

namespace attn {

CLI::App* add_generate_command(CLI::App& app, GenerateCli& cli) {
  auto* cmd = app.add_subcommand("generate", "sample text from a checkpoint of attn train or a Hugging Face decoder");
  // exactly one of --ckpt and --model (checked in run_generate, so that the message says so)
  auto* ckpt = cmd->add_option("--ckpt", cli.ckpt, "checkpoint directory (attn train --out); or --model")
                   ->check(not_empty("a checkpoint directory"));
  cmd->add_option("--model", cli.model, "Hugging Face model directory (a decoder: GPT-2, Llama, Mistral, Qwen2, "
                  "Gemma 2, BLOOM; or an encoder-decoder: T5, BART): config.json, model.safetensors, tokenizer.json; "
                  "or --ckpt")
      ->excludes(ckpt)->check(not_empty("a model directory"));
  auto* prompt = cmd->add_option("--prompt", cli.prompt,
                                 "text to continue (--ckpt default: a newline, or the first character)");
  cmd->add_option("--input", cli.input, "--model of an encoder-decoder: the source text to translate")
      ->excludes(prompt);
  cmd->add_option("-n,--tokens", cli.n, "tokens (characters for --ckpt) to generate")
      ->check(number_of<int64_t>())
      ->check(non_negative());
  cmd->add_option("--temperature", cli.temperature, "softmax temperature; 0 = greedy")
      ->check(number_of<double>())->check(non_negative());
  cmd->add_option("--top-k", cli.top_k, "sample among the k likeliest (0: all)")
      ->check(number_of<int64_t>())
      ->check(non_negative());
  cmd->add_option("--seed", cli.seed, "sampling seed")->check(number_of<uint64_t>());
  add_threads_flag(cmd, cli.threads);
  cmd->add_option("--kv-dtype", cli.kv_dtype, "KV cache storage: f32, or f16/bf16 (half the bytes per decode step)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  add_dtype_options(cmd, cli.dtype, cli.strict);
  return cmd;
}

namespace {

SampleOptions sample_options(const GenerateCli& cli) {
  SampleOptions o;
  o.max_new_tokens = cli.n;
  o.temperature = cli.temperature;
  o.top_k = cli.top_k;
  o.seed = cli.seed;
  o.kv_dtype = parse_kv_dtype(cli.kv_dtype.c_str());
  return o;
}

// Prints what the whole text of `ids` adds to what is shown (a token's text can depend on the ones before it:
// WordPiece's ##, a UTF-8 character over several byte tokens); holds back while it does not extend `shown`.
void show_text(const HfTokenizer& tok, const std::vector<int64_t>& ids, std::string& shown) {
  const std::string text = tok.decode(ids);
  if (text.size() > shown.size() && text.compare(0, shown.size(), shown) == 0) {
    std::fputs(text.c_str() + shown.size(), stdout);
    std::fflush(stdout);
    shown = text;
  }
}

// --model: the directory's tokenizer in and out, the text streamed as the decoded sequence grows; a decoder
// continues --prompt, an encoder-decoder translates --input (the target alone is printed).
int run_generate_pretrained(const GenerateCli& cli) {
  Pretrained p = Pretrained::load(cli.model, dtype_of(cli.dtype, cli.strict));
  PretrainedDecoder* d = p.decoder();
  PretrainedSeq2Seq* s2s = p.seq2seq();
  ATTN_CHECK(d || s2s, "Expected a decoder (GPT-2, Llama, Mistral, Qwen2, Gemma 2, BLOOM) or an encoder-decoder ",
             "(T5, BART) for generate, but got ", p.model->architecture(), " in '", cli.model, "' instead");
  ATTN_CHECK(d || !cli.input.empty(), "Expected --input TEXT (the source) for the encoder-decoder ",
             p.model->architecture(), " in '", cli.model, "', but got ", cli.prompt.empty() ? "none" : "--prompt",
             " instead");
  ATTN_CHECK(!d || cli.input.empty(), "Expected --prompt TEXT for the decoder ", p.model->architecture(),
             " (--input is an encoder-decoder's source), but got --input instead");
  const std::string& text = d ? cli.prompt : cli.input;
  std::vector<int64_t> in = p.tokenizer.encode(text).ids;  // special tokens only as the file adds them
  ATTN_CHECK(!in.empty(), "Expected ", d ? "a --prompt" : "an --input", " of at least one token, but got '", text,
             "' instead");
  // what is printed: the prompt and its continuation (a decoder), or the target alone
  std::vector<int64_t> ids = d ? in : std::vector<int64_t>{};
  std::string shown = p.tokenizer.decode(ids);
  std::fputs(shown.c_str(), stdout);
  SampleOptions o = sample_options(cli);
  o.eos_token_ids = d ? d->decoder_config().eos_token_ids : s2s->seq2seq_config().eos_token_ids;
  o.on_token = [&](int64_t tok) {
    ids.push_back(tok);
    show_text(p.tokenizer, ids, shown);
  };
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = int64_t((d ? generate(*d, in, o) : generate(*s2s, in, o)).size());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n");
  std::fflush(stdout);
  std::fprintf(stderr, "(%lld tokens after %s of %zu in %.2f s, %.1f per second, %s)\n", (long long)n,
               d ? "a prompt" : "a source", in.size(), s, s > 0 ? double(n) / s : 0.0,
               p.model->architecture().c_str());
  return 0;
}

}  // namespace

int run_generate(const GenerateCli& cli) {
  ATTN_CHECK(cli.ckpt.empty() != cli.model.empty(), "Expected exactly one of --ckpt DIR and --model DIR, but got ",
             cli.ckpt.empty() ? "neither" : "both", " instead");
  if (!cli.model.empty()) return run_generate_pretrained(cli);
  ATTN_CHECK(cli.input.empty(), "Expected --prompt with --ckpt (--input is an encoder-decoder's source), but got ",
             "--input instead");
  const Autocast autocast(dtype_of(cli.dtype, cli.strict));
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
  SampleOptions o = sample_options(cli);
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
