// A step profile you can read: nested, named wall-clock parts ("step" > "forward" > "block 0" > "attention"
// > "sdpa kernel"), summed over a run and printed as shares of the total (`attn train --profile`).
// Off by default, and then a Scope costs one branch. Not a sampling profiler (perf is, for the inside of a
// kernel); only the calling thread's parts are timed, so a part's time is the wall time of its parallel
// loops, and a part's time includes its children's.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace attn::profile {

void enable(bool on = true);
bool enabled();
void reset();  // forget every part's time (the tree of names stays)

// Times the enclosing block as a child of the innermost open Scope. `name` must outlive the run
// (a string literal, or one of part_name()'s).
class Scope {
 public:
  explicit Scope(const char* name) {
    if (enabled()) open(name);
  }
  ~Scope() {
    if (node_ >= 0) close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(const char* name);
  void close();
  int node_ = -1;
  int64_t t0_ = 0;
};

// "block 3" and the like, interned: a stable pointer for Scope.
const char* part_name(const std::string& name);

struct Part {
  std::string name;
  int depth;       // 0 for a root
  double seconds;  // summed over every call
  int64_t calls;
};
std::vector<Part> parts();  // depth-first, children in first-seen order

// The tree as a table: each part's share of the roots' total time and its milliseconds per call of the
// first root (per step, when the root is "step"), indented by depth.
void print(std::ostream& out);

}  // namespace attn::profile
