// Process memory as Linux reports it, for benchmarks that state what a kernel allocates beyond its inputs.
// Not an allocator hook: it reads /proc/self/status, so it sees every allocation, ours and any library's.
#pragma once
#include <cstdint>

namespace attn {

int64_t rss_bytes();       // resident set now (VmRSS)
int64_t peak_rss_bytes();  // high-water mark of the resident set (VmHWM)
void reset_peak_rss();     // restart the high-water mark at the current RSS (clear_refs 5)

}  // namespace attn
