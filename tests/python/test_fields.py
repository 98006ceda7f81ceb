"""GptConfig's and TrainOptions' fields, each named once in C++ (kGptConfigFields, kTrainOptionsFields), reach
Python and checkpoints alike: every field the binding exposes is a keyword argument, comes back from the
object, from config.json and from loading the checkpoint with a value other than its default. A field
added to a list shows up in the binding by itself, and this test then asks for a test value for it.

Also the one dtype rule of every dict of tensors the bindings take (python/numpy_view.h): float arrays of
any precision are stored as float32, any other dtype is refused naming the tensor.
"""
import json

import numpy as np
import pytest

import attn

# A value other than the default for every field.
GPT_VALUES = dict(vocab_size=5, block_size=12, n_layer=3, n_head=2, n_kv_head=1, n_embd=16, dropout=0.25,
                  bias=False, tie_weights=False, position="rope", window=3)
TRAIN_VALUES = dict(config="nanogpt-cpu", block_size=16, n_kv_head=2, tie_weights=False, steps=7, batch=3, lr=2e-3,
                    min_lr=2e-4, warmup=3, lr_decay_steps=5, weight_decay=0.05, beta1=0.8, beta2=0.95, eps=1e-7,
                    decay_embeddings=False, grad_clip=0.5, dropout=0.1, eval_every=2, eval_iters=1, seed=42,
                    threads=1, dtype="bf16", log_every=4, position="alibi", window=5)
TEXT = "to be or not to be, " * 40


def test_every_gpt_config_field_round_trips_through_python_and_a_checkpoint(tmp_path):
    defaults = attn.GPT(vocab_size=1).config
    assert sorted(defaults) == sorted(GPT_VALUES), "a GptConfig field without a test value here (or one too many)"
    assert sorted(attn.gpt_config("tiny")) == sorted(GPT_VALUES)
    assert [k for k in GPT_VALUES if defaults[k] == GPT_VALUES[k]] == []
    model = attn.GPT(**GPT_VALUES, seed=3)
    assert model.config == GPT_VALUES
    model.save(str(tmp_path / "ck"), attn.CharTokenizer("abcde"))
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["model"] == GPT_VALUES
    loaded, _ = attn.GPT.load(str(tmp_path / "ck"))
    assert loaded.config == GPT_VALUES
    with pytest.raises(TypeError):  # each keyword argument has its field's type
        attn.GPT(vocab_size=5, n_layer="three")


def test_every_train_options_field_round_trips_through_python_and_a_checkpoint(tmp_path):
    fields = [n for n, v in vars(attn.TrainOptions).items() if isinstance(v, property)]
    assert sorted(fields) == sorted(TRAIN_VALUES), "a TrainOptions field without a test value here (or one too many)"
    defaults = attn.TrainOptions()
    assert [k for k in TRAIN_VALUES if getattr(defaults, k) == TRAIN_VALUES[k]] == []
    t = attn.Trainer(text=TEXT, **TRAIN_VALUES)
    assert {k: getattr(t.options, k) for k in fields} == TRAIN_VALUES
    t.save(str(tmp_path / "ck"))
    assert json.loads((tmp_path / "ck" / "config.json").read_text())["training"] == TRAIN_VALUES
    resumed = attn.Trainer.resume(str(tmp_path / "ck"), text=TEXT)
    assert {k: getattr(resumed.options, k) for k in fields} == TRAIN_VALUES


def tensor_takers():
    """Each binding that takes a dict of tensors by name: (name, call with {"w": array})."""
    lin = attn.Linear(3, 2, bias=False, seed=0)
    gpt = attn.GPT(vocab_size=3, block_size=4, n_layer=1, n_head=1, n_embd=4)
    gpt_sd = gpt.state_dict()

    def gpt_take(w, tmp):
        wte = np.zeros((3, 4), w.dtype)  # (V, E): w in its corner
        wte[:2, :3] = w
        gpt.load_state_dict({**gpt_sd, "transformer.wte.weight": wte})
        return gpt.state_dict()["transformer.wte.weight"][:2, :3]

    return [
        ("Linear.load_state_dict", lambda w, tmp: (lin.load_state_dict({"weight": w}), lin.state_dict()["weight"])[1]),
        ("GPT.load_state_dict", gpt_take),
        ("AdamW params", lambda w, tmp: attn.AdamW({"weight": w}).params["weight"]),
        ("save_safetensors", lambda w, tmp: (attn.save_safetensors(tmp / "w.safetensors", {"weight": w}),
                                             attn.load_safetensors(tmp / "w.safetensors")["weight"])[1]),
    ]


@pytest.mark.parametrize("which", range(4), ids=[n for n, _ in tensor_takers()])
def test_one_dtype_rule_for_every_dict_of_tensors(tmp_path, which):
    name, take = tensor_takers()[which]
    w = np.arange(6, dtype=np.float64).reshape(2, 3) / 7
    for dtype in (np.float64, np.float16, np.float32):  # any float: stored as float32
        got = take(w.astype(dtype), tmp_path)
        assert got.dtype == np.float32 and got.shape == (2, 3), name
        np.testing.assert_array_equal(got, w.astype(dtype).astype(np.float32))
    for bad in (np.arange(6).reshape(2, 3), np.ones((2, 3), bool)):  # anything else: refused by name
        with pytest.raises(attn.AttnError, match=f"Expected tensor '[\\w.]+' to be a float array, but got {bad.dtype}"):
            take(bad, tmp_path)


# ---- MhaOptions and TransformerOptions: defaults written once (include/attn/mha.h, nn.h) ----

def test_option_defaults_are_torch_s_in_every_constructor():
    """The C++ structs' defaults reach the native constructors and every Python wrapper (through
    _attn.MHA_DEFAULTS / TRANSFORMER_DEFAULTS), and they are torch.nn's."""
    import inspect

    import _attn
    import attn.torch
    import torch

    assert list(_attn.MHA_DEFAULTS) == ["embed_dim", "num_heads", "dropout", "bias", "add_bias_kv", "add_zero_attn",
                                        "kdim", "vdim", "batch_first", "num_kv_heads", "seed"]
    assert list(_attn.TRANSFORMER_DEFAULTS) == ["d_model", "nhead", "dim_feedforward", "dropout", "activation",
                                                "layer_norm_eps", "batch_first", "norm_first", "bias",
                                                "num_kv_heads", "seed"]
    cases = [(attn.MultiheadAttention, torch.nn.MultiheadAttention, _attn.MHA_DEFAULTS),
             (attn.torch.MultiheadAttention, torch.nn.MultiheadAttention, _attn.MHA_DEFAULTS),
             (attn.TransformerEncoderLayer, torch.nn.TransformerEncoderLayer, _attn.TRANSFORMER_DEFAULTS),
             (attn.TransformerDecoderLayer, torch.nn.TransformerDecoderLayer, _attn.TRANSFORMER_DEFAULTS)]
    for ours, theirs, defaults in cases:
        mine = inspect.signature(ours).parameters
        torch_params = inspect.signature(theirs).parameters
        for name, p in mine.items():
            if p.default is inspect.Parameter.empty or p.default is None:  # required, or None: derived
                continue
            assert p.default == defaults[name], (ours, name)
            t = torch_params[name].default
            if isinstance(t, (bool, int, float, str)):  # torch's activation default is F.relu itself
                assert p.default == t, (ours, name, p.default, t)


def test_native_constructors_take_every_option_by_name():
    import _attn

    mha = _attn.MultiheadAttention(embed_dim=8, num_heads=2, dropout=0.1, bias=False, add_bias_kv=True,
                                   add_zero_attn=True, kdim=4, vdim=6, batch_first=True, num_kv_heads=1, seed=3)
    sd = mha.state_dict()
    assert sd["q_proj_weight"].shape == (8, 8) and sd["k_proj_weight"].shape == (4, 4)  # (Hkv·D, kdim)
    assert sd["v_proj_weight"].shape == (4, 6) and "bias_k" in sd and "in_proj_bias" not in sd
    assert "in_proj_bias" in _attn.MultiheadAttention(embed_dim=8, num_heads=2).state_dict()  # bias=True
    layer = _attn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, activation="gelu", bias=False)
    assert layer.state_dict()["linear1.weight"].shape == (16, 8) and "linear1.bias" not in layer.state_dict()
    with pytest.raises(attn.AttnError, match="relu"):
        _attn.TransformerEncoderLayer(d_model=8, nhead=2, activation="sigmoid")
    with pytest.raises(TypeError):  # d_model and nhead are required
        _attn.TransformerEncoderLayer(d_model=8)
