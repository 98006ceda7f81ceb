"""Decode time per token of a Mistral-shaped model (random weights saved by transformers) as the context grows
past its sliding window: with the window, every layer's KV cache rolls and a decode step reads W keys, so the
time per token stays flat up to 4W and beyond; the same model without the window reads the whole context.
The time per token at context P is (generate(P tokens, 1 + n new) - generate(P tokens, 1 new)) / n, medians
of interleaved repeats.

    .venv/bin/python bench/window_decode.py --threads 2 --repeats 3
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    a = ap.parse_args()

    import numpy as np
    import attn.models
    import tiny_decoders
    from _common import set_threads

    set_threads(a.threads)
    W = a.window
    shape = dict(hidden_size=512, heads=8, kv_heads=8, head_dim=64, layers=8, vocab_size=1000, intermediate=1024,
                 max_positions=8 * W)
    models = {}
    for name, window in (("window %d" % W, W), ("no window", None)):
        d = Path(tempfile.mkdtemp())
        tiny_decoders.mistral(d, sliding_window=window, **shape)
        models[name] = attn.models.from_pretrained(d)
    print(f"Mistral-shaped: E 512, 8 layers, 8 heads of 64, V 1000; sliding_window {W} or none")
    rng = np.random.default_rng(0)
    contexts = [W // 2, W, 2 * W, 4 * W]
    prompts = {P: [int(t) for t in rng.integers(0, 1000, P)] for P in contexts}

    def per_token(m, P):
        t0 = time.perf_counter()
        m.generate(prompts[P], max_new_tokens=1, eos_token_ids=[])
        t1 = time.perf_counter()
        m.generate(prompts[P], max_new_tokens=1 + a.new_tokens, eos_token_ids=[])
        t2 = time.perf_counter()
        return ((t2 - t1) - (t1 - t0)) / a.new_tokens * 1e3

    for m in models.values():
        m.generate(prompts[contexts[0]], max_new_tokens=4, eos_token_ids=[])  # warm-up
    ms = {(k, P): [] for k in models for P in contexts}
    for _ in range(a.repeats):
        for P in contexts:
            for k, m in models.items():  # interleaved
                ms[(k, P)].append(per_token(m, P))
    print(f"\nms per decoded token at context P ({a.new_tokens} tokens after P; {a.repeats} interleaved repeats, "
          "medians)")
    print(f"{'P':>6} " + " ".join(f"{k:>12}" for k in models))
    for P in contexts:
        print(f"{P:>6} " + " ".join(f"{statistics.median(ms[(k, P)]):12.2f}" for k in models))
    for k in models:
        r = statistics.median(ms[(k, contexts[-1])]) / statistics.median(ms[(k, contexts[1])])
        print(f"{k}: time per token at {contexts[-1]} / at {contexts[1]}: {r:.2f}x")


if __name__ == "__main__":
    main()
