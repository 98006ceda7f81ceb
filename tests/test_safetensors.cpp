// safetensors I/O: exact round trips, one test per malformed-file rule (each error must name the file
// and the problem), a random-corruption loop that may only ever throw attn::Error, and atomic saves.
// Interop with the safetensors library itself is tested in tests/python/test_safetensors_interop.py.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <sys/stat.h>

#include <ctime>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "attn/safetensors.h"
#include "test_util.h"

using namespace attn;
namespace fs = std::filesystem;
using Bytes = std::string;
using test::TempDir;

namespace {

Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const Bytes& b) {
  fs::remove(path);  // a new file, not a truncated one: ext4 flushes truncate-and-rewrite on close (slow)
  std::ofstream(path, std::ios::binary).write(b.data(), std::streamsize(b.size()));
}

Bytes le64(uint64_t n) {
  Bytes b(8, '\0');
  std::memcpy(b.data(), &n, 8);
  return b;
}

// A file from a header string and data bytes; the length field is the header's unless given.
Bytes make_file(const std::string& header, const Bytes& data, std::optional<uint64_t> n = {}) {
  return le64(n.value_or(header.size())) + header + data;
}

template <typename T>
Bytes raw(std::initializer_list<T> xs) {
  Bytes b(xs.size() * sizeof(T), '\0');
  std::memcpy(b.data(), std::data(xs), b.size());
  return b;
}

Tensor iota(Shape shape, float start) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = start + 0.25f * float(i);
  return t;
}

// Loading `path` must throw attn::Error whose message holds the file name and every one of `parts`.
void expect_load_error(const std::string& path, std::initializer_list<std::string> parts) {
  try {
    load_safetensors(path);
    ADD_FAILURE() << "expected an error for " << path;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
  }
}

void expect_bits_equal(const Tensor& a, const Tensor& b, const std::string& name) {
  EXPECT_TRUE(test::same_bits(a, b)) << name;
}

StateDict sample() {
  StateDict sd;
  sd.emplace("in_proj_weight", iota({6, 2}, -1.f));
  sd.emplace("in_proj_bias", iota({6}, 3.f));
  sd.emplace("scalar", iota({}, 7.5f));
  sd.emplace("empty", Tensor({0}));
  sd.emplace("empty2d", Tensor({3, 0}));
  Tensor special({5});
  float vals[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), -0.f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()};
  std::memcpy(special.data(), vals, sizeof vals);
  sd.emplace("special", std::move(special));
  return sd;
}

}  // namespace

TEST(Safetensors, RoundTripIsExact) {
  TempDir tmp;
  StateDict sd = sample();
  std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "h\u00e9llo \"quoted\"\n"}};
  save_safetensors(tmp / "a.safetensors", sd, meta);
  std::map<std::string, std::string> meta2;
  StateDict back = load_safetensors(tmp / "a.safetensors", &meta2);
  EXPECT_EQ(meta2, meta);
  ASSERT_EQ(back.size(), sd.size());
  for (const auto& [name, t] : sd) expect_bits_equal(back.at(name), t, name);
  Bytes b = read_bytes(tmp / "a.safetensors");
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // data starts 8-byte aligned
  EXPECT_EQ(b.size(), 8 + n + (12 + 6 + 1 + 0 + 0 + 5) * 4);
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"a.safetensors"});  // no temporary left behind

  // No metadata: no "__metadata__" key, and an empty map comes back.
  save_safetensors(tmp / "a.safetensors", sd);
  meta2 = {{"stale", "x"}};
  load_safetensors(tmp / "a.safetensors", &meta2);
  EXPECT_TRUE(meta2.empty());
  EXPECT_EQ(read_bytes(tmp / "a.safetensors").find("__metadata__"), std::string::npos);
}

// Byte-exact with the library: the expected bytes are those of test_serialization and
// test_serialization_forced_alignement in huggingface/safetensors (safetensors/src/tensor.rs).
TEST(Safetensors, WritesTheLibrarysBytes) {
  TempDir tmp;
  Bytes data = raw<float>({0, 1, 2, 3, 4, 5});
  StateDict sd;
  sd.emplace("attn.0", iota({1, 2, 3}, 0.f));
  for (int i = 0; i < 6; ++i) sd.at("attn.0").data()[i] = float(i);
  save_safetensors(tmp / "a.safetensors", sd);
  EXPECT_EQ(read_bytes(tmp / "a.safetensors"),
            make_file(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})", data));

  StateDict sd2;
  sd2.emplace("attn0", Tensor::copy_of(sd.at("attn.0").view().reshape({1, 1, 2, 3})));
  save_safetensors(tmp / "b.safetensors", sd2);
  EXPECT_EQ(read_bytes(tmp / "b.safetensors"),
            make_file(R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       )", data));

  save_safetensors(tmp / "c.safetensors", {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(tmp / "c.safetensors"), make_file(R"({"__metadata__":{"framework":"pt"}}     )", ""));
}

TEST(Safetensors, ConvertsF64F16BF16) {
  TempDir tmp;
  // F16 bit patterns and their values by the IEEE binary16 definition.
  Bytes f16 = raw<uint16_t>({0x3C00, 0xC000, 0x0001, 0x03FF, 0x7BFF, 0x7C00, 0x8000, 0xFC00});
  Bytes bf16 = raw<uint16_t>({0x3F80, 0xC049, 0x0001, 0xFF80});
  Bytes f64 = raw<double>({0.1, -1e300, 2.5});
  std::string h = cat(R"({"a":{"dtype":"F64","shape":[3],"data_offsets":[0,24]},)",
                      R"("b":{"dtype":"F16","shape":[2,4],"data_offsets":[24,40]},)",
                      R"("c":{"dtype":"BF16","shape":[4],"data_offsets":[40,48]}})");
  write_bytes(tmp / "x.safetensors", make_file(h, f64 + f16 + bf16));
  StateDict sd = load_safetensors(tmp / "x.safetensors");
  const float* a = sd.at("a").data();
  EXPECT_EQ(a[0], 0.1f);
  EXPECT_EQ(a[1], -std::numeric_limits<float>::infinity());  // out of float range rounds to -inf
  EXPECT_EQ(a[2], 2.5f);
  EXPECT_EQ(sd.at("b").shape(), (Shape{2, 4}));
  std::vector<float> b(sd.at("b").data(), sd.at("b").data() + 8);
  float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(b, (std::vector<float>{1.f, -2.f, std::ldexp(1.f, -24), std::ldexp(1023.f, -24), 65504.f, inf, 0.f, -inf}));
  EXPECT_TRUE(std::signbit(b[6]));  // -0 stays -0
  std::vector<float> c(sd.at("c").data(), sd.at("c").data() + 4);
  EXPECT_EQ(c, (std::vector<float>{1.f, -3.140625f, std::ldexp(1.f, -133), -inf}));
}

TEST(Safetensors, RejectsShortFile) {
  TempDir tmp;
  write_bytes(tmp / "x", Bytes("\x05\0\0\0\0", 5));
  expect_load_error(tmp / "x", {"at least 8 bytes", "got 5"});
}

TEST(Safetensors, RejectsHeaderLengthPastTheEnd) {
  TempDir tmp;
  write_bytes(tmp / "x", make_file("{}", "", 1000));
  expect_load_error(tmp / "x", {"header length of at most 2", "got 1000"});
  write_bytes(tmp / "y", make_file("{}", "", uint64_t(1) << 63));
  expect_load_error(tmp / "y", {"header length", "9223372036854775808"});
}

TEST(Safetensors, RejectsHeaderThatIsNotJson) {
  TempDir tmp;
  write_bytes(tmp / "x", make_file("{\"a\": nope}", ""));
  expect_load_error(tmp / "x", {"Expected a JSON header", "parse error"});
  write_bytes(tmp / "y", make_file("{\"a\": \"\xff\"}", ""));  // not UTF-8
  expect_load_error(tmp / "y", {"Expected a JSON header"});
  // The parser quotes the bad byte; the message stays valid UTF-8 (Python decodes it) and NUL-free.
  write_bytes(tmp / "z", make_file(Bytes("\x80{}", 3), ""));
  expect_load_error(tmp / "z", {"Expected a JSON header", "\\x80"});
  // A NUL would end nlohmann's input early, hiding what follows it.
  write_bytes(tmp / "w", make_file(Bytes("{}\0garbage", 10), ""));
  expect_load_error(tmp / "w", {"Expected a JSON header", "NUL byte at header offset 2"});
}

TEST(Safetensors, RejectsHeaderThatIsNotAnObject) {
  TempDir tmp;
  write_bytes(tmp / "x", make_file("[1, 2]  ", ""));
  expect_load_error(tmp / "x", {"JSON object", "[1,2]"});
  write_bytes(tmp / "y", make_file(R"({"w": [0, 4]})", "abcd"));
  expect_load_error(tmp / "y", {"'w' to be an object", "got an array"});
  write_bytes(tmp / "z", make_file(R"({"__metadata__": {"k": 1}})", ""));
  expect_load_error(tmp / "z", {"__metadata__", "\"k\"", "string"});
}

// Fields the format does not define are skipped, as the library skips them (any content, any keys).
TEST(Safetensors, SkipsUnknownFields) {
  TempDir tmp;
  std::string junk = std::string(100, '[') + "{\"a\":1,\"a\":2}" + std::string(100, ']');
  write_bytes(tmp / "x", make_file(R"({"w":{"x":[1,{"b":2}],"dtype":"F32","shape":[1],"data_offsets":[0,4],"j":)" +
                                       junk + "}}",
                                   raw<float>({1.5f})));
  StateDict sd = load_safetensors(tmp / "x");
  EXPECT_EQ(sd.at("w").data()[0], 1.5f);
}

// Structures that would make a DOM huge are rejected as they start, before they are stored.
TEST(Safetensors, RejectsHostileStructure) {
  TempDir tmp;
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"w":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
  };
  std::string deep = R"({"w":{"j":)" + std::string(200, '[') + std::string(200, ']') + "}}";
  write_bytes(tmp / "a", make_file(deep, ""));
  expect_load_error(tmp / "a", {"nested at most 127 levels"});
  std::string dims = "[1";
  for (int i = 0; i < 64; ++i) dims += ",1";
  write_bytes(tmp / "b", make_file(entry("\"F32\"", dims + "]", "[0,4]"), "abcd"));
  expect_load_error(tmp / "b", {"\"shape\" of tensor 'w'", "at most 64 numbers"});
  write_bytes(tmp / "c", make_file(entry("\"F32\"", "[1]", "[0,4,8]"), "abcd"));
  expect_load_error(tmp / "c", {"\"data_offsets\" of tensor 'w'", "at most 2 numbers"});
  write_bytes(tmp / "d", make_file(entry("\"F32\"", "[[1]]", "[0,4]"), "abcd"));
  expect_load_error(tmp / "d", {"\"shape\" of tensor 'w'", "nested array"});
  write_bytes(tmp / "e", make_file(entry("[\"F32\"]", "[1]", "[0,4]"), "abcd"));
  expect_load_error(tmp / "e", {"\"dtype\" of 'w'", "a string", "an array"});
  write_bytes(tmp / "f", make_file(R"({"__metadata__":{"k":{"x":"y"}}})", ""));
  expect_load_error(tmp / "f", {"\"k\" of '__metadata__'", "a string", "an object"});
}

TEST(Safetensors, RejectsMissingFields) {
  TempDir tmp;
  const char* fields[] = {R"("dtype":"F32")", R"("shape":[1])", R"("data_offsets":[0,4])"};
  const char* names[] = {"dtype", "shape", "data_offsets"};
  for (int skip = 0; skip < 3; ++skip) {
    std::string body;
    for (int i = 0; i < 3; ++i)
      if (i != skip) body += std::string(body.empty() ? "" : ",") + fields[i];
    write_bytes(tmp / "x", make_file("{\"w\":{" + body + "}}", "abcd"));
    expect_load_error(tmp / "x", {"tensor 'w'", cat("\"", names[skip], "\"")});
  }
  write_bytes(tmp / "y", make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"));
  expect_load_error(tmp / "y", {"tensor 'w'", "non-negative", "[-1]"});
  write_bytes(tmp / "z", make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "abcd"));
  expect_load_error(tmp / "z", {"tensor 'w'", "[begin, end]", "[0]"});
}

TEST(Safetensors, RejectsDtypesItCannotRead) {
  TempDir tmp;
  for (std::string dt : {"I32", "F8_E4M3", "f32", "XYZ"}) {
    write_bytes(tmp / "x", make_file(R"({"w":{"dtype":")" + dt + R"(","shape":[1],"data_offsets":[0,4]}})", "abcd"));
    expect_load_error(tmp / "x", {"tensor 'w'", "\"" + dt + "\"", "F32, F64, F16 or BF16"});
  }
}

TEST(Safetensors, RejectsOffsetsPastTheEnd) {
  TempDir tmp;
  write_bytes(tmp / "x", make_file(R"({"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})", Bytes(16, 'x')));
  expect_load_error(tmp / "x", {"tensor 'w'", "[0, 400]", "16 data bytes"});
}

TEST(Safetensors, RejectsReversedOffsets) {
  TempDir tmp;
  write_bytes(tmp / "x", make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", Bytes(8, 'x')));
  expect_load_error(tmp / "x", {"tensor 'w'", "begin <= end", "[8, 4]"});
}

TEST(Safetensors, RejectsOverlap) {
  TempDir tmp;
  std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  write_bytes(tmp / "x", make_file(h, Bytes(12, 'x')));
  expect_load_error(tmp / "x", {"do not overlap", "'a' at [0, 8]", "'b' at [4, 12]"});
}

TEST(Safetensors, RejectsHoles) {
  TempDir tmp;
  std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  write_bytes(tmp / "x", make_file(h, Bytes(12, 'x')));
  expect_load_error(tmp / "x", {"without holes", "4 unused bytes [4, 8)", "'b'"});
  // Bytes after the last tensor are a hole too (the library says "file not fully covered").
  write_bytes(tmp / "y", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", Bytes(8, 'x')));
  expect_load_error(tmp / "y", {"cover all 8 data bytes", "4 unused bytes [4, 8) at the end"});
}

TEST(Safetensors, RejectsByteCountThatDoesNotMatchTheShape) {
  TempDir tmp;
  write_bytes(tmp / "x", make_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", Bytes(20, 'x')));
  expect_load_error(tmp / "x", {"tensor 'w'", "(2, 3)", "F32", "24 bytes", "(20 bytes)"});
  // A shape whose running product overflows is rejected before any allocation.
  write_bytes(tmp / "y",
              make_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4,0],"data_offsets":[0,0]}})", ""));
  expect_load_error(tmp / "y", {"tensor 'w'", "fits in 64 bits"});
}

TEST(Safetensors, RejectsTruncatedData) {
  TempDir tmp;
  save_safetensors(tmp / "x", sample());
  Bytes b = read_bytes(tmp / "x");
  write_bytes(tmp / "x", b.substr(0, b.size() - 4));
  expect_load_error(tmp / "x", {"truncated file?", "'special'"});
}

TEST(Safetensors, RejectsDuplicateKeys) {
  TempDir tmp;
  std::string h = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  write_bytes(tmp / "x", make_file(h, Bytes(4, 'x')));
  expect_load_error(tmp / "x", {"unique keys", "\"w\" twice"});
  write_bytes(tmp / "y", make_file(R"({"w":{"dtype":"F32","shape":[1],"dtype":"F16","data_offsets":[0,4]}})", "abcd"));
  expect_load_error(tmp / "y", {"unique keys", "\"dtype\" twice"});
}

TEST(Safetensors, RejectsMissingFileAndFolders) {
  TempDir tmp;
  expect_load_error(tmp / "nope", {"readable file", "No such file"});
  expect_load_error(tmp.dir.string(), {"regular file"});
}

// FIFOs and devices are refused by name before any read: opening a FIFO for reading blocks until a
// writer comes (forever), and /dev/zero never ends. The test would hang, not fail, without the check:
// ctest's timeout makes that a failure.
TEST(Safetensors, RefusesFifoDeviceAndNulPaths) {
  TempDir tmp;
  ASSERT_EQ(::mkfifo((tmp / "fifo").c_str(), 0600), 0);
  expect_load_error(tmp / "fifo", {"regular file", "a FIFO"});
  expect_load_error("/dev/zero", {"regular file", "a character device"});
  save_safetensors(tmp / "one.safetensors", {});
  // "one.safetensors\0junk" must not open one.safetensors.
  const std::string nul = tmp / "one.safetensors" + std::string(1, '\0') + "junk";
  EXPECT_NE(test::error_of([&] { load_safetensors(nul); }).find("without NUL bytes"), std::string::npos);
  EXPECT_NE(test::error_of([&] { save_safetensors(nul, {}); }).find("without NUL bytes"), std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "one.safetensors.tmp"));
}

// The header parse is linear in its size: 200k zero-size entries (13 MB of header) took minutes with
// nlohmann's callback parser, which rescans the enclosing object at each entry (24 s for 40k). Timed as a
// ratio, not against a bound (an absolute 1 s of CPU failed under a concurrent build: 0.8–0.9 s there):
// 8x the entries may cost at most 24x the CPU time (n log n of the map gives ~10x, quadratic 64x).
TEST(Safetensors, HeaderWith200kEntriesParsesInLinearTime) {
  TempDir tmp;
  // This thread's CPU time, not wall time: other work on a shared machine doesn't count against it.
  auto cpu_seconds = [] {
    timespec ts;
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  auto load_time = [&](int entries) {
    std::string h = "{";
    for (int i = 0; i < entries; ++i)
      h += cat(i ? "," : "", "\"t", i, "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}");
    h += "}";
    write_bytes(tmp / "many", make_file(h, {}));
    double best = 1e30;
    for (int round = 0; round < 2; ++round) {  // the faster of two: a neighbour's spell counts once at most
      const double t0 = cpu_seconds();
      StateDict sd = load_safetensors(tmp / "many");
      best = std::min(best, cpu_seconds() - t0);
      EXPECT_EQ(sd.size(), size_t(entries));
      EXPECT_EQ(sd.at(cat("t", entries - 1)).shape(), Shape({0}));
    }
    return best;
  };
  const double small = load_time(25'000), large = load_time(200'000);
  std::printf("load of 25k entries: %.3f s of CPU, of 200k: %.3f s (%.1fx)\n", small, large, large / small);
  EXPECT_LT(large, 24 * small) << "8x the entries took " << large / small << "x the time: not linear";
}

// Random flips, overwrites and truncations of a valid file: each load must succeed or throw attn::Error
// (a crash, a read past the end or another exception type fails the test; run it under ASan to see more).
TEST(Safetensors, RandomCorruptionOnlyEverThrowsError) {
  TempDir tmp;
  save_safetensors(tmp / "good", sample(), {{"format", "pt"}});
  const Bytes good = read_bytes(tmp / "good");
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  std::mt19937_64 rng(20240531);
  int loaded = 0, rejected = 0;
  const char interesting[] = "{}[]\",:0123456789-e. \x00\xff";
  for (int iter = 0; iter < 3000; ++iter) {
    Bytes b = good;
    for (int k = 1 + int(rng() % 3); k-- > 0 && !b.empty();) {
      // Half of the edits land in the length field or the header, where the parser lives.
      size_t pos = rng() % 2 ? rng() % std::min<size_t>(b.size(), 8 + n) : rng() % b.size();
      switch (rng() % 4) {
        case 0: b[pos] = char(b[pos] ^ (1 << (rng() % 8))); break;
        case 1: b[pos] = interesting[rng() % (sizeof interesting - 1)]; break;
        case 2: b[pos] = char(rng()); break;
        case 3: b.resize(rng() % b.size()); break;
      }
    }
    write_bytes(tmp / "bad", b);
    try {
      load_safetensors(tmp / "bad");
      ++loaded;
    } catch (const Error& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find(tmp / "bad"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": not an attn::Error: " << e.what();
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(loaded, 0);  // flips in the data bytes keep the file valid
}

TEST(Safetensors, SaveIntoMissingFolderThrowsAndLeavesNothing) {
  TempDir tmp;
  try {
    save_safetensors(tmp / "missing/x.safetensors", sample());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp / "missing/x.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(tmp.files().empty());
}

// A write that fails half-way (file size limit) leaves the old file as it was and no temporary file.
TEST(Safetensors, FailedSaveLeavesOldFileIntact) {
  TempDir tmp;
  const std::string path = tmp / "model.safetensors";
  save_safetensors(path, sample(), {{"v", "old"}});
  const Bytes old = read_bytes(path);

  StateDict big;
  big.emplace("w", iota({1000, 100}, 0.f));  // 400 KB, over the limit below
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);  // make write() fail with EFBIG instead of killing us
  rlimit small = saved;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    save_safetensors(path, big);
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, prev);
  EXPECT_TRUE(threw);
  EXPECT_EQ(read_bytes(path), old);
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"model.safetensors"});

  // The same save without the limit replaces the file.
  save_safetensors(path, big);
  expect_bits_equal(load_safetensors(path).at("w"), big.at("w"), "w");
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"model.safetensors"});
}

// A rename that fails (the target is a folder) removes the temporary file and leaves the target.
TEST(Safetensors, FailedRenameLeavesNoTemporary) {
  TempDir tmp;
  fs::create_directories(tmp / "target/inside");
  EXPECT_THROW(save_safetensors(tmp / "target", sample()), Error);
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"target"});
  EXPECT_TRUE(fs::is_directory(tmp / "target/inside"));
}

TEST(Safetensors, SaveRejectsBadNamesBeforeWriting) {
  TempDir tmp;
  StateDict sd;
  sd.emplace("bad\xff", Tensor({1}));
  EXPECT_THROW(save_safetensors(tmp / "x", sd), Error);
  StateDict sd2;
  sd2.emplace("__metadata__", Tensor({1}));
  EXPECT_THROW(save_safetensors(tmp / "x", sd2), Error);
  StateDict sd3;
  sd3.emplace("no_storage", Tensor());
  EXPECT_THROW(save_safetensors(tmp / "x", sd3), Error);
  EXPECT_THROW(save_safetensors(tmp / "x", {}, {{"k", "\xfe"}}), Error);
  EXPECT_TRUE(tmp.files().empty());
}

TEST(Safetensors, ExpectTensorNamesShapesAndWhatIsThere) {
  StateDict sd = sample();
  EXPECT_EQ(&expect_tensor(sd, "in_proj_bias", {6}), &sd.at("in_proj_bias"));
  try {
    expect_tensor(sd, "in_proj_weight", {12, 4});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Expected in_proj_weight of shape (12, 4), but got (6, 2) instead");
  }
  try {
    expect_tensor(sd, "out_proj.weight", {4, 4});
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'out_proj.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'in_proj_weight' (6, 2)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'scalar' ()"), std::string::npos) << msg;
  }
}
