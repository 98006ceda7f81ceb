"""Arrays into attn and back without copies: numpy arrays, CPU torch tensors (their memory, detached, via
.numpy()), anything else with __dlpack__ or the buffer protocol. A torch tensor in gives a torch tensor out
(torch_io); numpy in gives numpy out. torch is never imported here: a tensor that arrived brings it.

Not a converter of dtypes: attn computes in float32 (and float64 where a function says so); bfloat16 and
float16 are refused by name rather than widened behind the caller's back, except where a function says it
takes them (scaled_dot_product_attention: float16 in float32; attn.torch).
"""
import functools

import numpy as np

import _attn

# The one dtype rule, in every message that refuses a dtype.
DTYPE_RULE = ("attn computes in float32 everywhere, and in float64 too in scaled_dot_product_attention and its "
              "backward (which take float16 too, computed in float32); elsewhere bfloat16 and float16 are refused, "
              "not widened")


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "numpy")


def as_array(x, name, floats=("float32", "float64")):
    """x as a numpy array sharing its memory; `name` and `floats` (the dtypes allowed) are for the error."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise _attn.AttnError(f"Expected {name} on the CPU, but got a tensor on {x.device} instead")
        kind = str(x.dtype).removeprefix("torch.")
        if x.is_floating_point() and kind not in floats:
            raise _attn.AttnError(f"Expected {name} of dtype {' or '.join(floats)}, but got {x.dtype} instead "
                                  f"({DTYPE_RULE}: convert with .float() first)")
        return x.detach().resolve_conj().resolve_neg().numpy()
    if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def tensor_dict(tensors):
    """{name: numpy array} of a dict of arrays or torch tensors, for the bindings' one converter of tensors
    by name (python/numpy_view.h: a float array of any precision is stored as float32, any other dtype is
    refused by name). torch tensors are detached and moved to the CPU; bfloat16, which numpy lacks, is
    widened to float32 here."""
    def one(v):
        if is_torch(v):
            v = v.detach().cpu()
            return (v.float() if str(v.dtype) == "torch.bfloat16" else v).numpy()
        return v if isinstance(v, np.ndarray) else np.asarray(v)
    return {k: one(v) for k, v in tensors.items()}


def to_torch(result):
    """numpy arrays (also inside tuples and lists) as torch tensors over the same memory."""
    import torch
    if isinstance(result, np.ndarray):
        return torch.from_numpy(result)
    if isinstance(result, (tuple, list)):
        return type(result)(to_torch(r) for r in result)
    return result


def torch_io(f):
    """Decorator: if any argument is a torch tensor, the numpy results come back as torch tensors."""
    @functools.wraps(f)
    def call(*args, **kwargs):
        result = f(*args, **kwargs)
        if any(is_torch(a) for a in args) or any(is_torch(a) for a in kwargs.values()):
            return to_torch(result)
        return result
    return call
