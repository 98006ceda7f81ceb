"""Training side by side with PyTorch 2.13 eager: the same character-level GPT (nanoGPT's shape, pre-norm,
tied head, its F.scaled_dot_product_attention), the same AdamW, the same thread count.

    # tokens/s of forward + backward + AdamW (d=128, 4 layers, 4 heads, ff 512, block 128, batch 32),
    # interleaved medians, and model FLOPs utilisation against this run's sgemm rate
    .venv/bin/python bench/train_torch.py throughput --threads 2 [--bf16]

    # nanoGPT's shakespeare_char CPU run (4 layers, 4 heads, E 128, block 64, batch 12, 2000 iterations,
    # lr 1e-3 -> 1e-4 over 2000, warmup 100, beta2 0.99, weight decay 0.1, dropout 0, eval every 250 on
    # 20 batches): `attn train` (the CLI) and PyTorch, val loss and wall time
    .venv/bin/python bench/train_torch.py quality --threads 2 [--steps 2000] [--seeds 1337,1,2] [--compile]

    # peak memory of training, each side in a fresh process: VmHWM over 3 steps less VmRSS before the
    # model was built; nanoGPT's CPU shape and gpt2-small (block 256, batch 4, dropout 0)
    .venv/bin/python bench/train_torch.py memory --threads 2

--bf16 (throughput) adds attn with dtype="bf16" (bf16 matmuls, fp32 master weights and AdamW) and PyTorch
eager under torch.autocast("cpu", dtype=torch.bfloat16), in the same interleaved rounds.
--compile adds PyTorch with torch.compile (inductor, CPU) beside eager; its compile time (the first
forward + backward, and the first evaluation, before the timed loop) is reported apart from its steps.

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
from _common import set_threads, settle

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"  # --data overrides


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


def get_batch(data, T, B, rng):
    """nanoGPT's get_batch: B random windows of T tokens and their next tokens."""
    ix = rng.integers(0, len(data) - T, B)
    return (torch.from_numpy(np.stack([data[i:i + T] for i in ix])),
            torch.from_numpy(np.stack([data[i + 1:i + 1 + T] for i in ix])))


def torch_step(fwd, model, opt, x, y, bf16=False):
    """nanoGPT's training step: forward (fwd: the model or its torch.compile), backward, clip 1.0, AdamW;
    bf16: the forward under torch.autocast (bfloat16 matmuls), as PyTorch's mixed precision is run."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        _, loss = fwd(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def sgemm_gflops(reps=5):
    """2048³ sgemm rates in this run: MKL (torch.mm, torch's) and attn's GEMM (attn.Linear without bias, ours;
    no OpenBLAS since issue 8)."""
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    lin = attn.Linear(n, n, bias=False, seed=0)
    lin.eval()
    x = a.numpy()
    rates = {}
    for name, fn in (("mkl", lambda: torch.mm(a, b)), ("attn", lambda: lin(x))):
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

def throughput_steps(threads, bf16=False, compiled=False, T=128, B=32):
    """nanoGPT's shape (4 layers, 4 heads, E 128) at block T, batch B: the PyTorch model and {name: one training
    step} of attn (attn.Trainer) and PyTorch eager, with compiled torch.compile, with bf16 attn bf16 and torch
    eager bf16; and the vocabulary size. bench/run.py uses it too."""
    L, H, E = 4, 4, 128
    text, ids, V = text_tokens()
    ours = attn.Trainer(text=text, config="nanogpt-cpu", block_size=T, batch=B, steps=10 ** 6, warmup=100,
                        lr=1e-3, min_lr=1e-4, beta2=0.99, weight_decay=0.1, grad_clip=1.0, threads=threads)
    rng = np.random.default_rng(0)

    def torch_step_fn(compiled, bf16=False):
        torch.manual_seed(0)
        model = TorchGPT(V, T, L, H, E, bias=False)
        opt = model.optimizer(1e-3, (0.9, 0.99), 0.1)
        fwd = torch.compile(model) if compiled else model
        it = [0]

        def step():
            for g in opt.param_groups:
                g["lr"] = nanogpt_lr(it[0], 1e-3, 1e-4, 100, 10 ** 6)
            torch_step(fwd, model, opt, *get_batch(ids, T, B, rng), bf16=bf16)
            it[0] += 1
        return model, step

    model, eager_step = torch_step_fn(False)
    steps = {"attn (C++ via Python)": ours.step, "torch eager": eager_step}
    if compiled:
        steps["torch compile"] = torch_step_fn(True)[1]
    if bf16:
        ours16 = attn.Trainer(text=text, config="nanogpt-cpu", block_size=T, batch=B, steps=10 ** 6, warmup=100,
                              lr=1e-3, min_lr=1e-4, beta2=0.99, weight_decay=0.1, grad_clip=1.0,
                              threads=threads, dtype="bf16")
        steps["attn bf16"] = ours16.step
        steps["torch eager bf16"] = torch_step_fn(False, bf16=True)[1]
    return model, steps, V


def time_steps(steps, reps, n):
    """3 warm-up steps of each (for torch.compile, its compile time), then reps interleaved rounds of n steps of
    each: {name: warm-up seconds}, {name: [seconds per step of each round]}."""
    warm = {}
    for name, fn in steps.items():  # warm-up; for torch.compile, its compile time
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        warm[name] = time.perf_counter() - t0
    times = {k: [] for k in steps}
    for _ in range(reps):
        for name, fn in steps.items():
            settle()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n)
    return warm, times


def throughput(args):
    set_threads(args.threads)
    L, H, E, T, B = 4, 4, 128, 128, 32
    model, steps, V = throughput_steps(args.threads, args.bf16, args.compile, T, B)
    warm, times = time_steps(steps, args.reps, args.steps)
    gf = sgemm_gflops()
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    fpt = flops_per_token(n_params, L, H, E, T)
    print(f"throughput: {L} layers, {H} heads, E {E}, ff {4 * E}, block {T}, batch {B}, vocab {V}, "
          f"{n_params} parameters (without wpe), {args.threads} threads")
    print(f"  sgemm 2048^3 this run: attn {gf['attn']:.1f} GFLOP/s (ours), MKL {gf['mkl']:.1f} GFLOP/s "
          f"(torch's); model FLOPs/token {fpt / 1e6:.2f} M (nanoGPT's 6N + 12·L·H·Q·T)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, s in med.items():
        tok_s = B * T / s
        blas = "attn" if name.startswith("attn") else "mkl"
        mfu = tok_s * fpt * 1e-9 / gf[blas]
        vs = "" if name.startswith("attn") else f"  attn is {s / med['attn (C++ via Python)']:.2f}x faster"
        if name == "attn bf16":
            vs = f"  {med['attn (C++ via Python)'] / s:.2f}x attn fp32"
        if name == "torch eager bf16":
            vs = f"  attn bf16 is {s / med['attn bf16']:.2f}x faster"
        if name == "torch compile":
            vs += f"; compile {warm[name] - 3 * s:.1f} s (3 warm-up steps less 3 steady ones)"
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


def run_attn(args, seed, S, binary, val, T):
    """Ours: the CLI, as a user runs it. Val loss on 20 batches and on the full split, wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ckpt")
        cmd = [binary, "train", "--data", str(DATA), "--out", out, "--config", "nanogpt-cpu", "--steps", str(S),
               "--batch", "12", "--lr", "1e-3", "--min-lr", "1e-4", "--warmup", "100", "--lr-decay-steps", str(S),
               "--beta2", "0.99", "--weight-decay", "0.1", "--dropout", "0", "--grad-clip", "1",
               "--eval-every", "250", "--eval-iters", "20", "--threads", str(args.threads), "--log-every", "100",
               "--seed", str(seed)]
        print("ours:", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        assert res.returncode == 0, res.stdout + res.stderr
        loss = float(re.findall(r"val loss ([0-9.]+)", res.stdout)[-1])
        model, _ = attn.GPT.load(out)
        model.eval()
        return loss, full_val_loss(lambda x, y: model.evaluate(x, y), val, T), wall, 0.0


def run_torch(args, seed, S, train, val, V, T, compiled):
    """PyTorch: nanoGPT's loop (get_batch, estimate_loss, get_lr, clip 1.0, AdamW), eager or torch.compile'd.
    Compiling happens before the clock's loop, on a batch of its own and without an optimizer step (dropout
    is 0, so nothing of the run changes): its time is returned apart and counted in the wall time."""
    L, H, E, B, lr, min_lr, warmup, wd, beta2, every, iters = 4, 4, 128, 12, 1e-3, 1e-4, 100, 0.1, 0.99, 250, 20
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    m = TorchGPT(V, T, L, H, E, bias=False)
    opt = m.optimizer(lr, (0.9, beta2), wd)
    fwd = torch.compile(m) if compiled else m

    def batch(split, r=rng):
        return get_batch(train if split == 0 else val, T, B, r)

    @torch.no_grad()
    def estimate(n=iters):
        m.eval()
        out = [float(np.mean([fwd(*batch(s))[1].item() for _ in range(n)])) for s in (0, 1)]
        m.train()
        return out

    compile_s = 0.0
    if compiled:
        t0 = time.perf_counter()
        fwd(*batch(0, np.random.default_rng(0)))[1].backward()
        m.zero_grad(set_to_none=True)
        with torch.no_grad():
            m.eval()
            fwd(*batch(1, np.random.default_rng(0)))
            m.train()
        compile_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    for it in range(S):
        for g in opt.param_groups:
            g["lr"] = nanogpt_lr(it, lr, min_lr, warmup, S)
        torch_step(fwd, m, opt, *batch(0))
        if (it + 1) % every == 0 and it + 1 < S:
            estimate()
    loss = estimate()[1]
    wall = time.perf_counter() - t0 + compile_s
    with torch.no_grad():
        m.eval()  # the uncompiled module: the last window batch has another shape
        full = full_val_loss(lambda x, y: m(torch.from_numpy(x), torch.from_numpy(y))[1].item(), val, T)
    return loss, full, wall, compile_s


def quality(args):
    set_threads(args.threads)
    text, ids, V = text_tokens()
    n = int(len(ids) * 0.9)
    train, val = ids[:n], ids[n:]
    T, S = 64, args.steps
    binary = args.attn_bin or next((str(p) for p in sorted(ROOT.glob("build*/attn")) if p.is_file()), None)
    assert binary, "no attn binary: build one (make build) or pass --attn-bin"
    sides = {"attn  (CLI)": lambda seed: run_attn(args, seed, S, binary, val, T),
             "torch (eager)": lambda seed: run_torch(args, seed, S, train, val, V, T, False)}
    if args.compile:
        sides["torch (compile)"] = lambda seed: run_torch(args, seed, S, train, val, V, T, True)
    print(f"quality: nanoGPT shakespeare_char CPU config, {S} steps, {args.threads} threads, seeds {args.seeds}",
          flush=True)
    results = {k: [] for k in sides}
    for seed in args.seeds:  # interleaved: every side once per seed, so a change in load touches all of them
        for name, run in sides.items():
            load = os.getloadavg()[0]
            loss, full, wall, comp = run(seed)
            results[name].append(wall)
            if comp:
                results.setdefault(name + " less compile", []).append(wall - comp)
            extra = f"  (compile {comp:.1f} s of it)" if comp else ""
            print(f"  seed {seed:<5} {name:<16} val loss {loss:.4f} (20 batches), {full:.4f} (full val split)  "
                  f"wall {wall:7.1f} s{extra}  load {load:.2f} at its start", flush=True)
        ours = results["attn  (CLI)"][-1]
        print("  seed " + str(seed) + ": attn wall / " + ", ".join(
            f"{k.removeprefix('torch ')} {ours / v[-1]:.2f}x" for k, v in results.items() if not k.startswith("attn")) +
            " (target <= 0.5); val loss target <= 1.90", flush=True)


# ---- peak memory of a training step ----

def vm(field):
    """/proc/self/status's field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def memory_one(args):
    """In a fresh process: build one side's model and optimizer, reset the high-water mark, run 3 steps;
    print VmRSS before the model, VmRSS once built, and VmHWM after the steps (the same /proc method on
    both sides)."""
    shape = {"nanogpt-cpu": (4, 4, 128, 64, 12, False), "gpt2-small": (12, 12, 768, 256, 4, True)}[args.shape]
    L, H, E, T, B, bias = shape
    text, ids, V = text_tokens()
    base = vm("VmRSS")
    if args.side == "attn":
        attn.set_num_threads(args.threads)
        t = attn.Trainer(text=text, config=args.shape, block_size=T, batch=B, steps=10, dropout=0.0,
                         threads=args.threads)
        step = t.step
    else:
        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        model = TorchGPT(V, T, L, H, E, bias=bias)
        opt = model.optimizer(1e-3, (0.9, 0.99), 0.1)
        rng = np.random.default_rng(0)

        def step():
            torch_step(model, model, opt, *get_batch(ids, T, B, rng))
    built = vm("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts at the current RSS
    for _ in range(3):
        step()
    print(f"{base} {built} {vm('VmHWM')}")


def memory(args):
    set_threads(args.threads)
    print(f"peak memory of training: a fresh process per side and shape, {args.threads} threads, dropout 0; "
          "'needs' = VmHWM over 3 steps less VmRSS before the model was built (weights, gradients, optimizer "
          "state, activations; torch allocates its gradients and AdamW state in the first step, attn when the "
          "model and optimizer are built), 'step' = VmHWM less VmRSS once they were built")
    for shape, desc in (("nanogpt-cpu", "4 layers, E 128, block 64, batch 12, no bias"),
                        ("gpt2-small", "12 layers, E 768, block 256, batch 4, bias")):
        got = {}
        for side in ("attn", "torch"):
            out = subprocess.run([sys.executable, __file__, "_memory_one", "--side", side, "--shape", shape,
                                  "--threads", str(args.threads), "--data", str(DATA)],
                                 capture_output=True, text=True, check=True).stdout.split()
            base, built, peak = (int(v) / 2 ** 20 for v in out[-3:])
            got[side] = peak - base
            print(f"  {shape:<12} ({desc})  {side:<5} RSS before the model {base:7.1f} MiB, built {built:7.1f} "
                  f"MiB, peak {peak:7.1f} MiB: needs {peak - base:7.1f} MiB, step {peak - built:7.1f} MiB", flush=True)
        print(f"  {shape}: attn needs {got['attn'] / got['torch']:.2f}x torch's", flush=True)


def main():
    global DATA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["throughput", "quality", "memory", "_memory_one"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="throughput: steps per timed round (5); quality: 2000")
    ap.add_argument("--reps", type=int, default=5, help="throughput: timed rounds (median)")
    ap.add_argument("--attn-bin", default=None, help="the attn CLI (default: build*/attn)")
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[1337],
                    help="quality: initialisation and batches, both sides, comma-separated (1337,1,2)")
    ap.add_argument("--compile", action="store_true", help="also PyTorch with torch.compile (inductor, CPU)")
    ap.add_argument("--bf16", action="store_true", help="throughput: also attn dtype=bf16 and torch autocast bf16")
    ap.add_argument("--data", type=Path, default=DATA, help="tinyshakespeare.txt (default: ../shared/data)")
    ap.add_argument("--side", choices=["attn", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--shape", choices=["nanogpt-cpu", "gpt2-small"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    DATA = args.data
    if args.what == "throughput":
        args.steps = args.steps or 5
        throughput(args)
    elif args.what == "quality":
        args.steps = args.steps or 2000
        quality(args)
    else:
        (memory if args.what == "memory" else memory_one)(args)


if __name__ == "__main__":
    sys.exit(main())
