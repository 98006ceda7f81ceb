"""MultiheadAttention with the semantics of torch.nn.MultiheadAttention, on numpy float32 arrays.

Not a torch.nn.Module: no autograd, no devices. Differences from PyTorch (see include/attn/mha.h):
a fully masked row gives zero weights and context (PyTorch: NaN), is_causal works without attn_mask and
combines with it, and initialisation and dropout use attn's own random numbers.
"""
import os
import secrets

import numpy as np

import _attn


def _array(x):
    return np.asarray(x, dtype=np.float32)  # no copy for float32 input; strides are kept


def _mask(m, name):
    if m is None:
        return None
    m = np.asarray(m)
    if m.dtype == np.bool_:
        return m
    if m.dtype.kind != "f":
        raise _attn.AttnError(f"Expected {name} of dtype bool or float, but got {m.dtype} instead")
    return m.astype(np.float32, copy=False)


class MultiheadAttention:
    """Allows the model to jointly attend to information from different representation subspaces.

    Arguments as torch.nn.MultiheadAttention, plus num_kv_heads (grouped-query attention when it is
    below num_heads, multi-query at 1) and seed (initialisation and dropout; None draws one).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, num_kv_heads=None, seed=None):
        self.seed = secrets.randbits(64) if seed is None else int(seed)
        self._native = _attn.MultiheadAttention(
            int(embed_dim), int(num_heads), float(dropout), bool(bias), bool(add_bias_kv), bool(add_zero_attn),
            int(kdim or 0), int(vdim or 0), bool(batch_first), int(num_kv_heads or 0), self.seed)

    def __call__(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                 average_attn_weights=True, is_causal=False, trace=False):
        """Returns (output, weights or None) in PyTorch's shapes; trace=True prints each stage's shape.

        key_padding_mask (N, S) / attn_mask (L, S) or (N*num_heads, L, S): bool True = masked out,
        float = added to the scores.
        """
        out, weights, text = self._native.forward(
            _array(query), _array(key), _array(value), _mask(key_padding_mask, "key_padding_mask"),
            bool(need_weights), _mask(attn_mask, "attn_mask"), bool(average_attn_weights), bool(is_causal),
            bool(trace))
        if trace:
            print(text, end="")
        return out, weights

    forward = __call__

    def state_dict(self):
        """{name: float32 array} under PyTorch's names, in PyTorch's order (copies)."""
        return self._native.state_dict()

    def load_state_dict(self, state_dict):
        """Takes {name: array}, e.g. {k: v.numpy() for k, v in torch_mha.state_dict().items()}."""
        self._native.load_state_dict({k: _array(v) for k, v in state_dict.items()})

    def save(self, path):
        self._native.save(os.fspath(path))

    def load(self, path):
        self._native.load(os.fspath(path))

    def train(self, mode=True):
        self._native.train(bool(mode))
        return self

    def eval(self):
        return self.train(False)

    @property
    def training(self):
        return self._native.training

    def __getattr__(self, name):  # embed_dim, num_heads, num_kv_heads, kdim, vdim, head_dim, dropout, batch_first
        if name in ("embed_dim", "num_heads", "num_kv_heads", "kdim", "vdim", "head_dim", "dropout", "batch_first"):
            return getattr(self._native, name)
        raise AttributeError(name)

    def __repr__(self):
        n = self._native
        return (f"MultiheadAttention(embed_dim={n.embed_dim}, num_heads={n.num_heads}, "
                f"num_kv_heads={n.num_kv_heads}, kdim={n.kdim}, vdim={n.vdim}, batch_first={n.batch_first})")
