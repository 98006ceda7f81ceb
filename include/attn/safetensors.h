// safetensors files (https://github.com/huggingface/safetensors format): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the
// raw little-endian bytes. Reads what safetensors.torch.save_file writes; writes what safe_open reads.
// load_safetensors reads a whole file into float32 tensors; MappedSafetensors maps one (a pretrained
// model's weights) and uses its F32 tensors in place.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn {

using StateDict = std::map<std::string, Tensor>;  // PyTorch state_dict names -> float32 tensors

// Loads every tensor as float32 (F32 as is; F16 and BF16 exactly; F64 rounded to nearest), and the
// "__metadata__" strings into *metadata if given. Throws attn::Error naming the file and the problem for
// a truncated file, a bad header length or JSON, a header that is not an object, duplicate keys, a
// missing field, offsets out of range, reversed, overlapping or leaving holes in the data, a dtype it
// can't read, or a shape that does not match the byte count. Never reads past the end of the file.
StateDict load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// A safetensors file mapped into memory (private pages, see file.h), with load_safetensors' checks of
// the whole header before any tensor is handed out. get() returns an F32 tensor whose data is 4-byte
// aligned in the file as a Tensor over the mapping itself (no copy; it keeps the mapping alive after
// this object is gone), and any other tensor converted into a new float32 one as load_safetensors does.
class MappedSafetensors {
 public:
  explicit MappedSafetensors(const std::string& path);
  const std::string& path() const;
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  // The stored shape; an Error naming the file and the tensor if there is none of that name.
  const Shape& shape(const std::string& name) const;
  bool in_place(const std::string& name) const;  // get(name) is a view of the file's bytes
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Writes F32 tensors atomically: a temporary file in the same folder, fsync, then rename over `path`,
// so a crash leaves either the old file or the new one, never a broken one; on an error the temporary
// file is removed and an existing `path` is left as it was. The bytes are what the safetensors library
// writes for the same tensors (compact JSON, names sorted, header padded with spaces to 8 bytes);
// metadata keys are sorted, where the library writes them in hash-map order.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The tensor `name` of `sd` with shape `want`, or an Error naming both shapes (or the missing name).
const Tensor& expect_tensor(const StateDict& sd, const std::string& name, const Shape& want);

}  // namespace attn
