"""What the `attn` command says to a user who gets a command line wrong, and what its --help and
--version show: "did you mean" for subcommands and flags, readable range errors, --ckpt required where
it is read, defaults in every --help, and --resume with a larger --steps re-planning the cosine decay.
Not the training or the views themselves (test_gpt.py, test_viz_cli.py).
"""
import re
import subprocess
from pathlib import Path

import pytest

from cli_bin import attn_exe, run_cli

CMAKE = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()


def run(*args):
    return run_cli(*args, text=True)


@pytest.mark.parametrize("args, message", [
    (["trian"], "unknown command 'trian' (did you mean 'train'?); the commands are demo, info, tune, bench, train, "
                "generate, viz, embed"),
    ([], "a command is required; the commands are demo, info, tune, bench, train, generate, viz, embed"),
    (["train", "--step", "10"], "attn train has no option --step (did you mean --steps?)"),
    (["generate", "--temprature", "1"], "(did you mean --temperature?)"),
    (["bench", "--threads", "-1"], "--threads: Expected a number >= 0, but got -1 instead"),
    (["generate", "--ckpt", "x", "--temperature", "-1"], "--temperature: Expected a number >= 0, but got -1 instead"),
    (["generate", "--prompt", "x"], "Expected exactly one of --ckpt DIR and --model DIR, but got neither instead"),
    (["--versoin"], "attn has no option --versoin (did you mean --version?)"),
    # an empty path (a failed $(scripts/minilm-dir)) is an error, not the option's absence
    (["viz", "--model", "", "--text", "x"], "--model: Expected a model directory, but got an empty string instead"),
    (["viz", "--ckpt", "", "--text", "x"], "--ckpt: Expected a checkpoint directory, but got an empty string instead"),
    (["generate", "--model", ""], "--model: Expected a model directory, but got an empty string instead"),
    (["embed", "--model", ""], "--model: Expected a model directory, but got an empty string instead"),
    (["train", "--data", "", "--steps", "1"], "--data: Expected a text file, but got an empty string instead"),
])
def test_errors_say_what_to_do(args, message):
    r = run(*args)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert len(r.stderr) < 400, r.stderr  # one readable message, no 309-digit range


def test_version_and_defaults_in_help():
    version = re.search(r"project\(attn VERSION ([0-9.]+)", CMAKE).group(1)
    assert run("--version").stdout.strip() == f"attn {version}"
    assert "--threads INT:NONNEGATIVE=0" in run("generate", "--help").stdout
    train = run("train", "--help").stdout
    assert "--steps INT=2000 with --data, 200 without" in train and "--out TEXT=out" in train
    assert "--top-k INT:NONNEGATIVE=all up to 64 keys" in run("viz", "--help").stdout  # not =-1


@pytest.mark.parametrize("command", ["info", "tune", "bench", "train", "generate", "viz", "embed"])
def test_threads_is_one_flag_in_every_command(command):
    # one declaration (tools/flags.h): an int >= 0, 0 for the CPUs this process may use
    assert re.search(r"--threads INT:NONNEGATIVE=(0|1)\b", run(command, "--help").stdout), command
    r = run(command, "--threads", "-1")
    assert r.returncode != 0 and "--threads: Expected a number >= 0, but got -1 instead" in r.stderr, r.stderr


def test_generate_prints_its_text_before_its_stats_with_2_to_1(tmp_path):
    out = str(tmp_path / "ck")
    assert run("train", "--out", out, "--steps", "1", "--eval-iters", "1").returncode == 0
    exe = attn_exe()
    r = subprocess.run([str(exe), "generate", "--ckpt", out, "--prompt", "ab|", "-n", "5"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 2 and lines[0].startswith("ab|"), r.stdout
    assert lines[1].startswith("(5 characters in "), r.stdout


def test_resume_with_more_steps_replans_the_decay(tmp_path):
    out = str(tmp_path / "ck")
    r = run("train", "--out", out, "--steps", "6", "--eval-every", "0", "--eval-iters", "1")
    assert r.returncode == 0 and "cosine decay to step 6)" in r.stdout, r.stdout + r.stderr
    r = run("train", "--out", out, "--resume", "--steps", "9")
    assert r.returncode == 0 and "cosine decay to step 9)" in r.stdout, r.stdout + r.stderr
    r = run("train", "--out", out, "--resume", "--steps", "12", "--lr-decay-steps", "100")
    assert r.returncode == 0 and "cosine decay to step 100)" in r.stdout, r.stdout + r.stderr


def test_resume_keeps_the_runs_log_every(tmp_path):
    # the help says --resume continues with the run's options: its progress lines too (not on a terminal here)
    out = str(tmp_path / "ck")
    steps = lambda r: re.findall(r"^step (\d+)/", r.stdout, re.M)
    r = run("train", "--out", out, "--steps", "4", "--log-every", "2", "--eval-every", "0", "--eval-iters", "1")
    assert r.returncode == 0 and steps(r) == ["2", "4"], r.stdout + r.stderr
    r = run("train", "--out", out, "--resume", "--steps", "8")
    assert r.returncode == 0 and steps(r) == ["6", "8"], r.stdout + r.stderr
    r = run("train", "--out", out, "--resume", "--steps", "11", "--log-every", "3")  # or as said now
    assert r.returncode == 0 and steps(r) == ["9", "11"], r.stdout + r.stderr


def test_learning_rate_surprises_are_said_or_refused(tmp_path):
    # --lr 0 trains nothing: refused; a warmup longer than the run never reaches --lr: a warning with the
    # peak; a longer resume re-plans the decay, so the lr rises again: said with both values.
    r = run("train", "--out", str(tmp_path / "zero"), "--steps", "2", "--lr", "0")
    assert r.returncode != 0 and "Expected lr > 0" in r.stderr, r.stdout + r.stderr
    out = str(tmp_path / "ck")
    r = run("train", "--out", out, "--steps", "4", "--warmup", "10", "--eval-every", "0", "--eval-iters", "1")
    assert r.returncode == 0 and "warning: --warmup 10 outlasts the run's 4 steps" in r.stdout, r.stdout + r.stderr
    r = run("train", "--out", out, "--resume", "--steps", "20")
    m = re.search(r"resume: the cosine decay now ends at step 20 \(it ended at 4\): the learning rate goes from "
                  r"(\S+) at step 4 to (\S+) at step 5", r.stdout)
    assert r.returncode == 0 and m, r.stdout + r.stderr
    assert "--lr-decay-steps 4 keeps the old one" in r.stdout
    r = run("train", "--out", out, "--resume", "--steps", "22", "--lr-decay-steps", "20")
    assert r.returncode == 0 and "resume:" not in r.stdout, r.stdout  # the same schedule: nothing to say

def test_train_prints_its_memory_and_refuses_a_run_larger_than_memory(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("abcdefgh ijklmnop\n" * 500)
    r = run("train", "--data", str(text), "--out", str(tmp_path / "ck"), "--batch", "100000000")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Expected training batch 100000000 x 64 tokens of a model of block_size 64" in r.stderr, r.stderr
    assert "to fit in the machine's" in r.stderr
    assert not (tmp_path / "ck").exists()
    r = run("train", "--out", str(tmp_path / "ok"), "--steps", "1", "--eval-iters", "1")
    assert r.returncode == 0 and re.search(r"memory: about [0-9.]+ [KM]B \(parameters", r.stdout), r.stdout


def test_bench_states_both_ceilings_and_backward_rows():
    # The table's rates against the same-run sgemm and the measured FMA peak, and with --backward a
    # flash-bwd row after each flash row with its scratch (extra MB) beside it.
    r = run("bench", "--lengths", "128", "--repeats", "1", "--reference-max", "0", "--threads", "1", "--backward")
    assert r.returncode == 0, r.stderr
    ceilings = re.search(r"attn gemm 2048\^3: ([\d.]+) GFLOP/s .*FMA peak, measured: ([\d.]+) GFLOP/s", r.stdout)
    assert ceilings and float(ceilings[1]) > 0 and float(ceilings[2]) > 0, r.stdout
    assert re.search(r"%sgemm\s+%fma\s+extra MB\s+skipped", r.stdout), r.stdout
    rows = re.findall(r"^(mha|causal)\s+128\s+128\s+8/8\s+64\s+(flash|flash-bwd)\s+([\d.]+)\s+([\d.]+)\s+(\d+)%\s+"
                      r"(\d+)%\s+([\d.]+)\s+\d+%$",
                      r.stdout, re.M)
    assert [(c, b) for c, b, *_ in rows] == [("mha", "flash"), ("mha", "flash-bwd"), ("causal", "flash"),
                                             ("causal", "flash-bwd")], r.stdout
    for _, _, ms, gf, _, fma, _ in rows:  # %fma is GFLOP/s over the printed peak
        assert float(ms) > 0 and abs(int(fma) - 100 * float(gf) / float(ceilings[2])) <= 1, (gf, fma, r.stdout)
    # the GQA and decode rows at the given lengths, not at 4096 and 16384; the decode floor at a bandwidth
    assert re.search(r"^gqa\s+128\s+128\s+32/8\s", r.stdout, re.M) and re.search(r"^decode\s+1\s+128\s", r.stdout, re.M)
    assert not re.search(r"\b(4096|16384)\b", r.stdout.split("%sgemm")[-1]), r.stdout
    assert re.search(r"^decode floor: reading K and V once \(\d+ MB\) takes [\d.]+ ms \([\d.]+ GB/s on 1 threads\)$",
                     r.stdout, re.M), r.stdout


def test_bench_variants_rows_say_what_was_never_computed():
    # Issue 37: window, ALiBi, softcap and packed-document rows beside full causal, forward and backward, each
    # with the share of (query, key) tiles the kernel skips: a window of 64 in 2048 keys skips most of them.
    r = run("bench", "--variants", "--window", "64", "--lengths", "2048", "--repeats", "1", "--threads", "1",
            "--backward")
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^(causal|window|alibi|softcap|docs x8)\s+2048\s+2048\s+8/8\s+64\s+(flash|flash-bwd)\s+"
                      r"([\d.]+)\s+([\d.]+)\s+\d+%\s+\d+%\s+[\d.]+\s+(\S+)$", r.stdout, re.M)
    assert [(c, b) for c, b, *_ in rows] == [(c, b) for c in ("causal", "window", "alibi", "softcap", "docs x8")
                                             for b in ("flash", "flash-bwd")], r.stdout
    skipped = {c: int(s.rstrip("%")) for c, b, _, _, s in rows if b == "flash"}
    assert skipped["alibi"] == skipped["softcap"] == skipped["causal"] < 60, r.stdout  # the causal triangle's
    # ~256-row tiles x 256 keys: 2 of 8 per row tile
    assert skipped["window"] >= 70 and skipped["docs x8"] >= 80, r.stdout


def test_bench_backward_default_is_said_as_it_is():
    assert "--backward BOOLEAN=off; on with --ring" in run("bench", "--help").stdout
