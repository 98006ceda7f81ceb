// Hostile and degenerate input end to end in C++ (issue #13): empty problems through sdpa, attention
// and the layers, forward and backward; models and training steps that can't fit; checkpoints whose
// config.json is edited, mistyped or inconsistent; FIFOs, devices and NUL bytes where files are read;
// the checkpoint swap's non-atomic fallback and the removal of a killed save's temporaries. Runs under
// ASan + UBSan too (make asan), which is where a read past an empty buffer would show.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../src/core/aligned.h"
#include "../src/train/checkpoint.h"
#include "attn/file.h"
#include "attn/memstat.h"
#include "attn/mha.h"
#include "attn/nn.h"
#include "attn/sdpa.h"
#include "attn/train.h"
#include "test_util.h"

namespace attn {
namespace {

namespace fs = std::filesystem;
using ckpt::json;
using test::error_of;
using test::TempDir;

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

bool all_zero(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.data()[i] != 0) return false;
  return true;
}

// ---- Empty problems ----

// B = 0 used to divide by B·Hkv in flash_backward (SIGFPE); L = 0, S = 0 and Dv = 0 are ordinary too.
TEST(Empty, SdpaForwardAndBackwardOfEveryEmptyDim) {
  struct Dims { int64_t B, H, L, S, D, Dv; };
  for (Dims d : {Dims{0, 2, 3, 4, 8, 8}, Dims{2, 2, 0, 4, 8, 8}, Dims{2, 2, 3, 0, 8, 8}, Dims{2, 2, 3, 4, 8, 0}}) {
    for (Backend backend : {Backend::reference, Backend::flash}) {
      SCOPED_TRACE(cat("B ", d.B, " L ", d.L, " S ", d.S, " Dv ", d.Dv, " ", to_string(backend)));
      Tensor q({d.B, d.H, d.L, d.D}), k({d.B, d.H, d.S, d.D}), v({d.B, d.H, d.S, d.Dv});
      Tensor out({d.B, d.H, d.L, d.Dv}), lse({d.B, d.H, d.L});
      std::fill_n(out.data(), out.numel(), 7.f);
      SdpaArgs<float> args{q, k, v};
      sdpa(args, {out, {}, lse}, {.backend = backend});
      EXPECT_TRUE(all_zero(out));  // S = 0: every row is fully masked, and gives 0
      Tensor dout({d.B, d.H, d.L, d.Dv}), dq({d.B, d.H, d.L, d.D}), dk({d.B, d.H, d.S, d.D}), dv({d.B, d.H, d.S, d.Dv});
      std::fill_n(dk.data(), dk.numel(), 7.f);
      std::fill_n(dv.data(), dv.numel(), 7.f);
      sdpa_backward<float>(args, out, lse, dout, {dq, dk, dv}, {.backend = backend});
      EXPECT_TRUE(all_zero(dq) && all_zero(dk) && all_zero(dv));
    }
  }
}

// A contiguous (N, 0, E) has stride 0 in dim 0; project() rejected it, copied it and recursed forever.
TEST(Empty, MultiheadAttentionAndEncoderLayerWithZeroLengthAndBatch) {
  for (Shape shape : {Shape{2, 0, 8}, Shape{0, 3, 8}}) {
    SCOPED_TRACE(to_string(shape));
    MultiheadAttention mha({.embed_dim = 8, .num_heads = 2, .batch_first = true, .seed = 1});
    Tensor x(shape);
    MhaOutput r = mha.forward(x, x, x);
    EXPECT_EQ(r.output.shape(), shape);
    EXPECT_EQ(r.weights.shape(), Shape({shape[0], shape[1], shape[1]}));
    MhaGrads g = mha.backward(r.output);
    EXPECT_EQ(g.dquery.shape(), shape);

    TransformerOptions o;
    o.d_model = 8, o.nhead = 2, o.dim_feedforward = 16, o.dropout = 0, o.batch_first = true;
    TransformerEncoderLayer layer(o);
    Tensor y = layer.forward(x, {});
    EXPECT_EQ(y.shape(), shape);
    EXPECT_EQ(layer.backward(y).shape(), shape);
  }
  // S = 0 keys: the attention is 0, so the output is out_proj's bias.
  MultiheadAttention mha({.embed_dim = 8, .num_heads = 2, .batch_first = true, .seed = 1});
  Tensor q({2, 3, 8}), kv({2, 0, 8});
  MhaOutput r = mha.forward(q, kv, kv);
  EXPECT_EQ(r.weights.shape(), Shape({2, 3, 0}));
  const StateDict sd = mha.state_dict();
  for (int64_t i = 0; i < r.output.numel(); ++i) EXPECT_EQ(r.output.data()[i], sd.at("out_proj.bias").data()[i % 8]);
}

// D = 0: every score is 0 (an empty dot product), so each row is the mean of its visible V rows, as torch's
// SDPA gives; the default scale 1/sqrt(0) used to be refused as infinite.
TEST(Empty, HeadDimZeroAveragesTheValues) {
  for (Backend backend : {Backend::reference, Backend::flash}) {
    SCOPED_TRACE(to_string(backend));
    Tensor q({1, 2, 3, 0}), k({1, 2, 4, 0}), v({1, 2, 4, 5}), out({1, 2, 3, 5});
    for (int64_t i = 0; i < v.numel(); ++i) v.data()[i] = float(i % 7) - 2.5f;
    SdpaArgs<float> args{q, k, v};
    args.causal = Causal::top_left;
    sdpa(args, {out}, {.backend = backend});
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t l = 0; l < 3; ++l)
        for (int64_t e = 0; e < 5; ++e) {
          float mean = 0;
          for (int64_t s = 0; s <= l; ++s) mean += v.view().at({0, h, s, e});
          EXPECT_FLOAT_EQ(out.view().at({0, h, l, e}), mean / float(l + 1)) << h << " " << l << " " << e;
        }
  }
}

// ---- What can't fit ----

TEST(Memory, ModelsAndStepsThatCantFitAreRefusedByName) {
  GptConfig c = gpt_config("tiny");
  c.vocab_size = 10;
  c.n_layer = 100'000'000;  // used to fail in h.reserve with std::bad_alloc
  EXPECT_TRUE(has(error_of([&] { Gpt g(c, 0); }), "n_layer 100000000"));
  c.n_layer = 2, c.n_embd = int64_t(1) << 40, c.n_head = 1;
  EXPECT_TRUE(has(error_of([&] { Gpt g(c, 0); }), "to fit in the machine's"));
  TrainOptions o = synthetic_defaults();
  o.batch = int64_t(1) << 60;  // batch·T wrapped and x_ was written past its end
  EXPECT_TRUE(has(error_of([&] { Trainer t(o, Dataset::reverse_task(4)); }), "training batch 1152921504606846976"));
  o.batch = 2, o.block_size = int64_t(1) << 62;
  EXPECT_TRUE(has(error_of([&] { Trainer t(o, Dataset::reverse_task(4)); }), "to fit in the machine's"));
}

// ---- Files ----

TEST(Files, FifosDevicesDirectoriesAndNulBytesAreRefusedByName) {
  TempDir tmp;
  ASSERT_EQ(::mkfifo((tmp / "fifo").c_str(), 0600), 0);
  EXPECT_TRUE(has(error_of([&] { read_regular_file(tmp / "fifo", "--data", 100); }), "'--data' ") ||
              has(error_of([&] { read_regular_file(tmp / "fifo", "--data", 100); }), "a FIFO"));
  EXPECT_TRUE(has(error_of([&] { Dataset::text_file(tmp / "fifo"); }), "a FIFO"));
  EXPECT_TRUE(has(error_of([&] { Dataset::text_file("/dev/zero"); }), "a character device"));
  EXPECT_TRUE(has(error_of([&] { Dataset::text_file(tmp.dir.string()); }), "a directory"));
  std::ofstream(tmp / "big") << "0123456789";
  EXPECT_TRUE(has(error_of([&] { read_regular_file(tmp / "big", "x", 9); }), "of at most 9 bytes"));
  EXPECT_EQ(read_regular_file(tmp / "big", "x", 10), "0123456789");
  const std::string nul = tmp / "big" + std::string(1, '\0') + "junk";
  EXPECT_TRUE(has(error_of([&] { Dataset::text_file(nul); }), "without NUL bytes"));
  EXPECT_TRUE(has(error_of([&] { load_model(nul); }), "without NUL bytes"));
  EXPECT_TRUE(has(error_of([&] { check_checkpoint_dir(nul); }), "without NUL bytes"));
}

// ---- Checkpoints ----

TrainOptions quick_options() {
  TrainOptions o = synthetic_defaults();
  o.steps = 4, o.batch = 2, o.eval_iters = 1, o.threads = 1;
  return o;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return json::parse(s.str());
}

// Writes config.json with `edit` applied; with rehash, its recorded hash is made to match again (as a
// deliberate forger would), so what is tested is the schema check behind the hash.
void edit_config(const std::string& dir, const std::function<void(json&)>& edit, bool rehash = true) {
  json j = read_json(dir + "/config.json");
  edit(j);
  if (rehash) j["config_fnv1a64"] = ckpt::config_hash(j);
  std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump(2);
}

TEST(Checkpoint, EditedConfigIsRefusedByItsHash) {
  TempDir tmp;
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.step();
  t.save(tmp / "ck");
  edit_config(tmp / "ck", [](json& j) { j["step"] = 7; }, /*rehash=*/false);
  const std::string msg = error_of([&] { load_model(tmp / "ck"); });
  EXPECT_TRUE(has(msg, "the file was edited or is corrupt")) << msg;
  // A duplicate key after the real one (nlohmann keeps the last) changes the content: refused too.
  t.save(tmp / "ck2");
  std::string text = read_json(tmp / "ck2/config.json").dump(2);
  text.insert(text.rfind('}'), ",\n  \"step\": \"abc\"");
  std::ofstream(tmp / "ck2/config.json", std::ios::trunc) << text;
  EXPECT_TRUE(has(error_of([&] { load_model(tmp / "ck2"); }), "edited or is corrupt"));
  EXPECT_TRUE(has(error_of([&] { Trainer::resume(tmp / "ck2"); }), "edited or is corrupt"));
}

// Each of these aborted attn generate / train --resume with nlohmann::type_error, std::bad_alloc, a
// segfault or an endless read; now each is an attn::Error naming the field, before anything is built.
TEST(Checkpoint, ConfigSchemaIsCheckedBeforeAnythingIsBuilt) {
  TempDir tmp;
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.step();
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* want;
    bool resume;
    const char* type = "";  // what the field should have been (json_io::field's words), if a type error
  };
  const Case cases[] = {
      {"step string", [](json& j) { j["step"] = "abc"; }, "\"step\" in", false,
       "to be an integer that fits in 64 bits, but got \"abc\""},
      {"step negative", [](json& j) { j["step"] = -3; }, "step >= 0", false},
      {"task_length string", [](json& j) { j["data"]["task_length"] = "8"; }, "\"task_length\" in", true,
       "to be an integer that fits in 64 bits, but got \"8\""},
      {"kind int", [](json& j) { j["data"]["kind"] = 3; }, "\"kind\" in", true, "to be a string, but got 3"},
      {"kind unknown", [](json& j) { j["data"]["kind"] = "movie"; }, "kind \"reverse\" or \"text\"", true},
      {"n_layer 1e8", [](json& j) { j["model"]["n_layer"] = 100000000; }, "layers", false},
      {"n_layer float", [](json& j) { j["model"]["n_layer"] = 1e8; }, "\"n_layer\" in", false,
       "to be an integer that fits in 64 bits, but got 100000000.0"},
      {"n_embd 2^40", [](json& j) { j["model"]["n_embd"] = int64_t(1) << 40; }, "transformer.wte.weight", false},
      {"vocab mismatch", [](json& j) { j["model"]["vocab_size"] = 5; }, "transformer.wte.weight", false},
      {"batch 2^60", [](json& j) { j["training"]["batch"] = int64_t(1) << 60; }, "training batch 1152921504606846976",
       true},
      {"threads 2^40", [](json& j) { j["training"]["threads"] = int64_t(1) << 40; }, "\"threads\" in", true,
       "to be an integer in [-2147483648, 2147483647], but got 1099511627776"},
      {"seed -1", [](json& j) { j["training"]["seed"] = -1; }, "\"seed\" in", true,
       "to be a non-negative integer that fits in 64 bits, but got -1"},
      {"lr string", [](json& j) { j["training"]["lr"] = "fast"; }, "\"lr\" in", true,
       "to be a finite number, but got \"fast\""},
      {"/dev/zero data",
       [](json& j) {
         j["data"] = {{"kind", "text"}, {"bytes", 1}, {"path", "/dev/zero"}, {"fnv1a64", 1}};
       },
       "a character device", true},
      {"tokenizer type", [](json& j) { j["tokenizer"]["type"] = 1; }, "\"type\" in", false,
       "to be a string, but got 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(tmp / "ck");
    t.save(tmp / "ck");
    edit_config(tmp / "ck", c.edit);
    const std::string msg =
        c.resume ? error_of([&] { Trainer::resume(tmp / "ck"); }) : error_of([&] { load_model(tmp / "ck"); });
    EXPECT_TRUE(has(msg, c.want)) << msg;
    EXPECT_TRUE(has(msg, c.type)) << msg;
  }
}

TEST(Checkpoint, FifoAsModelFileIsRefusedNotWaitedOn) {
  TempDir tmp;
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.save(tmp / "ck");
  fs::remove(tmp / "ck/model.safetensors");
  ASSERT_EQ(::mkfifo((tmp / "ck/model.safetensors").c_str(), 0600), 0);
  EXPECT_TRUE(has(error_of([&] { load_model(tmp / "ck"); }), "regular file"));
}

// Without RENAME_EXCHANGE the old directory is moved aside and the new one moved in; forced here.
TEST(Checkpoint, SwapFallbackReplacesTheDirectory) {
  TempDir tmp;
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.save(tmp / "ck");
  static int calls = 0;
  ckpt::set_swap_for_testing([](const char*, const char*) {
    ++calls;
    errno = EINVAL;
    return -1;
  });
  t.step();
  t.step();
  t.save(tmp / "ck");
  ckpt::set_swap_for_testing(nullptr);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(load_model(tmp / "ck").step, 2);
  EXPECT_EQ(tmp.files(), std::vector<std::string>({"ck"}));  // no .old-* or .tmp-* left
}

// A save killed between mkdir and the swap leaves .ck.tmp-PID-*; the next save (or --out's check at the
// start of attn train) removes it once PID is gone, and leaves a live process's alone.
TEST(Checkpoint, StaleTemporariesOfAKilledSaveAreRemoved) {
  TempDir tmp;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status;
  ::waitpid(child, &status, 0);  // a pid that is gone
  fs::create_directories(tmp / cat(".ck.tmp-", child, "-0123456789abcdef/model.safetensors"));
  fs::create_directories(tmp / cat(".ck.old-", child, "-0123456789abcdef"));
  const pid_t live = ::fork();  // a live process's: it might be saving
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(live, 0);
  fs::create_directories(tmp / cat(".ck.tmp-", live, "-live"));
  check_checkpoint_dir(tmp / "ck");
  EXPECT_EQ(tmp.files(), std::vector<std::string>({cat(".ck.tmp-", live, "-live")}));
  fs::create_directories(tmp / cat(".ck.tmp-", child, "-feedface"));
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.save(tmp / "ck");
  EXPECT_EQ(tmp.files(), std::vector<std::string>({cat(".ck.tmp-", live, "-live"), "ck"}));
  ::kill(live, SIGKILL);
  ::waitpid(live, &status, 0);
}

// Issue 23: as PID 1 (a container), kill(1, 0) always finds the PID alive, so a temporary of an earlier
// PID 1 was never removed. A sibling with this process's own PID that is not one of its saves in
// progress is stale: removed (this process stands in for PID 1).
TEST(Checkpoint, StaleTemporariesOfAnEarlierProcessWithOurPidAreRemoved) {
  TempDir tmp;
  fs::create_directories(tmp / cat(".ck.tmp-", ::getpid(), "-0123456789abcdef/model.safetensors"));
  fs::create_directories(tmp / cat(".ck.old-", ::getpid(), "-0123456789abcdef"));
  check_checkpoint_dir(tmp / "ck");
  EXPECT_EQ(tmp.files(), std::vector<std::string>());
}

// Issue 23: resuming through a symbolic link replaced the link with a directory and left its target at
// the old step; a save writes through the link now.
TEST(Checkpoint, SaveThroughASymlinkedDirectoryUpdatesItsTarget) {
  TempDir tmp;
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.step();
  t.save(tmp / "real");
  fs::create_directory_symlink("real", tmp / "link");
  auto r = Trainer::resume(tmp / "link");
  r->step();
  r->save(tmp / "link");
  EXPECT_TRUE(fs::is_symlink(tmp / "link"));
  EXPECT_EQ(load_model(tmp / "real").step, 2);
  EXPECT_EQ(tmp.files(), std::vector<std::string>({"link", "real"}));  // no lock or temporary left
}

// Issue 23: --resume rebuilt the tokenizer from the data and ignored the checkpoint's, which generate
// uses: a vocabulary that contradicts the data (same size, other characters) is refused.
TEST(Checkpoint, ResumeRefusesATokenizerThatContradictsTheData) {
  TempDir tmp;
  TrainOptions o = quick_options();
  o.block_size = 8;
  Trainer t(o, Dataset::text(std::string(200, 'a') + std::string(200, 'b')));
  t.save(tmp / "ck");
  edit_config(tmp / "ck", [](json& j) { j["tokenizer"]["vocab"] = "ax"; });
  auto text = std::make_unique<Dataset>(Dataset::text(std::string(200, 'a') + std::string(200, 'b')));
  const std::string msg = error_of([&] { Trainer::resume(tmp / "ck", std::move(text)); });
  EXPECT_TRUE(has(msg, "Expected the tokenizer in") && has(msg, "\"ax\"")) << msg;
}

// Issue 23: the lock on a checkpoint directory is a flock on .NAME.lock naming its holder (a second
// process is refused by name: tests/python/test_hardening.py runs two attn train); this process shares
// its own lock; the lock file is gone with its last holder.
TEST(Checkpoint, LockIsAFlockNamingItsHolderSharedWithinTheProcess) {
  TempDir tmp;
  auto lock = lock_checkpoint_dir(tmp / "ck");
  auto again = lock_checkpoint_dir(tmp / "ck");  // this process: shared, no self-deadlock
  EXPECT_EQ(lock.get(), again.get());
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.save(tmp / "ck");  // a save of the holder itself
  // Another open file description (as another process has) can't take it, and the file names the holder.
  const int fd = ::open((tmp / ".ck.lock").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0);
  EXPECT_EQ(errno, EWOULDBLOCK);
  char pid[32] = {};
  EXPECT_GT(::pread(fd, pid, sizeof pid - 1, 0), 0);
  EXPECT_EQ(std::atol(pid), long(::getpid()));
  ::close(fd);
  lock.reset(), again.reset();
  EXPECT_EQ(tmp.files(), std::vector<std::string>({"ck"}));  // the lock file went with the last holder
}

// Issue 23: counts past what int64 products can hold (4 · eval_iters, warmup + 1) crashed in malloc or
// gave a negative learning rate; each is refused by name from the options and from an edited config.json.
TEST(Options, CountsAreBoundedByName) {
  struct Case {
    int64_t TrainOptions::*field;
    int64_t value;
    const char* want;
  };
  const Case cases[] = {{&TrainOptions::eval_iters, int64_t(4611686018427387905), "eval_iters <= 1000000"},
                        {&TrainOptions::warmup, INT64_MAX, "warmup <= 1099511627776"},
                        {&TrainOptions::steps, INT64_MAX, "steps <= "},
                        {&TrainOptions::lr_decay_steps, INT64_MAX, "lr_decay_steps <= "},
                        {&TrainOptions::eval_every, INT64_MAX, "eval_every <= "}};
  for (const Case& c : cases) {
    TrainOptions o = quick_options();
    o.*c.field = c.value;
    const std::string msg = error_of([&] { Trainer(o, Dataset::reverse_task(4)); });
    EXPECT_TRUE(has(msg, c.want)) << msg;
  }
  TempDir tmp;
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.save(tmp / "ck");
  edit_config(tmp / "ck", [](json& j) { j["training"]["eval_iters"] = int64_t(4611686018427387905); });
  EXPECT_TRUE(has(error_of([&] { Trainer::resume(tmp / "ck"); }), "eval_iters <= 1000000"));
}

// Issue 23: a K/V of 2^40 rows (zero strides: no memory behind it) made the decode and forward kernels
// store through the null pointer their unchecked scratch allocation returned; now a std::bad_alloc.
TEST(Memory, HugeScratchIsABadAllocNotANullStore) {
  for (int64_t L : {1, 64}) {
    SCOPED_TRACE(L);
    Tensor q({1, 1, L, 8}), kv({1, 1, 1, 8}), out({1, 1, L, 8});
    View<const float> k = kv;
    k.shape = {1, 1, int64_t(1) << 40, 8};
    k.strides = {0, 0, 0, 1};
    SdpaArgs<float> args{q, k, k};
    EXPECT_THROW(sdpa(args, {out}, {.backend = Backend::flash}), std::bad_alloc);
  }
}

TEST(Checkpoint, OutIsCheckedBeforeAnyWork) {
  TempDir tmp;
  std::ofstream(tmp / "afile") << "x";
  EXPECT_TRUE(has(error_of([&] { check_checkpoint_dir(tmp / "afile/sub"); }), "Not a directory"));
  EXPECT_TRUE(has(error_of([&] { check_checkpoint_dir(tmp / "afile"); }), "to be a directory, but got a file"));
  EXPECT_TRUE(has(error_of([&] { check_checkpoint_dir("/proc/nope/ck"); }), "/proc/nope"));
  EXPECT_TRUE(has(error_of([&] { check_checkpoint_dir("/"); }), "checkpoint directory name"));
  EXPECT_TRUE(has(error_of([&] { check_checkpoint_dir(""); }), "checkpoint directory name"));
  fs::create_directories(tmp / "other");
  std::ofstream(tmp / "other/notes.txt") << "mine";
  EXPECT_TRUE(has(error_of([&] { check_checkpoint_dir(tmp / "other"); }), "notes.txt"));
  check_checkpoint_dir(tmp / "new/ck");  // its folder is created
  EXPECT_TRUE(fs::is_directory(tmp / "new"));
}

// Issue 23: a text file took about 12.7x its size (ids as int32 twice, the code points sorted) while the
// memory line said "2 MB". Ids are 1 byte each up to 256 characters, 2 up to 65,536, written straight
// from the text: loading peaks near text + ids, and the Trainer's estimate counts them.
TEST(Memory, TokensAreHeldAtOneOrTwoBytesAndCounted) {
  std::string ascii(1000, 'a'), wide;
  for (char32_t c = 0x400; c < 0x400 + 300; ++c) wide += utf8_encode(std::u32string(1, c));
  EXPECT_EQ(Dataset::text(ascii + "b").token_bytes(), 1001u);
  Dataset w = Dataset::text(wide);
  EXPECT_EQ(w.token_bytes(), 600u);  // 300 characters, 2 bytes each
  std::vector<int64_t> x(8), y(8);
  Rng rng(1);
  w.batch(0, 1, 8, rng, x.data(), y.data());
  for (int t = 0; t + 1 < 8; ++t) EXPECT_EQ(x[t + 1], y[t]);  // the ids read back as they were written
  EXPECT_EQ(w.tokenizer().decode(std::vector<int32_t>(x.begin(), x.end())).size(), 16u);

  TempDir tmp;
  const size_t n = size_t(48) << 20;
  {
    std::string text(n, 'x');
    for (size_t i = 0; i < n; i += 61) text[i] = char('a' + i % 26);
    std::ofstream(tmp / "big.txt", std::ios::binary) << text;
  }
  reset_peak_rss();
  const int64_t before = rss_bytes();
  Dataset d = Dataset::text_file(tmp / "big.txt");
  const double grown = double(peak_rss_bytes() - before) / double(n);
  EXPECT_EQ(d.token_bytes(), n);
  EXPECT_LT(grown, 2.6) << "peak RSS grew by " << grown << "x the text's size";
}

// Issue 23: in a 3 GiB memory cgroup the run was SIGKILLed without a word: the limit is read (v2
// memory.max and v1 memory.limit_in_bytes, the smallest on the way up) and the estimates check against it.
TEST(Memory, CgroupLimitIsTheSmallestOnTheWayUp) {
  TempDir tmp;
  auto put = [&](const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(tmp / rel).parent_path());
    std::ofstream(tmp / rel) << text;
  };
  put("proc2", "0::/a/b\n");
  put("cg/a/b/memory.max", "max\n");
  put("cg/a/memory.max", "3221225472\n");
  put("cg/memory.max", "8589934592\n");
  EXPECT_EQ(cgroup_memory_limit(tmp / "proc2", tmp / "cg"), uint64_t(3) << 30);
  put("proc1", "4:cpu,memory:/x/y\n1:cpu:/\n");
  put("cg1/memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  put("cg1/memory/x/memory.limit_in_bytes", "1000000\n");
  EXPECT_EQ(cgroup_memory_limit(tmp / "proc1", tmp / "cg1"), 1000000u);
  put("proc3", "0::/elsewhere\n");  // a container's own cgroup mounted at the root
  put("cg3/memory.max", "max\n");
  EXPECT_EQ(cgroup_memory_limit(tmp / "proc3", tmp / "cg3"), 0u);
  EXPECT_LE(available_memory_bytes(), physical_memory_bytes());
}

}  // namespace
}  // namespace attn

namespace attn {

// Kernel scratch (src/core/aligned.h): the calling thread's block is kept and reused up to kKeep; a second
// Scratch alive on the thread, a larger request and another thread each get memory of their own; a take
// past the size is an error, not an overrun.
TEST(Scratch, KeepsTheThreadsBlockAndNeverSharesIt) {
  uint8_t* kept;
  {
    Scratch s(1000);
    kept = s.take<uint8_t>(1000);
    Scratch nested(100);
    const uint8_t* other = nested.take<uint8_t>(100);
    EXPECT_TRUE(other + 100 <= kept || other >= kept + 1000) << "a nested Scratch shares the kept block";
  }
  {
    Scratch s(500);
    EXPECT_EQ(s.take<uint8_t>(500), kept);  // the same block, no new pages
  }
  {
    Scratch big(Scratch::kKeep + 64);
    uint8_t* b = big.take<uint8_t>(Scratch::kKeep + 64);
    EXPECT_TRUE(b + Scratch::kKeep + 64 <= kept || b >= kept + 1000);
  }
  {
    Scratch s(1000);
    EXPECT_EQ(s.take<uint8_t>(1000), kept);  // the large request did not replace it
    EXPECT_THROW(s.take<float>(1), AllocationError);
  }
  std::thread([&] {
    Scratch s(1000);
    const uint8_t* theirs = s.take<uint8_t>(1000);
    EXPECT_TRUE(theirs + 1000 <= kept || theirs >= kept + 1000) << "two threads share a block";
  }).join();
  Scratch s(128);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.take<float>(3)) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.take<float>(16)) % 64, 0u);  // 64-byte aligned, 128 bytes used
  EXPECT_THROW(s.take<float>(1), AllocationError);
}

}  // namespace attn
