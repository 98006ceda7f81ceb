// cpu_info(): CPUID for the name and features, sysfs for the caches. Read once, then constant.
#include "attn/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace attn {
namespace {

std::string brand_string() {
  unsigned max = __get_cpuid_max(0x80000000u, nullptr);
  if (max < 0x80000004u) return "unknown x86-64";
  char s[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    unsigned r[4];
    __get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3]);
    std::memcpy(s + 16 * i, r, 16);
  }
  std::string name(s);
  const auto first = name.find_first_not_of(' '), last = name.find_last_not_of(' ');
  return first == std::string::npos ? "unknown x86-64" : name.substr(first, last - first + 1);
}

// "32K", "2048K", "32M" as sysfs writes them; 0 if unreadable.
int64_t parse_size(const std::string& s) {
  if (s.empty()) return 0;
  int64_t v = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) v = v * 10 + (s[i] - '0');
  if (i < s.size() && (s[i] == 'K' || s[i] == 'k')) v *= 1024;
  else if (i < s.size() && (s[i] == 'M' || s[i] == 'm')) v *= 1024 * 1024;
  return v;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

void read_caches(CpuInfo& c) {
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string level = read_line(dir + "level"), type = read_line(dir + "type");
    if (level.empty()) break;
    const int64_t size = parse_size(read_line(dir + "size"));
    if (level == "1" && type == "Data") c.l1d = size;
    if (level == "2" && type != "Instruction") c.l2 = size;
    if (level == "3" && type != "Instruction") c.l3 = size;
  }
  if (c.l1d <= 0) c.l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  if (c.l2 <= 0) c.l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (c.l3 <= 0) c.l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  c.caches_read = c.l1d > 0 && c.l2 > 0;
  if (c.l1d <= 0) c.l1d = 32 << 10;
  if (c.l2 <= 0) c.l2 = 1 << 20;
  if (c.l3 <= 0) c.l3 = 8 << 20;
}

// ATTN_CPU_CACHES: "l1d=32K,l2=512K,l3=32M", any subset, in any order.
void force_caches(CpuInfo& c, const char* spec) {
  CpuInfo f = c;
  std::string s(spec), bad;
  for (size_t at = 0; at <= s.size() && bad.empty();) {
    const size_t end = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, end - at);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const int64_t v = eq == std::string::npos ? 0 : parse_size(item.substr(eq + 1));
    if (v <= 0) bad = item;
    else if (key == "l1d") f.l1d = v;
    else if (key == "l2") f.l2 = v;
    else if (key == "l3") f.l3 = v;
    else bad = item;
    at = end + 1;
  }
  if (!bad.empty()) {
    std::fprintf(stderr,
                 "attn: ignoring ATTN_CPU_CACHES=\"%s\": expected items such as l1d=32K,l2=512K, but got \"%s\"\n",
                 spec, bad.c_str());
    return;
  }
  f.caches_forced = true;
  c = f;
}

// Linux hands AMX's 8 KiB of tile state to a process only on request (arch_prctl ARCH_REQ_XCOMP_PERM
// for XTILEDATA, feature 18); without it the first tile instruction is a SIGILL. Other systems: no AMX.
bool tiles_granted() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
  return false;
#endif
}

CpuInfo read_cpu() {
  CpuInfo c;
  c.name = brand_string();
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2");
  c.fma = __builtin_cpu_supports("fma");
  c.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  unsigned a, b, cx, d;
  c.f16c = __get_cpuid(1, &a, &b, &cx, &d) && (cx & bit_F16C);
  c.bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
  const bool amx_bf16 = __get_cpuid_count(7, 0, &a, &b, &cx, &d) && (d & (1u << 22)) && (d & (1u << 24));
  c.amx = c.avx512 && amx_bf16 && tiles_granted();
  const std::pair<const char*, bool> named[] = {
      {"sse4.2", __builtin_cpu_supports("sse4.2")}, {"avx2", c.avx2}, {"fma", c.fma}, {"f16c", c.f16c},
      {"avx512f", __builtin_cpu_supports("avx512f")}, {"avx512bw", __builtin_cpu_supports("avx512bw")},
      {"avx512dq", __builtin_cpu_supports("avx512dq")}, {"avx512vl", __builtin_cpu_supports("avx512vl")},
      {"avx512vnni", __builtin_cpu_supports("avx512vnni")}, {"avx512bf16", __builtin_cpu_supports("avx512bf16")},
      {"amx_bf16", amx_bf16},
  };
  for (const auto& [n, has] : named)
    if (has) c.features += std::string(c.features.empty() ? "" : " ") + n;  // not "" + string: GCC 12's -Wrestrict
  read_caches(c);
  if (const char* spec = std::getenv("ATTN_CPU_CACHES"); spec && *spec) force_caches(c, spec);
  return c;
}

const CpuInfo& as_read() {
  static const CpuInfo info = read_cpu();
  return info;
}

CpuInfo& mutable_info() {
  static CpuInfo info = as_read();
  return info;
}

}  // namespace

const CpuInfo& cpu_info() { return mutable_info(); }

void set_cpu_caches(int64_t l1d, int64_t l2) {
  CpuInfo& c = mutable_info();
  const CpuInfo& r = as_read();
  if (l1d > 0) c.l1d = l1d;
  if (l2 > 0) c.l2 = l2;
  c.caches_forced = r.caches_forced || c.l1d != r.l1d || c.l2 != r.l2;  // the sizes read again: not forced
}

void set_cpu_bf16(bool on) { mutable_info().bf16 = on && as_read().bf16; }
void set_cpu_amx(bool on) {
  CpuInfo& c = mutable_info();
  c.amx = on && as_read().amx, c.amx_emulated = false;
}
void emulate_cpu_amx() {
  CpuInfo& c = mutable_info();
  c.amx = c.amx_emulated = as_read().bf16;  // every CPU with AMX has AVX512_BF16
}

}  // namespace attn
