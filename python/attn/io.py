"""safetensors files: load and save dicts of float32 numpy arrays, readable by the safetensors library."""
import os

import numpy as np

import _attn


def load_safetensors(path, *, return_metadata=False):
    """{name: float32 array} from a safetensors file (F32, F64, F16 and BF16 are read as float32).

    With return_metadata=True, returns (tensors, metadata) where metadata is the file's
    "__metadata__" dict of strings. Raises attn.AttnError (a ValueError) for a malformed file.
    """
    tensors, metadata = _attn.load_safetensors(os.fspath(path))
    return (tensors, metadata) if return_metadata else tensors


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: float array} as F32 (atomically: a temporary file, fsync, rename).

    Values may be numpy arrays or anything np.asarray takes, torch tensors included (detached and
    moved to the CPU first); metadata is an optional dict of str to str.
    """
    def as_array(v):
        if hasattr(v, "detach"):  # a torch tensor; .float() also covers bfloat16, which numpy lacks
            v = v.detach().cpu()
            v = v.float() if v.is_floating_point() else v
            return v.numpy()
        return np.asarray(v)

    _attn.save_safetensors(os.fspath(path), {k: as_array(v) for k, v in tensors.items()}, metadata)
