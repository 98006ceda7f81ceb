// Hostile and degenerate input end to end in C++ (issue #13): empty problems through sdpa, attention
// and the layers, forward and backward; models and training steps that can't fit; checkpoints whose
// config.json is edited, mistyped or inconsistent; FIFOs, devices and NUL bytes where files are read;
// the checkpoint swap's non-atomic fallback and the removal of a killed save's temporaries. Runs under
// ASan + UBSan too (make asan), which is where a read past an empty buffer would show.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../src/train/checkpoint.h"
#include "attn/file.h"
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
  };
  const Case cases[] = {
      {"step string", [](json& j) { j["step"] = "abc"; }, "step to be an integer", false},
      {"step negative", [](json& j) { j["step"] = -3; }, "step >= 0", false},
      {"task_length string", [](json& j) { j["data"]["task_length"] = "8"; }, "task_length to be an integer", true},
      {"kind int", [](json& j) { j["data"]["kind"] = 3; }, "kind to be a string", true},
      {"kind unknown", [](json& j) { j["data"]["kind"] = "movie"; }, "kind \"reverse\" or \"text\"", true},
      {"n_layer 1e8", [](json& j) { j["model"]["n_layer"] = 100000000; }, "layers", false},
      {"n_layer float", [](json& j) { j["model"]["n_layer"] = 1e8; }, "n_layer to be an integer", false},
      {"n_embd 2^40", [](json& j) { j["model"]["n_embd"] = int64_t(1) << 40; }, "transformer.wte.weight", false},
      {"vocab mismatch", [](json& j) { j["model"]["vocab_size"] = 5; }, "transformer.wte.weight", false},
      {"batch 2^60", [](json& j) { j["training"]["batch"] = int64_t(1) << 60; }, "training batch 1152921504606846976", true},
      {"threads 2^40", [](json& j) { j["training"]["threads"] = int64_t(1) << 40; }, "threads to be an integer that fits", true},
      {"seed -1", [](json& j) { j["training"]["seed"] = -1; }, "seed to be a non-negative integer", true},
      {"lr string", [](json& j) { j["training"]["lr"] = "fast"; }, "lr to be a finite number", true},
      {"/dev/zero data", [](json& j) { j["data"] = {{"kind", "text"}, {"bytes", 1}, {"path", "/dev/zero"}, {"fnv1a64", 1}}; },
       "a character device", true},
      {"tokenizer type", [](json& j) { j["tokenizer"]["type"] = 1; }, "type to be a string", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(tmp / "ck");
    t.save(tmp / "ck");
    edit_config(tmp / "ck", c.edit);
    const std::string msg = c.resume ? error_of([&] { Trainer::resume(tmp / "ck"); }) : error_of([&] { load_model(tmp / "ck"); });
    EXPECT_TRUE(has(msg, c.want)) << msg;
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
  fs::create_directories(tmp / cat(".ck.tmp-", ::getpid(), "-live"));  // ours, alive: might be saving
  check_checkpoint_dir(tmp / "ck");
  EXPECT_EQ(tmp.files(), std::vector<std::string>({cat(".ck.tmp-", ::getpid(), "-live")}));
  fs::create_directories(tmp / cat(".ck.tmp-", child, "-feedface"));
  Trainer t(quick_options(), Dataset::reverse_task(4));
  t.save(tmp / "ck");
  EXPECT_EQ(tmp.files(), std::vector<std::string>({cat(".ck.tmp-", ::getpid(), "-live"), "ck"}));
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

}  // namespace
}  // namespace attn
