"""attn's speed with and without a busy neighbour (`yes > /dev/null`, pinned nowhere), at the default
thread count (the CPUs this process may use) and at --threads 1, through the CLI as a user runs it:

    .venv/bin/python bench/busy_neighbour.py [--data ../shared/data/tinyshakespeare.txt] [--reps 3]

`attn train --config nanogpt-cpu` (tokens/s of the last progress line) and `attn generate` on a
nanogpt-cpu checkpoint (characters/s), each run interleaved across the four settings, medians.
The issue's targets: under load, default >= --threads 1; quiet, default >= 1.6x --threads 1 (training).
A benchmark, not a test: record the command and the numbers in BENCHMARKS.md.
"""
import argparse
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


def run(cmd):
    r = subprocess.run([str(BIN)] + cmd, capture_output=True, text=True, check=True)
    return r.stdout + r.stderr  # generate prints its statistics on stderr


def train_rate(data, out, threads):
    shutil.rmtree(out, ignore_errors=True)
    text = run(["train", "--data", data, "--out", out, "--config", "nanogpt-cpu", "--steps", "120",
                "--eval-every", "0", "--log-every", "20", "--threads", str(threads)])
    return float(re.findall(r"([\d.]+)k tok/s", text)[-1]) * 1e3


def generate_rate(ckpt, threads):
    text = run(["generate", "--ckpt", ckpt, "-n", "400", "--prompt", "ROMEO:", "--threads", str(threads)])
    return float(re.search(r"characters in [\d.]+ s, (\d+) per second", text).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print(attn.info()["text"], end="")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(Path(tmp) / "ck")
        run(["train", "--data", a.data, "--out", ckpt, "--config", "nanogpt-cpu", "--steps", "1", "--eval-every", "0"])
        results = {}
        for busy in (False, True):
            neighbour = subprocess.Popen("exec yes > /dev/null", shell=True) if busy else None
            try:
                for _ in range(a.reps):
                    for threads in (0, 1):
                        key = (busy, threads)
                        results.setdefault(key + ("train",), []).append(
                            train_rate(a.data, str(Path(tmp) / "t"), threads))
                        results.setdefault(key + ("generate",), []).append(generate_rate(ckpt, threads))
            finally:
                if neighbour:
                    neighbour.kill()
                    neighbour.wait()
        print(f"{'':18} {'train tok/s':>24} {'generate chars/s':>24}")
        print(f"{'':18} {'default':>11} {'--threads 1':>12} {'default':>11} {'--threads 1':>12}")
        for busy in (False, True):
            row = [statistics.median(results[(busy, t, w)]) for w in ("train", "generate") for t in (0, 1)]
            print(f"{'busy neighbour' if busy else 'quiet':18} {row[0]:11.0f} {row[1]:12.0f} {row[2]:11.0f} "
                  f"{row[3]:12.0f}"
                  f"   default/1: train {row[0] / row[1]:.2f}x, generate {row[2] / row[3]:.2f}x")


if __name__ == "__main__":
    main()
