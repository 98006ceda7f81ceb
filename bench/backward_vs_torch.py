"""SDPA forward+backward: attn's flash kernels against PyTorch's CPU SDPA (autograd), fp32, same threads.

    PYTHONPATH=python:build/python .venv/bin/python bench/backward_vs_torch.py [--L 4096] [--reps 7] [--bf16]

Prints medians of interleaved runs: attn forward (with LSE), attn backward, and torch forward+backward.
--bf16 adds attn with dtype="bfloat16" (forward and backward over bf16 pairs, on the same fp32 arrays) and
torch's SDPA forward+backward on bf16 tensors, in the same rounds.
A benchmark, not a test: the numbers go to the report / BENCHMARKS.md, nothing is asserted.
"""
import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

import attn
from _common import set_threads, settle

def make_sides(B, H, L, D, causal, rng):
    """One case's calls: attn_fwd(dtype) -> (out, lse), attn_bwd(out, lse, dtype), torch_fwd_bwd(bf16=False),
    all on the same q, k, v, dout (fp32 arrays; torch's bf16 side on bf16 copies). bench/run.py uses them too."""
    q, k, v, dout = (rng.standard_normal((B, H, L, D), dtype=np.float32) for _ in range(4))
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    tdout = torch.tensor(dout)

    def attn_fwd(dtype="float32"):
        return attn.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True, strict=True,
                                                 dtype=dtype)

    def attn_bwd(out, lse, dtype="float32"):
        attn.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, is_causal=causal, strict=True,
                                                   dtype=dtype)

    bq, bk, bv = (t.detach().to(torch.bfloat16).requires_grad_() for t in (tq, tk, tv))
    bdout = tdout.to(torch.bfloat16)

    def torch_fwd_bwd(bf16=False):
        ts, d = ((bq, bk, bv), bdout) if bf16 else ((tq, tk, tv), tdout)
        for t in ts:
            t.grad = None
        F.scaled_dot_product_attention(*ts, is_causal=causal).backward(d)

    return attn_fwd, attn_bwd, torch_fwd_bwd


def timed(f, *a):
    t = time.perf_counter()
    r = f(*a)
    return time.perf_counter() - t, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="add attn bf16 and torch on bf16 tensors")
    args = ap.parse_args()
    set_threads(args.threads)

    rng = np.random.default_rng(0)
    attn_fwd, attn_bwd, torch_fwd_bwd = make_sides(args.B, args.H, args.L, args.D, args.causal, rng)
    out, lse = attn_fwd()  # warm-up
    attn_bwd(out, lse)
    torch_fwd_bwd()
    if args.bf16:
        attn_bwd(*attn_fwd("bfloat16"), "bfloat16")
        torch_fwd_bwd(bf16=True)
    fwd, bwd, ref, fwd16, bwd16, ref16 = [], [], [], [], [], []
    for _ in range(args.reps):  # interleaved: both sides see the same load
        settle()
        t, (out, lse) = timed(attn_fwd)
        fwd.append(t)
        bwd.append(timed(attn_bwd, out, lse)[0])
        settle()
        ref.append(timed(torch_fwd_bwd)[0])
        if args.bf16:
            settle()
            t, (out, lse) = timed(attn_fwd, "bfloat16")
            fwd16.append(t)
            bwd16.append(timed(attn_bwd, out, lse, "bfloat16")[0])
            settle()
            ref16.append(timed(torch_fwd_bwd, True)[0])
    f, b, r = (float(np.median(x)) for x in (fwd, bwd, ref))
    print(f"B={args.B} H={args.H} L={args.L} D={args.D} causal={args.causal} threads={args.threads}, "
          f"medians of {args.reps}")
    print(f"attn forward {f * 1e3:.1f} ms, backward {b * 1e3:.1f} ms, forward+backward {(f + b) * 1e3:.1f} ms "
          f"= {(f + b) / f:.2f}x the forward")
    print(f"torch forward+backward {r * 1e3:.1f} ms: attn is {r / (f + b):.2f}x faster")
    if args.bf16:
        f16, b16, r16 = (float(np.median(x)) for x in (fwd16, bwd16, ref16))
        print(f"attn bf16 forward {f16 * 1e3:.1f} ms ({f / f16:.2f}x fp32's), backward {b16 * 1e3:.1f} ms "
              f"({b / b16:.2f}x fp32's), forward+backward {(f16 + b16) * 1e3:.1f} ms ({(f + b) / (f16 + b16):.2f}x)")
        print(f"torch bf16 tensors forward+backward {r16 * 1e3:.1f} ms: attn bf16 is {r16 / (f16 + b16):.2f}x "
              f"faster")


if __name__ == "__main__":
    main()
