"""Hostile model directories (issue 36): tiny GPT-2, Llama and BERT directories written by transformers
(save_pretrained, tests/python/tiny_decoders.py), then mutated as a careless or hostile user would. Each
mutation is exit 2 from the CLI and attn.AttnError from Python, naming the field and the file: never a
crash (it killed the interpreter), a hang or gigabytes. Also what a user of such a directory meets in
`attn embed` and `attn generate`, and attn.models' argument checks. The same mutations on files written
in C++: tests/test_hf.cpp, tests/test_hf_decoder.cpp.
"""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import attn
import attn.models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
import tiny_decoders  # noqa: E402  (needs transformers)
from test_viz_cli import attn_binary  # noqa: E402


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """The unmutated directories, written once; each test mutates a copy."""
    root = tmp_path_factory.mktemp("originals")
    tiny_decoders.gpt2(root / "gpt2", n_embd=32, n_head=2, n_layer=2, vocab_size=120, n_positions=64)
    tiny_decoders.llama(root / "llama", hidden_size=32, heads=4, kv_heads=2, head_dim=8, vocab_size=120,
                        intermediate=48, max_positions=64)
    tiny_decoders.bert(root / "bert")
    return root


@pytest.fixture
def copy(originals, tmp_path):
    def make(name):
        shutil.copytree(originals / name, tmp_path / name)
        return tmp_path / name
    return make


def edit(path, change):
    j = json.loads(path.read_text())
    change(j)
    path.write_text(json.dumps(j))


def cli(*args, limit_bytes=None, stdin=None):
    cmd = [attn_binary(), *map(str, args)]
    if limit_bytes:  # the process's address space: what gigabytes would have needed
        cmd = ["prlimit", f"--as={limit_bytes}", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, input=stdin)


def refused(r, *parts):
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    last = r.stderr.splitlines()[-1]  # after embed's line on its pooling
    assert last.startswith("error: ") and r.stderr.endswith(last + "\n"), r.stderr[-2000:]
    for p in parts:
        assert str(p) in r.stderr, (p, r.stderr)


def generate(d, *args, **kw):
    return cli("generate", "--model", d, "--prompt", "the man said", "-n", 5, "--temperature", 0, *args, **kw)


# ---- config.json ----

@pytest.mark.parametrize("arch,change,parts", [
    # an overflowing RoPE table size, then writes into nothing (SIGSEGV)
    ("llama", {"head_dim": 2**61}, ["num_attention_heads * head_dim", "4 * 2305843009213693952", "config.json"]),
    ("llama", {"head_dim": 2**59}, ["'model.layers.0.self_attn.q_proj.weight' of shape (2305843009213693952, 32)"]),
    ("llama", {"num_hidden_layers": 2**40}, ["num_hidden_layers 1099511627776 in config.json",
                                             "model.layers.1099511627775.input_layernorm.weight"]),
    ("gpt2", {"n_layer": 2**40}, ["n_layer 1099511627776", "transformer.h.1099511627775"]),
    # NaN states or token 0 with exit 0
    ("llama", {"rms_norm_eps": -1e-6}, ['"rms_norm_eps"', "config.json", "to be >= 0"]),
    ("gpt2", {"layer_norm_epsilon": -1e-5}, ['"layer_norm_epsilon"', "to be >= 0"]),
])
def test_config_fields_are_named(copy, arch, change, parts):
    d = copy(arch)
    edit(d / "config.json", lambda j: j.update(change))
    refused(generate(d), *parts)
    with pytest.raises(attn.AttnError, match=re.escape(parts[0])):
        attn.models.from_pretrained(d)


def test_bert_negative_layer_norm_eps_is_refused(copy):
    d = copy("bert")
    edit(d / "config.json", lambda j: j.update(layer_norm_eps=-1e-12))
    refused(cli("embed", "--model", d, stdin="a text\n"), '"layer_norm_eps"', d / "config.json", ">= 0")


@pytest.mark.parametrize("positions", [2**26, 2**62])
def test_huge_max_positions_cost_only_the_positions_used(copy, originals, positions):
    # 2^62 overflowed the RoPE table's size (SIGSEGV); 2^26 built 4.2 GB of it before the first token. The
    # text is the unmutated model's, in a process that can't map 1.5 GB.
    want = generate(originals / "llama")
    assert want.returncode == 0, want.stderr
    d = copy("llama")
    edit(d / "config.json", lambda j: j.update(max_position_embeddings=positions))
    r = generate(d, limit_bytes=1_500_000_000)
    assert r.returncode == 0, r.stderr
    assert r.stdout == want.stdout


def test_generate_n_past_any_cache_is_the_positions_there_are(copy):
    # -n 2^63-1 said "capacity -9223372036854775808"; every id an eos: one token, then done
    d = copy("gpt2")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": list(range(120))}))
    r = cli("generate", "--model", d, "--prompt", "the", "-n", 2**63 - 1)
    assert r.returncode == 0, r.stderr
    assert "(1 tokens after a prompt of 1 " in r.stderr, r.stderr


# ---- tokenizer.json ----

def nested_sequences(n):
    return '{"type": "Sequence", "normalizers": [' * n + '{"type": "Lowercase"}' + "]}" * n


@pytest.mark.parametrize("case", ["vocab id 2^63-1", "template without its token", "template id of a number",
                                  "added_tokens an object", "100,000 nested Sequences", "an id past vocab_size",
                                  "an id of 10^8"])
def test_tokenizer_json_fields_are_named(copy, case):
    d = copy("gpt2")
    t = d / "tokenizer.json"
    parts = [t]
    j = json.loads(t.read_text())
    if case == "vocab id 2^63-1":  # id + 1 overflowed: an out-of-bounds write
        j["model"]["vocab"]["zz"] = 2**63 - 1
        parts += ["the id of 'zz'", "[0, 4294967295]"]
    elif case == "template without its token":  # a missing key read: undefined behaviour
        j["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                               {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {}}
        parts += ['special_tokens["[CLS]"]', "but got none"]
    elif case == "template id of a number":  # nlohmann's type_error text (a RuntimeError in Python)
        j["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": 3, "type_id": 0}}],
                               "pair": [], "special_tokens": {}}
        parts += ['SpecialToken items (with a string "id")']
    elif case == "added_tokens an object":  # ignored silently
        j["added_tokens"] = {"id": 5, "content": "x"}
        parts += ['"added_tokens" (a list)']
    elif case == "an id past vocab_size":  # failed only at the embedding
        j["model"]["vocab"]["zz"] = 125
        parts += [d / "config.json", "below vocab_size 120", "up to 125"]
    elif case == "an id of 10^8":  # 3.1 GB and 7 s for a 3 KB file
        j["model"]["vocab"]["zz"] = 10**8
        parts += [d / "config.json", "up to 100000000"]
    text = json.dumps(j)
    if case == "100,000 nested Sequences":  # a stack overflow (json.dumps would recurse as deep)
        text = text[:-1] + ', "normalizer": ' + nested_sequences(100000) + "}"
        parts += ["nested at most 127 levels deep"]
    t.write_text(text)
    refused(generate(d, limit_bytes=1_500_000_000), *parts)
    with pytest.raises(attn.AttnError):
        attn.models.from_pretrained(d)


def test_nesting_is_bounded_where_the_library_bounds_it(copy):
    tokenizers = pytest.importorskip("tokenizers")
    d = copy("gpt2")
    j = json.loads((d / "tokenizer.json").read_text())
    for n, loads in ((62, True), (63, False)):
        text = json.dumps(j)[:-1] + ', "normalizer": ' + nested_sequences(n) + "}"
        (d / "tokenizer.json").write_text(text)
        try:
            tokenizers.Tokenizer.from_str(text)
            theirs = True
        except Exception:
            theirs = False
        assert theirs == loads
        if loads:
            assert attn.models.from_pretrained(d).tokenizer.encode("THE MAN") == \
                tokenizers.Tokenizer.from_str(text).encode("THE MAN").ids
        else:
            with pytest.raises(attn.AttnError, match="nested at most 127 levels"):
                attn.models.from_pretrained(d)


def test_a_backtracking_split_pattern_is_stopped_naming_it_and_the_file(copy, tmp_path):
    # (a+)+b|a stays under PCRE2's limit per search but costs ~11 ms per 19 bytes: 380 KB ran past 30 s
    d = copy("gpt2")
    edit(d / "tokenizer.json", lambda j: j.update(pre_tokenizer={
        "type": "Split", "pattern": {"Regex": "(a+)+b|a"}, "behavior": "Isolated", "invert": False}))
    (tmp_path / "runs.txt").write_text(("a" * 18 + " ") * 20000 + "\n")  # 380 KB, one line
    r = cli("embed", "--model", d, "--input", tmp_path / "runs.txt")
    refused(r, "'(a+)+b|a'", f"\"Split\" pre_tokenizer of '{d / 'tokenizer.json'}'", "backtracks")
    assert "PCRE2 error" not in r.stderr


# ---- weights ----

def test_a_dangling_model_safetensors_is_named_as_one(copy):
    d = copy("gpt2")
    (d / "model.safetensors").unlink()
    os.symlink(d / "moved.safetensors", d / "model.safetensors")
    refused(generate(d), f"a symbolic link to '{d / 'moved.safetensors'}'")


def test_a_list_valued_weight_map_is_shown(copy):
    d = copy("gpt2")
    (d / "model.safetensors").rename(d / "shard.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["shard.safetensors"]}))
    refused(generate(d), '"weight_map"', 'but got ["shard.safetensors"]')


# ---- attn embed on a directory without sentence-transformers files ----

def test_embed_of_a_decoder_pools_its_last_hidden_state_and_says_so(originals, tmp_path):
    # The logits were pooled (V wide, copied E at a time): wrong vectors, without a word.
    d = originals / "gpt2"
    texts = ["the man said", "a", "they were here"]
    r = cli("embed", "--model", d, "--out", tmp_path / "e.npy", stdin="\n".join(texts) + "\n")
    assert r.returncode == 0, r.stderr
    assert "no sentence-transformers pooling config" in r.stderr and "mean pooling, not normalized" in r.stderr
    assert "over GPT2LMHeadModel's last hidden state" in r.stderr
    got = np.load(tmp_path / "e.npy")
    tok = attn.models.from_pretrained(d).tokenizer
    ref = transformers.GPT2Model.from_pretrained(d, attn_implementation="eager").eval()
    for i, text in enumerate(texts):
        with torch.no_grad():
            h = ref(input_ids=torch.tensor([tok.encode(text)])).last_hidden_state[0]
        np.testing.assert_allclose(got[i], h.mean(0).numpy(), atol=2e-6)  # float32 sums over <= 4 tokens


def test_embed_names_its_pooling_the_invalid_line_and_its_progress(copy, tmp_path):
    d = copy("bert")
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    texts = [f"text number {i}" for i in range(10)]
    r = cli("embed", "--model", d, "--batch", 2, "--progress", 1e-9, stdin="\n".join(texts) + "\n")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == "attn embed: cls pooling, not normalized (sentence-transformers' modules.json)", lines
    assert [l.split(",")[0] for l in lines[1:]] == [f"attn embed: {n} of 10 texts" for n in (2, 4, 6, 8, 10)], lines
    (tmp_path / "bad.txt").write_bytes(b"one\ntwo\nthr\xffee\n")  # a byte offset only, in 200,000 lines
    refused(cli("embed", "--model", d, "--input", tmp_path / "bad.txt"), f"--input '{tmp_path / 'bad.txt'}' line 3",
            "byte offset 3")


# ---- attn.models' arguments ----

def test_python_arguments_are_refused_as_the_cli_refuses_them(originals):
    m = attn.models.from_pretrained(originals / "gpt2")
    with pytest.raises(attn.AttnError, match="ids of an integer dtype"):
        m.forward(np.array([[1.9, 2.0]]))  # truncated to 1 before
    with pytest.raises(attn.AttnError, match="ids of an integer dtype"):
        m.attention_weights([[1.0, 2.0]])
    with pytest.raises(attn.AttnError, match="attention_mask of an integer dtype .or 0s and 1s., but got float64 "
                                             "values"):
        m.forward(np.array([[1, 2]]), np.array([[1.0, 0.5]]))
    np.testing.assert_array_equal(m.forward([[1, 2]], np.array([[1.0, 0.0]])), m.forward([[1, 2]], [[1, 0]]))
    with pytest.raises(attn.AttnError, match="finite temperature >= 0"):
        m.generate([1, 2], 3, temperature=-1.0)  # greedy before; the CLI refuses it
    with pytest.raises(attn.AttnError, match="NoneType None"):
        attn.models.from_pretrained(None)  # looked for a directory named "None"
    assert attn.models.from_pretrained(os.fsencode(originals / "gpt2")).architecture == "GPT2LMHeadModel"


def test_attn_errors_are_caught_as_torch_code_catches_them(tmp_path):
    # torch raises RuntimeError for the misuse attn raises AttnError for: code written for torch catches it
    assert issubclass(attn.AttnError, ValueError) and issubclass(attn.AttnError, RuntimeError)
    with pytest.raises(RuntimeError, match="config.json"):
        attn.models.from_pretrained(tmp_path)
    q = np.ones((1, 2, 3, 4), np.float32)
    with pytest.raises(RuntimeError, match="one dtype"):
        attn.scaled_dot_product_attention(q, q.astype(np.float64), q)
