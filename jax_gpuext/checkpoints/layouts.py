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

Any mismatch of shape, dtype or packing raises ``CheckpointLayoutError`` naming the tensor. The
files these arrays come from are read by ``container`` (``read_tensors``).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_gpuext import formats
from jax_gpuext.checkpoints.container import CheckpointError, fp4_pack, fp4_unpack

MXFP4_BYTES_PER_BLOCK = 16  # 32 E2M1 codes, two per byte
DEEPSEEK_TILE = 128
NVFP4_BLOCK = 16


class CheckpointLayoutError(CheckpointError):
    """A checkpoint tensor whose shape, dtype or packing is not the layout's."""


def _array(x, name: str, dtype, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.dtype(dtype):
        hint = " (NumPy .npz files lose ml_dtypes types such as float8; use safetensors)" if a.dtype.kind == "V" else ""
        raise CheckpointLayoutError(f"{name}: expected {np.dtype(dtype).name} ({what}), got {a.dtype} "
                                    f"with shape {list(a.shape)}{hint}")
    return a


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
    data = fp4_unpack(b).reshape(b.shape[:-2] + (b.shape[-2] * 2 * MXFP4_BYTES_PER_BLOCK,))
    return formats.BlockScaledArray(jnp.asarray(data), jnp.asarray(s.view(ml_dtypes.float8_e8m0fnu)), None,
                                    formats.MXFP4, -1)


def to_gpt_oss_mxfp4(q) -> dict[str, np.ndarray]:
    """MXFP4 blocked along the last axis -> {"blocks", "scales"} in gpt-oss's layout."""
    _check_format(q, formats.MXFP4, "to_gpt_oss_mxfp4")
    k = q.data.shape[-1]
    if k % 32:
        raise CheckpointLayoutError(f"gpt-oss stores whole 32-blocks; the last axis is {k}")
    packed = fp4_pack(q.data, "to_gpt_oss_mxfp4")
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
        input_name = (name[: -len("weight")] if name.endswith("weight") else f"{name}.") + "input_scale"
        a = _array(input_scale, input_name, np.float32, "the activations' fp32 global scale")
        if a.size != 1:
            raise CheckpointLayoutError(f"{input_name}: expected one value, got shape {list(a.shape)}")
        act = jnp.asarray(a.reshape(()))
    q = formats.BlockScaledArray(jnp.asarray(fp4_unpack(w)), jnp.asarray(s), jnp.asarray(g.reshape(())),
                                 formats.NVFP4, -1)
    return q, act


def to_modelopt_nvfp4(q, input_scale=None) -> dict[str, np.ndarray]:
    _check_format(q, formats.NVFP4, "to_modelopt_nvfp4")
    if q.data.ndim != 2 or q.data.shape[1] % 2 or np.ndim(q.global_scale) != 0:
        raise CheckpointLayoutError(f"ModelOpt NVFP4 weights are [out, in] (in even: two per byte) with one global "
                                    f"scale; got data {list(q.data.shape)}, global scale shape "
                                    f"{list(np.shape(q.global_scale))}")
    out = {"weight": fp4_pack(q.data, "to_modelopt_nvfp4"), "weight_scale": np.asarray(q.scale),
           "weight_scale_2": np.asarray(q.global_scale, np.float32)}
    if input_scale is not None:
        out["input_scale"] = np.asarray(input_scale, np.float32)
    return out


# --------------------------------------------------------------------------- {name: array} from read_tensors
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
