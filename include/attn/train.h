// Training the GPT: data (a UTF-8 text split 90/10, or a synthetic task that needs no data), the
// training step (forward, cross-entropy, backward, clipping, AdamW, the schedule), evaluation, and
// checkpoints that resume exactly. Not the command line (tools/train.cpp) and not the model (gpt.h).
//
// Randomness is a pure function of (seed, step): the batch of step s, its dropout masks and the
// evaluation batches are drawn from generators seeded by mix64(seed, stream, s). A checkpoint therefore
// stores only the seed and the step, and a resumed run follows the uninterrupted one bit for bit.
//
// A checkpoint is a directory DIR holding model.safetensors (weights, AdamW moments; the step and a
// checkpoint id in its metadata) and config.json (model config, vocabulary, training options, data
// identity, RNG state, the same id, and the size and FNV-1a hash of model.safetensors). Both are written
// into a fresh sibling directory which then atomically replaces DIR (renameat2 RENAME_EXCHANGE), so a
// reader sees the old pair or the new pair, never a mix; loading checks the id and the hash.
//
// Data-parallel training (Trainer::distribute, GradientSync): N processes train one model, each on a
// fixed share of every step's batch, with the gradients summed across them; the run is the one process's
// up to the order of that sum, and a checkpoint does not depend on N.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attn/gpt.h"
#include "attn/launch.h"  // dist's launched_world_size and check_trains_alone, for the front ends
#include "attn/optim.h"
#include "attn/rng.h"
#include "attn/tokenizer.h"

namespace attn {

// ---- Data ----

class Dataset {
 public:
  // A UTF-8 text file: the vocabulary of its characters, the first 90% of its tokens for training and
  // the last 10% for validation (nanoGPT's shakespeare_char split).
  static Dataset text_file(const std::string& path);
  static Dataset text(const std::string& text, const std::string& name = "<text>");
  // The built-in task: `length` random letters, '|', then the same letters reversed ("abc|cba"); only
  // the reversed half is scored. Learnable in seconds, with a clear anti-diagonal attention pattern.
  static Dataset reverse_task(int64_t length = 8);

  // x, y (B, T): inputs and next-token targets (-1 = not scored) from split 0 (train) or 1 (val).
  // Text: random windows as nanoGPT's get_batch; the task: one example per row, T = seq_len().
  void batch(int split, int64_t B, int64_t T, Rng& rng, int64_t* x, int64_t* y) const;

  const CharTokenizer& tokenizer() const { return tok_; }
  bool synthetic() const { return task_length_ > 0; }
  int64_t task_length() const { return task_length_; }
  // The task's sequence length (2·length); for text 0 (any T up to the split's size - 1).
  int64_t seq_len() const { return 2 * task_length_; }
  int64_t split_tokens(int split) const { return split == 0 ? n_train_ : n_ - n_train_; }
  // Bytes holding the token ids: id_width() (1 for up to 256 characters, 2 up to 65,536) per token.
  uint64_t token_bytes() const { return ids_.size(); }
  const std::string& name() const { return name_; }  // the file's path, "<text>" or "reverse"
  uint64_t bytes() const { return bytes_; }
  uint64_t hash() const { return hash_; }              // FNV-1a 64 of the text's bytes (0 for the task)

  static constexpr const char* kTaskAlphabet = "abcdefghijklmnopqrstuvwxyz";

 private:
  CharTokenizer tok_;
  int64_t token(int64_t i) const;  // id i of the text (train split first, then val)
  std::vector<unsigned char> ids_;  // (n_,) token ids, width_ bytes each, little-endian
  int width_ = 1;
  int64_t n_ = 0, n_train_ = 0;
  std::string name_;
  uint64_t bytes_ = 0, hash_ = 0;
  int64_t task_length_ = 0;
};

uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// ---- Data parallelism ----

struct SyncStats {
  int64_t steps = 0;         // finish() calls
  int buckets = 0;           // gradient buckets per step, each summed as soon as its gradients are final
  double bytes = 0;          // gradient bytes summed per step (each process's whole gradient)
  double wait_seconds = 0;   // in finish(): the sum's time beyond the backward, what the steps paid for it
  double lag_seconds = 0;    // of wait_seconds, until every process had reached finish(): the slowest one's
                             // later backward (load imbalance, a busy machine), not communication
  double busy_seconds = 0;   // all of the sum's work (packing, MPI calls, adding, unpacking), the wait included
};

// The processes a Trainer trains with (Trainer::distribute): implemented over MPI by attn::DataParallel
// (attn/data_parallel.h), so the trainer sees no MPI. Every call is collective: each process makes the
// same calls in the same order.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_size() const { return 1; }  // processes on this machine (for the default thread count)
  // Once, before the first step: the gradients in groups, in the order the backward finishes them
  // (Gpt::grad_groups()).
  virtual void attach(const std::vector<std::vector<Param>>& groups) = 0;
  // During a backward: group g's gradients on this process are final (each group once per step, in order).
  virtual void grads_final(size_t group) = 0;
  // After the backward: returns once every gradient holds its sum over the processes, added in rank order
  // 0, 1, ..., N-1 (the same bits on every process, and on every repeat of the run).
  virtual void finish() = 0;
  // values[i] becomes its sum over the processes, added in rank order.
  virtual void sum(double* values, size_t n) = 0;
  // Whether every process passed the same value (each learns the answer).
  virtual bool same_everywhere(uint64_t value) = 0;
  // The lowest rank's non-empty `error`, or "" when every process passed "": how an error on one process
  // (a failed save on rank 0) becomes every process's.
  virtual std::string first_error(const std::string& error) = 0;
  virtual SyncStats stats() const = 0;
};


// ---- Training ----

struct TrainOptions {
  std::string config = "tiny";  // gpt_config() name
  int64_t block_size = 0;       // 0: the configuration's (the task's length for the synthetic data)
  int64_t n_kv_head = 0;        // 0: n_head; fewer for GQA
  bool tie_weights = true;
  std::string position = "learned";  // GptConfig::position: learned, rope or alibi
  int64_t window = 0;           // GptConfig::window: > 0, a sliding window of that many keys before each query
  int64_t steps = 2000;
  int64_t batch = 12;
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup = 100;
  int64_t lr_decay_steps = 0;   // 0: steps
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.99, eps = 1e-8;
  bool decay_embeddings = true; // nanoGPT decays wte/wpe (rank 2); biases and LayerNorm never decay
  double grad_clip = 1.0;       // 0: off
  double dropout = 0.0;
  int64_t eval_every = 250;     // 0: only at the end
  int64_t eval_iters = 20;      // batches per split per evaluation
  uint64_t seed = 1337;
  int threads = 0;               // 0: the CPUs this process may use
  // The matmuls' precision (gemm.h): "f32", or "bf16" for mixed precision as torch.autocast: bf16
  // products with fp32 sums; weights, AdamW state, activations, norms and reductions stay fp32.
  std::string dtype = "f32";
  // Steps between the progress lines of a loop that prints them (attn train, when not on a terminal);
  // kept with the run so that --resume prints as the run did. The Trainer itself prints nothing.
  int64_t log_every = 10;
};

// TrainOptions' fields, each named once: a checkpoint's "training" object (written, read and type-checked)
// and the Python binding (TrainOptions' attributes, Trainer's keyword arguments) follow this list.
inline constexpr auto kTrainOptionsFields = std::tuple{
    ATTN_FIELD(TrainOptions, config), ATTN_FIELD(TrainOptions, block_size), ATTN_FIELD(TrainOptions, n_kv_head),
    ATTN_FIELD(TrainOptions, tie_weights), ATTN_FIELD(TrainOptions, steps), ATTN_FIELD(TrainOptions, batch),
    ATTN_FIELD(TrainOptions, lr), ATTN_FIELD(TrainOptions, min_lr), ATTN_FIELD(TrainOptions, warmup),
    ATTN_FIELD(TrainOptions, lr_decay_steps), ATTN_FIELD(TrainOptions, weight_decay), ATTN_FIELD(TrainOptions, beta1),
    ATTN_FIELD(TrainOptions, beta2), ATTN_FIELD(TrainOptions, eps), ATTN_FIELD(TrainOptions, decay_embeddings),
    ATTN_FIELD(TrainOptions, grad_clip), ATTN_FIELD(TrainOptions, dropout), ATTN_FIELD(TrainOptions, eval_every),
    ATTN_FIELD(TrainOptions, eval_iters), ATTN_FIELD(TrainOptions, seed), ATTN_FIELD(TrainOptions, threads),
    ATTN_FIELD(TrainOptions, dtype), ATTN_FIELD(TrainOptions, log_every), ATTN_FIELD(TrainOptions, position),
    ATTN_FIELD(TrainOptions, window)};

// Defaults for the synthetic task: a short, fast run whose loss falls within 20 steps (1 thread).
TrainOptions synthetic_defaults();

struct StepStats {
  float loss;
  double lr, grad_norm;
};
struct EvalStats {
  float train_loss, val_loss;
};

class Trainer {
 public:
  // A fresh run. Throws for bad options (named) before any work.
  Trainer(const TrainOptions& options, Dataset data);
  Trainer(const Trainer&) = delete;  // the optimizer holds pointers into the model
  Trainer& operator=(const Trainer&) = delete;

  // Continues the run saved in `dir` (its options, with `steps` replaced if > 0). The data is reloaded
  // from the saved path unless `data` is given; either way it must be the same text (hash checked).
  // A larger `steps` re-plans a cosine decay that ended at the old last step to end at the new one;
  // lr_decay_steps > 0 sets the decay's length instead.
  static std::unique_ptr<Trainer> resume(const std::string& dir, std::unique_ptr<Dataset> data = nullptr,
                                         int64_t steps = 0, int64_t lr_decay_steps = 0);

  StepStats step();      // one optimizer step on the batch of step_count()
  EvalStats evaluate();  // mean loss over eval_iters batches of each split (fixed per step, eval mode)
  // The mean validation loss over eval_iters batches of T tokens (eval mode): T past block_size where the
  // positions allow it (rope, alibi), to see how a model trained on block_size extrapolates.
  float evaluate_val(int64_t T);
  void save(const std::string& dir, const EvalStats* last_eval = nullptr);

  // Data-parallel training over `sync`'s N processes: each builds the same Trainer (same options and data,
  // or the same checkpoint) and calls this once (checked: the same parameters, step and data everywhere).
  // From then on, process r takes rows [B·r/N, B·(r+1)/N) of each step's global batch of B (the rows one
  // process would draw, so the data order does not depend on N; B >= N), with the dropout masks the whole
  // batch would draw for them. Its gradient is its rows' part of the batch's mean loss (scaled by the
  // batch's scored-token count, not its own), and the parts are summed across the processes during the
  // backward, so clipping and AdamW see the global gradient and every process keeps the same parameters.
  // step() returns the global batch's loss; evaluate() splits each batch the same way and returns the
  // whole batch's losses; save() writes on rank 0 alone and returns (or throws) on every process once it
  // is done. Threads 0 (the default) become the CPUs / the processes on this machine.
  void distribute(std::shared_ptr<GradientSync> sync);
  GradientSync* sync() const { return sync_.get(); }  // nullptr: one process

  int64_t step_count() const { return step_; }
  const TrainOptions& options() const { return o_; }
  Gpt& model() { return *model_; }
  AdamW& optimizer() { return *opt_; }
  const Dataset& data() const { return data_; }
  int64_t seq_len() const { return T_; }
  int64_t tokens_per_step() const { return o_.batch * T_; }
  LrSchedule schedule() const;
  // After resume(): the checkpoint's schedule, before a longer `steps` (or lr_decay_steps) re-planned it.
  const std::optional<LrSchedule>& saved_schedule() const { return saved_schedule_; }

 private:
  void write_checkpoint(const std::string& dir, const EvalStats* last_eval);
  TrainOptions o_;
  Dataset data_;
  int64_t T_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<AdamW> opt_;
  int64_t step_ = 0;
  std::vector<int64_t> x_, y_;  // (B, T): the global batch
  std::shared_ptr<GradientSync> sync_;
  int64_t row0_ = 0, rows_ = 0;  // this process's share of x_, y_: rows [row0_, row0_ + rows_)
  std::optional<LrSchedule> saved_schedule_;
};

// ---- Checkpoints without a trainer ----

struct LoadedModel {
  std::unique_ptr<Gpt> model;
  CharTokenizer tokenizer;
  int64_t step = 0;
};
// The model and vocabulary of a checkpoint (optimizer state is ignored). Errors name the file and the
// problem: missing, truncated, corrupt (hash), half-replaced pair (id), bad JSON or config.
LoadedModel load_model(const std::string& dir);
// What a save into `dir` checks, done now (before any training): a name without NUL bytes that is not
// "", "." or "/", its folder (created if missing), `dir` missing, empty or a checkpoint, and writable.
// Also removes hidden .DIR.tmp-* / .DIR.old-* siblings that a killed save left. An Error otherwise.
void check_checkpoint_dir(const std::string& dir);
// An exclusive lock on checkpoint directory `dir` for as long as the handle lives: flock on the hidden
// sibling .DIR.lock (which records the holder's PID), so the kernel releases it when the process dies,
// kill -9 included. A second process asking gets an Error naming the holder's PID; this process asking
// again shares the lock it holds. A symbolic link is followed (the lock is on its target). Every save
// takes it for its own duration; `attn train` holds it for the whole run, so two runs can't overwrite
// each other's checkpoints.
std::shared_ptr<void> lock_checkpoint_dir(const std::string& dir);
// A checkpoint of the model alone (no optimizer state, not resumable).
void save_model(const std::string& dir, Gpt& model, const CharTokenizer& tokenizer);

}  // namespace attn
