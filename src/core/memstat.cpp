// Resident-set readings from /proc/self/status; 0 where the kernel does not report them.
#include "attn/memstat.h"

#include <cstring>
#include <fstream>
#include <string>

namespace attn {
namespace {

int64_t status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key))) * 1024;  // reported in kB
  return 0;
}

}  // namespace

int64_t rss_bytes() { return status_bytes("VmRSS:"); }
int64_t peak_rss_bytes() { return status_bytes("VmHWM:"); }
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace attn
