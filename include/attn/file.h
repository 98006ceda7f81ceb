// Reading files that users name: the path is checked (no NUL byte) and only a regular file is opened for
// reading, so a FIFO, a device (/dev/zero) or a directory is refused by name instead of blocking
// forever or reading without end. Not buffered I/O or a file abstraction: one checked whole-file read,
// or one checked mapping.
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
