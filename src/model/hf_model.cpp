// The parts of a Hugging Face model directory that every architecture shares: its weights (one mapped
// safetensors file or the shards an index names), the choice of loader by config.json's
// "architectures", and sentence-transformers' pooling. The architectures live in hf_<name>.cpp.
#include <cmath>
#include <filesystem>

#include "attn/hf.h"
#include "attn/sdpa.h"
#include "hf_config.h"
#include "hf_json.h"
#include "hf_pack.h"

namespace attn {

namespace fs = std::filesystem;
using hf::json;

HfWeights::HfWeights(const std::string& dir) : dir_(dir) {
  check_path(dir, "model directory");
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shards;
  std::error_code ec;  // a symbolic link counts as there, dangling or not: its open says why it fails
  if (fs::exists(fs::symlink_status(single, ec))) {
    shards.push_back("model.safetensors");
  } else if (fs::exists(fs::symlink_status(index, ec))) {
    const json j = hf::read_json(index.string(), "safetensors index");
    auto wm = j.find("weight_map");
    ATTN_CHECK(wm != j.end() && wm->is_object(), "Expected \"weight_map\" (tensor name -> file) in '",
               index.string(), "', but got ", wm == j.end() ? std::string("none") : hf::brief(*wm), " instead");
    for (const auto& [name, file] : wm->items()) {
      ATTN_CHECK(file.is_string() && fs::path(file.get<std::string>()).filename() == file.get<std::string>(),
                 "Expected the shard of '", name, "' in '", index.string(), "' to be a file name, but got ",
                 hf::brief(file), " instead");
      if (std::find(shards.begin(), shards.end(), file.get<std::string>()) == shards.end())
        shards.push_back(file.get<std::string>());
    }
  } else {
    ATTN_CHECK(false, "Expected a model directory with model.safetensors or model.safetensors.index.json, but got '",
               dir, "' without either instead");
  }
  for (const std::string& f : shards) {
    files_.emplace_back((fs::path(dir) / f).string());
    for (const std::string& name : files_.back().names()) {
      auto [it, fresh] = where_.emplace(name, files_.size() - 1);
      ATTN_CHECK(fresh, "Expected each tensor in one shard, but got '", name, "' in both '",
                 files_[it->second].path(), "' and '", files_.back().path(), "' instead");
    }
  }
}

bool HfWeights::contains(const std::string& name) const { return where_.count(name) > 0; }

void HfWeights::expect(const std::string& name, const std::string& because) const {
  ATTN_CHECK(contains(name), "Expected a tensor '", name, "' in '", dir_, "' (", because,
             "), but got no tensor of that name instead");
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

Tensor HfWeights::get(const std::string& name, const Shape& want) const {
  auto it = where_.find(name);
  ATTN_CHECK(it != where_.end(), "Expected a tensor '", name, "' of shape ", to_string(want), " in '", dir_,
             "', but got no tensor of that name instead");
  const MappedSafetensors& f = files_[it->second];
  ATTN_CHECK(f.shape(name) == want, "Expected tensor '", name, "' of shape ", to_string(want),
             " (from config.json), but got ", to_string(f.shape(name)), " in '", f.path(), "' instead");
  return f.get(name);
}

Linear HfWeights::linear(const std::string& name, int64_t out, int64_t in, bool bias, WeightLayout layout) const {
  Tensor weight = get(name + ".weight", layout == WeightLayout::in_out ? Shape{in, out} : Shape{out, in});
  return Linear(std::move(weight), bias ? get(name + ".bias", {out}) : Tensor(), layout);
}

LayerNorm HfWeights::layer_norm(const std::string& name, int64_t E, double eps) const {
  Tensor weight = get(name + ".weight", {E});
  return LayerNorm(std::move(weight), get(name + ".bias", {E}), eps);
}

// ---- packed batches ----

namespace hf {

PackedBatch pack_batch(const int64_t* ids, int64_t B, int64_t L, const int64_t* mask) {
  ATTN_CHECK(B > 0 && L > 0, "Expected ids (B, L) with B, L > 0, but got (", B, ", ", L, ") instead");
  PackedBatch p;
  p.B = B, p.L = L;
  p.off.assign(size_t(B) + 1, 0);
  p.row_of.assign(size_t(B * L), -1);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t l = 0; l < L; ++l) {
      const int64_t i = b * L + l;
      ATTN_CHECK(!mask || mask[i] == 0 || mask[i] == 1, "Expected attention_mask of 0s and 1s, but got ", mask[i],
                 " at (", b, ", ", l, ") instead");
      if (mask && mask[i] == 0) continue;
      p.row_of[size_t(i)] = p.rows();
      p.tok.push_back(ids[i]);
      p.pos.push_back(l);
    }
    p.off[size_t(b) + 1] = p.rows();
  }
  return p;
}

void set_variants(SdpaArgs<float>& args, const LayerAttention& a) {
  args.scale = a.scale;
  if (a.sliding_window > 0) args.window = Window{a.sliding_window - 1, -1};
  args.softcap = a.softcap;
  args.alibi_slopes = a.alibi_slopes;
  args.relative_bias = a.relative_bias;
}

void attend_packed(const PackedBatch& p, View<const float> q, View<const float> k, View<const float> v, int64_t H,
                   int64_t Hkv, int64_t D, Causal causal, View<float> ctx, Tensor* weights, const LayerAttention& a) {
  const int64_t L = p.L;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t o = p.off[size_t(b)], n = p.off[size_t(b) + 1] - o;
    if (n == 0) continue;
    // rows [o, o + n) of a (T, heads·D) matrix as (1, heads, n, D): head h is columns [h·D, (h+1)·D)
    auto heads = [&](auto x, int64_t h) {
      return decltype(x){x.data + o * x.stride(0), {1, h, n, D}, {n * x.stride(0), D, x.stride(0), 1}};
    };
    SdpaArgs<float> args{heads(q, H), heads(k, Hkv), heads(v, Hkv)};
    args.causal = causal;
    set_variants(args, a);
    Tensor w;
    if (weights) w = Tensor::uninitialized({1, H, n, n});
    sdpa(args, SdpaOut<float>{heads(ctx, H), weights ? w.view() : View<float>{}, {}});
    if (!weights) continue;
    // (1, H, n, n) into (B, H, L, L) at the sequence's own positions
    float* dst = weights->data();
    const int64_t* at = p.pos.data() + o;  // the positions l of the packed rows o...o+n-1
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) dst[((b * H + h) * L + at[i]) * L + at[j]] = w.data()[(h * n + i) * n + j];
  }
}

void attend_cached(KVCache& cache, int64_t layer, View<const float> q, View<const float> k, View<const float> v,
                   int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, const LayerAttention& a, View<float> ctx,
                   Tensor* weights) {
  // rows (B·T, heads·D) as (B, heads, T, D)
  auto heads = [&](auto m, int64_t h) {
    return decltype(m){m.data, {B, h, T, D}, {T * m.stride(0), D, m.stride(0), 1}};
  };
  SdpaArgs<float> args;
  args.q = heads(q, H);
  args.causal = Causal::bottom_right;  // query t sees the cached keys and the new ones up to t
  set_variants(args, a);
  auto attend = [&](View<const float> keys, View<const float> values) {
    args.k = keys;
    args.v = values;
    if (weights) *weights = Tensor({B, H, T, keys.size(2)});
    sdpa(args, SdpaOut<float>{heads(ctx, H), weights ? weights->view() : View<float>{}, {}});
  };
  const int64_t held = cache.stored(layer);
  if (cache.window(layer) > 0 && T > 1) {
    // Several new tokens on a rolling layer (which may hold fewer than they see): attended over the cached
    // window and themselves, joined (B, Hkv, held + T, D), or over themselves alone in place, then appended
    // (which drops what leaves the window).
    if (held == 0) {
      attend(heads(k, Hkv), heads(v, Hkv));
      cache.append(layer, heads(k, Hkv), heads(v, Hkv));
      return;
    }
    const int64_t n = held + T;
    Tensor kk({B, Hkv, n, D}), vv({B, Hkv, n, D});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t s = 0; s < n; ++s) {
          float* dk = kk.data() + ((b * Hkv + h) * n + s) * D;
          float* dv = vv.data() + ((b * Hkv + h) * n + s) * D;
          if (s >= held) {  // new token s - held: row b·T + s - held, head h
            const int64_t r = b * T + s - held;
            std::copy_n(k.data + r * k.stride(0) + h * D, D, dk);
            std::copy_n(v.data + r * v.stride(0) + h * D, D, dv);
          } else if (cache.dtype() == KvDtype::f32) {
            const View<const float> ck = cache.keys(layer), cv = cache.values(layer);
            std::copy_n(ck.data + b * ck.stride(0) + h * ck.stride(1) + s * ck.stride(2), D, dk);
            std::copy_n(cv.data + b * cv.stride(0) + h * cv.stride(1) + s * cv.stride(2), D, dv);
          } else {
            const HalfKV hk = cache.half(layer);
            from_half(hk.dtype, hk.k.data + b * hk.k.stride(0) + h * hk.k.stride(1) + s * hk.k.stride(2), D, dk);
            from_half(hk.dtype, hk.v.data + b * hk.v.stride(0) + h * hk.v.stride(1) + s * hk.v.stride(2), D, dv);
          }
        }
    attend(kk.view(), vv.view());
    cache.append(layer, heads(k, Hkv), heads(v, Hkv));
    return;
  }
  cache.append(layer, heads(k, Hkv), heads(v, Hkv));
  if (cache.dtype() == KvDtype::f32) {
    attend(cache.keys(layer), cache.values(layer));
  } else {
    ATTN_CHECK(!weights, "Expected an f32 KV cache for attention weights, but got ", to_string(cache.dtype()),
               " instead");
    sdpa(args, cache.half(layer), SdpaOut<float>{heads(ctx, H), {}, {}});
  }
}

Tensor unpack(const PackedBatch& p, View<const float> x) {
  const int64_t F = x.size(1);
  Tensor out({p.B, p.L, F});  // padded positions stay 0
  for (int64_t i = 0; i < p.B * p.L; ++i)
    if (p.row_of[size_t(i)] >= 0) std::copy_n(x.data + p.row_of[size_t(i)] * x.stride(0), F, out.data() + i * F);
  return out;
}

}  // namespace hf

namespace hf {

namespace {

// Fields of a saved config that change nothing attn computes at inference: which class and library wrote
// it, token ids (read where they matter: eos, decoder start), dtype (the file's tensors say it), dropout and
// layer drop (eval mode), initialisation, labels of heads attn does not run, and generation defaults
// (attn's generate is asked for greedy or sampling explicitly; forced_bos/eos_token_id are read where used).
constexpr const char* kInertFields[] = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "dtype", "torch_dtype", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "unk_token_id",
    "initializer_range", "initializer_factor", "init_std", "attention_dropout", "hidden_dropout", "dropout",
    "dropout_rate", "activation_dropout", "classifier_dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop",
    "encoder_layerdrop", "decoder_layerdrop", "id2label", "label2id", "num_labels", "problem_type",
    "output_attentions", "output_hidden_states", "return_dict", "is_encoder_decoder", "task_specific_params",
    "finetuning_task", "prefix", "forced_bos_token_id", "forced_eos_token_id", "num_beams", "no_repeat_ngram_size",
    "early_stopping", "max_length", "min_length", "length_penalty", "gradient_checkpointing",
    "bad_words_ids", "use_return_dict", "classif_dropout"};

}  // namespace

void check_fields(const json& j, const std::string& where, const std::string& architecture,
                  std::initializer_list<const char*> read) {
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* r : read) known = known || key == r;
    for (const char* r : kInertFields) known = known || key == r;
    ATTN_CHECK(known, "Expected only the config.json fields attn implements for ", architecture, " in ", where,
               ", but got \"", key, "\" (", brief(value), ") instead");
  }
}

int64_t generation_id(const std::string& dir, const json& config, const char* key, int64_t fallback) {
  const fs::path gen = fs::path(dir) / "generation_config.json";
  json g;
  if (fs::exists(gen)) g = read_json(gen.string(), "generation_config.json");
  const bool in_gen = g.contains(key);
  const json& j = in_gen ? g : config;
  const std::string where = cat("'", in_gen ? gen.string() : (fs::path(dir) / "config.json").string(), "'");
  return field_or<int64_t>(j, key, where, fallback);
}

}  // namespace hf

std::unique_ptr<PretrainedModel> load_pretrained(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  const json j = hf::read_json(path, "config.json");
  std::string arch;
  if (auto a = j.find("architectures"); a != j.end() && a->is_array() && a->size() == 1 && (*a)[0].is_string())
    arch = (*a)[0].get<std::string>();
  if (arch == "BertModel") return std::make_unique<BertModel>(dir);
  if (arch == "GPT2LMHeadModel") return std::make_unique<Gpt2Model>(dir);
  if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM" ||
      arch == "Gemma2ForCausalLM")
    return std::make_unique<LlamaModel>(dir);
  if (arch == "BloomForCausalLM") return std::make_unique<BloomModel>(dir);
  if (arch == "T5ForConditionalGeneration") return std::make_unique<T5Model>(dir);
  if (arch == "BartForConditionalGeneration") return std::make_unique<BartModel>(dir);
  ATTN_CHECK(false, "Expected \"architectures\" [\"BertModel\"], [\"GPT2LMHeadModel\"], [\"LlamaForCausalLM\"], ",
             "[\"MistralForCausalLM\"], [\"Qwen2ForCausalLM\"], [\"Gemma2ForCausalLM\"], [\"BloomForCausalLM\"], ",
             "[\"T5ForConditionalGeneration\"] or [\"BartForConditionalGeneration\"] in '", path, "', but got ",
             j.contains("architectures") ? hf::brief(j["architectures"]) : std::string("none"), " instead");
  return nullptr;
}

// ---- sentence-transformers pooling ----

Pooling read_pooling(const std::string& dir) {
  Pooling p;
  const fs::path sbert = fs::path(dir) / "sentence_bert_config.json";
  if (fs::exists(sbert))
    p.max_seq_length = hf::field_or<int64_t>(hf::read_json(sbert.string(), "sentence_bert_config.json"),
                                             "max_seq_length", sbert.string(), 0);
  const fs::path modules = fs::path(dir) / "modules.json";
  if (!fs::exists(modules)) return p;
  const json j = hf::read_json(modules.string(), "modules.json", /*array=*/true);
  for (const json& m : j) {
    const std::string where = cat("a module of '", modules.string(), "'");
    const std::string type = hf::field<std::string>(m, "type", where);
    if (type.ends_with("Normalize")) {
      p.normalize = true;
    } else if (type.ends_with("Pooling")) {
      const fs::path cfg = fs::path(dir) / hf::field<std::string>(m, "path", where) / "config.json";
      const json c = hf::read_json(cfg.string(), "pooling config");
      const std::string cw = cat("'", cfg.string(), "'");
      const bool mean = hf::field_or<bool>(c, "pooling_mode_mean_tokens", cw, false);
      const bool cls = hf::field_or<bool>(c, "pooling_mode_cls_token", cw, false);
      const bool max = hf::field_or<bool>(c, "pooling_mode_max_tokens", cw, false);
      const bool other = hf::field_or<bool>(c, "pooling_mode_mean_sqrt_len_tokens", cw, false) ||
                         hf::field_or<bool>(c, "pooling_mode_weightedmean_tokens", cw, false) ||
                         hf::field_or<bool>(c, "pooling_mode_lasttoken", cw, false);
      ATTN_CHECK(int(mean) + int(cls) + int(max) == 1 && !other, "Expected one pooling mode of mean, cls or max in ",
                 cw, ", but got ", hf::brief(c), " instead");
      p.mode = mean ? Pooling::Mode::mean : cls ? Pooling::Mode::cls : Pooling::Mode::max;
      p.configured = true;
    }
  }
  return p;
}

std::string to_string(const Pooling& p) {
  const char* mode = p.mode == Pooling::Mode::mean ? "mean" : p.mode == Pooling::Mode::cls ? "cls" : "max";
  return cat(mode, " pooling, ", p.normalize ? "L2-normalized" : "not normalized");
}

Tensor pool(View<const float> hidden, const int64_t* mask, const Pooling& pooling) {
  ATTN_CHECK(hidden.rank() == 3 && hidden.is_contiguous(), "Expected hidden states (B, L, E), contiguous, but got ",
             to_string(hidden.shape), " instead");
  const int64_t B = hidden.size(0), L = hidden.size(1), E = hidden.size(2);
  Tensor out({B, E});
  for (int64_t b = 0; b < B; ++b) {
    float* o = out.data() + b * E;
    const float* h = hidden.data + b * L * E;
    const int64_t* m = mask ? mask + b * L : nullptr;
    if (pooling.mode == Pooling::Mode::cls) {
      std::copy(h, h + E, o);
    } else {
      // sentence-transformers: sum(h · m) / max(sum(m), 1e-9), in float32, tokens in order
      std::vector<float> acc(size_t(E), pooling.mode == Pooling::Mode::max ? -INFINITY : 0.0f);
      float count = 0;
      for (int64_t l = 0; l < L; ++l) {
        if (m && m[l] == 0) continue;
        count += 1;
        for (int64_t e = 0; e < E; ++e)
          acc[size_t(e)] = pooling.mode == Pooling::Mode::max ? std::max(acc[size_t(e)], h[l * E + e])
                                                              : acc[size_t(e)] + h[l * E + e];
      }
      for (int64_t e = 0; e < E; ++e)
        o[e] = pooling.mode == Pooling::Mode::max ? (count > 0 ? acc[size_t(e)] : 0.0f)
                                                  : acc[size_t(e)] / std::max(count, 1e-9f);
    }
    if (pooling.normalize) {  // torch.nn.functional.normalize: x / max(||x||, 1e-12)
      double ss = 0;
      for (int64_t e = 0; e < E; ++e) ss += double(o[e]) * o[e];
      const float inv = 1.0f / std::max(float(std::sqrt(ss)), 1e-12f);
      for (int64_t e = 0; e < E; ++e) o[e] *= inv;
    }
  }
  return out;
}

// ---- Pretrained ----

Pretrained Pretrained::load(const std::string& dir, Precision precision) {
  const std::string tokenizer = (fs::path(dir) / "tokenizer.json").string();
  Pretrained p{load_pretrained(dir), HfTokenizer::from_file(tokenizer), read_pooling(dir)};
  // an id past the embedding would fail only when a text met it: refused here, both files named
  const int64_t V = p.model->vocab_size();
  ATTN_CHECK(p.tokenizer.vocab_size() <= V, "Expected the token ids of '", tokenizer, "' below vocab_size ", V,
             " of '", (fs::path(dir) / "config.json").string(), "', but got ids up to ", p.tokenizer.vocab_size() - 1,
             " instead");
  p.model->precision = precision;
  if (precision == Precision::bf16)
    for (Linear* l : p.model->linears()) l->use_bf16_weights();
  return p;
}

int64_t Pretrained::max_tokens() const {
  int64_t n = pooling.max_seq_length > 0 ? pooling.max_seq_length : tokenizer.max_length();
  const int64_t cap = model->max_positions();
  return n <= 0 ? cap : cap > 0 ? std::min(n, cap) : n;
}

Tensor Pretrained::embed(const std::vector<std::string>& texts, int64_t batch, int64_t max_length,
                         const std::function<void(int64_t, int64_t)>& progress) {
  ATTN_CHECK(batch > 0, "Expected batch > 0, but got ", batch, " instead");
  ATTN_CHECK(max_length >= 0, "Expected max_length >= 0, but got ", max_length, " instead");
  const int64_t N = int64_t(texts.size()), E = model->hidden_size(), most = max_length ? max_length : max_tokens();
  std::vector<std::vector<int64_t>> ids(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) ids[i] = tokenizer.encode(texts[i], true, most).ids;
  std::vector<size_t> order(texts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a].size() < ids[b].size(); });
  Tensor out({N, E});
  for (int64_t b0 = 0; b0 < N; b0 += batch) {
    const int64_t B = std::min(batch, N - b0);
    int64_t L = 1;
    for (int64_t i = 0; i < B; ++i) L = std::max(L, int64_t(ids[order[size_t(b0 + i)]].size()));
    std::vector<int64_t> x(size_t(B * L), tokenizer.pad_id()), m(size_t(B * L), 0);  // (B, L) each
    for (int64_t i = 0; i < B; ++i) {
      const std::vector<int64_t>& t = ids[order[size_t(b0 + i)]];
      std::copy(t.begin(), t.end(), x.begin() + i * L);
      std::fill_n(m.begin() + i * L, t.size(), 1);
    }
    Tensor h = model->hidden_states(x.data(), B, L, m.data());  // (B, L, E)
    Tensor p = pool(h.view(), m.data(), pooling);          // (B, E)
    for (int64_t i = 0; i < B; ++i) std::copy_n(p.data() + i * E, E, out.data() + int64_t(order[size_t(b0 + i)]) * E);
    if (progress) progress(b0 + B, N);
  }
  return out;
}

}  // namespace attn
