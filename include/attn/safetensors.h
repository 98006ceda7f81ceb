// safetensors files (https://github.com/huggingface/safetensors format): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the
// raw little-endian bytes. Reads what safetensors.torch.save_file writes; writes what safe_open reads.
// Not a lazy/mmap loader: files here are parameter sets of at most a few hundred MB.
#pragma once
#include <map>
#include <string>

#include "attn/tensor.h"

namespace attn {

using StateDict = std::map<std::string, Tensor>;  // PyTorch state_dict names -> float32 tensors

// Loads every tensor as float32 (F32 as is; F16 and BF16 exactly; F64 rounded to nearest), and the
// "__metadata__" strings into *metadata if given. Throws attn::Error naming the file and the problem for
// a truncated file, a bad header length or JSON, a header that is not an object, duplicate keys, a
// missing field, offsets out of range, reversed, overlapping or leaving holes in the data, a dtype it
// can't read, or a shape that does not match the byte count. Never reads past the end of the file.
StateDict load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

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
