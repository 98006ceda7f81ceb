"""attn's attention inside Hugging Face transformers: one call, then any model loaded with
attn_implementation="attn" runs its attention on attn's kernels (attn.torch: forward and backward, autograd).

    import attn.transformers
    attn.transformers.register()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="attn")

What reaches the kernels, and as what (never a dense (B, H, L, S) mask where the model's own mask is one of
transformers' plain ones):
- causal masks as causal (bottom-right aligned, what a KV cache needs), bidirectional ones as nothing;
- padding: the 2D mask, as packed documents (self-attention whose padding is one run at either end of each
  row: the pad tiles are never computed), else as a (B, 1, 1, S) key mask that is never broadcast in memory;
- GQA/MQA: the Hkv key/value heads as they are (enable_gqa), never repeated;
- sliding_window (Mistral, Qwen2, Gemma 2) as the kernels' window, softcap (Gemma 2) as their softcap,
  T5's position bias as its (num_buckets, H) table (relative_bias: the table gets its gradient), BLOOM's ALiBi
  as slopes (BloomAttention computes attention itself: register() routes it here for "attn" models);
- dropout (training) as attn's dropout on the weights; scaling as given.
A mask transformers builds from anything else (or/and mask functions, packed sequences by position_ids, a
static cache's offsets) arrives as transformers' own dense boolean mask, complete, and is used as given.

This registers through transformers' AttentionInterface and AttentionMaskInterface: registering the attention
function alone makes transformers skip mask creation for an unknown implementation (attention_mask=None:
padding silently ignored), so the mask function below is registered with it.
"""
import weakref

import torch
import transformers
from transformers import AttentionInterface
from transformers.masking_utils import (AttentionMaskInterface, bidirectional_mask_function, causal_mask_function,
                                        prepare_padding_mask, sdpa_mask)

from . import torch as _attn_torch

__all__ = ["register", "attention_forward", "attention_mask"]

NAME = "attn"


def register(name=NAME):
    """Makes attn_implementation=name (default "attn") run attention on attn's kernels, for models created
    after this call. Idempotent."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    _route_bloom(name)


# ---- the mask: what transformers' create_*_mask functions hand the attention function ----

def _plain_kind(mask_function, local_size, use_vmap):
    """"causal", "bidirectional" or "sliding" when mask_function is one of transformers' plain mask functions
    (nothing or'ed or and'ed onto it), else None."""
    if use_vmap:
        return None
    if mask_function is causal_mask_function:
        return "causal"
    if mask_function is bidirectional_mask_function:
        return "bidirectional"
    # sliding_window_causal_mask_function(W) = and_masks(sliding_window_overlay(W), causal_mask_function)
    if local_size is not None and getattr(mask_function, "__name__", "") == "and_mask":
        cells = [c.cell_contents for c in (mask_function.__closure__ or ())]
        parts = cells[0] if len(cells) == 1 and isinstance(cells[0], tuple) else ()
        if (len(parts) == 2 and parts[1] is causal_mask_function
                and getattr(parts[0], "__qualname__", "").startswith("sliding_window_overlay.")):
            return "sliding"
    return None


def attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=causal_mask_function,
                   attention_mask=None, local_size=None, use_vmap=False, **kwargs):
    """The mask interface's function for "attn": None (no padding) or the (B, S) keep-mask of the keys when
    the mask is a plain causal, sliding-window or bidirectional one whose queries end at the last key (the
    attention function adds causal and window itself); otherwise transformers' own complete (B, 1, L, S)
    boolean mask (sdpa_mask), which the attention function uses as given."""
    q_offset, kv_offset = int(q_offset), int(kv_offset)
    kind = _plain_kind(mask_function, local_size, use_vmap)
    bottom_right = q_offset - kv_offset == kv_length - q_length  # the last query sits on the last key
    if kind is None or (kind != "bidirectional" and not bottom_right):
        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                         kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                         local_size=local_size, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                         use_vmap=use_vmap, device=kwargs.get("device", "cpu"))
    if attention_mask is None:
        return None
    keep = prepare_padding_mask(attention_mask.bool(), kv_length, kv_offset)[:, kv_offset:kv_offset + kv_length]
    return None if bool(keep.all()) else keep


# ---- the attention function ----

# T5: the position bias layer 0 computed from its table, by the tensor transformers shares with later layers
# (id -> (weak reference, table entry); an entry leaves with its tensor)
_t5_bias = {}


def _remember(bias, entry):
    key = id(bias)
    _t5_bias[key] = (weakref.ref(bias, lambda _: _t5_bias.pop(key, None)), entry)


def _t5_table(module, position_bias):
    """(table, bidirectional, max_distance) of T5's relative position bias when position_bias is one a T5
    attention layer computed from its table (or that layer's own), "zeros" for the zeros a T5 layer without a
    table makes (cross-attention), None for anything else (then added as it is)."""
    if not hasattr(module, "has_relative_attention_bias") or not hasattr(module, "relative_attention_max_distance"):
        return None
    if module.has_relative_attention_bias:
        t = (module.relative_attention_bias.weight, not module.is_decoder, int(module.relative_attention_max_distance))
        _remember(position_bias, t)
        return t
    ref, known = _t5_bias.get(id(position_bias), (None, None))
    if ref is not None and ref() is position_bias:
        return known
    return "zeros" if not position_bias.requires_grad and not bool(position_bias.any()) else None


def _self_attention(module, causal, query, key):
    """Is this a self-attention (its keys are its queries' tokens)? A causal one is; an encoder's layers are."""
    if query.shape[2] != key.shape[2]:
        return False
    if causal:
        return True
    return getattr(module, "is_cross_attention", None) is False or getattr(module, "is_decoder", None) is False


def _documents(keep):
    """Document ids (B, S) when each row's padding is one run at its start or end (0 then 1 along the row),
    else None."""
    change = keep[:, 1:] != keep[:, :-1]
    if bool((change.sum(1) > 1).any()):
        return None
    return torch.cat([torch.zeros_like(keep[:, :1], dtype=torch.int64), change.cumsum(1)], 1)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      sliding_window=None, softcap=None, position_bias=None, alibi_slopes=None, **kwargs):
    """The attention interface's function for "attn": query (B, H, L, D), key (B, Hkv, S, D), value (B, Hkv, S,
    Dv) as transformers passes them -> ((B, L, H, Dv), None). attention_mask is what attention_mask() made."""
    L, S = query.shape[2], key.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    kw = dict(dropout_p=float(dropout), scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
              softcap=float(softcap or 0.0), alibi_slopes=alibi_slopes)
    mask = None
    if attention_mask is not None and attention_mask.dim() == 4:
        mask = attention_mask  # transformers' complete mask: causal, window and padding in it
    else:
        if causal and L > 1:
            kw.update(is_causal=True, causal_alignment="bottom_right")
        if sliding_window:
            kw["window"] = (int(sliding_window) - 1, -1 if causal else int(sliding_window) - 1)
        if attention_mask is not None:  # (B, S) keys to keep
            docs = _documents(attention_mask) if _self_attention(module, causal, query, key) else None
            if docs is not None:
                kw["document_ids"] = docs
            else:
                mask = attention_mask[:, None, None, :]
    if position_bias is not None:
        t5 = _t5_table(module, position_bias)
        if isinstance(t5, tuple):
            kw.update(relative_bias=t5[0], relative_bias_bidirectional=t5[1], relative_bias_max_distance=t5[2])
        elif t5 is None:  # a bias of unknown origin: added as it is, with the mask's -inf where it masks
            bias = position_bias.to(query.dtype)
            if mask is not None:
                bias = bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
            mask = bias
    out = _attn_torch.scaled_dot_product_attention(query, key, value, attn_mask=mask, **kw)
    return out.transpose(1, 2), None


# ---- BLOOM: attention computed inside BloomAttention.forward, not through the interface ----

def _route_bloom(name):
    """BloomAttention builds its scores itself (baddbmm with the ALiBi tensor), so attn_implementation is
    never consulted there: for models whose config says `name`, its forward runs attention_forward with ALiBi's
    slopes instead. Models of other implementations keep transformers' forward."""
    from transformers.models.bloom import modeling_bloom as mb
    cls = mb.BloomAttention
    if getattr(cls, "_attn_names", None) is None:
        cls._attn_names = set()
        init, forward = cls.__init__, cls.forward

        def __init__(self, config, *args, **kwargs):
            init(self, config, *args, **kwargs)
            self._attn_config = config

        def routed(self, hidden_states, residual, alibi, attention_mask, layer_past=None, use_cache=False,
                   output_attentions=False, **kwargs):
            config = getattr(self, "_attn_config", None)
            if config is None or config._attn_implementation not in cls._attn_names:
                return forward(self, hidden_states, residual, alibi, attention_mask, layer_past, use_cache,
                               output_attentions, **kwargs)
            B, L, _ = hidden_states.shape
            q, k, v = self._reshape(self.query_key_value(hidden_states))  # (B, H, L, D) each
            if layer_past is not None:
                k, v = layer_past.update(k, v, self.layer_idx)
            slopes = mb._get_alibi_slopes(self.num_heads, hidden_states.device)
            ctx, _ = attention_forward(self, q, k, v, attention_mask, dropout=self.attention_dropout.p if
                                       self.training else 0.0, scaling=self.inv_norm_factor, is_causal=True,
                                       alibi_slopes=slopes)
            ctx = ctx.reshape(B, L, self.hidden_size)
            if self.pretraining_tp > 1 and self.slow_but_exact:
                slices = self.hidden_size / self.pretraining_tp
                out = torch.zeros_like(ctx)
                for i in range(self.pretraining_tp):
                    s = slice(int(i * slices), int((i + 1) * slices))
                    out = out + torch.nn.functional.linear(ctx[:, :, s], self.dense.weight[:, s])
            else:
                out = self.dense(ctx)
            return mb.dropout_add(out, residual, self.hidden_dropout, self.training), None

        cls.__init__ = __init__
        cls.forward = routed
    cls._attn_names.add(name)
