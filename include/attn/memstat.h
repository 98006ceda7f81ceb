// Memory as Linux reports it: the process's resident set (for benchmarks that state what a kernel
// allocates beyond its inputs) and the machine's physical memory (to refuse, before allocating, what
// could never fit). Not an allocator hook: it reads /proc and sysconf, so it sees every allocation.
#pragma once
#include <cstdint>
#include <string>

namespace attn {

int64_t rss_bytes();       // resident set now (VmRSS)
int64_t peak_rss_bytes();  // high-water mark of the resident set (VmHWM)
void reset_peak_rss();     // restart the high-water mark at the current RSS (clear_refs 5)

// Physical memory of the machine (sysconf, else /proc/meminfo MemTotal); 0 if neither reports it.
uint64_t physical_memory_bytes();
// The smallest memory limit of this process's cgroups, from its own up to the hierarchy's root: cgroup
// v2 memory.max, v1 memory.limit_in_bytes ("max" and v1's page-rounded 2^63 are no limit); 0 if none.
// The paths are parameters for tests; a container that mounts its own cgroup at the root is read too.
uint64_t cgroup_memory_limit(const std::string& proc_cgroup = "/proc/self/cgroup",
                             const std::string& root = "/sys/fs/cgroup");
// What this process may use: the physical memory or its cgroup's limit, whichever is smaller (0: unknown).
uint64_t available_memory_bytes();
// An Error before any allocation when `bytes` exceed available_memory_bytes(): "Expected <what> to fit in
// the machine's 125.8 GiB of memory (or: in the 3.0 GiB its cgroup allows), but it needs 4096.0 GiB
// instead". The one home of that estimate's check.
// A double, so an estimate never wraps; NaN (from sizes checked elsewhere) passes.
void check_fits_in_memory(double bytes, const std::string& what);
// "1.5 GiB": a byte count for messages.
std::string gib(double bytes);

}  // namespace attn
