"""A float64 NumPy model of ragged_dot (ragged_m) and the operands the GPU backend tests share
(tests/ragged_dot/test_ragged_dot_cublaslt.py, tests/ragged_dot/test_ragged_dot_hopper.py): groups of lhs rows, one
weight matrix each, rows past the groups zero, written here independently of jax_gpuext."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_gpuext as gx
from _hlo import custom_calls_in_command_buffers
from jax_gpuext.ragged_dot.common import RaggedProblem


def rand(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


def problem(m=64, k=256, n=128, g=4, rhs_format=gx.FP8_128x128, out=jnp.bfloat16, rhs_contract=2,
            mode="ragged_m", lhs_format=gx.FP8_1x128):
    return RaggedProblem(mode, m, k, n, g, lhs_format, rhs_format, out, rhs_contract)


def operands(m, k, n, g, rhs_format, rhs_contract, seed=0):
    """lhs FP8_1x128 (M, K); rhs quantized with its blocks along K, stored (G, N, K) for
    rhs_contract 2 or (G, K, N) for 1."""
    lhs = gx.quantize(rand(seed, (m, k)), gx.FP8_1x128)
    w = rand(seed + 1, (g, n, k), 0.1)
    if rhs_contract == 1:
        w = jnp.swapaxes(w, 1, 2)
    axis = -1 if rhs_contract == 2 else 1
    rhs = gx.quantize(w, rhs_format) if rhs_format == gx.FP8_128x128 else gx.quantize(w, rhs_format, axis=axis)
    return lhs, rhs


# --------------------------------------------------------------------------- float64 NumPy model
def np_dequant_rows(q):
    """FP8_1x128 along the last axis, float64: data * the scale of element k's block k // 128."""
    data = np.asarray(q.data.astype(jnp.float32), np.float64)
    scale = np.asarray(q.scale, np.float64)
    return data * scale[..., np.arange(data.shape[-1]) // 128]


def np_weights_gnk(q, rhs_contract):
    """Dequantized weights as (G, N, K) float64, by explicit block indices."""
    data = np.asarray(q.data.astype(jnp.float32), np.float64)
    scale = np.asarray(q.scale, np.float64)
    if q.format == gx.FP8_128x128:
        r = np.arange(data.shape[1]) // 128
        c = np.arange(data.shape[2]) // 128
        w = data * scale[:, r][:, :, c]
    else:
        ax = q.axis % 3
        w = data * np.take(scale, np.arange(data.shape[ax]) // 128, axis=ax)
    return w if rhs_contract == 2 else np.swapaxes(w, 1, 2)


def np_ragged_dot(lhs, rhs, sizes, rhs_contract):
    """out[r] = lhs[r] . W[g(r)]^T for the rows of each group; rows past the groups are 0. Sizes
    are clamped as the handler documents: negative -> 0, nothing past row M."""
    a = np_dequant_rows(lhs)
    w = np_weights_gnk(rhs, rhs_contract)
    m = a.shape[0]
    out = np.zeros((m, w.shape[1]))
    mag = np.zeros_like(out)
    start = 0
    for g, s in enumerate(np.asarray(sizes, np.int64)):
        end = min(start + max(int(s), 0), m)
        out[start:end] = a[start:end] @ w[g].T
        mag[start:end] = np.abs(a[start:end]) @ np.abs(w[g]).T
        start = end
    return out, mag


# --------------------------------------------------------------------------- GPU checks
SIZES = {  # G = 6 groups over M = 200 rows (sum <= M)
    "balanced": [32, 32, 32, 32, 32, 32],
    "skewed": [150, 2, 0, 40, 1, 7],
    "empty_groups": [0, 0, 96, 0, 0, 104],
    "single_rows": [1, 1, 1, 1, 1, 1],
    "sum_below_m": [17, 33, 5, 0, 60, 3],
    "one_group_all": [200, 0, 0, 0, 0, 0],
}


def check_gpu_result(y, lhs, rhs, sizes, rhs_contract, out_dtype):
    want, mag = np_ragged_dot(lhs, rhs, sizes, rhs_contract)
    y = np.asarray(y.astype(jnp.float32), np.float64)
    # fp32 accumulation of FP8 products (fewer product bits on Hopper: 1e-3 of sum |terms|), then
    # the output's rounding
    ulp = {jnp.dtype(jnp.bfloat16): 2.0 ** -8, jnp.dtype(jnp.float16): 2.0 ** -11}.get(jnp.dtype(out_dtype), 2.0 ** -23)
    bound = 1e-3 * mag + ulp * np.abs(want) + 1e-30
    bad = np.abs(y - want) > bound
    assert not bad.any(), f"{bad.sum()} of {bad.size} elements off, first at {np.argwhere(bad)[0]}"
    total = min(int(np.clip(np.asarray(sizes, np.int64), 0, None).sum()), y.shape[0])
    assert (y[total:] == 0).all(), "rows past the groups must be written as zeros"


def check_command_buffer_replays(impl, target, m, command_buffer, size_vectors, k=256, n=128):
    """One compiled program run with several size vectors (group sizes are read on the device at
    every replay of a recorded graph), each checked against the model; `target` is inside a
    command buffer exactly when CUSTOM_CALL capture is on (the handler is kCmdBufferCompatible)."""
    g = len(size_vectors[0])
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, 2, seed=40)
    p = problem(m=m, k=k, n=n, g=g)
    opts = {"xla_gpu_enable_command_buffer": command_buffer, "xla_gpu_graph_min_graph_size": 1}
    f = jax.jit(lambda a, b, s: impl(a, b, s, p), compiler_options=opts)
    for sizes in size_vectors:
        sizes = jnp.array(sizes, jnp.int32)
        check_gpu_result(f(lhs, rhs, sizes), lhs, rhs, sizes, 2, jnp.bfloat16)
    captured = custom_calls_in_command_buffers(f.lower(lhs, rhs, jnp.zeros(g, jnp.int32)).compile().as_text())
    assert (target in captured) == bool(command_buffer), captured
