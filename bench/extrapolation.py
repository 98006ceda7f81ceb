"""ALiBi's headline result at small scale (Press et al. 2022, "Train Short, Test Long"): the character GPT
trained at block 128 with learned, rotary (RoPE) or ALiBi positions, then its validation loss at contexts of
128, 256, 512 and 1024 (`attn train --position P --eval-lengths ...`). Learned positions have no rows past
the block; RoPE meets angles it never saw; ALiBi's linear bias only grows. One table, the commands beside it.

    .venv/bin/python bench/extrapolation.py --data ../shared/data/tinyshakespeare.txt [--steps 1500] [--threads 2]

A benchmark of the model, not of speed: record the command and the table in BENCHMARKS.md.
"""
import argparse
import os
import re
import subprocess
import tempfile

LENGTHS = (128, 256, 512, 1024)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window", type=int, default=0, help="also a sliding window of W keys (0: none)")
    ap.add_argument("--attn", default=os.path.join(os.path.dirname(__file__), "..", "build", "attn"))
    a = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pos in ("learned", "rope", "alibi"):
            cmd = [a.attn, "train", "--data", a.data, "--out", os.path.join(tmp, pos), "--block", "128",
                   "--batch", "16", "--steps", str(a.steps), "--warmup", "100", "--eval-every", "0",
                   "--eval-iters", "20", "--position", pos, "--window", str(a.window), "--threads", str(a.threads),
                   "--eval-lengths", ",".join(map(str, LENGTHS))]
            print("$", " ".join(cmd[:1] + ["train"] + cmd[2:4] + ["--out", pos] + cmd[6:]), flush=True)
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows[pos] = {int(m[1]): m[2] for m in re.finditer(r"^val loss at context (\d+): (\S+)", out, re.M)}
    print(f"\nval loss (nats/char) by context length; trained at 128, {a.steps} steps"
          + (f", window {a.window}" if a.window else ""))
    print(f"{'positions':<10}" + "".join(f"{n:>9}" for n in LENGTHS))
    for pos, r in rows.items():
        print(f"{pos:<10}" + "".join(f"{(r.get(n) if r.get(n) != 'none' else '-'):>9}" for n in LENGTHS))


if __name__ == "__main__":
    main()
