// Data, the training step, evaluation, resumable checkpoints and the demo. The loop with its progress
// bar and Ctrl-C handling is the CLI's (tools/train.cpp); this file is what both it and Python call.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <fstream>
#include <ostream>
#include <sstream>

#include "attn/check.h"
#include "attn/file.h"
#include "attn/memstat.h"
#include "attn/profile.h"
#include "attn/threads.h"
#include "attn/train.h"
#include "checkpoint.h"

namespace attn {
namespace {

using ckpt::json;

// Independent random streams, each a pure function of (seed, stream, step).
enum Stream : uint64_t { kTrainBatch = 1, kDropout = 2, kEvalTrain = 3, kEvalVal = 4 };
uint64_t stream_seed(uint64_t seed, Stream stream, int64_t step) {
  return mix64(mix64(seed ^ (uint64_t(stream) * 0x9E3779B97F4A7C15ull)) ^ uint64_t(step));
}

// A text of n bytes is held with its ids (at least n more): refuse what can't fit before reading. The
// exact count is Dataset::text's, once the vocabulary says the ids' width.
std::string read_file(const std::string& path) {
  const uint64_t have = available_memory_bytes();
  return read_regular_file(path, "data file", have ? have / 2 : UINT64_MAX);
}

uint64_t below(Rng& rng, uint64_t n) { return rng.next() % n; }  // bias < n / 2^64: negligible

void check_options(const TrainOptions& o) {
  auto positive = [](int64_t v, const char* name) {
    ATTN_CHECK(v > 0, "Expected ", name, " > 0, but got ", v, " instead");
  };
  auto non_negative = [](double v, const char* name) {
    ATTN_CHECK(v >= 0, "Expected ", name, " >= 0, but got ", v, " instead");
  };
  // Counts of steps and batches are bounded where no sum or product of them can overflow int64 (warmup + 1,
  // 4 · eval_iters partial sums): 2^40 steps is years of training; a million batches per evaluation is
  // more than any held-out split needs. (Batch and block sizes are bounded by the memory estimate below.)
  auto at_most = [](int64_t v, int64_t max, const char* name) {
    ATTN_CHECK(v <= max, "Expected ", name, " <= ", max, ", but got ", v, " instead");
  };
  constexpr int64_t kMaxCount = int64_t(1) << 40, kMaxEvalIters = 1000000;
  for (auto [v, name] : {std::pair{o.steps, "steps"}, {o.warmup, "warmup"}, {o.lr_decay_steps, "lr_decay_steps"},
                         {o.eval_every, "eval_every"}})
    at_most(v, kMaxCount, name);
  at_most(o.eval_iters, kMaxEvalIters, "eval_iters");
  ATTN_CHECK(o.steps >= 0, "Expected steps >= 0, but got ", o.steps, " instead");
  parse_precision(o.dtype);  // names anything but f32/bf16
  positive(o.batch, "batch");
  positive(o.eval_iters, "eval_iters");
  positive(o.log_every, "log_every");
  non_negative(o.threads, "threads");
  ATTN_CHECK(o.lr > 0, "Expected lr > 0 (at lr 0 nothing trains), but got ", o.lr, " instead");
  non_negative(o.min_lr, "min_lr");
  non_negative(double(o.warmup), "warmup");
  non_negative(double(o.lr_decay_steps), "lr_decay_steps");
  non_negative(o.weight_decay, "weight_decay");
  non_negative(o.grad_clip, "grad_clip");
  non_negative(double(o.eval_every), "eval_every");
  non_negative(double(o.block_size), "block_size");
  non_negative(double(o.n_kv_head), "n_kv_head");
}

GptConfig model_config(const TrainOptions& o, const Dataset& data) {
  GptConfig c = gpt_config(o.config);
  c.vocab_size = data.tokenizer().vocab_size();
  if (o.block_size > 0) c.block_size = o.block_size;
  c.n_kv_head = o.n_kv_head;
  c.tie_weights = o.tie_weights;
  c.dropout = o.dropout;
  c.position = o.position;
  c.window = o.window;
  return c;
}

json data_json(const Dataset& d) {
  json j = {{"kind", d.synthetic() ? "reverse" : "text"}, {"bytes", d.bytes()}};
  if (d.synthetic()) {
    j["task_length"] = d.task_length();
  } else {
    j["path"] = d.name();
    j["fnv1a64"] = d.hash();
  }
  return j;
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// ---- Dataset ----

// The text's ids at 1 or 2 bytes each (a character vocabulary of more than 65,536 is 4), written
// straight from the UTF-8: the text and its ids are the whole of the data in memory, counted before.
Dataset Dataset::text(const std::string& text, const std::string& name) {
  Dataset d;
  d.tok_ = CharTokenizer::from_text(text);
  d.width_ = d.tok_.id_width();
  d.n_ = code_points(text);
  check_fits_in_memory(double(text.size()) + double(d.n_) * d.width_,
                       cat("the text of ", text.size(), " bytes and its ", d.n_, " tokens at ", d.width_, " byte",
                           d.width_ > 1 ? "s" : "", " each"));
  d.ids_.resize(size_t(d.n_) * size_t(d.width_));
  d.tok_.encode_into(text, d.width_, d.ids_.data());
  d.n_train_ = int64_t(double(d.n_) * 0.9);
  d.name_ = name;
  d.bytes_ = text.size();
  d.hash_ = fnv1a64(text.data(), text.size());
  return d;
}

Dataset Dataset::text_file(const std::string& path) {
  const std::string bytes = read_file(path);
  try {
    return text(bytes, path);
  } catch (const Error& e) {
    throw Error(cat(e.what(), " (in '", path, "')"));
  }
}

Dataset Dataset::reverse_task(int64_t length) {
  ATTN_CHECK(length > 0, "Expected a task length > 0, but got ", length, " instead");
  Dataset d;
  d.tok_ = CharTokenizer::from_text(std::string(kTaskAlphabet) + "|");
  d.name_ = "reverse";
  d.task_length_ = length;
  return d;
}

void Dataset::batch(int split, int64_t B, int64_t T, Rng& rng, int64_t* x, int64_t* y) const {
  ATTN_CHECK(split == 0 || split == 1, "Expected split 0 (train) or 1 (val), but got ", split, " instead");
  if (synthetic()) {
    const int64_t k = task_length_, A = int64_t(std::char_traits<char>::length(kTaskAlphabet));
    ATTN_CHECK(T == 2 * k, "Expected T = ", 2 * k, " for the reverse task of length ", k, ", but got ", T, " instead");
    const int64_t bar = tok_.encode("|")[0];
    std::vector<int64_t> e(size_t(2 * k + 1));  // letters, '|', letters reversed
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < k; ++i) e[size_t(i)] = e[size_t(2 * k - i)] = int64_t(below(rng, uint64_t(A)));
      e[size_t(k)] = bar;
      for (int64_t t = 0; t < T; ++t) {
        x[b * T + t] = e[size_t(t)];
        y[b * T + t] = t >= k ? e[size_t(t + 1)] : -1;  // only the reversed half can be predicted
      }
    }
    return;
  }
  const int64_t first = split == 0 ? 0 : n_train_, size = split_tokens(split);
  ATTN_CHECK(size > T, "Expected at least T + 1 = ", T + 1, " tokens in the ", split == 0 ? "train" : "val",
             " split, but got ", size, " instead");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = first + int64_t(below(rng, uint64_t(size - T)));  // torch.randint(len - T)
    for (int64_t t = 0; t < T; ++t) {
      x[b * T + t] = token(i + t);
      y[b * T + t] = token(i + t + 1);
    }
  }
}

int64_t Dataset::token(int64_t i) const {
  const unsigned char* p = ids_.data() + size_t(i) * size_t(width_);
  int64_t id = 0;
  for (int k = width_ - 1; k >= 0; --k) id = id << 8 | p[k];
  return id;
}

// ---- Trainer ----

TrainOptions synthetic_defaults() {
  TrainOptions o;
  o.steps = 200;
  o.batch = 32;
  o.lr = 1e-2;  // a 2-layer model of E 64 takes it: the loss halves by step 20 and is ~0.01 by step 100
  o.min_lr = 1e-3;
  o.warmup = 5;
  o.weight_decay = 0.1;
  o.eval_every = 50;
  o.eval_iters = 10;
  // The tiny model's matmuls are too small to split: a second thread only waits.
  o.threads = 1;
  return o;
}

Trainer::Trainer(const TrainOptions& options, Dataset data) : o_(options), data_(std::move(data)) {
  check_options(o_);
  if (o_.lr_decay_steps == 0) o_.lr_decay_steps = o_.steps;
  set_num_threads(o_.threads);
  const GptConfig c = check_gpt_config(model_config(o_, data_));  // its own errors before the step's estimate
  T_ = data_.synthetic() ? data_.seq_len() : c.block_size;
  ATTN_CHECK(T_ <= c.block_size, "Expected block_size >= ", T_, " (the task's sequence length), but got ",
             c.block_size, " instead");
  for (int split = 0; split < 2 && !data_.synthetic(); ++split)  // fail now, not at the first evaluation
    ATTN_CHECK(data_.split_tokens(split) > T_, "Expected at least block_size + 1 = ", T_ + 1, " characters in the ",
               split ? "val" : "train", " split (90/10) of ", data_.name(), ", but got ", data_.split_tokens(split),
               " instead: use more text or a smaller --block");
  // Before allocating (batch 2^60 wrapped batch·T and wrote past x_): the step must fit in memory.
  check_fits_in_memory(gpt_training_bytes_estimate(c, double(o_.batch), double(T_)) + double(data_.token_bytes()),
                       cat("training batch ", o_.batch, " x ", T_, " tokens of a model of block_size ", c.block_size,
                           ", n_layer ", c.n_layer, ", n_embd ", c.n_embd, ", vocab_size ", c.vocab_size,
                           data_.token_bytes() ? cat(" on ", data_.token_bytes(), " bytes of token ids") : ""));
  model_ = std::make_unique<Gpt>(c, o_.seed);
  const bool decay_emb = o_.decay_embeddings;
  opt_ = std::make_unique<AdamW>(model_->parameter_list(),
                                 AdamWOptions{o_.lr, o_.beta1, o_.beta2, o_.eps, o_.weight_decay},
                                 [decay_emb](const Param& p) { return nanogpt_decays(p, decay_emb); });
  x_.resize(size_t(o_.batch * T_));
  y_.resize(size_t(o_.batch * T_));
  rows_ = o_.batch;
}

LrSchedule Trainer::schedule() const { return {o_.lr, o_.min_lr, o_.warmup, o_.lr_decay_steps}; }

StepStats Trainer::step() {
  {
    profile::Scope p("data");
    Rng rng(stream_seed(o_.seed, kTrainBatch, step_));
    data_.batch(0, o_.batch, T_, rng, x_.data(), y_.data());  // the global batch, on every process
  }
  model_->train();
  model_->reseed(stream_seed(o_.seed, kDropout, step_));
  {
    profile::Scope p("zero_grad");
    opt_->zero_grad();
  }
  // Forward, loss and backward on this process's rows. The loss is the global batch's mean, so every
  // share's gradient is divided by the global count of scored tokens; the processes' parts then add up
  // to the one-process gradient. (One process: forward_backward exactly.)
  const int64_t count = scored_tokens(y_.data(), int64_t(y_.size()));
  struct Unhook {  // the hook lives for this backward only (also when it throws)
    Gpt& m;
    ~Unhook() { m.on_grads_final = nullptr; }
  } unhook{*model_};
  if (sync_) model_->on_grads_final = [this](size_t group) { sync_->grads_final(group); };
  double loss_sum;
  {
    const Autocast autocast(parse_precision(o_.dtype));
    loss_sum = model_->forward_backward_sum(x_.data() + row0_ * T_, y_.data() + row0_ * T_, rows_, T_, count);
  }
  if (sync_) {
    sync_->finish();  // profiled inside
    sync_->sum(&loss_sum, 1);
  }
  StepStats s;
  s.loss = count == 0 ? 0.0f : float(loss_sum / double(count));
  {
    profile::Scope p("clip_grad_norm");
    s.grad_norm = grad_norm(opt_->params());
  }
  s.lr = schedule().at(step_);
  profile::Scope p("optimizer");
  opt_->step(s.lr, clip_coefficient(s.grad_norm, o_.grad_clip));  // the clip folded into the update's pass
  ++step_;
  return s;
}

EvalStats Trainer::evaluate() {
  model_->eval();
  const Autocast autocast(parse_precision(o_.dtype));
  // Per batch, this process's rows' loss sum and scored count (summed across the processes); each batch's
  // loss is their quotient, as one process's cross_entropy over the whole batch.
  std::vector<double> part(size_t(4 * o_.eval_iters), 0.0);
  for (int split = 0; split < 2; ++split) {
    Rng rng(stream_seed(o_.seed, split == 0 ? kEvalTrain : kEvalVal, step_));
    for (int64_t i = 0; i < o_.eval_iters; ++i) {
      data_.batch(split, o_.batch, T_, rng, x_.data(), y_.data());
      const int64_t* y = y_.data() + row0_ * T_;
      Tensor logits = model_->forward(x_.data() + row0_ * T_, rows_, T_);
      double* p = &part[size_t(2 * (split * o_.eval_iters + i))];
      p[0] = cross_entropy_sum(logits.view().reshape({rows_ * T_, model_->config().vocab_size}), y);
      p[1] = double(scored_tokens(y, rows_ * T_));
    }
  }
  if (sync_) sync_->sum(part.data(), part.size());
  float loss[2];
  for (int split = 0; split < 2; ++split) {
    double sum = 0;
    for (int64_t i = 0; i < o_.eval_iters; ++i) {
      const double* p = &part[size_t(2 * (split * o_.eval_iters + i))];
      sum += p[1] > 0 ? float(p[0] / p[1]) : 0.0f;  // Gpt::evaluate's float mean of the batch
    }
    loss[split] = float(sum / double(o_.eval_iters));
  }
  model_->train();
  return {loss[0], loss[1]};
}

float Trainer::evaluate_val(int64_t T) {
  ATTN_CHECK(T > 0, "Expected an evaluation length T > 0, but got ", T, " instead");
  model_->eval();
  const Autocast autocast(parse_precision(o_.dtype));
  std::vector<int64_t> x(size_t(o_.batch * T)), y(x.size());
  Rng rng(stream_seed(o_.seed, kEvalVal, step_));
  double sum = 0;
  for (int64_t i = 0; i < o_.eval_iters; ++i) {
    data_.batch(1, o_.batch, T, rng, x.data(), y.data());
    sum += model_->evaluate(x.data(), y.data(), o_.batch, T);
  }
  model_->train();
  return float(sum / double(o_.eval_iters));
}

void Trainer::distribute(std::shared_ptr<GradientSync> sync) {
  ATTN_CHECK(sync, "Expected a GradientSync to distribute the training over, but got none instead");
  ATTN_CHECK(!sync_, "Expected one call of Trainer::distribute, but got a second one instead");
  const int n = sync->size(), r = sync->rank();
  // Every process must hold the same run: parameters, optimizer step, options and data (checked first,
  // so that every check after it fails on every process alike).
  uint64_t h = fnv1a64(&step_, sizeof step_);
  TrainOptions same = o_;
  same.threads = 0;  // may differ per process: no result depends on the thread count
  const std::string opts = ckpt::to_json(same).dump() + data_json(data_).dump();
  h = fnv1a64(opts.data(), opts.size(), h);
  for (const Param& p : model_->parameter_list()) h = fnv1a64(p.value->data(), size_t(p.value->numel()) * 4, h);
  ATTN_CHECK(sync->same_everywhere(h), "Expected the same model, options, data and step on all ", n,
             " processes, but got different ones instead (was every process given the same arguments and files?)");
  ATTN_CHECK(o_.batch >= n, "Expected batch >= ", n, " (the number of processes: each takes a share of every ",
             "step's batch), but got ", o_.batch, " instead");
  sync->attach(model_->grad_groups());
  sync_ = std::move(sync);
  row0_ = o_.batch * r / n;
  rows_ = o_.batch * (r + 1) / n - row0_;
  model_->set_batch_offset(row0_);
  if (o_.threads == 0 && sync_->local_size() > 1) share_threads(sync_->local_size());  // the machine's CPUs
}

void Trainer::save(const std::string& dir, const EvalStats* last_eval) {
  if (sync_) {  // rank 0 writes (every process holds the same state); all return, or throw its error
    std::string error;
    if (sync_->rank() == 0) {
      try {
        write_checkpoint(dir, last_eval);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    error = sync_->first_error(error);
    if (!error.empty()) throw Error(error);
    return;
  }
  write_checkpoint(dir, last_eval);
}

void Trainer::write_checkpoint(const std::string& dir, const EvalStats* last_eval) {
  StateDict tensors = model_->state_dict();
  opt_->save_state(tensors, "optim.");
  json config = {{"step", step_},
                 {"model", ckpt::to_json(model_->config())},
                 {"tokenizer", ckpt::tokenizer_json(data_.tokenizer())},
                 {"training", ckpt::to_json(o_)},
                 {"data", data_json(data_)},
                 {"rng", {{"seed", o_.seed}, {"step", step_},
                          {"scheme", "batch, dropout and eval streams: mix64(mix64(seed ^ stream·φ) ^ step)"}}}};
  if (last_eval) config["metrics"] = {{"train_loss", last_eval->train_loss}, {"val_loss", last_eval->val_loss}};
  ckpt::write(dir, tensors, std::move(config));
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& dir, std::unique_ptr<Dataset> data, int64_t steps,
                                         int64_t lr_decay_steps) {
  ckpt::Contents c = ckpt::read(dir);
  const std::string where = dir + "/config.json";
  ATTN_CHECK(c.config.contains("training") && c.config.contains("data"), "Expected training options in '", where,
             "' (a checkpoint from attn train), but got a model-only checkpoint instead");
  TrainOptions o = ckpt::train_options_from(c.config["training"], where + " training");
  const LrSchedule saved{o.lr, o.min_lr, o.warmup, o.lr_decay_steps};
  if (steps > 0) {
    // A longer run re-plans a decay that ended with the old run; a shorter one keeps the schedule it followed.
    if (steps > o.steps && o.lr_decay_steps == o.steps) o.lr_decay_steps = steps;
    o.steps = steps;
  }
  if (lr_decay_steps > 0) o.lr_decay_steps = lr_decay_steps;
  const json& dj = c.config["data"];
  if (!data) {
    if (dj.value("kind", "") == "reverse") {
      data = std::make_unique<Dataset>(Dataset::reverse_task(dj.value("task_length", int64_t(0))));
    } else {
      const std::string path = dj.value("path", "");
      ATTN_CHECK(path != "<text>", "Expected the text to resume with (the run in '", dir,
                 "' trained on a text given in memory, not a file), but got none instead");
      data = std::make_unique<Dataset>(Dataset::text_file(path));
    }
  }
  const json now = data_json(*data);
  ATTN_CHECK(now.value("kind", "") == dj.value("kind", "") &&
                 now.value("bytes", uint64_t(0)) == dj.value("bytes", uint64_t(0)) &&
                 now.value("fnv1a64", uint64_t(0)) == dj.value("fnv1a64", uint64_t(0)) &&
                 now.value("task_length", int64_t(0)) == dj.value("task_length", int64_t(0)),
             "Expected the data the checkpoint was trained on (", dj.dump(), "), but got ", now.dump(), " instead");
  auto t = std::make_unique<Trainer>(o, std::move(*data));
  // The data's vocabulary is the one the ids were trained with (as generate reads it from the checkpoint).
  const json vocab = ckpt::tokenizer_json(t->data().tokenizer());
  ATTN_CHECK(vocab == c.config["tokenizer"], "Expected the tokenizer in '", where, "' to be the data's ",
             vocab.dump().substr(0, 200), ", but got ", c.config["tokenizer"].dump().substr(0, 200), " instead");
  ATTN_CHECK(ckpt::to_json(t->model().config()) == c.config["model"], "Expected the model config ",
             ckpt::to_json(t->model().config()).dump(), " implied by the training options, but got ",
             c.config["model"].dump(), " in '", where, "' instead");
  const int64_t step = c.config.value("step", int64_t(-1));
  StateDict optim = ckpt::take_prefixed(c.tensors, "optim.");
  t->model().load_state_dict(c.tensors);
  t->opt_->load_state(optim, step, "optim.");
  t->step_ = step;
  t->saved_schedule_ = saved;
  return t;
}

// ---- Model-only checkpoints ----

LoadedModel load_model(const std::string& dir) {
  ckpt::Contents c = ckpt::read(dir);
  const std::string where = dir + "/config.json";
  ATTN_CHECK(c.config.contains("model") && c.config.contains("tokenizer"), "Expected 'model' and 'tokenizer' in '",
             where, "', but got none instead");
  LoadedModel m;
  m.tokenizer = ckpt::tokenizer_from(c.config["tokenizer"], where + " tokenizer");
  const GptConfig config = ckpt::gpt_config_from(c.config["model"], where + " model");
  ATTN_CHECK(config.vocab_size == m.tokenizer.vocab_size(), "Expected vocab_size ", m.tokenizer.vocab_size(),
             " (the tokenizer's) in '", where, "', but got ", config.vocab_size, " instead");
  m.model = std::make_unique<Gpt>(config, 0);
  ckpt::take_prefixed(c.tensors, "optim.");
  m.model->load_state_dict(c.tensors);
  m.step = c.config.value("step", int64_t(0));
  return m;
}

void save_model(const std::string& dir, Gpt& model, const CharTokenizer& tokenizer) {
  ATTN_CHECK(tokenizer.vocab_size() == model.config().vocab_size, "Expected a tokenizer of ",
             model.config().vocab_size, " characters (the model's vocab_size), but got ", tokenizer.vocab_size(),
             " instead");
  json config = {{"step", 0}, {"model", ckpt::to_json(model.config())}, {"tokenizer", ckpt::tokenizer_json(tokenizer)}};
  ckpt::write(dir, model.state_dict(), std::move(config));
}

}  // namespace attn
