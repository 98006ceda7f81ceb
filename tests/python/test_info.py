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


def test_forced_caches_change_the_blocking_not_the_bits(tmp_path):
    """ATTN_CPU_CACHES makes this machine block as another CPU would (attn info shows it, and the GEMM's K
    block follows the L1d); a malformed value is named on stderr and ignored; no tuning applies then."""
    env = {"ATTN_TUNE_FILE": str(tmp_path / "none.json"), "PATH": "/usr/bin:/bin"}
    run = lambda extra: subprocess.run([attn_binary(), "info", "--threads", "1"], capture_output=True, text=True,
                                       check=True, env={**env, **extra})
    small, large = run({"ATTN_CPU_CACHES": "l1d=16K,l2=512K"}), run({"ATTN_CPU_CACHES": "l1d=64K,l2=2M"})
    assert "L1d 16 KiB, L2 512 KiB" in small.stdout and "(forced" in small.stdout
    assert "L1d 64 KiB, L2 2048 KiB" in large.stdout
    kc = lambda out: next(ln for ln in out.splitlines() if ln.startswith("gemm")).split("blocked KC ")[1].split()[0]
    assert int(kc(small.stdout)) < int(kc(large.stdout)), (small.stdout, large.stdout)
    assert "derived from the forced caches" in small.stdout
    bad = run({"ATTN_CPU_CACHES": "l1d=lots"})
    assert 'ignoring ATTN_CPU_CACHES="l1d=lots"' in bad.stderr and "(forced" not in bad.stdout


def test_attn_tune_saves_a_choice_that_info_reports(tmp_path):
    f = tmp_path / "tune.json"
    env = {"ATTN_TUNE_FILE": str(f), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([attn_binary(), "tune", "--threads", "1", "--seconds", "0.5"], capture_output=True,
                       text=True, check=True, env=env)
    assert "<- chosen" in r.stdout and f"saved in {f}" in r.stdout
    info = subprocess.run([attn_binary(), "info"], capture_output=True, text=True, check=True, env=env).stdout
    assert "tuning    gemm block " in info and "(measured" in info and "(tuned)" in info
