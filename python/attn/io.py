"""safetensors files: load and save dicts of float32 numpy arrays, readable by the safetensors library."""
import os

import _attn

from ._interop import tensor_dict


def load_safetensors(path, *, return_metadata=False):
    """{name: float32 array} from a safetensors file (F32, F64, F16 and BF16 are read as float32).

    With return_metadata=True, returns (tensors, metadata) where metadata is the file's
    "__metadata__" dict of strings. Raises attn.AttnError (a ValueError, and a RuntimeError as torch raises) for
    a malformed file.
    """
    tensors, metadata = _attn.load_safetensors(os.fspath(path))
    return (tensors, metadata) if return_metadata else tensors


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: float array} as F32 (atomically: a temporary file, fsync, rename).

    Values may be numpy arrays or anything np.asarray takes, torch tensors included (detached and
    moved to the CPU first), of any float dtype; other dtypes are refused. metadata is an optional
    dict of str to str.
    """
    _attn.save_safetensors(os.fspath(path), tensor_dict(tensors), metadata)
