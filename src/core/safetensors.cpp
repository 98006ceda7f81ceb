// safetensors I/O: a reader that treats the file as hostile (F32/F64/F16/BF16 in, float32 out) and an
// atomic F32 writer whose bytes match what the safetensors library writes for the same tensors.
// load_safetensors reads the file into memory once; MappedSafetensors maps it and hands out F32 tensors
// in place. Either way every number in the header is checked against the bytes actually there before
// any tensor is built.
#include "attn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <system_error>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/file.h"
#include "attn/memstat.h"
#include "json.h"

// Every file error names the file: "safetensors file 'x': Expected ..., but got ... instead".
#define ST_CHECK(cond, ...)                                                                         \
  do {                                                                                              \
    if (!(cond)) throw ::attn::Error(printable(::attn::cat("safetensors file '", path, "': ", __VA_ARGS__))); \
  } while (0)

namespace attn {
namespace {

using json = json_io::json;
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian, like this host");

// The library's own limit on the JSON header (MAX_HEADER_SIZE in safetensors/src/tensor.rs).
constexpr uint64_t kMaxHeader = 100'000'000;
constexpr uint64_t kMaxI64 = std::numeric_limits<int64_t>::max();

// Messages quote bytes of the file (the JSON parser's "last read" token, names). Python decodes a
// message as strict UTF-8 and C++ reads it up to the first NUL, so any byte that is not part of a
// well-formed UTF-8 sequence, and any control byte, is written as \xNN.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto* u = reinterpret_cast<const unsigned char*>(s.data()) + i;
    size_t len = u[0] < 0x80 ? 1 : (u[0] >> 5) == 0x6 ? 2 : (u[0] >> 4) == 0xE ? 3 : (u[0] >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len == 1 ? u[0] : u[0] & (0x7f >> len);
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (u[k] & 0xC0) == 0x80;
      cp = cp << 6 | (u[k] & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};  // shorter encodings are overlong
    ok = ok && cp >= min_cp[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp < 0xE000) && cp >= 0x20 && cp != 0x7F;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += cat("\\x", "0123456789abcdef"[u[0] >> 4], "0123456789abcdef"[u[0] & 15]);
      i += 1;
    }
  }
  return out;
}

using json_io::brief;  // a header may be 100 MB: values in messages cut short

// ---- dtypes we read, all converted to float32 exactly (F64 rounds to nearest) ----

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float32
    float f = std::ldexp(float(man), -24);
    return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / NaN (payload kept)
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (man << 13));   // rebias the exponent
}

struct DType {
  const char* name;
  uint64_t size;
  void (*convert)(const uint8_t* src, float* dst, int64_t n);
};

template <typename T, typename F>
void convert_each(const uint8_t* src, float* dst, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, src + i * sizeof(T), sizeof(T));  // data may sit at any byte offset
    dst[i] = f(x);
  }
}

const DType kDTypes[] = {
    {"F32", 4, [](const uint8_t* s, float* d, int64_t n) { std::memcpy(d, s, size_t(n) * 4); }},
    {"F64", 8,
     [](const uint8_t* s, float* d, int64_t n) { convert_each<double>(s, d, n, [](double x) { return float(x); }); }},
    {"F16", 2, [](const uint8_t* s, float* d, int64_t n) { convert_each<uint16_t>(s, d, n, f16_to_f32); }},
    {"BF16", 2,
     [](const uint8_t* s, float* d, int64_t n) {
       convert_each<uint16_t>(s, d, n, [](uint16_t x) { return std::bit_cast<float>(uint32_t(x) << 16); });
     }},
    // Integer and bool tensors (transformers' position_ids buffers) are indexed so a file that holds them
    // is read, but they are not floats: load_safetensors and MappedSafetensors::get refuse them by name.
    {"I64", 8, nullptr},
    {"I32", 4, nullptr},
    {"I16", 2, nullptr},
    {"I8", 1, nullptr},
    {"U64", 8, nullptr},
    {"U32", 4, nullptr},
    {"U16", 2, nullptr},
    {"U8", 1, nullptr},
    {"BOOL", 1, nullptr},
};

struct Entry {
  std::string name;
  const DType* dtype;
  Shape shape;
  uint64_t begin, end;  // relative to the first byte after the header
};

std::string read_file(const std::string& path) {
  try {
    const uint64_t ram = physical_memory_bytes();
    return read_regular_file(path, "safetensors file", ram ? ram : UINT64_MAX);
  } catch (const Error& e) {
    throw Error(printable(e.what()));
  }
}

// Parses the header into a DOM that holds only what the format defines, so memory stays near the
// header's size whatever a hostile header holds (a plain DOM of a 100 MB header of "[[[[" took 7 GB):
// - nesting deeper than 128 levels is rejected (serde_json's limit: the library can't read it either);
// - fields of a tensor entry that the format does not define are skipped unstored, as the library
//   skips them;
// - a container where the format wants a string or a number is rejected as it starts, and shape and
//   data_offsets hold at most 64 and 2 numbers;
// - keys are unique in the header and in each entry (JSON allows duplicates; a name that means two
//   tensors is ambiguous, and nlohmann would silently keep the last).
// A SAX handler that builds the DOM itself, in time linear in the header: nlohmann's callback parser
// (json::parse with a callback) rescans the enclosing object at every entry's end, which took 24 s for
// 40k entries and did not finish 200k in 300 s.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& path) : path(path) {}
  json root;

  bool null() { return value(json(nullptr)); }
  bool boolean(bool b) { return value(json(b)); }
  bool number_integer(json::number_integer_t v) { return value(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return value(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return value(json(v)); }
  bool string(json::string_t& s) { return value(json(std::move(s))); }
  bool binary(json::binary_t&) { return value(json(nullptr)); }  // never in JSON text
  bool start_object(std::size_t) { return start(false); }
  bool start_array(std::size_t) { return start(true); }
  bool end_object() { return end(); }
  bool end_array() { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    ST_CHECK(false, "Expected a JSON header, but got '", e.what(), "' instead");
    return false;
  }

  bool key(json::string_t& k) {
    if (skipping_) return true;
    // depth_ 1: a tensor name (or __metadata__) in the header; 2: a field of that entry.
    // At depth 1 the stored object itself knows its keys; an entry's skipped fields are not stored.
    const bool fresh = depth_ == 1 ? !open_.back()->contains(k) : entry_keys_.insert(k).second;
    ST_CHECK(fresh, "Expected unique keys in the header, but got \"", k, "\" twice instead");
    if (depth_ == 1) name_ = k, field_.clear();
    if (depth_ == 2) field_ = k, items_ = 0;
    if (depth_ == 2 && !meta() && !defined(k)) {
      skip_value_ = true;  // skipped unstored
      return true;
    }
    slot_ = &(*open_.back())[k];
    return true;
  }

 private:
  static constexpr int kMaxDepth = json_io::kMaxDepth;  // as serde_json, which the library parses with
  static constexpr size_t kMaxDims = 64;  // numpy's limit (NPY_MAXDIMS): no array has more
  const std::string& path;
  std::vector<json*> open_;                  // the stored containers now open, outermost first
  json* slot_ = nullptr;                     // where the value after the last key goes
  int depth_ = 0;                            // containers open now, skipped ones included
  int skipping_ = 0;                         // > 0: this many containers deep in a skipped value
  bool skip_value_ = false;                  // the last key was skipped, and so is its value
  std::set<std::string> entry_keys_;         // of the entry being read, skipped fields included
  std::string name_, field_;                 // the current key at depth 1 (a tensor or __metadata__), at depth 2
  size_t items_ = 0;                         // numbers read so far of the current shape or data_offsets

  bool meta() const { return name_ == "__metadata__"; }
  static bool defined(const std::string& f) { return f == "dtype" || f == "shape" || f == "data_offsets"; }

  json* store(json&& v) {
    if (open_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& c = *open_.back();
    if (c.is_array()) {
      c.push_back(std::move(v));
      return &c.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  bool value(json&& v) {
    if (skipping_) return true;
    if (skip_value_) {
      skip_value_ = false;
      return true;
    }
    if (depth_ == 3) {
      const size_t most = field_ == "shape" ? kMaxDims : 2;
      ST_CHECK(++items_ <= most, "Expected \"", field_, "\" of tensor '", name_, "' to hold at most ", most,
               " numbers, but got more instead");
    }
    store(std::move(v));
    return true;
  }

  bool start(bool array) {
    ST_CHECK(depth_ < kMaxDepth, "Expected a header nested at most ", kMaxDepth,
             " levels deep, but got deeper nesting instead");
    if (skipping_ || skip_value_) {
      skip_value_ = false;
      ++skipping_, ++depth_;
      return true;
    }
    if (depth_ == 1) ST_CHECK(!array, "Expected '", name_, "' to be an object, but got an array instead");
    if (depth_ == 2) {
      const bool want_array = !meta() && field_ != "dtype";
      ST_CHECK(array && want_array, "Expected \"", field_, "\" of '", name_, "' to be ",
               want_array ? "an array of numbers" : "a string", ", but got ", array ? "an array" : "an object",
               " instead");
    }
    ST_CHECK(depth_ < 3, "Expected \"", field_, "\" of tensor '", name_, "' to hold numbers, but got a nested ",
             array ? "array" : "object", " instead");
    if (!array && depth_ == 1) entry_keys_.clear();
    open_.push_back(store(array ? json::array() : json::object()));
    ++depth_;
    return true;
  }

  bool end() {
    --depth_;
    if (skipping_) {
      --skipping_;
      return true;
    }
    open_.pop_back();
    return true;
  }
};

json parse_header(const std::string& path, const char* first, const char* last) {
  HeaderParser parser(path);
  try {
    json::sax_parse(first, last, &parser);
  } catch (const json::exception& e) {
    ST_CHECK(false, "Expected a JSON header, but got '", e.what(), "' instead");
  }
  return std::move(parser.root);
}

Entry parse_entry(const std::string& path, const std::string& name, const json& v, uint64_t data_size) {
  ST_CHECK(v.is_object(), "Expected tensor '", name, "' to be {\"dtype\", \"shape\", \"data_offsets\"}, but got ",
           brief(v), " instead");
  auto field = [&](const char* f) -> const json& {
    auto it = v.find(f);
    ST_CHECK(it != v.end(), "Expected tensor '", name, "' to have \"", f, "\", but got ", brief(v), " instead");
    return *it;
  };
  Entry e{name, nullptr, {}, 0, 0};
  const json& dt = field("dtype");
  for (const DType& d : kDTypes)
    if (dt.is_string() && dt.get_ref<const std::string&>() == d.name) e.dtype = &d;
  ST_CHECK(e.dtype, "Expected tensor '", name, "' of dtype F32, F64, F16 or BF16 (or an integer dtype, indexed but not "
           "read as floats), but got ", brief(dt), " instead");

  const json& sh = field("shape");
  bool ok = sh.is_array();
  uint64_t n = 1;  // numel; like the library, the running product must not overflow (and fits int64)
  for (size_t i = 0; ok && i < sh.size(); ++i) {
    ok = sh[i].is_number_unsigned() && !__builtin_mul_overflow(n, sh[i].get<uint64_t>(), &n) && n <= kMaxI64 &&
         sh[i].get<uint64_t>() <= kMaxI64;
    if (ok) e.shape.push_back(int64_t(sh[i].get<uint64_t>()));
  }
  uint64_t bytes = 0;
  ok = ok && !__builtin_mul_overflow(n, e.dtype->size, &bytes);
  ST_CHECK(ok, "Expected tensor '", name, "' to have a shape of non-negative sizes whose byte count fits in 64 bits, "
           "but got ", brief(sh), " instead");

  const json& off = field("data_offsets");
  ST_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
           "Expected data_offsets of tensor '", name, "' to be [begin, end], but got ", brief(off), " instead");
  e.begin = off[0].get<uint64_t>(), e.end = off[1].get<uint64_t>();
  ST_CHECK(e.begin <= e.end, "Expected data_offsets [begin, end] with begin <= end for tensor '", name, "', but got [",
           e.begin, ", ", e.end, "] instead");
  ST_CHECK(e.end <= data_size, "Expected data_offsets of tensor '", name, "' within the ", data_size,
           " data bytes after the header, but got [", e.begin, ", ", e.end, "] instead (truncated file?)");
  ST_CHECK(e.end - e.begin == bytes, "Expected tensor '", name, "' of shape ", to_string(e.shape), " and dtype ",
           e.dtype->name, " to take ", bytes, " bytes, but got data_offsets [", e.begin, ", ", e.end, "] (",
           e.end - e.begin, " bytes) instead");
  return e;
}

// The tensors must tile the data buffer exactly: sorted by offset, each starts where the last ended,
// and the last ends at the end of the file (the library's rule; a gap could hide anything).
void check_tiling(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    ST_CHECK(e.begin >= pos, "Expected tensors that do not overlap, but got '", prev->name, "' at [", prev->begin,
             ", ", prev->end, "] and '", e.name, "' at [", e.begin, ", ", e.end, "] instead");
    ST_CHECK(e.begin == pos, "Expected tensors that cover the data without holes, but got ", e.begin - pos,
             " unused bytes [", pos, ", ", e.begin, ") before tensor '", e.name, "' instead");
    pos = e.end, prev = &e;
  }
  ST_CHECK(pos == data_size, "Expected tensors that cover all ", data_size, " data bytes, but got ", data_size - pos,
           " unused bytes [", pos, ", ", data_size, ") at the end instead");
}

// A JSON string literal; names and metadata must be UTF-8 (the header is JSON).
std::string quote(const std::string& path, const std::string& s) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    ST_CHECK(false, "Expected UTF-8 tensor names and metadata, but got \"", s, "\" instead");
  }
  return {};
}

}  // namespace

namespace {

// The checked index of a whole file's bytes: its entries (sorted by offset), metadata and data start.
struct Index {
  std::vector<Entry> entries;
  std::map<std::string, std::string> meta;
  const uint8_t* data;  // the first byte after the header
};

Index index_file(const std::string& path, const uint8_t* file, uint64_t size) {
  ST_CHECK(size >= 8, "Expected at least 8 bytes (the header length), but got ", size, " instead");
  uint64_t n;
  std::memcpy(&n, file, 8);
  ST_CHECK(n <= size - 8, "Expected a header length of at most ", size - 8, " (the file has ", size,
           " bytes), but got ", n, " instead");
  ST_CHECK(n <= kMaxHeader, "Expected a header length of at most ", kMaxHeader, ", but got ", n, " instead");
  const char* header = reinterpret_cast<const char*>(file + 8);
  // JSON has no raw NUL anywhere, and nlohmann's parser would take one for the end of its input,
  // silently ignoring whatever follows it.
  const void* nul = std::memchr(header, 0, n);
  ST_CHECK(!nul, "Expected a JSON header, but got a NUL byte at header offset ",
           static_cast<const char*>(nul) - header, " instead");
  json j = parse_header(path, header, header + n);
  ST_CHECK(j.is_object(), "Expected a JSON object as the header, but got ", brief(j), " instead");

  Index ix{{}, {}, file + 8 + n};
  const uint64_t data_size = size - 8 - n;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      ST_CHECK(v.is_object() || v.is_null(), "Expected __metadata__ to be an object of strings, but got ", brief(v),
               " instead");
      for (const auto& [k, s] : v.items()) {
        ST_CHECK(s.is_string(), "Expected __metadata__ value of \"", k, "\" to be a string, but got ", brief(s),
                 " instead");
        ix.meta[k] = s.get<std::string>();
      }
      continue;
    }
    ix.entries.push_back(parse_entry(path, name, v, data_size));
  }
  check_tiling(path, ix.entries, data_size);
  return ix;
}

void check_float(const std::string& path, const Entry& e) {
  ST_CHECK(e.dtype->convert, "Expected tensor '", e.name, "' of dtype F32, F64, F16 or BF16, but got \"",
           e.dtype->name, "\" instead");
}

Tensor converted(const std::string& path, const Entry& e, const uint8_t* data) {
  check_float(path, e);
  Tensor t(e.shape);
  e.dtype->convert(data + e.begin, t.data(), t.numel());
  return t;
}

}  // namespace

StateDict load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const std::string file = read_file(path);
  Index ix = index_file(path, reinterpret_cast<const uint8_t*>(file.data()), file.size());
  StateDict out;
  for (const Entry& e : ix.entries) check_float(path, e);  // before anything is built
  for (const Entry& e : ix.entries) out.emplace(e.name, converted(path, e, ix.data));
  if (metadata) *metadata = std::move(ix.meta);
  return out;
}

// ---- MappedSafetensors ----

struct MappedSafetensors::Impl {
  std::string path;
  std::shared_ptr<MappedFile> file;
  std::map<std::string, Entry> entries;
  std::map<std::string, std::string> meta;
  const uint8_t* data = nullptr;
};

MappedSafetensors::MappedSafetensors(const std::string& path) : impl_(std::make_shared<Impl>()) {
  impl_->path = path;
  try {
    impl_->file = map_regular_file(path, "safetensors file");
  } catch (const Error& e) {
    throw Error(printable(e.what()));
  }
  Index ix = index_file(path, impl_->file->data, impl_->file->size);
  for (Entry& e : ix.entries) impl_->entries.emplace(e.name, std::move(e));
  impl_->meta = std::move(ix.meta);
  impl_->data = ix.data;
}

const std::string& MappedSafetensors::path() const { return impl_->path; }
const std::map<std::string, std::string>& MappedSafetensors::metadata() const { return impl_->meta; }

std::vector<std::string> MappedSafetensors::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : impl_->entries) out.push_back(name);
  return out;
}

bool MappedSafetensors::contains(const std::string& name) const { return impl_->entries.count(name) > 0; }

const Shape& MappedSafetensors::shape(const std::string& name) const {
  auto it = impl_->entries.find(name);
  const std::string& path = impl_->path;
  ST_CHECK(it != impl_->entries.end(), "Expected a tensor named '", name, "', but got none of that name instead");
  return it->second.shape;
}

bool MappedSafetensors::in_place(const std::string& name) const {
  shape(name);  // checks the name
  const Entry& e = impl_->entries.at(name);
  return std::strcmp(e.dtype->name, "F32") == 0 &&
         reinterpret_cast<uintptr_t>(impl_->data + e.begin) % alignof(float) == 0;
}

Tensor MappedSafetensors::get(const std::string& name) const {
  const bool borrow = in_place(name);
  const Entry& e = impl_->entries.at(name);
  if (!borrow) return converted(impl_->path, e, impl_->data);
  // The mapping's pages are private: the Tensor's non-const data never writes the file.
  float* p = reinterpret_cast<float*>(const_cast<uint8_t*>(impl_->data + e.begin));
  return Tensor::borrow(p, e.shape, impl_->file);
}

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  check_path(path, "path");
  // The header, byte for byte as the library writes it: compact JSON, "__metadata__" first, then the
  // tensors in offset order, which for one dtype is name order (std::map compares bytes, like Rust).
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) h += quote(path, k) + ":" + quote(path, v) + ",";
    h.back() = '}';
    h += ",";
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    ST_CHECK(name != "__metadata__", "Expected tensor names other than \"__metadata__\", but got it instead");
    ST_CHECK(t.data() || t.numel() == 0, "Expected tensor '", name,
             "' to have storage, but got an empty Tensor instead");
    std::string shape;
    for (int64_t d : t.shape()) shape += cat(shape.empty() ? "" : ",", d);
    uint64_t end = offset + uint64_t(t.numel()) * 4;
    h += cat(quote(path, name), ":{\"dtype\":\"F32\",\"shape\":[", shape, "],\"data_offsets\":[", offset, ",", end,
             "]},");
    offset = end;
  }
  if (h.back() == ',') h.pop_back();
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');  // pad with spaces so the data starts 8-byte aligned
  const uint64_t n = h.size();

  // Atomic (file.h): a fresh sibling, fsynced, renamed over the target.
  AtomicFile f(path, "safetensors file");
  f.write(&n, 8);
  f.write(h);
  for (const auto& [name, t] : tensors) f.write(t.data(), size_t(t.numel()) * 4);
  f.commit();
}

const Tensor& expect_tensor(const StateDict& sd, const std::string& name, const Shape& want) {
  auto it = sd.find(name);
  if (it == sd.end()) {
    std::string have;
    for (const auto& [k, t] : sd) have += (have.empty() ? "'" : ", '") + k + "' " + to_string(t.shape());
    throw Error(cat("Expected a tensor named '", name, "', but got only [", have, "] instead"));
  }
  ATTN_CHECK(it->second.shape() == want, "Expected ", name, " of shape ", to_string(want), ", but got ",
             to_string(it->second.shape()), " instead");
  return it->second;
}

}  // namespace attn
