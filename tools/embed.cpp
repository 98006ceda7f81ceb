// `attn embed`: sentence embeddings of a Hugging Face model directory (attn/hf.h), one text per line of
// a file or stdin, written as .npy (float32, (N, E)) or JSON lines ({"text": ..., "embedding": [...]}) by
// the extension of --out, JSON lines on stdout without it. Not a server and not a search index.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attn/file.h"
#include "attn/hf.h"
#include "attn/threads.h"
#include "cli.h"
#include "flags.h"

namespace attn {

CLI::App* add_embed_command(CLI::App& app, EmbedCli& cli) {
  auto* cmd = app.add_subcommand("embed", "sentence embeddings from a Hugging Face model directory (e.g. MiniLM)");
  cmd->add_option("--model", cli.model, "model directory: config.json, model.safetensors, tokenizer.json")->required();
  cmd->add_option("--input", cli.input, "texts, one per line (default: stdin)");
  cmd->add_option("--out", cli.out, "output: FILE.npy (float32 (N, E)) or FILE.jsonl (default: JSON lines on stdout)");
  cmd->add_option("--batch", cli.batch, "texts per forward (sorted by length, padded per batch)")
      ->check(number_of<int64_t>())->check(positive());
  add_dtype_options(cmd, cli.dtype, cli.strict);
  add_threads_flag(cmd, cli.threads);
  return cmd;
}

namespace {

std::vector<std::string> read_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

// NumPy's .npy format 1.0: magic, version, a header dict padded with spaces to 64 bytes, the data.
void write_npy(std::FILE* f, const Tensor& t) {
  std::string header = cat("{'descr': '<f4', 'fortran_order': False, 'shape': (", t.size(0), ", ", t.size(1), "), }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint16_t len = uint16_t(header.size());
  std::fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  std::fwrite(&len, 2, 1, f);  // little-endian, as this host (safetensors.cpp asserts it)
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(t.data(), sizeof(float), size_t(t.numel()), f);
}

}  // namespace

int run_embed(const EmbedCli& cli) {
  set_num_threads(cli.threads);
  std::string text;
  if (cli.input.empty()) {
    std::ostringstream s;
    s << std::cin.rdbuf();
    text = s.str();
  } else {
    text = read_regular_file(cli.input, "--input", uint64_t(1) << 32);
  }
  const std::vector<std::string> lines = read_lines(text);
  Pretrained p = Pretrained::load(cli.model, dtype_of(cli.dtype, cli.strict));
  const Tensor e = p.embed(lines, cli.batch);  // (N, E)
  const bool npy = cli.out.size() >= 4 && cli.out.compare(cli.out.size() - 4, 4, ".npy") == 0;
  if (!cli.out.empty()) check_path(cli.out, "--out");
  std::FILE* f = cli.out.empty() ? stdout : std::fopen(cli.out.c_str(), "wb");
  ATTN_CHECK(f, "Expected --out '", cli.out, "' to be writable, but got '", std::strerror(errno), "' instead");
  if (npy) {
    write_npy(f, e);
  } else {
    const int64_t E = e.size(1);
    for (size_t i = 0; i < lines.size(); ++i) {
      nlohmann::json row;
      row["text"] = lines[i];
      row["embedding"] = std::vector<float>(e.data() + int64_t(i) * E, e.data() + int64_t(i + 1) * E);
      const std::string s = row.dump() + "\n";
      std::fwrite(s.data(), 1, s.size(), f);
    }
  }
  const bool ok = std::fflush(f) == 0 && !std::ferror(f);
  if (f != stdout) std::fclose(f);
  ATTN_CHECK(ok, "Expected to write ", cli.out.empty() ? std::string("stdout") : "--out '" + cli.out + "'",
             ", but got a write error instead");
  return 0;
}

}  // namespace attn
