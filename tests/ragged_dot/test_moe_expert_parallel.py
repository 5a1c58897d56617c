"""Expert parallelism (issue 30): an MoE layer with its experts sharded over a mesh axis under
shard_map, tokens sent to their experts' devices with lax.all_to_all and back, equal to the same
layer unsharded (8 CPU devices: tests/conftest.py).

Why the two agree: every quantity is computed per token row or per expert, never across a
device's batch. Activations are quantized per row (FP8_1x128 along the hidden axis), weights per
expert (128x128 tiles), so both layers quantize identical operands; a row of a grouped dot
depends only on that row and its expert's matrix. The weight gradient contracts each expert's
tokens with blocks restarting at the expert's first token, and the tokens reach an expert in the
same order either way (devices hold contiguous token ranges; both sorts are stable). What may
differ is the order in which XLA's float32 dot sums the K products for other operand shapes (the
CPU lowering of lax.ragged_dot is one masked dot over all local experts: 2 here, 16 unsharded),
so the outputs agree to a few float32 ulps of their magnitude (measured: 5e-7 of the largest).
The gradients agree to 1e-3 in relative norm (measured: 3e-6 and 6e-5): their cotangents are
quantized to FP8 again, where an ulp of float32 difference upstream can move an element to the
neighbouring E4M3 value (2^-3 apart), which the sums then carry.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_gpuext as gx

try:
    from jax import shard_map as _shard_map  # jax >= 0.7: jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)
except ImportError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map as _shard_map

D, EXPERTS, TOP_K = 8, 16, 2
TOKENS, HIDDEN, FFN = 8 * 24, 128, 256


def route(x, router):
    """Top-k experts of each token and their softmax gates (row by row: no batch reduction)."""
    probs = jax.nn.softmax(jnp.einsum("th,he->te", x, router, precision="highest"), axis=-1)
    gates, experts = lax.top_k(probs, TOP_K)
    return gates, experts.astype(jnp.int32)


def experts_ffn(rows, sizes, w1, w2):
    """Each group of rows through its expert: gelu(rows @ w1[e]) @ w2[e], as grouped FP8 dots."""
    h = jax.nn.gelu(gx.scaled_ragged_dot(rows, w1, sizes, preferred_element_type=jnp.float32))
    return gx.scaled_ragged_dot(h, w2, sizes, preferred_element_type=jnp.float32)


def moe(x, router, w1, w2):
    """The unsharded layer: sort the (token, choice) pairs by expert, grouped dots, unsort, combine."""
    gates, experts = route(x, router)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=EXPERTS).astype(jnp.int32)
    out = experts_ffn(x[order // TOP_K], sizes, w1, w2)
    out = jnp.zeros_like(out).at[order].set(out).reshape(x.shape[0], TOP_K, -1)
    return jnp.einsum("tkh,tk->th", out, gates)


def moe_expert_parallel(x, router, w1, w2, axis="ep"):
    """Per device: its tokens, all experts' router, its EXPERTS / D experts. Rows are sent to the
    device owning their expert in fixed-capacity chunks (capacity = every row of this device, so
    nothing is dropped), regrouped there by local expert, computed, and sent back."""
    nd = lax.psum(1, axis)
    local = w1.shape[0]
    gates, experts = route(x, router)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    flat_sorted = flat[order]
    capacity = flat.shape[0]
    dest = flat_sorted // local
    counts = jnp.bincount(flat, length=nd * local).astype(jnp.int32).reshape(nd, local)
    starts = jnp.cumsum(counts.sum(1)) - counts.sum(1)
    slot = jnp.arange(capacity) - starts[dest]
    send = jnp.zeros((nd, capacity, x.shape[1]), x.dtype).at[dest, slot].set(x[order // TOP_K])
    recv = lax.all_to_all(send, axis, 0, 0, tiled=True).reshape(nd, capacity, -1)
    recv_counts = lax.all_to_all(counts, axis, 0, 0, tiled=True)  # [source, local expert]
    # the local expert of each received row (local = padding), then rows grouped by expert
    ends = jnp.cumsum(recv_counts, axis=1)
    row_expert = jnp.sum(jnp.arange(capacity)[None, :, None] >= ends[:, None, :], axis=-1).reshape(-1)
    regroup = jnp.argsort(row_expert, stable=True)
    out = experts_ffn(recv.reshape(nd * capacity, -1)[regroup], recv_counts.sum(0).astype(jnp.int32), w1, w2)
    out = jnp.zeros_like(out).at[regroup].set(out).reshape(nd, capacity, -1)
    back = lax.all_to_all(out, axis, 0, 0, tiled=True).reshape(nd, capacity, -1)
    mine = back[dest, slot]
    mine = jnp.zeros_like(mine).at[order].set(mine).reshape(x.shape[0], TOP_K, -1)
    return jnp.einsum("tkh,tk->th", mine, gates)


@functools.cache
def _setup():
    if jax.device_count() < D:
        pytest.skip(f"needs {D} devices (tests/conftest.py asks XLA for 8 host devices), got {jax.device_count()}")
    mesh = Mesh(np.array(jax.devices()[:D]), ("ep",))
    k = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(k[0], (TOKENS, HIDDEN), jnp.float32)
    router = jax.random.normal(k[1], (HIDDEN, EXPERTS), jnp.float32)
    w1 = jax.random.normal(k[2], (EXPERTS, HIDDEN, FFN), jnp.float32) / HIDDEN ** 0.5
    w2 = jax.random.normal(k[3], (EXPERTS, FFN, HIDDEN), jnp.float32) / FFN ** 0.5
    sharded = _shard_map(moe_expert_parallel, mesh=mesh, in_specs=(P("ep"), P(), P("ep"), P("ep")),
                         out_specs=P("ep"))
    place = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    args = (place(x, P("ep")), place(router, P()), place(w1, P("ep")), place(w2, P("ep")))
    return sharded, (x, router, w1, w2), args


def _close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * np.abs(want).max())


def test_expert_parallel_layer_equals_the_unsharded_layer():
    sharded, dense_args, args = _setup()
    y = jax.jit(sharded)(*args)
    want = jax.jit(moe)(*dense_args)
    assert y.shape == (TOKENS, HIDDEN) and np.abs(np.asarray(want)).max() > 0.1
    _close(y, want)


@pytest.mark.slow
def test_expert_parallel_weight_gradients_equal_the_unsharded_ones():
    sharded, dense_args, args = _setup()
    loss = lambda f: lambda x, r, w1, w2: jnp.sum(jnp.square(f(x, r, w1, w2)))  # noqa: E731
    g = jax.jit(jax.grad(loss(sharded), argnums=(2, 3)))(*args)
    want = jax.jit(jax.grad(loss(moe), argnums=(2, 3)))(*dense_args)
    for a, b in zip(g, want):
        a, b = np.asarray(a), np.asarray(b)
        assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b)
