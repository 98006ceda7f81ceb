"""attn inside transformers (attn.transformers.register(), attn_implementation="attn") on tiny random models of
every architecture attn loads itself (BERT, GPT-2, Llama, Mistral, Qwen2, Gemma 2, BLOOM, T5, BART): outputs on
a padded batch equal to transformers' own "sdpa" (or "eager" where transformers has no sdpa for the model:
Gemma 2's softcap, BLOOM) within fp32 tolerance, greedy generations identical, a training step's gradients
close; and what reaches the kernels: causal, padding, windows, softcaps, ALiBi and T5's table as variants
(attn.torch's keyword arguments), never as a dense (B, H, L, S) mask, GQA without repeated K/V, dropout in
training.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
import tiny_decoders  # noqa: E402  (needs transformers)

import attn.transformers  # noqa: E402

attn.transformers.register()


def bert(d):
    torch.manual_seed(0)
    c = transformers.BertConfig(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=80, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0)
    return tiny_decoders.save(tiny_decoders.jitter_norms(transformers.BertModel(c)), d, 97)


# name: (builder, class, the reference implementation, kind)
ARCHS = {
    "bert": (bert, "BertModel", "sdpa", "encoder"),
    "gpt2": (lambda d: tiny_decoders.gpt2(d, vocab_size=97, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
             "GPT2LMHeadModel", "sdpa", "decoder"),
    "llama": (lambda d: tiny_decoders.llama(d), "LlamaForCausalLM", "sdpa", "decoder"),
    "mistral": (lambda d: tiny_decoders.mistral(d, sliding_window=5), "MistralForCausalLM", "sdpa", "decoder"),
    "qwen2": (lambda d: tiny_decoders.qwen2(d, layers=3, use_sliding_window=True, sliding_window=4,
                                            max_window_layers=1), "Qwen2ForCausalLM", "sdpa", "decoder"),
    "gemma2": (lambda d: tiny_decoders.gemma2(d, sliding_window=4, initializer_range=0.1, query_pre_attn_scalar=16,
                                              attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
               "Gemma2ForCausalLM", "eager", "decoder"),
    "bloom": (lambda d: tiny_decoders.bloom(d, heads=6, initializer_range=0.1), "BloomForCausalLM", "eager",
              "decoder"),
    "t5": (lambda d: tiny_decoders.t5(d, relative_attention_num_buckets=8, relative_attention_max_distance=12,
                                      dropout_rate=0.0), "T5ForConditionalGeneration", "sdpa", "seq2seq"),
    "bart": (lambda d: tiny_decoders.bart(d, dropout=0.0), "BartForConditionalGeneration", "sdpa", "seq2seq"),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def models(request, tmp_path_factory):
    build, cls, ref_impl, kind = ARCHS[request.param]
    d = tmp_path_factory.mktemp(request.param)
    build(d)
    cls = getattr(transformers, cls)
    ours = cls.from_pretrained(d, attn_implementation="attn").eval()
    ref = cls.from_pretrained(d, attn_implementation=ref_impl).eval()
    assert ours.config._attn_implementation == "attn"
    return request.param, kind, ours, ref


class Spy:
    """Records the keyword arguments of every attn.torch call that attn.transformers makes."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = attn.transformers._attn_torch.scaled_dot_product_attention

        def spy(q, k, v, **kw):
            self.calls.append(dict(kw, q=tuple(q.shape), k=tuple(k.shape)))
            return real(q, k, v, **kw)
        monkeypatch.setattr(attn.transformers._attn_torch, "scaled_dot_product_attention", spy)


def inputs(kind, V=97, B=3, L=14, seed=0):
    """ids and a padding mask: left padding for decoders (what generate pads), right for the others."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, V, (B, L), generator=g)
    m = torch.ones_like(x)
    pad = [0, 5, 1][:B]  # tokens of padding per row
    for b, n in enumerate(pad):
        if n and kind == "decoder":
            m[b, :n] = 0
        elif n:
            m[b, L - n:] = 0
    return x, m


def run(kind, model, x, m):
    if kind == "seq2seq":
        y = torch.randint(3, 97, (x.shape[0], 9), generator=torch.Generator().manual_seed(1))
        return model(input_ids=x, attention_mask=m, decoder_input_ids=y).logits, torch.ones_like(y, dtype=torch.bool)
    out = model(input_ids=x, attention_mask=m)
    return (out.logits if kind == "decoder" else out.last_hidden_state), m.bool()


def test_outputs_equal_the_reference_and_variants_reach_the_kernels(models, monkeypatch):
    name, kind, ours, ref = models
    spy = Spy(monkeypatch)
    x, m = inputs(kind)
    with torch.no_grad():
        got, keep = run(kind, ours, x, m)
        want, _ = run(kind, ref, x, m)
    # fp32: the two libraries sum in other orders; |logits| up to ~10 here
    np.testing.assert_allclose(got[keep].numpy(), want[keep].numpy(), atol=2e-5 * max(1.0, want.abs().max().item()))
    assert spy.calls, "attn's kernels did not run"
    for c in spy.calls:
        mask = c.get("attn_mask")
        # no dense (B, H or 1, L, S) mask: padding is documents or a (B, 1, 1, S) key mask
        assert mask is None or mask.shape[2] == 1, (name, mask.shape)
        if c["q"][1] != c["k"][1]:
            assert c["enable_gqa"] and c["k"][1] < c["q"][1]  # K/V heads as they are
    kw = spy.calls[0]
    variants = {
        "mistral": lambda: all(c.get("window") == (4, -1) for c in spy.calls),
        "qwen2": lambda: [c.get("window") for c in spy.calls] == [None, (3, -1), (3, -1)],
        "gemma2": lambda: [c.get("window") for c in spy.calls] == [(3, -1), None, (3, -1)] and
        all(c["softcap"] == 2.0 and abs(c["scale"] - 0.25) < 1e-12 for c in spy.calls),
        "bloom": lambda: kw["alibi_slopes"] is not None and kw["alibi_slopes"].shape == (6,),
        "t5": lambda: all(c.get("relative_bias") is not None for c in spy.calls if c["q"][2] == c["k"][2]),
    }
    assert variants.get(name, lambda: True)(), spy.calls
    if kind == "decoder":  # self-attention with padding at the start of rows: documents, pad tiles skipped
        assert all(c.get("document_ids") is not None and c.get("is_causal") for c in spy.calls)


def test_greedy_generation_is_the_references(models):
    name, kind, ours, ref = models
    if kind == "encoder":
        pytest.skip("an encoder does not generate")
    x, m = inputs(kind, B=2, L=9, seed=2)
    with torch.no_grad():
        got = ours.generate(input_ids=x, attention_mask=m, max_new_tokens=24, do_sample=False, num_beams=1)
        want = ref.generate(input_ids=x, attention_mask=m, max_new_tokens=24, do_sample=False, num_beams=1)
    assert torch.equal(got, want)


def test_training_step_gradients_are_close(models):
    name, kind, ours, ref = models
    x, m = inputs(kind, seed=3)
    grads = []
    for model in (ours, ref):
        model.train()
        model.zero_grad()
        out, keep = run(kind, model, x, m)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
        (out * w)[keep].sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.eval()
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n, g in grads[1].items():
        scale = max(1.0, g.abs().max().item())
        assert (grads[0][n] - g).abs().max().item() <= 1e-4 * scale, n


def test_dropout_in_training_only(tmp_path, monkeypatch):
    d = tmp_path / "llama"
    tiny_decoders.llama(d, attention_dropout=0.5)
    m = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="attn")
    spy = Spy(monkeypatch)
    x = torch.randint(0, 97, (2, 11))
    m.train()
    torch.manual_seed(5)
    a = m(x).logits
    torch.manual_seed(5)
    b = m(x).logits
    torch.manual_seed(6)
    c = m(x).logits
    assert torch.equal(a, b) and not torch.allclose(a, c)  # attn's dropout, seeded from torch's generator
    assert all(call["dropout_p"] == 0.5 for call in spy.calls)
    m.eval()
    with torch.no_grad():
        e = m(x).logits
        want = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="sdpa").eval()(x).logits
    np.testing.assert_allclose(e.numpy(), want.numpy(), atol=1e-5)
    assert spy.calls[-1]["dropout_p"] == 0.0


def test_a_mask_of_another_kind_arrives_complete(tmp_path, monkeypatch):
    # Packed sequences by position_ids (no attention_mask): transformers ands a packing mask onto the causal
    # one; attn receives transformers' own complete mask and gives sdpa's result.
    d = tmp_path / "llama"
    tiny_decoders.llama(d)
    ours = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="attn").eval()
    ref = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="sdpa").eval()
    spy = Spy(monkeypatch)
    x = torch.randint(0, 97, (1, 12))
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    with torch.no_grad():
        # (without a cache: transformers looks for packed sequences only then)
        got = ours(x, position_ids=pos, use_cache=False).logits
        want = ref(x, position_ids=pos, use_cache=False).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    assert spy.calls[0]["attn_mask"].shape == (1, 1, 12, 12) and not spy.calls[0].get("is_causal")
