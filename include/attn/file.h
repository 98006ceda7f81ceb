// Files that users name. Reading: the path is checked (no NUL byte) and only a regular file is opened for
// reading, so a FIFO, a device (/dev/zero) or a directory is refused by name instead of blocking
// forever or reading without end. Writing: atomically, beside the target, under a lock (below). Not
// buffered I/O or a file abstraction: one checked whole-file read, one checked mapping, one atomic write.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace attn {

// An Error unless `path` is free of NUL bytes: a C call would silently use the part before the first
// one ("a.safetensors\0junk" opening a.safetensors). `what` names the argument: "--data", "path".
void check_path(const std::string& path, const std::string& what);

// The whole of the regular file at `path`, at most max_bytes of it (an Error beyond). Errors name
// `what` and the path: missing or unreadable, not a regular file (checked with stat before opening,
// opened with O_NONBLOCK so a FIFO swapped in meanwhile can't block, and checked again with fstat),
// too large, or shorter than its size while reading.
std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// What a user pipes in, or a regular file: "-" is standard input, and a pipe (a FIFO, /dev/stdin on a pipe,
// a shell's <(cmd)) is read to its end; anything else as read_regular_file reads it. At most max_bytes.
std::string read_input(const std::string& path, const std::string& what, uint64_t max_bytes);

// A regular file mapped into memory with read_regular_file's checks: private copy-on-write pages (a
// write through data changes this process's copy, never the file), unmapped with the last reference.
// A file of 0 bytes has data null. Shrinking the file while it is mapped is not supported (SIGBUS).
struct MappedFile {
  uint8_t* data = nullptr;
  uint64_t size = 0;
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
};
std::shared_ptr<MappedFile> map_regular_file(const std::string& path, const std::string& what);

}  // namespace attn

namespace attn {

// ---- Writing files users name: whole or not at all, never through someone else's name ----

// The OS's message for errno e ("No space left on device").
std::string os_error(int e);

// A file that appears at `path` whole or not at all: written into a fresh hidden sibling
// ".NAME.tmp-PID-NONCE" (created with O_CREAT | O_EXCL | O_NOFOLLOW, so it can neither follow a planted
// symbolic link nor reuse an existing file), fsynced, and renamed over `path` by commit(); the folder is
// fsynced after. Until then `path` keeps its old content: a full disk, an exception or a signal leaves it
// as it was (a killed writer's sibling is removed by the next writer of that name, once its PID is gone).
// A symbolic link at `path` is replaced by the file, never written through. Errors name `what` and the path.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const std::string& what);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // not committed: the sibling is removed
  void write(const void* data, size_t n);  // all n bytes, or an Error
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();
  const std::string& temporary() const { return tmp_; }

 private:
  std::string path_, what_, tmp_;
  int fd_ = -1;
};

// `bytes` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, const std::string& what, const std::string& bytes);

// One writer of `path` at a time (a file, or a checkpoint directory): an exclusive flock on its hidden
// sibling ".NAME.lock" (opened with O_NOFOLLOW), held while the handle lives and shared by this process's
// holders of the same path. Another process holding it: an Error naming its PID, `what` and the path.
std::shared_ptr<void> lock_writer(const std::string& path, const std::string& what);

// Hidden siblings ".NAME.tmp-PID-..." and ".NAME.old-PID-..." that a killed writer left in `parent`: removed
// once process PID is gone, or when PID is this process and the sibling is none of its writes in progress.
void remove_stale_siblings(const std::string& parent, const std::string& name);

// Marks a hidden sibling (its file name) as this process's write in progress while it lives, so that
// remove_stale_siblings leaves it (a container restart reuses PIDs: the PID alone can't tell).
class OwnSibling {
 public:
  explicit OwnSibling(std::string name);
  OwnSibling(const OwnSibling&) = delete;
  OwnSibling& operator=(const OwnSibling&) = delete;
  ~OwnSibling();

 private:
  std::string name_;
};

// A fresh random 64-bit value for names of temporary siblings (time, PID and a counter, mixed).
uint64_t sibling_nonce();

}  // namespace attn
