"""The GPT layer against PyTorch 2.13: AdamW steps against torch.optim.AdamW on the same gradients, the
GPT's logits and every parameter gradient against an independent torch re-implementation (float64) with
copied weights; the Python API (training step, save/load, generation); and the CLI (Ctrl-C saves a
checkpoint that --resume continues; generate reads it).
"""
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import _attn
import attn

torch.set_num_threads(1)
attn.set_num_threads(1)


# ---- AdamW ----

def test_adamw_matches_torch_adamw():
    rng = np.random.default_rng(0)
    shapes = {"w": (37, 19), "emb": (5, 3, 2), "bias": (19,), "tiny": (64,)}
    no_decay = ["bias", "tiny"]
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    ours = attn.AdamW(params, lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, no_decay=no_decay)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    theirs = torch.optim.AdamW([{"params": [tp[k] for k in shapes if k not in no_decay], "weight_decay": 0.1},
                                {"params": [tp[k] for k in no_decay], "weight_decay": 0.0}],
                               lr=3e-3, betas=(0.9, 0.99), eps=1e-8)
    for step in range(30):
        lr = 3e-3 * (0.55 + 0.45 * np.cos(np.pi * step / 30))  # a schedule: lr changes every step
        grads = {k: (rng.standard_normal(s) * 10.0 ** rng.uniform(-3, 1)).astype(np.float32)
                 for k, s in shapes.items()}
        # Gradients of ~1e-9: sqrt(v̂) is then comparable to eps, so eps added after the bias correction
        # (torch's placement) and any other placement give visibly different updates.
        grads["tiny"] = (rng.standard_normal(64) * 1e-9).astype(np.float32)
        for k in shapes:
            tp[k].grad = torch.from_numpy(grads[k].copy())
        for g in theirs.param_groups:
            g["lr"] = lr
        theirs.step()
        ours.step(grads, lr=lr)
        got, state = ours.params, ours.state()
        for k in shapes:
            want = tp[k].detach().numpy()
            # Same float32 operations in the same order; torch's CPU kernels fuse lerp/addcmul into FMAs
            # and its vectorised sqrt is not correctly rounded (±1 ulp), so each step may differ by a few
            # ulps of the parameter plus a few ulps of the update (<= lr·|m̂/denom| ~ 1e-2, ulp ~1e-9),
            # accumulating over 30 steps: 64 ulps of the parameter + 1e-8. A wrong eps placement or bias
            # correction moves parameters by ~lr = 3e-3.
            np.testing.assert_array_less(np.abs(got[k] - want), 64 * np.spacing(np.abs(want)) + 1e-8,
                                         err_msg=f"{k} step {step}")
            for name in ("exp_avg", "exp_avg_sq"):
                # FMA or not, the moments agree to an ulp of their terms; where the average cancels to near
                # 0 that is relative to the tensor's scale, not to the entry.
                t = theirs.state[tp[k]][name].numpy()
                np.testing.assert_allclose(state[f"{name}.{k}"], t, rtol=1e-5, atol=1e-6 * np.abs(t).max(),
                                           err_msg=f"{name} {k}")
    assert ours.steps == 30


# ---- GPT vs a torch re-implementation ----

def torch_gpt(sd, cfg, idx, targets):
    """nanoGPT's forward written from the equations in float64, on our state_dict names; loss and logits."""
    V, E, H = cfg["vocab_size"], cfg["n_embd"], cfg["n_head"]
    Hkv, D = cfg["n_kv_head"], E // H
    B, T = idx.shape
    w = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in sd.items()}
    g = w.get
    x = g("transformer.wte.weight")[torch.from_numpy(idx)] + g("transformer.wpe.weight")[:T]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (E,), g(p + "norm1.weight"), g(p + "norm1.bias"), 1e-5)
        if p + "self_attn.in_proj_weight" in w:
            wq, wk, wv = g(p + "self_attn.in_proj_weight").split([E, Hkv * D, Hkv * D])
        else:
            wq, wk, wv = (g(p + f"self_attn.{n}_proj_weight") for n in "qkv")
        bq = bk = bv = None
        if p + "self_attn.in_proj_bias" in w:
            bq, bk, bv = g(p + "self_attn.in_proj_bias").split([E, Hkv * D, Hkv * D])
        q = F.linear(h, wq, bq).view(B, T, H, D).transpose(1, 2)
        k = F.linear(h, wk, bk).view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        v = F.linear(h, wv, bv).view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, E)
        x = x + F.linear(a, g(p + "self_attn.out_proj.weight"), g(p + "self_attn.out_proj.bias"))
        h = F.layer_norm(x, (E,), g(p + "norm2.weight"), g(p + "norm2.bias"), 1e-5)
        h = F.gelu(F.linear(h, g(p + "linear1.weight"), g(p + "linear1.bias")))
        x = x + F.linear(h, g(p + "linear2.weight"), g(p + "linear2.bias"))
    x = F.layer_norm(x, (E,), g("transformer.ln_f.weight"), g("transformer.ln_f.bias"), 1e-5)
    logits = x @ (g("lm_head.weight") if "lm_head.weight" in w else g("transformer.wte.weight")).T
    loss = F.cross_entropy(logits.view(-1, V), torch.from_numpy(targets).view(-1), ignore_index=-1)
    loss.backward()
    return loss.item(), logits.detach().numpy(), {k: t.grad.numpy() for k, t in w.items()}


@pytest.mark.parametrize("tie,bias,kv", [(True, True, 4), (False, False, 2), (True, True, 1)])
def test_gpt_logits_and_gradients_match_torch(tie, bias, kv):
    model = attn.GPT(vocab_size=13, block_size=16, n_layer=2, n_head=4, n_kv_head=kv, n_embd=32, bias=bias,
                     tie_weights=tie, seed=5)
    rng = np.random.default_rng(1)
    sd = model.state_dict()
    for k in sd:  # nonzero biases and LayerNorm affines, so their gradients and uses are all exercised
        if sd[k].ndim == 1:
            sd[k] = (sd[k] + 0.1 * rng.standard_normal(sd[k].shape)).astype(np.float32)
    model.load_state_dict(sd)
    B, T = 3, 11
    idx = rng.integers(0, 13, (B, T))
    targets = rng.integers(0, 13, (B, T))
    targets[0, :3] = -1
    logits = model.forward(idx)
    model.zero_grad()
    loss = model.forward_backward(idx, targets)
    grads = model.grads()
    want_loss, want_logits, want_grads = torch_gpt(sd, model.config, idx, targets)
    assert set(grads) == set(want_grads)
    # float32 against float64 through two blocks of width 32: relative rounding ~1e-6 per op; logits of
    # size ~1 stay within 1e-4 and gradients within 1e-3 of their largest entry.
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-4)
    assert abs(loss - want_loss) < 1e-5
    for k, g in grads.items():
        scale = np.abs(want_grads[k]).max()
        assert np.abs(g - want_grads[k]).max() <= 1e-3 * scale + 1e-7, k


# ---- The Python API ----

def test_training_step_save_load_and_generate(tmp_path):
    text = "hello world, h\u00e9llo w\u00f6rld \U0001F642\n" * 40
    t = attn.Trainer(text=text, config="tiny", block_size=16, batch=4, steps=30, warmup=2, lr=3e-3, threads=1,
                     eval_iters=2)
    losses = [t.step()["loss"] for _ in range(30)]
    assert np.mean(losses[-5:]) < losses[0] - 0.5  # a repetitive text is learned quickly
    t.save(str(tmp_path / "ck"))
    model, tok = attn.GPT.load(str(tmp_path / "ck"))
    assert tok.vocab == t.tokenizer.vocab
    for k, v in t.model.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[k], v)
    prompt = tok.encode("hello")
    a = model.generate(prompt, 20, temperature=0.8, top_k=5, seed=3)
    assert a == model.generate(prompt, 20, temperature=0.8, top_k=5, seed=3) and len(a) == 20
    # the library's one sampling default (attn/sampling.h): greedy, whatever the seed; the CLI samples on purpose
    assert model.generate(prompt, 20) == model.generate(prompt, 20, temperature=0) == \
        model.generate(prompt, 20, seed=5)
    model.save(str(tmp_path / "model"), tok)
    again, _ = attn.GPT.load(str(tmp_path / "model"))
    assert again.generate(prompt, 20, temperature=0.8, top_k=5, seed=3) == a
    with pytest.raises(attn.AttnError, match="text given in memory"):
        attn.Trainer.resume(str(tmp_path / "ck"))
    resumed = attn.Trainer.resume(str(tmp_path / "ck"), steps=32, text=text)
    assert resumed.step_count == 30 and resumed.options.steps == 32
    with pytest.raises(attn.AttnError, match="the data the checkpoint was trained on"):
        attn.Trainer.resume(str(tmp_path / "ck"), text=text + "!")
    with pytest.raises(attn.AttnError, match="TrainOptions field"):
        attn.Trainer(text=text, learning_rate=1.0)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc\xffdef")
    with pytest.raises(attn.AttnError, match="byte offset 3"):
        attn.Trainer(data=str(bad))


# ---- The CLI ----

def attn_binary():
    exe = Path(_attn.__file__).resolve().parent.parent / "attn"  # build-*/python/_attn*.so -> build-*/attn
    if not exe.is_file():
        pytest.skip(f"no attn binary next to {_attn.__file__}")
    return str(exe)


def test_cli_ctrl_c_saves_a_checkpoint_that_resume_continues(tmp_path):
    exe, out = attn_binary(), str(tmp_path / "ck")
    p = subprocess.Popen([exe, "train", "--out", out, "--steps", "100000", "--threads", "1", "--log-every", "1",
                          "--eval-every", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:  # plain lines, not a progress bar: stdout is a pipe
        if line.startswith("step 3/"):
            break
    p.send_signal(signal.SIGINT)
    rest = p.stdout.read()
    assert p.wait(timeout=60) == 130, rest
    assert "checkpoint saved" in rest
    model, tok = attn.GPT.load(out)
    step = int(rest.split("interrupted at step ")[1].split(":")[0])
    assert step >= 3
    with pytest.raises(attn.AttnError, match="holding a checkpoint"):
        raise attn.AttnError(subprocess.run([exe, "train", "--out", out], capture_output=True, text=True).stderr)
    r = subprocess.run([exe, "train", "--out", out, "--resume", "--steps", str(step + 2), "--threads", "1",
                        "--log-every", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # The same as a run never interrupted (same schedule: the interrupted run decays over 100000 steps).
    u = subprocess.run([exe, "train", "--out", str(tmp_path / "whole"), "--steps", str(step + 2), "--lr-decay-steps",
                        "100000", "--threads", "1", "--log-every", "1", "--eval-every", "0"],
                       capture_output=True, text=True)
    losses = [[line.split("  lr")[0] for line in run.stdout.splitlines()
               if line.startswith("step ") and "/" in line.split()[1]
               and int(line.split()[1].split("/")[0]) > step] for run in (r, u)]
    assert len(losses[0]) == 2 and losses[0] == losses[1], (losses, r.stdout, u.stdout)
    r = subprocess.run([exe, "train", "--out", out, "--resume", "--lr", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--lr" in r.stderr
    g = subprocess.run([exe, "generate", "--ckpt", out, "--prompt", "abcd|", "-n", "4", "--temperature", "0"],
                       capture_output=True, text=True)
    assert g.returncode == 0, g.stderr
    assert g.stdout.startswith("abcd|") and len(g.stdout.strip()) == 9
