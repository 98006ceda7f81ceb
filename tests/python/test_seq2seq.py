"""attn.models' encoder-decoders (T5ForConditionalGeneration, BartForConditionalGeneration) against
transformers on tiny random models that transformers builds and saves (tests/python/tiny_decoders.py): the
encoder's states and the teacher-forced logits on a padded batch within a tolerance derived from float64,
greedy translation identical to transformers' generate (eager attention, float32), the three kinds of attention
weights, forced/eos tokens, and `attn generate --model DIR --input TEXT`.
"""
import os
from pathlib import Path

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
    # few buckets and a short max_distance, so that 30-token sequences reach the logarithmic buckets and beyond
    "t5": lambda d: tiny_decoders.t5(d, relative_attention_num_buckets=8, relative_attention_max_distance=12),
    # v1.1: gated-gelu, the output not scaled (num_decoder_layers != num_layers breaks transformers 5.24's own
    # generate: its cache is sized by num_layers)
    "t5-v1.1": lambda d: tiny_decoders.t5(d, feed_forward_proj="gated-gelu", tie_word_embeddings=False, layers=3,
                                          relative_attention_num_buckets=16, seed=1),
    "bart": lambda d: tiny_decoders.bart(d, seed=2),
    "bart-scaled-relu": lambda d: tiny_decoders.bart(d, scale_embedding=True, activation_function="relu", heads=3,
                                                     seed=3),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    ref = CONFIGS[request.param](d)
    ref.set_attn_implementation("eager")  # T5's stacks hold copies of the config: every one of them
    return attn.models.from_pretrained(d), ref, d


def ids(V, B, L, seed):
    return np.random.default_rng(seed).integers(3, V, (B, L))


def source_and_mask(V):
    x = ids(V, 2, 30, 0)
    m = np.ones_like(x)
    m[1, 21:] = 0  # right padding
    return x, m


def test_encoder_states_match_transformers(pair):
    ours, ref, _ = pair
    assert isinstance(ours, attn.models.PretrainedSeq2Seq)
    x, m = source_and_mask(ref.config.vocab_size)
    with torch.no_grad():
        want = ref.get_encoder()(input_ids=torch.from_numpy(x), attention_mask=torch.from_numpy(m)).last_hidden_state
    got = ours.forward(x, attention_mask=m)
    keep = m.astype(bool)
    assert (got[~keep] == 0).all()
    np.testing.assert_allclose(got[keep], want.numpy()[keep], atol=2e-5)


def test_logits_match_transformers(pair):
    ours, ref, _ = pair
    x, m = source_and_mask(ref.config.vocab_size)
    y = ids(ref.config.vocab_size, 2, 17, 1)
    y[:, 0] = ours.decoder_start_token_id
    args = dict(input_ids=torch.from_numpy(x), attention_mask=torch.from_numpy(m),
                decoder_input_ids=torch.from_numpy(y))
    with torch.no_grad():
        want32 = ref(**args).logits.numpy()
        want64 = ref.double()(**args).logits.numpy()
        ref.float()
    got = ours.logits(x, y, attention_mask=m)
    assert got.shape == want32.shape
    # Derived tolerance (docs/ARCHITECTURE.md): attn's error against float64 at most 2x transformers' own
    # float32 error, plus 2 float32 ulps of the largest logit.
    err_ref, err_ours = np.abs(want32 - want64).max(), np.abs(got - want64).max()
    assert err_ours <= 2 * err_ref + 2 * np.spacing(np.float32(np.abs(want64).max())), (err_ours, err_ref)


def test_greedy_translation_is_transformers(pair):
    ours, ref, _ = pair
    src = [int(t) for t in ids(ref.config.vocab_size, 1, 24, 2)[0]]
    with torch.no_grad():
        want = ref.generate(torch.tensor([src]), max_new_tokens=40, do_sample=False, num_beams=1, min_new_tokens=0)
    want = want[0].tolist()
    assert want[0] == ours.decoder_start_token_id and len(want) == 41
    assert ours.generate(src, max_new_tokens=40) == want[1:]
    # a 16-bit self-attention cache runs the same loop (its rounding may change a near tie, so only the length)
    assert len(ours.generate(src, max_new_tokens=40, kv_dtype="bf16")) == 40


def test_attention_weights_match_transformers(pair):
    ours, ref, _ = pair
    src = [int(t) for t in ids(ref.config.vocab_size, 1, 13, 3)[0]]
    tgt = [ours.decoder_start_token_id] + [int(t) for t in ids(ref.config.vocab_size, 1, 8, 4)[0]]
    with torch.no_grad():
        out = ref(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([tgt]), output_attentions=True)
    got = ours.all_attention_weights(src, tgt)
    for name, want in (("encoder", out.encoder_attentions), ("decoder", out.decoder_attentions),
                       ("cross", out.cross_attentions)):
        assert len(got[name]) == len(want), name
        for g, w in zip(got[name], want):
            assert g.shape == tuple(w.shape), name  # (1, H, T or S, S or T)
            np.testing.assert_allclose(g, w.numpy(), atol=1e-6, err_msg=name)
    assert got["cross"][0].shape == (1, ref.config.num_attention_heads if hasattr(ref.config, "num_attention_heads")
                                     else ref.config.num_heads, len(tgt), len(src))
    assert (np.triu(got["decoder"][0][0], 1) == 0).all()  # causal


def test_eos_and_forced_tokens(pair):
    ours, ref, d = pair
    src = [5, 6, 7, 8]
    free = ours.generate(src, max_new_tokens=12)
    assert ours.eos_token_ids == []  # the tiny configs have none: generation runs the full length
    stop = free[4]
    assert ours.generate(src, max_new_tokens=12, eos_token_ids=[stop]) == free[:free.index(stop) + 1]
    # forced_bos/eos_token_id (BART's generation config) as transformers applies them
    ref.generation_config.forced_bos_token_id = 9
    ref.generation_config.forced_eos_token_id = 10
    try:
        with torch.no_grad():
            want = ref.generate(torch.tensor([src]), max_new_tokens=6, do_sample=False, num_beams=1)[0, 1:].tolist()
    finally:
        ref.generation_config.forced_bos_token_id = None
        ref.generation_config.forced_eos_token_id = None
    forced = tmp_copy(d, forced_bos_token_id=9, forced_eos_token_id=10)
    got = attn.models.from_pretrained(forced).generate(src, max_new_tokens=6)
    assert got == want and got[0] == 9 and got[-1] == 10


def tmp_copy(d, **generation):
    """The directory again with generation_config.json's fields set (the safetensors file linked)."""
    import json
    import shutil
    import tempfile
    out = Path(tempfile.mkdtemp())
    for f in Path(d).iterdir():
        if f.suffix == ".safetensors":
            os.symlink(f, out / f.name)
        else:
            shutil.copy(f, out / f.name)
    g = json.loads((out / "generation_config.json").read_text())
    g.update(generation)
    (out / "generation_config.json").write_text(json.dumps(g))
    return out


def test_cli_translates_the_input(pair):
    ours, _, d = pair
    text = "the man said that"
    src = ours.tokenizer.encode(text)
    new = ours.generate(src, max_new_tokens=9)
    r = run_cli("generate", "--model", str(d), "--input", text, "-n", "9", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == ours.tokenizer.decode(new) + "\n"
    assert f"9 tokens after a source of {len(src)} ".encode() in r.stderr
    r = run_cli("generate", "--model", str(d), "--prompt", text)
    assert r.returncode == 2 and b"--input TEXT" in r.stderr


def test_unimplemented_fields_are_refused_by_name(tmp_path):
    import json
    d = tmp_path / "t5"
    tiny_decoders.t5(d, d_model=16, d_kv=4, d_ff=8, layers=1, heads=2, vocab_size=40)
    c = json.loads((d / "config.json").read_text())
    for field, value, name in (("feed_forward_proj", "gated-silu", "gated-silu"), ("is_decoder", True, "is_decoder"),
                               ("relative_attention_bias", 3, '"relative_attention_bias"')):
        (d / "config.json").write_text(json.dumps({**c, field: value}))
        with pytest.raises(_attn.AttnError, match=name):
            attn.models.from_pretrained(d)
    b = tmp_path / "bart"
    tiny_decoders.bart(b, d_model=16, heads=2, layers=1, ffn=8, vocab_size=40)
    c = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**c, "normalize_before": True}))
    with pytest.raises(_attn.AttnError, match="normalize_before"):
        attn.models.from_pretrained(b)


def embedded(page):
    import json
    import re
    m = re.search(r'<script type="application/json" id="attn-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_viz_shows_cross_attention_beside_each_sides_self_attention(tmp_path):
    d = tmp_path / "t5"
    tiny_decoders.t5(d, layers=2)
    m = attn.models.from_pretrained(d)
    text, target = "the man said that", "it was good"
    out = tmp_path / "views"
    r = run_cli("viz", "--model", str(d), "--text", text, "--target", target, "--out", str(out))
    assert r.returncode == 0, r.stderr
    pages = [out / "attention.html", out / "encoder.html", out / "decoder.html"]
    pngs = [out / f"{kind}_layer{l}.png" for kind in ("cross", "encoder", "decoder") for l in range(2)]
    assert r.stdout.decode().split() == [str(p) for p in pages + pngs]
    assert all(p.exists() for p in pages + pngs)
    src = m.tokenizer.encode(text)
    tgt = [m.decoder_start_token_id] + m.tokenizer.encode(target, add_special_tokens=False)
    w = m.all_attention_weights(src, tgt)
    cross = embedded(pages[0].read_text(encoding="utf-8"))
    assert cross["L"] == len(tgt) and cross["S"] == len(src)  # target tokens x source tokens
    assert cross["key_tokens"] == m.tokenizer.tokenize(text) and len(cross["query_tokens"]) == len(tgt)
    assert cross["layer_names"] == ["decoder 0 \u00b7 cross", "decoder 1 \u00b7 cross"]
    assert np.allclose(np.array([h["w"] for h in cross["layers"][1]], np.float32), w["cross"][1][0])
    enc = embedded(pages[1].read_text(encoding="utf-8"))
    assert enc["L"] == enc["S"] == len(src)
    assert np.allclose(np.array([h["w"] for h in enc["layers"][0]], np.float32), w["encoder"][0][0])
    assert 'href="encoder.html"' in pages[0].read_text(encoding="utf-8")


def test_viz_names_the_window_of_a_sliding_layer(tmp_path):
    d = tmp_path / "gemma2"
    tiny_decoders.gemma2(d, sliding_window=3, layers=2)
    r = run_cli("viz", "--model", str(d), "--text", "the man said that it was good", "--out", str(tmp_path / "v"))
    assert r.returncode == 0, r.stderr
    data = embedded((tmp_path / "v" / "attention.html").read_text(encoding="utf-8"))
    assert data["layer_names"] == ["layer 0 \u00b7 window 3", "layer 1"], data.get("layer_names")
    w = np.array([h["w"] for h in data["layers"][0]])  # (H, T, T): 0 outside the window of 3 keys
    T = w.shape[1]
    assert (w[:, np.tril_indices(T, -3)[0], np.tril_indices(T, -3)[1]] == 0).all() and (w[:, -1, -3:] > 0).all()
