"""Data-parallel training against threads on one machine, through the CLI as a user runs it:

    .venv/bin/python bench/train_dp.py [--data ../shared/data/tinyshakespeare.txt] [--rounds 5] [--steps 120]

`scripts/mpirun-local -np 2 build/attn train --config nanogpt-cpu --threads 1` (two processes of one
thread, gradients summed over MPI) against `build/attn train --config nanogpt-cpu --threads 2` (one
process of two threads) and `--threads 1` (the base), interleaved round by round, medians of the training
tokens/s (the `done:` line: evaluation and checkpoints excluded) and of the all-reduce's own times (the
`all-reduce:` line). The machine's load average is printed with every run: on a shared machine the
numbers move with the neighbours. The issue's target: -np 2 x 1 thread within 10% of 1 x 2 threads.

    .venv/bin/python bench/train_dp.py --paper [--gpt2-tokens-per-s R]

prints, without running anything, the communication per step of `gpt2-small` and what it costs on a
10 Gb/s and a 100 Gb/s network for N processes; with R (one process's measured training tokens/s of
gpt2-small), the expected scaling too. A benchmark, not a test: record the command and the numbers in
BENCHMARKS.md.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import _attn
import attn

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(_attn.__file__).resolve().parent.parent / "attn"
MPIRUN = ROOT / "scripts" / "mpirun-local"


def load():
    return os.getloadavg()[0]


def train(data, out, np_, threads, steps):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(BIN), "train", "--data", data, "--out", out, "--config", "nanogpt-cpu", "--steps", str(steps),
           "--eval-every", "0", "--eval-iters", "1", "--log-every", str(steps), "--threads", str(threads)]
    if np_ > 1:
        cmd = [str(MPIRUN), "-np", str(np_)] + cmd
    before = load()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    m = re.search(r"s training, ([\d.]+)(k?) tok/s", r.stdout)
    row = {"tok_s": float(m[1]) * (1e3 if m[2] else 1), "load": (before + load()) / 2}
    a = re.search(r"([\d.]+) ms per step after the backward, ([\d.]+) ms in all .*; ([\d.]+) ms per step waiting",
                  r.stdout)
    if a:
        row.update(after=float(a[1]), all=float(a[2]), lag=float(a[3]))
    m = re.search(r"all-reduce: (.*?) of gradients per step in (\d+) bucket", r.stdout)
    if m:
        row.update(bytes=m[1], buckets=int(m[2]))
    return row


def measure(a):
    print(attn.info()["text"], end="")
    print(subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()[0])
    settings = [("-np 2 x --threads 1", 2, 1), ("-np 1 x --threads 2", 1, 2), ("-np 1 x --threads 1", 1, 1)]
    rows = {name: [] for name, _, _ in settings}
    with tempfile.TemporaryDirectory() as tmp:
        train(a.data, str(Path(tmp) / "warm"), 2, 1, 5)  # page cache, MPI's first start
        for r in range(a.rounds):
            for name, np_, threads in (settings if r % 2 == 0 else settings[::-1]):
                row = train(a.data, str(Path(tmp) / "ck"), np_, threads, a.steps)
                rows[name].append(row)
                extra = f", all-reduce {row['after']:.2f} ms after the backward, {row['all']:.2f} ms in all, " \
                        f"lag {row['lag']:.2f} ms" if "after" in row else ""
                print(f"round {r}: {name}: {row['tok_s']:,.0f} tok/s (load {row['load']:.2f}){extra}", flush=True)
    med = {name: statistics.median(x["tok_s"] for x in v) for name, v in rows.items()}
    dp = rows[settings[0][0]]
    print(f"\n{a.steps} steps of nanogpt-cpu (batch 12 x 64), medians of {a.rounds} interleaved rounds; "
          f"load average {statistics.median(x['load'] for v in rows.values() for x in v):.2f} (median)\n")
    print("| setting | train tok/s | vs 1 x 2 threads | vs 1 x 1 thread |")
    print("|---|---:|---:|---:|")
    for name in med:
        print(f"| `{name}` | {med[name]:,.0f} | {med[name] / med[settings[1][0]]:.2f}x | "
              f"{med[name] / med[settings[2][0]]:.2f}x |")
    print(f"\nall-reduce of -np 2 ({dp[0].get('bytes')} per step, {dp[0].get('buckets')} buckets), medians per step: "
          f"{statistics.median(x['after'] for x in dp):.2f} ms after the backward, "
          f"{statistics.median(x['all'] for x in dp):.2f} ms in all, "
          f"{statistics.median(x['lag'] for x in dp):.2f} ms waiting for the slower process")


def paper(a):
    """gpt2-small's gradient traffic per step, its time on 10 and 100 Gb/s links, and (given one process's
    measured tokens/s with the character vocabulary) the expected scaling."""
    c = attn.gpt_config("gpt2-small")
    E, L, T = c["n_embd"], c["n_layer"], c["block_size"]
    per_layer = 12 * E * E + 13 * E  # attention (4 E^2 + 4 E), MLP (8 E^2 + 5 E), 2 LayerNorms (4 E)
    attention_flops = 6 * L * T * E  # per token, forward + backward, causal: QK^T and PV
    params = lambda vocab: vocab * E + T * E + L * per_layer + 2 * E
    print(f"gpt2-small: {L} layers, E {E}, block {T}, tied head, biases; nanoGPT's global batch 12 x {T} tokens")
    if a.gpt2_tokens_per_s:
        print(f"compute: {a.gpt2_tokens_per_s:g} training tokens/s for one process with the character vocabulary "
              f"(measured), scaled by FLOPs per token (6 P + attention) for GPT-2's vocabulary")
    for vocab, what in ((50257, "GPT-2's BPE vocabulary"), (65, "a character vocabulary (tinyshakespeare)")):
        P = params(vocab)
        emb = vocab * E + T * E
        print(f"\nvocab {vocab} ({what}): {P / 1e6:.1f}M parameters, {4 * P / 1e6:.0f} MB of float32 gradients; "
              f"the last bucket (wte + wpe, final only after the embedding's backward) {100 * emb / P:.0f}% of them")
        R = a.gpt2_tokens_per_s * (6 * params(65) + attention_flops) / (6 * P + attention_flops)
        head = "| N | sent (= received) per process per step | 10 Gb/s | 100 Gb/s |"
        if R:
            head += " compute per step | efficiency at 10 Gb/s: no overlap / best overlap | at 100 Gb/s |"
        print(head)
        print("|" + "---:|" * (head.count("|") - 1))
        for N in (2, 4, 8, 16, 64):
            sent = 2 * (N - 1) / N * 4 * P  # reduce-scatter + all-gather, each (N-1)/N of the gradient
            t10, t100 = sent / (10e9 / 8), sent / (100e9 / 8)  # full duplex: sends and receives at once
            row = f"| {N} | {sent / 1e6:,.0f} MB | {t10 * 1e3:,.0f} ms | {t100 * 1e3:,.0f} ms |"
            if R:
                comp = 12 * T / R / N  # each of N processes computes 1/N of the global batch
                back = comp * 2 / 3  # the backward, ~2/3 of a step's FLOPs, is what the sums can hide under
                def eff(t):
                    hidden = min(t * (1 - emb / P), back)  # all but the last bucket, at best
                    return comp / (comp + t), comp / (comp + t - hidden)
                e10, e100 = eff(t10), eff(t100)
                row += f" {comp:,.2f} s | {e10[0]:.0%} / {e10[1]:.0%} | {e100[0]:.0%} / {e100[1]:.0%} |"
            print(row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--paper", action="store_true", help="gpt2-small's communication on paper; runs nothing")
    ap.add_argument("--gpt2-tokens-per-s", type=float, default=0.0,
                    help="with --paper: one process's measured gpt2-small training tokens/s (character vocabulary, "
                         "e.g. from `attn train --config gpt2-small --batch 1`), for the scaling estimate")
    a = ap.parse_args()
    paper(a) if a.paper else measure(a)


if __name__ == "__main__":
    main()
