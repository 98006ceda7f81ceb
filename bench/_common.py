"""What every benchmark script starts with: the same thread count on both sides, and the header that
says which machine and which kernels the numbers belong to (attn.info(): CPU, caches, SIMD target, GEMM
kernel, threads; torch's version, threads and BLAS). A number without its CPU means little."""
import time

import torch

import attn


def set_threads(n):
    """torch.set_num_threads(n) and attn.set_num_threads(n), then the header."""
    torch.set_num_threads(n)
    attn.set_num_threads(n)
    print(attn.info()["text"], end="")
    blas = "MKL" if torch.backends.mkl.is_available() else "no MKL"
    print(f"torch     {torch.__version__}, {torch.get_num_threads()} threads, {blas}, "
          f"{torch.backends.cpu.get_cpu_capability()} kernels")


def settle(seconds=0.02):
    """A pause before each timed sample of an interleaved run: torch's libgomp team keeps spinning for a few
    ms after a torch call returns, so whatever is timed right after it shares the cores with that spin (found
    on a Zen 4, 2 vCPUs: a GEMM timed back to back after torch.mm read at half its rate, 10 ms later at full)."""
    time.sleep(seconds)
