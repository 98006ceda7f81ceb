"""Side by side with PyTorch 2.13 in one process: attn vs torch SDPA (its CPU flash kernel), torch's
matmul-softmax-matmul math path, and nn.MultiheadAttention, interleaved, same thread count, medians.

    .venv/bin/python bench/compare_torch.py --threads 2 [--quick] [--bf16]

Prints one table per case: median ms of each contender and the ratio torch / attn (> 1: attn faster).
--bf16: the SDPA cases in bf16 instead: attn's bf16 flash forward (dtype="bfloat16", on fp32 arrays; and
attn.torch on bf16 tensors, the user's path with its conversions) against attn's fp32 and torch's SDPA on
bf16 tensors.
Forward+backward has its own script (bench/backward_vs_torch.py), training its own (bench/train_torch.py).
A benchmark, not a test: record the command and the numbers in BENCHMARKS.md.
"""
import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attn
from _common import set_threads, settle


def interleaved_medians(contenders, reps):
    """Runs each contender once per round, rounds `reps` times after a warm-up, each timing after a pause
    (settle); median seconds each."""
    times = {name: [] for name in contenders}
    for fn in contenders.values():
        fn()
    for _ in range(reps):
        for name, fn in contenders.items():
            settle()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def report(title, medians, ours="attn", flops=None):
    print(f"\n{title}")
    for name, s in medians.items():
        extra = f"  {flops / s * 1e-9:7.1f} GFLOP/s" if flops else ""
        ratio = "" if name.startswith(ours) else f"  attn is {s / medians[ours]:.2f}x faster"
        print(f"  {name:<28} {s * 1e3:9.2f} ms{extra}{ratio}")


def sdpa_contenders(B, H, Hkv, L, D, causal, rng, bf16=False):
    """(title, {name: one call}, FLOPs) of an SDPA case: attn against torch's flash and math paths, or (bf16)
    attn bf16 and fp32, attn.torch and torch on bf16 tensors. bench/run.py takes two of them."""
    q = rng.standard_normal((B, H, L, D), dtype=np.float32)
    k = rng.standard_normal((B, Hkv, L, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, L, D), dtype=np.float32)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    gqa = H != Hkv
    flops = 4.0 * B * H * L * L * D * (0.5 if causal else 1.0)
    title = f"SDPA B={B} H={H} Hkv={Hkv} L=S={L} D={D} {'causal' if causal else 'non-causal'}"
    if bf16:
        import attn.torch as attn_torch
        hq, hk, hv = (t.to(torch.bfloat16) for t in (tq, tk, tv))

        def torch_bf16():
            with torch.no_grad():
                F.scaled_dot_product_attention(hq, hk, hv, is_causal=causal, enable_gqa=gqa)

        def attn_torch_bf16():
            with torch.no_grad():
                attn_torch.scaled_dot_product_attention(hq, hk, hv, is_causal=causal, enable_gqa=gqa)

        return title + " bf16", {
            "attn bf16": lambda: attn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa,
                                                                   dtype="bfloat16"),
            "attn fp32": lambda: attn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
            "attn.torch, bf16 tensors": attn_torch_bf16,
            "torch sdpa, bf16 tensors": torch_bf16}, flops

    def torch_flash():
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa)

    def torch_math():
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa)

    contenders = {"attn": lambda: attn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
                  "torch sdpa (flash)": torch_flash}
    if L <= 4096:
        contenders["torch sdpa (math)"] = torch_math
    return title, contenders, flops


def sdpa_case(B, H, Hkv, L, D, causal, reps, rng, bf16=False):
    title, contenders, flops = sdpa_contenders(B, H, Hkv, L, D, causal, rng, bf16)
    report(title, interleaved_medians(contenders, reps), ours="attn bf16" if bf16 else "attn", flops=flops)


def mha_contenders(E, H, L, rng):
    """(title, {name: one call}) of nn.MultiheadAttention's forward: attn's against torch's, the same weights."""
    x = rng.standard_normal((1, L, E), dtype=np.float32)
    tmha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    ours = attn.MultiheadAttention(E, H, batch_first=True)
    ours.load_state_dict({k: v.numpy() for k, v in tmha.state_dict().items()})
    ours.eval()
    tx = torch.from_numpy(x)

    def torch_mha():
        with torch.no_grad():
            tmha(tx, tx, tx, need_weights=False)

    return f"MultiheadAttention E={E} H={H} L={L} need_weights=False, eval", {
        "attn MultiheadAttention": lambda: ours(x, x, x, need_weights=False),
        "torch nn.MultiheadAttention": torch_mha}


def mha_case(E, H, L, reps, rng):
    title, contenders = mha_contenders(E, H, L, rng)
    report(title, interleaved_medians(contenders, reps), ours="attn MultiheadAttention")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="L=1024 only, for a smoke run")
    ap.add_argument("--bf16", action="store_true", help="the SDPA cases in bf16 (no MultiheadAttention)")
    a = ap.parse_args()
    set_threads(a.threads)
    print(f"torch {torch.__version__}, torch threads {torch.get_num_threads()}, attn threads "
          f"{attn.get_num_threads()}")
    rng = np.random.default_rng(0)
    L = 1024 if a.quick else 4096
    for causal in (False, True):
        sdpa_case(1, 8, 8, L, 64, causal, a.reps, rng, a.bf16)
    sdpa_case(1, 8, 8, L, 128, False, a.reps, rng, a.bf16)
    sdpa_case(1, 32, 8, L, 128, False, a.reps, rng, a.bf16)
    if not a.bf16:
        mha_case(512, 8, L, a.reps, rng)


if __name__ == "__main__":
    main()
