"""attn.torch as a drop-in inside PyTorch 2.13, side by side with torch, interleaved medians, same threads:

    .venv/bin/python bench/drop_in_torch.py --threads 2

1. attn.torch.MultiheadAttention vs torch.nn.MultiheadAttention, forward + backward at (N, L, E) =
   (8, 128, 256), 8 heads, self-attention, need_weights=True (torch's default: attn's weights come from the
   flash kernel's LSE) and need_weights=False.
2. nanoGPT's attention block (B, T, C) = (8, 128, 256), 8 heads, causal, with attn.torch's
   scaled_dot_product_attention: eager against torch.compile (inductor, fullgraph=True; the custom ops
   attn::sdpa and attn::sdpa_backward are single nodes), forward + backward; the compile time apart.
A benchmark, not a test: record the command and the numbers in BENCHMARKS.md.
"""
import argparse
import time

import torch

import attn.torch
from _common import set_threads
from compare_torch import interleaved_medians


class Block(torch.nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H, self.c_attn, self.c_proj = H, torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        y = attn.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    set_threads(a.threads)
    N, L, E, H = 8, 128, 256, 8
    torch.manual_seed(0)
    x = torch.randn(N, L, E, requires_grad=True)
    ours = attn.torch.MultiheadAttention(E, H, batch_first=True)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    ref.load_state_dict(ours.state_dict())

    def step(m, need):
        def run():
            y, _ = m(x, x, x, need_weights=need)
            y.sum().backward()
        return run

    for need in (True, False):
        med = interleaved_medians({"attn": step(ours, need), "torch": step(ref, need)}, a.reps)
        print(f"MHA forward+backward (N, L, E) = ({N}, {L}, {E}), H {H}, need_weights={need}: attn "
              f"{med['attn'] * 1e3:.1f} ms, torch {med['torch'] * 1e3:.1f} ms, "
              f"torch/attn {med['torch'] / med['attn']:.2f}")

    block = Block(E, H)
    compiled = torch.compile(block, fullgraph=True)
    t0 = time.perf_counter()
    compiled(x).sum().backward()
    print(f"torch.compile(fullgraph=True) of the block: first forward+backward {time.perf_counter() - t0:.1f} s")

    def fb(m):
        def run():
            m(x).sum().backward()
        return run

    med = interleaved_medians({"eager": fb(block), "compiled": fb(compiled)}, a.reps)
    print(f"nanoGPT attention block forward+backward (B, T, C) = ({N}, {L}, {E}), H {H}, causal: eager "
          f"{med['eager'] * 1e3:.1f} ms, compiled {med['compiled'] * 1e3:.1f} ms, eager/compiled "
          f"{med['eager'] / med['compiled']:.2f}")


if __name__ == "__main__":
    main()
