"""quantize_both_axes == (quantize(axis=-1), quantize(axis=-2)) bit for bit on the CPU backends (the
CUDA fused kernel: test_formats_gpu.py), with NVFP4's global scale shared, under jit and vmap; its
errors are quantize's."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext import formats
from jax_gpuext.dot import recipe
from test_formats import BACKENDS, DTYPES, as_bits, assert_bits_equal, random_blocks

ONE_D = [f for f in formats.FORMATS.values() if len(f.block) != 2]  # FP8_128x128 has no axis -2


@functools.cache
def both(fmt, backend, rounding=None):
    return jax.jit(lambda x: gx.quantize_both_axes(x, fmt, scale_rounding=rounding, backend=backend))


@functools.cache
def single(fmt, backend, axis, rounding=None):
    return jax.jit(lambda x: gx.quantize(x, fmt, axis=axis, scale_rounding=rounding, backend=backend))


def assert_same(got, want, what):
    assert got.axis == want.axis and got.format is want.format, what
    assert_bits_equal(got.data, as_bits(np.asarray(want.data)), f"{what} data")
    assert_bits_equal(got.scale, as_bits(np.asarray(want.scale)), f"{what} scale")
    if want.global_scale is not None:
        assert as_bits(np.asarray(got.global_scale)) == as_bits(np.asarray(want.global_scale)), what


def inputs(dtype):
    """random_blocks' specials (NaN, Inf, zero, subnormal blocks) spread across rows and columns, and
    a batch dim with partial blocks both ways (33 rows, 200 columns: no block length divides either)."""
    rng = np.random.default_rng(3)
    return [random_blocks(5, 12, (256,), dtype).reshape(48, 64), (rng.standard_normal((2, 33, 200)) * 5).astype(dtype)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ONE_D, ids=[f.name for f in ONE_D])
def test_both_axes_equal_two_quantize_calls(fmt, dtype, backend):
    for x in inputs(dtype):
        q_last, q_second = both(fmt, backend)(x)
        assert_same(q_last, single(fmt, backend, -1)(x), f"{fmt.name} {backend} {x.shape} axis -1")
        assert_same(q_second, single(fmt, backend, -2)(x), f"{fmt.name} {backend} {x.shape} axis -2")
        # and the reference, so a backend cannot agree with itself only
        assert_same(q_second, single(fmt, "reference", -2)(x), f"{fmt.name} {backend} {x.shape} vs reference")


@pytest.mark.parametrize("rounding", ["up", "nearest"])
def test_nvfp4_shares_one_global_scale(rounding):
    x = (np.random.default_rng(4).standard_normal((64, 96)) * 7).astype(np.float32)
    for backend in BACKENDS:
        q_last, q_second = both(gx.NVFP4, backend, rounding)(x)
        assert q_last.global_scale is not None
        np.testing.assert_array_equal(as_bits(np.asarray(q_last.global_scale)), as_bits(np.asarray(q_second.global_scale)))
        assert_same(q_second, single(gx.NVFP4, backend, -2, rounding)(x), f"NVFP4 {rounding} {backend}")
    g = np.float32(0.02)
    got = jax.jit(lambda v: gx.quantize_both_axes(v, gx.NVFP4, global_scale=g, backend="cpu"))(x)
    want = jax.jit(lambda v: gx.quantize(v, gx.NVFP4, axis=-2, global_scale=g, backend="reference"))(x)
    assert_same(got[1], want, "NVFP4 given global scale")


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_equals_a_loop(backend):
    x = np.random.default_rng(6).standard_normal((3, 40, 64)).astype(ml_dtypes.bfloat16)
    x[1] *= 1000
    for fmt in (gx.MXFP8_E4M3, gx.NVFP4, gx.FP8_TENSOR):
        got = jax.jit(jax.vmap(lambda v: gx.quantize_both_axes(v, fmt, backend=backend)))(x)
        for i in range(3):
            for k, axis in ((0, -1), (1, -2)):
                want = single(fmt, backend, axis)(x[i])
                assert_bits_equal(got[k].data[i], as_bits(np.asarray(want.data)), f"{fmt.name} vmap {i} axis {axis}")
                assert_bits_equal(got[k].scale[i], as_bits(np.asarray(want.scale)), f"{fmt.name} vmap {i} scale")


def test_per_tensor_is_one_quantization_with_both_axes():
    x = np.random.default_rng(7).standard_normal((3, 20, 24)).astype(np.float32)
    a, b = gx.quantize_both_axes(x, gx.FP8_TENSOR, backend="cpu")
    assert (a.axis, b.axis) == (-1, -2)
    want = gx.quantize(x, gx.FP8_TENSOR, axis=-2, backend="reference")
    assert_same(b, want, "FP8_TENSOR")
    text = jax.jit(lambda v: gx.quantize_both_axes(v, gx.FP8_TENSOR, backend="cpu")).lower(x).as_text()
    assert text.count("gpuext_quantize") == 1  # x is read once: one quantization


def test_errors_are_quantizes():
    x = jnp.ones((4, 64), jnp.float32)
    with pytest.raises(ValueError, match="rank >= 2"):
        gx.quantize_both_axes(jnp.ones(64), gx.MXFP8_E4M3)
    with pytest.raises(ValueError, match="axis must be -1"):  # quantize(x, FP8_128x128, axis=-2) raises so
        gx.quantize_both_axes(x, gx.FP8_128x128)
    with pytest.raises(ValueError, match="axis must be -1"):
        gx.quantize(x, gx.FP8_128x128, axis=-2)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16, got int32"):
        gx.quantize_both_axes(jnp.ones((4, 64), jnp.int32), gx.MXFP8_E4M3)
    with pytest.raises(ValueError, match="'nearest'.*NVFP4 only"):
        gx.quantize_both_axes(x, gx.MXFP8_E4M3, scale_rounding="nearest")
    with pytest.raises(TypeError, match="axis"):
        gx.quantize_both_axes(x, gx.MXFP8_E4M3, axis=-1)  # both axes are the point: no axis argument
    with pytest.raises(TypeError, match="not differentiable"):
        jax.grad(lambda v: gx.quantize_both_axes(v, gx.MXFP8_E4M3)[1].data.astype(jnp.float32).sum())(x)


@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.FP8_1x128, gx.NVFP4], ids=lambda f: f.name)
def test_training_paths_quantize_both_axes(fmt, monkeypatch):
    """Issue 35: the training paths take both quantizations of an operand from quantize_both_axes (one
    read of x where the backend fuses them): scaled_dot_general's backward for the cotangent (its
    dgrad contracts N, its wgrad M), scaled_ragged_dot's forward for the weights (forward along K,
    dgrad along N, where both are one format). Counted while tracing, so it holds for every backend
    the op may choose."""
    calls = []
    real = formats.quantize_both_axes

    def counting(x, f, **kw):
        calls.append((x.shape, f))
        return real(x, f, **kw)

    monkeypatch.setattr(formats, "quantize_both_axes", counting)
    x = jnp.ones((64, 256), jnp.bfloat16)
    w = jnp.ones((256, 128), jnp.bfloat16)
    dense = lambda a, b: gx.scaled_dot_general(a, b, (((1,), (0,)), ((), ())), format=fmt).astype(jnp.float32).sum()
    jax.make_jaxpr(jax.grad(dense, argnums=(0, 1)))(x, w)
    assert ((1, 64, 128), recipe(fmt).grad) in calls, calls  # the cotangent, canonical (B, M, N)
    # the forward's operands, where the backward reads them in the forward's formats (NVFP4's
    # backward reads MXFP8_E4M3): x along K and M, w along K and N, saved quantized
    rec = recipe(fmt)
    operands = {((1, 64, 256), rec.lhs), ((1, 256, 128), rec.rhs)}
    assert operands <= set(calls) if rec.lhs_bwd == rec.lhs else not operands & set(calls), calls
    calls.clear()
    ws = jnp.ones((4, 256, 128), jnp.bfloat16)
    sizes = jnp.array([16, 0, 40, 8], jnp.int32)
    grouped = lambda a, b: gx.scaled_ragged_dot(a, b, sizes, format=fmt).astype(jnp.float32).sum()
    jax.make_jaxpr(jax.grad(grouped, argnums=(0, 1)))(x, ws)
    # the weights, where their two quantizations share a format (NVFP4's dgrad reads MXFP8_E4M3)
    shapes = {s for s, _ in calls}
    assert shapes == ({(4, 256, 128)} if rec.rhs_bwd == rec.rhs else set()), calls
