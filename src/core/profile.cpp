// The step profile's tree of named parts (profile.h). Single-threaded by design: Scopes open and close
// on the thread that drives training, never inside a parallel_for body.
#include "attn/profile.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>

namespace attn::profile {
namespace {

struct Node {
  const char* name;
  int parent;
  std::vector<int> children;
  double seconds = 0;
  int64_t calls = 0;
};

bool g_enabled = false;
std::vector<Node> g_nodes;    // every part ever opened
std::vector<int> g_roots;     // nodes without a parent, in first-seen order
int g_current = -1;           // the innermost open part
std::deque<std::string> g_names;  // part_name()'s strings; a deque never moves them

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void enable(bool on) { g_enabled = on; }
bool enabled() { return g_enabled; }

void reset() {
  for (Node& n : g_nodes) n.seconds = 0, n.calls = 0;
}

const char* part_name(const std::string& name) {
  for (const std::string& s : g_names)
    if (s == name) return s.c_str();
  return g_names.emplace_back(name).c_str();
}

void Scope::open(const char* name) {
  std::vector<int>& siblings = g_current >= 0 ? g_nodes[size_t(g_current)].children : g_roots;
  int found = -1;
  for (int c : siblings)  // a handful of children: a linear scan by name
    if (std::strcmp(g_nodes[size_t(c)].name, name) == 0) found = c;
  if (found < 0) {
    found = int(g_nodes.size());
    g_nodes.push_back(Node{name, g_current, {}});
    // push_back may have moved `siblings`' owner: look it up again
    (g_current >= 0 ? g_nodes[size_t(g_current)].children : g_roots).push_back(found);
  }
  node_ = found;
  g_current = found;
  t0_ = now_ns();
}

void Scope::close() {
  Node& n = g_nodes[size_t(node_)];
  n.seconds += double(now_ns() - t0_) * 1e-9;
  n.calls += 1;
  g_current = n.parent;
}

std::vector<Part> parts() {
  std::vector<Part> out;
  std::function<void(int, int)> walk = [&](int i, int depth) {
    const Node& n = g_nodes[size_t(i)];
    out.push_back({n.name, depth, n.seconds, n.calls});
    for (int c : n.children) walk(c, depth + 1);
  };
  for (int r : g_roots) walk(r, 0);
  return out;
}

void print(std::ostream& out) {
  const std::vector<Part> ps = parts();
  double total = 0;
  int64_t steps = 0;
  for (const Part& p : ps)
    if (p.depth == 0) {
      total += p.seconds;
      if (steps == 0) steps = p.calls;
    }
  if (total <= 0) {
    out << "profile: nothing was timed\n";
    return;
  }
  char line[160];
  std::snprintf(line, sizeof line, "%-44s %7s %10s %8s\n", "part (time includes the parts below it)", "share",
                "ms/step", "calls");
  out << line;
  for (const Part& p : ps) {
    const std::string label = std::string(size_t(2 * p.depth), ' ') + p.name;
    std::snprintf(line, sizeof line, "%-44s %6.1f%% %10.3f %8lld\n", label.c_str(), 100.0 * p.seconds / total,
                  steps > 0 ? 1e3 * p.seconds / double(steps) : 0.0, (long long)p.calls);
    out << line;
  }
}

}  // namespace attn::profile
