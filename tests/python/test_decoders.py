"""attn.models' decoders (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Gemma2ForCausalLM, BloomForCausalLM) against transformers on tiny random models that transformers builds and
saves (tests/python/tiny_decoders.py): logits on a batch within a tolerance derived from float64, padded rows,
greedy generation of 50 tokens identical to transformers' generate (eager attention, float32; past the sliding
windows, so the rolling KV caches wrap), eos stopping, and `attn generate --model`. Not the loader's errors on
malformed files (tests/test_hf_decoder.cpp).
"""
import numpy as np
import pytest

import _attn
import attn.models
from cli_bin import run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
import tiny_decoders  # noqa: E402  (needs transformers)

CONFIGS = {
    "gpt2-odd": lambda d: tiny_decoders.gpt2(d, n_embd=72, n_head=3, n_layer=2, vocab_size=211),
    "gpt2-untied-gelu": lambda d: tiny_decoders.gpt2(d, n_embd=48, n_head=4, n_layer=3, vocab_size=101, tie=False,
                                                     n_inner=100, activation_function="gelu", seed=1),
    "llama-gqa": lambda d: tiny_decoders.llama(d, hidden_size=64, heads=4, kv_heads=2, head_dim=16, vocab_size=97),
    "llama-mqa-tied": lambda d: tiny_decoders.llama(d, hidden_size=36, heads=6, kv_heads=1, head_dim=8, layers=3,
                                                    vocab_size=150, intermediate=72, tie=True, rope_theta=500000.0,
                                                    rms_norm_eps=1e-5, seed=2),
    "llama-mha-bias": lambda d: tiny_decoders.llama(d, hidden_size=32, heads=2, kv_heads=2, head_dim=16,
                                                    vocab_size=61, rope_theta=1000.0, attention_bias=True,
                                                    mlp_bias=True, seed=3),
    # every layer a window of 8 keys: the 7-token prompt and 50 new tokens wrap the rolling cache
    "mistral-window": lambda d: tiny_decoders.mistral(d, sliding_window=8, seed=4),
    # q/k/v biases; layers 1 and 2 slide over 6 keys, layer 0 sees everything
    "qwen2-window": lambda d: tiny_decoders.qwen2(d, layers=3, use_sliding_window=True, sliding_window=6,
                                                  max_window_layers=1, seed=5),
    # sliding, global, sliding; scores scaled by 16^-1/2 and both softcaps small enough to bite
    "gemma2-caps": lambda d: tiny_decoders.gemma2(d, initializer_range=0.1, query_pre_attn_scalar=16,
                                                  attn_logit_softcapping=2.0, final_logit_softcapping=3.0, seed=6),
    # 6 heads: ALiBi's slopes past the power of two
    "bloom-alibi": lambda d: tiny_decoders.bloom(d, heads=6, initializer_range=0.1, seed=7),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    ref = CONFIGS[request.param](d)
    ref.config._attn_implementation = "eager"  # transformers' eager attention, float32
    return attn.models.from_pretrained(d), ref, d


def batch(V, B=2, L=23, seed=0):
    return np.random.default_rng(seed).integers(0, V, (B, L))


def test_logits_match_transformers(pair):
    ours, ref, _ = pair
    assert isinstance(ours, attn.models.PretrainedDecoder)
    x = batch(ref.config.vocab_size)
    with torch.no_grad():
        want32 = ref(torch.from_numpy(x)).logits.numpy()
        want64 = ref.double()(torch.from_numpy(x)).logits.numpy()
        ref.float()
    got = ours.forward(x)
    assert got.shape == want32.shape
    # Derived tolerance (docs/ARCHITECTURE.md): attn's error against float64 may be at most 2x that of
    # transformers' own float32 run, plus an atol of 2 float32 ulps of the largest logit.
    err_ref = np.abs(want32 - want64).max()
    err_ours = np.abs(got - want64).max()
    assert err_ours <= 2 * err_ref + 2 * np.spacing(np.float32(np.abs(want64).max())), (err_ours, err_ref)


def test_padded_rows_match_transformers_and_are_zero(pair):
    ours, ref, _ = pair
    x = batch(ref.config.vocab_size, B=3, L=13, seed=1)
    m = np.ones_like(x)
    m[0, 9:] = 0
    m[2, 4:] = 0  # right padding: the kept tokens' positions are 0..n-1 in both libraries
    with torch.no_grad():
        want = ref(torch.from_numpy(x), attention_mask=torch.from_numpy(m)).logits.numpy()
    got = ours.forward(x, attention_mask=m)
    keep = m.astype(bool)
    assert (got[~keep] == 0).all()
    np.testing.assert_allclose(got[keep], want[keep], atol=1e-5)


def test_attention_weights_match_transformers(pair):
    ours, ref, _ = pair
    x = batch(ref.config.vocab_size, B=2, L=9, seed=3)
    with torch.no_grad():
        want = [a.numpy() for a in ref(torch.from_numpy(x), output_attentions=True).attentions]
    got = ours.attention_weights(x)
    assert len(got) == len(want) and got[0].shape == want[0].shape  # (B, H, L, L) per layer
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-6)
        assert (np.triu(g, 1) == 0).all()  # causal


def test_greedy_generation_is_transformers(pair):
    ours, ref, _ = pair
    prompt = [int(t) for t in batch(ref.config.vocab_size, B=1, L=7, seed=2)[0]]
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=50, do_sample=False, min_new_tokens=0)
    want = want[0, len(prompt):].tolist()
    assert len(want) == 50
    assert ours.generate(prompt, max_new_tokens=50) == want
    # a 16-bit KV cache runs the same loop (its rounding may change a near tie, so only the length)
    assert len(ours.generate(prompt, max_new_tokens=50, kv_dtype="bf16")) == 50


def test_generation_stops_after_an_eos_token(pair):
    ours, ref, _ = pair
    prompt = [1, 2, 3]
    free = ours.generate(prompt, max_new_tokens=20)
    assert ours.eos_token_ids == []  # the tiny configs have none: generation runs the full length
    stop = free[5]
    got = ours.generate(prompt, max_new_tokens=20, eos_token_ids=[stop])
    assert got == free[:free.index(stop) + 1]
    sampled = ours.generate(prompt, max_new_tokens=20, temperature=0.9, top_k=5, seed=4)
    assert sampled == ours.generate(prompt, max_new_tokens=20, temperature=0.9, top_k=5, seed=4)
    assert len(sampled) == 20


def test_cli_generate_model_prints_the_greedy_text(pair):
    ours, _, d = pair
    prompt = "the man said"
    ids = ours.tokenizer.encode(prompt)
    new = ours.generate(ids, max_new_tokens=12)
    r = run_cli("generate", "--model", str(d), "--prompt", prompt, "-n", "12", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == ours.tokenizer.decode(ids + new) + "\n"
    assert f"12 tokens after a prompt of {len(ids)} ".encode() in r.stderr
    r = run_cli("generate", "--model", str(d), "--ckpt", str(d))
    assert r.returncode == 2 and b"excludes" in r.stderr


def test_an_encoder_does_not_generate(tmp_path):
    # the loader's message for a directory whose architecture is not a decoder's is the C++ test's; here
    # the Python class: a decoder has generate, and the generate of a non-decoder is refused by name
    d = tmp_path / "g"
    tiny_decoders.gpt2(d, n_embd=16, n_head=2, n_layer=1, vocab_size=64)
    m = attn.models.from_pretrained(d)
    assert m.architecture == "GPT2LMHeadModel" and m.forward(np.zeros((1, 3), np.int64)).shape == (1, 3, 64)
    with pytest.raises(_attn.AttnError, match="prompt of at least one token"):
        m.generate([])
