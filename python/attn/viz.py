"""Attention pictures from numpy arrays: PNG heatmaps and one self-contained interactive HTML page.

    import attn
    out, w, _ = attn.scaled_dot_product_attention(q, k, v, return_weights=True)   # w: (B, H, L, S)
    attn.viz.heatmap("head3.png", w[0, 3], tokens, title="layer 0 · head 3")
    attn.viz.heatmap("heads.png", w[0], tokens)                     # all heads in a grid
    attn.viz.html("attention.html", [w[0]], tokens)                  # a list of layers, each (H, L, S)
    attn.viz.gpt("gpt.html", "out", "abcd|dcb")                      # a GPT checkpoint on a text

heatmap and html are not model runners: give them weights you already have; gpt runs the model. Tokens are
strings (a str is split into
characters); key_tokens=None means self-attention (the query tokens label the keys).
"""
import os

import numpy as np

import _attn

from ._interop import as_array

__all__ = ["heatmap", "html", "gpt"]


def _tokens(tokens):
    if tokens is None:
        return []
    if isinstance(tokens, str):
        return list(tokens)
    return [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in tokens]


def _weights(a):
    return np.ascontiguousarray(as_array(a, "weights"), dtype=np.float32)


def _head_averaged(a, what):
    """The error for MultiheadAttention's head-averaged (N, L, S) weights where (H, L, S) belongs."""
    return _attn.AttnError(
        f"Expected {what}, but got MultiheadAttention's head-averaged weights of shape {a.shape} (N, L, S: one row "
        f"per batch item, not per head) instead: call it with average_attn_weights=False and pass w[n], the "
        f"(H, L, S) weights of batch item n")


def _layer(a, i):
    """Layer i of html()'s list: (H, L, S), and not MultiheadAttention's head-averaged (N, L, S) batch."""
    from .layers import HeadAveragedWeights
    if isinstance(a, HeadAveragedWeights):
        raise _head_averaged(a, f"layer {i} of weights (H, L, S)")
    w = _weights(a)
    if w.ndim != 3:
        raise _attn.AttnError(f"Expected layer {i} of weights (H, L, S), but got shape {w.shape} instead")
    return w


def heatmap(path, weights, query_tokens, key_tokens=None, title=None, *, vmax=None, max_px=1024):
    """Write a PNG of weights (L, S), or of all heads (H, L, S) side by side, on one colour rule.

    vmax: one absolute scale, 0 to vmax (default: each query row relative to its largest weight, the rule
    of every view, said on the colour bar); max_px: longest side of one matrix in
    pixels (longer inputs are max-pooled). Returns the layout: width, height, cell (pixels), rows,
    cols (cells drawn per panel) and panels (top-left corner of each matrix), so cell (i, j) of
    panel p starts at (panels[p][0] + j * cell, panels[p][1] + i * cell).
    """
    w = _weights(weights)
    if w.ndim not in (2, 3):
        raise _attn.AttnError(f"Expected weights of shape (L, S) or (H, L, S), but got {w.shape} instead")
    return _attn.viz_heatmap(os.fspath(path), w, _tokens(query_tokens), _tokens(key_tokens), title or "",
                             float(vmax or 0.0), int(max_px), w.ndim == 3)


def html(path, layers, query_tokens, key_tokens=None, top_k=None, *, title="attention", layer_names=None,
         scale="row"):
    """Write one self-contained HTML page (head view, model view, matrix view and, for self-attention, the
    attention rollout of the layers; no network).

    layers: one array (num_layers, H, L, S) or a list of (H, L, S) arrays (H may differ between
    layers). One 3-D array is refused: (H, L, S) heads and an (N, L, S) batch look alike; pass [w].
    top_k: None keeps every weight for up to 64 keys and the 16 largest per query row beyond; 0 keeps
    all; k keeps the k largest per row. The page says when weights were dropped. scale: the colour scale the
    page opens with, "row" (each query row relative to its largest weight) or "absolute" (0 to 1, bertviz's);
    the page switches between them and says which it shows. Returns path.
    """
    from .layers import HeadAveragedWeights
    want = "layers of shape (num_layers, H, L, S) or a list of (H, L, S) arrays"
    ndim = getattr(layers, "ndim", None)
    if isinstance(layers, (list, tuple)) or ndim == 4:
        arrays = [_layer(x, i) for i, x in enumerate(layers)]
    elif isinstance(layers, HeadAveragedWeights):
        raise _head_averaged(layers, want)
    elif ndim == 3:
        raise _attn.AttnError(
            f"Expected {want}, but got one array of shape {tuple(layers.shape)} instead: three dimensions could be "
            f"one layer's heads (H, L, S) or a batch (N, L, S), so attn.viz.html does not guess. One layer's heads: "
            f"pass [w]; batch item n of (N, H, L, S) weights: pass [w[n]]")
    else:
        raise _attn.AttnError(f"Expected {want}, but got {getattr(layers, 'shape', type(layers).__name__)} instead")
    _attn.viz_html(os.fspath(path), arrays, _tokens(query_tokens), _tokens(key_tokens),
                   [str(n) for n in layer_names or []], title, -1 if top_k is None else int(top_k), str(scale))
    return path


def gpt(path, model_or_ckpt_dir, text, top_k=None, *, tokenizer=None, title=None, scale="row"):
    """Write the HTML page of a GPT's attention on `text`: every layer and head, the characters as tokens.

    model_or_ckpt_dir: a checkpoint directory (attn train --out, GPT.save), a (GPT, CharTokenizer) pair as
    GPT.load returns, a Trainer, or a GPT with tokenizer=. text: characters of the vocabulary, at most
    block_size of them. top_k and scale as in html(). The same page as `attn viz --ckpt DIR --text TEXT`.
    Returns path.
    """
    m = model_or_ckpt_dir
    if isinstance(m, (str, os.PathLike)):
        model, tok = _attn.GPT.load(os.fspath(m))
    elif isinstance(m, tuple):
        model, tok = m
    elif isinstance(m, _attn.Trainer):
        model, tok = m.model, m.tokenizer
    else:
        model, tok = m, tokenizer
    if not isinstance(model, _attn.GPT) or not isinstance(tok, _attn.CharTokenizer):
        raise _attn.AttnError("Expected a checkpoint directory, (GPT, CharTokenizer), a Trainer or a GPT with "
                              f"tokenizer=, but got {type(m).__name__} (tokenizer {type(tok).__name__}) instead")
    block = model.config["block_size"]
    if not 0 < len(text) <= block:
        raise _attn.AttnError(f"Expected a text of 1 to the model's block_size = {block} characters, but got "
                              f"{len(text)} characters instead")
    weights = model.attention_weights(np.array([tok.encode(text)], dtype=np.int64))  # per layer (1, H, T, T)
    return html(path, [w[0] for w in weights], list(text), top_k=top_k, scale=scale,
                title=title or f'attention on "{_attn.viz_display_token(text, 40)}"')  # as attn viz cuts it
