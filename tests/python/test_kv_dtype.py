"""`attn generate --kv-dtype`: a 16-bit KV cache gives the same greedy text as the fp32 one on the
built-in model trained for 100 steps (loss ~0.01) (the reversal task), and a bad dtype is refused by name. The
numerics of the half-precision decode kernel are tests/test_decode_half.cpp's; this is the end to end
check that the option reaches the cache."""
import subprocess

from cli_bin import attn_exe


def test_generate_with_half_kv_cache_gives_the_fp32_greedy_text(tmp_path):
    exe = attn_exe()
    out = str(tmp_path / "ckpt")
    r = subprocess.run([str(exe), "train", "--out", out, "--steps", "100", "--threads", "2", "--eval-every", "0"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    texts = {}
    for dt in ("f32", "f16", "bf16"):
        g = subprocess.run([str(exe), "generate", "--ckpt", out, "--prompt", "qwertyui|", "-n", "30", "--temperature",
                            "0", "--kv-dtype", dt], capture_output=True, text=True)
        assert g.returncode == 0, g.stderr
        texts[dt] = g.stdout
    assert len(texts["f32"].strip()) == 39
    # the trained model reverses its 8 letters (the task), so the text is not one a broken cache also gives
    assert texts["f32"].startswith("qwertyui|iuytrewq"), texts["f32"]
    assert texts["f16"] == texts["f32"]
    assert texts["bf16"] == texts["f32"]
    bad = subprocess.run([str(exe), "generate", "--ckpt", out, "--kv-dtype", "f8"], capture_output=True, text=True)
    assert bad.returncode != 0 and "f8" in bad.stderr
