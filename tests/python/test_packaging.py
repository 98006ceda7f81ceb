"""`pip install .` as a user runs it: the repo built into a fresh venv (scikit-build-core), then attn
imported from outside the repo and each entry point called once: the module, the `attn` command.

Not a test of the numbers (the other files do that). The venv sees .venv's numpy, torch and build tools
through one path line (not .venv's .pth files, so the in-tree attn is invisible), and pip builds without
isolation in build-wheel/, which it keeps: a second run recompiles nothing.
"""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SMOKE = r"""
import sys, numpy as np, attn
assert attn.__file__.startswith(sys.prefix), attn.__file__   # the installed copy, not the repo's
q = np.ones((1, 2, 3, 4), np.float32)
out = attn.scaled_dot_product_attention(q, q, q, is_causal=True)
assert out.shape == (1, 2, 3, 4), out.shape
mha = attn.MultiheadAttention(8, 2, batch_first=True, seed=0)
y, w = mha(np.ones((1, 3, 8), np.float32), np.ones((1, 3, 8), np.float32), np.ones((1, 3, 8), np.float32))
assert y.shape == (1, 3, 8) and w.shape == (1, 3, 3)
import torch, attn.torch
t = torch.ones(1, 2, 3, 4, requires_grad=True)
attn.torch.scaled_dot_product_attention(t, t, t).sum().backward()
assert t.grad.shape == t.shape
print("version", attn.__version__)
"""


def test_pip_install_into_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "dev_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL="2")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-build-isolation",
                        "--no-deps", "--disable-pip-version-check", str(REPO)],
                       capture_output=True, text=True, env=env, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]

    r = subprocess.run([py, "-c", SMOKE], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    version = r.stdout.split()[-1]
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert f"project(attn VERSION {version} " in cmake, version

    exe = venv / "bin" / "attn"  # the CLI comes with the wheel
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"attn {version}", r.stdout + r.stderr
