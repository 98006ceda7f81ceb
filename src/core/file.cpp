// Checked whole-file reads and mappings of regular files (see attn/file.h).
#include "attn/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "attn/check.h"

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
  ATTN_CHECK(::stat(path.c_str(), &st) == 0, "Expected ", what, " '", path, "' to be a readable file, but got '",
             std::strerror(errno), "' instead");
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

}  // namespace attn
