"""The attention variants side by side with PyTorch 2.13 in one process: attn's kernels against
flex_attention compiled for the CPU (torch.compile'd, the same score_mod / mask_mod, block mask built once)
for the forward, and against torch's SDPA with the equivalent dense mask (an additive float mask carrying the
biases) for forward+backward, which FlexAttention lacks on the CPU. Interleaved rounds, medians, the same
thread count both sides.

    .venv/bin/python bench/variants_vs_flex.py --threads 2 [--L 4096] [--reps 5] [--window 512]

Prints per variant the median ms of each contender and the ratio (> 1: attn faster), with the `attn info`
header. A benchmark, not a test: record the command and the numbers in BENCHMARKS.md.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import attn
import attn.torch as attn_torch
from _common import set_threads
from compare_torch import interleaved_medians, report


def alibi_slopes(H):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])


def variants(L, H, W):
    """name -> (attn keyword arguments, flex score_mod, flex mask_mod, dense additive bias (1 or H, L, L))."""
    q_idx, k_idx = torch.arange(L)[:, None], torch.arange(L)[None, :]
    causal = k_idx <= q_idx
    slopes = alibi_slopes(H)
    docs = torch.arange(L) * 8 // L  # 8 documents of L/8

    def neg_inf(keep):
        return torch.zeros(L, L).masked_fill(~keep, float("-inf"))[None]

    return {
        "window": (dict(is_causal=True, window=(W, 0)), None,
                   lambda b, h, q, k: (k <= q) & (k >= q - W), neg_inf(causal & (k_idx >= q_idx - W))),
        "alibi": (dict(is_causal=True, alibi_slopes=slopes), lambda s, b, h, q, k: s - slopes[h] * (q - k).abs(),
                  lambda b, h, q, k: k <= q, neg_inf(causal) - slopes[:, None, None] * (q_idx - k_idx).abs()),
        "softcap": (dict(is_causal=True, softcap=50.0), lambda s, b, h, q, k: 50.0 * torch.tanh(s / 50.0),
                    lambda b, h, q, k: k <= q, None),  # softcap has no dense-mask form: no SDPA row
        "documents": (dict(is_causal=True, document_ids=docs[None]), None,
                      lambda b, h, q, k: (k <= q) & (docs[q] == docs[k]),
                      neg_inf(causal & (docs[:, None] == docs[None]))),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    set_threads(a.threads)  # prints the attn info header and torch's
    print(f"B 1, H {a.H}, L = S = {a.L}, D {a.D}, window {a.window}")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, a.H, a.L, a.D, generator=g) for _ in range(3))
    qn, kn, vn = (x.numpy() for x in (q, k, v))
    flex = torch.compile(flex_attention, dynamic=False)
    for name, (kw, score_mod, mask_mod, dense) in variants(a.L, a.H, a.window).items():
        block_mask = create_block_mask(mask_mod, 1, None, a.L, a.L, device="cpu")
        np_kw = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}

        def attn_fwd():
            attn.scaled_dot_product_attention(qn, kn, vn, **np_kw)

        def flex_fwd():
            with torch.no_grad():
                flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

        report(f"{name}: forward", interleaved_medians({"attn": attn_fwd, "flex_attention (compiled)": flex_fwd},
                                                         a.reps))
        if dense is None:
            continue
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        dout = torch.randn_like(q)
        akw = {n: x for n, x in kw.items()}

        def attn_fb():
            o = attn_torch.scaled_dot_product_attention(qg, kg, vg, **akw)
            torch.autograd.grad(o, (qg, kg, vg), dout)

        def sdpa_fb():
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=dense)
            torch.autograd.grad(o, (qg, kg, vg), dout)

        report(f"{name}: forward+backward",
               interleaved_medians({"attn": attn_fb, "torch SDPA, dense mask": sdpa_fb}, a.reps))


if __name__ == "__main__":
    main()
