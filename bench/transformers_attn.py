"""transformers' own models with attn_implementation="attn" (attn.transformers.register()) against the same
models with "sdpa": (1) all-MiniLM-L6-v2 sentence embeddings of a padded batch (forward and mean pooling,
inference), (2) a Llama-shaped causal LM's training step (forward, loss, backward; random weights, float32).
Everything but attention is PyTorch's on both sides, so the gain is attention's share. A third model,
"free", has attention cost nothing (its output is the query, as a view): sdpa / free bounds what any
attention kernel can gain in this model. Same thread count, runs interleaved, medians.

    .venv/bin/python bench/transformers_attn.py --threads 2 --repeats 5
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))


def interleaved(cases, repeats):
    from _common import settle
    times = {k: [] for k in cases}
    for f in cases.values():
        f()  # warm-up
    for _ in range(repeats):
        for k, f in cases.items():
            settle()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def report(what, m):
    print(f"\n{what}")
    for k, v in m.items():
        print(f"  {k:6} {v * 1e3:9.1f} ms")
    print(f"  attn / sdpa: {m['sdpa'] / m['attn']:.2f}x; "
          f"the bound (attention free) / sdpa: {m['sdpa'] / m['free']:.2f}x")


def free_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention that costs nothing: the query, (B, L, H, D) as a view (the bound of attention's share)."""
    return query.transpose(1, 2), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--texts", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512, help="Llama step: tokens per sequence")
    ap.add_argument("--batch", type=int, default=2, help="Llama step: sequences")
    a = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    import attn.transformers
    import tiny_decoders
    from _common import set_threads

    set_threads(a.threads)
    attn.transformers.register()
    transformers.AttentionInterface.register("free", free_attention)
    print(f"transformers {transformers.__version__}")

    # (1) MiniLM embeddings: texts of 8 to 120 words, padded to the longest of the batch
    minilm = subprocess.run([str(ROOT / "scripts" / "minilm-dir")], capture_output=True, text=True).stdout.strip()
    if minilm:
        tok = transformers.AutoTokenizer.from_pretrained(minilm)
        rng = np.random.default_rng(0)
        words = "the quick brown fox jumps over a lazy dog while attention heads read every token".split()
        texts = [" ".join(rng.choice(words, int(n))) for n in rng.integers(8, 120, a.texts)]
        batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        models = {impl: transformers.AutoModel.from_pretrained(minilm, attn_implementation=impl).eval()
                  for impl in ("attn", "sdpa", "free")}

        def embed(m):
            with torch.inference_mode():
                h = m(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).float()
                return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)
        e = {k: embed(m) for k, m in models.items()}
        print(f"MiniLM: {a.texts} texts, batch {tuple(batch['input_ids'].shape)}, "
              f"{float(batch['attention_mask'].float().mean()):.0%} tokens (the rest padding); "
              f"max |embedding difference| {float((e['attn'] - e['sdpa']).abs().max()):.1e}")
        report("all-MiniLM-L6-v2 embeddings (forward + mean pooling)",
               interleaved({k: (lambda m=m: embed(m)) for k, m in models.items()}, a.repeats))
    else:
        print("MiniLM: not installed (scripts/minilm-dir), skipped")

    # (2) a Llama-shaped training step
    d = Path(tempfile.mkdtemp())
    tiny_decoders.llama(d, hidden_size=512, heads=8, kv_heads=2, head_dim=64, layers=8, vocab_size=8000,
                        intermediate=1408, max_positions=a.seq)
    x = torch.randint(0, 8000, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))
    models = {impl: transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation=impl).train()
              for impl in ("attn", "sdpa", "free")}

    def step(m):
        m.zero_grad(set_to_none=True)
        m(input_ids=x, labels=x).loss.backward()
    grads = {}
    for k, m in models.items():
        step(m)
        if k == "free":
            continue
        grads[k] = torch.cat([p.grad.flatten() for p in m.parameters()])
    print(f"\nLlama-shaped: E 512, 8 layers, 8 query heads over 2 KV heads of 64, V 8000; batch {a.batch} x {a.seq}; "
          f"max |gradient difference| {float((grads['attn'] - grads['sdpa']).abs().max()):.1e} "
          f"(of max {float(grads['sdpa'].abs().max()):.1e})")
    report("training step (forward, loss, backward)",
           interleaved({k: (lambda m=m: step(m)) for k, m in models.items()}, a.repeats))


if __name__ == "__main__":
    main()
