"""Training side by side with PyTorch 2.13 eager: the same character-level GPT (nanoGPT's shape, pre-norm,
tied head, its F.scaled_dot_product_attention), the same AdamW, the same thread count.

    # tokens/s of forward + backward + AdamW (d=128, 4 layers, 4 heads, ff 512, block 128, batch 32),
    # interleaved medians, and model FLOPs utilisation against this run's sgemm rate
    .venv/bin/python bench/train_torch.py throughput --threads 2

    # nanoGPT's shakespeare_char CPU run (4 layers, 4 heads, E 128, block 64, batch 12, 2000 iterations,
    # lr 1e-3 -> 1e-4 over 2000, warmup 100, beta2 0.99, weight decay 0.1, dropout 0, eval every 250 on
    # 20 batches): `attn train` (the CLI) and PyTorch, val loss and wall time
    .venv/bin/python bench/train_torch.py quality --threads 2 [--steps 2000]

A benchmark, not a test: record the command and the numbers in BENCHMARKS.md. Our side of the throughput
run is the Python binding (attn.Trainer, whose step is all C++); of the quality run, the attn CLI binary.
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import attn
from _common import set_threads

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


# ---- The PyTorch model: nanoGPT's GPT, trimmed to what the comparison uses ----

class Block(nn.Module):
    def __init__(self, E, H, bias):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(E, bias=bias)
        self.c_attn = nn.Linear(E, 3 * E, bias=bias)
        self.c_proj = nn.Linear(E, E, bias=bias)
        self.ln_2 = nn.LayerNorm(E, bias=bias)
        self.c_fc = nn.Linear(E, 4 * E, bias=bias)
        self.mlp_proj = nn.Linear(4 * E, E, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class TorchGPT(nn.Module):
    def __init__(self, V, block, L, H, E, bias):
        super().__init__()
        self.wte = nn.Embedding(V, E)
        self.wpe = nn.Embedding(block, E)
        self.h = nn.ModuleList(Block(E, H, bias) for _ in range(L))
        self.ln_f = nn.LayerNorm(E, bias=bias)
        self.lm_head = nn.Linear(E, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT
        for name, p in self.named_parameters():  # nanoGPT's init
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def optimizer(self, lr, betas, weight_decay):  # nanoGPT's groups: dim >= 2 decays
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)


def nanogpt_lr(it, lr, min_lr, warmup, decay):
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay - warmup))) * (lr - min_lr)


def sgemm_gflops(reps=5):
    """2048³ sgemm rates in this run: MKL (torch.mm, torch's) and OpenBLAS (attn.Linear without bias, ours)."""
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    lin = attn.Linear(n, n, bias=False, seed=0)
    lin.eval()
    x = a.numpy()
    rates = {}
    for name, fn in (("mkl", lambda: torch.mm(a, b)), ("openblas", lambda: lin(x))):
        fn()
        t = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        rates[name] = 2 * n ** 3 / statistics.median(t) * 1e-9
    return rates


def flops_per_token(n_params_no_wpe, L, H, E, T):
    """nanoGPT's estimate_mfu: 6N + 12·L·H·Q·T per token for forward + backward."""
    return 6 * n_params_no_wpe + 12 * L * H * (E // H) * T


def text_tokens():
    text = DATA.read_text(encoding="utf-8") if DATA.exists() else "".join(
        chr(97 + i % 26) for i in np.random.default_rng(0).integers(0, 26, 200_000))
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    return text, np.array([stoi[c] for c in text], dtype=np.int64), len(vocab)


# ---- throughput ----

def throughput(args):
    set_threads(args.threads)
    L, H, E, T, B = 4, 4, 128, 128, 32
    text, ids, V = text_tokens()
    ours = attn.Trainer(text=text, config="nanogpt-cpu", block_size=T, batch=B, steps=10 ** 6, warmup=100,
                        lr=1e-3, min_lr=1e-4, beta2=0.99, weight_decay=0.1, grad_clip=1.0, threads=args.threads)
    torch.manual_seed(0)
    model = TorchGPT(V, T, L, H, E, bias=False)
    opt = model.optimizer(1e-3, (0.9, 0.99), 0.1)
    rng = np.random.default_rng(0)
    it = [0]

    def torch_step():
        ix = rng.integers(0, len(ids) - T - 1, B)
        x = torch.from_numpy(np.stack([ids[i:i + T] for i in ix]))
        y = torch.from_numpy(np.stack([ids[i + 1:i + 1 + T] for i in ix]))
        for g in opt.param_groups:
            g["lr"] = nanogpt_lr(it[0], 1e-3, 1e-4, 100, 10 ** 6)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        it[0] += 1

    steps = {"attn (C++ via Python)": ours.step, "torch eager": torch_step}
    for fn in steps.values():  # warm-up
        for _ in range(3):
            fn()
    times = {k: [] for k in steps}
    for _ in range(args.reps):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            times[name].append((time.perf_counter() - t0) / args.steps)
    gf = sgemm_gflops()
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    fpt = flops_per_token(n_params, L, H, E, T)
    print(f"throughput: {L} layers, {H} heads, E {E}, ff {4 * E}, block {T}, batch {B}, vocab {V}, "
          f"{n_params} parameters (without wpe), {args.threads} threads")
    print(f"  sgemm 2048^3 this run: OpenBLAS {gf['openblas']:.1f} GFLOP/s (ours), MKL {gf['mkl']:.1f} GFLOP/s "
          f"(torch's); model FLOPs/token {fpt / 1e6:.2f} M (nanoGPT's 6N + 12·L·H·Q·T)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, s in med.items():
        tok_s = B * T / s
        blas = "openblas" if name.startswith("attn") else "mkl"
        mfu = tok_s * fpt * 1e-9 / gf[blas]
        vs = "" if name.startswith("attn") else f"  attn is {s / med['attn (C++ via Python)']:.2f}x faster"
        print(f"  {name:<24} {s * 1e3:8.1f} ms/step  {tok_s:9.0f} tok/s  MFU {100 * mfu:5.1f}% of its sgemm{vs}")


# ---- quality ----

def full_val_loss(logits_fn, val, T):
    """Mean cross-entropy over the whole val split in non-overlapping T-token windows."""
    n = (len(val) - 1) // T
    x = val[:n * T].reshape(n, T)
    y = val[1:n * T + 1].reshape(n, T)
    total = 0.0
    for i in range(0, n, 64):
        total += logits_fn(x[i:i + 64], y[i:i + 64]) * len(x[i:i + 64])
    return total / n


def quality(args):
    set_threads(args.threads)
    text, ids, V = text_tokens()
    n = int(len(ids) * 0.9)
    train, val = ids[:n], ids[n:]
    L, H, E, T, B = 4, 4, 128, 64, 12
    S, lr, min_lr, warmup, wd, beta2 = args.steps, 1e-3, 1e-4, 100, 0.1, 0.99
    every, iters = 250, 20
    binary = args.attn_bin or next((str(p) for p in sorted(ROOT.glob("build*/attn")) if p.is_file()), None)
    assert binary, "no attn binary: build one (make build) or pass --attn-bin"

    # Ours: the CLI, as a user runs it.
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ckpt")
        cmd = [binary, "train", "--data", str(DATA), "--out", out, "--config", "nanogpt-cpu", "--steps", str(S),
               "--batch", str(B), "--lr", str(lr), "--min-lr", str(min_lr), "--warmup", str(warmup),
               "--lr-decay-steps", str(S), "--beta2", str(beta2), "--weight-decay", str(wd), "--dropout", "0",
               "--grad-clip", "1", "--eval-every", str(every), "--eval-iters", str(iters),
               "--threads", str(args.threads), "--log-every", "100", "--seed", str(args.seed)]
        print("ours:", " ".join(cmd))
        env = dict(os.environ)
        if args.passive_attn:
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        ours_wall = time.perf_counter() - t0
        assert res.returncode == 0, res.stdout + res.stderr
        ours_val = float(re.findall(r"val loss ([0-9.]+)", res.stdout)[-1])
        model, _ = attn.GPT.load(out)
        model.eval()
        ours_full = full_val_loss(lambda x, y: model.evaluate(x, y), val, T)

    # PyTorch: nanoGPT's loop (get_batch, estimate_loss, get_lr, clip 1.0, AdamW).
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    m = TorchGPT(V, T, L, H, E, bias=False)
    opt = m.optimizer(lr, (0.9, beta2), wd)

    def batch(split):
        data = train if split == 0 else val
        ix = rng.integers(0, len(data) - T, B)
        return (torch.from_numpy(np.stack([data[i:i + T] for i in ix])),
                torch.from_numpy(np.stack([data[i + 1:i + 1 + T] for i in ix])))

    @torch.no_grad()
    def estimate():
        m.eval()
        out = [float(np.mean([m(*batch(s))[1].item() for _ in range(iters)])) for s in (0, 1)]
        m.train()
        return out

    t0 = time.perf_counter()
    for it in range(S):
        for g in opt.param_groups:
            g["lr"] = nanogpt_lr(it, lr, min_lr, warmup, S)
        x, y = batch(0)
        _, loss = m(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if (it + 1) % every == 0 and it + 1 < S:
            estimate()
    torch_val = estimate()[1]
    torch_wall = time.perf_counter() - t0
    with torch.no_grad():
        m.eval()
        torch_full = full_val_loss(lambda x, y: m(torch.from_numpy(x), torch.from_numpy(y))[1].item(), val, T)

    print(f"quality: nanoGPT shakespeare_char CPU config, {S} steps, {args.threads} threads, seed {args.seed}"
          f"{', attn with OMP_WAIT_POLICY=PASSIVE' if args.passive_attn else ''}")
    print(f"  attn  (CLI)    val loss {ours_val:.4f} (20 batches), {ours_full:.4f} (full val split)  "
          f"wall {ours_wall:7.1f} s")
    print(f"  torch (eager)  val loss {torch_val:.4f} (20 batches), {torch_full:.4f} (full val split)  "
          f"wall {torch_wall:7.1f} s")
    print(f"  attn wall time = {ours_wall / torch_wall:.2f} x torch's (target <= 0.5); "
          f"val loss target <= 1.90")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["throughput", "quality"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="throughput: steps per timed round (5); quality: 2000")
    ap.add_argument("--reps", type=int, default=5, help="throughput: timed rounds (median)")
    ap.add_argument("--attn-bin", default=None, help="the attn CLI (default: build*/attn)")
    ap.add_argument("--seed", type=int, default=1337, help="quality: initialisation and batches, both sides")
    ap.add_argument("--passive-attn", action="store_true",
                    help="quality: run the attn CLI with OMP_WAIT_POLICY=PASSIVE (libgomp's spinning threads and "
                         "OpenBLAS's pthreads fight over 2 cores otherwise); torch keeps its default")
    args = ap.parse_args()
    if args.what == "throughput":
        args.steps = args.steps or 5
        throughput(args)
    else:
        args.steps = args.steps or 2000
        quality(args)


if __name__ == "__main__":
    sys.exit(main())
