"""Greedy translation of a 64-token source into 64 target tokens: attn's encoder-decoders (the encoder once,
cross-attention K/V once, the decoder's KV cache) against transformers' generate (float32, its KV caches),
on a T5-small-shaped and a BART-base-shaped model (random weights saved by transformers). Same thread count
on both sides, runs interleaved, medians.

    .venv/bin/python bench/seq2seq_vs_torch.py --threads 2 --repeats 3 [--ref-attn eager]
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

SHAPES = {  # T5-small: d_model 512, 6 + 6 layers, 8 heads of 64, d_ff 2048; BART-base: 768, 6 + 6, 12 heads, 3072
    "t5": (lambda t, d: t.t5(d, d_model=512, d_kv=64, d_ff=2048, layers=6, heads=8, vocab_size=32128,
                             dropout_rate=0.0), "T5ForConditionalGeneration"),
    "bart": (lambda t, d: t.bart(d, d_model=768, heads=12, layers=6, ffn=3072, vocab_size=50265, max_positions=1024,
                                 dropout=0.0), "BartForConditionalGeneration"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--source", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--ref-attn", default="sdpa")
    ap.add_argument("--arch", nargs="*", default=sorted(SHAPES))
    a = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    import attn.models
    import tiny_decoders
    from _common import set_threads

    set_threads(a.threads)
    print(f"transformers {transformers.__version__}, attention {a.ref_attn}")
    for arch in a.arch:
        build, cls = SHAPES[arch]
        d = Path(tempfile.mkdtemp())
        build(tiny_decoders, d)
        ref = getattr(transformers, cls).from_pretrained(d, attn_implementation=a.ref_attn).eval()
        ours = attn.models.from_pretrained(d)
        V = ref.config.vocab_size
        src = [int(t) for t in np.random.default_rng(0).integers(3, V, a.source)]

        def theirs():
            with torch.inference_mode():
                out = ref.generate(torch.tensor([src]), max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                   do_sample=False, num_beams=1)
            return out[0, 1:].tolist()

        def mine():
            return ours.generate(src, max_new_tokens=a.new_tokens, eos_token_ids=[])

        same = mine() == theirs()
        times = {"attn": [], "transformers": []}
        for _ in range(a.repeats):
            for k, f in (("attn", mine), ("transformers", theirs)):
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        m = {k: statistics.median(v) for k, v in times.items()}
        print(f"\n{cls}: {sum(p.numel() for p in ref.parameters()) / 1e6:.1f}M parameters; {a.source} source tokens "
              f"-> {a.new_tokens} greedy; identical: {same}; {a.repeats} interleaved repeats, medians")
        for k in m:
            print(f"  {k:13} {m[k] * 1e3:9.1f} ms  {a.new_tokens / m[k]:7.1f} tokens/s")
        print(f"  attn / transformers: {m['transformers'] / m['attn']:.2f}x")


if __name__ == "__main__":
    main()
