"""ragged_dot_masked (issue 36): the grouped dot in the masked layout (experts x capacity, valid
counts on the device), jax_gpuext/ragged_dot/masked.py and the hopper backend's masked mode.

CPU: the reference and xla backends against a float64 NumPy model written here (each expert's
first count rows times its weights, by Python loops; operands dequantized by tests/_ragged_numpy.py),
for FP8 blockwise (weights (G, K, N) and (G, N, K)), MX and NVFP4 with scalar and per-expert
global scales; counts of 0, the capacity, above it and negative; NaN in rows past a count and in an
empty expert's weights reaching nothing; validation errors; vmap; the custom call the hopper
backend lowers to. The kernel's GPU tests are in tests/ragged_dot/test_ragged_dot_hopper.py (the
GPU script runs that module in its own step: the grouped kernel may trap or hang).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _ragged_numpy as rnp
import jax_gpuext as gx
from jax_gpuext.common import extension as _ext
from jax_gpuext.ragged_dot import hopper, masked

G, C, K, N = 5, 40, 256, 136
COUNTS = np.array([3, 0, 40, 77, -2], np.int32)  # a partial slab, an empty one, full, over capacity, negative


def rand(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


def values(q):
    """float64 element x block scale x global scale (a per-expert global scale on axis 0)."""
    v = rnp.dequant(q)
    if q.global_scale is not None:
        gs = np.asarray(q.global_scale, np.float64)
        v = v * (gs[:, None, None] if gs.ndim == 1 else gs)
    return v


def model(lhs, rhs, counts, rhs_contract):
    """(G, C, N) and the magnitude sum_k |terms|: row r of expert g is lhs[g, r] @ W_g for
    r < clamp(count, 0, C), else 0."""
    a, w = values(lhs), values(rhs)
    w = w if rhs_contract == 1 else np.swapaxes(w, 1, 2)  # (G, K, N)
    g, c, _ = a.shape
    out, mag = np.zeros((g, c, w.shape[2])), np.zeros((g, c, w.shape[2]))
    for e in range(g):
        r = min(max(int(counts[e]), 0), c)
        out[e, :r] = a[e, :r] @ w[e]
        mag[e, :r] = np.abs(a[e, :r]) @ np.abs(w[e])
    return out, mag


def quantized(lf, rf, rhs_contract, seed=0, c=C, k=K, n=N, g=G):
    lhs = gx.quantize(rand(seed, (g, c, k), 2.0), lf)
    shape = (g, k, n) if rhs_contract == 1 else (g, n, k)
    w = rand(seed + 1, shape, 0.3)
    rhs = gx.quantize(w, rf) if len(rf.block) == 2 else gx.quantize(w, rf, axis=rhs_contract)
    return lhs, rhs


CASES = [(gx.FP8_1x128, gx.FP8_128x128, 1, "reference"), (gx.FP8_1x128, gx.FP8_128x128, 2, "reference"),
         (gx.FP8_1x128, gx.FP8_1x128, 2, "reference"), (gx.MXFP8_E4M3, gx.MXFP4, 1, "reference"),
         (gx.NVFP4, gx.NVFP4, 1, "reference"),
         (gx.FP8_1x128, gx.FP8_128x128, 1, "xla"), (gx.NVFP4, gx.NVFP4, 2, "xla"), (gx.MXFP8_E4M3, gx.MXFP4, 1, "xla")]


@pytest.mark.parametrize("lf,rf,rc,backend", CASES,
                         ids=[f"{a.name}-{b.name}-rc{c}-{d}" for a, b, c, d in CASES])
def test_matches_float64(lf, rf, rc, backend):
    lhs, rhs = quantized(lf, rf, rc, seed=3)
    y = jax.jit(lambda a, b, s: gx.ragged_dot_masked(a, b, s, rc, backend=backend))(lhs, rhs, jnp.asarray(COUNTS))
    want, mag = model(lhs, rhs, COUNTS, rc)
    assert y.shape == (G, C, N) and y.dtype == jnp.float32
    rnp.assert_close(y, want, mag)


def test_default_contracting_dim_and_output_dtype():
    """None contracts the rhs's quantized axis ((G, N, K) for 1-D blocks along the last axis;
    FP8_128x128 tiles: (G, K, N), lax.ragged_dot's order); bf16 output is the float32 result cast once."""
    lhs, rhs = quantized(gx.FP8_1x128, gx.FP8_1x128, 2, seed=5)
    want, mag = model(lhs, rhs, COUNTS, 2)
    y = gx.ragged_dot_masked(lhs, rhs, COUNTS, preferred_element_type=jnp.bfloat16)
    assert y.dtype == jnp.bfloat16
    f32 = gx.ragged_dot_masked(lhs, rhs, COUNTS)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(f32.astype(jnp.bfloat16)))
    rnp.assert_close(f32, want, mag)
    lhs, rhs = quantized(gx.FP8_1x128, gx.FP8_128x128, 1, seed=6)
    assert masked.problem(lhs, rhs, jnp.asarray(COUNTS), None, jnp.float32).rhs_contract == 1


def test_per_expert_nvfp4_global_scales():
    lhs = gx.quantize(rand(7, (G, C, K)), gx.NVFP4)
    rhs = jax.vmap(lambda v: gx.quantize(v, gx.NVFP4, axis=0))(rand(8, (G, K, N), 0.3))
    assert rhs.global_scale.shape == (G,)
    for backend in ("reference", "xla"):
        y = gx.ragged_dot_masked(lhs, rhs, COUNTS, 1, backend=backend)
        want, mag = model(lhs, rhs, COUNTS, 1)
        rnp.assert_close(y, want, mag)


@pytest.mark.parametrize("backend", ["reference", "xla"])
def test_nan_past_a_count_or_in_an_empty_expert_reaches_nothing(backend):
    """Rows past an expert's count are zeros whatever they hold; an empty expert's weights touch no row."""
    lhs, rhs = quantized(gx.FP8_1x128, gx.FP8_128x128, 1, seed=9)
    data = lhs.data.at[0, 10].set(jnp.nan).at[4, 0].set(jnp.inf)  # expert 0 counts 3 rows; expert 4 none
    lhs = gx.BlockScaledArray(data, lhs.scale, None, lhs.format, lhs.axis)
    wdata = rhs.data.at[1].set(jnp.nan)  # expert 1 is empty
    rhs = gx.BlockScaledArray(wdata, rhs.scale, None, rhs.format, rhs.axis)
    y = np.asarray(gx.ragged_dot_masked(lhs, rhs, COUNTS, 1, backend=backend))
    assert np.isfinite(y).all()
    assert not y[0, 3:].any() and not y[1].any() and not y[4].any()


def test_errors_name_the_argument():
    lhs, rhs = quantized(gx.FP8_1x128, gx.FP8_128x128, 1)
    counts = jnp.asarray(COUNTS)
    with pytest.raises(ValueError, match=r"lhs must be \(G, C, K\)"):
        gx.ragged_dot_masked(gx.quantize(rand(0, (C, K)), gx.FP8_1x128), rhs, counts)
    with pytest.raises(ValueError, match="valid_counts must have shape"):
        gx.ragged_dot_masked(lhs, rhs, counts[:3])
    with pytest.raises(TypeError, match="int32"):
        gx.ragged_dot_masked(lhs, rhs, counts.astype(jnp.float32))
    with pytest.raises(ValueError, match="rhs_contracting_dim"):
        gx.ragged_dot_masked(lhs, rhs, counts, 0)
    with pytest.raises(ValueError, match="quantized along axis 1"):
        gx.ragged_dot_masked(gx.quantize(rand(0, (G, C, K)), gx.FP8_1x128, axis=1), rhs, counts)
    with pytest.raises(ValueError, match="cannot be mixed"):
        gx.ragged_dot_masked(gx.quantize(rand(0, (G, C, K)), gx.MXFP8_E4M3), rhs, counts)
    with pytest.raises(ValueError, match="does not match lhs"):
        gx.ragged_dot_masked(lhs, quantized(gx.FP8_1x128, gx.FP8_128x128, 1, g=4)[1], counts)
    with pytest.raises(TypeError, match="BlockScaledArray"):
        gx.ragged_dot_masked(rand(0, (G, C, K)), rhs, counts)
    with pytest.raises(ValueError, match="backend"):
        gx.ragged_dot_masked(lhs, rhs, counts, backend="nope")


def test_vmap_over_a_leading_axis():
    lhs, rhs = quantized(gx.FP8_1x128, gx.FP8_128x128, 1, seed=11)
    counts = jnp.stack([jnp.asarray(COUNTS), jnp.asarray(COUNTS[::-1])])
    stack = lambda q: jax.tree_util.tree_map(lambda x: jnp.stack([x, x]) if x is not None else None, q)  # noqa: E731
    y = jax.vmap(lambda a, s: gx.ragged_dot_masked(a, rhs, s, 1))(stack(lhs), counts)
    for i in range(2):
        want, mag = model(lhs, rhs, np.asarray(counts[i]), 1)
        rnp.assert_close(y[i], want, mag)


def test_hopper_lowers_to_the_kernel_in_its_masked_mode():
    """A 3-D lhs and output tell the handler the masked layout: lhs data (G, C, K) as it is, its
    scales (K/128, round_up(G*C, 4)), weights (G, N, K), the counts, a workspace for G*C rows."""
    lhs, rhs = quantized(gx.FP8_1x128, gx.FP8_128x128, 2, seed=12)
    p = masked.problem(lhs, rhs, jnp.asarray(COUNTS), 2, jnp.bfloat16)
    text = jax.jit(lambda a, b, s: hopper.masked_impl(a, b, s, p)).trace(lhs, rhs, jnp.asarray(COUNTS)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert hopper.TARGET in text
    for t in (f"tensor<{G}x{C}x{K}xf8E4M3FN>", f"tensor<2x{G * C}xf32>", f"tensor<{G}x{N}x{K}xf8E4M3FN>",
              f"tensor<{G}xi32>", f"tensor<{G}x{C}x{N}xbf16>",
              f"tensor<{hopper.workspace_bytes(G * C, G) + hopper.WORKSPACE_SLACK}xui8>"):
        assert t in text, t


def test_hopper_masked_supports_says_why():
    lhs, rhs = quantized(gx.FP8_1x128, gx.FP8_128x128, 2)
    ok = masked.problem(lhs, rhs, jnp.asarray(COUNTS), 2, jnp.bfloat16)
    r = hopper.masked_supports(ok)
    if _ext.module("cuda") is None:
        assert not r.supported and "no CUDA extension" in r.reason
    l1, r1 = quantized(gx.FP8_1x128, gx.FP8_1x128, 2)
    assert "FP8_128x128 weights" in hopper.masked_supports(masked.problem(l1, r1, COUNTS, 2, jnp.float32)).reason
    l2, r2 = quantized(gx.FP8_1x128, gx.FP8_128x128, 2, k=200)
    assert "K=200" in hopper.masked_supports(masked.problem(l2, r2, COUNTS, 2, jnp.float32)).reason


def test_backend_table():
    from jax_gpuext.common import backends, verified

    assert [b.name for b in backends.backends(masked.OP)] == ["hopper", "xla", "reference"]
    assert verified.components(masked.OP, "hopper") == ("ragged_dot.hopper",)
    assert hopper.masked_feature(masked.problem(*quantized(gx.FP8_1x128, gx.FP8_128x128, 2), COUNTS, 2,
                                                jnp.float32)) == "masked"
