"""attn's attention inside PyTorch autograd, on CPU tensors read in place (no copies, no build against torch):

    import attn.torch
    y = attn.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # torch.nn.functional's signature
    mha = attn.torch.MultiheadAttention(512, 8, batch_first=True)          # torch.nn.MultiheadAttention's

Forward and backward are attn's C++ kernels (sdpa / sdpa_backward, MultiheadAttention.forward/backward);
everything around them stays torch's. Not a GPU path. bfloat16 query/key/value are accepted by
scaled_dot_product_attention: the forward multiplies in bf16 (AMX or VDPBF16PS, or their exact emulation) with fp32
sums and softmax, as torch's CPU flash kernel does, and returns bfloat16; the backward multiplies in bf16
too (fp32 sums), returning bfloat16 gradients.
float16 is refused by name, as is bfloat16 in MultiheadAttention.
Importing this module imports torch; `import attn` does not.
"""

from typing import Optional, Tuple

import numpy as np
import torch

import _attn

_MHA = _attn.MHA_DEFAULTS  # the constructor's defaults, from MhaOptions (include/attn/mha.h)

from . import functional as _F
from ._interop import DTYPE_RULE, as_array
from .layers import _mask

__all__ = ["scaled_dot_product_attention", "varlen_attention", "MultiheadAttention"]


def _bf16(*tensors):
    """True if the tensors are bfloat16 (all of them: a mix is refused naming the dtypes)."""
    half = [t.dtype == torch.bfloat16 for t in tensors]
    if any(half) and not all(half):
        raise _attn.AttnError("Expected query, key and value of one dtype, but got "
                              f"{', '.join(str(t.dtype) for t in tensors)} instead")
    return all(half)


def _widened(t, half):
    return t.float() if half else t


def _narrowed(t, half):
    return t.to(torch.bfloat16) if half else t


def _draw_seed():
    return int(torch.randint(0, 2**62, (1,)).item())  # torch.manual_seed makes attn's dropout repeat


def _first_derivatives_only():
    """attn's backward is a kernel, not torch operations: its gradient has no graph of its own. Grad mode
    inside a backward means create_graph=True (a second derivative to come): refused by name."""
    if torch.is_grad_enabled():
        raise RuntimeError("attn.torch computes first derivatives only: double backward (create_graph=True) is "
                           "not supported")


# SDPA as two torch.library custom ops with fake (meta) implementations: Dynamo and AOTAutograd trace
# them as single nodes (torch.compile(fullgraph=True) works, no graph break per call), and eager autograd
# runs the same ops. The forward returns the LSE as a second output, for the backward. The variants travel as
# the ops' last arguments (`_Variants` below spells them once).
@torch.library.custom_op("attn::sdpa", mutates_args=())
def _sdpa_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
             dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool, seed: int,
             causal_alignment: str = "top_left", window_left: int = -1, window_right: int = -1,
             alibi_slopes: Optional[torch.Tensor] = None, softcap: float = 0.0,
             relative_bias: Optional[torch.Tensor] = None, relative_bidirectional: bool = True,
             relative_max_distance: int = 128, document_ids: Optional[torch.Tensor] = None,
             cu_seqlens_q: Optional[torch.Tensor] = None,
             cu_seqlens_k: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    half = _bf16(query, key, value)
    q, k, v = (as_array(_widened(t, half), n) for t, n in ((query, "query"), (key, "key"), (value, "value")))
    mask = None if attn_mask is None else as_array(attn_mask, "attn_mask")
    var = _Variants(window_left, window_right, alibi_slopes, softcap, relative_bias, relative_bidirectional,
                    relative_max_distance, document_ids, cu_seqlens_q, cu_seqlens_k)
    out, lse = _F.scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa,
                                               causal_alignment=causal_alignment, return_lse=True, seed=seed,
                                               dtype="bfloat16" if half else "float32", **var.kwargs())
    return _narrowed(torch.from_numpy(out), half), torch.from_numpy(lse)


@_sdpa_op.register_fake
def _(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, *variants, **kw_variants):
    return query.new_empty(query.shape[:-1] + value.shape[-1:]), query.new_empty(query.shape[:-1])


@torch.library.custom_op("attn::sdpa_backward", mutates_args=())
def _sdpa_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      out: torch.Tensor, lse: torch.Tensor, attn_mask: Optional[torch.Tensor], dropout_p: float,
                      is_causal: bool, scale: Optional[float], enable_gqa: bool, seed: int, mask_grad: bool,
                      causal_alignment: str = "top_left", window_left: int = -1, window_right: int = -1,
                      alibi_slopes: Optional[torch.Tensor] = None, softcap: float = 0.0,
                      relative_bias: Optional[torch.Tensor] = None, relative_bidirectional: bool = True,
                      relative_max_distance: int = 128, document_ids: Optional[torch.Tensor] = None,
                      cu_seqlens_q: Optional[torch.Tensor] = None, cu_seqlens_k: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dmask, drelative_bias): dmask is the float mask's gradient when mask_grad, drelative_bias the
    table's with a relative_bias, else empty tensors."""
    mask = None if attn_mask is None else as_array(attn_mask, "attn_mask")
    half = _bf16(query, key, value)
    w = lambda t: _widened(t, half)  # noqa: E731
    var = _Variants(window_left, window_right, alibi_slopes, softcap, relative_bias, relative_bidirectional,
                    relative_max_distance, document_ids, cu_seqlens_q, cu_seqlens_k)
    grads = _F.scaled_dot_product_attention_backward(
        as_array(w(grad_out).contiguous(), "grad_out"), as_array(w(query), "query"), as_array(w(key), "key"),
        as_array(w(value), "value"), as_array(w(out), "out"), as_array(lse, "lse"), mask, dropout_p, is_causal,
        scale, enable_gqa, causal_alignment=causal_alignment, seed=seed, return_mask_grad=mask_grad,
        dtype="bfloat16" if half else "float32", **var.kwargs())
    dmask = torch.from_numpy(grads[3]).to(attn_mask.dtype) if mask_grad else query.new_empty(0)
    drel = torch.from_numpy(grads[-1]).to(relative_bias.dtype) if relative_bias is not None else query.new_empty(0)
    return (*(_narrowed(torch.from_numpy(g), half) for g in grads[:3]), dmask, drel)


@_sdpa_backward_op.register_fake
def _(grad_out, query, key, value, out, lse, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, mask_grad,
      causal_alignment="top_left", window_left=-1, window_right=-1, alibi_slopes=None, softcap=0.0, relative_bias=None,
      *rest, **kw_rest):
    # contiguous, as the real op returns them (empty_like would copy a strided query's layout)
    dmask = attn_mask.new_empty(attn_mask.shape) if mask_grad else query.new_empty(0)
    drel = relative_bias.new_empty(relative_bias.shape) if relative_bias is not None else query.new_empty(0)
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dmask, drel


class _Variants:
    """The variants as the ops take them (plain values and optional tensors), and as functional's kwargs."""

    def __init__(self, window_left=-1, window_right=-1, alibi_slopes=None, softcap=0.0, relative_bias=None,
                 relative_bidirectional=True, relative_max_distance=128, document_ids=None, cu_seqlens_q=None,
                 cu_seqlens_k=None):
        self.args = (int(window_left), int(window_right), alibi_slopes, float(softcap), relative_bias,
                     bool(relative_bidirectional), int(relative_max_distance), document_ids, cu_seqlens_q, cu_seqlens_k)

    @classmethod
    def of(cls, window, alibi_slopes, softcap, relative_bias, relative_bias_bidirectional, relative_bias_max_distance,
           document_ids, cu_seqlens_q=None, cu_seqlens_k=None):
        left, right = (-1, -1) if window is None else window
        detach = lambda t: None if t is None else t.detach()  # noqa: E731 (slopes and ids carry no gradient)
        return cls(left, right, detach(alibi_slopes), softcap, relative_bias, relative_bias_bidirectional,
                   relative_bias_max_distance, detach(document_ids), detach(cu_seqlens_q), detach(cu_seqlens_k))

    def kwargs(self):
        left, right, slopes, softcap, rel, bi, dist, ids, cu_q, cu_k = self.args
        arr = lambda t, n: None if t is None else as_array(t.detach(), n)  # noqa: E731
        kw = dict(window=(left, right), alibi_slopes=arr(slopes, "alibi_slopes"), softcap=softcap,
                  relative_bias=arr(rel, "relative_bias"), relative_bias_bidirectional=bi,
                  relative_bias_max_distance=dist, document_ids=None if ids is None else ids.numpy())
        if cu_q is not None:
            kw["cu_seqlens"] = (cu_q.numpy(), cu_k.numpy())  # int64 tensors
        return kw


def _sdpa_setup_context(ctx, inputs, output):
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, seed, *variants = inputs
    causal_alignment, variants = (variants[0], variants[1:]) if variants else ("top_left", _Variants().args)
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, attn_mask)
    ctx.args = (dropout_p, is_causal, scale, enable_gqa, seed)
    ctx.causal_alignment, ctx.variants = causal_alignment, variants
    # a float mask that requires grad (a learned bias) gets its dS; a relative bias table its gradient
    ctx.mask_grad = attn_mask is not None and attn_mask.is_floating_point() and attn_mask.requires_grad
    ctx.mark_non_differentiable(lse)


def _sdpa_backward(ctx, grad_out, _grad_lse):
    _first_derivatives_only()
    query, key, value, out, lse, attn_mask = ctx.saved_tensors
    dq, dk, dv, dmask, drel = _sdpa_backward_op(grad_out, query, key, value, out, lse, attn_mask, *ctx.args,
                                                ctx.mask_grad, ctx.causal_alignment, *ctx.variants)
    relative_bias = ctx.variants[4]
    return (dq, dk, dv, (dmask if ctx.mask_grad else None), None, None, None, None, None, None, None, None, None,
            None, (drel if relative_bias is not None else None), None, None, None, None, None)


_sdpa_op.register_autograd(_sdpa_backward, setup_context=_sdpa_setup_context)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, causal_alignment="top_left", window=None, alibi_slopes=None,
                                 softcap=0.0, relative_bias=None, relative_bias_bidirectional=True,
                                 relative_bias_max_distance=128, document_ids=None):
    """torch.nn.functional.scaled_dot_product_attention on attn's kernels, differentiable in query, key, value.

    float32 or float64 CPU tensors, or bfloat16 (bf16 products forward and backward, fp32 sums and softmax,
    returned in bfloat16); attn_mask bool (True = may attend) or float (added; a float mask that
    requires grad gets its gradient, reduced over the dims it broadcasts, as torch gives it). First
    derivatives only: double backward (create_graph=True, then backward again) is not supported. One
    difference on purpose: a fully masked row gives zeros (torch gives NaN). Dropout is attn's own, seeded
    from torch's generator. Traceable by torch.compile (custom ops attn::sdpa and attn::sdpa_backward).
    The variants (window, alibi_slopes, softcap, relative_bias with its two settings, document_ids) are
    attn.scaled_dot_product_attention's; a relative_bias that requires grad gets its gradient (T5 training).
    """
    seed = _draw_seed() if dropout_p > 0 else 0
    var = _Variants.of(window, alibi_slopes, softcap, relative_bias, relative_bias_bidirectional,
                       relative_bias_max_distance, document_ids)
    return _sdpa_op(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                    None if scale is None else float(scale), bool(enable_gqa), seed, causal_alignment, *var.args)[0]


def varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, dropout_p=0.0, softmax_scale=None, causal=False,
                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
    """FlashAttention 2's flash_attn_varlen_func on attn's kernels, differentiable in query, key and value:
    query (total_q, H, D), key (total_k, Hkv, D), value (total_k, Hkv, Dv), sequences packed without padding
    by cu_seqlens_q / cu_seqlens_k (int); causal bottom-right aligned within each, as FlashAttention's.
    Returns (total_q, H, Dv). (attn.varlen_attention is the numpy form.)"""
    seed = _draw_seed() if dropout_p > 0 else 0
    var = _Variants.of(window_size, alibi_slopes, softcap, None, True, 128, None, cu_seqlens_q.to(torch.int64),
                       cu_seqlens_k.to(torch.int64))
    t = lambda x: x.transpose(0, 1).unsqueeze(0)  # noqa: E731 (total, H, D) -> (1, H, total, D), a view
    out = _sdpa_op(t(query), t(key), t(value), None, float(dropout_p), bool(causal),
                   None if softmax_scale is None else float(softmax_scale), query.shape[1] != key.shape[1], seed,
                   "bottom_right", *var.args)[0]
    return out[0].transpose(0, 1)


class _Mha(torch.autograd.Function):
    """One call of a fresh native MultiheadAttention: its saved activations belong to this call alone."""

    @staticmethod
    def forward(ctx, module, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
                is_causal, *params):
        native = _attn.MultiheadAttention(*module._native_args(), _draw_seed())
        native.load_state_dict({n: as_array(p, n) for n, p in zip(module._names, params)})
        native.train(True)  # training mode keeps what backward needs; dropout is set by module.training
        q, k, v = (np.asarray(as_array(t, n, ("float32",))) for t, n in ((query, "query"), (key, "key"),
                                                                          (value, "value")))
        out, weights, _ = native.forward(q, k, v, _mask(key_padding_mask, "key_padding_mask"), bool(need_weights),
                                         _mask(attn_mask, "attn_mask"), bool(average_attn_weights),
                                         bool(is_causal), False)
        ctx.native, ctx.names = native, module._names
        weights = torch.from_numpy(weights) if weights is not None else torch.empty(0)
        ctx.mark_non_differentiable(weights)  # attn's backward takes dL/doutput only
        return torch.from_numpy(out), weights

    @staticmethod
    def backward(ctx, grad_out, _grad_weights):
        _first_derivatives_only()
        dq, dk, dv = ctx.native.backward(as_array(grad_out.contiguous(), "grad_output", ("float32",)))
        grads = ctx.native.grads()
        ctx.native = None
        return (None, torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv), None, None, None, None, None,
                *(torch.from_numpy(grads[n]) for n in ctx.names))


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention on attn's forward and backward: same constructor, forward, parameter
    names, state_dict and initialisation (torch's RNG), plus num_kv_heads (grouped-query attention).

    float32 CPU tensors. The returned weights carry no gradient (attn's backward is for the output).
    """

    def __init__(self, embed_dim, num_heads, dropout=_MHA["dropout"], bias=_MHA["bias"],
                 add_bias_kv=_MHA["add_bias_kv"], add_zero_attn=_MHA["add_zero_attn"], kdim=None, vdim=None,
                 batch_first=_MHA["batch_first"], device=None, dtype=None, *, num_kv_heads=None):
        super().__init__()
        if dtype not in (None, torch.float32) or torch.device(device or "cpu").type != "cpu":
            raise _attn.AttnError(f"Expected dtype float32 on the CPU, but got dtype {dtype}, device {device} instead "
                                  f"({DTYPE_RULE})")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_dim = embed_dim // num_heads
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self._ctor = (int(embed_dim), int(num_heads), float(dropout), bool(bias), bool(add_bias_kv),
                      bool(add_zero_attn), int(kdim or 0), int(vdim or 0), bool(batch_first), int(num_kv_heads or 0))
        self.add_zero_attn = add_zero_attn
        shapes = {n: a.shape for n, a in _attn.MultiheadAttention(*self._ctor, 0).state_dict().items()}
        self._names = list(shapes)  # the native layer's order: the order of _Mha's gradients
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                     "bias_k", "bias_v"):
            self.register_parameter(name, torch.nn.Parameter(torch.empty(shapes[name])) if name in shapes else None)
        self.out_proj = torch.nn.modules.linear.NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias)
        self._reset_parameters()

    def _reset_parameters(self):  # torch.nn.MultiheadAttention's, in its order, so one seed gives one model
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if w is not None:
                torch.nn.init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            torch.nn.init.constant_(self.in_proj_bias, 0.0)
            torch.nn.init.constant_(self.out_proj.bias, 0.0)
        for b in (self.bias_k, self.bias_v):
            if b is not None:
                torch.nn.init.xavier_normal_(b)

    def _native_args(self):
        ctor = list(self._ctor)
        ctor[2] = ctor[2] if self.training else 0.0  # dropout only in training mode
        return ctor

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        params = dict(self.named_parameters())
        out, weights = _Mha.apply(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                                  average_attn_weights, is_causal, *(params[n] for n in self._names))
        return out, (weights if need_weights else None)

    # What nn.TransformerEncoderLayer's fast path reads besides the parameters (eval, no grad): it then runs
    # torch's fused kernel on these parameters, as it would for torch.nn.MultiheadAttention.
    merge_masks = torch.nn.MultiheadAttention.merge_masks

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}"
