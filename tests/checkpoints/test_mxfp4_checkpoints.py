"""MXFP4 -> FP8_128x128 re-encoding (exact or refused) and the checkpoint adapters (issue 19).

Expectations are written here in float64 from the layouts' own definitions (gpt-oss:
lut[code] * 2**(scale - 127) with element 2i in the low nibble; DeepSeek-V3: weight *
weight_scale_inv per 128x128 tile; ModelOpt: lut[code] * weight_scale * weight_scale_2), never
through jax_gpuext's decoders. Files are written by the safetensors package itself (its NumPy
API takes ml_dtypes' float8 / bfloat16 arrays by name); the container's own tests are
tests/checkpoints/test_checkpoint_files.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import jax_gpuext as gx
from jax_gpuext import checkpoints as ck
from jax_gpuext.formats import reencode

E2M1_LUT = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def as_bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def mxfp4_values(q) -> np.ndarray:
    """float64 values of an MXFP4 array from its codes and E8M0 bytes (NaN for scale 0xFF)."""
    codes = as_bits(q.data) & 0xF
    s = as_bits(q.scale).astype(np.int64)
    s = np.take(np.repeat(s, 32, axis=-1), np.arange(codes.shape[-1]), axis=-1)
    return np.where(s == 0xFF, np.nan, np.ldexp(E2M1_LUT[codes], s - 127))


def random_mxfp4(rng, shape, scale_lo, scale_hi):
    """An MXFP4 array with every E2M1 code and E8M0 bytes drawn from [scale_lo, scale_hi]."""
    codes = rng.integers(0, 16, shape).astype(np.uint8)
    scales = rng.integers(scale_lo, scale_hi + 1, shape[:-1] + (-(-shape[-1] // 32),)).astype(np.uint8)
    return gx.BlockScaledArray(jnp.asarray(codes.view(ml_dtypes.float4_e2m1fn)),
                               jnp.asarray(scales.view(ml_dtypes.float8_e8m0fnu)), None, gx.MXFP4, -1)


# --------------------------------------------------------------------------- re-encoding
@pytest.mark.parametrize("shape,lo,hi", [((256, 384), 120, 133), ((130, 200), 0, 13), ((2, 128, 96), 241, 254)],
                         ids=["span13", "bottom_of_e8m0", "top_of_e8m0"])
def test_reencode_is_exact_bit_for_bit_within_the_safe_span(shape, lo, hi):
    assert hi - lo == reencode.SAFE_SCALE_SPAN
    q = random_mxfp4(np.random.default_rng(0), shape, lo, hi)
    f = reencode.mxfp4_to_fp8_128x128(q)
    assert f.format is gx.FP8_128x128 and f.data.dtype == jnp.float8_e4m3fn and f.scale.dtype == jnp.float32
    # float64 values of the re-encoding from its own bits: E4M3 * fp32 tile scale
    s = np.asarray(f.scale, np.float64)
    s = s[..., np.arange(shape[-2]) // 128, :][..., np.arange(shape[-1]) // 128]
    got = np.asarray(f.data).astype(np.float64) * s
    want = mxfp4_values(q)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))
    # and through the library's own dequantize: identical fp32 bits, subnormal results included
    for backend in ("reference", "cpu"):
        a = gx.dequantize(f, jnp.float32, backend=backend)
        b = gx.dequantize(q, jnp.float32, backend=backend)
        assert np.array_equal(as_bits(a), as_bits(b)), backend
    assert np.all((np.log2(np.asarray(f.scale)) % 1) == 0)  # tile scales are powers of two


def test_reencode_data_dependent_span_up_to_17():
    """Beyond the safe span, a tile is still exact when its actual values fit: 2**-9 .. 384."""
    codes = np.zeros((128, 128), np.uint8)
    scales = np.full((128, 4), 127, np.uint8)
    codes[0, 0], scales[0, 0] = 7, 133  # 6 * 2**6 = 384: the tile's top binade (1.5 * 2**8)
    codes[1, 0], scales[1, 0] = 1, 119  # 0.5 * 2**-8 = 2**-9: scale bytes span 14 > 13, values 17 binades
    q = gx.BlockScaledArray(jnp.asarray(codes.view(ml_dtypes.float4_e2m1fn)),
                            jnp.asarray(scales.view(ml_dtypes.float8_e8m0fnu)), None, gx.MXFP4, -1)
    f = reencode.mxfp4_to_fp8_128x128(q)
    assert float(f.scale[0, 0]) == 2.0 ** 0
    assert float(f.data[1, 0].astype(jnp.float32)) == 2.0 ** -9  # E4M3's smallest subnormal
    assert np.array_equal(np.asarray(f.data).astype(np.float64) * float(f.scale[0, 0]), mxfp4_values(q))


@pytest.mark.parametrize("low_code,low_scale,why", [(1, 118, "below E4M3's subnormals"),  # 2**-10
                                                    (3, 118, "below E4M3's subnormals")],  # 1.5 * 2**-9
                         ids=["sig1_span18", "sig1.5_span17"])
def test_reencode_refuses_a_tile_that_cannot_be_exact(low_code, low_scale, why):
    codes = np.zeros((256, 256), np.uint8)
    scales = np.full((256, 8), 127, np.uint8)
    codes[130, 131], scales[130, 4] = 7, 133  # tile (1, 1): 6 * 2**6
    codes[200, 140], scales[200, 4] = low_code, low_scale
    q = gx.BlockScaledArray(jnp.asarray(codes.view(ml_dtypes.float4_e2m1fn)),
                            jnp.asarray(scales.view(ml_dtypes.float8_e8m0fnu)), None, gx.MXFP4, -1)
    with pytest.raises(reencode.InexactTileError, match=r"tile \(1, 1\).*\(200, 140\)") as e:
        reencode.mxfp4_to_fp8_128x128(q)
    assert e.value.tile == (1, 1) and why in e.value.reason


def test_reencode_refuses_nan_scales_and_bad_inputs():
    q = random_mxfp4(np.random.default_rng(1), (128, 64), 126, 128)
    scale = as_bits(q.scale).copy()
    scale[5, 1] = 0xFF
    q = gx.BlockScaledArray(q.data, jnp.asarray(scale.view(ml_dtypes.float8_e8m0fnu)), None, gx.MXFP4, -1)
    with pytest.raises(reencode.InexactTileError, match="NaN scale"):
        reencode.mxfp4_to_fp8_128x128(q)
    with pytest.raises(TypeError, match="MXFP4"):
        reencode.mxfp4_to_fp8_128x128(gx.quantize(np.ones((4, 32), np.float32), gx.MXFP8_E4M3))
    with pytest.raises(ValueError, match="rank >= 2"):
        reencode.mxfp4_to_fp8_128x128(gx.quantize(np.ones(64, np.float32), gx.MXFP4))


def test_reencoded_weight_in_the_fp8_blockwise_dot_matches_float64():
    rng = np.random.default_rng(2)
    w = random_mxfp4(rng, (256, 384), 118, 124)
    x = rng.standard_normal((8, 384)).astype(np.float32)
    f = reencode.mxfp4_to_fp8_128x128(w)
    y = gx.block_scaled_dot(gx.quantize(x, gx.FP8_1x128), f, preferred_element_type=jnp.float32)
    qx = gx.quantize(x, gx.FP8_1x128)
    xs = np.asarray(qx.data).astype(np.float64) * np.repeat(np.asarray(qx.scale, np.float64), 128, -1)[:, :384]
    want = xs @ mxfp4_values(w).T
    mag = np.abs(xs) @ np.abs(mxfp4_values(w)).T
    assert np.all(np.abs(np.asarray(y, np.float64) - want) <= 2e-6 * mag + 1e-30)


# --------------------------------------------------------------------------- checkpoint files
def write_safetensors(path, tensors: dict):
    save_file(tensors, str(path))


def test_gpt_oss_layout_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, (2, 6, 4, 16), dtype=np.uint8)  # experts, rows, 4 blocks of 32
    scales = rng.integers(100, 140, (2, 6, 4), dtype=np.uint8)
    write_safetensors(tmp_path / "m.safetensors", {"block.0.mlp.mlp1_weight.blocks": blocks,
                                                   "block.0.mlp.mlp1_weight.scales": scales})
    q = ck.load_gpt_oss_mxfp4(ck.read_tensors(tmp_path / "m.safetensors"), "block.0.mlp.mlp1_weight")
    assert q.format is gx.MXFP4 and q.data.shape == (2, 6, 128) and q.scale.shape == (2, 6, 4)
    # gpt-oss's own decode: low nibble -> even element, lut[code] * 2**(scale - 127)
    codes = np.stack([blocks & 0xF, blocks >> 4], -1).reshape(2, 6, 4, 32)
    want = np.ldexp(E2M1_LUT[codes], scales[..., None].astype(np.int64) - 127).reshape(2, 6, 128)
    got = np.asarray(gx.dequantize(q, jnp.float32), np.float64)
    assert np.array_equal(got, want)
    back = ck.to_gpt_oss_mxfp4(q)
    assert np.array_equal(back["blocks"], blocks) and np.array_equal(back["scales"], scales)


def test_deepseek_layout_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((200, 300)).astype(ml_dtypes.float8_e4m3fn)
    s = (rng.random((2, 3)) + 0.5).astype(np.float32)
    write_safetensors(tmp_path / "ds.safetensors", {"layers.0.mlp.up.weight": w, "layers.0.mlp.up.weight_scale_inv": s})
    q = ck.load_deepseek_fp8(ck.read_tensors(tmp_path / "ds.safetensors"), "layers.0.mlp.up")
    assert q.format is gx.FP8_128x128
    want = w.astype(np.float64) * np.repeat(np.repeat(s, 128, 0), 128, 1)[:200, :300].astype(np.float64)
    got = np.asarray(gx.dequantize(q, jnp.float32), np.float64)
    assert np.array_equal(got, want.astype(np.float32))  # weight_dequant's fp32 product, rounded once
    back = ck.to_deepseek_fp8(q)
    assert as_bits(back["weight"]).tobytes() == as_bits(w).tobytes() and np.array_equal(back["weight_scale_inv"], s)


def test_modelopt_nvfp4_layout_round_trip(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.integers(0, 256, (24, 32), dtype=np.uint8)  # out 24, in 64
    ws = (rng.random((24, 4)) * 3 + 0.1).astype(ml_dtypes.float8_e4m3fn)
    ws2, ins = np.float32(0.013), np.float32(0.021)
    write_safetensors(tmp_path / "mo.safetensors", {"proj.weight": w, "proj.weight_scale": ws,
                                                    "proj.weight_scale_2": np.array(ws2), "proj.input_scale": np.array(ins)})
    q, act = ck.load_modelopt_nvfp4(ck.read_tensors(tmp_path / "mo.safetensors"), "proj")
    assert q.format is gx.NVFP4 and q.data.shape == (24, 64) and float(act) == float(ins)
    codes = np.stack([w & 0xF, w >> 4], -1).reshape(24, 64)
    exact = E2M1_LUT[codes] * np.repeat(ws.astype(np.float64), 16, -1) * float(ws2)
    got = np.asarray(gx.dequantize(q, jnp.float32), np.float64)
    assert np.all(np.abs(got - exact) <= np.abs(exact) * 2.0 ** -23)  # one fp32 rounding (docs/formats.md)
    back = ck.to_modelopt_nvfp4(q, act)
    assert np.array_equal(back["weight"], w) and as_bits(back["weight_scale"]).tobytes() == as_bits(ws).tobytes()
    assert back["weight_scale_2"] == ws2 and back["input_scale"] == ins


def test_layout_errors_name_the_tensor(tmp_path):
    with pytest.raises(ck.CheckpointLayoutError, match=r"w\.blocks: expected uint8"):
        ck.from_gpt_oss_mxfp4(np.zeros((4, 16), np.int8), np.zeros(4, np.uint8), name="w")
    with pytest.raises(ck.CheckpointLayoutError, match=r"w\.blocks: expected \[\.\.\., G, 16\]"):
        ck.from_gpt_oss_mxfp4(np.zeros((4, 8), np.uint8), np.zeros(4, np.uint8), name="w")
    with pytest.raises(ck.CheckpointLayoutError, match=r"w\.scales: expected shape \[4\]"):
        ck.from_gpt_oss_mxfp4(np.zeros((4, 16), np.uint8), np.zeros(5, np.uint8), name="w")
    with pytest.raises(ck.CheckpointLayoutError, match=r"up\.weight_scale_inv: expected shape \[2, 3\]"):
        ck.from_deepseek_fp8(np.zeros((200, 300), ml_dtypes.float8_e4m3fn), np.zeros((1, 3), np.float32), name="up.weight")
    with pytest.raises(ck.CheckpointLayoutError, match=r"up\.weight: expected float8_e4m3fn"):
        ck.from_deepseek_fp8(np.zeros((200, 300), np.float32), np.zeros((2, 3), np.float32), name="up.weight")
    with pytest.raises(ck.CheckpointLayoutError, match=r"p\.weight_scale: expected shape \[2, 4\]"):
        ck.from_modelopt_nvfp4(np.zeros((2, 32), np.uint8), np.zeros((2, 2), ml_dtypes.float8_e4m3fn),
                               np.float32(1), name="p.weight")
    with pytest.raises(ck.CheckpointLayoutError, match=r"p\.weight_scale_2: expected float32"):
        ck.from_modelopt_nvfp4(np.zeros((2, 32), np.uint8), np.zeros((2, 4), ml_dtypes.float8_e4m3fn),
                               np.float16(1), name="p.weight")
    with pytest.raises(ck.CheckpointLayoutError, match="tensor x.blocks is missing"):
        ck.load_gpt_oss_mxfp4({}, "x")
    assert issubclass(ck.CheckpointLayoutError, ck.CheckpointError)  # one family: except CheckpointError
    write_safetensors(tmp_path / "w.safetensors", {"w.blocks": np.zeros((4, 8), np.uint8),
                                                   "w.scales": np.zeros(4, np.uint8)})
    with pytest.raises(ck.CheckpointError, match=r"w\.blocks: expected \[\.\.\., G, 16\]"):
        ck.load_gpt_oss_mxfp4(ck.read_tensors(tmp_path / "w.safetensors"), "w")


def test_npz_and_the_package_writer(tmp_path):
    rng = np.random.default_rng(6)
    blocks, scales = rng.integers(0, 256, (3, 2, 16), dtype=np.uint8), rng.integers(120, 130, (3, 2), dtype=np.uint8)
    np.savez(tmp_path / "g.npz", **{"w.blocks": blocks, "w.scales": scales})
    q = ck.load_gpt_oss_mxfp4(ck.read_tensors(tmp_path / "g.npz"), "w")
    ck.write_safetensors(tmp_path / "g.safetensors", {f"w.{k}": v for k, v in ck.to_gpt_oss_mxfp4(q).items()})
    again = ck.read_tensors(tmp_path / "g.safetensors")
    assert np.array_equal(again["w.blocks"], blocks) and np.array_equal(again["w.scales"], scales)
    np.savez(tmp_path / "f8.npz", w=np.zeros((4, 4), ml_dtypes.float8_e4m3fn))
    with pytest.raises(ck.CheckpointLayoutError, match="npz files lose"):
        ck.from_deepseek_fp8(ck.read_tensors(tmp_path / "f8.npz")["w"], np.ones((1, 1), np.float32), name="w")
