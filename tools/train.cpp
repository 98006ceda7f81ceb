// `attn train`: the training loop of the command line. Options, a one-line progress bar on a terminal
// (plain lines otherwise), periodic evaluation and checkpoints, --resume, a lock on --out for the run,
// and a checkpoint on Ctrl-C, SIGTERM or SIGHUP.
// The training itself (step, evaluation, checkpoint format) is include/attn/train.h's.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#ifdef ATTN_HAVE_MPI
#include <fcntl.h>

#include "attn/data_parallel.h"
#endif
#include "attn/profile.h"
#include "attn/threads.h"
#include "attn/train.h"
#include "cli.h"
#include "flags.h"

namespace attn {
namespace {

using Clock = std::chrono::steady_clock;

// SIGINT (Ctrl-C), SIGTERM (docker stop, systemd, Slurm) and SIGHUP (a closed terminal) alike: the
// signal's number, then a checkpoint at the end of the step. SA_RESETHAND: a second one ends the process.
volatile std::sig_atomic_t g_interrupted = 0;
void on_stop_signal(int sig) { g_interrupted = sig; }
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

// The flag and help of each field of TrainOptions that has a flag of its own, by the field's name in
// kTrainOptionsFields (train.h), which binds them. Not here: eps (no flag), and the two booleans whose
// flags say the opposite (--untied, --no-decay-embeddings).
struct TrainFlag {
  const char* field;
  const char* flag;
  const char* help;
};
constexpr TrainFlag kTrainFlags[] = {
    {"config", "--config", "model: tiny, nanogpt-cpu or gpt2-small"},
    {"block_size", "--block", "context length (default: the configuration's)"},
    {"n_kv_head", "--kv-heads", "key/value heads for grouped-query attention"},
    {"position", "--position", "positions: learned (a table of --block rows), rope or alibi (no table: the model "
                               "runs past --block)"},
    {"window", "--window", "sliding window: each position sees itself and the W before it (0: all before it)"},
    {"steps", "--steps", "optimizer steps in all"},
    {"batch", "--batch", "sequences per step"},
    {"lr", "--lr", "peak learning rate"},
    {"min_lr", "--min-lr", "learning rate at the end of the cosine decay"},
    {"warmup", "--warmup", "linear warmup steps"},
    {"lr_decay_steps", "--lr-decay-steps", "cosine decay length (default: --steps)"},
    {"weight_decay", "--weight-decay", "AdamW decoupled weight decay (matrices, embeddings)"},
    {"beta1", "--beta1", "AdamW beta1"},
    {"beta2", "--beta2", "AdamW beta2"},
    {"grad_clip", "--grad-clip", "clip the global gradient norm (0: off)"},
    {"dropout", "--dropout", "dropout probability"},
    {"eval_every", "--eval-every", "steps between evaluations and checkpoints (0: end only)"},
    {"eval_iters", "--eval-iters", "batches per split per evaluation"},
    {"seed", "--seed", "initialisation, data sampling and dropout"},
    {"threads", "--threads", kThreadsHelp},
    {"log_every", "--log-every", "steps between progress lines when not on a terminal"},
    {"dtype", "--dtype", "matmul precision: f32, or bf16 (mixed precision: bf16 products, fp32 weights, AdamW state "
                         "and sums; emulated exactly without AVX512_BF16)"},
};

// Adds --flag bound to field `f` of cli.values; after parsing, cli.apply copies it into a TrainOptions
// if it was given.
template <typename T>
CLI::Option* bind_option(CLI::App* cmd, TrainCli& cli, const std::string& flag, T TrainOptions::*f,
                         const std::string& help) {
  CLI::Option* opt = cmd->add_option(flag, cli.values.*f, help)->check(number_of<T>());
  const T with_data = TrainOptions{}.*f, builtin = synthetic_defaults().*f;
  if (!(with_data == builtin)) {  // --help shows both defaults: nanoGPT-like with --data, the task's without
    std::ostringstream d;
    d << with_data << " with --data, " << builtin << " without";
    opt->default_str(d.str());
  }
  cli.apply.push_back([opt, f, &cli](TrainOptions& o) {
    if (opt->count() == 0) return std::string();
    o.*f = cli.values.*f;
    return opt->get_name();
  });
  return opt;
}

// Every field of kTrainOptionsFields with a flag in kTrainFlags, bound in the list's order.
void bind_train_options(CLI::App* cmd, TrainCli& cli) {
  std::apply([&](const auto&... field) {
    auto bind = [&](const auto& x) {
      for (const TrainFlag& f : kTrainFlags)
        if (std::string_view(f.field) == x.name) bind_option(cmd, cli, f.flag, x.member, f.help);
    };
    (bind(field), ...);
  }, kTrainOptionsFields);
}

std::string duration(double s) {
  const long t = long(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string rate(double tokens_per_s) {
  char buf[32];
  if (tokens_per_s >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", tokens_per_s / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", tokens_per_s);
  return buf;
}

std::string bytes_text(double b) {
  char buf[32];
  const char* unit[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  for (; b >= 1000 && u < 4; ++u) b /= 1000;
  std::snprintf(buf, sizeof buf, "%.3g %s", b, unit[u]);
  return buf;
}

bool holds_checkpoint(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(dir) / "config.json", ec);
}

// An error every process of a data-parallel run met at the same point (a failed save, a bad option):
// each ends normally with it, rank 0 alone saying it.
struct AgreedError : Error {
  using Error::Error;
};

#ifdef ATTN_HAVE_MPI
void silence(int fd) {
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) ::dup2(null, fd), ::close(null);
}
#endif

// The run's Trainer, new or resumed, from the command line. `writer`: this process checks --out (and
// creates its folder) and locks it for the run (`lock`), the one that will write it. `threads`: --threads
// given with --resume, else -1.
std::unique_ptr<Trainer> make_trainer(TrainCli& cli, bool writer, int& threads, std::shared_ptr<void>& lock) {
  threads = -1;
  TrainOptions o = cli.data.empty() ? synthetic_defaults() : TrainOptions{};
  std::vector<std::string> given;
  for (auto& f : cli.apply)
    if (std::string name = f(o); !name.empty()) given.push_back(name);
  if (cli.untied) o.tie_weights = false, given.push_back("--untied");
  if (cli.no_decay_embeddings) o.decay_embeddings = false, given.push_back("--no-decay-embeddings");

  // --out is checked (and its folder created) now, not at the first save after the training work, and
  // locked before it is read: a second run on it would overwrite this one's checkpoints.
  if (writer) lock = lock_checkpoint_dir(cli.out);
  std::unique_ptr<Trainer> t;
  if (cli.resume) {
    for (const std::string& g : given)
      ATTN_CHECK(g == "--steps" || g == "--threads" || g == "--lr-decay-steps" || g == "--log-every",
                 "Expected only --steps, --lr-decay-steps, --threads and --log-every with --resume (the run's ",
                 "own options are used), but got ", g, " instead");
    auto data = cli.data.empty() ? nullptr : std::make_unique<Dataset>(Dataset::text_file(cli.data));
    const bool steps_given = std::find(given.begin(), given.end(), "--steps") != given.end();
    const bool decay_given = std::find(given.begin(), given.end(), "--lr-decay-steps") != given.end();
    t = Trainer::resume(cli.out, std::move(data), steps_given ? o.steps : 0, decay_given ? o.lr_decay_steps : 0);
    dtype_of(t->options().dtype, cli.strict);  // --strict: the resumed run's own dtype
    if (std::find(given.begin(), given.end(), "--threads") != given.end()) set_num_threads(threads = o.threads);
    // the run's own progress lines, unless --log-every says otherwise now
    cli.log_every = std::find(given.begin(), given.end(), "--log-every") != given.end() ? o.log_every
                                                                                       : t->options().log_every;
  } else {
    ATTN_CHECK(!holds_checkpoint(cli.out), "Expected a new or empty --out directory (or --resume to continue), but ",
               "got '", cli.out, "' holding a checkpoint instead");
    dtype_of(o.dtype, cli.strict);  // --strict: bf16 only where the CPU has it
    Dataset d = cli.data.empty() ? Dataset::reverse_task() : Dataset::text_file(cli.data);
    t = std::make_unique<Trainer>(o, std::move(d));
    cli.log_every = o.log_every;
  }
  return t;
}

int train_loop(TrainCli& cli, Trainer& trainer);

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainCli& cli) {
  auto* cmd = app.add_subcommand("train", "train the character-level GPT (no --data: a built-in reversal task)");
  cmd->add_option("--data", cli.data, "UTF-8 text file (90% train, 10% val); none: the synthetic task")
      ->check(not_empty("a text file"));
  // an empty --out is refused by lock_checkpoint_dir ("Expected a checkpoint directory name"), before any work
  cmd->add_option("--out", cli.out, "checkpoint directory (model.safetensors + config.json)");
  cmd->add_flag("--resume", cli.resume, "continue the run saved in --out exactly (its options, --log-every included; a "
                "larger --steps extends the cosine decay with it, or give --lr-decay-steps)");
  bind_train_options(cmd, cli);
  cmd->get_option("--config")->check(CLI::IsMember(gpt_config_names()));
  cmd->get_option("--threads")->check(non_negative());
  cmd->get_option("--log-every")->check(positive());
  cmd->get_option("--dtype")->check(CLI::IsMember({"f32", "bf16"}));
  cmd->get_option("--position")->check(CLI::IsMember({"learned", "rope", "alibi"}));
  cmd->get_option("--window")->check(non_negative());
  cmd->add_option("--eval-lengths", cli.eval_lengths, "after the run, the val loss at these context lengths "
                  "(past --block with --position rope or alibi)")->delimiter(',')
      ->check(number_of<int64_t>())->check(positive());
  cmd->add_flag("--strict", cli.strict, "with --dtype bf16: exit with an error where bf16 would run emulated");
  cmd->add_flag("--untied", cli.untied, "an output head of its own (not tied to wte)");
  cmd->add_flag("--profile", cli.profile, "after the run, print each part's share of the step time (layers' forward "
                "and backward, the attention kernel, the optimizer, data)");
  cmd->add_flag("--no-decay-embeddings", cli.no_decay_embeddings, "no weight decay on wte/wpe (nanoGPT decays them)");
  return cmd;
}

int run_train(TrainCli& cli) {
#ifdef ATTN_HAVE_MPI
  // Under mpirun with more than one process: data-parallel training, rank 0 printing and writing.
  if (launched_world_size() > 1) {
    auto dp = std::make_shared<DataParallel>();
    const int rank = dp->rank();
    if (rank != 0) silence(STDOUT_FILENO);
    std::unique_ptr<Trainer> t;
    std::string error;
    int threads = -1;
    std::shared_ptr<void> lock;
    try {
      t = make_trainer(cli, rank == 0, threads, lock);
    } catch (const std::exception& e) {
      error = e.what();
    }
    error = dp->first_error(error);  // one process's bad file is everyone's end, said once
    try {
      if (!error.empty()) throw AgreedError(error);
      t->distribute(dp);  // fails alike everywhere: its checks are collective
      if (threads >= 0) set_num_threads(threads);  // --threads with --resume over the run's default
    } catch (const Error&) {
      if (rank != 0) silence(STDERR_FILENO);
      throw;
    }
    try {
      return train_loop(cli, *t);
    } catch (const AgreedError&) {  // a failed save: every process has it
      if (rank != 0) silence(STDERR_FILENO);
      throw;
    } catch (const std::exception& e) {
      abort_job(e.what());  // met by this process alone: the others would wait for it forever
    }
  }
#else
  check_trains_alone();
#endif
  int threads = -1;
  std::shared_ptr<void> lock;
  auto t = make_trainer(cli, true, threads, lock);
  return train_loop(cli, *t);
}

namespace {

// What the run is, before its first step: memory, model, data, options, what the schedule does that a user
// would not guess, the data-parallel split.
void print_plan(Trainer& t) {
  const TrainOptions& opt = t.options();
  const GptConfig& c = t.model().config();
  const Dataset& d = t.data();
  // The Trainer refused (before allocating) a run larger than the machine's memory; say what this one needs.
  std::printf("memory: about %s (parameters, gradients, AdamW state, the activations of batch %lld x %lld and %s "
              "of token ids)\n",
              bytes_text(gpt_training_bytes_estimate(c, double(opt.batch), double(t.seq_len())) +
                         double(d.token_bytes())).c_str(),
              (long long)opt.batch, (long long)t.seq_len(), bytes_text(double(d.token_bytes())).c_str());
  std::printf("model %s: %lld layers, %lld heads (%lld kv), embedding %lld, block %lld, vocab %lld, %lld parameters, "
              "%s positions%s\n", opt.config.c_str(), (long long)c.n_layer, (long long)c.n_head, (long long)c.n_kv_head,
              (long long)c.n_embd, (long long)c.block_size, (long long)c.vocab_size,
              (long long)t.model().num_parameters(), c.position.c_str(),
              c.window ? cat(", window ", c.window).c_str() : "");
  if (d.synthetic())
    std::printf("data: the reversal task (%lld letters, '|', the letters reversed; loss on the reversed half)\n",
                (long long)d.task_length());
  else
    std::printf("data: %s, %llu bytes, %lld train / %lld val tokens\n", d.name().c_str(),
                (unsigned long long)d.bytes(), (long long)d.split_tokens(0), (long long)d.split_tokens(1));
  std::printf(
      "training: steps %lld (from %lld), batch %lld x %lld tokens, lr %g -> %g (warmup %lld, cosine decay "
      "to step %lld), "
      "weight decay %g, grad clip %g, dropout %g, seed %llu, threads %d\n",
      (long long)opt.steps, (long long)t.step_count(), (long long)opt.batch, (long long)t.seq_len(), opt.lr, opt.min_lr,
      (long long)opt.warmup, (long long)opt.lr_decay_steps, opt.weight_decay, opt.grad_clip, opt.dropout,
      (unsigned long long)opt.seed, num_threads());
  // A warmup that outlasts the run, and a resume whose longer --steps re-planned the decay (the learning
  // rate rises again).
  const LrSchedule sched = t.schedule();
  if (opt.warmup >= opt.steps && opt.steps > 0)
    std::printf("warning: --warmup %lld outlasts the run's %lld steps: the learning rate peaks at %.2e, never "
                "reaching --lr %g (give --warmup below --steps)\n",
                (long long)opt.warmup, (long long)opt.steps, sched.at(opt.steps - 1), opt.lr);
  if (const auto& before = t.saved_schedule(); before && before->decay_steps != sched.decay_steps &&
                                               t.step_count() > 0 && t.step_count() < opt.steps) {
    const int64_t s = t.step_count();
    std::printf("resume: the cosine decay now ends at step %lld (it ended at %lld): the learning rate goes from "
                "%.2e at step %lld to %.2e at step %lld, on the new schedule from there (--lr-decay-steps %lld keeps "
                "the old one)\n",
                (long long)sched.decay_steps, (long long)before->decay_steps, before->at(s - 1), (long long)s,
                sched.at(s), (long long)s + 1, (long long)before->decay_steps);
  }
  if (GradientSync* sync = t.sync()) {
    const SyncStats st = sync->stats();
    const int n = sync->size();
    const int64_t lo = opt.batch / n, hi = (opt.batch + n - 1) / n;
    std::printf("data parallel: %d processes, %lld%s rows of each batch per process, threads %d each; gradients "
                "(%s) summed in %d bucket%s during the backward; rank 0 prints and writes; Ctrl-C stops "
                "every process at one step and saves it\n",
                n, (long long)lo, hi > lo ? cat(" or ", hi).c_str() : "", num_threads(), bytes_text(st.bytes).c_str(),
                st.buckets, st.buckets == 1 ? "" : "s");
  }
  std::fflush(stdout);
}

// Ctrl-C, SIGTERM, SIGHUP caught for the guard's life (on_stop_signal: g_interrupted, from 0), the handlers
// before it put back however the scope ends, an exception included. Under mpirun the terminal's Ctrl-C
// reaches mpirun alone, which sends SIGTERM to every process and SIGKILL a second later
// (odls_base_sigkill_timeout): after each step the processes add up their flags, so all stop at the same
// step and rank 0 saves it within that second.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa = {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    g_interrupted = 0;
    for (size_t i = 0; i < std::size(kStopSignals); ++i) sigaction(kStopSignals[i], &sa, &previous_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < std::size(kStopSignals); ++i) sigaction(kStopSignals[i], &previous_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction previous_[std::size(kStopSignals)];
};

// The progress of the steps: a bar redrawn in place on a terminal (at most every 0.1 s), else a line every
// --log-every steps.
class Progress {
 public:
  Progress(bool tty, int64_t log_every) : tty_(tty), log_every_(log_every), t0_(Clock::now()) {}

  // stopping: a stop was agreed at this step (its checkpoint follows): no plain line for it.
  void step(int64_t step, int64_t steps, const StepStats& s, double tok_s, double eta_s, bool stopping) {
    char line[256];
    std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  lr %.2e  %s tok/s  ETA %s", (long long)step,
                  (long long)steps, s.loss, s.lr, rate(tok_s).c_str(), duration(eta_s).c_str());
    if (tty_) {
      const double now = std::chrono::duration<double>(Clock::now() - t0_).count();
      if (now - last_bar_ >= 0.1 || step == steps) {
        std::printf("\r\033[K%s", line);
        std::fflush(stdout);
        last_bar_ = now;
      }
    } else if ((step % log_every_ == 0 || step == steps) && !stopping) {
      // not once a stop is agreed: under mpirun, mpirun stops reading our stdout while it waits to kill
      // us, and a step line into a full pipe would block rank 0 before the agreed stop and its save
      std::printf("%s\n", line);
      std::fflush(stdout);
    }
  }
  // Before a line of its own: the bar goes, and is drawn afresh at the next step.
  void clear() {
    if (tty_ && last_bar_ >= 0) std::printf("\r\033[K");
    last_bar_ = -1;
  }

 private:
  bool tty_;
  int64_t log_every_;
  Clock::time_point t0_;
  double last_bar_ = -1;
};

// The end of a run: the last evaluation's line, the totals, the all-reduce's cost, the profile.
void print_summary(Trainer& t, const TrainCli& cli, const EvalStats& ev, int64_t done, double total_s,
                   double train_s) {
  std::printf("step %lld: train loss %.4f, val loss %.4f\n", (long long)t.step_count(), ev.train_loss, ev.val_loss);
  std::printf("done: %lld steps in %.1f s (%.1f s training, %s tok/s); checkpoint in %s\n", (long long)done,
              total_s, train_s, rate(done > 0 ? double(done * t.tokens_per_step()) / train_s : 0).c_str(),
              cli.out.c_str());
  if (GradientSync* sync = t.sync(); sync && done > 0) {
    // The sum's own time (after every process reached the end of its backward) apart from the wait for
    // the slowest process, which is load imbalance, not communication.
    const SyncStats st = sync->stats();
    const double per = 1e3 / double(st.steps);
    std::printf("all-reduce: %s of gradients per step in %d bucket%s: %.2f ms per step after the backward, %.2f ms "
                "in all (packing, MPI, adding, unpacking; %.1f%% of the step time); %.2f ms per step waiting for "
                "the slowest process\n",
                bytes_text(st.bytes).c_str(), st.buckets, st.buckets == 1 ? "" : "s",
                per * (st.wait_seconds - st.lag_seconds), per * (st.busy_seconds - st.lag_seconds),
                100 * (st.busy_seconds - st.lag_seconds) / train_s, per * st.lag_seconds);
  }
  if (cli.profile) {
    std::printf("profile of the %lld training steps (wall time on the calling thread, %d threads):\n", (long long)done,
                num_threads());
    std::ostringstream table;
    profile::print(table);
    std::fputs(table.str().c_str(), stdout);
  }
}

// The steps to --steps, an evaluation and a checkpoint every --eval-every and at the end. Ctrl-C, SIGTERM,
// SIGHUP: a checkpoint at the end of the step, then 128 + the signal.
int train_loop(TrainCli& cli, Trainer& t) {
  print_plan(t);
  const TrainOptions& opt = t.options();
  GradientSync* sync = t.sync();
  const StopSignals stop;
  auto interrupted = [&] {
    double any = g_interrupted ? 1 : 0;
    if (sync) sync->sum(&any, 1);
    return any > 0;
  };
  auto save = [&](const EvalStats* ev) {
    try {
      t.save(cli.out, ev);
    } catch (const Error& e) {
      if (sync) throw AgreedError(e.what());  // Trainer::save threw it on every process
      throw;
    }
  };

  profile::reset();
  profile::enable(cli.profile);  // only the training steps: evaluation and checkpoints are outside "step"
  Progress progress(!sync && ::isatty(STDOUT_FILENO), cli.log_every);  // mpirun hands its processes a pty of its own
  const int64_t first = t.step_count();
  const auto t0 = Clock::now();
  double train_s = 0;
  auto since = [](Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); };
  EvalStats ev{};
  bool have_eval = false;
  while (t.step_count() < opt.steps) {
    const auto s0 = Clock::now();
    StepStats s;
    {
      profile::Scope part("step");
      s = t.step();
    }
    train_s += since(s0);
    const int64_t done = t.step_count() - first, step = t.step_count();
    // agreed before the step's line: a rank whose signal came after another's would print a line for the
    // step the run stops at (and the checkpoint would not be the step after the last line)
    const bool stop = interrupted();
    progress.step(step, opt.steps, s, double(done * t.tokens_per_step()) / train_s,
                  train_s / double(done) * double(opt.steps - step), stop);
    if (stop) {
      progress.clear();
      save(have_eval ? &ev : nullptr);
      const int sig = g_interrupted ? int(g_interrupted) : SIGTERM;  // a rank told by another: mpirun's SIGTERM
      std::printf("interrupted at step %lld: checkpoint saved in %s (%s; continue with --resume)\n", (long long)step,
                  cli.out.c_str(), sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP");
      std::fflush(stdout);
      return 128 + sig;
    }
    if (opt.eval_every > 0 && step % opt.eval_every == 0 && step < opt.steps) {
      ev = t.evaluate();
      have_eval = true;
      save(&ev);
      progress.clear();
      std::printf("step %lld: train loss %.4f, val loss %.4f (checkpoint saved)\n", (long long)step, ev.train_loss,
                  ev.val_loss);
      std::fflush(stdout);
    }
  }
  profile::enable(false);
  ev = t.evaluate();
  save(&ev);
  progress.clear();
  print_summary(t, cli, ev, t.step_count() - first, since(t0), train_s);
  for (int64_t T : cli.eval_lengths) {  // a length the positions can't reach is said, not an error
    try {
      std::printf("val loss at context %lld: %.4f\n", (long long)T, t.evaluate_val(T));
    } catch (const Error& e) {
      std::printf("val loss at context %lld: none (%s)\n", (long long)T, e.what());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

}  // namespace attn
