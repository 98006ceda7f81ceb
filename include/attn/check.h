// Errors at the boundary: one exception type whose message says what was expected and what came.
// Not for hot loops: kernels trust their (checked) arguments and use assert() at most.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace attn {

// Every user-facing error: shape, dtype, mask, argument and file errors alike.
struct Error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

}  // namespace attn

// ATTN_CHECK(cond, "Expected ", what, ", but got ", got, " instead")
#define ATTN_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) throw ::attn::Error(::attn::cat(__VA_ARGS__)); \
  } while (0)
