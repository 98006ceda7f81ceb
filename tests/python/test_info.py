"""attn.info() and `attn info`: the same facts (CPU, SIMD target, GEMM kernel, threads) from Python and
the CLI, the thread count they report follows set_num_threads, and strict=True / --strict pass on a
CPU whose best target runs (the forced-fallback cases are in tests/test_info.cpp)."""
import subprocess

import attn
from test_viz_cli import attn_binary


def test_info_names_the_cpu_target_gemm_and_threads():
    i = attn.info()
    assert i["cpu"] and i["gemm"] and i["simd_target"] in i["simd_compiled"].split()
    assert i["l2"] > i["l1d"] > 0
    assert f"simd      {i['simd_target']}" in i["text"] and f"gemm      {i['gemm']}" in i["text"]
    before = attn.get_num_threads()
    try:
        attn.set_num_threads(3)
        assert attn.info()["threads"] == 3
    finally:
        attn.set_num_threads(before)


def test_strict_passes_without_a_fallback():
    i = attn.info()
    if i["simd_fallback"]:  # a CPU without AVX2: strict must refuse, naming the fallback
        try:
            attn.info(strict=True)
        except attn.AttnError as e:
            assert i["simd_fallback"] in str(e)
        else:
            raise AssertionError("strict=True accepted a fallback")
    else:
        assert attn.info(strict=True)["simd_fallback"] == ""


def test_cli_info_says_what_python_says():
    i = attn.info()
    r = subprocess.run([attn_binary(), "info", "--threads", "3"], capture_output=True, text=True, check=True)
    assert f"simd      {i['simd_target']}" in r.stdout
    assert f"cpu       {i['cpu']}" in r.stdout
    assert "threads   3 " in r.stdout
    r = subprocess.run([attn_binary(), "info", "--strict"], capture_output=True, text=True)
    assert r.returncode == (2 if i["simd_fallback"] else 0), r.stderr
