"""A GPT-2-small-shaped decoder (124M parameters, random weights saved by transformers' save_pretrained),
attn against transformers' generate with its KV cache (PyTorch eager, SDPA attention, float32): tokens/s
generating N tokens greedily after a short prompt, and the first-token latency of a long prompt (its
prefill and one token). Same thread count on both sides, runs interleaved, medians. --arch picks the
architecture at the same size (E 768, 12 layers, 12 heads, V 50257; the gated MLPs 2048 wide, about GPT-2's
parameters), --ref-attn transformers' attention ("sdpa", or "eager": its plain PyTorch attention).

    .venv/bin/python bench/generate_vs_torch.py --threads 2 --repeats 3 [--bf16] [--arch llama --ref-attn eager]

--bf16 adds attn loaded with dtype="bfloat16" (bf16 weights, bf16 matmuls) and transformers under
torch.autocast("cpu", dtype=torch.bfloat16), in the same interleaved rounds (greedy tokens may differ).
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))


# GPT-2 small's size for each architecture: 12 layers, 12 heads, E 768, V 50257, 1024 positions
SMALL = dict(hidden_size=768, heads=12, layers=12, vocab_size=50257, max_positions=1024)
GATED = dict(SMALL, kv_heads=12, intermediate=2048)
ARCHS = {
    "gpt2": (lambda t, d: t.gpt2(d, n_embd=768, n_head=12, n_layer=12, vocab_size=50257, n_positions=1024),
             "GPT2LMHeadModel"),
    "llama": (lambda t, d: t.llama(d, head_dim=64, **GATED), "LlamaForCausalLM"),
    "mistral": (lambda t, d: t.mistral(d, head_dim=64, kv_heads=4, sliding_window=256,
                                       **{k: v for k, v in GATED.items() if k != "kv_heads"}), "MistralForCausalLM"),
    "qwen2": (lambda t, d: t.qwen2(d, **GATED), "Qwen2ForCausalLM"),
    "gemma2": (lambda t, d: t.gemma2(d, head_dim=64, sliding_window=256, **GATED), "Gemma2ForCausalLM"),
    "bloom": (lambda t, d: t.bloom(d, hidden_size=768, heads=12, layers=12, vocab_size=50257), "BloomForCausalLM"),
}


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def make_sides(d, cls, ref_attn="sdpa", bf16=False):
    """transformers' model (class name cls) and {name: generate(prompt ids, n) -> n new ids, greedy, KV cache}
    of the model directory d: attn and transformers, with bf16 also attn bf16 and transformers bf16.
    bench/run.py uses it too."""
    import torch
    import transformers
    import attn.models

    ref = getattr(transformers, cls).from_pretrained(d, attn_implementation=ref_attn).eval()
    ours = attn.models.from_pretrained(d)

    def torch_gen(prompt, n):
        with torch.inference_mode():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                               use_cache=True, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    def ours_gen(prompt, n):
        return ours.generate(prompt, max_new_tokens=n, eos_token_ids=[])

    sides = {"attn": ours_gen, "transformers": torch_gen}
    if bf16:
        ours16 = attn.models.from_pretrained(d, dtype="bfloat16")

        def torch_gen16(prompt, n):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch_gen(prompt, n)
        sides["attn bf16"] = lambda prompt, n: ours16.generate(prompt, max_new_tokens=n, eos_token_ids=[])
        sides["transformers bf16"] = torch_gen16
    return ref, sides


def warm_up(sides, short):
    for f in sides.values():  # warm-up (and the page cache)
        f(short, 8)


def measure(sides, short, long, new_tokens, repeats):
    """Interleaved repeats: {side: [tokens/s of new_tokens after short]}, {side: [ms to the first token after
    long]}."""
    rate = {k: [] for k in sides}
    first = {k: [] for k in sides}
    for _ in range(repeats):
        for k, f in sides.items():  # interleaved
            s, _ = timed(lambda: f(short, new_tokens))
            rate[k].append(new_tokens / s)
            s, _ = timed(lambda: f(long, 1))
            first[k].append(s * 1e3)
    return rate, first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens before the timed generation")
    ap.add_argument("--long-prompt", type=int, default=512, help="prompt tokens of the first-token latency")
    ap.add_argument("--dir", help="a model directory to reuse (written there if empty)")
    ap.add_argument("--bf16", action="store_true", help="also both sides in bf16")
    ap.add_argument("--arch", default="gpt2", choices=sorted(ARCHS))
    ap.add_argument("--ref-attn", default="sdpa", help="transformers' attn_implementation (sdpa, eager)")
    a = ap.parse_args()

    import numpy as np
    import transformers
    import tiny_decoders
    from _common import set_threads

    set_threads(a.threads)
    print(f"transformers {transformers.__version__}")
    d = Path(a.dir or tempfile.mkdtemp())
    build, cls = ARCHS[a.arch]
    if not (d / "config.json").exists():
        build(tiny_decoders, d)
    ref, sides = make_sides(d, cls, a.ref_attn, a.bf16)
    print(f"{cls}, transformers' attention: {a.ref_attn}")
    print(f"{sum(p.numel() for p in ref.parameters()) / 1e6:.1f}M parameters, {d}")
    rng = np.random.default_rng(0)
    V = ref.config.vocab_size
    short = [int(t) for t in rng.integers(0, V, a.prompt)]
    long = [int(t) for t in rng.integers(0, V, a.long_prompt)]

    warm_up(sides, short)
    same = sides["attn"](short, a.new_tokens) == sides["transformers"](short, a.new_tokens)
    print(f"greedy {a.new_tokens} tokens identical in both: {same}")
    rate, first = measure(sides, short, long, a.new_tokens, a.repeats)
    print(f"\n{a.new_tokens} new tokens after {a.prompt}, first token after {a.long_prompt}; "
          f"{a.repeats} interleaved repeats, medians")
    print(f"{'':18} {'tokens/s':>10} {'first token (ms)':>17}")
    for k in sides:
        print(f"{k:18} {statistics.median(rate[k]):10.2f} {statistics.median(first[k]):17.1f}")

    def ratio(x, y):
        r = statistics.median(rate[x]) / statistics.median(rate[y])
        f = statistics.median(first[y]) / statistics.median(first[x])
        print(f"{x} / {y}: {r:.2f}x tokens/s, {f:.2f}x first-token latency")
    ratio("attn", "transformers")
    if a.bf16:
        ratio("attn bf16", "attn")
        ratio("attn bf16", "transformers bf16")


if __name__ == "__main__":
    main()
