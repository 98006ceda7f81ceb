// Tests of writing the files users name (attn/file.h): AtomicFile leaves the target whole or untouched and
// never writes through a name someone else planted, lock_writer refuses a planted symbolic link and a second
// writer, read_input takes pipes, and the tuning file is written through them (issue 36: `attn tune`'s
// temporary file followed a symbolic link; with HOME unset it went to a shared /tmp folder).
// Not the CLI's use of them (tests/python/test_hardening.py runs `attn embed` against a full disk and signals).
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "attn/check.h"
#include "attn/file.h"
#include "attn/tune.h"
#include "test_util.h"

namespace attn {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Sets an environment variable for a scope, or unsets it (nullopt); restores what was there.
struct Env {
  std::string name;
  std::optional<std::string> old;
  Env(const char* n, std::optional<std::string> value) : name(n) {
    if (const char* v = std::getenv(n)) old = v;
    if (value) ::setenv(n, value->c_str(), 1);
    else ::unsetenv(n);
  }
  ~Env() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

TEST(AtomicFile, ReplacesWholeOnCommitAndLeavesTheTargetOtherwise) {
  TempDir tmp;
  const std::string path = tmp / "out.npy";
  write_file_atomic(path, "--out", "old");
  {
    AtomicFile f(path, "--out");
    f.write("new, half of it");
    EXPECT_EQ(slurp(path), "old") << "the target changes only at commit";
    EXPECT_EQ(tmp.files().size(), 2u);  // out.npy and the hidden sibling
  }  // an exception or early return: never committed
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"out.npy"}) << "the sibling is removed";
  AtomicFile f(path, "--out");
  f.write("new");
  f.commit();
  EXPECT_EQ(slurp(path), "new");
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"out.npy"});
  EXPECT_THROW(f.write("more"), Error);
}

// A symbolic link at the target is replaced by the file, never written through.
TEST(AtomicFile, ReplacesASymlinkInsteadOfWritingThroughIt) {
  TempDir tmp;
  write_file_atomic(tmp / "victim", "test", "precious");
  fs::create_symlink(tmp / "victim", tmp / "out.jsonl");
  write_file_atomic(tmp / "out.jsonl", "--out", "mine");
  EXPECT_EQ(slurp(tmp / "victim"), "precious");
  EXPECT_FALSE(fs::is_symlink(tmp / "out.jsonl"));
  EXPECT_EQ(slurp(tmp / "out.jsonl"), "mine");
}

// A write that fails half-way (the file size limit: as a full disk) names the file and leaves it as it was.
TEST(AtomicFile, AFailedWriteNamesTheFileAndLeavesItAsItWas) {
  TempDir tmp;
  const std::string path = tmp / "e.npy";
  write_file_atomic(path, "--out", "old");
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto prev = std::signal(SIGXFSZ, SIG_IGN);  // write() fails with EFBIG instead of killing us
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string what;
  try {
    write_file_atomic(path, "--out", std::string(100000, 'x'));
  } catch (const Error& e) {
    what = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, prev);
  EXPECT_NE(what.find("--out '" + path + "'"), std::string::npos) << what;
  EXPECT_NE(what.find("is unchanged"), std::string::npos) << what;
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"e.npy"});
}

// A killed writer's sibling (its PID gone) is removed by the next writer; a live process's is left.
TEST(AtomicFile, SiblingsOfAKilledWriterAreRemovedByTheNext) {
  TempDir tmp;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ::waitpid(child, &status, 0);  // a PID that is gone now
  const std::string dead = cat(".t.json.tmp-", child, "-0123456789abcdef");
  const std::string live = cat(".t.json.tmp-", ::getppid(), "-0123456789abcdef");
  write_file_atomic(tmp / dead, "test", "torn");
  write_file_atomic(tmp / live, "test", "in progress");
  write_file_atomic(tmp / "t.json", "the tuning file", "{}");
  EXPECT_EQ(tmp.files(), std::vector<std::string>({live, "t.json"}));
}

TEST(LockWriter, ASymlinkAtTheLocksNameIsRefusedNotTruncatedThrough) {
  TempDir tmp;
  write_file_atomic(tmp / "victim", "test", "precious");
  fs::create_symlink(tmp / "victim", tmp / ".out.npy.lock");
  try {
    lock_writer(tmp / "out.npy", "--out");
    ADD_FAILURE() << "a lock through a planted symbolic link";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".out.npy.lock"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(tmp / "victim"), "precious");
}

TEST(LockWriter, ASecondProcessIsRefusedNamingTheFirst) {
  TempDir tmp;
  auto lock = lock_writer(tmp / "out.npy", "--out");
  EXPECT_EQ(lock.get(), lock_writer(tmp / "out.npy", "--out").get()) << "shared within the process";
  fs::create_directory_symlink(tmp.dir, tmp / "via");  // another name: the child's copy of the parent's
  const pid_t child = ::fork();                        // holders (by path) can't answer for it
  if (child == 0) {
    try {
      lock_writer(tmp / "via/out.npy", "--out");
    } catch (const Error& e) {
      const std::string want = cat("process ", ::getppid(), " holding its lock");
      ::_exit(std::string(e.what()).find(want) != std::string::npos ? 0 : 2);
    }
    ::_exit(1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit " << WEXITSTATUS(status);
  lock.reset();
  EXPECT_EQ(tmp.files(), std::vector<std::string>{"via"}) << "the lock file goes with its last holder";
}

TEST(ReadInput, APipeIsReadToItsEnd) {
  TempDir tmp;
  const std::string fifo = tmp / "in";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    std::ofstream(fifo) << "one\ntwo\n";
    ::_exit(0);
  }
  EXPECT_EQ(read_input(fifo, "--input", 1 << 20), "one\ntwo\n");
  int status = 0;
  ::waitpid(child, &status, 0);
  write_file_atomic(tmp / "f.txt", "test", "file");
  EXPECT_EQ(read_input(tmp / "f.txt", "--input", 1 << 20), "file");
  EXPECT_THROW(read_input(tmp.dir.string(), "--input", 1 << 20), Error) << "a directory is still refused";
}

// Issue 36: `attn tune` wrote through `<file>.tmp-<pid>`, so a symbolic link planted there had its target
// overwritten with tuning JSON.
TEST(TuneFile, APlantedTemporaryNameIsNeverWrittenThrough) {
  TempDir tmp;
  const std::string path = tmp / "tune.json";
  Env file("ATTN_TUNE_FILE", path);
  reload_tuning();
  write_file_atomic(tmp / "victim", "test", "precious");
  fs::create_symlink(tmp / "victim", cat(path, ".tmp-", ::getpid()));  // the old name, this process's PID
  tune({0.05, true});
  EXPECT_EQ(slurp(tmp / "victim"), "precious");
  EXPECT_NE(slurp(path).find(tuning_key()), std::string::npos);
  reload_tuning();
}

// With HOME unset the tuning file is the user's own (the password database's home), never a shared folder.
TEST(TuneFile, NoHomeMeansTheUsersHomeNotASharedFolder) {
  Env file("ATTN_TUNE_FILE", std::nullopt), xdg("XDG_CACHE_HOME", std::nullopt), home("HOME", std::nullopt);
  const passwd* pw = ::getpwuid(::getuid());
  ASSERT_NE(pw, nullptr);
  EXPECT_EQ(tuning_path(), std::string(pw->pw_dir) + "/.cache/attn/tune.json");
  EXPECT_NE(tuning_path().rfind("/tmp", 0), 0u) << tuning_path();
}

}  // namespace
}  // namespace attn
