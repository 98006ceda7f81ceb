// Resident-set readings from /proc/self/status and the machine's physical memory; 0 where the kernel
// does not report them.
#include "attn/memstat.h"

#include <unistd.h>

#include <cstdio>
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

std::string gib(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", bytes / double(1ull << 30));
  return s;
}

void check_fits_in_memory(double bytes, const std::string& what) {
  const uint64_t have = physical_memory_bytes();
  ATTN_CHECK(have == 0 || !(bytes > double(have)), "Expected ", what, " to fit in the machine's ", gib(have),
             " of memory, but it needs ", gib(bytes), " instead");
}

}  // namespace attn
