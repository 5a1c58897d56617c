"""Block-scaled weights exactly as published checkpoints store them, to ``BlockScaledArray`` and
back, without re-quantizing: the adapters move bits, never round.

Three layouts (docs/mxfp4_checkpoints.md cites the code each fact comes from):

- gpt-oss MXFP4 (openai/gpt-oss ``gpt_oss/torch/weights.py``): ``<name>.blocks`` uint8
  ``[*prefix, G, 16]`` (32 E2M1 codes per block, element 2i in the low nibble of byte i) and
  ``<name>.scales`` uint8 ``[*prefix, G]`` (E8M0, value 2**(s - 127)); the weight is
  ``[*prefix, 32 G]`` with blocks along the last (input-feature) axis -> ``MXFP4``, axis -1.
- DeepSeek-V3 FP8 (deepseek-ai/DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant``):
  ``weight`` float8_e4m3fn ``[out, in]`` and ``weight_scale_inv`` float32
  ``[ceil(out/128), ceil(in/128)]``, dequantized as ``weight * weight_scale_inv`` per 128x128
  tile -> ``FP8_128x128``.
- ModelOpt NVFP4 (NVIDIA/TensorRT-Model-Optimizer ``modelopt/torch/quantization/qtensor/
  nvfp4_tensor.py``): ``weight`` uint8 ``[out, in/2]`` (element 2i in the low nibble),
  ``weight_scale`` float8_e4m3fn ``[out, in/16]``, ``weight_scale_2`` float32 (amax / (6 * 448):
  the dequantisation global scale, as ours), ``input_scale`` float32 (the activations' global
  scale, for ``quantize(x, NVFP4, global_scale=input_scale)``) -> ``NVFP4``, axis -1.

Any mismatch of shape, dtype or packing raises ``CheckpointLayoutError`` naming the tensor.
``read_safetensors`` reads a .safetensors file without the safetensors package (its format is
an 8-byte header length, a JSON header and raw little-endian bytes); ``.npz`` works through NumPy.
"""

from __future__ import annotations

import json
import os
import struct

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_gpuext import formats

MXFP4_BYTES_PER_BLOCK = 16  # 32 E2M1 codes, two per byte
DEEPSEEK_TILE = 128
NVFP4_BLOCK = 16


class CheckpointLayoutError(ValueError):
    """A checkpoint tensor whose shape, dtype or packing is not the layout's."""


def _array(x, name: str, dtype, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.dtype(dtype):
        hint = " (NumPy .npz files lose ml_dtypes types such as float8; use safetensors)" if a.dtype.kind == "V" else ""
        raise CheckpointLayoutError(f"{name}: expected {np.dtype(dtype).name} ({what}), got {a.dtype} "
                                    f"with shape {list(a.shape)}{hint}")
    return a


def _fp4_unpack(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., n] -> float4_e2m1fn [..., 2n], element 2i from the low nibble of byte i."""
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (-1,))
    return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn)


def _fp4_pack(data) -> np.ndarray:
    """float4_e2m1fn [..., 2n] -> uint8 [..., n], element 2i in the low nibble of byte i."""
    codes = np.asarray(data).view(np.uint8) & 0xF
    if codes.shape[-1] % 2:
        raise CheckpointLayoutError(f"FP4 data with an odd last axis ({codes.shape[-1]}) cannot be packed two per byte")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _check_format(q, fmt, what: str):
    if not isinstance(q, formats.BlockScaledArray) or q.format.name != fmt.name:
        raise TypeError(f"{what} takes a {fmt.name} BlockScaledArray, got {q!r}")
    if q.axis != -1 and not fmt.per_tensor:
        raise CheckpointLayoutError(f"{what}: the layout blocks the last axis; this array is blocked along {q.axis}")


# --------------------------------------------------------------------------- gpt-oss MXFP4
def from_gpt_oss_mxfp4(blocks, scales, *, name: str = "weight") -> formats.BlockScaledArray:
    """``<name>.blocks`` uint8 [*prefix, G, 16] and ``<name>.scales`` uint8 [*prefix, G] -> MXFP4
    [*prefix, 32 G] blocked along the last axis."""
    b = _array(blocks, f"{name}.blocks", np.uint8, "two E2M1 codes per byte")
    s = _array(scales, f"{name}.scales", np.uint8, "E8M0 exponents biased by 127")
    if b.ndim < 2 or b.shape[-1] != MXFP4_BYTES_PER_BLOCK:
        raise CheckpointLayoutError(f"{name}.blocks: expected [..., G, {MXFP4_BYTES_PER_BLOCK}] (32 E2M1 codes "
                                    f"packed per block), got shape {list(b.shape)}")
    if s.shape != b.shape[:-1]:
        raise CheckpointLayoutError(f"{name}.scales: expected shape {list(b.shape[:-1])} (one per 32-block of "
                                    f"{name}.blocks {list(b.shape)}), got {list(s.shape)}")
    data = _fp4_unpack(b).reshape(b.shape[:-2] + (b.shape[-2] * 2 * MXFP4_BYTES_PER_BLOCK,))
    return formats.BlockScaledArray(jnp.asarray(data), jnp.asarray(s.view(ml_dtypes.float8_e8m0fnu)), None,
                                    formats.MXFP4, -1)


def to_gpt_oss_mxfp4(q) -> dict[str, np.ndarray]:
    """MXFP4 blocked along the last axis -> {"blocks", "scales"} in gpt-oss's layout."""
    _check_format(q, formats.MXFP4, "to_gpt_oss_mxfp4")
    k = q.data.shape[-1]
    if k % 32:
        raise CheckpointLayoutError(f"gpt-oss stores whole 32-blocks; the last axis is {k}")
    packed = _fp4_pack(q.data)
    return {"blocks": packed.reshape(packed.shape[:-1] + (k // 32, MXFP4_BYTES_PER_BLOCK)),
            "scales": np.asarray(q.scale).view(np.uint8)}


# --------------------------------------------------------------------------- DeepSeek-V3 FP8
def from_deepseek_fp8(weight, weight_scale_inv, *, name: str = "weight") -> formats.BlockScaledArray:
    """``weight`` float8_e4m3fn [out, in] and ``weight_scale_inv`` float32 [ceil(out/128),
    ceil(in/128)] -> FP8_128x128 (value = weight * weight_scale_inv per tile)."""
    w = _array(weight, name, ml_dtypes.float8_e4m3fn, "E4M3 elements")
    s = _array(weight_scale_inv, f"{name}_scale_inv", np.float32, "one fp32 scale per 128x128 tile")
    if w.ndim != 2:
        raise CheckpointLayoutError(f"{name}: expected [out, in], got shape {list(w.shape)}")
    expected = formats.scale_shape(w.shape, formats.FP8_128x128)
    if s.shape != expected:
        raise CheckpointLayoutError(f"{name}_scale_inv: expected shape {list(expected)} (ceil of {name} "
                                    f"{list(w.shape)} / 128), got {list(s.shape)}")
    return formats.BlockScaledArray(jnp.asarray(w), jnp.asarray(s), None, formats.FP8_128x128, -1)


def to_deepseek_fp8(q) -> dict[str, np.ndarray]:
    _check_format(q, formats.FP8_128x128, "to_deepseek_fp8")
    if q.data.ndim != 2:
        raise CheckpointLayoutError(f"DeepSeek-V3 weights are [out, in]; got shape {list(q.data.shape)}")
    return {"weight": np.asarray(q.data), "weight_scale_inv": np.asarray(q.scale)}


# --------------------------------------------------------------------------- ModelOpt NVFP4
def from_modelopt_nvfp4(weight, weight_scale, weight_scale_2, input_scale=None, *, name: str = "weight"):
    """ModelOpt NVFP4 -> (NVFP4 BlockScaledArray [out, in], activation global scale or None)."""
    w = _array(weight, name, np.uint8, "two E2M1 codes per byte")
    s = _array(weight_scale, f"{name}_scale", ml_dtypes.float8_e4m3fn, "one E4M3 scale per 16")
    g = _array(weight_scale_2, f"{name}_scale_2", np.float32, "the fp32 global scale")
    if w.ndim != 2:
        raise CheckpointLayoutError(f"{name}: expected [out, in/2] packed, got shape {list(w.shape)}")
    if g.size != 1:
        raise CheckpointLayoutError(f"{name}_scale_2: expected one value, got shape {list(g.shape)}")
    in_features = 2 * w.shape[1]
    expected = (w.shape[0], -(-in_features // NVFP4_BLOCK))
    if s.shape != expected:
        raise CheckpointLayoutError(f"{name}_scale: expected shape {list(expected)} (one per 16 of the "
                                    f"{in_features} packed inputs of {name} {list(w.shape)}), got {list(s.shape)}")
    act = None
    if input_scale is not None:
        a = _array(input_scale, "input_scale", np.float32, "the activations' fp32 global scale")
        if a.size != 1:
            raise CheckpointLayoutError(f"input_scale: expected one value, got shape {list(a.shape)}")
        act = jnp.asarray(a.reshape(()))
    q = formats.BlockScaledArray(jnp.asarray(_fp4_unpack(w)), jnp.asarray(s), jnp.asarray(g.reshape(())),
                                 formats.NVFP4, -1)
    return q, act


def to_modelopt_nvfp4(q, input_scale=None) -> dict[str, np.ndarray]:
    _check_format(q, formats.NVFP4, "to_modelopt_nvfp4")
    if q.data.ndim != 2 or np.ndim(q.global_scale) != 0:
        raise CheckpointLayoutError(f"ModelOpt NVFP4 weights are [out, in] with one global scale; got data "
                                    f"{list(q.data.shape)}, global scale shape {list(np.shape(q.global_scale))}")
    out = {"weight": _fp4_pack(q.data), "weight_scale": np.asarray(q.scale),
           "weight_scale_2": np.asarray(q.global_scale, np.float32)}
    if input_scale is not None:
        out["input_scale"] = np.asarray(input_scale, np.float32)
    return out


# --------------------------------------------------------------------------- files
# safetensors dtype names -> NumPy dtypes (the ones these layouts use, plus the common floats)
SAFETENSORS_DTYPES = {
    "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2), "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I32": np.dtype(np.int32), "I64": np.dtype(np.int64), "F64": np.dtype(np.float64),
}


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as a NumPy array (memory-mapped, read-only)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointLayoutError(f"{path}: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointLayoutError(f"{path}: header length {n} exceeds the file ({size} bytes)")
        header = json.loads(f.read(n))
    raw = np.memmap(path, np.uint8, "r", offset=8 + n, shape=(size - 8 - n,)) if size > 8 + n else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dt is None:
            raise CheckpointLayoutError(f"{path}: tensor {name} has dtype {info.get('dtype')!r}, not one of "
                                        f"{sorted(SAFETENSORS_DTYPES)}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= begin <= end <= raw.size or end - begin != int(np.prod(shape)) * dt.itemsize:
            raise CheckpointLayoutError(f"{path}: tensor {name} ({info['dtype']}{list(shape)}) has data offsets "
                                        f"[{begin}, {end}) that do not fit its size or the file")
        out[name] = raw[begin:end].view(dt).reshape(shape)
    return out


def write_safetensors(path, tensors: dict) -> None:
    """{name: array} -> a .safetensors file (the inverse of ``read_safetensors``)."""
    names = {dt: n for n, dt in SAFETENSORS_DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(np.asarray(a))
        if a.dtype not in names:
            raise CheckpointLayoutError(f"{name}: dtype {a.dtype} has no safetensors name")
        raw = a.tobytes()  # safetensors is little-endian, as every host JAX runs on
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


def read_tensors(path) -> dict[str, np.ndarray]:
    """A .safetensors or .npz file as {name: array}."""
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    if path.endswith(".npz"):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    raise ValueError(f"{path}: expected a .safetensors or .npz file")


def _need(tensors, name: str):
    if name not in tensors:
        raise CheckpointLayoutError(f"tensor {name} is missing (have: {sorted(tensors)[:20]})")
    return tensors[name]


def load_gpt_oss_mxfp4(tensors, name: str) -> formats.BlockScaledArray:
    """``<name>.blocks`` / ``<name>.scales`` from {name: array} (``read_tensors``)."""
    return from_gpt_oss_mxfp4(_need(tensors, f"{name}.blocks"), _need(tensors, f"{name}.scales"), name=name)


def load_deepseek_fp8(tensors, prefix: str) -> formats.BlockScaledArray:
    """``<prefix>.weight`` / ``<prefix>.weight_scale_inv``."""
    return from_deepseek_fp8(_need(tensors, f"{prefix}.weight"), _need(tensors, f"{prefix}.weight_scale_inv"),
                             name=f"{prefix}.weight")


def load_modelopt_nvfp4(tensors, prefix: str):
    """``<prefix>.weight`` / ``.weight_scale`` / ``.weight_scale_2`` / ``.input_scale`` (optional)."""
    return from_modelopt_nvfp4(_need(tensors, f"{prefix}.weight"), _need(tensors, f"{prefix}.weight_scale"),
                               _need(tensors, f"{prefix}.weight_scale_2"), tensors.get(f"{prefix}.input_scale"),
                               name=f"{prefix}.weight")
