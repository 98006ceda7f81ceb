// Helpers the GoogleTest files share: the message of an expected attn::Error, a scratch folder, a text
// file, a tensor of normal samples, and the one bit-equality check (same_bits).
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "attn/check.h"
#include "attn/cpu.h"
#include "attn/rng.h"
#include "attn/tensor.h"
#include "attn/threads.h"

namespace attn::test {

// The attn::Error message of f(), or "" if it did not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Whether a[0, n) and b[0, n) hold the same bits (NaN payloads and -0 included): the check of "the same
// result for any thread count, target or blocking". A failure names the first element that differs and
// how many do; use as EXPECT_TRUE(same_bits(...)) << what.
template <typename T>
::testing::AssertionResult same_bits(const T* a, const T* b, size_t n) {
  size_t first = n, differ = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) first = std::min(first, i), ++differ;
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << n << " elements differ, the first at " << first << ": "
                                       << +a[first] << " vs " << +b[first];
}
template <typename T>
::testing::AssertionResult same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  return same_bits(a.data(), b.data(), a.size());
}
template <typename T>
::testing::AssertionResult same_bits(const TensorT<T>& a, const TensorT<T>& b) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << to_string(a.shape()) << " vs " << to_string(b.shape());
  return same_bits(a.data(), b.data(), size_t(a.numel()));
}

inline void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A tensor of N(0, scale²) samples from rng.
inline Tensor normal_tensor(Shape shape, Rng& rng, double scale) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = float(rng.normal() * scale);
  return t;
}

// A fresh, empty folder of its own under the system temp dir, removed at the end of its scope.
struct TempDir {
  std::filesystem::path dir;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "attn_test_XXXXXX").string();
    dir = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
  std::vector<std::string> files() const {  // names in the folder, sorted
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

// The bf16 instructions kernels may use, for a scope (set_cpu_bf16, set_cpu_amx), at most what the CPU has;
// where emulate_amx, AMX's paths with its tiles in software (emulate_cpu_amx) on any CPU with AVX512_BF16.
// What was read is restored after.
struct Bf16Instructions {
  Bf16Instructions(bool vdpbf16ps, bool amx, bool emulate_amx = false) {
    set_cpu_bf16(vdpbf16ps), set_cpu_amx(amx);
    if (emulate_amx) emulate_cpu_amx();
  }
  ~Bf16Instructions() { set_cpu_bf16(true), set_cpu_amx(true); }
  Bf16Instructions(const Bf16Instructions&) = delete;
  Bf16Instructions& operator=(const Bf16Instructions&) = delete;
};

// For its scope, the machine made to look like another: Highway target (0: the best), L1d and L2 sizes
// (0: as they are) and threads; everything as it was afterwards. Blocking follows; the bits must not.
struct PretendMachine {
  int64_t l1d = cpu_info().l1d, l2 = cpu_info().l2;
  int threads = num_threads();
  PretendMachine(int64_t target, int64_t l1d_, int64_t l2_, int threads_) {
    hwy::SetSupportedTargetsForTest(target);
    set_cpu_caches(l1d_, l2_);
    set_num_threads(threads_);
  }
  ~PretendMachine() {
    hwy::SetSupportedTargetsForTest(0);
    set_cpu_caches(l1d, l2);
    set_num_threads(threads);
  }
  PretendMachine(const PretendMachine&) = delete;
  PretendMachine& operator=(const PretendMachine&) = delete;
};

}  // namespace attn::test
