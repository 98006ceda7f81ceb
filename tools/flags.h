// Checks of numeric flags before CLI11 converts them: the text must be a whole T. CLI11 itself saturates
// (--steps 99999999999999999999 became 2^63 - 1) and takes "nan" for a double. Not the range checks of
// each option's meaning: those are the library's (check_options, SampleOptions) or CLI11's validators.
#pragma once
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "attn/check.h"
#include "cli.h"  // non_negative

namespace attn {

// A CLI11 validator for a flag of type T: integers in T's range, finite numbers for floating point;
// anything else passes unchecked.
template <typename T>
CLI::Validator number_of() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if constexpr (std::is_same_v<T, bool> || !std::is_arithmetic_v<T>) {
          return "";
        } else {
          T v{};
          const char *first = s.data(), *last = s.data() + s.size();
          auto [end, ec] = std::from_chars(first, last, v);
          if constexpr (std::is_integral_v<T>) {
            if (ec == std::errc::result_out_of_range || (std::is_unsigned_v<T> && !s.empty() && s[0] == '-'))
              return cat("Expected an integer in [", std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(),
                         "], but got ", s, " instead");
            if (ec != std::errc() || end != last) return cat("Expected an integer, but got '", s, "' instead");
          } else {
            if (ec != std::errc() || end != last || !std::isfinite(v))
              return cat("Expected a finite number, but got '", s, "' instead");
          }
          return "";
        }
      },
      "");  // no type name: CLI11 already prints INT or FLOAT, and the range validators add theirs
}

// A CLI11 validator for a path option: given, it must not be empty. `--model "$(scripts/minilm-dir)"` whose
// command failed passes "", which would otherwise read as the option's absence (viz trained its built-in
// model instead).
inline CLI::Validator not_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& s) -> std::string {
        return s.empty()
                   ? cat("Expected ", what, ", but got an empty string instead (did a $(...) that names it fail?)")
                   : "";
      },
      "");
}

inline constexpr const char* kThreadsHelp = "threads (0: the CPUs this process may use)";

// --threads, the same in every subcommand: an int >= 0, 0 for the CPUs this process may use
// (set_num_threads refuses more than max_threads(), by name). `help` where a subcommand says more.
inline CLI::Option* add_threads_flag(CLI::App* cmd, int& threads, const std::string& help = kThreadsHelp) {
  return cmd->add_option("--threads", threads, help)->check(number_of<int>())->check(non_negative());
}

}  // namespace attn
