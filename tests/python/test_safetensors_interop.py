"""safetensors interop with the safetensors library itself: its files load in attn with exact values,
attn's files open in safe_open / load_file with exact values and metadata (and are byte-identical to
the library's own), and corrupted files only ever raise attn.AttnError."""
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import attn

torch.set_num_threads(1)


def bits(a):
    """The float32 bit patterns, so -0.0 != 0.0 and NaN == NaN when compared: every NaN as the one quiet NaN
    (a corrupted fp16 signaling NaN 0x7C7F widens to 0x7F8FE000 in attn, exactly; torch's .float() gives
    0x7FFFFFFF; both are NaN, and hypothesis found the pair)."""
    a = np.array(a, np.float32, order="C")
    return np.where(np.isnan(a), np.float32("nan"), a).view(np.uint32)


def assert_same(ours, want):
    assert ours.dtype == np.float32
    assert ours.shape == tuple(want.shape)
    np.testing.assert_array_equal(bits(ours), bits(want))


def special(dtype):
    """Values that stress a conversion: zeros of both signs, infinities, NaN, subnormals, extremes."""
    info = torch.finfo(dtype)
    return torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), info.tiny, info.tiny / 4,
                         info.max, -info.max, info.eps, 1 / 3], dtype=dtype)


def torch_state():
    torch.manual_seed(0)
    sd = {}
    modules = {
        "self.": torch.nn.MultiheadAttention(8, 2),
        "cross.": torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3),  # q/k/v_proj_weight, no in_proj_weight
        "kv.": torch.nn.MultiheadAttention(8, 4, bias=False, add_bias_kv=True, batch_first=True),
    }
    for prefix, m in modules.items():
        sd.update({prefix + k: v for k, v in m.state_dict().items()})
    sd["f64"] = torch.randn(3, 4, dtype=torch.float64)
    sd["f16"] = torch.randn(2, 5).to(torch.float16)
    sd["bf16"] = torch.randn(7).to(torch.bfloat16)
    for dt in (torch.float64, torch.float16, torch.bfloat16, torch.float32):
        sd[f"special.{dt}"] = special(dt)
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 3)
    sd["empty16"] = torch.zeros(4, 0, dtype=torch.float16)
    return sd


def test_torch_save_file_loads_exactly(tmp_path):
    sd = torch_state()
    assert {"self.in_proj_weight", "cross.q_proj_weight", "cross.k_proj_weight", "kv.bias_k"} <= set(sd)
    path = tmp_path / "torch.safetensors"
    safetensors.torch.save_file(sd, str(path), metadata={"format": "pt", "note": "h\u00e9llo"})
    ours, meta = attn.load_safetensors(path, return_metadata=True)
    assert meta == {"format": "pt", "note": "h\u00e9llo"}
    assert set(ours) == set(sd)
    for name, t in sd.items():
        # torch's .float() is exact for F16/BF16 and rounds F64 to nearest, as ours must.
        assert_same(ours[name], t.float().numpy())


def test_our_files_open_in_the_library(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "w": rng.standard_normal((4, 6)).astype(np.float32),
        "b64": rng.standard_normal(5),  # float64, stored as F32
        "h16": rng.standard_normal((2, 2)).astype(np.float16),
        "scalar": np.array(-1.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "special": special(torch.float32).numpy(),
        "strided": rng.standard_normal((6, 4)).astype(np.float32).T,  # not C-contiguous
        "z": np.arange(3, dtype=np.float32),
    }
    want = {k: np.array(v, np.float32, order="C") for k, v in arrays.items()}  # the library needs C order
    meta = {"format": "np", "quote\"": "line\nbreak"}
    path = tmp_path / "ours.safetensors"
    attn.save_safetensors(path, arrays, metadata=meta)

    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == meta
        assert sorted(f.keys()) == sorted(want)
        for k in f.keys():
            assert_same(f.get_tensor(k), want[k])
    loaded = safetensors.torch.load_file(str(path))
    assert set(loaded) == set(want)
    for k, t in loaded.items():
        assert t.dtype == torch.float32
        assert_same(t.numpy(), want[k])
    # Byte-identical with what the library writes for the same float32 arrays (with at most one metadata
    # key: the library writes metadata in hash-map order, ours is sorted).
    for m in (None, {"format": "np"}):
        attn.save_safetensors(tmp_path / "same.safetensors", arrays, metadata=m)
        assert (tmp_path / "same.safetensors").read_bytes() == safetensors.numpy.save(want, metadata=m)
    # And our own reader gets the same back.
    ours, meta2 = attn.load_safetensors(path, return_metadata=True)
    assert meta2 == meta
    for k in want:
        assert_same(ours[k], want[k])


def test_torch_state_dict_round_trips_through_ours(tmp_path):
    torch.manual_seed(1)
    m = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3, batch_first=True)
    path = tmp_path / "mha.safetensors"
    attn.save_safetensors(path, m.state_dict())  # torch tensors are accepted as they are
    m2 = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3, batch_first=True)
    m2.load_state_dict(safetensors.torch.load_file(str(path)))
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 4, 5), torch.randn(2, 4, 3)
    with torch.no_grad():
        assert torch.equal(m(q, k, v)[0], m2(q, k, v)[0])


def test_errors_are_attn_errors_naming_the_file(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 63) + b"{}")
    with pytest.raises(attn.AttnError, match="bad.safetensors.*9223372036854775808"):
        attn.load_safetensors(path)
    assert issubclass(attn.AttnError, ValueError)
    with pytest.raises(attn.AttnError, match="float array.*int64"):
        attn.save_safetensors(tmp_path / "x.safetensors", {"i": np.arange(3)})
    with pytest.raises(attn.AttnError, match="metadata"):
        attn.save_safetensors(tmp_path / "x.safetensors", {}, metadata={"k": 1})
    assert not (tmp_path / "x.safetensors").exists()


# A valid file with several dtypes and metadata, written by the library, for the corruption test.
_GOOD = safetensors.torch.save({"a": torch.randn(3, 2), "b16": torch.randn(5).half(), "c64": torch.randn(2).double(),
                                "bf": torch.randn(3).bfloat16(), "s": torch.tensor(1.0)},
                               metadata={"format": "pt"})
_HEADER_END = 8 + struct.unpack("<Q", _GOOD[:8])[0]
_TMP = tempfile.TemporaryDirectory()


def _library_load(path):
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k).float().numpy() for k in f.keys()}
    except Exception:  # the library raises several types; only agreement on success is checked
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.one_of(st.integers(0, _HEADER_END - 1), st.integers(0, len(_GOOD) - 1)),
                                st.integers(0, 255)), max_size=6),
       cut=st.one_of(st.none(), st.integers(0, len(_GOOD))))
def test_corruption_only_raises_attn_error(edits, cut):
    b = bytearray(_GOOD)
    for pos, val in edits:
        b[pos] = val
    if cut is not None:
        del b[cut:]
    path = Path(_TMP.name) / "corrupt.safetensors"
    path.unlink(missing_ok=True)  # a new file: ext4 flushes a truncated-and-rewritten one on close (slow)
    path.write_bytes(bytes(b))
    try:
        ours = attn.load_safetensors(path)
    except attn.AttnError as e:
        assert str(path) in str(e)
        event("rejected")
        return
    # Loaded: plain float32 arrays, and where the library also reads the file, the same values.
    assert all(a.dtype == np.float32 for a in ours.values())
    theirs = _library_load(path)
    event("loaded" if theirs is None else "loaded, and so did the library")
    if theirs is not None:
        assert set(theirs) == set(ours)
        for k, a in theirs.items():
            assert_same(ours[k], a)
