// Resident-set readings from /proc/self/status, the machine's physical memory and its cgroup's limit; 0
// where the kernel does not report them.
#include "attn/memstat.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "attn/check.h"

namespace attn {
namespace {

int64_t status_bytes(const char* key, const char* file = "/proc/self/status") {
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;  // reported in kB
  return 0;
}

}  // namespace

int64_t rss_bytes() { return status_bytes("VmRSS:"); }
int64_t peak_rss_bytes() { return status_bytes("VmHWM:"); }
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

uint64_t physical_memory_bytes() {
  static const uint64_t bytes = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return uint64_t(pages) * uint64_t(page);
    return uint64_t(status_bytes("MemTotal:", "/proc/meminfo"));
  }();
  return bytes;
}

uint64_t cgroup_memory_limit(const std::string& proc_cgroup, const std::string& root) {
  uint64_t limit = 0;
  auto consider = [&](const std::string& file) {
    std::ifstream f(file);
    std::string v;
    if (!(f >> v) || v == "max" || v.find_first_not_of("0123456789") != std::string::npos) return;
    const uint64_t b = std::strtoull(v.c_str(), nullptr, 10);
    if (b > 0 && b < (uint64_t(1) << 62) && (limit == 0 || b < limit)) limit = b;  // v1 "no limit" is ~2^63
  };
  std::ifstream f(proc_cgroup);
  for (std::string line; std::getline(f, line);) {
    // "0::/path" (v2) or "4:memory:/path" (v1, possibly with other controllers: "4:cpu,memory:/path")
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    std::string dir, file;
    if (controllers.empty()) {
      dir = root, file = "memory.max";
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      dir = root + "/memory", file = "memory.limit_in_bytes";
    } else {
      continue;
    }
    for (;;) {  // the cgroup and each parent: a limit above applies below
      consider(dir + path + "/" + file);
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.rfind('/'));
    }
  }
  return limit;
}

uint64_t available_memory_bytes() {
  static const uint64_t bytes = [] {
    const uint64_t ram = physical_memory_bytes(), cg = cgroup_memory_limit();
    return ram == 0 ? cg : cg == 0 ? ram : std::min(ram, cg);
  }();
  return bytes;
}

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", bytes / double(1ull << 30));
  return s;
}

void check_fits_in_memory(double bytes, const std::string& what) {
  const uint64_t have = available_memory_bytes();
  ATTN_CHECK(have == 0 || !(bytes > double(have)), "Expected ", what, " to fit in ",
             have < physical_memory_bytes() ? "the " + gib(have) + " of memory its cgroup allows"
                                            : "the machine's " + gib(have) + " of memory",
             ", but it needs ", gib(bytes), " instead");
}

}  // namespace attn
