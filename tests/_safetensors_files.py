"""Checkpoint files for the tests, made and judged without jax_gpuext's reader.

- Valid files are written by the safetensors package (``safetensors.serialize`` with its own
  ``TensorSpec`` names, so which NumPy dtype each code stands for is safetensors' word, not our
  table). F6, which its writer cannot name, is written as U8 and relabelled in the header, and
  the result is checked by safetensors' reader.
- ``split`` / ``build`` take a file apart into (header as JSON, data bytes) and back, for mutations.
- ``expected`` decides what a file holds: safetensors' ``deserialize`` (the library's own
  validation) decides valid or not, plus the rules jax_gpuext adds (a name given twice; a
  BOOL byte other than 0/1; a shape NumPy cannot hold). Sub-byte codes are unpacked here with ``np.unpackbits`` as the
  LSB-first bit stream, independently of jax_gpuext's arithmetic.
"""

from __future__ import annotations

import json
import re
import struct

import ml_dtypes
import numpy as np
import safetensors

# Sub-byte codes: (the ml_dtypes element type, bits per element) by the OCP MX names.
SUB_BYTE = {"F4": (np.dtype(ml_dtypes.float4_e2m1fn), 4), "F6_E2M3": (np.dtype(ml_dtypes.float6_e2m3fn), 6),
            "F6_E3M2": (np.dtype(ml_dtypes.float6_e3m2fn), 6)}


def build(header, data: bytes = b"", *, text: bytes | None = None, length: int | None = None) -> bytes:
    """u64 header length, header (``header`` as JSON, or ``text`` as given), data."""
    text = json.dumps(header).encode() if text is None else text
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def split(blob: bytes):
    """(header dict, data bytes) of a valid file."""
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def installed_dtypes() -> list[str]:
    """Every dtype code the installed safetensors knows, from its own refusal of an unknown one."""
    try:
        safetensors.deserialize(build({"t": {"dtype": "?", "shape": [], "data_offsets": [0, 0]}}))
    except Exception as e:  # noqa: BLE001
        found = re.search(r"expected one of (.*)", str(e))
        if found:
            return re.findall(r"`([A-Z0-9_]+)`", found.group(1))
        raise AssertionError(f"safetensors' refusal of dtype '?' no longer lists its dtypes: {e}") from e
    raise AssertionError("safetensors accepted dtype '?'")


def _writer_dtypes() -> dict[str, np.dtype]:
    """code -> NumPy dtype, for every code safetensors' writer has a NumPy / ml_dtypes name for."""
    out = {}
    for name in sorted({np.dtype(t).name for t in set(np.sctypeDict.values())}):
        try:
            out[safetensors.TensorSpec(dtype=name, shape=[8], data_ptr=0, data_len=0).dtype] = np.dtype(name)
        except Exception:  # noqa: BLE001 - a name safetensors does not write
            continue
    return out


WRITER_DTYPES = _writer_dtypes()


def element_dtype(code: str) -> np.dtype:
    return SUB_BYTE[code][0] if code in SUB_BYTE else WRITER_DTYPES[code]


def random_tensor(code: str, shape, seed: int) -> np.ndarray:
    """Every bit pattern of the type (NaN payloads, negative zeros, ...) equally likely; BOOL 0/1."""
    rng = np.random.default_rng(seed)
    dtype = element_dtype(code)
    raw = rng.integers(0, 256, size=int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dtype=np.uint8)
    if code == "BOOL":
        raw &= 1
    elif code in SUB_BYTE:
        raw &= (1 << SUB_BYTE[code][1]) - 1
    return raw.view(dtype).reshape(shape)


def packed_bytes(codes: np.ndarray, bits: int) -> bytes:
    """Element codes -> the LSB-first bit stream, via np.packbits."""
    stream = np.unpackbits(codes.reshape(-1, 1).view(np.uint8), axis=1, bitorder="little")[:, :bits]
    return np.packbits(stream.reshape(-1), bitorder="little").tobytes()


def unpacked_codes(data: bytes, bits: int) -> np.ndarray:
    stream = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little").reshape(-1, bits)
    return (stream.astype(np.uint16) << np.arange(bits, dtype=np.uint16)).sum(axis=1).astype(np.uint8)


def serialize(tensors: dict, metadata: dict | None = None) -> bytes:
    """A .safetensors file of {name: array} written by safetensors itself."""
    keep, specs, relabel = [], {}, {}
    for name, a in tensors.items():
        code = next((c for c, (dt, _) in SUB_BYTE.items() if a.dtype == dt), None)
        if code is not None:
            data = np.frombuffer(packed_bytes(a.view(np.uint8), SUB_BYTE[code][1]), np.uint8)
            if code == "F4" and a.ndim and a.shape[-1] % 2 == 0:
                spec_shape, writer = list(a.shape[:-1]) + [a.shape[-1] // 2], "float4_e2m1fn_x2"
            else:  # what safetensors' writer cannot name: U8 bytes, relabelled below
                spec_shape, writer = [data.size], "uint8"
                relabel[name] = (code, list(a.shape))
        else:
            data, spec_shape, writer = np.ascontiguousarray(a), list(a.shape), a.dtype.name
        keep.append(data)
        specs[name] = safetensors.TensorSpec(dtype=writer, shape=spec_shape, data_ptr=data.ctypes.data,
                                             data_len=data.nbytes)
    # (metadata {} as None: with no tensors, safetensors 0.7 / 0.8 write {} as the unreadable
    # header `{},"__metadata__":{}}`, a bug of its writer that its reader rightly refuses)
    blob = bytes(safetensors.serialize(specs, metadata=metadata or None))
    if relabel:
        header, data = split(blob)
        for name, (code, shape) in relabel.items():
            header[name].update(dtype=code, shape=shape)
        blob = build(header, data)
        safetensors.deserialize(blob)  # still a file safetensors accepts
    return blob


def repeated_name(text: bytes) -> str | None:
    """The first JSON object key given twice, at any level, or None."""
    found = []

    def hook(pairs):
        keys = [k for k, _ in pairs]
        found.extend(k for i, k in enumerate(keys) if k in keys[:i])
        return dict(pairs)
    json.loads(text, object_pairs_hook=hook)
    return found[0] if found else None


def decode(code: str, shape, data: bytes) -> np.ndarray:
    if code in SUB_BYTE:
        dtype, bits = SUB_BYTE[code]
        return unpacked_codes(data, bits).view(dtype).reshape(shape)
    return np.frombuffer(data, WRITER_DTYPES[code].newbyteorder("<")).reshape(shape)


def expected(blob: bytes):
    """("refused", why) or ("loaded", {name: array}): what a reader must make of this file."""
    try:
        tensors = safetensors.deserialize(blob)
    except Exception as e:  # noqa: BLE001 - refused by safetensors: the reason is its message
        return "refused", f"safetensors: {e}"
    (n,) = struct.unpack("<Q", blob[:8])
    twice = repeated_name(blob[8:8 + n])
    if twice is not None:
        return "refused", f"name {twice!r} given twice"
    out = {}
    for name, info in tensors:
        try:
            out[name] = decode(info["dtype"], info["shape"], bytes(info["data"]))
        except ValueError as e:  # valid to safetensors, but no ndarray has this shape (rank > 64, [0, 2**62, 4])
            return "refused", f"NumPy cannot hold tensor {name!r} of shape {info['shape']}: {e}"
        if info["dtype"] == "BOOL" and out[name].view(np.uint8).max(initial=0) > 1:
            return "refused", f"BOOL tensor {name!r} holds a byte other than 0 / 1"
    return "loaded", out


def assert_same_tensors(got: dict, want: dict, context: str) -> None:
    assert sorted(got) == sorted(want), f"names {sorted(got)} != {sorted(want)} ({context})"
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype.newbyteorder("="), f"{name!r}: dtype {g.dtype} != {w.dtype} ({context})"
        assert g.shape == w.shape, f"{name!r}: shape {g.shape} != {w.shape} ({context})"
        assert g.tobytes() == w.astype(w.dtype.newbyteorder("=")).tobytes(), f"{name!r}: bytes differ ({context})"
