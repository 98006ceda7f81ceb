// Checkpoint directories: an atomic swap of the (model.safetensors, config.json) pair and a read that
// verifies it. Linux: renameat2(RENAME_EXCHANGE) swaps the new directory in; both files are read through
// one open directory descriptor, so a concurrent swap can't hand a reader one old and one new file.
#include "checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "attn/check.h"
#include "attn/file.h"
#include "attn/rng.h"
#include "../core/json.h"

namespace attn::ckpt {
namespace fs = std::filesystem;

std::string hex64(uint64_t v) {
  char s[19];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

// FNV-1a of the config's content without the hash itself: its compact dump (keys sorted, numbers as
// they round-trip), so the writer's object and the reader's parse of it hash alike.
std::string config_hash(json config) {
  config.erase("config_fnv1a64");
  const std::string text = config.dump(-1, ' ', false, json::error_handler_t::replace);
  return hex64(fnv1a64(text.data(), text.size()));
}

namespace {

constexpr const char* kFormat = "attn-gpt-checkpoint";
constexpr int kVersion = 2;  // 2: config.json carries the hash of its own content
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kConfigHash = "config_fnv1a64";  // config_hash() erases this key
constexpr uint64_t kMaxConfigBytes = 64 << 20;  // a vocabulary of a million characters is 4 MB

int exchange(const char* from, const char* to) { return ::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_EXCHANGE); }
SwapFn g_swap = exchange;

// Size and FNV-1a hash of a file, streamed.
std::pair<uint64_t, uint64_t> size_and_hash(const std::string& path, const std::string& shown) {
  struct stat st;
  ATTN_CHECK(::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode), "Expected '", shown,
             "' to be a regular file, but got something else instead");
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

// Everything in `dir` must be ours: it is replaced as a whole.
void check_replaceable(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  ATTN_CHECK(fs::is_directory(dir, ec), "Expected the checkpoint path '", dir.string(),
             "' to be a directory, but got a file instead");
  fs::directory_iterator it(dir, ec);
  ATTN_CHECK(!ec, "Expected to list the checkpoint directory '", dir.string(), "', but got '", ec.message(),
             "' instead");
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    ATTN_CHECK(name == kModelFile || name == kConfigFile, "Expected the checkpoint directory '", dir.string(),
               "' to hold only ", kModelFile, " and ", kConfigFile, " (it is replaced as a whole), but got '", name,
               "' in it instead");
  }
}

// Every field read with its type checked (integers must fit, numbers be finite): core's getter.
using json_io::field;

void write_checked(const fs::path& target, const StateDict& tensors, json config) {
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const uint64_t nonce = sibling_nonce();
  const fs::path tmp = parent / cat(".", target.filename().string(), ".tmp-", ::getpid(), "-", hex64(nonce));
  const fs::path old = parent / cat(".", target.filename().string(), ".old-", ::getpid(), "-", hex64(nonce));
  const OwnSibling own_tmp(tmp.filename().string()), own_old(old.filename().string());
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
    config[kConfigHash] = config_hash(config);
    write_file_atomic((tmp / kConfigFile).string(), "the checkpoint's config",
                      config.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
    fsync_path(tmp.string(), O_RDONLY | O_DIRECTORY);

    std::error_code ec;
    if (fs::exists(target, ec)) {
      if (g_swap(tmp.c_str(), target.c_str()) != 0) {
        // No atomic exchange on this file system: move the old one aside, then the new one in. A crash
        // in between leaves DIR missing (the old pair is in the hidden sibling), never a mixed pair.
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

// config.json's schema beyond the format fields, checked before anything is built from it: every field a
// reader uses has its type and range, and the model config matches the tensors' shapes (so n_layer 1e8
// or n_embd 2^40 is refused here, not in an allocation).
void validate(const Contents& c, const std::string& where) {
  const json& j = c.config;
  ATTN_CHECK(field<int64_t>(j, "step", where) >= 0, "Expected ", where, ".step >= 0, but got ", j["step"].dump(),
             " instead");
  ATTN_CHECK(j.contains("model") && j.contains("tokenizer"), "Expected 'model' and 'tokenizer' in '", where,
             "', but got none instead");
  const GptConfig m = gpt_config_from(j["model"], where + " model");
  ATTN_CHECK(m.vocab_size > 0 && m.block_size > 0 && m.n_layer > 0 && m.n_head > 0 && m.n_embd > 0 && m.n_kv_head >= 0,
             "Expected ", where, " model sizes > 0, but got ", j["model"].dump(), " instead");
  tokenizer_from(j["tokenizer"], where + " tokenizer");
  // The tensors say what the model is: embeddings (V, E) and (block, E) (learned positions), n_layer blocks.
  const int64_t E = m.n_embd;
  expect_tensor(c.tensors, "transformer.wte.weight", {m.vocab_size, E});
  if (m.position == "learned") expect_tensor(c.tensors, "transformer.wpe.weight", {m.block_size, E});
  ATTN_CHECK(c.tensors.count(cat("transformer.h.", m.n_layer - 1, ".norm1.weight")) &&
                 !c.tensors.count(cat("transformer.h.", m.n_layer, ".norm1.weight")),
             "Expected the ", m.n_layer, " layers of ", where, " model.n_layer in ", kModelFile,
             ", but got a different number of layers instead");
  if (j.contains("training")) train_options_from(j["training"], where + " training");
  if (j.contains("data")) {
    const json& d = j["data"];
    const std::string dw = where + " data";
    const std::string kind = field<std::string>(d, "kind", dw);
    ATTN_CHECK(kind == "reverse" || kind == "text", "Expected ", dw, ".kind \"reverse\" or \"text\", but got \"", kind,
               "\" instead");
    field<uint64_t>(d, "bytes", dw);
    if (kind == "reverse") {
      ATTN_CHECK(field<int64_t>(d, "task_length", dw) > 0, "Expected ", dw, ".task_length > 0, but got ",
                 d["task_length"].dump(), " instead");
    } else {
      field<std::string>(d, "path", dw);
      field<uint64_t>(d, "fnv1a64", dw);
    }
  }
}

}  // namespace

// The checks of a save that need no tensors: a NUL-free name, its folder (created), a directory that is
// missing, empty or a checkpoint, stale siblings removed, and a folder we can write in.
fs::path prepare(const std::string& dir) {
  check_path(dir, "the checkpoint directory");
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
  // A symbolic link is written through: the swap below replaces its target, never the link itself.
  std::error_code lec;
  for (int hops = 0; fs::is_symlink(target, lec); ++hops) {
    ATTN_CHECK(hops < 40, "Expected the checkpoint directory '", dir,
               "' to resolve, but got a loop of symbolic links instead");
    const fs::path to = fs::read_symlink(target, lec);
    target = (to.is_absolute() ? to : target.parent_path() / to).lexically_normal();
    if (target.filename().empty()) target = target.parent_path();
  }
  ATTN_CHECK(!target.empty() && target.filename() != "." && target.filename() != ".." && target != target.root_path(),
             "Expected a checkpoint directory name, but got '", dir, "' instead");
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  fs::create_directories(parent, ec);
  ATTN_CHECK(!ec && fs::is_directory(parent), "Expected to create the folder '", parent.string(), "' of checkpoint '",
             dir, "', but got '", ec ? ec.message() : "not a directory", "' instead");
  check_replaceable(target);
  remove_stale_siblings(parent.string(), target.filename().string());
  // Writable: what the save will do first, tried now.
  const fs::path probe = parent / cat(".", target.filename().string(), ".tmp-", ::getpid(), "-probe");
  ATTN_CHECK(::mkdir(probe.c_str(), 0777) == 0, "Expected to write the checkpoint '", dir, "' in '", parent.string(),
             "', but got '", os_error(errno), "' instead");
  ::rmdir(probe.c_str());
  return target;
}

void write(const std::string& dir, const StateDict& tensors, json config) {
  try {
    const fs::path target = prepare(dir);
    const std::shared_ptr<void> lock = lock_writer(target.string(), "the checkpoint");
    write_checked(target, tensors, std::move(config));
  } catch (const fs::filesystem_error& e) {  // a rename or removal the checks above could not foresee
    throw Error(cat("Expected to write the checkpoint '", dir, "', but got '", e.what(), "' instead"));
  }
}

Contents read(const std::string& dir) {
  check_path(dir, "the checkpoint directory");
  // A writer that swaps DIR while we read removes the files of the directory we hold: try again then.
  for (int attempt = 0;; ++attempt) {
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ATTN_CHECK(dfd >= 0, "Expected a checkpoint directory '", dir, "', but got '", os_error(errno), "' instead");
    const std::string via = cat("/proc/self/fd/", dfd, "/");
    auto shown = [&](const char* file) { return (fs::path(dir) / file).string(); };
    // Runs f, naming the user's path in its errors instead of /proc/self/fd.
    auto named = [&](auto f) {
      try {
        return f();
      } catch (const Error& e) {
        std::string msg = e.what();
        for (const char* file : {kModelFile, kConfigFile})
          for (size_t at; (at = msg.find(via + file)) != std::string::npos;)
            msg.replace(at, via.size() + std::strlen(file), shown(file));
        throw Error(msg);
      }
    };
    auto swapped = [&] {
      struct stat a, b;
      return ::fstat(dfd, &a) == 0 && (::stat(dir.c_str(), &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev);
    };
    try {
      Contents c;
      const std::string text =
          named([&] { return read_regular_file(via + kConfigFile, "checkpoint config", kMaxConfigBytes); });
      c.config = json_io::parse(text, "checkpoint config", shown(kConfigFile));
      ATTN_CHECK(!c.config.is_discarded() && c.config.is_object(), "Expected a JSON object in '", shown(kConfigFile),
                 "', but got malformed or truncated JSON instead");
      const std::string where = shown(kConfigFile);
      const json& format = c.config.contains("format") ? c.config["format"] : json();
      const json& version = c.config.contains("version") ? c.config["version"] : json();
      ATTN_CHECK(format == kFormat && version == kVersion, "Expected '", where, "' of format ", kFormat, " version ",
                 kVersion, ", but got format ", format.dump(), " version ", version.dump(), " instead");
      const std::string want_config = field<std::string>(c.config, kConfigHash, where);
      ATTN_CHECK(config_hash(c.config) == want_config, "Expected '", where, "' with the FNV-1a ", want_config,
                 " it records of its content, but got ", config_hash(c.config),
                 " instead: the file was edited or is corrupt");
      const std::string id = field<std::string>(c.config, "checkpoint_id", where);
      ATTN_CHECK(c.config.contains("model_file") && c.config["model_file"].is_object(), "Expected 'model_file' in ",
                 where, ", but got none instead");
      const json& mf = c.config["model_file"];
      const auto want_size = field<uint64_t>(mf, "bytes", where + " model_file");
      const auto want_hash = field<std::string>(mf, "fnv1a64", where + " model_file");
      auto [size, hash] = named([&] { return size_and_hash(via + kModelFile, shown(kModelFile)); });
      ATTN_CHECK(size == want_size && hex64(hash) == want_hash, "Expected '", shown(kModelFile), "' of ", want_size,
                 " bytes with FNV-1a ", want_hash, " as config.json records, but got ", size, " bytes with FNV-1a ",
                 hex64(hash), " instead: the file is truncated or corrupt");
      std::map<std::string, std::string> meta;
      c.tensors = named([&] { return load_safetensors(via + kModelFile, &meta); });
      ATTN_CHECK(meta["checkpoint_id"] == id, "Expected '", shown(kModelFile), "' of checkpoint ", id,
                 " (config.json), but got checkpoint '", meta["checkpoint_id"], "' instead: the pair is mixed");
      validate(c, where);
      ::close(dfd);
      return c;
    } catch (const Error&) {
      const bool retry = attempt < 3 && swapped();
      ::close(dfd);
      if (!retry) throw;
    } catch (const json::exception& e) {  // none expected after validate(); never let one escape
      ::close(dfd);
      throw Error(
          cat("Expected a valid checkpoint config '", shown(kConfigFile), "', but got '", e.what(), "' instead"));
    }
  }
}

void set_swap_for_testing(SwapFn swap) { g_swap = swap ? swap : exchange; }

// ---- JSON forms ----

namespace {

// A struct as a JSON object of its fields (fields.h), and back with every field's type checked by field<>.
template <class S, class Fields>
json fields_json(const S& s, const Fields& fields) {
  json j = json::object();
  for_each_field(fields, s, [&](const char* name, const auto& v) { j[name] = v; });
  return j;
}

// Fields added after checkpoints were first written: absent means the default (what those runs did).
bool added_later(const char* name) {
  const std::string_view n = name;
  return n == "dtype" || n == "log_every" || n == "position" || n == "window";
}

template <class S, class Fields>
S fields_from(const json& j, const Fields& fields, const std::string& where) {
  S s;
  for_each_field(fields, s, [&](const char* name, auto& v) {
    if (added_later(name) && j.is_object() && !j.contains(name)) return;
    v = field<std::decay_t<decltype(v)>>(j, name, where);
  });
  return s;
}

}  // namespace

json to_json(const GptConfig& c) { return fields_json(c, kGptConfigFields); }
GptConfig gpt_config_from(const json& j, const std::string& where) {
  return fields_from<GptConfig>(j, kGptConfigFields, where);
}
json to_json(const TrainOptions& o) { return fields_json(o, kTrainOptionsFields); }
TrainOptions train_options_from(const json& j, const std::string& where) {
  return fields_from<TrainOptions>(j, kTrainOptionsFields, where);
}

json tokenizer_json(const CharTokenizer& t) { return {{"type", "char"}, {"vocab", utf8_encode(t.vocab())}}; }

CharTokenizer tokenizer_from(const json& j, const std::string& where) {
  ATTN_CHECK(field<std::string>(j, "type", where) == "char", "Expected a tokenizer of type char in ", where,
             ", but got '", j.value("type", ""), "' instead");
  return CharTokenizer(utf8_decode(field<std::string>(j, "vocab", where)));
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

namespace attn {
void check_checkpoint_dir(const std::string& dir) { ckpt::prepare(dir); }
std::shared_ptr<void> lock_checkpoint_dir(const std::string& dir) {
  return lock_writer(ckpt::prepare(dir).string(), "the checkpoint");
}
}  // namespace attn
