"""The README is a test: every ```sh and ```python block runs, in order, as written, in a stand-in for the
repo root (a temp directory where `build/` links to the build being tested and `scripts/` to the repo's;
shell blocks with bash -e, Python blocks with this interpreter, which imports the attn under test), and
writes nothing outside `tour/` (and `out/demo/`, `attn demo`'s views), which git ignores. Not run: the set-up
block, whose `make`
commands are what runs this test, the ```cpp program (examples/quickstart.cpp, built as a program), and
an mpirun block when attn was built without MPI.
The numbers the README quotes (QUOTES: a greedy sample, the learning rate of a resumed run, the tokens and the
cosine similarity of MiniLM, an array's shape) must be what its tour printed. The ```cpp block is a whole
program: examples/quickstart.cpp, which the build compiles and tests/install_test.sh builds against the
installed package.
Links to files of the repo must point at files that exist.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import _attn
from cli_bin import attn_exe

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def blocks():
    return [(m.group(1), m.group(2), m.start()) for m in re.finditer(r"^```(\w+)\n(.*?)^```$", README, re.M | re.S)]


def same_digits(quoted, printed):
    """Whether `printed` (a number) rounds to `quoted` (the README's text) at the README's precision."""
    mantissa = re.match(r"-?\d+(?:\.(\d+))?", quoted)
    digits = len(mantissa.group(1) or "")
    if "e" in quoted.lower():
        return float(f"{float(printed):.{digits}e}") == float(quoted)
    return round(float(printed), digits) == float(quoted)


def resumed_lr(groups, out, tour):
    before, step, after, step1 = groups
    m = re.search(r"the learning rate goes from (\S+) at step (\d+) to (\S+) at step (\d+)", out)
    assert m, f"the resumed run printed no learning-rate line:\n{out[-2000:]}"
    assert (m.group(2), m.group(4)) == (step, step1), (m.groups(), groups)
    return same_digits(before, m.group(1)) and same_digits(after, m.group(3))


def off_diagonal(groups, out, tour):
    numbers = re.findall(r"\d+\.\d+(?:e[-+]?\d+)?", out)  # the printed 2 x 2 matrix: 1, s, s, 1
    return len(numbers) == 4 and same_digits(groups[0], numbers[1]) and same_digits(groups[0], numbers[2])


def npy_shape(groups, out, tour):
    import numpy as np
    a = np.load(tour / "emb.npy")
    return a.shape == tuple(int(g) for g in groups) and a.dtype == np.float32


# Each number the README quotes: a pattern of README.md (its groups: the quote) and whether it holds, given the
# groups, the output of the block the quote is in or follows, and the tour/ folder.
QUOTES = [
    (r'--prompt "sunlight\|" -n 8 --temperature 0 +# (\S+)', lambda g, out, tour: g[0] in out.split()),
    (r"\((\S+) at step (\d+) here, (\S+) at (\d+)\)", resumed_lr),
    (r"tour/emb\.npy +# \((\d+), (\d+)\) float32", npy_shape),
    (r'tokenize\("Attention, please!"\)\) +# (\[.*?\])\n', lambda g, out, tour: g[0] in out),
    (r"# cosine similarity (\S+) off the diagonal", off_diagonal),
]


def test_readme_blocks_run_in_order(tmp_path):
    build = attn_exe().parent
    assert (build / "attn").is_file(), f"no attn binary in {build}"
    (tmp_path / "build").symlink_to(build)
    (tmp_path / "scripts").symlink_to(REPO / "scripts")  # scripts/mpirun-local
    env = dict(os.environ, PYTHONUNBUFFERED="1", ATTN_TUNE_FILE=str(tmp_path / "tour" / "tune.json"))  # not the user's
    ran = {"sh": 0, "python": 0}
    outputs = []  # (where the block starts in README.md, its stdout)
    for lang, code, start in blocks():
        if lang == "sh" and re.search(r"^make ", code, re.M):
            continue  # the set-up block
        if lang not in ran:
            continue
        if "mpirun" in code and not getattr(_attn, "HAVE_MPI", False):
            continue  # data-parallel training: attn was built without MPI
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, f"README {lang} block failed:\n{code}\n--- stdout\n{r.stdout[-3000:]}\n" \
                                  f"--- stderr\n{r.stderr[-3000:]}"
        ran[lang] += 1
        outputs.append((start, r.stdout))
    assert ran["sh"] >= 2 and ran["python"] >= 2, ran
    for pattern, holds in QUOTES:
        m = re.search(pattern, README)
        assert m, f"README.md no longer quotes {pattern}: update QUOTES"
        out = [o for start, o in outputs if start < m.start()][-1]
        assert holds(m.groups(), out, tmp_path / "tour"), f"README.md says {m.group(0)!r}, but the tour printed:\n" \
                                                          f"{out[-3000:]}"
    for f in ("views/attention.html", "views.html", "gpt.html", "mha.safetensors", "rev/config.json"):
        assert (tmp_path / "tour" / f).is_file(), f"the README's tour did not write tour/{f}"
    outside = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("build", "scripts", "tour", "out"))
    outside += sorted(f"out/{p.name}" for p in (tmp_path / "out").iterdir() if p.name != "demo")
    assert not outside, f"the README's tour wrote {outside} outside tour/ and out/demo/ (into the checkout)"
    for f in ("tour/rev/config.json", "out/demo/attention.html"):
        ignored = subprocess.run(["git", "check-ignore", "-q", f], cwd=REPO)
        assert ignored.returncode == 0, f"{f} is not git-ignored"


def test_readme_links_exist():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" not in target:
            assert (REPO / target).exists(), f"README links {target}, which is not in the repo"
    for path in re.findall(r"`((?:examples|tests|docs|include|python)/[\w./]+)`", README):
        assert (REPO / path).exists(), f"README names {path}, which is not in the repo"


def test_readme_cpp_is_the_quickstart_program():
    cpp = [code for lang, code, _ in blocks() if lang == "cpp"]
    assert cpp == [(REPO / "examples/quickstart.cpp").read_text()], "the README's C++ is examples/quickstart.cpp"
