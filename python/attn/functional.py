"""scaled_dot_product_attention with the semantics of torch.nn.functional's function of that name, on numpy
arrays or CPU torch tensors (read in place; torch in, torch out). No autograd: attn.torch has that."""
import numpy as np

import _attn

from ._interop import as_array, torch_io


@torch_io
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, *, causal_alignment="top_left",
                                 return_weights=False, return_lse=False, seed=0, backend="auto",
                                 strict=False, explain=False, dtype="float32"):
    """softmax(query @ key^T * scale + mask) @ value over the last two dims; leading dims are batch.

    attn_mask: bool (True = may attend, PyTorch's convention for this function) or float (added),
    broadcastable to (..., L, S). is_causal combines with attn_mask (PyTorch forbids both at once);
    causal_alignment is "top_left" (PyTorch) or "bottom_right" (the last query sees every key).
    enable_gqa: dim -3 of key/value may divide dim -3 of query (grouped-query attention).
    Extras: return_weights / return_lse make it return (out, weights?, lse?); a fully masked row
    gives zeros (PyTorch gives NaN); dropout uses `seed`.
    backend: "auto" (flash for float32, its weights from its LSE; the reference for float64), "reference"
    or "flash";
    strict=True turns an automatic fallback to the reference into an error. explain=True runs nothing
    and returns (backend, reason): what this call would run, and why.
    dtype: what Q·Kᵀ and P·V multiply in, "float32" or "bfloat16" (query, key, value and the softmax's
    probabilities rounded to bf16; sums, softmax and output fp32; the flash kernel without weights only,
    float32 elsewhere); with strict, bfloat16 without AVX512_BF16 (emulated) is an error. The backward of
    a bfloat16 forward takes the same dtype. float16 query, key and value are computed in float32 (widened
    exactly) and the output and weights rounded to float16; explain says so.
    """
    half = _is_half(query)
    (query, key, value), mask, kind = _prepare(query, key, value, attn_mask, enable_gqa)
    lead = query.shape[:-3]  # folded into B; dim -3 is the head dim
    causal = causal_alignment if is_causal else "none"
    result = _attn.sdpa(_as4(query), _as4(key), _as4(value), mask, kind, None, "drop", causal, scale,
                        float(dropout_p), int(seed), bool(return_weights), bool(return_lse), backend,
                        bool(strict), bool(explain), dtype)
    if explain:  # (backend, reason)
        return (result[0], result[1] + _HALF_REASON) if half else result
    out, weights, lse = result
    if half:
        out, weights = out.astype(np.float16), None if weights is None else weights.astype(np.float16)
    L, S = query.shape[-2], key.shape[-2]
    out = out.reshape(lead + query.shape[-3:-1] + (value.shape[-1],)) if query.ndim >= 3 else out.reshape(L, -1)
    if not (return_weights or return_lse):
        return out
    shape = query.shape[:-1]
    result = [out]
    if return_weights:
        result.append(weights.reshape(shape + (S,)))
    if return_lse:
        result.append(lse.reshape(shape))
    return tuple(result)



@torch_io
def scaled_dot_product_attention_backward(grad_out, query, key, value, out, lse, attn_mask=None, dropout_p=0.0,
                                          is_causal=False, scale=None, enable_gqa=False, *,
                                          causal_alignment="top_left", seed=0, backend="auto", strict=False,
                                          return_mask_grad=False, dtype="float32"):
    """Gradients (dq, dk, dv) of scaled_dot_product_attention at (query, key, value).

    grad_out is dLoss/dout; out and lse come from the forward call (return_lse=True), whose other
    arguments (mask, dropout_p and seed, is_causal, scale, enable_gqa) must be passed again. With
    enable_gqa, dk and dv are summed over the query heads that share a key/value head. A fully masked
    row gets zero gradient. return_mask_grad=True (a float attn_mask) returns (dq, dk, dv, dmask) too:
    the mask's gradient dS, summed over the dims the mask broadcasts, in the mask's shape (it runs on the
    reference backward, the kernel that writes dS). dtype: the forward's, "float32" or "bfloat16" (the five
    products over bf16 pairs: Q, K, V, grad_out, P and dS rounded; sums and gradients fp32).
    """
    mask_shape = None if attn_mask is None else as_array(attn_mask, "attn_mask", _FLOATS).shape
    half = _is_half(query)
    (query, key, value), mask, kind = _prepare(query, key, value, attn_mask, enable_gqa)
    out, lse, grad_out = (np.asarray(as_array(x, n, _FLOATS), dtype=query.dtype)
                          for x, n in ((out, "out"), (lse, "lse"), (grad_out, "grad_out")))
    causal = causal_alignment if is_causal else "none"
    grads = _attn.sdpa_backward(_as4(query), _as4(key), _as4(value), _as4(out), _as4(lse[..., None])[..., 0],
                                _as4(grad_out), mask, kind, None, "drop", causal, scale, float(dropout_p),
                                int(seed), backend, bool(strict), bool(return_mask_grad), dtype)
    dq, dk, dv = grads[0].reshape(query.shape), grads[1].reshape(key.shape), grads[2].reshape(value.shape)
    if half:
        dq, dk, dv = dq.astype(np.float16), dk.astype(np.float16), dv.astype(np.float16)
    if not return_mask_grad:
        return dq, dk, dv
    return dq, dk, dv, _sum_to(grads[3].reshape(query.shape[:-1] + (key.shape[-2],)), mask_shape)


def _sum_to(x, shape):
    """x summed over the dims that `shape` broadcasts (missing leading ones, and 1s): the gradient of a
    broadcast input, in its shape."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape))))
    return x.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1), keepdims=True)

def _as4(x):
    """(..., H, L, D) as (B, H, L, D): missing leading dims become 1, extra ones fold into B."""
    x = x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x
    return x.reshape((-1,) + x.shape[-3:]) if x.ndim > 4 else x


_FLOATS = ("float16", "float32", "float64")  # what these functions take (float16 computed in float32)
_HALF_REASON = ("; float16 query, key and value are computed in float32 (widened exactly), the output rounded to "
                "float16")


def _is_half(query):
    return as_array(query, "query", _FLOATS).dtype == np.float16


def _prepare(query, key, value, attn_mask, enable_gqa):
    """Checked numpy inputs of one dtype (float16 widened to float32), and the mask with its kind ("keep" or
    "additive") folded like them."""
    query, key, value = (as_array(x, n, _FLOATS) for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if query.dtype.name not in _FLOATS or key.dtype != query.dtype or value.dtype != query.dtype:
        raise _attn.AttnError(
            f"Expected query, key and value of one dtype, float16, float32 or float64, but got {query.dtype}, "
            f"{key.dtype} and {value.dtype} instead")
    if query.dtype == np.float16:
        query, key, value = (x.astype(np.float32) for x in (query, key, value))
    dtype = query.dtype
    if query.ndim < 2 or key.ndim != query.ndim or value.ndim != query.ndim:
        raise _attn.AttnError(
            f"Expected query, key and value of the same rank >= 2, but got {query.shape}, {key.shape} "
            f"and {value.shape} instead")
    if not enable_gqa and key.shape[:-2] != query.shape[:-2]:
        raise _attn.AttnError(
            f"Expected key batch dims {query.shape[:-2]} like query's (or enable_gqa=True), but got "
            f"{key.shape[:-2]} instead")
    if key.shape[:-3] != query.shape[:-3] or value.shape[:-2] != key.shape[:-2]:  # _as4 folds them into B unchecked
        raise _attn.AttnError(
            f"Expected key and value batch dims {query.shape[:-3]} like query's, and value's dims before "
            f"(S, Dv) like key's, but got key {key.shape} and value {value.shape} instead")
    mask, kind = None, "keep"
    if attn_mask is not None:
        mask = as_array(attn_mask, "attn_mask", _FLOATS)
        if mask.dtype != np.bool_ and not np.issubdtype(mask.dtype, np.floating):
            raise _attn.AttnError(
                f"Expected attn_mask of dtype bool or float, but got {mask.dtype} of shape {mask.shape} instead")
        kind = "keep" if mask.dtype == np.bool_ else "additive"
        mask = mask if kind == "keep" else mask.astype(dtype, copy=False)
        if query.ndim > 4:  # fold the leading dims like the inputs
            full = query.shape[:-2] + (query.shape[-2], key.shape[-2])
            try:
                mask = np.broadcast_to(mask, full).reshape((-1,) + full[-3:])
            except ValueError:  # numpy's message names neither the argument nor the target
                raise _attn.AttnError(
                    f"Expected attn_mask broadcastable to {full}, but got shape {mask.shape} instead") from None
    return (query, key, value), mask, kind
