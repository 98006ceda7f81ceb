"""Hostile and degenerate input from Python and the CLI (issue #13): every case here used to crash, hang,
wrap silently or raise the wrong exception. Each asserts the named attn.AttnError (or the CLI's one line
and exit 2) or the right empty result. The C++ side of the same cases is tests/test_hardening.cpp.
"""
import json
import os
import signal
import subprocess
import sys
import threading

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


@pytest.mark.parametrize("q,k,v", [((0, 2, 3, 8), (0, 2, 4, 8), (0, 2, 4, 8)),
                                   ((2, 2, 0, 8), (2, 2, 4, 8), (2, 2, 4, 8)),
                                   ((2, 2, 3, 8), (2, 2, 0, 8), (2, 2, 0, 8)),
                                   ((2, 2, 3, 8), (2, 2, 4, 8), (2, 2, 4, 0))])
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
    code = (f"import attn\ntry:\n  attn.load_safetensors({str(tmp_path / 'fifo')!r})\n"
            "except attn.AttnError as e:\n  print(e)")
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


# ---- Issue 23: one --out, one writer; signals that save ----

def start_train(out, cwd, *args):
    """`attn train` on the reversal task, long enough to be stopped, its stdout drained into p.lines by a
    thread (a full pipe would block it); returns once its first step is done."""
    p = subprocess.Popen([attn_binary(), "train", "--out", str(out), "--steps", "1000000", "--eval-every", "0",
                          "--log-every", "1", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    p.lines, first_step = [], threading.Event()

    def drain():
        for line in p.stdout:
            p.lines.append(line)
            if line.startswith("step "):
                first_step.set()
        first_step.set()

    p.reader = threading.Thread(target=drain, daemon=True)
    p.reader.start()
    first_step.wait(timeout=120)
    if p.poll() is not None:
        pytest.fail(f"attn train ended before its first step: {p.returncode} {p.stderr.read()}")
    return p


def stop(p, sig):
    """Sends sig, waits; returns (exit code, stdout, stderr)."""
    p.send_signal(sig)
    rc = p.wait(timeout=120)
    p.reader.join(timeout=60)
    return rc, "".join(p.lines), p.stderr.read()


def test_a_second_trainer_on_one_out_is_refused_naming_the_first(tmp_path):
    # Two trainers on one --out both exited 0, one silently overwriting the other's checkpoints.
    first = start_train("cr", tmp_path)
    try:
        for args in (["--steps", "5"], ["--resume", "--steps", "5"]):
            r = run_cli("train", "--out", "cr", *args, cwd=tmp_path)
            assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
            assert f"but got process {first.pid} holding its lock" in r.stderr, r.stderr
        with pytest.raises(attn.AttnError, match=f"process {first.pid} holding its lock"):
            attn.Trainer(steps=1).save(str(tmp_path / "cr"))  # the library's saves take the same lock
    finally:
        stop(first, signal.SIGKILL)  # kill -9: the kernel releases the flock
    r = run_cli("train", "--out", "cr", "--steps", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path) == ["cr"]  # the lock file kill -9 left was taken over, then removed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_save_as_ctrl_c_does(tmp_path, sig):
    # Only SIGINT saved: docker stop, systemd and Slurm (SIGTERM) and a closed terminal (SIGHUP) lost the run.
    rc, out, err = stop(start_train("ck", tmp_path), sig)
    assert rc == 128 + sig, (rc, out[-2000:], err)
    assert "checkpoint saved in ck" in out and sig.name in out, out
    step = json.loads((tmp_path / "ck" / "config.json").read_text())["step"]
    assert step >= 1
    r = run_cli("train", "--out", "ck", "--resume", "--steps", str(step + 2), cwd=tmp_path)
    assert r.returncode == 0 and f"step {step + 2}/{step + 2}" in r.stdout, r.stderr


# ---- Issue 23: objects shared across Python threads ----

# Runs in a child interpreter: a crash there (it was SIGSEGV or "double free" 10/10) is this test's failure,
# not the end of the test session.
SHARED_OBJECTS = r"""
import threading, numpy as np, attn
rng = np.random.default_rng(0)
V, T = 11, 16
g = attn.GPT(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=32, dropout=0.0, seed=1)
xs = [rng.integers(0, V, (2, T)) for _ in range(8)]
ys = [rng.integers(0, V, (2, T)) for _ in range(8)]
rounds = 4
want_loss = [g.forward_backward(x, y) for x, y in zip(xs, ys)]
want_logits = [g.forward(x) for x in xs]  # training mode: forward saves activations too
g.zero_grad()
for _ in range(rounds):
    for x, y in zip(xs, ys):
        g.forward_backward(x, y)
want_grads = g.grads()
g.zero_grad()
m = attn.MultiheadAttention(16, 4, batch_first=True, seed=2)
q = rng.standard_normal((2, 5, 16)).astype(np.float32)
dy = rng.standard_normal((2, 5, 16)).astype(np.float32)
m(q, q, q)
want_dq = m.backward(dy)
got, errors = {}, []
def work(i):
    try:
        for r in range(rounds):
            got[("loss", i, r)] = g.forward_backward(xs[i], ys[i])
            got[("logits", i, r)] = g.forward(xs[i])
            m(q, q, q)  # same input everywhere: whichever forward came last, the backward is the same
            got[("dq", i, r)] = m.backward(dy)
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
assert not errors, errors
bad = 0
for i in range(8):
    for r in range(rounds):
        bad += got[("loss", i, r)] != want_loss[i]
        bad += not np.array_equal(got[("logits", i, r)], want_logits[i])
        bad += not all(np.array_equal(a, b) for a, b in zip(got[("dq", i, r)], want_dq))
assert bad == 0, f"{bad} results differ from the serial ones"
# The gradients are sums over the same calls in another order: equal up to rounding.
for k, v in g.grads().items():
    np.testing.assert_allclose(v, want_grads[k], rtol=1e-4, atol=1e-6, err_msg=k)
print("ok")
"""


def test_objects_shared_by_8_threads_give_the_serial_results():
    r = subprocess.run([sys.executable, "-c", SHARED_OBJECTS], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-3000:])


def test_docstrings_say_shared_objects_are_locked():
    for cls in (attn.MultiheadAttention, attn.TransformerEncoderLayer, attn.GPT, attn.Trainer, attn.AdamW):
        assert "per-object lock" in (cls.__doc__ or ""), cls


# ---- Issue 23: allocations that fail are MemoryError, never a null store ----

HUGE_KV = r"""
import numpy as np, attn
kv = np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), shape=(1, 1, 2**40, 8), strides=(0, 0, 0, 4))
for L in (1, 64):
    try:
        attn.scaled_dot_product_attention(np.zeros((1, 1, L, 8), np.float32), kv, kv)
        print("no error", L)
    except MemoryError as e:
        print("MemoryError", L, e)
"""


def test_a_huge_zero_stride_kv_is_a_memory_error_not_a_segfault():
    r = subprocess.run([sys.executable, "-c", HUGE_KV], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-3000:])
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(l.startswith("MemoryError") and "Expected to allocate" in l for l in lines), r.stdout


# ---- Issue 23: counts bounded by name (CLI, Python, config.json is tests/test_hardening.cpp's) ----

@pytest.mark.parametrize("args,want", [
    (["--eval-iters", "4611686018427387905"], "eval_iters <= 1000000"),
    (["--warmup", "9223372036854775807"], "warmup <= 1099511627776"),
    (["--eval-every", "9223372036854775807"], "eval_every <= 1099511627776"),
    (["--steps", "9223372036854775807"], "steps <= 1099511627776"),
])
def test_cli_counts_past_their_bound_are_refused_by_name(tmp_path, args, want):
    r = run_cli("train", *args, cwd=tmp_path)
    assert r.returncode == 2 and want in r.stderr, (r.returncode, r.stderr)


def test_python_counts_past_their_bound_are_refused_by_name():
    with pytest.raises(attn.AttnError, match="eval_iters <= 1000000"):
        attn.Trainer(eval_iters=4611686018427387905)
    with pytest.raises(attn.AttnError, match="warmup <= "):
        attn.Trainer(warmup=2**63 - 1)


# ---- Issue 23: Python edges ----

def tiny_gpt():
    return attn.GPT(vocab_size=5, block_size=8, n_layer=1, n_head=1, n_embd=8, seed=1)


def test_generate_refuses_a_nan_temperature():
    # NaN compared false everywhere and sampled token 0 every time ('aaaaaaaa'); the CLI refused it already.
    with pytest.raises(attn.AttnError, match="finite temperature"):
        tiny_gpt().generate([1], 8, temperature=float("nan"))


@pytest.mark.parametrize("ids", [np.array([[1.5]]), [[1.0, 2.0]], np.array([[True]])])
def test_token_ids_must_be_integers(ids):
    with pytest.raises(attn.AttnError, match="integer dtype"):
        tiny_gpt().forward(ids)  # 1.5 was truncated to 1 silently


def test_layers_refuse_integer_input_as_sdpa_does():
    m = attn.MultiheadAttention(8, 2, batch_first=True, seed=1)
    x = np.ones((2, 3, 8), np.int32)
    with pytest.raises(attn.AttnError, match="of a floating dtype, but got int32"):
        m(x, x, x)
    with pytest.raises(attn.AttnError, match="of a floating dtype"):
        attn.Linear(8, 2)(x)


def test_torch_double_backward_says_it_is_not_supported():
    torch = pytest.importorskip("torch")
    import attn.torch as at
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    for loss in (lambda o: o.sum(), lambda o: (o * o).sum()):  # the second: torch's "Can't call numpy() ..."
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(loss(at.scaled_dot_product_attention(q, k, v)), q, create_graph=True)
    m = at.MultiheadAttention(4, 2, batch_first=True)
    x = torch.randn(1, 3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(m(x, x, x)[0].sum(), x, create_graph=True)


# ---- Issue 23: messages ----

def test_a_text_one_token_too_short_is_refused_saying_what_is_enough():
    with pytest.raises(attn.AttnError, match=r"at least block_size \+ 1 = 17 characters in the val split"):
        attn.Trainer(text="ab" * 80, block_size=16)  # val split 16: 17 is enough
    attn.Trainer(text="ab" * 85, block_size=16)  # val split 17


def test_zero_heads_say_so():
    q = np.ones((1, 0, 2, 4), np.float32)
    with pytest.raises(attn.AttnError, match=r"at least one head \(Hkv >= 1\)"):
        attn.scaled_dot_product_attention(q, q, q)


def test_a_tensor_name_utf8_cant_hold_is_an_attn_error(tmp_path):
    for call in (lambda: attn.save_safetensors(tmp_path / "a.safetensors", {"\udcff": np.ones(1, np.float32)}),
                 lambda: attn.save_safetensors(tmp_path / "b.safetensors", {}, metadata={"k": "\udcff"}),
                 lambda: attn.Linear(2, 2).load_state_dict({"\udcff": np.ones(1, np.float32)})):
        with pytest.raises(attn.AttnError, match="UTF-8 can encode"):
            call()


@pytest.mark.parametrize("args,want", [
    (["train", "--block", "100000000"], "block_size 100000000"),  # said "batch 32 x block 16"
    (["viz", "--builtin", "--png-max-px", "1"], "--png-max-px"),  # said "options.max_px >= 16"
])
def test_cli_messages_name_what_the_user_gave(tmp_path, args, want):
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and want in r.stderr, (r.returncode, r.stderr)


def test_a_default_thread_count_that_cant_start_leaves_set_num_threads_working():
    # ATTN_NUM_THREADS beyond what the address space allows made every call fail, set_num_threads(1) too.
    code = ("import numpy as np, attn\n"
            "q = np.ones((1, 1, 64, 8), np.float32)\n"
            "try:\n    attn.scaled_dot_product_attention(q, q, q)\n"
            "except attn.AttnError as e:\n    print('refused:', e)\n"
            "attn.set_num_threads(1)\n"
            "print('ok', attn.scaled_dot_product_attention(q, q, q).shape)\n")
    env = dict(os.environ, ATTN_NUM_THREADS="64")
    r = subprocess.run(["prlimit", "--as=450000000", sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and "ok (1, 1, 64, 8)" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "refused: Expected to start 64 threads" in r.stdout and "ATTN_NUM_THREADS" in r.stdout, r.stdout
