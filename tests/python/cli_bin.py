"""The `attn` command the CLI tests run: $ATTN_BIN, or the `attn` of the build dir the _attn module comes from
(build-*/python/_attn*.so -> build-*/attn). Shared by the test files that run the binary."""
import os
import subprocess
from pathlib import Path

import _attn


def attn_exe():
    """The path of the attn binary (whether it exists is the caller's to check)."""
    return Path(os.environ.get("ATTN_BIN") or Path(_attn.__file__).resolve().parent.parent / "attn")


def run_cli(*args, **kw):
    """`attn *args`, stdout and stderr captured (bytes unless kw says text=True), at most 300 s; kw (input=...,
    text=...) go to subprocess.run."""
    return subprocess.run([str(attn_exe()), *args], capture_output=True, timeout=300, **kw)
