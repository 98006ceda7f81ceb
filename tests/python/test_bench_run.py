"""`make bench`'s script, bench/run.py, at --quick (tiny sizes, one round; about 10 s on 2 free cores): the table
has every row, each with attn's number and the peer's, or a note saying why the peer was skipped (its package
not installed), and the command exits 0. A row whose measuring code breaks fails here."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from minilm import minilm_dir

ROOT = Path(__file__).resolve().parents[2]

# (row, peer): the table's first column and its last; a peer is skipped only when its package is missing
ROWS = [("GEMM fp32", "torch.mm"), ("SDPA fwd fp32", "torch SDPA"), ("SDPA fwd bf16", "torch SDPA"),
        ("SDPA fwd+bwd fp32", "torch SDPA"), ("MultiheadAttention fwd", "torch nn.MultiheadAttention"),
        ("decode", "transformers"), ("first token", "transformers"), ("MiniLM batch", "transformers"),
        ("MiniLM batch", "onnxruntime"), ("MiniLM single", "transformers"), ("MiniLM single", "onnxruntime"),
        ("training step", "PyTorch eager")]
NUMBERS = re.compile(r"^(?P<row>.+?) {2,}.*? (?P<unit>ms|GFLOP/s|tok/s|sent/s|-) +(?P<attn>\S+) +(?P<peer>\S+) +"
                     r"(?P<ratio>\S+) {2}(?P<name>.*)$")


def test_quick_run_prints_every_row():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--threads", "2"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    out = r.stdout
    assert out.startswith("cpu ") and "\ntorch " in out, out  # attn info's header, then torch's line
    assert re.search(r"^wall time \d+ s", out, re.M), out
    lines = [m for m in map(NUMBERS.match, out.splitlines()) if m]
    for row, peer in ROWS:
        found = [m for m in lines if m["row"] == row and m["name"].startswith(peer)]
        assert len(found) == 1, (row, peer, out)
        m = found[0]
        if m["peer"] == "-":  # skipped: only for a missing package (transformers also writes the decoder)
            if row.startswith("MiniLM") and minilm_dir() is None:
                assert "skipped: the model" in m[0], m[0]
                continue
            package = "onnxruntime" if peer == "onnxruntime" else "transformers"
            assert importlib.util.find_spec(package) is None, f"{package} is installed, yet: {m[0]}"
            assert f"skipped: {package} not installed" in m[0], m[0]
            if m["attn"] == "-":
                continue
        else:
            assert float(m["peer"]) > 0 and float(m["ratio"].rstrip("x")) > 0, m[0]
        assert float(m["attn"]) > 0, (row, peer, m[0])
    # bf16 forward+backward: measured where the CPU has bf16 arithmetic, else a note saying why not
    bf16 = [m for m in lines if m["row"] == "SDPA fwd+bwd bf16"]
    assert len(bf16) == 1, out
    assert float(bf16[0]["attn"]) > 0 if bf16[0]["attn"] != "-" else "not run: " in bf16[0][0], bf16[0][0]
