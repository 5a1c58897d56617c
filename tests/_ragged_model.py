"""A float64 NumPy model of ragged_dot (ragged_m, and ragged_dot_masked's layout) and the operands
the GPU backend tests share (tests/ragged_dot/test_ragged_dot_cublaslt.py,
tests/ragged_dot/test_ragged_dot_hopper.py): groups of lhs rows, one weight matrix each, rows past
the groups zero, written here independently of jax_gpuext."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_gpuext as gx
import _command_buffer as cb
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


def np_masked_dot(lhs, rhs, counts, rhs_contract):
    """The masked layout (ragged_dot_masked): lhs (G, C, K) FP8_1x128, weights per expert; row r of
    expert g is lhs[g, r] . W[g]^T for r < clamp(count_g, 0, C), else 0. With the magnitude."""
    a = np_dequant_rows(lhs)
    w = np_weights_gnk(rhs, rhs_contract)
    g, c, _ = a.shape
    out, mag = np.zeros((g, c, w.shape[1])), np.zeros((g, c, w.shape[1]))
    for e in range(g):
        r = min(max(int(counts[e]), 0), c)
        out[e, :r] = a[e, :r] @ w[e].T
        mag[e, :r] = np.abs(a[e, :r]) @ np.abs(w[e]).T
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


def _check_bound(y, want, mag, out_dtype):
    y = np.asarray(y.astype(jnp.float32), np.float64)
    # fp32 accumulation of FP8 products (fewer product bits on Hopper: 1e-3 of sum |terms|), then
    # the output's rounding
    ulp = {jnp.dtype(jnp.bfloat16): 2.0 ** -8, jnp.dtype(jnp.float16): 2.0 ** -11}.get(jnp.dtype(out_dtype), 2.0 ** -23)
    bad = np.abs(y - want) > 1e-3 * mag + ulp * np.abs(want) + 1e-30
    assert not bad.any(), f"{bad.sum()} of {bad.size} elements off, first at {np.argwhere(bad)[0]}"
    return y


def check_gpu_result(y, lhs, rhs, sizes, rhs_contract, out_dtype):
    want, mag = np_ragged_dot(lhs, rhs, sizes, rhs_contract)
    y = _check_bound(y, want, mag, out_dtype)
    total = min(int(np.clip(np.asarray(sizes, np.int64), 0, None).sum()), y.shape[0])
    assert (y[total:] == 0).all(), "rows past the groups must be written as zeros"


def check_gpu_masked_result(y, lhs, rhs, counts, rhs_contract, out_dtype):
    """As check_gpu_result, for the masked layout: rows past each expert's count exactly zero."""
    want, mag = np_masked_dot(lhs, rhs, counts, rhs_contract)
    y = _check_bound(y, want, mag, out_dtype)
    for e in range(y.shape[0]):
        assert not y[e, min(max(int(counts[e]), 0), y.shape[1]):].any(), f"expert {e}: rows past its count"


def check_command_buffer_replays(impl, target, m, command_buffer, size_vectors, k=256, n=128):
    """One compiled program run with several size vectors, each checked against the model. With
    CUSTOM_CALL capture (the handler is kCmdBufferCompatible) the call is recorded once and then
    replayed without its handler (tests/_command_buffer.py counts its runs), so the replays get
    their sizes only by reading them on the device; with capture off the handler runs every time.

    The sizes reach the call through a buffer that stays where it is: the program picks row `i`
    of one table of all the vectors. A new sizes array per run would move the call's operand, and
    XLA records the graph again (calling the handler) whenever an operand moves. The row is picked
    by a masked sum, not a slice, so that XLA cannot fold a dynamic slice into the call's operand."""
    g = len(size_vectors[0])
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, 2, seed=40)
    p = problem(m=m, k=k, n=n, g=g)
    table = jnp.array(size_vectors, jnp.int32)  # (V, G)

    def pick(table, i):
        return jnp.sum(jnp.where((jnp.arange(table.shape[0]) == i)[:, None], table, 0), axis=0, dtype=jnp.int32)

    f = jax.jit(lambda a, b, t, i: impl(a, b, pick(t, i), p), compiler_options=cb.options(command_buffer))
    runs = max(cb.RUNS, len(size_vectors))
    with cb.counting(target) as counts:
        for r in range(runs):
            v = r % len(size_vectors)
            check_gpu_result(f(lhs, rhs, table, jnp.int32(v)), lhs, rhs, table[v], 2, jnp.bfloat16)
    cb.assert_counts(counts, runs, command_buffer)
