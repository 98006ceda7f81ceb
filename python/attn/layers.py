"""The nn layers with PyTorch's constructor arguments and state_dict names, on numpy float32 arrays or CPU
torch tensors (torch in, torch out; state_dict() gives numpy, load_state_dict takes either).

Not torch.nn.Modules and no autograd (attn.torch.MultiheadAttention is one): backprop is explicit. In training
mode (the default) forward()
keeps what backward() needs; backward(grad_output) returns the input gradient(s) and ADDS the parameter
gradients into grads() (zero_grad() clears them), as PyTorch's .grad accumulates.

    layer = attn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    layer.load_state_dict({k: v.numpy() for k, v in torch_layer.state_dict().items()})
    y = layer(x)                      # x (N, L, E) float32
    dx = layer.backward(np.ones_like(y))
    layer.grads()["self_attn.in_proj_weight"]
"""
import os
import secrets

import numpy as np

import _attn

from ._interop import as_array, tensor_dict, torch_io

# The constructors' defaults, from the C++ option structs (include/attn/mha.h, nn.h): written once there.
_MHA = _attn.MHA_DEFAULTS
_TRANSFORMER = _attn.TRANSFORMER_DEFAULTS

__all__ = ["MultiheadAttention", "Linear", "LayerNorm", "Dropout", "ReLU", "GELU", "Embedding", "FeedForward",
           "TransformerEncoderLayer", "TransformerDecoderLayer"]


def _array(x, name="input"):
    a = np.asarray(as_array(x, name))
    if a.dtype.kind != "f":  # as scaled_dot_product_attention: integer or bool data is a mistake
        raise _attn.AttnError(f"Expected {name} of a floating dtype, but got {a.dtype} instead")
    return np.asarray(a, dtype=np.float32)  # no copy for float32 input; strides are kept


def _layer_variants(window, alibi_slopes, softcap, document_ids):
    """The variants a layer passes to its attention, as _attn's `variants` dict (functional's one spelling)."""
    from .functional import _variants
    return _variants(np.float32, window, alibi_slopes, softcap, None, True, 128, document_ids)


def _mask(m, name):
    """torch.nn's masks: bool True = masked out, float = added to the scores."""
    if m is None:
        return None
    m = as_array(m, name)
    if m.dtype == np.bool_:
        return m
    if m.dtype.kind != "f":
        raise _attn.AttnError(f"Expected {name} of dtype bool or float, but got {m.dtype} instead")
    return m.astype(np.float32, copy=False)


class HeadAveragedWeights(np.ndarray):
    """MultiheadAttention's default weights, (N, L, S) or (L, S): the mean over heads of each batch item. A
    plain ndarray in every way but its type, which lets attn.viz.html refuse them where (H, L, S) belongs."""


def _seed(seed):
    return secrets.randbits(64) if seed is None else int(seed)


_THREADS_DOC = """Threads: a layer may be shared across threads. Its calls run without the GIL, one at a time per
    layer (a per-object lock), so no thread sees another's half-made state. A forward and the backward
    that follows are two calls, though: another thread's forward in between replaces the saved
    activations, so train with one layer per thread."""


class _Layer:
    """Parameters, gradients and the training flag, shared by every layer."""

    def __init_subclass__(cls, **kwargs):  # every layer's docstring ends with the threads paragraph
        super().__init_subclass__(**kwargs)
        cls.__doc__ = (cls.__doc__ or cls.__name__).rstrip() + "\n\n    " + _THREADS_DOC

    _native = None

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    @torch_io
    def forward(self, input):
        return self._native.forward(_array(input))

    @torch_io
    def backward(self, grad_output):
        return self._native.backward(_array(grad_output))

    def state_dict(self):
        """{name: float32 array} under PyTorch's names, in PyTorch's order (copies)."""
        return self._native.state_dict()

    def load_state_dict(self, state_dict):
        """Takes {name: float array or tensor}, e.g. a torch module's state_dict(); stored as float32."""
        self._native.load_state_dict(tensor_dict(state_dict))

    def grads(self):
        """{name: float32 array}: the accumulated gradients, same names as state_dict() (copies)."""
        return self._native.grads()

    def zero_grad(self):
        self._native.zero_grad()

    def train(self, mode=True):
        self._native.train(bool(mode))
        return self

    def eval(self):
        return self.train(False)

    @property
    def training(self):
        return self._native.training


class MultiheadAttention(_Layer):
    """Allows the model to jointly attend to information from different representation subspaces.

    Arguments as torch.nn.MultiheadAttention, plus num_kv_heads (grouped-query attention when it is
    below num_heads, multi-query at 1) and seed (initialisation and dropout; None draws one).
    """

    def __init__(self, embed_dim, num_heads, dropout=_MHA["dropout"], bias=_MHA["bias"],
                 add_bias_kv=_MHA["add_bias_kv"], add_zero_attn=_MHA["add_zero_attn"], kdim=None, vdim=None,
                 batch_first=_MHA["batch_first"], num_kv_heads=None, seed=None):
        self.seed = _seed(seed)
        self._native = _attn.MultiheadAttention(
            int(embed_dim), int(num_heads), float(dropout), bool(bias), bool(add_bias_kv), bool(add_zero_attn),
            int(kdim or 0), int(vdim or 0), bool(batch_first), int(num_kv_heads or 0), self.seed)

    @torch_io
    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, trace=False, *, window=None, alibi_slopes=None,
                softcap=0.0, document_ids=None):
        """Returns (output, weights or None) in PyTorch's shapes; trace=True prints each stage's shape.

        key_padding_mask (N, S) / attn_mask (L, S) or (N*num_heads, L, S): bool True = masked out,
        float = added to the scores. The variants (window, alibi_slopes, softcap, document_ids) as
        attn.scaled_dot_product_attention's, computed in the kernel.
        """
        out, weights, text = self._native.forward(
            _array(query), _array(key), _array(value), _mask(key_padding_mask, "key_padding_mask"),
            bool(need_weights), _mask(attn_mask, "attn_mask"), bool(average_attn_weights), bool(is_causal),
            bool(trace), _layer_variants(window, alibi_slopes, softcap, document_ids))
        if trace:
            print(text, end="")
        if weights is not None and average_attn_weights:
            weights = weights.view(HeadAveragedWeights)
        return out, weights

    @torch_io
    def backward(self, grad_output):
        """(dquery, dkey, dvalue) after a training-mode forward; adds into grads(). Self-attention's input
        gradient is their sum."""
        return self._native.backward(_array(grad_output))

    def save(self, path):
        self._native.save(os.fspath(path))

    def load(self, path):
        self._native.load(os.fspath(path))

    def __getattr__(self, name):  # embed_dim, num_heads, num_kv_heads, kdim, vdim, head_dim, dropout, batch_first
        if name in ("embed_dim", "num_heads", "num_kv_heads", "kdim", "vdim", "head_dim", "dropout", "batch_first"):
            return getattr(self._native, name)
        raise AttributeError(name)

    def __repr__(self):
        n = self._native
        return (f"MultiheadAttention(embed_dim={n.embed_dim}, num_heads={n.num_heads}, "
                f"num_kv_heads={n.num_kv_heads}, kdim={n.kdim}, vdim={n.vdim}, batch_first={n.batch_first})")


class Linear(_Layer):
    """y = x W^T + b on the last dim, as torch.nn.Linear."""

    def __init__(self, in_features, out_features, bias=True, seed=None):
        self._native = _attn.Linear(int(in_features), int(out_features), bool(bias), _seed(seed))


class LayerNorm(_Layer):
    """torch.nn.LayerNorm over the last dim (normalized_shape is an int or a 1-tuple)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise _attn.AttnError(
                    f"Expected normalized_shape of one dim, but got {tuple(normalized_shape)} instead")
            normalized_shape = normalized_shape[0]
        self._native = _attn.LayerNorm(int(normalized_shape), float(eps), bool(elementwise_affine), bool(bias))


class Dropout(_Layer):
    """torch.nn.Dropout with attn's hash-seeded masks (PyTorch's distribution, other numbers)."""

    def __init__(self, p=0.5, seed=None):
        self._native = _attn.Dropout(float(p), _seed(seed))


class ReLU(_Layer):
    def __init__(self):
        self._native = _attn.Activation("relu")


class GELU(_Layer):
    """approximate='none' (the exact erf form, PyTorch's default) or 'tanh'."""

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise _attn.AttnError(f"Expected approximate 'none' or 'tanh', but got {approximate!r} instead")
        self._native = _attn.Activation("gelu" if approximate == "none" else "gelu_tanh")


class Embedding(_Layer):
    """torch.nn.Embedding: int indices (any shape) -> (..., embedding_dim). backward returns None."""

    def __init__(self, num_embeddings, embedding_dim, seed=None):
        self._native = _attn.Embedding(int(num_embeddings), int(embedding_dim), _seed(seed))

    @torch_io
    def forward(self, input):
        return self._native.forward(np.asarray(input, dtype=np.int64))


class FeedForward(_Layer):
    """The Transformer's feed-forward block: linear1 -> activation -> dropout -> linear2."""

    def __init__(self, d_model, dim_feedforward, activation="relu", dropout=0.1, bias=True, seed=None):
        self._native = _attn.FeedForward(int(d_model), int(dim_feedforward), str(activation), float(dropout),
                                         bool(bias), _seed(seed))


class _TransformerLayer(_Layer):
    """The constructor both Transformer layers share: torch.nn's arguments, TransformerOptions' defaults."""

    _NATIVE = None  # the _attn class

    def __init__(self, d_model, nhead, dim_feedforward=_TRANSFORMER["dim_feedforward"],
                 dropout=_TRANSFORMER["dropout"], activation=_TRANSFORMER["activation"],
                 layer_norm_eps=_TRANSFORMER["layer_norm_eps"], batch_first=_TRANSFORMER["batch_first"],
                 norm_first=_TRANSFORMER["norm_first"], bias=_TRANSFORMER["bias"], num_kv_heads=None, seed=None):
        if not isinstance(activation, str):
            raise _attn.AttnError(f"Expected activation 'relu' or 'gelu', but got {activation!r} instead")
        self._native = self._NATIVE(int(d_model), int(nhead), int(dim_feedforward), float(dropout), activation,
                                    float(layer_norm_eps), bool(batch_first), bool(norm_first), bool(bias),
                                    int(num_kv_heads or 0), _seed(seed))


class TransformerEncoderLayer(_TransformerLayer):
    """torch.nn.TransformerEncoderLayer (self-attention, then the feed-forward block), plus num_kv_heads.

    src (L, N, E), (N, L, E) with batch_first, or unbatched (L, E); src_mask (L, L) or (N*nhead, L, L),
    src_key_padding_mask (N, L): bool True = masked out, float = added. is_causal works with or without
    src_mask; the variants (window, alibi_slopes, softcap, document_ids) go to its self-attention.
    backward(grad_output) -> grad src.
    """

    _NATIVE = _attn.TransformerEncoderLayer

    @torch_io
    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False, *, window=None,
                alibi_slopes=None, softcap=0.0, document_ids=None):
        return self._native.forward(_array(src), _mask(src_mask, "src_mask"),
                                    _mask(src_key_padding_mask, "src_key_padding_mask"), bool(is_causal),
                                    _layer_variants(window, alibi_slopes, softcap, document_ids))


class TransformerDecoderLayer(_TransformerLayer):
    """torch.nn.TransformerDecoderLayer (masked self-attention, cross-attention over memory, feed-forward).

    backward(grad_output) -> (grad tgt, grad memory).
    """

    _NATIVE = _attn.TransformerDecoderLayer

    @torch_io
    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        return self._native.forward(_array(tgt), _array(memory), _mask(tgt_mask, "tgt_mask"),
                                    _mask(memory_mask, "memory_mask"),
                                    _mask(tgt_key_padding_mask, "tgt_key_padding_mask"),
                                    _mask(memory_key_padding_mask, "memory_key_padding_mask"),
                                    bool(tgt_is_causal), bool(memory_is_causal))
