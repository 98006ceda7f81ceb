// Helpers the GoogleTest files share: the message of an expected attn::Error, a scratch folder, a text
// file and a tensor of normal samples.
#pragma once
#include <stdlib.h>

#include <algorithm>
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

// The bf16 instructions kernels may use, for a scope (set_cpu_bf16, set_cpu_amx), at most what the CPU has:
// neither runs the emulation. What was read is restored after.
struct Bf16Instructions {
  Bf16Instructions(bool vdpbf16ps, bool amx) { set_cpu_bf16(vdpbf16ps), set_cpu_amx(amx); }
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
