"""scaled_dot_product_attention with the semantics of torch.nn.functional's function of that name, on numpy
arrays or CPU torch tensors (read in place; torch in, torch out). No autograd: attn.torch has that."""
import numpy as np

import _attn

from ._interop import as_array, torch_io


@torch_io
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, *, causal_alignment="top_left",
                                 return_weights=False, return_lse=False, seed=0, backend="auto",
                                 strict=False, explain=False, dtype="float32", window=None, alibi_slopes=None,
                                 softcap=0.0, relative_bias=None, relative_bias_bidirectional=True,
                                 relative_bias_max_distance=128, document_ids=None, cu_seqlens=None):
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

    Variants (FlashAttention 2's definitions, computed in the kernel, tiles no query sees never computed;
    they combine with each other, masks, causal and dropout):
    window=(left, right): query l sees keys l + S - L - left .. l + S - L + right (-1: unbounded); softcap:
    scores = softcap·tanh(scores/softcap) before masks (Gemma 2); alibi_slopes (H,) or (..., H): scores get
    -slope·|l + S - L - s| (BLOOM, MPT); relative_bias (num_buckets, H): T5's learned bias by the bucket of
    s - l (relative_bias_bidirectional, relative_bias_max_distance as T5's config); document_ids (..., L),
    L == S: a query sees keys of its own document only (packed sequences; causal and windows count within
    a document). cu_seqlens=(cu_seqlens_q, cu_seqlens_k) with one batch: documents of other lengths for
    queries and keys, FlashAttention's varlen (varlen_attention takes its (total, H, D) layout).
    """
    half = _is_half(query)
    (query, key, value), mask, kind = _prepare(query, key, value, attn_mask, enable_gqa)
    lead = query.shape[:-3]  # folded into B; dim -3 is the head dim
    causal = causal_alignment if is_causal else "none"
    variants = _variants(query.dtype, window, alibi_slopes, softcap, relative_bias, relative_bias_bidirectional,
                         relative_bias_max_distance, document_ids, cu_seqlens)
    result = _attn.sdpa(_as4(query), _as4(key), _as4(value), mask, kind, None, "drop", causal, scale,
                        float(dropout_p), int(seed), bool(return_weights), bool(return_lse), backend,
                        bool(strict), bool(explain), dtype, variants)
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
                                          return_mask_grad=False, dtype="float32", window=None, alibi_slopes=None,
                                          softcap=0.0, relative_bias=None, relative_bias_bidirectional=True,
                                          relative_bias_max_distance=128, document_ids=None, cu_seqlens=None):
    """Gradients (dq, dk, dv) of scaled_dot_product_attention at (query, key, value).

    grad_out is dLoss/dout; out and lse come from the forward call (return_lse=True), whose other
    arguments (mask, dropout_p and seed, is_causal, scale, enable_gqa) must be passed again. With
    enable_gqa, dk and dv are summed over the query heads that share a key/value head. A fully masked
    row gets zero gradient. return_mask_grad=True (a float attn_mask) returns (dq, dk, dv, dmask) too:
    the mask's gradient dS, summed over the dims the mask broadcasts, in the mask's shape (it runs on the
    reference backward, the kernel that writes dS). dtype: the forward's, "float32" or "bfloat16" (the five
    products over bf16 pairs: Q, K, V, grad_out, P and dS rounded; sums and gradients fp32). The variants
    as the forward's; with a relative_bias, its gradient (num_buckets, H) comes last.
    """
    mask_shape = None if attn_mask is None else as_array(attn_mask, "attn_mask", _FLOATS).shape
    half = _is_half(query)
    (query, key, value), mask, kind = _prepare(query, key, value, attn_mask, enable_gqa)
    out, lse, grad_out = (np.asarray(as_array(x, n, _FLOATS), dtype=query.dtype)
                          for x, n in ((out, "out"), (lse, "lse"), (grad_out, "grad_out")))
    causal = causal_alignment if is_causal else "none"
    variants = _variants(query.dtype, window, alibi_slopes, softcap, relative_bias, relative_bias_bidirectional,
                         relative_bias_max_distance, document_ids, cu_seqlens)
    grads = _attn.sdpa_backward(_as4(query), _as4(key), _as4(value), _as4(out), _as4(lse[..., None])[..., 0],
                                _as4(grad_out), mask, kind, None, "drop", causal, scale, float(dropout_p),
                                int(seed), backend, bool(strict), bool(return_mask_grad), dtype, variants)
    result = [grads[0].reshape(query.shape), grads[1].reshape(key.shape), grads[2].reshape(value.shape)]
    if half:
        result = [g.astype(np.float16) for g in result]
    if return_mask_grad:
        result.append(_sum_to(grads[3].reshape(query.shape[:-1] + (key.shape[-2],)), mask_shape))
    if relative_bias is not None:
        result.append(grads[4])
    return tuple(result)


@torch_io
def varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, dropout_p=0.0, softmax_scale=None, causal=False,
                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, *, return_lse=False, seed=0,
                     backend="auto", strict=False, explain=False, dtype="float32"):
    """FlashAttention 2's flash_attn_varlen_func on attn's kernels: sequences of other lengths packed without
    padding, query (total_q, H, D), key (total_k, Hkv, D), value (total_k, Hkv, Dv); sequence i holds query
    rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] and key rows cu_seqlens_k[i]:cu_seqlens_k[i + 1] (int, first 0,
    last total). causal is bottom-right aligned within each sequence, as FlashAttention's; window_size, softcap
    and alibi_slopes (H,) as its. Returns out (total_q, H, Dv), with return_lse also lse (H, total_q). Read in
    place: the heads are strided views, never copied. Its backward: varlen_attention_backward."""
    q, k, v = _varlen_views(query, key, value)
    result = scaled_dot_product_attention(
        q, k, v, None, dropout_p, causal, softmax_scale, q.shape[1] != k.shape[1], causal_alignment="bottom_right",
        return_lse=return_lse, seed=seed, backend=backend, strict=strict, explain=explain, dtype=dtype,
        window=window_size, softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens=(cu_seqlens_q, cu_seqlens_k))
    if explain:
        return result
    out = (result[0] if return_lse else result)[0].swapaxes(0, 1)  # (total_q, H, Dv), a view
    return (out, result[1][0]) if return_lse else out


@torch_io
def varlen_attention_backward(grad_out, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k, dropout_p=0.0,
                              softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              alibi_slopes=None, *, seed=0, backend="auto", strict=False, dtype="float32"):
    """Gradients (dq, dk, dv) of varlen_attention, in the shapes of query, key and value; out and lse (H,
    total_q) from the forward (return_lse=True), whose arguments must be passed again."""
    q, k, v = _varlen_views(query, key, value)
    g, o = _varlen_views(grad_out, out)
    grads = scaled_dot_product_attention_backward(
        g, q, k, v, o, as_array(lse, "lse")[None], None, dropout_p, causal, softmax_scale, q.shape[1] != k.shape[1],
        causal_alignment="bottom_right", seed=seed, backend=backend, strict=strict, dtype=dtype, window=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes, cu_seqlens=(cu_seqlens_q, cu_seqlens_k))
    return tuple(x[0].swapaxes(0, 1) for x in grads)


def _varlen_views(*xs):
    """(total, heads, dim) arrays as (1, heads, total, dim) views."""
    arrays = [as_array(x, "query, key, value, out or grad_out") for x in xs]
    if any(a.ndim != 3 for a in arrays):
        raise _attn.AttnError(f"Expected (total, heads, dim) arrays for varlen attention (query (total_q, H, D), "
                              f"key (total_k, Hkv, D), value (total_k, Hkv, Dv)), but got "
                              f"{', '.join(str(a.shape) for a in arrays)} instead")
    return [a.swapaxes(0, 1)[None] for a in arrays]


def _int64(x, name):
    a = as_array(x, name)
    if a.dtype.kind not in "iu":
        raise _attn.AttnError(f"Expected {name} of an integer dtype, but got {a.dtype} instead")
    return np.asarray(a, dtype=np.int64)


def _variants(dtype, window, alibi_slopes, softcap, relative_bias, bidirectional, max_distance, document_ids,
              cu_seqlens=None):
    """The variants as _attn.sdpa's `variants` dict; folded batch dims as _as4 folds them."""
    v = {}
    if cu_seqlens is not None:
        v["cu_seqlens_q"], v["cu_seqlens_k"] = (_int64(c, n)
                                                for c, n in zip(cu_seqlens, ("cu_seqlens_q", "cu_seqlens_k")))
    if window is not None and tuple(window) != (-1, -1):
        v["window"] = (int(window[0]), int(window[1]))
    if alibi_slopes is not None:
        a = np.asarray(as_array(alibi_slopes, "alibi_slopes"), dtype=dtype)
        v["alibi_slopes"] = a if a.ndim <= 1 else a.reshape(-1, a.shape[-1])
    if softcap:
        v["softcap"] = float(softcap)
    if relative_bias is not None:
        v["relative_bias"] = np.asarray(as_array(relative_bias, "relative_bias"), dtype=dtype)
        v["relative_bidirectional"], v["relative_max_distance"] = bool(bidirectional), int(max_distance)
    if document_ids is not None:
        ids = _int64(document_ids, "document_ids")
        v["document_ids"] = ids.reshape(-1, ids.shape[-1]) if ids.ndim >= 1 else ids
    return v


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
