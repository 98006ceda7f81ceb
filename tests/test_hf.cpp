// Hugging Face model directories (attn/hf.h, attn/hf_tokenizer.h) on tiny files written here: the mapped
// safetensors reader, the loader's errors, BERT's packing of padded batches, the WordPiece pipeline, and
// hostile tokenizer.json files (an Error naming the part, never a crash, a hang or gigabytes).
// The comparisons with transformers and tokenizers on the real MiniLM are tests/python/test_models.py.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "attn/hf.h"
#include "attn/rng.h"
#include "test_util.h"

namespace attn {
namespace {

using test::error_of;
using test::TempDir;

using test::write_text;
Tensor random(Shape shape, Rng& rng, double scale = 0.1) { return test::normal_tensor(std::move(shape), rng, scale); }

// A BertModel directory of E 16, 2 layers, 4 heads, FFN 24, vocab 30, 12 positions, random weights.
void write_bert(const TempDir& d, const std::string& prefix = "", const std::string& skip = "") {
  write_text(d / "config.json", R"({"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30,
    "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 24,
    "max_position_embeddings": 12, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"})");
  Rng rng(7);
  StateDict sd;
  auto add = [&](const std::string& name, Shape shape) {
    if (name != skip) sd.emplace(prefix + name, random(std::move(shape), rng));
  };
  add("embeddings.word_embeddings.weight", {30, 16});
  add("embeddings.position_embeddings.weight", {12, 16});
  add("embeddings.token_type_embeddings.weight", {2, 16});
  add("embeddings.LayerNorm.weight", {16});
  add("embeddings.LayerNorm.bias", {16});
  for (int i = 0; i < 2; ++i) {
    const std::string p = cat("encoder.layer.", i, ".");
    for (const char* n :
         {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"})
      add(p + n + ".weight", {16, 16}), add(p + n + ".bias", {16});
    add(p + "intermediate.dense.weight", {24, 16}), add(p + "intermediate.dense.bias", {24});
    add(p + "output.dense.weight", {16, 24}), add(p + "output.dense.bias", {16});
    for (const char* n : {"attention.output.LayerNorm", "output.LayerNorm"})
      add(p + n + ".weight", {16}), add(p + n + ".bias", {16});
  }
  save_safetensors(d / "model.safetensors", sd);
}

TEST(MappedSafetensors, F32TensorsAreViewsOfTheFileAndOutliveTheReader) {
  TempDir d;
  Rng rng(1);
  StateDict sd;
  sd.emplace("a", random({3, 5}, rng));
  sd.emplace("b", random({7}, rng));
  save_safetensors(d / "m.safetensors", sd);
  Tensor a;
  {
    MappedSafetensors f(d / "m.safetensors");
    EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(f.in_place("a"));
    a = f.get("a");
    EXPECT_EQ(f.shape("b"), Shape{7});
    EXPECT_NE(error_of([&] { f.shape("c"); }).find("'c'"), std::string::npos);
  }
  ASSERT_EQ(a.shape(), (Shape{3, 5}));  // the mapping lives as long as the tensor
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.data()[i], sd.at("a").data()[i]);
  a.data()[0] = 42;  // private pages: the file is unchanged
  EXPECT_EQ(load_safetensors(d / "m.safetensors").at("a").data()[0], sd.at("a").data()[0]);
}

// transformers' files hold integer buffers (embeddings.position_ids, I64): the file is read, and only
// asking for such a tensor as floats is an error.
TEST(MappedSafetensors, IntegerTensorsAreIndexedButNotFloats) {
  TempDir d;
  std::string h =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"p":{"dtype":"I64","shape":[1],"data_offsets":[4,12]}})";
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  bytes += h + std::string(12, '\0');
  std::ofstream(d / "m.safetensors", std::ios::binary) << bytes;
  MappedSafetensors f(d / "m.safetensors");
  EXPECT_TRUE(f.contains("p"));
  EXPECT_EQ(f.get("a").data()[0], 0.0f);
  EXPECT_NE(error_of([&] { f.get("p"); }).find("tensor 'p' of dtype F32, F64, F16 or BF16, but got \"I64\""),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_safetensors(d / "m.safetensors"); }).find("\"I64\""), std::string::npos);
}

TEST(HfLoader, ErrorsNameTheTensorAndBothShapes) {
  {
    TempDir d;
    write_bert(d, "", "encoder.layer.1.output.dense.weight");
    const std::string e = error_of([&] { BertModel m(d.dir.string()); });
    EXPECT_NE(e.find("'encoder.layer.1.output.dense.weight' of shape (16, 24)"), std::string::npos) << e;
  }
  {
    TempDir d;
    write_bert(d);
    std::string cfg = R"({"architectures": ["BertModel"], "vocab_size": 30, "hidden_size": 16, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 32, "max_position_embeddings": 12})";
    write_text(d / "config.json", cfg);
    const std::string e = error_of([&] { load_pretrained(d.dir.string()); });
    EXPECT_NE(e.find("'encoder.layer.0.intermediate.dense.weight' of shape (32, 16)"), std::string::npos) << e;
    EXPECT_NE(e.find("got (24, 16)"), std::string::npos) << e;
    write_text(d / "config.json", R"({"architectures": ["ResNetModel"]})");
    const std::string u = error_of([&] { load_pretrained(d.dir.string()); });
    EXPECT_NE(u.find("ResNetModel"), std::string::npos) << u;
  }
}

TEST(HfBert, PaddedBatchIsEachSequenceAloneAndPaddingIsZero) {
  TempDir d;
  write_bert(d, "bert.");  // BertFor*'s prefix is accepted
  auto m = load_pretrained(d.dir.string());
  const int64_t L = 6, E = 16;
  const std::vector<int64_t> ids = {2, 5, 9, 4, 0, 0, 3, 7, 1, 8, 6, 11};
  const std::vector<int64_t> mask = {1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};
  Tensor both = m->forward(ids.data(), 2, L, mask.data());
  Tensor first = m->forward(ids.data(), 1, 4, nullptr);
  Tensor second = m->forward(ids.data() + L, 1, L, nullptr);
  // Packed rows run through the same kernels as the sequence alone; only a GEMM's blocking over the
  // larger row count can round differently: a few float ulps of values of size ~1.
  for (int64_t l = 0; l < 4; ++l)
    for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(both.data()[l * E + e], first.data()[l * E + e], 1e-5);
  for (int64_t l = 4; l < L; ++l)
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(both.data()[l * E + e], 0.0f);
  for (int64_t i = 0; i < L * E; ++i) EXPECT_NEAR(both.data()[L * E + i], second.data()[i], 1e-5);
  std::vector<Tensor> w = m->attention_weights(ids.data(), 2, L, mask.data());
  ASSERT_EQ(w.size(), 2u);
  ASSERT_EQ(w[0].shape(), (Shape{2, 4, L, L}));
  for (int64_t l = 0; l < 4; ++l) {  // each query row of sequence 0 sums to 1 over its 4 keys, 0 beyond
    double s = 0;
    for (int64_t k = 0; k < L; ++k) s += w[1].data()[l * L + k];
    EXPECT_NEAR(s, 1.0, 1e-5);
    EXPECT_EQ(w[1].data()[l * L + 4], 0.0f);
  }
  EXPECT_NE(error_of([&] { m->forward(ids.data(), 1, 13, nullptr); }).find("max_position_embeddings 12"),
            std::string::npos);
}

TEST(HfTokenizer, BertNormalizerPreTokenizerAndWordPiece) {
  TempDir d;
  write_text(d / "tokenizer.json", R"({
    "added_tokens": [{"id": 0, "content": "[PAD]", "special": true}, {"id": 1, "content": "[UNK]", "special": true},
                     {"id": 2, "content": "[CLS]", "special": true}, {"id": 3, "content": "[SEP]", "special": true}],
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null,
                   "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100,
              "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "wor": 5, "##ld": 6, ",": 7,
                        "!": 8, "你": 9, "好": 10, "cafe": 11}}})");
  HfTokenizer t = HfTokenizer::from_file(d / "tokenizer.json");
  // accents stripped (É), lower-cased, punctuation split, CJK split, a control character dropped, [SEP]
  // in the text kept as the special token, an unknown word [UNK]
  const Encoding e = t.encode("HÉLLO,\x01 World! 你好 Café xyz[SEP]");
  EXPECT_EQ(e.ids, (std::vector<int64_t>{2, 4, 7, 5, 6, 8, 9, 10, 11, 1, 3, 3}));
  EXPECT_EQ(e.tokens[4], "##ld");
  EXPECT_EQ(t.decode(e.ids), "hello, world! 你 好 cafe");  // [UNK] is special here: skipped
  EXPECT_NE(error_of([&] { t.encode("bad \xff byte"); }).find("offset"), std::string::npos);
  EXPECT_EQ(t.encode("hello", true, 2).ids, (std::vector<int64_t>{2, 3}));  // truncation keeps the specials
}

// A hand-made byte-level BPE (the ids checked with the `tokenizers` library): merges in the "a b" form
// (the [a, b] form: tests/python/test_bpe.py), ranks by their order (the rank-0 "l o" goes before "h e"),
// ties to the leftmost ("a a" on "aaa"), a byte-level space (Ġ), an added special token.
TEST(HfTokenizer, ByteLevelBpeMergesInOrder) {
  TempDir d;
  write_text(d / "tokenizer.json", R"({
    "added_tokens": [{"id": 0, "content": "<|end|>", "special": true, "normalized": false}],
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": {"type": "ByteLevel", "trim_offsets": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false, "byte_fallback": false,
              "vocab": {"<|end|>": 0, "h": 1, "e": 2, "l": 3, "o": 4, "Ġ": 5, "a": 6, "lo": 7, "he": 8,
                        "hel": 9, "Ġa": 10, "aa": 11, "helo": 12},
              "merges": ["l o", "h e", "he l", "Ġ a", "a a", "hel o"]}})");
  HfTokenizer t = HfTokenizer::from_file(d / "tokenizer.json");
  // "hello": h e l l o -> (l o) first: h e l lo -> (h e): he l lo -> (he l): hel lo; "helo" needs "hel o"
  EXPECT_EQ(t.encode("hello").ids, (std::vector<int64_t>{9, 7}));
  EXPECT_EQ(t.encode("hello").tokens, (std::vector<std::string>{"hel", "lo"}));
  EXPECT_EQ(t.encode("aaa").ids, (std::vector<int64_t>{11, 6}));          // the leftmost pair merges first
  EXPECT_EQ(t.encode("he aaa<|end|>").ids, (std::vector<int64_t>{8, 10, 11, 0}));  // " aaa": Ġa then aa
  EXPECT_EQ(t.encode("hex").ids, (std::vector<int64_t>{8}));  // no unk_token: 'x' is dropped, as the library does
  EXPECT_EQ(t.decode({9, 7, 5, 11}), "hello aa");
  EXPECT_EQ(t.decode({9, 0, 7}, false), "hel<|end|>lo");
}

TEST(HfTokenizer, UnknownComponentsAreNamed) {
  TempDir d;
  auto error_for = [&](const std::string& parts) {
    write_text(d / "tokenizer.json",
               R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, )" + parts + "}");
    return error_of([&] { HfTokenizer::from_file(d / "tokenizer.json"); });
  };
  EXPECT_NE(error_for(R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "UnicodeScripts"}]})")
                .find("but got the \"UnicodeScripts\" pre_tokenizer of"), std::string::npos);
  EXPECT_NE(error_for(R"("normalizer": {"type": "Precompiled", "precompiled_charsmap": ""})").find("\"Precompiled\""),
            std::string::npos);
  EXPECT_NE(error_for(R"("decoder": {"type": "CTC"})").find("\"CTC\""), std::string::npos);
  EXPECT_NE(error_for(R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated",
                      "invert": false})").find("'(a'"), std::string::npos);  // PCRE2's message, with the pattern
  write_text(d / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]]}})");
  EXPECT_NE(error_of([&] { HfTokenizer::from_file(d / "tokenizer.json"); }).find("'b', which is not one"),
            std::string::npos);
}

// ---- hostile files (issue 36): each was a crash, a hang or gigabytes ----

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- hostile model directories (issue 36) ----

TEST(HfLoader, HostileDirectoriesNameTheFieldAndTheFile) {
  TempDir d;
  write_bert(d);
  auto config = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(d / "config.json"));
    edit(j);
    write_text(d / "config.json", j.dump());
  };
  const std::string orig = nlohmann::json::parse(std::ifstream(d / "config.json")).dump();
  config([](nlohmann::json& j) { j["layer_norm_eps"] = -1e-12; });  // NaN embeddings with exit 0 before
  std::string e = error_of([&] { load_pretrained(d.dir.string()); });
  EXPECT_TRUE(has(e, "\"layer_norm_eps\" in '" + d / "config.json" + "' to be >= 0")) << e;
  config([&](nlohmann::json& j) { j = nlohmann::json::parse(orig), j["num_hidden_layers"] = int64_t(1) << 50; });
  e = error_of([&] { load_pretrained(d.dir.string()); });  // "vector::reserve" before
  EXPECT_TRUE(has(e, "num_hidden_layers 1125899906842624") && has(e, "encoder.layer.1125899906842623.")) << e;
  config([&](nlohmann::json& j) { j = nlohmann::json::parse(orig); });

  // a tokenizer whose ids pass the embedding failed at the first text that used one: refused at load
  write_text(d / "tokenizer.json", R"({"model": {"type": "WordPiece", "unk_token": "[UNK]",
    "vocab": {"[UNK]": 0, "a": 1, "far": 30}}})");
  e = error_of([&] { Pretrained::load(d.dir.string()); });
  EXPECT_TRUE(has(e, d / "tokenizer.json") && has(e, d / "config.json") && has(e, "below vocab_size 30") &&
              has(e, "up to 30")) << e;

  // a dangling model.safetensors was "without either" file
  std::filesystem::rename(d / "model.safetensors", d / "real.safetensors");
  std::filesystem::create_symlink(d / "gone.safetensors", d / "model.safetensors");
  e = error_of([&] { load_pretrained(d.dir.string()); });
  EXPECT_TRUE(has(e, "a symbolic link to '" + d / "gone.safetensors" + "'") && has(e, "No such file")) << e;
  std::filesystem::remove(d / "model.safetensors");
  // a list where weight_map's object goes read "got none"
  write_text(d / "model.safetensors.index.json", R"({"weight_map": ["real.safetensors"]})");
  e = error_of([&] { load_pretrained(d.dir.string()); });
  EXPECT_TRUE(has(e, "\"weight_map\"") && has(e, "but got [\"real.safetensors\"]")) << e;
}


// A WordPiece tokenizer.json (the ids of "hello world" are [2, 4, 5, 3] with the BERT template) with
// `edit` applied to its JSON.
std::string wordpiece_file(const TempDir& d, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "added_tokens": [{"id": 0, "content": "[UNK]", "special": true}, {"id": 2, "content": "[CLS]", "special": true},
                     {"id": 3, "content": "[SEP]", "special": true}],
    "normalizer": {"type": "Lowercase"},
    "pre_tokenizer": {"type": "WhitespaceSplit"},
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
      "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                         "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "vocab": {"[UNK]": 0, "a": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5}}})");
  edit(j);
  write_text(d / "tokenizer.json", j.dump());
  return d / "tokenizer.json";
}

std::string load_error(const std::string& path) { return error_of([&] { HfTokenizer::from_file(path); }); }

TEST(HfTokenizer, HostileFieldsAreErrorsNamingThem) {
  TempDir d;
  using nlohmann::json;
  EXPECT_EQ(HfTokenizer::from_file(wordpiece_file(d, [](json&) {})).encode("Hello world").ids,
            (std::vector<int64_t>{2, 4, 5, 3}));
  // id + 1 overflowed (an out-of-bounds write); the library keeps ids as u32
  std::string e = load_error(wordpiece_file(d, [](json& j) { j["model"]["vocab"]["x"] = INT64_MAX; }));
  EXPECT_TRUE(has(e, "the id of 'x'") && has(e, "[0, 4294967295]") && has(e, d / "tokenizer.json")) << e;
  e = load_error(wordpiece_file(d, [](json& j) { j["added_tokens"][0]["id"] = INT64_MAX; }));
  EXPECT_TRUE(has(e, "\"id\" in an added token of") && has(e, "[0, 4294967295]")) << e;
  // a special token the template names but special_tokens lacks: a missing key read (undefined behaviour)
  e = load_error(wordpiece_file(d, [](json& j) { j["post_processor"]["special_tokens"].erase("[SEP]"); }));
  EXPECT_TRUE(has(e, "special_tokens[\"[SEP]\"]") && has(e, "but got none")) << e;
  // wrongly typed ids: nlohmann's type_error text, a RuntimeError in Python
  e = load_error(wordpiece_file(d, [](json& j) { j["post_processor"]["single"][0]["SpecialToken"]["id"] = 7; }));
  EXPECT_TRUE(has(e, "SpecialToken items (with a string \"id\")")) << e;
  e = load_error(wordpiece_file(d, [](json& j) { j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = {"2"}; }));
  EXPECT_TRUE(has(e, "special_tokens[\"[CLS]\"] with as many ids")) << e;
  // an object where the list goes was ignored silently
  e = load_error(wordpiece_file(d, [](json& j) { j["added_tokens"] = {{"id", 6}, {"content", "zz"}}; }));
  EXPECT_TRUE(has(e, "\"added_tokens\" (a list)")) << e;
}

// Sequence in Sequence recursed once a level: 100,000 levels overflowed the stack. The file's nesting is
// bounded as the library's JSON reader bounds it: 62 nested Sequences (126 levels) load, 63 do not.
TEST(HfTokenizer, NestingIsBoundedAsTheLibraryBoundsIt) {
  TempDir d;
  auto nested = [&](int n) {
    return wordpiece_file(d, [n](nlohmann::json& j) {
      std::string s = R"({"type": "Lowercase"})";
      for (int i = 0; i < n; ++i) s = R"({"type": "Sequence", "normalizers": [)" + s + "]}";
      j["normalizer"] = nlohmann::json::parse(s);
    });
  };
  EXPECT_EQ(HfTokenizer::from_file(nested(62)).encode("HELLO").ids, (std::vector<int64_t>{2, 4, 3}));
  EXPECT_TRUE(has(load_error(nested(63)), "nested at most 127 levels deep")) << load_error(nested(63));
  // 100,000 levels, written as text (nlohmann's dump would recurse as deep)
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"type": "Sequence", "normalizers": [)";
  deep += R"({"type": "Lowercase"})";
  for (int i = 0; i < 100000; ++i) deep += "]}";
  std::string text = nlohmann::json::parse(std::ifstream(nested(0))).dump();
  text.insert(text.rfind('}'), R"(, "normalizer": )" + deep);
  write_text(d / "deep.json", text);
  EXPECT_TRUE(has(load_error(d / "deep.json"), "nested at most 127 levels deep"));
}

// A Split pattern that backtracks: (a+)+b|a costs 2^n steps at each a of a run of n, under PCRE2's limit
// per search but 11 ms per 19 bytes (380 KB ran past 30 s). The input's budget stops it, naming the pattern
// and the file; the same file on ordinary text, and a pattern that needs more than the JIT's stack (PCRE2
// error -46 before), still run.
TEST(HfTokenizer, ABacktrackingPatternIsStoppedNamingItAndTheFile) {
  TempDir d;
  const std::string path = wordpiece_file(d, [](nlohmann::json& j) {
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a+)+b|a"}}}, {"behavior", "Isolated"},
                          {"invert", false}};
  });
  HfTokenizer t = HfTokenizer::from_file(path);
  EXPECT_EQ(t.encode("aa", false).ids, (std::vector<int64_t>{1, 1}));
  std::string runs;  // 20 KB: 1,052 runs of 18 a's, each ~2^19 steps
  while (runs.size() < 20000) runs += std::string(18, 'a') + " ";
  const std::string e = error_of([&] { t.encode(runs); });
  EXPECT_TRUE(has(e, "'(a+)+b|a'") && has(e, "\"Split\" pre_tokenizer of '" + path + "'") && has(e, "backtracks"))
      << e;
  const std::string deep = wordpiece_file(d, [](nlohmann::json& j) {  // the one match removed: no words left
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "WhitespaceSplit"}}, {{"type", "Split"},
                          {"pattern", {{"Regex", "(?:ab|a)+"}}}, {"behavior", "Removed"}, {"invert", false}}}}};
  });
  std::string abs;
  for (int i = 0; i < 500000; ++i) abs += "ab";
  EXPECT_EQ(HfTokenizer::from_file(deep).encode(abs + " hello", false).ids, (std::vector<int64_t>{4}));
}

// The id -> token table is a map: one id of 10^8 among a few costs what the file holds (a 3 KB file took
// 3.1 GB and 7 s as a dense table).
TEST(HfTokenizer, SparseIdsAreKeptAsTheFileHoldsThem) {
  TempDir d;
  HfTokenizer t =
      HfTokenizer::from_file(wordpiece_file(d, [](nlohmann::json& j) { j["model"]["vocab"]["far"] = 100000000; }));
  EXPECT_EQ(t.vocab_size(), 100000001);
  EXPECT_EQ(t.id_to_token(100000000), "far");
  EXPECT_EQ(t.encode("far", false).ids, (std::vector<int64_t>{100000000}));
  EXPECT_TRUE(has(error_of([&] { t.id_to_token(50000000); }), "50000000"));
}

}  // namespace
}  // namespace attn
