"""attn's GEMM against torch.mm (MKL on x86) in one process: interleaved, same thread count, medians.

    .venv/bin/python bench/gemm_vs_torch.py [--threads 1,2] [--rounds 9] [--quick] [--dtype bf16]

Shapes as bench/gemm_candidates.cpp: 2048³, the training shapes (M = B·T in {768, 4096} against N, K in
{128, 512}; forward x·Wᵀ, dx = dy·W, dW = dyᵀ·x), the MHA projections at E = 512, L = 4096. Prints the CPU
header, GFLOP/s of each and the ratio attn / MKL (> 1: attn faster). --dtype bf16: attn's gemm_bf16 on bf16
operands into a bf16 C against attn's fp32 gemm and torch.mm on bfloat16 tensors (oneDNN; its C is bf16 too),
all three interleaved. A benchmark, not a test: record the command and the numbers in BENCHMARKS.md.

Each timing starts --pause (20 ms) after the one before, then one untimed call of the same side: torch's
OpenMP team (libgomp) spins for a few ms after torch.mm returns, and a timing that starts then shares the
cores with it (on a 2-vCPU Zen 4, attn's 768x128x512 NT read 90 GFLOP/s right after torch, 98 after 1 ms,
132 after 3 ms, 177 after 10 ms; attn's own pool spins 100 us); the untimed call wakes this side's threads
(and the VM's idle vCPU) again, which after the pause cost the shapes of 2-3 calls per timing up to 40%.
--pause 0: back-to-back timings.
"""
import argparse
import statistics
import subprocess
import time

import numpy as np
import torch

import attn
from _common import settle


def cpu_header():
    lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    keep = ("Model name", "CPU(s):", "L1d", "L2", "L3")
    out = [ln for ln in lines if ln.strip().startswith(keep)]
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("Flags")), [])
    out.append("SIMD flags: " + " ".join(f for f in flags if f.startswith(("avx", "fma", "sse4"))))
    out.append("torch " + torch.__version__ + ", " + torch.backends.cpu.get_cpu_capability() + ", MKL "
               + str(torch.backends.mkl.is_available()))
    out.append(attn.gemm_kernel())
    out.append("bf16: " + attn.info()["gemm_bf16"])
    return "\n".join(out)


def shapes():
    yield "2048^3", 2048, 2048, 2048, False, False
    for bt in (768, 4096):
        for out, inn in ((128, 512), (512, 128), (512, 512)):
            yield "fwd x.W^T", bt, out, inn, False, True
            yield "dx = dy.W", bt, inn, out, False, False
            yield "dW = dy^T.x", out, inn, bt, True, False
    yield "MHA in_proj", 4096, 1536, 512, False, True
    yield "MHA out_proj", 4096, 512, 512, False, True


def measure(shape_list, rounds, pause, dtype, rng):
    """GFLOP/s of each side on each shape (label, M, N, K, trans_a, trans_b): [(row label, {side: median})],
    sides attn and torch (and attn16 with dtype bf16). bench/run.py uses it too."""
    # (label, flops, {side: timed closure}, {side: [seconds per call]}, {side: reps}); {side: one call}
    cases, warms = [], []
    for what, M, N, K, ta, tb in shape_list:
        a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
        c = np.empty((M, N), np.float32)
        ta_t, tb_t = torch.from_numpy(a), torch.from_numpy(b)
        opa = ta_t.t() if ta else ta_t
        opb = tb_t.t() if tb else tb_t
        tc = torch.empty(M, N)
        flops = 2.0 * M * N * K

        # one call of each side; a timing repeats it reps times (~30 ms of its work), and one untimed call
        # precedes it
        calls = {"attn": lambda a=a, b=b, c=c, ta=ta, tb=tb: attn.gemm(a, b, c, trans_a=ta, trans_b=tb),
                 "torch": lambda opa=opa, opb=opb, tc=tc: torch.mm(opa, opb, out=tc)}
        calls["attn"](), calls["torch"]()
        assert np.allclose(c, tc.numpy(), rtol=1e-3, atol=1e-3 * np.sqrt(K)), what
        if dtype == "bf16":
            a16, b16 = ta_t.to(torch.bfloat16), tb_t.to(torch.bfloat16)
            opa16, opb16 = (a16.t() if ta else a16), (b16.t() if tb else b16)
            na16, nb16 = a16.view(torch.int16).numpy(), b16.view(torch.int16).numpy()
            c16, tc16 = np.empty((M, N), np.int16), torch.empty(M, N, dtype=torch.bfloat16)
            calls = {"attn16": lambda na16=na16, nb16=nb16, c16=c16, ta=ta, tb=tb:
                     attn.gemm_bf16(na16, nb16, c16, trans_a=ta, trans_b=tb),
                     "attn": calls["attn"],
                     "torch": lambda opa16=opa16, opb16=opb16, tc16=tc16: torch.mm(opa16, opb16, out=tc16)}
            calls["attn16"](), calls["torch"]()
            got16 = torch.from_numpy(c16).view(torch.bfloat16).float().numpy()
            assert np.allclose(got16, tc16.float().numpy(), rtol=2e-2, atol=2e-2 * np.sqrt(K)), what
        # per side from one timed call: where torch's bf16 is a slow fallback (1.25 GFLOP/s on a Zen 3 without
        # AVX512_BF16), its timings would otherwise run minutes
        reps = {}
        for k, f in calls.items():
            t0 = time.perf_counter()
            f()
            reps[k] = max(1, round(0.03 / (time.perf_counter() - t0)))
        runs = {k: (lambda f=f, n=reps[k]: [f() for _ in range(n)]) for k, f in calls.items()}
        op = ("T" if ta else "N") + ("T" if tb else "N")
        cases.append((f"{what:<13} {f'{M}x{N}x{K} {op}':>18}", flops, runs, {k: [] for k in runs}, reps))
        warms.append(calls)
    # Rounds outer, shapes inner: a slow spell of the machine (a VM's vCPU taken away for seconds)
    # lands in one round of every shape, not in every round of a few.
    for _ in range(rounds):
        for (label, flops, runs, times, reps), warm in zip(cases, warms):
            for name, fn in runs.items():
                settle(pause)  # the other side's threads asleep again
                warm[name]()  # and this side's awake: one untimed call
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) / reps[name])
    return [(label, {k: flops / statistics.median(v) * 1e-9 for k, v in times.items()})
            for label, flops, runs, times, reps in cases]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--pause", type=float, default=0.02, help="seconds between timings (see above)")
    args = ap.parse_args()
    print(cpu_header())
    rng = np.random.default_rng(0)
    for t in (int(x) for x in args.threads.split(",")):
        torch.set_num_threads(t)
        attn.set_num_threads(t)
        print(f"\nthreads {t}: GFLOP/s, median of {args.rounds} interleaved rounds (all shapes in each), "
              f"{args.pause * 1e3:g} ms apart")
        if args.dtype == "bf16":
            print(f"{'shape':<13} {'M x N x K op':>18} {'attn bf16':>10} {'attn f32':>9} {'torch bf16':>11} "
                  f"{'bf16/f32':>9} {'attn/torch':>11}")
        else:
            print(f"{'shape':<13} {'M x N x K op':>18} {'attn':>8} {'torch.mm':>9} {'attn/MKL':>9}")
        for label, gf in measure(list(shapes())[: 1 if args.quick else None], args.rounds, args.pause, args.dtype,
                                 rng):
            if args.dtype == "bf16":
                print(f"{label} {gf['attn16']:10.1f} {gf['attn']:9.1f} "
                      f"{gf['torch']:11.1f} {gf['attn16'] / gf['attn']:9.2f} {gf['attn16'] / gf['torch']:11.2f}")
                continue
            print(f"{label} {gf['attn']:8.1f} {gf['torch']:9.1f} {gf['attn'] / gf['torch']:9.2f}", flush=True)


if __name__ == "__main__":
    main()
