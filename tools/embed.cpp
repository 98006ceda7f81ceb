// `attn embed`: sentence embeddings of a Hugging Face model directory (attn/hf.h), one text per line of
// a file, a pipe or stdin, written as .npy (float32, (N, E)) or JSON lines ({"text": ..., "embedding":
// [...]}) by the extension of --out (any case; another is refused before the model loads), JSON lines on
// stdout without it. --out is written whole or not at all, one writer at a time (attn/file.h's AtomicFile,
// lock_writer): a full disk or a signal leaves the previous file as it was. stderr says which pooling runs
// (and warns where the directory has no sentence-transformers pooling: a GPT-2 directory's vectors are
// mean-pooled hidden states, not trained sentence embeddings) and, on long runs, how far it is. Not a
// server and not a search index.
#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attn/file.h"
#include "attn/hf.h"
#include "attn/threads.h"
#include "attn/tokenizer.h"
#include "cli.h"
#include "flags.h"

namespace attn {

CLI::App* add_embed_command(CLI::App& app, EmbedCli& cli) {
  auto* cmd = app.add_subcommand("embed", "sentence embeddings from a Hugging Face model directory (e.g. MiniLM)");
  cmd->add_option("--model", cli.model, "model directory: config.json, model.safetensors, tokenizer.json")
      ->required()
      ->check(not_empty("a model directory"));
  cmd->add_option("--input", cli.input, "texts, one per line: a file, a pipe, or - (default: stdin)");
  cmd->add_option("--out", cli.out, "output: FILE.npy (float32 (N, E)) or FILE.jsonl (default: JSON lines on stdout)");
  cmd->add_option("--batch", cli.batch, "texts per forward (sorted by length, padded per batch)")
      ->check(number_of<int64_t>())->check(positive());
  cmd->add_option("--progress", cli.progress, "seconds between progress lines on stderr (0: none)")
      ->check(number_of<double>())->check(non_negative());
  add_dtype_options(cmd, cli.dtype, cli.strict);
  add_threads_flag(cmd, cli.threads);
  return cmd;
}

namespace {

// The lines of `text`, each valid UTF-8 (an Error naming the line of `input` otherwise: the tokenizer's
// byte offset alone left a user searching 200,000 lines).
std::vector<std::string> read_lines(const std::string& text, const std::string& input) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    try {
      utf8_decode(line);
    } catch (const Error& e) {
      throw Error(cat("--input '", input, "' line ", lines.size() + 1, ": ", e.what(), " (offsets within the line)"));
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

// NumPy's .npy format 1.0: magic, version, a header dict padded with spaces to 64 bytes, the data.
void write_npy(AtomicFile& f, const Tensor& t) {
  std::string header = cat("{'descr': '<f4', 'fortran_order': False, 'shape': (", t.size(0), ", ", t.size(1), "), }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint16_t len = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(&len, 2);  // little-endian, as this host (safetensors.cpp asserts it)
  f.write(header);
  f.write(t.data(), sizeof(float) * size_t(t.numel()));
}

// The rows of e (N, E) as JSON lines, the text beside each vector.
std::string json_lines(const std::vector<std::string>& lines, const Tensor& e) {
  std::string out;
  const int64_t E = e.size(1);
  for (size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json row;
    row["text"] = lines[i];
    row["embedding"] = std::vector<float>(e.data() + int64_t(i) * E, e.data() + int64_t(i + 1) * E);
    out += row.dump() + "\n";
  }
  return out;
}

enum class Format { npy, jsonl };

// --out's format by its extension, in any case: .npy, or .jsonl / .ndjson (JSON lines); else an Error.
Format format_of(const std::string& out) {
  std::string ext = std::filesystem::path(out).extension().string();
  for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".npy") return Format::npy;
  ATTN_CHECK(ext == ".jsonl" || ext == ".ndjson", "Expected --out ending in .npy or .jsonl, but got '", out,
             "' instead");
  return Format::jsonl;
}

}  // namespace

int run_embed(const EmbedCli& cli) {
  set_num_threads(cli.threads);
  std::shared_ptr<void> lock;  // taken before the work: a second writer of --out is refused at once
  Format format = Format::jsonl;
  if (!cli.out.empty()) {
    format = format_of(cli.out);
    lock = lock_writer(cli.out, "--out");
  }
  const std::string input = cli.input.empty() ? "-" : cli.input;
  const std::vector<std::string> lines = read_lines(read_input(input, "--input", uint64_t(1) << 32), input);
  Pretrained p = Pretrained::load(cli.model, dtype_of(cli.dtype, cli.strict));
  if (p.pooling.configured)
    std::fprintf(stderr, "attn embed: %s (sentence-transformers' modules.json)\n", to_string(p.pooling).c_str());
  else
    std::fprintf(stderr, "attn embed: warning: '%s' has no sentence-transformers pooling config (modules.json): %s, "
                 "over %s's last hidden state, which was not trained as a sentence embedding\n", cli.model.c_str(),
                 to_string(p.pooling).c_str(), p.model->architecture().c_str());
  // a line every cli.progress seconds: texts done, rate, time left
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last = t0;
  auto progress = [&](int64_t done, int64_t total) {
    const Clock::time_point now = Clock::now();
    if (cli.progress <= 0 || std::chrono::duration<double>(now - last).count() < cli.progress) return;
    last = now;
    const double s = std::chrono::duration<double>(now - t0).count(), rate = s > 0 ? double(done) / s : 0.0;
    std::fprintf(stderr, "attn embed: %lld of %lld texts, %.0f per second, %.0f s left\n", (long long)done,
                 (long long)total, rate, rate > 0 ? double(total - done) / rate : 0.0);
  };
  const Tensor e = p.embed(lines, cli.batch, 0, progress);  // (N, E)
  if (cli.out.empty()) {
    const std::string s = json_lines(lines, e);
    const bool ok = std::fwrite(s.data(), 1, s.size(), stdout) == s.size() && std::fflush(stdout) == 0;
    ATTN_CHECK(ok, "Expected to write stdout, but got '", std::strerror(errno), "' instead");
    return 0;
  }
  AtomicFile f(cli.out, "--out");
  if (format == Format::npy) write_npy(f, e);
  else f.write(json_lines(lines, e));
  f.commit();
  return 0;
}

}  // namespace attn
