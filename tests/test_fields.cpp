// The field lists (fields.h) are the one home of GptConfig's and TrainOptions' schema: every field of
// kGptConfigFields and kTrainOptionsFields goes through a checkpoint and comes back with a value that is
// not its default, so a field added to a list once is saved and loaded with no other line written (and
// this test asks for a test value for it); and each is type-checked when config.json is read.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../src/train/checkpoint.h"
#include "attn/train.h"
#include "test_util.h"

using namespace attn;
using test::error_of;

namespace {

std::string temp_dir(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("attn_test_fields_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// f(name, a.field, b.field) for every field of the list.
template <class Fields, class S, class F>
void for_each_pair(const Fields& fields, const S& a, const S& b, F f) {
  std::apply([&](const auto&... x) { (f(x.name, a.*(x.member), b.*(x.member)), ...); }, fields);
}

// Every field of `sample` differs from the struct's default (else the round trip would prove nothing
// for it), and `got` equals `sample` field by field.
template <class Fields, class S>
void expect_round_trip(const Fields& fields, const S& sample, const S& got) {
  for_each_pair(fields, sample, S{}, [](const char* name, const auto& v, const auto& def) {
    EXPECT_NE(v, def) << name << ": give the sample a value other than the default";
  });
  for_each_pair(fields, sample, got, [](const char* name, const auto& v, const auto& back) {
    EXPECT_EQ(v, back) << name;
  });
}

}  // namespace

TEST(Fields, EveryGptConfigFieldRoundTripsThroughACheckpoint) {
  const CharTokenizer tok = CharTokenizer::from_text("abcde");
  GptConfig c;
  c.vocab_size = 5, c.block_size = 12, c.n_layer = 3, c.n_head = 2, c.n_kv_head = 1, c.n_embd = 16;
  c.dropout = 0.25, c.bias = false, c.tie_weights = false, c.position = "alibi", c.window = 6;
  Gpt model(c, 1);
  const std::string dir = temp_dir("model");
  save_model(dir, model, tok);
  expect_round_trip(kGptConfigFields, c, load_model(dir).model->config());
  std::filesystem::remove_all(dir);
}

TEST(Fields, EveryTrainOptionsFieldRoundTripsThroughACheckpoint) {
  TrainOptions o;
  o.config = "nanogpt-cpu", o.block_size = 16, o.n_kv_head = 2, o.tie_weights = false, o.steps = 7, o.batch = 3;
  o.lr = 2e-3, o.min_lr = 2e-4, o.warmup = 3, o.lr_decay_steps = 5, o.weight_decay = 0.05, o.beta1 = 0.8;
  o.beta2 = 0.95, o.eps = 1e-7, o.decay_embeddings = false, o.grad_clip = 0.5, o.dropout = 0.1, o.eval_every = 2;
  o.eval_iters = 1, o.seed = 42, o.threads = 1, o.dtype = "bf16", o.log_every = 4, o.position = "rope";
  o.window = 8;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "to be or not to be, ";
  Trainer t(o, Dataset::text(text));
  const std::string dir = temp_dir("train");
  t.save(dir);
  expect_round_trip(kTrainOptionsFields, o,
                    Trainer::resume(dir, std::make_unique<Dataset>(Dataset::text(text)))->options());
  std::filesystem::remove_all(dir);
}

// A checkpoint written before TrainOptions had a dtype (no "dtype" in config.json) resumes as f32, the
// run it was.
TEST(Fields, ACheckpointFromBeforeDtypeResumesAsF32) {
  TrainOptions o = synthetic_defaults();
  o.dtype = "bf16";
  Trainer t(o, Dataset::reverse_task(4));
  const std::string dir = temp_dir("old");
  t.save(dir);
  ckpt::json j;
  {
    std::ifstream in(dir + "/config.json");
    j = ckpt::json::parse(in);
  }
  j["training"].erase("dtype");
  j["config_fnv1a64"] = ckpt::config_hash(j);
  std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump(2);
  EXPECT_EQ(Trainer::resume(dir)->options().dtype, "f32");
  std::filesystem::remove_all(dir);
}

// The schema checks come with the list: each field of either list given a value of the wrong type in
// config.json (rehashed, so only the schema can object) is refused naming that field.
TEST(Fields, EveryFieldIsTypeCheckedWhenRead) {
  Trainer t(synthetic_defaults(), Dataset::reverse_task(4));
  const std::string dir = temp_dir("types");
  auto refused = [&](const char* object, const char* name, bool is_string) {
    SCOPED_TRACE(cat(object, ".", name));
    std::filesystem::remove_all(dir);
    t.save(dir);
    std::ifstream in(dir + "/config.json");
    ckpt::json j = ckpt::json::parse(in);
    j[object][name] = is_string ? ckpt::json(1) : ckpt::json("x");
    j["config_fnv1a64"] = ckpt::config_hash(j);
    std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump(2);
    const std::string e = error_of([&] { Trainer::resume(dir); });
    // json_io::field's words: "Expected \"n_layer\" in '.../config.json' model to be an integer ..."
    EXPECT_NE(e.find(cat("\"", name, "\" in ")), std::string::npos) << e;
    EXPECT_NE(e.find(cat(" ", object, " to be ")), std::string::npos) << e;
  };
  const GptConfig model;
  const TrainOptions training;
  for_each_field(kGptConfigFields, model, [&](const char* name, const auto& v) {
    refused("model", name, std::is_same_v<std::decay_t<decltype(v)>, std::string>);
  });
  for_each_field(kTrainOptionsFields, training, [&](const char* name, const auto& v) {
    refused("training", name, std::is_same_v<std::decay_t<decltype(v)>, std::string>);
  });
  std::filesystem::remove_all(dir);
}
