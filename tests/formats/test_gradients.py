"""Gradients of quantize / dequantize (issue 26, finding 6): one rule, the same on every backend.

The cpu backend refused jax.grad while the reference returned all-zero gradients. The rule now
sits above the backend choice (docs/formats.md, "Gradients"):
- dequantize is differentiable exactly in its float32 parts: y = data * scale (* global_scale), so
  d y / d scale_b = data (* global_scale) on the elements of block b: each block scale's cotangent is
  the block sum of data * cotangent. Checked against an independent float64 NumPy computation and
  with jax.test_util.check_grads;
- a tangent that would have to live in an 8- or 4-bit format (the data codes, E8M0 / E4M3 block
  scales, anything through quantize) is refused with a TypeError;
- the straight-through estimator recipe of docs/formats.md trains through quantization exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_gpuext as gx
from jax_gpuext.common import backends, gates
from jax_gpuext.common.gates import GateResult

BACKENDS = ("reference", "xla", "cpu")  # every backend that runs on CPU
FP32_SCALED = (gx.FP8_1x128, gx.FP8_128x128, gx.FP8_TENSOR)


def _operands(fmt, shape=(4, 200), seed=0):
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32) * 3
    w = np.random.default_rng(seed + 1).normal(size=shape).astype(np.float32)
    return x, w, jax.jit(lambda v: gx.quantize(v, fmt))(x)


def _block_sums(values: np.ndarray, fmt, shape) -> np.ndarray:
    """float64 NumPy: the sum of ``values`` over each block of ``fmt`` (partial blocks included)."""
    if fmt.per_tensor:
        return np.asarray(values.sum())
    if len(fmt.block) == 2:
        r, c = fmt.block
        m, n = shape[-2:]
        out = np.zeros(shape[:-2] + (-(-m // r), -(-n // c)))
        for i in range(out.shape[-2]):
            for j in range(out.shape[-1]):
                out[..., i, j] = values[..., i * r:(i + 1) * r, j * c:(j + 1) * c].sum((-2, -1))
        return out
    b = fmt.block[0]
    k = shape[-1]
    return np.stack([values[..., i * b:(i + 1) * b].sum(-1) for i in range(-(-k // b))], -1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FP32_SCALED, ids=lambda f: f.name)
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_scale_gradient_is_the_block_sum_of_data_times_cotangent(backend, fmt, out_dtype):
    x, w, q = _operands(fmt, (4, 300) if not fmt.per_tensor else (3, 50))

    def loss(scale):
        y = gx.dequantize(gx.BlockScaledArray(q.data, scale, None, fmt, -1), out_dtype, backend=backend)
        return jnp.sum(y.astype(jnp.float32) * w)

    got = np.asarray(jax.jit(jax.grad(loss))(q.scale), np.float64)
    # cotangent of y is w (rounded to out_dtype's tangent, which the tangent cast does exactly);
    # d y_i / d scale_b = data_i for i in block b
    ct = np.asarray(jnp.asarray(w).astype(out_dtype).astype(jnp.float32), np.float64)
    want = _block_sums(np.asarray(q.data, np.float64) * ct, fmt, x.shape)
    assert got.shape == q.scale.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nvfp4_global_scale_gradient(backend):
    x, w, q = _operands(gx.NVFP4, (4, 64))

    def loss(g):
        return jnp.sum(gx.dequantize(gx.BlockScaledArray(q.data, q.scale, g, gx.NVFP4, -1), backend=backend) * w)

    got = float(jax.jit(jax.grad(loss))(q.global_scale))
    scale = np.repeat(np.asarray(q.scale, np.float64), 16, axis=-1)[..., :x.shape[-1]]
    want = float((np.asarray(q.data, np.float64) * scale * w).sum())
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # and forward mode: the derivative along a direction of the global scale
    f = lambda g: gx.dequantize(gx.BlockScaledArray(q.data, q.scale, g, gx.NVFP4, -1), backend=backend)  # noqa: E731
    _, t = jax.jit(lambda g, t: jax.jvp(f, (g,), (t,)))(q.global_scale, jnp.float32(2.0))
    np.testing.assert_allclose(np.asarray(t, np.float64), 2.0 * np.asarray(q.data, np.float64) * scale, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FP32_SCALED + (gx.NVFP4,), ids=lambda f: f.name)
def test_check_grads(backend, fmt):
    """JAX's own numerical check, forward and reverse, of the float32 parts."""
    _, _, q = _operands(fmt, (2, 256))
    if fmt.has_global_scale:
        f = lambda g: gx.dequantize(gx.BlockScaledArray(q.data, q.scale, g, fmt, -1), backend=backend)  # noqa: E731
        arg = q.global_scale
    else:
        f = lambda s: gx.dequantize(gx.BlockScaledArray(q.data, s, None, fmt, -1), backend=backend)  # noqa: E731
        arg = q.scale
    check_grads(jax.jit(f), (arg,), order=1, modes=("fwd", "rev"), eps=1e-3, rtol=2e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gradient_is_the_same_under_vmap_and_jit(backend):
    fmt = gx.FP8_1x128
    x, w, q = _operands(fmt, (3, 4, 256))

    def loss(scale, data, wi):
        return jnp.sum(gx.dequantize(gx.BlockScaledArray(data, scale, None, fmt, -1), backend=backend) * wi)

    grad = jax.jit(jax.grad(loss))
    one = np.stack([np.asarray(grad(q.scale[i], q.data[i], w[i])) for i in range(3)])
    batched = np.asarray(jax.jit(jax.vmap(jax.grad(loss)))(q.scale, q.data, w))
    np.testing.assert_array_equal(batched, one)


@pytest.mark.parametrize("backend", BACKENDS)
def test_refusals_name_the_part_and_are_the_same_on_every_backend(backend):
    x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
    with pytest.raises(TypeError, match="jax_gpuext.quantize is not differentiable"):
        jax.grad(lambda v: gx.dequantize(gx.quantize(v, gx.MXFP8_E4M3, backend=backend), backend=backend).sum())(x)
    with pytest.raises(TypeError, match="jax_gpuext.quantize is not differentiable"):
        jax.jvp(lambda v: gx.quantize(v, gx.FP8_1x128, backend=backend).scale, (x,), (x,))
    q = jax.jit(lambda v: gx.quantize(v, gx.FP8_1x128))(x)
    with pytest.raises(TypeError, match=r"the data \(float8_e4m3fn codes\) of a FP8_1x128 array"):
        jax.grad(lambda q: gx.dequantize(q, backend=backend).sum())(q)
    for fmt, scale_dtype in ((gx.MXFP8_E4M3, "float8_e8m0fnu"), (gx.NVFP4, "float8_e4m3fn")):
        qq = jax.jit(lambda v: gx.quantize(v, fmt))(x)
        with pytest.raises(TypeError, match=rf"block scales \({scale_dtype}\) of a {fmt.name} array"):
            jax.grad(lambda s: gx.dequantize(gx.BlockScaledArray(qq.data, s, qq.global_scale, fmt, -1),
                                             backend=backend).astype(jnp.float32).sum())(qq.scale)
    # a quantized array inside a differentiated function, not itself differentiated: fine
    w = jnp.ones((4, 64))
    g = jax.jit(jax.grad(lambda w: jnp.sum(gx.dequantize(jax.lax.stop_gradient(q), backend=backend) * w)))(w)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(gx.dequantize(q)))


def test_straight_through_recipe_of_the_docs():
    """docs/formats.md's recipe for quantization-aware training: forward bits of
    dequantize(quantize(x)), gradient the identity."""
    @jax.custom_vjp
    def fake_quant(x):
        return gx.dequantize(gx.quantize(x, gx.MXFP8_E4M3), x.dtype)

    fake_quant.defvjp(lambda x: (fake_quant(x), None), lambda _, g: (g,))

    x = np.random.default_rng(5).normal(size=(8, 64)).astype(np.float32)
    w = np.random.default_rng(6).normal(size=(8, 64)).astype(np.float32)
    y = fake_quant(x)
    np.testing.assert_array_equal(np.asarray(y).view(np.uint32),
                                  np.asarray(gx.dequantize(gx.quantize(x, gx.MXFP8_E4M3))).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda v: jnp.sum(fake_quant(v) * w))(x)), w)


def test_the_cuda_lowering_carries_the_same_rule(monkeypatch):
    """No GPU here: open the cuda backend's gates and lower the gradient for CUDA ahead of time. The
    rule sits above the backend choice, so the CUDA program holds our dequantize custom call and the
    same block-sum reduction as on CPU."""
    monkeypatch.setattr(gates, "check", lambda name: GateResult(True, "opened for the test"))
    fmt = gx.FP8_1x128
    _, w, q = _operands(fmt, (4, 256))

    def loss(scale):
        y = gx.dequantize(gx.BlockScaledArray(q.data, scale, None, fmt, -1), backend="cuda")
        return jnp.sum(y * w)

    with backends.platform("cuda"):
        text = jax.jit(jax.value_and_grad(loss)).trace(q.scale).lower(lowering_platforms=("cuda",)).as_text()
    assert "gpuext_dequantize" in text and "reduce" in text, text[:2000]
