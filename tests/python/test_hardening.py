"""Hostile and degenerate input from Python and the CLI (issue #13): every case here used to crash, hang,
wrap silently or raise the wrong exception. Each asserts the named attn.AttnError (or the CLI's one line
and exit 2) or the right empty result. The C++ side of the same cases is tests/test_hardening.cpp.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import attn
from test_viz_cli import attn_binary


def z(*shape):
    return np.zeros(shape, np.float32)


# ---- Empty inputs: zero-length L, S and N through every layer, forward and backward ----

@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("L,S,N", [(0, 4, 2), (3, 0, 2), (3, 4, 0), (0, 0, 2)])
def test_mha_empty_lengths_and_batch(batch_first, L, S, N):
    m = attn.MultiheadAttention(8, 2, batch_first=batch_first, seed=1)
    shape = (lambda T: (N, T, 8)) if batch_first else (lambda T: (T, N, 8))
    q, kv = np.ones(shape(L), np.float32), np.ones(shape(S), np.float32)
    y, w = m(q, kv, kv)
    assert y.shape == shape(L) and w.shape == (N, L, S)
    if y.size:  # S = 0: no key to attend to, attention is 0 and the output is out_proj's bias
        np.testing.assert_array_equal(y, np.broadcast_to(m.state_dict()["out_proj.bias"], y.shape))
    dq, dk, dv = m.backward(np.ones_like(y))
    assert dq.shape == shape(L) and dk.shape == shape(S) and dv.shape == shape(S)
    assert not dk.any() or L > 0


@pytest.mark.parametrize("shape", [(2, 0, 8), (0, 3, 8)])
def test_transformer_layers_with_empty_inputs(shape):
    enc = attn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, seed=1)
    y = enc(z(*shape))
    assert y.shape == shape and enc.backward(np.ones_like(y)).shape == shape
    dec = attn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, seed=1)
    mem = z(shape[0], 4, 8)
    y = dec(z(*shape), mem)
    dt, dm = dec.backward(np.ones_like(y))
    assert y.shape == shape and dt.shape == shape and dm.shape == mem.shape
    y = dec(z(2, 3, 8), z(2, 0, 8))  # S = 0 memory
    assert y.shape == (2, 3, 8) and dec.backward(np.ones_like(y))[1].shape == (2, 0, 8)


@pytest.mark.parametrize("q,k,v", [((0, 2, 3, 8), (0, 2, 4, 8), (0, 2, 4, 8)), ((2, 2, 0, 8), (2, 2, 4, 8), (2, 2, 4, 8)),
                                   ((2, 2, 3, 8), (2, 2, 0, 8), (2, 2, 0, 8)), ((2, 2, 3, 8), (2, 2, 4, 8), (2, 2, 4, 0))])
def test_sdpa_empty_dims_forward_and_backward(q, k, v):
    q, k, v = np.ones(q, np.float32), np.ones(k, np.float32), np.ones(v, np.float32)
    out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert out.shape == q.shape[:-1] + v.shape[-1:] and not out.any()
    dq, dk, dv = attn.scaled_dot_product_attention_backward(np.ones_like(out), q, k, v, out, lse)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert not dk.any() and not dv.any()


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_head_dim_zero_is_torchs_mean_of_the_values(is_causal):
    torch = pytest.importorskip("torch")
    q, k = np.ones((2, 3, 4, 0), np.float32), np.ones((2, 3, 5, 0), np.float32)
    v = np.random.default_rng(0).standard_normal((2, 3, 5, 6)).astype(np.float32)
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=is_causal)
    got = attn.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


def test_threads_that_cannot_be_started_are_an_error_not_a_hang():
    # An address-space limit that leaves room for the program but not for 64 thread stacks (8 MB each):
    # set_num_threads used to hang here.
    r = subprocess.run(["prlimit", "--as=400000000", attn_binary(), "info", "--threads", "64"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Expected to start 64 threads, but only " in r.stderr and " could be started" in r.stderr


# ---- Arrays at any alignment: copied once at the boundary (UBSan flagged misaligned float loads) ----

def misaligned(a):
    buf = bytearray(a.nbytes + 1)
    out = np.frombuffer(buf, a.dtype, a.size, 1).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 4 != 0
    return out


def test_misaligned_arrays_give_the_aligned_result():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    mask = rng.standard_normal((5, 5)).astype(np.float32)
    m = attn.MultiheadAttention(8, 2, batch_first=True, seed=1)
    want = m(x, x, x, attn_mask=mask)
    got = m(misaligned(x), misaligned(x), misaligned(x), attn_mask=misaligned(mask))
    np.testing.assert_array_equal(got[0], want[0])
    q = x.reshape(1, 2, 5, 8)
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(misaligned(q), misaligned(q), misaligned(q)),
                                  attn.scaled_dot_product_attention(q, q, q))
    lin = attn.Linear(8, 3, seed=1)
    np.testing.assert_array_equal(lin(misaligned(x)), lin(x))
    sd = lin.state_dict()
    lin.load_state_dict({k: misaligned(v) for k, v in sd.items()})
    np.testing.assert_array_equal(lin(x), want_lin := lin(x))
    # Strides that are not whole float32 elements (6 bytes) were refused; they take the same copy now.
    raw = np.zeros(6 * 8 + 4, np.uint8)
    odd = np.ndarray((8,), np.float32, raw, 1, (6,))
    odd[...] = x[0, 0]
    np.testing.assert_array_equal(lin(odd), lin(x[0, 0]))
    assert want_lin.shape == (2, 5, 3)


# ---- Sizes that can't be allocated: attn.AttnError naming the problem, never a segfault ----

@pytest.mark.parametrize("make,want", [
    (lambda: attn.LayerNorm(2**62), "byte count fits in 64 bits"),
    (lambda: attn.Embedding(2**62, 1), "byte count fits in 64 bits"),
    (lambda: attn.Linear(4, 2**62), "element count fits in 64 bits"),
    (lambda: attn.GPT(vocab_size=2**56), "vocab_size 72057594037927936"),
    (lambda: attn.GPT(vocab_size=10, n_layer=10**8), "n_layer 100000000"),
    (lambda: attn.MultiheadAttention(2**31, 1), "element count fits in 64 bits"),
    (lambda: attn.Trainer(batch=2**60).step(), "training batch 1152921504606846976"),
])
def test_sizes_that_cant_fit_raise_attn_error(make, want):
    with pytest.raises(attn.AttnError, match=want):
        make()


# ---- Files: NUL bytes, FIFOs, edited config.json ----

def test_nul_in_path_is_refused(tmp_path):
    attn.save_safetensors(tmp_path / "one.safetensors", {"a": np.ones(2, np.float32)})
    with pytest.raises(attn.AttnError, match="without NUL bytes"):
        attn.load_safetensors(str(tmp_path / "one.safetensors") + "\x00junk")
    with pytest.raises(attn.AttnError, match="without NUL bytes"):
        attn.save_safetensors(str(tmp_path / "two.safetensors") + "\x00junk", {})


def test_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    code = f"import attn\ntry:\n  attn.load_safetensors({str(tmp_path / 'fifo')!r})\nexcept attn.AttnError as e:\n  print(e)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "a FIFO" in r.stdout, r.stdout + r.stderr


def test_edited_config_raises_attn_error_from_python(tmp_path):
    g = attn.GPT(vocab_size=3, block_size=4, n_layer=1, n_head=1, n_embd=4)
    g.save(str(tmp_path / "ck"), attn.CharTokenizer("abc"))
    cfg = tmp_path / "ck" / "config.json"
    j = json.loads(cfg.read_text())
    j["step"] = "abc"
    cfg.write_text(json.dumps(j))
    with pytest.raises(attn.AttnError, match="edited or is corrupt"):
        attn.GPT.load(str(tmp_path / "ck"))


# ---- The CLI: one line, exit 2, before any work ----

def run_cli(*args, cwd):
    return subprocess.run([attn_binary(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("args,want", [
    (["train", "--batch", "1152921504606846976"], "training batch 1152921504606846976"),
    (["train", "--batch", "1099511627776"], "to fit in the machine's"),
    (["train", "--block", "4611686018427387904"], "to fit in the machine's"),
    (["train", "--steps", "99999999999999999999"], "--steps: Expected an integer in"),
    (["train", "--lr", "nan"], "--lr: Expected a finite number"),
    (["train", "--seed", "-1"], "--seed: Expected an integer in [0,"),
    (["train", "--data", "/dev/zero"], "a character device"),
    (["train", "--data", "fifo"], "a FIFO"),
    (["train", "--out", "afile/sub"], "Not a directory"),
    (["train", "--out", "afile"], "to be a directory, but got a file"),
    (["train", "--out", "/proc/nope/ck"], "/proc/nope"),
    (["train", "--out", "/"], "checkpoint directory name"),
    (["train", "--out", ""], "checkpoint directory name"),
    (["train", "--out", "notckpt"], "notes.txt"),
    (["generate", "--ckpt", "nope", "--temperature", "nan"], "--temperature: Expected a finite number"),
    (["generate", "--ckpt", "nope"], "nope"),
    (["bench", "--lengths", "100000000"], "to fit in the machine's"),
    (["bench", "--lengths", "0"], "--lengths"),
    (["train", "--bogus"], "--bogus"),
])
def test_cli_errors_are_one_line_and_exit_2_before_any_work(tmp_path, args, want):
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "notckpt").mkdir()
    (tmp_path / "notckpt" / "notes.txt").write_text("mine")
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and want in r.stderr, r.stderr
    assert "step 1" not in r.stdout  # refused before training


def test_cli_generate_refuses_an_edited_checkpoint(tmp_path):
    r = run_cli("train", "--steps", "2", "--out", "ck", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = tmp_path / "ck" / "config.json"
    j = json.loads(cfg.read_text())
    j["data"]["task_length"] = "8"
    cfg.write_text(json.dumps(j))
    for args in (["generate", "--ckpt", "ck", "-n", "2"], ["train", "--resume", "--out", "ck", "--steps", "3"]):
        r = run_cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and "edited or is corrupt" in r.stderr, r.stderr
