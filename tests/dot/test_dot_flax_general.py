"""Flax layers that contract several axes, with ``scaled_dot_general`` as their dot (issue 27):
``nnx.MultiHeadAttention`` (the output projection contracts (heads, head_dim)) followed by an
``nnx.LinearGeneral`` over two axes, and ``linen.DenseGeneral`` over two axes. Each trains a few
SGD steps: the loss falls, and tracks the same model trained with bf16 dots."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_gpuext as gx

MXFP8_DOT = functools.partial(gx.scaled_dot_general, format=gx.MXFP8_E4M3)


def bf16_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **_):
    """The baseline: lax.dot_general on bf16 operands, accumulated in f32 (out_sharding unused here)."""
    out = lax.dot_general(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), dimension_numbers,
                          preferred_element_type=jnp.float32)
    return out.astype(preferred_element_type or jnp.promote_types(lhs.dtype, rhs.dtype))


def _data(batch=8, seq=8, dim=32, out=10):
    rng = np.random.default_rng(3)  # NumPy's: jax.random would compile for each shape
    return (jnp.asarray(rng.standard_normal((batch, seq, dim), np.float32)),
            jnp.asarray(rng.standard_normal((batch, out), np.float32)))


def _sgd(loss, params, steps, lr):
    step = jax.jit(lambda p: (loss(p), jax.tree.map(lambda a, g: a - lr * g, p, jax.grad(loss)(p))))
    losses = []
    for _ in range(steps):
        value, params = step(params)
        losses.append(float(value))
    return losses


def _check(losses, baseline):
    """The loss falls, and stays within 5% of the bf16 run's (plus 1% of the start, near zero)."""
    assert losses[-1] < 0.6 * losses[0], losses
    for ours, theirs in zip(losses, baseline):
        assert abs(ours - theirs) <= 0.05 * theirs + 0.01 * baseline[0], (losses, baseline)


def test_nnx_attention_and_linear_general_train_with_our_dot():
    nnx = pytest.importorskip("flax.nnx")
    x, y = _data()

    def train(dot):
        attn = nnx.MultiHeadAttention(num_heads=4, in_features=32, qkv_features=32, decode=False,
                                      qkv_dot_general=dot, out_dot_general=dot, rngs=nnx.Rngs(0))
        head = nnx.LinearGeneral(in_features=(8, 32), out_features=10, axis=(-2, -1), dot_general=dot,
                                 rngs=nnx.Rngs(1))  # contracts (seq, dim) of (batch, seq, dim)
        graphdef, params, rest = nnx.split((attn, head), nnx.Param, ...)

        def loss(p):
            a, h = nnx.merge(graphdef, p, rest)
            return jnp.mean((h(a(x)) - y) ** 2)
        return _sgd(loss, params, steps=8, lr=0.05)

    losses = train(MXFP8_DOT)
    _check(losses, train(bf16_dot))
    # our dot really runs in both projections: a quantize per operand, forward and backward
    attn = nnx.MultiHeadAttention(num_heads=4, in_features=32, qkv_features=32, decode=False,
                                  qkv_dot_general=MXFP8_DOT, out_dot_general=MXFP8_DOT, rngs=nnx.Rngs(0))
    assert jax.jit(lambda v: attn(v)).lower(x).as_text().count("gpuext_quantize") == 8  # q, k, v, out: 2 each


def test_linen_dense_general_over_two_axes_trains_with_our_dot():
    nn = pytest.importorskip("flax.linen")
    x, y = _data()

    def train(dot):
        layer = nn.DenseGeneral(10, axis=(-2, -1), dot_general=dot)
        params = layer.init(jax.random.key(0), x)
        return _sgd(lambda p: jnp.mean((layer.apply(p, x) - y) ** 2), params, steps=8, lr=0.05)

    _check(train(MXFP8_DOT), train(bf16_dot))
