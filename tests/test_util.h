// Helpers the GoogleTest files share: the message of an expected attn::Error, and a scratch folder.
#pragma once
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "attn/check.h"

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

}  // namespace attn::test
