// What the CLI says when it cannot parse a command line: "did you mean" for a mistyped subcommand or
// flag (the nearest known name by edit distance), CLI11's own message otherwise. Not the checks of
// values (the validators in cli.h and each subcommand do those).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"

namespace attn {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);  // Levenshtein, one row at a time
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string join(const std::vector<std::string>& names, const char* prefix) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + (prefix + n);
  return s;
}

}  // namespace

std::string nearest(const std::string& word, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;  // more than this many edits is no typo
  for (const std::string& k : known) {
    const size_t d = k.rfind(word, 0) == 0 && !word.empty() ? 1 : edit_distance(word, k);
    if (d < best_d) best = k, best_d = d;
  }
  return best;
}

int report_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
  std::vector<std::string> commands;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) commands.push_back(s->get_name());
  int i = 1;
  std::vector<std::string> top;  // the top level's own flags (--help, --version)
  for (const CLI::Option* o : app.get_options())
    for (const std::string& n : o->get_lnames()) top.push_back(n);
  for (; i < argc && argv[i][0] == '-'; ++i) {  // the top level has flags only
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || std::find(top.begin(), top.end(), a.substr(2)) != top.end()) continue;
    const std::string guess = nearest(a.substr(2), top);
    std::fprintf(stderr, "error: attn has no option %s%s%s%s; attn --help lists them\n", a.c_str(),
                 guess.empty() ? "" : " (did you mean --", guess.c_str(), guess.empty() ? "" : "?)");
    return 2;
  }
  if (i == argc || std::find(commands.begin(), commands.end(), argv[i]) == commands.end()) {
    std::string got = i == argc ? "" : argv[i], guess = nearest(got, commands);
    std::fprintf(stderr, "error: %s%s%s; the commands are %s (attn --help)\n",
                 got.empty() ? "a command is required" : ("unknown command '" + got + "'").c_str(),
                 guess.empty() ? "" : " (did you mean '", guess.empty() ? "" : (guess + "'?)").c_str(),
                 join(commands, "").c_str());
    return 2;
  }
  CLI::App* sub = app.get_subcommand(argv[i]);
  std::vector<std::string> flags;
  for (const CLI::Option* o : sub->get_options())
    for (const std::string& n : o->get_lnames()) flags.push_back(n);
  for (int j = i + 1; j < argc; ++j) {  // an unknown flag first: it may be why a required one is missing
    std::string a = argv[j];
    if (a.rfind("--", 0) != 0) continue;
    a = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (std::find(flags.begin(), flags.end(), a) != flags.end()) continue;
    const std::string guess = nearest(a, flags);
    std::fprintf(stderr, "error: attn %s has no option --%s%s%s%s; attn %s --help lists them\n", argv[i], a.c_str(),
                 guess.empty() ? "" : " (did you mean --", guess.c_str(), guess.empty() ? "" : "?)", argv[i]);
    return 2;
  }
  std::fprintf(stderr, "error: %s\n", e.what());  // one line, exit 2, as every other error of the CLI
  return 2;
}

}  // namespace attn
