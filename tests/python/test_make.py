"""The two front doors as a user meets them: `make test` runs and reports both halves (C++ and Python) and
fails if either fails; `make demo` installs the demo set of scripts/install-deps.sh and builds the CLI and
the module only. Run with stand-in commands and dry runs: not a test of the tests, and it builds nothing."""
import re
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
    r = make("-n", "build-demo", "BUILD=/nonexistent-build")
    assert "install-deps.sh demo" in r.stdout and "--target attn _attn" in r.stdout, r.stdout
    assert "-DATTN_BUILD_TESTS=OFF" in r.stdout, r.stdout
    assert re.search(r"^demo: build-demo$", (REPO / "Makefile").read_text(), re.M)
