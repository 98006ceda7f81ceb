"""The README is a test: every ```sh and ```python block runs, in order, as written, in a stand-in for the
repo root (a temp directory where `build/` links to the build being tested and `scripts/` to the repo's;
shell blocks with bash -e, Python blocks with this interpreter, which imports the attn under test), and
writes nothing outside `tour/` (and `out/demo/`, `attn demo`'s views), which git ignores. Not run: the set-up block, whose `make`
commands are what runs this test, ```cpp fragments (examples/quickstart.cpp is the built program), and
an mpirun block when attn was built without MPI.
Links to files of the repo must point at files that exist.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import _attn

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def blocks():
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w+)\n(.*?)^```$", README, re.M | re.S)]


def test_readme_blocks_run_in_order(tmp_path):
    build = Path(os.environ.get("ATTN_BIN") or Path(_attn.__file__).resolve().parent.parent / "attn").parent
    assert (build / "attn").is_file(), f"no attn binary in {build}"
    (tmp_path / "build").symlink_to(build)
    (tmp_path / "scripts").symlink_to(REPO / "scripts")  # scripts/mpirun-local
    env = dict(os.environ, PYTHONUNBUFFERED="1", ATTN_TUNE_FILE=str(tmp_path / "tour" / "tune.json"))  # not the user's
    ran = {"sh": 0, "python": 0}
    for lang, code in blocks():
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
    assert ran["sh"] >= 2 and ran["python"] >= 2, ran
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
