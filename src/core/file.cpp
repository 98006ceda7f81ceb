// Checked whole-file reads and mappings of regular files (see attn/file.h).
#include "attn/file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "attn/check.h"
#include "attn/rng.h"

namespace attn {
namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// The path for a message: a NUL shown as \0, so C++ and Python print all of it.
std::string shown(const std::string& path) {
  std::string s;
  for (char c : path) s += c == '\0' ? std::string("\\0") : std::string(1, c);
  return s;
}

}  // namespace

void check_path(const std::string& path, const std::string& what) {
  ATTN_CHECK(path.find('\0') == std::string::npos, "Expected ", what, " to be a path without NUL bytes, but got '",
             shown(path), "' instead");
}

namespace {

// Opens `path` for reading after the checks read_regular_file states; returns the fd and its size.
int open_regular(const std::string& path, const std::string& what, uint64_t max_bytes, uint64_t* size) {
  check_path(path, what);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    std::string target(4096, '\0');  // a dangling symbolic link is named as one, not as a missing file
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    ATTN_CHECK(n < 0, "Expected ", what, " '", path, "' to be a readable file, but got a symbolic link to '",
               target.substr(0, size_t(n)), "', which gives '", std::strerror(e), "', instead");
    ATTN_CHECK(false, "Expected ", what, " '", path, "' to be a readable file, but got '", std::strerror(e),
               "' instead");
  }
  ATTN_CHECK(S_ISREG(st.st_mode), "Expected ", what, " '", path, "' to be a regular file, but got ",
             kind_of(st.st_mode), " instead");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ATTN_CHECK(fd >= 0, "Expected ", what, " '", path, "' to be a readable file, but got '", std::strerror(errno),
             "' instead");
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!ok || uint64_t(st.st_size) > max_bytes) ::close(fd);
  ATTN_CHECK(ok, "Expected ", what, " '", path, "' to be a regular file, but got ", kind_of(st.st_mode),
             " instead (it changed while opening)");
  ATTN_CHECK(uint64_t(st.st_size) <= max_bytes, "Expected ", what, " '", path, "' of at most ", max_bytes,
             " bytes, but got ", st.st_size, " bytes instead");
  *size = uint64_t(st.st_size);
  return fd;
}

struct Closer {
  int fd;
  ~Closer() { ::close(fd); }
};

}  // namespace

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  uint64_t size = 0;
  Closer closer{open_regular(path, what, max_bytes, &size)};
  std::string bytes(size_t(size), '\0');
  for (size_t got = 0; got < bytes.size();) {
    const ssize_t r = ::read(closer.fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    ATTN_CHECK(r > 0, "Expected ", bytes.size(), " bytes in ", what, " '", path, "', but got ", got, " before '",
               r < 0 ? std::strerror(errno) : "end of file", "' instead");
    got += size_t(r);
  }
  return bytes;
}

std::string read_input(const std::string& path, const std::string& what, uint64_t max_bytes) {
  check_path(path, what);
  struct stat st;
  const bool pipe = path == "-" || (::stat(path.c_str(), &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)));
  if (!pipe) return read_regular_file(path, what, max_bytes);
  const int fd = path == "-" ? ::dup(STDIN_FILENO) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ATTN_CHECK(fd >= 0, "Expected ", what, " '", path, "' to be readable, but got '", std::strerror(errno), "' instead");
  Closer closer{fd};
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    ATTN_CHECK(r >= 0, "Expected to read ", what, " '", path, "', but got '", std::strerror(errno), "' after ",
               bytes.size(), " bytes instead");
    if (r == 0) return bytes;
    ATTN_CHECK(bytes.size() + size_t(r) <= max_bytes, "Expected ", what, " '", path, "' of at most ", max_bytes,
               " bytes, but got more instead");
    bytes.append(buf, size_t(r));
  }
}

MappedFile::~MappedFile() {
  if (data) ::munmap(data, size_t(size));
}

std::shared_ptr<MappedFile> map_regular_file(const std::string& path, const std::string& what) {
  uint64_t size = 0;
  Closer closer{open_regular(path, what, UINT64_MAX, &size)};
  auto m = std::make_shared<MappedFile>();
  if (size == 0) return m;
  void* p = ::mmap(nullptr, size_t(size), PROT_READ | PROT_WRITE, MAP_PRIVATE, closer.fd, 0);
  ATTN_CHECK(p != MAP_FAILED, "Expected to map ", what, " '", path, "' (", size, " bytes) into memory, but got '",
             std::strerror(errno), "' instead");
  m->data = static_cast<uint8_t*>(p);
  m->size = size;
  return m;
}

// ---- Writing ----

namespace fs = std::filesystem;

std::string os_error(int e) { return std::strerror(e); }

uint64_t sibling_nonce() {
  static std::atomic<uint64_t> counter{0};
  return mix64(uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (uint64_t(::getpid()) << 32) ^ mix64(counter.fetch_add(1)));
}

namespace {

// The folder and the file name of `path` ("out.npy" -> ".", "out.npy").
std::pair<std::string, std::string> split_path(const std::string& path) {
  const fs::path p(path);
  const std::string parent = p.parent_path().string();
  return {parent.empty() ? "." : parent, p.filename().string()};
}

void fsync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);  // best effort: the file is complete either way
    ::close(fd);
  }
}

// The hidden siblings this process is writing right now (their file names).
std::mutex g_own_mu;
std::set<std::string> g_own;

}  // namespace

OwnSibling::OwnSibling(std::string name) : name_(std::move(name)) {
  std::lock_guard<std::mutex> l(g_own_mu);
  g_own.insert(name_);
}

OwnSibling::~OwnSibling() {
  std::lock_guard<std::mutex> l(g_own_mu);
  g_own.erase(name_);
}

void remove_stale_siblings(const std::string& parent, const std::string& name) {
  std::error_code ec;
  const long self = long(::getpid());
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string f = e.path().filename().string();
    for (const char* kind : {".tmp-", ".old-"}) {
      const std::string prefix = "." + name + kind;
      if (f.rfind(prefix, 0) != 0) continue;
      const long pid = std::strtol(f.c_str() + prefix.size(), nullptr, 10);
      if (pid == self) {
        std::lock_guard<std::mutex> l(g_own_mu);
        if (g_own.count(f) || (f.size() >= 6 && f.compare(f.size() - 6, 6, "-probe") == 0)) continue;
      } else if (pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno != ESRCH)) {
        continue;  // alive (or not ours to ask)
      }
      fs::remove_all(e.path(), ec);
    }
  }
}

AtomicFile::AtomicFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  check_path(path, what);
  const auto [parent, name] = split_path(path);
  ATTN_CHECK(!name.empty() && name != "." && name != "..", "Expected ", what, " to name a file, but got '", path,
             "' instead");
  remove_stale_siblings(parent, name);
  for (int attempt = 0; fd_ < 0; ++attempt) {
    char nonce[17];
    std::snprintf(nonce, sizeof nonce, "%016llx", static_cast<unsigned long long>(sibling_nonce()));
    tmp_ = (fs::path(parent) / cat(".", name, ".tmp-", ::getpid(), "-", nonce)).string();
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    const int e = errno;
    ATTN_CHECK(fd_ >= 0 || (e == EEXIST && attempt < 100), "Expected to create a file beside ", what, " '", path,
               "' (", tmp_, "), but got '", os_error(e), "' instead");
  }
  {
    std::lock_guard<std::mutex> l(g_own_mu);
    g_own.insert(fs::path(tmp_).filename().string());
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) {
    ::unlink(tmp_.c_str());
    std::lock_guard<std::mutex> l(g_own_mu);
    g_own.erase(fs::path(tmp_).filename().string());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  ATTN_CHECK(fd_ >= 0, "Expected ", what_, " '", path_, "' open for writing, but got it committed already");
  for (auto* c = static_cast<const char*>(data); n > 0;) {
    const ssize_t w = ::write(fd_, c, n);
    if (w < 0 && errno == EINTR) continue;
    ATTN_CHECK(w > 0, "Expected to write ", what_, " '", path_, "' (", n, " more bytes), but got '",
               os_error(w < 0 ? errno : EIO), "' instead; '", path_, "' is unchanged");
    c += w, n -= size_t(w);
  }
}

void AtomicFile::commit() {
  ATTN_CHECK(fd_ >= 0, "Expected ", what_, " '", path_, "' open for writing, but got it committed already");
  const int sync_error = ::fsync(fd_) == 0 ? 0 : errno;
  const int close_error = ::close(fd_) == 0 ? 0 : errno;
  fd_ = -1;
  const int e = sync_error ? sync_error : close_error;
  ATTN_CHECK(e == 0, "Expected to write ", what_, " '", path_, "', but got '", os_error(e), "' instead; '", path_,
             "' is unchanged");
  ATTN_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "Expected to replace ", what_, " '", path_, "', but got '",
             os_error(errno), "' instead; '", path_, "' is unchanged");
  {
    std::lock_guard<std::mutex> l(g_own_mu);
    g_own.erase(fs::path(tmp_).filename().string());
  }
  tmp_.clear();
  fsync_folder(split_path(path_).first);
}

void write_file_atomic(const std::string& path, const std::string& what, const std::string& bytes) {
  AtomicFile f(path, what);
  f.write(bytes);
  f.commit();
}

namespace {

// The flock'ed .NAME.lock beside a target, shared by this process's holders (by path). The last holder
// removes the file before it unlocks; a locker checks that the file it locked is still the one at the
// path (else a holder removed it in between, and it tries again). A kill -9 leaves the file, unlocked:
// the next writer takes it over.
std::mutex g_locks_mu;
std::map<std::string, std::weak_ptr<void>> g_locks;

struct WriterLock {
  std::string path;
  int fd = -1;
};

void release(WriterLock* lock) {
  std::lock_guard<std::mutex> l(g_locks_mu);
  ::unlink(lock->path.c_str());
  ::close(lock->fd);  // releases the flock
  auto it = g_locks.find(lock->path);
  if (it != g_locks.end() && it->second.expired()) g_locks.erase(it);
  delete lock;
}

}  // namespace

std::shared_ptr<void> lock_writer(const std::string& target, const std::string& what) {
  check_path(target, what);
  const auto [parent, name] = split_path(target);
  std::error_code ec;
  const std::string path = fs::absolute(fs::path(parent) / cat(".", name, ".lock"), ec).lexically_normal().string();
  std::unique_lock<std::mutex> l(g_locks_mu);
  if (auto held = g_locks[path].lock()) return held;
  for (int attempt = 0;; ++attempt) {
    // O_NOFOLLOW: a symbolic link planted at the lock's name is refused, never truncated through
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
    ATTN_CHECK(fd >= 0, "Expected to create the lock file '", path, "' of ", what, " '", target, "', but got '",
               os_error(errno), "' instead");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      char text[32] = {};
      const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
      const long pid = n > 0 ? std::strtol(text, nullptr, 10) : 0;
      ::close(fd);
      if (e == EWOULDBLOCK && pid == long(::getpid()) && attempt < 1000) {  // our last holder is releasing it
        l.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        l.lock();
        if (auto held = g_locks[path].lock()) return held;
        continue;
      }
      ATTN_CHECK(e != EWOULDBLOCK, "Expected no other process writing ", what, " '", target, "', but got ",
                 pid > 0 ? cat("process ", pid) : std::string("another process"), " holding its lock '", path,
                 "' instead: wait for it to end, or give another name");
      throw Error(
          cat("Expected to lock '", path, "' of ", what, " '", target, "', but got '", os_error(e), "' instead"));
    }
    struct stat a, b;
    if (::fstat(fd, &a) != 0 || ::lstat(path.c_str(), &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
      ::close(fd);  // removed by its last holder after we opened it: lock the new one
      ATTN_CHECK(attempt < 1000, "Expected to lock '", path, "' of ", what, " '", target,
                 "', but got it replaced on every try instead");
      continue;
    }
    // The PID is for the message of a process refused; the lock holds without it.
    const std::string pid = cat(::getpid(), "\n");
    if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, pid.data(), pid.size(), 0);
    std::shared_ptr<WriterLock> lock(new WriterLock{path, fd}, release);
    g_locks[path] = lock;
    return lock;
  }
}

}  // namespace attn
