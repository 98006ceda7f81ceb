// The pretrained decoders (attn/hf.h: Gpt2Model, LlamaModel) on tiny files written here: the loader's
// errors (unknown architecture, missing tensor, a shape that contradicts the config, unsupported RoPE),
// the KV-cache path against the full forward, padding against the sequence alone, and hostile config.json
// fields (an Error naming the field and the file, never a crash or gigabytes). The comparisons
// with transformers (logits, greedy generation) are tests/python/test_decoders.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>
#include <limits>

#include "attn/hf.h"
#include "attn/rng.h"
#include "test_util.h"

namespace attn {
namespace {

using test::error_of;
using test::TempDir;

using test::write_text;
Tensor random(Shape shape, Rng& rng, double scale = 0.3) { return test::normal_tensor(std::move(shape), rng, scale); }

// Writes sd with `skip` left out and `reshape` (name -> shape) given another shape.
void save(const TempDir& d, StateDict sd, const std::string& skip, const std::string& reshape, Shape shape, Rng& rng) {
  if (!skip.empty()) sd.erase(skip);
  if (!reshape.empty()) sd.insert_or_assign(reshape, random(std::move(shape), rng));
  save_safetensors(d / "model.safetensors", sd);
}

// GPT-2: vocab 20, E 8, 2 heads, 2 layers, 16 positions; Conv1D weights (in, out).
void write_gpt2(const TempDir& d, const std::string& skip = "", const std::string& reshape = "", Shape shape = {}) {
  write_text(d / "config.json", R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 20, "n_embd": 8,
    "n_layer": 2, "n_head": 2, "n_positions": 16, "activation_function": "gelu_new", "eos_token_id": 19})");
  Rng rng(3);
  StateDict sd;
  sd.emplace("transformer.wte.weight", random({20, 8}, rng));
  sd.emplace("transformer.wpe.weight", random({16, 8}, rng));
  for (const char* n : {"transformer.ln_f"})
    sd.emplace(cat(n, ".weight"), random({8}, rng)), sd.emplace(cat(n, ".bias"), random({8}, rng));
  for (int i = 0; i < 2; ++i) {
    const std::string p = cat("transformer.h.", i, ".");
    for (const char* n : {"ln_1", "ln_2"})
      sd.emplace(p + n + ".weight", random({8}, rng)), sd.emplace(p + n + ".bias", random({8}, rng));
    const std::pair<const char*, Shape> convs[] = {
        {"attn.c_attn", {8, 24}}, {"attn.c_proj", {8, 8}}, {"mlp.c_fc", {8, 32}}, {"mlp.c_proj", {32, 8}}};
    for (const auto& [n, s] : convs) {
      sd.emplace(p + n + ".weight", random(s, rng));
      sd.emplace(p + n + ".bias", random({s[1]}, rng));
    }
  }
  save(d, std::move(sd), skip, reshape, std::move(shape), rng);
}

// Llama: vocab 23, E 12, 3 heads of D 6 over 1 key/value head (MQA), FFN 20, 2 layers, untied head.
// `rope` ends the config (other fields may come before it); `arch` names the architecture.
void write_llama(const TempDir& d, const std::string& skip = "", const std::string& reshape = "", Shape shape = {},
                 const std::string& rope = R"("rope_parameters": {"rope_theta": 500.0, "rope_type": "default"})",
                 const std::string& arch = "LlamaForCausalLM") {
  write_text(d / "config.json", R"({"architectures": [")" + arch + R"("], "vocab_size": 23, "hidden_size": 12,
    "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 6,
    "intermediate_size": 20, "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "tie_word_embeddings": false, )" + rope + "}");
  Rng rng(5);
  StateDict sd;
  sd.emplace("model.embed_tokens.weight", random({23, 12}, rng));
  sd.emplace("model.norm.weight", random({12}, rng));
  sd.emplace("lm_head.weight", random({23, 12}, rng));
  for (int i = 0; i < 2; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    for (const char* n : {"input_layernorm", "post_attention_layernorm"})
      sd.emplace(p + n + ".weight", random({12}, rng));
    const std::pair<const char*, Shape> lin[] = {{"self_attn.q_proj", {18, 12}}, {"self_attn.k_proj", {6, 12}},
                                                 {"self_attn.v_proj", {6, 12}},  {"self_attn.o_proj", {12, 18}},
                                                 {"mlp.gate_proj", {20, 12}},    {"mlp.up_proj", {20, 12}},
                                                 {"mlp.down_proj", {12, 20}}};
    for (const auto& [n, s] : lin) sd.emplace(p + n + ".weight", random(s, rng));
  }
  save(d, std::move(sd), skip, reshape, std::move(shape), rng);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(HfDecoder, UnknownArchitectureIsNamed) {
  TempDir d;
  write_gpt2(d);
  write_text(d / "config.json", R"({"architectures": ["MixtralForCausalLM"], "vocab_size": 20})");
  const std::string e = error_of([&] { load_pretrained(d.dir.string()); });
  EXPECT_TRUE(has(e, "MixtralForCausalLM") && has(e, "GPT2LMHeadModel") && has(e, "T5ForConditionalGeneration")) << e;
}

TEST(HfDecoder, MissingTensorIsNamedWithItsShape) {
  TempDir d;
  write_gpt2(d, "transformer.h.1.mlp.c_fc.weight");
  std::string e = error_of([&] { load_pretrained(d.dir.string()); });
  EXPECT_TRUE(has(e, "'transformer.h.1.mlp.c_fc.weight' of shape (8, 32)") && has(e, "no tensor")) << e;
  TempDir l;
  write_llama(l, "lm_head.weight");  // untied: the head is its own tensor
  e = error_of([&] { load_pretrained(l.dir.string()); });
  EXPECT_TRUE(has(e, "'lm_head.weight' of shape (23, 12)")) << e;
}

TEST(HfDecoder, ShapeAgainstTheConfigNamesBothShapes) {
  TempDir d;
  write_gpt2(d, "", "transformer.h.0.attn.c_attn.weight", {24, 8});  // torch's (out, in), not Conv1D's
  std::string e = error_of([&] { load_pretrained(d.dir.string()); });
  EXPECT_TRUE(has(e, "'transformer.h.0.attn.c_attn.weight' of shape (8, 24)") && has(e, "but got (24, 8)")) << e;
  TempDir l;
  write_llama(l, "", "model.layers.1.self_attn.k_proj.weight", {18, 12});  // H key/value heads, not Hkv
  e = error_of([&] { load_pretrained(l.dir.string()); });
  EXPECT_TRUE(has(e, "'model.layers.1.self_attn.k_proj.weight' of shape (6, 12)") && has(e, "but got (18, 12)")) << e;
}

TEST(HfDecoder, ScaledRopeIsRefused) {
  TempDir l;
  write_llama(l, "", "", {}, R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})");
  const std::string e = error_of([&] { load_pretrained(l.dir.string()); });
  EXPECT_TRUE(has(e, "rope_type \"default\"") && has(e, "llama3")) << e;
}

// The KV cache path (prefill, then one token per step) gives the logits of the full forward, for either
// architecture; the eos id comes from config.json.
TEST(HfDecoder, CachedStepsMatchTheFullForward) {
  for (const char* arch : {"gpt2", "llama"}) {
    TempDir d;
    if (arch == std::string("gpt2")) write_gpt2(d);
    else write_llama(d);
    auto m = load_pretrained(d.dir.string());
    auto* dec = dynamic_cast<PretrainedDecoder*>(m.get());
    ASSERT_TRUE(dec) << arch;
    const int64_t B = 2, L = 11, V = dec->vocab_size(), P = 5;
    std::vector<int64_t> ids(size_t(B * L));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7 % size_t(V));
    Tensor full = dec->forward(ids.data(), B, L);  // (B, L, V)
    ASSERT_EQ(full.shape(), (Shape{B, L, V}));
    for (KvDtype kv : {KvDtype::f32, KvDtype::f16}) {
      KVCache cache = dec->new_cache(B, L, kv);
      std::vector<int64_t> step(size_t(B * P));
      for (int64_t b = 0; b < B; ++b) std::copy_n(ids.begin() + b * L, P, step.begin() + b * P);
      Tensor pre = dec->forward_cached(step.data(), B, P, cache);  // (B, P, V)
      Tensor last = Tensor();
      // a 16-bit cache rounds K and V once: |Δ logits| ~ unit roundoff · |logits| (weights 0.3, E 8-12)
      const float tol = kv == KvDtype::f32 ? 2e-5f : 2e-2f;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < P; ++t)
          for (int64_t v = 0; v < V; ++v)
            ASSERT_NEAR(pre.data()[(b * P + t) * V + v], full.data()[(b * L + t) * V + v], tol) << arch;
      for (int64_t t = P; t < L; ++t) {
        const int64_t tok[2] = {ids[size_t(t)], ids[size_t(L + t)]};
        last = dec->forward_cached(tok, B, 1, cache, true);  // (B, 1, V)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t v = 0; v < V; ++v)
            ASSERT_NEAR(last.data()[b * V + v], full.data()[(b * L + t) * V + v], tol) << arch << " t " << t;
      }
      EXPECT_EQ(cache.length(0), L);
      const int64_t one = 0;
      EXPECT_TRUE(has(error_of([&] { dec->forward_cached(&one, B, 1, cache); }), "positions")) << arch;
    }
    EXPECT_EQ(dec->decoder_config().eos_token_ids, (arch == std::string("gpt2") ? std::vector<int64_t>{19}
                                                                                 : std::vector<int64_t>{}));
  }
}

// BLOOM: vocab 19, E 12, 3 heads (ALiBi), 2 layers; the fused query_key_value (3E, E).
void write_bloom(const TempDir& d, const std::string& extra = "") {
  write_text(d / "config.json", R"({"architectures": ["BloomForCausalLM"], "vocab_size": 19, "hidden_size": 12,
    "n_layer": 2, "n_head": 3, "layer_norm_epsilon": 1e-5)" + extra + "}");
  Rng rng(9);
  StateDict sd;
  auto ln = [&](const std::string& n) {
    sd.emplace(n + ".weight", random({12}, rng)), sd.emplace(n + ".bias", random({12}, rng));
  };
  sd.emplace("transformer.word_embeddings.weight", random({19, 12}, rng));
  ln("transformer.word_embeddings_layernorm");
  ln("transformer.ln_f");
  for (int i = 0; i < 2; ++i) {
    const std::string p = cat("transformer.h.", i, ".");
    ln(p + "input_layernorm");
    ln(p + "post_attention_layernorm");
    const std::pair<const char*, Shape> lin[] = {{"self_attention.query_key_value", {36, 12}},
                                                 {"self_attention.dense", {12, 12}},
                                                 {"mlp.dense_h_to_4h", {48, 12}},
                                                 {"mlp.dense_4h_to_h", {12, 48}}};
    for (const auto& [n, sh] : lin)
      sd.emplace(p + n + ".weight", random(sh, rng)), sd.emplace(p + n + ".bias", random({sh[0]}, rng));
  }
  save_safetensors(d / "model.safetensors", sd);
}

// forward_cached in steps (a prefill of P tokens, then `chunk` tokens at a time) against the full forward.
void expect_steps_match_forward(PretrainedDecoder& dec, int64_t L, int64_t P, int64_t chunk, KvDtype kv, float tol,
                                const std::string& what) {
  const int64_t B = 2, V = dec.vocab_size();
  std::vector<int64_t> ids(size_t(B * L));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 7 % size_t(V));
  Tensor full = dec.forward(ids.data(), B, L);  // (B, L, V)
  KVCache cache = dec.new_cache(B, L, kv);
  for (int64_t t0 = 0; t0 < L;) {
    const int64_t T = std::min(t0 == 0 ? P : chunk, L - t0);
    std::vector<int64_t> step(size_t(B * T));
    for (int64_t b = 0; b < B; ++b) std::copy_n(ids.begin() + b * L + t0, T, step.begin() + b * T);
    Tensor got = dec.forward_cached(step.data(), B, T, cache);  // (B, T, V)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t v = 0; v < V; ++v)
          ASSERT_NEAR(got.data()[(b * T + t) * V + v], full.data()[(b * L + t0 + t) * V + v], tol)
              << what << " position " << t0 + t;
    t0 += T;
  }
}

// A Mistral-style model (every layer a window of 4 keys) and a Qwen2-style one (layer 1 of 2 sliding over 3):
// the rolling cache, stepped one token or three at a time past the window, in fp32 and bf16, gives the
// full forward's logits; a cache of every layer rolling decodes past its capacity.
TEST(HfDecoder, SlidingWindowCacheMatchesTheFullForward) {
  TempDir m, q;
  write_llama(m, "", "", {}, R"("sliding_window": 4, "rope_parameters": {"rope_theta": 500.0})", "MistralForCausalLM");
  write_llama(q, "", "", {}, R"("sliding_window": 3, "use_sliding_window": true, "max_window_layers": 1)",
              "Qwen2ForCausalLM");
  // Qwen2 has q/k/v biases: add them to the file
  {
    Rng rng(11);
    MappedSafetensors f(q / "model.safetensors");
    StateDict sd;
    for (const std::string& n : f.names()) sd.emplace(n, Tensor::copy_of(f.get(n).view()));
    for (int i = 0; i < 2; ++i)
      for (auto [n, rows] : {std::pair{"q_proj", 18}, std::pair{"k_proj", 6}, std::pair{"v_proj", 6}})
        sd.emplace(cat("model.layers.", i, ".self_attn.", n, ".bias"), random({rows}, rng));
    save_safetensors(q / "model.safetensors", sd);
  }
  for (const TempDir* d : {&m, &q}) {
    auto model = load_pretrained(d->dir.string());
    auto* dec = dynamic_cast<PretrainedDecoder*>(model.get());
    ASSERT_TRUE(dec);
    const bool mistral = d == &m;
    EXPECT_EQ(dec->architecture(), mistral ? "MistralForCausalLM" : "Qwen2ForCausalLM");
    EXPECT_EQ(dec->attention(0).sliding_window, mistral ? 4 : 0);
    EXPECT_EQ(dec->attention(1).sliding_window, mistral ? 4 : 3);
    for (int64_t chunk : {1, 3}) {
      expect_steps_match_forward(*dec, 13, 5, chunk, KvDtype::f32, 2e-5f,
                                 cat(dec->architecture(), " f32 chunk ", chunk));
      // bf16 K/V: |Δ logits| ~ 2^-8 relative (weights 0.3, E 12)
      expect_steps_match_forward(*dec, 13, 5, chunk, KvDtype::bf16, 5e-2f,
                                 cat(dec->architecture(), " bf16 chunk ", chunk));
    }
    KVCache small = dec->new_cache(1, 6);
    EXPECT_EQ(small.max_length(), mistral ? std::numeric_limits<int64_t>::max() : 6);
    for (int64_t t = 0; t < 9; ++t) {  // past the capacity of 6: fine only when every layer rolls
      const int64_t tok = t % 23;
      if (mistral || t < 6) dec->forward_cached(&tok, 1, 1, small);
      else EXPECT_TRUE(has(error_of([&] { dec->forward_cached(&tok, 1, 1, small); }), "positions"));
    }
  }
}

// BLOOM's ALiBi over the KV cache (one token, then two at a time) gives the full forward's logits; its fused
// query_key_value is read as heads of (q, k, v) triples (a wrong grouping changes the logits, so the match
// with transformers in test_decoders.py checks it).
TEST(HfDecoder, BloomCachedStepsMatchTheFullForward) {
  TempDir d;
  write_bloom(d);
  auto model = load_pretrained(d.dir.string());
  auto* dec = dynamic_cast<PretrainedDecoder*>(model.get());
  ASSERT_TRUE(dec);
  EXPECT_EQ(dec->max_positions(), 0);  // ALiBi: no position table
  for (int64_t chunk : {1, 2}) expect_steps_match_forward(*dec, 10, 3, chunk, KvDtype::f32, 2e-5f, "bloom");
  TempDir e;
  write_bloom(e, R"(, "n_inner": 20)");
  const std::string err = error_of([&] { load_pretrained(e.dir.string()); });
  EXPECT_TRUE(has(err, "\"n_inner\"") && has(err, "20")) << err;
}

// A config.json field attn does not implement is refused by name, never ignored: one unknown anywhere, one of
// another architecture of the family, a layer type, a rope scaling, a flag of BART's kin.
TEST(HfDecoder, UnimplementedConfigFieldsAreRefusedByName) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("chunked_attention_size": 8, "rope_theta": 500.0)", "\"chunked_attention_size\""},
      {R"("query_pre_attn_scalar": 16, "rope_theta": 500.0)", "\"query_pre_attn_scalar\""},
      {R"("sliding_window": 4, "rope_theta": 500.0)", "\"sliding_window\""},  // Llama has none
      {R"("pretraining_tp": 2, "rope_theta": 500.0)", "pretraining_tp"},
  };
  for (const auto& [fields, name] : cases) {
    TempDir d;
    write_llama(d, "", "", {}, fields);
    const std::string e = error_of([&] { load_pretrained(d.dir.string()); });
    EXPECT_TRUE(has(e, name) && has(e, "LlamaForCausalLM")) << e;
  }
  TempDir g;
  write_llama(g, "", "", {}, R"("layer_types": ["sliding_attention", "chunked_attention"], "sliding_window": 4)",
              "Qwen2ForCausalLM");
  std::string e = error_of([&] { load_pretrained(g.dir.string()); });
  EXPECT_TRUE(has(e, "chunked_attention") && has(e, "layer 1")) << e;
  TempDir b;
  write_bloom(b, R"(, "alibi_bias_max": 8)");
  e = error_of([&] { load_pretrained(b.dir.string()); });
  EXPECT_TRUE(has(e, "\"alibi_bias_max\"") && has(e, "BloomForCausalLM")) << e;
}

// A right-padded row gives the logits of the sequence alone, and zeros at the padding; an unpadded row
// beside it is unchanged.
TEST(HfDecoder, PaddingCostsNothingAndChangesNothing) {
  TempDir d;
  write_llama(d);
  auto m = load_pretrained(d.dir.string());
  const int64_t L = 9, V = m->vocab_size();
  std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3};  // (2, 9)
  std::vector<int64_t> mask = {1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  Tensor got = m->forward(ids.data(), 2, L, mask.data());
  Tensor alone = m->forward(ids.data(), 1, 6);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(got.data()[t * V + v], t < 6 ? alone.data()[t * V + v] : 0.0f, 1e-6) << t;
  Tensor second = m->forward(ids.data() + L, 1, L);
  for (int64_t i = 0; i < L * V; ++i) ASSERT_NEAR(got.data()[L * V + i], second.data()[i], 1e-6);
}

// ---- hostile config.json fields (issue 36) ----

// config.json of `d` with edit() applied.
void edit_config(const TempDir& d, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(d / "config.json"));
  edit(j);
  write_text(d / "config.json", j.dump());
}

TEST(HfDecoder, HostileSizesAndEpsilonsAreNamedNeverACrash) {
  using nlohmann::json;
  struct Case {
    const char* arch;
    std::function<void(json&)> edit;
    std::vector<const char*> want;
  };
  const Case cases[] = {
      // head_dim 2^61: an overflowing RoPE table size, then writes into nothing (SIGSEGV); the table is built
      // for the positions used now, and the weights say what 3 heads of 2^61 would need
      {"llama", [](json& j) { j["head_dim"] = int64_t(1) << 61; },
       {"'model.layers.0.self_attn.q_proj.weight' of shape (6917529027641081856, 12) (from config.json)"}},
      {"llama", [](json& j) { j["head_dim"] = int64_t(1) << 62; },
       {"num_attention_heads * head_dim", "3 * 4611686018427387904", "config.json"}},
      // "vector::reserve" before
      {"llama", [](json& j) { j["num_hidden_layers"] = int64_t(1) << 40; },
       {"num_hidden_layers 1099511627776 in config.json", "'model.layers.1099511627775.input_layernorm.weight'"}},
      {"gpt2", [](json& j) { j["n_layer"] = int64_t(1) << 40; },
       {"n_layer 1099511627776", "transformer.h.1099511627775"}},
      {"gpt2", [](json& j) { j["n_embd"] = int64_t(1) << 62; }, {"4 * n_embd", "config.json"}},
      // NaN embeddings or token 0 with exit 0 before
      {"llama", [](json& j) { j["rms_norm_eps"] = -1e-5; }, {"\"rms_norm_eps\"", "to be >= 0", "config.json"}},
      {"gpt2", [](json& j) { j["layer_norm_epsilon"] = -1.0; }, {"\"layer_norm_epsilon\"", "to be >= 0"}},
      // 2^64 - 1 read as int64 was -1
      {"llama", [](json& j) { j["vocab_size"] = UINT64_MAX; }, {"\"vocab_size\"", "an integer that fits in 64 bits"}},
  };
  for (const Case& c : cases) {
    TempDir d;
    c.arch == std::string("gpt2") ? write_gpt2(d) : write_llama(d);
    edit_config(d, c.edit);
    const std::string e = error_of([&] { load_pretrained(d.dir.string()); });
    for (const char* w : c.want) EXPECT_TRUE(has(e, w)) << c.arch << ": " << e;
  }
}

// max_position_embeddings 2^62 overflowed the RoPE table's size (SIGSEGV); 2^26 built 4.2 GB before the
// first token. The table now grows with the positions used: the logits are those of the model with 32.
// generate's cache is prompt + max_new_tokens, at most the positions: -n 2^63-1 made it -2^63.
TEST(HfDecoder, HugeMaxPositionsCostOnlyThePositionsUsed) {
  TempDir small, huge;
  write_llama(small);
  write_llama(huge);
  edit_config(huge, [](nlohmann::json& j) { j["max_position_embeddings"] = int64_t(1) << 62; });
  auto a = load_pretrained(small.dir.string()), b = load_pretrained(huge.dir.string());
  EXPECT_EQ(b->max_positions(), int64_t(1) << 62);
  const std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  Tensor x = a->forward(ids.data(), 1, 11), y = b->forward(ids.data(), 1, 11);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(x.data()[i], y.data()[i]) << i;
  SampleOptions o;
  o.max_new_tokens = INT64_MAX;
  o.temperature = 0;
  for (int64_t v = 0; v < b->vocab_size(); ++v) o.eos_token_ids.push_back(v);  // stops after one token
  for (auto* m : {a.get(), b.get()})
    EXPECT_EQ(generate(*dynamic_cast<PretrainedDecoder*>(m), ids, o).size(), 1u);
  // 300 greedy tokens: the cache grows past the prompt + 256 it starts with, and each token is the argmax of
  // the full forward over everything before it
  o.eos_token_ids.clear();
  o.max_new_tokens = 300;
  std::vector<int64_t> all = ids;
  const std::vector<int64_t> got = generate(*dynamic_cast<PretrainedDecoder*>(b.get()), ids, o);
  ASSERT_EQ(got.size(), 300u);
  all.insert(all.end(), got.begin(), got.end() - 1);
  const int64_t L = int64_t(all.size()), V = b->vocab_size();
  Tensor logits = b->forward(all.data(), 1, L);  // (1, L, V)
  for (int64_t t = 0; t < 300; ++t) {
    const float* row = logits.data() + (int64_t(ids.size()) - 1 + t) * V;
    ASSERT_EQ(std::max_element(row, row + V) - row, got[size_t(t)]) << t;
  }
}

// A decoder's sentence embedding pools its last hidden state (the final norm's output, E wide): the logits
// were pooled before, V wide, and their rows copied E values at a time.
TEST(HfDecoder, EmbedPoolsTheLastHiddenState) {
  TempDir d;
  write_gpt2(d);
  write_text(d / "tokenizer.json", R"({"pre_tokenizer": {"type": "WhitespaceSplit"}, "model": {"type": "WordPiece",
    "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1, "b": 2, "c": 3}}})");
  Pretrained p = Pretrained::load(d.dir.string());
  EXPECT_FALSE(p.pooling.configured);  // no modules.json: mean pooling, as sentence-transformers falls back
  const Tensor e = p.embed({"a b c a", "b"});  // (2, E)
  ASSERT_EQ(e.shape(), (Shape{2, 8}));
  const std::vector<int64_t> ids = {1, 2, 3, 1};
  const Tensor h = p.model->hidden_states(ids.data(), 1, 4);  // (1, 4, E)
  ASSERT_EQ(h.shape(), (Shape{1, 4, 8}));
  for (int64_t c = 0; c < 8; ++c) {
    float mean = 0;  // pool's order: a float32 sum over the tokens, then / count
    for (int64_t l = 0; l < 4; ++l) mean += h.data()[l * 8 + c];
    EXPECT_NEAR(e.data()[c], mean / 4, 1e-6) << c;
  }
}

}  // namespace
}  // namespace attn
