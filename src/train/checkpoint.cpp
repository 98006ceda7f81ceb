// Checkpoint directories: an atomic swap of the (model.safetensors, config.json) pair and a read that
// verifies it. Linux: renameat2(RENAME_EXCHANGE) swaps the new directory in; both files are read through
// one open directory descriptor, so a concurrent swap can't hand a reader one old and one new file.
#include "checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "attn/check.h"
#include "attn/rng.h"

namespace attn::ckpt {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "attn-gpt-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kConfigFile = "config.json";

std::string os_error(int e) { return std::strerror(e); }

std::string hex64(uint64_t v) {
  char s[19];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

// Size and FNV-1a hash of a file, streamed.
std::pair<uint64_t, uint64_t> size_and_hash(const std::string& path, const std::string& shown) {
  std::ifstream f(path, std::ios::binary);
  ATTN_CHECK(f, "Expected a readable file '", shown, "', but got '", os_error(errno), "' instead");
  std::vector<char> buf(1 << 20);
  uint64_t size = 0, h = fnv1a64(nullptr, 0);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    const auto n = size_t(f.gcount());
    h = fnv1a64(buf.data(), n, h);
    size += n;
  }
  return {size, h};
}

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_file_synced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  ATTN_CHECK(fd >= 0, "Expected to create '", path, "', but got '", os_error(errno), "' instead");
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      throw Error(cat("Expected to write '", path, "', but got '", os_error(e), "' instead"));
    }
    done += size_t(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  ATTN_CHECK(synced, "Expected fsync of '", path, "' to succeed, but got '", os_error(e), "' instead");
}

// Everything in `dir` must be ours: it is replaced as a whole.
void check_replaceable(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  ATTN_CHECK(fs::is_directory(dir, ec), "Expected the checkpoint path '", dir.string(),
             "' to be a directory, but got a file instead");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    ATTN_CHECK(name == kModelFile || name == kConfigFile, "Expected the checkpoint directory '", dir.string(),
               "' to hold only ", kModelFile, " and ", kConfigFile, " (it is replaced as a whole), but got '", name,
               "' in it instead");
  }
}

// A JSON value of type T under key in j, or an Error naming where.
template <typename T>
T get(const json& j, const char* key, const std::string& where) {
  ATTN_CHECK(j.is_object() && j.contains(key), "Expected '", key, "' in ", where, ", but got none instead");
  const json& v = j.at(key);
  bool ok;
  if constexpr (std::is_same_v<T, bool>) ok = v.is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = v.is_number_integer();
  else if constexpr (std::is_floating_point_v<T>) ok = v.is_number();
  else ok = v.is_string();
  ATTN_CHECK(ok, "Expected ", where, ".", key, " of another type, but got ", v.dump(), " instead");
  return v.get<T>();
}

}  // namespace

void write(const std::string& dir, const StateDict& tensors, json config) {
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
  ATTN_CHECK(!target.empty() && target.filename() != "." && target.filename() != "..",
             "Expected a checkpoint directory name, but got '", dir, "' instead");
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  fs::create_directories(parent);
  check_replaceable(target);

  static std::atomic<uint64_t> counter{0};
  const uint64_t nonce = mix64(uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                               (uint64_t(::getpid()) << 32) ^ counter.fetch_add(1));
  const fs::path tmp = parent / cat(".", target.filename().string(), ".tmp-", hex64(nonce));
  ATTN_CHECK(::mkdir(tmp.c_str(), 0777) == 0, "Expected to create the directory '", tmp.string(), "', but got '",
             os_error(errno), "' instead");
  try {
    const std::string id = hex64(mix64(nonce));
    std::map<std::string, std::string> meta{{"format", kFormat}, {"checkpoint_id", id},
                                            {"step", std::to_string(config.value("step", int64_t(0)))}};
    const std::string model_path = (tmp / kModelFile).string();
    save_safetensors(model_path, tensors, meta);  // fsynced
    auto [size, hash] = size_and_hash(model_path, model_path);
    config["format"] = kFormat;
    config["version"] = kVersion;
    config["checkpoint_id"] = id;
    config["model_file"] = {{"name", kModelFile}, {"bytes", size}, {"fnv1a64", hex64(hash)}};
    write_file_synced((tmp / kConfigFile).string(), config.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
    fsync_path(tmp.string(), O_RDONLY | O_DIRECTORY);

    std::error_code ec;
    if (fs::exists(target, ec)) {
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
        // No atomic exchange on this file system: move the old one aside, then the new one in. A crash
        // in between leaves DIR missing (the old pair is in the hidden sibling), never a mixed pair.
        const fs::path old = parent / cat(".", target.filename().string(), ".old-", hex64(nonce));
        fs::rename(target, old);
        fs::rename(tmp, target);
        fs::remove_all(old);
      } else {
        fs::remove_all(tmp);  // now the old pair
      }
    } else {
      fs::rename(tmp, target);
    }
    fsync_path(parent.string(), O_RDONLY | O_DIRECTORY);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

Contents read(const std::string& dir) {
  // A writer that swaps DIR while we read removes the files of the directory we hold: try again then.
  for (int attempt = 0;; ++attempt) {
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ATTN_CHECK(dfd >= 0, "Expected a checkpoint directory '", dir, "', but got '", os_error(errno), "' instead");
    const std::string via = cat("/proc/self/fd/", dfd, "/");
    auto shown = [&](const char* file) { return (fs::path(dir) / file).string(); };
    auto swapped = [&] {
      struct stat a, b;
      return ::fstat(dfd, &a) == 0 && (::stat(dir.c_str(), &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev);
    };
    try {
      Contents c;
      std::ifstream f(via + kConfigFile, std::ios::binary);
      ATTN_CHECK(f, "Expected a checkpoint config '", shown(kConfigFile), "', but got '", os_error(errno), "' instead");
      std::stringstream text;
      text << f.rdbuf();
      c.config = json::parse(text.str(), nullptr, false);
      ATTN_CHECK(!c.config.is_discarded() && c.config.is_object(), "Expected a JSON object in '", shown(kConfigFile),
                 "', but got malformed or truncated JSON instead");
      const std::string where = shown(kConfigFile);
      const json& format = c.config.contains("format") ? c.config["format"] : json();
      const json& version = c.config.contains("version") ? c.config["version"] : json();
      ATTN_CHECK(format == kFormat && version == kVersion, "Expected '", where, "' of format ", kFormat, " version ",
                 kVersion, ", but got format ", format.dump(), " version ", version.dump(), " instead");
      const std::string id = get<std::string>(c.config, "checkpoint_id", where);
      ATTN_CHECK(c.config.contains("model_file") && c.config["model_file"].is_object(), "Expected 'model_file' in ",
                 where, ", but got none instead");
      const json& mf = c.config["model_file"];
      const auto want_size = get<uint64_t>(mf, "bytes", where + " model_file");
      const auto want_hash = get<std::string>(mf, "fnv1a64", where + " model_file");
      auto [size, hash] = size_and_hash(via + kModelFile, shown(kModelFile));
      ATTN_CHECK(size == want_size && hex64(hash) == want_hash, "Expected '", shown(kModelFile), "' of ", want_size,
                 " bytes with FNV-1a ", want_hash, " as config.json records, but got ", size, " bytes with FNV-1a ",
                 hex64(hash), " instead: the file is truncated or corrupt");
      std::map<std::string, std::string> meta;
      try {
        c.tensors = load_safetensors(via + kModelFile, &meta);
      } catch (const Error& e) {  // name the user's path, not /proc/self/fd
        std::string msg = e.what();
        for (size_t at; (at = msg.find(via + kModelFile)) != std::string::npos;)
          msg.replace(at, via.size() + std::strlen(kModelFile), shown(kModelFile));
        throw Error(msg);
      }
      ATTN_CHECK(meta["checkpoint_id"] == id, "Expected '", shown(kModelFile), "' of checkpoint ", id,
                 " (config.json), but got checkpoint '", meta["checkpoint_id"], "' instead: the pair is mixed");
      ::close(dfd);
      return c;
    } catch (const Error&) {
      const bool retry = attempt < 3 && swapped();
      ::close(dfd);
      if (!retry) throw;
    }
  }
}

// ---- JSON forms ----

json to_json(const GptConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"block_size", c.block_size}, {"n_layer", c.n_layer},
          {"n_head", c.n_head},         {"n_kv_head", c.n_kv_head},   {"n_embd", c.n_embd},
          {"dropout", c.dropout},       {"bias", c.bias},             {"tie_weights", c.tie_weights}};
}

GptConfig gpt_config_from(const json& j, const std::string& where) {
  GptConfig c;
  c.vocab_size = get<int64_t>(j, "vocab_size", where);
  c.block_size = get<int64_t>(j, "block_size", where);
  c.n_layer = get<int64_t>(j, "n_layer", where);
  c.n_head = get<int64_t>(j, "n_head", where);
  c.n_kv_head = get<int64_t>(j, "n_kv_head", where);
  c.n_embd = get<int64_t>(j, "n_embd", where);
  c.dropout = get<double>(j, "dropout", where);
  c.bias = get<bool>(j, "bias", where);
  c.tie_weights = get<bool>(j, "tie_weights", where);
  return c;
}

#define ATTN_TRAIN_FIELDS(X)                                                                              \
  X(config) X(block_size) X(n_kv_head) X(tie_weights) X(steps) X(batch) X(lr) X(min_lr) X(warmup)         \
  X(lr_decay_steps) X(weight_decay) X(beta1) X(beta2) X(eps) X(decay_embeddings) X(grad_clip) X(dropout) \
  X(eval_every) X(eval_iters) X(seed) X(threads)

json to_json(const TrainOptions& o) {
  json j;
#define X(f) j[#f] = o.f;
  ATTN_TRAIN_FIELDS(X)
#undef X
  return j;
}

TrainOptions train_options_from(const json& j, const std::string& where) {
  TrainOptions o;
#define X(f) o.f = get<decltype(o.f)>(j, #f, where);
  ATTN_TRAIN_FIELDS(X)
#undef X
  return o;
}

json tokenizer_json(const CharTokenizer& t) { return {{"type", "char"}, {"vocab", utf8_encode(t.vocab())}}; }

CharTokenizer tokenizer_from(const json& j, const std::string& where) {
  ATTN_CHECK(get<std::string>(j, "type", where) == "char", "Expected a tokenizer of type char in ", where,
             ", but got '", j.value("type", ""), "' instead");
  return CharTokenizer(utf8_decode(get<std::string>(j, "vocab", where)));
}

StateDict take_prefixed(StateDict& all, const std::string& prefix) {
  StateDict out;
  for (auto it = all.begin(); it != all.end();) {
    if (it->first.rfind(prefix, 0) == 0) {
      out.emplace(it->first, std::move(it->second));
      it = all.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace attn::ckpt
