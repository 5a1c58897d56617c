"""The grouped dot at the smallest and largest MX scales (issue 34, finding 2; docs/design.md,
"The smallest and largest MX scales").

``ragged_dot`` in both modes on every CPU backend with E8M0 scales 2^-127, 2^-126, 2^-100 and
2^127 mixed within each operand, against the float64 model of tests/_ragged_numpy.py (which reads
the scales exactly: NumPy keeps float32 subnormals). The dense dot's tests
(tests/dot/test_extreme_scales.py) hold the cases' rationale and the comparison rule.

Marked xfail until ragged_dot/reference.py and ragged_dot/xla.py route MX operands through
``jax_gpuext.dot.scale_range.dot`` (the change is described in docs/design.md's section): strict,
so the markers must go when they do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_gpuext as gx
import _ragged_numpy as rnp
from jax_gpuext.ragged_dot import RAGGED_CONTRACT, RAGGED_M
from test_extreme_scales import (EXTREMES, HUGE, TINY, TINY1, _elements, _rng,
                                 assert_exact_within_f32_accumulation)

PENDING = pytest.mark.xfail(reason="issue 34 finding 2: ragged xla/reference pending", strict=True)
BACKENDS = ["reference", "xla"]
M, K, N = 70, 128, 24
SIZES = np.array([20, 0, 33, 9], np.int32)  # 62 of 70 rows in groups; an empty group
G = len(SIZES)
E8M0 = jnp.float8_e8m0fnu
FORMAT_PAIRS = [(gx.MXFP8_E4M3, gx.MXFP8_E4M3), (gx.MXFP8_E5M2, gx.MXFP4)]


def _scale(codes):
    return lax.bitcast_convert_type(jnp.asarray(np.asarray(codes, np.uint8)), E8M0)


def _pattern(rng, nb):
    """Each K block's lhs code: the four extremes, shuffled (rows of 2^-127 vary with 2^-126)."""
    p = np.resize(EXTREMES, nb)
    rng.shuffle(p)
    return p


def _inverse(rng, pattern, shape_tail):
    """rhs codes making each block's pair of scales an ordinary number (2^-3 .. 2^3)."""
    jitter = rng.integers(-3, 4, pattern.shape + shape_tail)
    return np.clip(254 - pattern.reshape(pattern.shape + (1,) * len(shape_tail)) + jitter, 0, 254)


@PENDING
@pytest.mark.parametrize("fmts", FORMAT_PAIRS, ids=lambda f: f"{f[0].name}-{f[1].name}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_m_extreme_scales_match_float64(backend, fmts):
    """RAGGED_M: lhs (M, K) with the extremes mixed along K (one row all 2^-127, one all 2^127),
    weights (G, K, N) with each block's inverse scale: products of two extreme scales that are
    ordinary numbers, and some rows that underflow or overflow."""
    rng = _rng("ragged_m", backend, fmts[0].name, fmts[1].name)
    nb = K // 32
    pattern = _pattern(rng, nb)
    lc = np.broadcast_to(pattern, (M, nb)).copy()
    lc[0], lc[21] = TINY, HUGE
    lc[1:] = np.where(lc[1:] == TINY, rng.choice([TINY, TINY1], lc[1:].shape), lc[1:])
    rc = np.moveaxis(_inverse(rng, pattern, (G, N)), 0, 1)  # (G, nb, N)
    lhs = gx.BlockScaledArray(jnp.asarray(_elements(rng, (M, K), fmts[0].elem_dtype)), _scale(lc), None, fmts[0], -1)
    rhs = gx.BlockScaledArray(jnp.asarray(_elements(rng, (G, K, N), fmts[1].elem_dtype)), _scale(rc), None,
                              fmts[1], 1)
    sizes = jnp.asarray(SIZES)
    y = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, RAGGED_M, backend=backend))(lhs, rhs, sizes)
    with np.errstate(invalid="ignore", over="ignore"):
        want, mag = rnp.ragged_m(rnp.dequant(lhs), rnp.dequant(rhs), SIZES)
    assert_exact_within_f32_accumulation(y, want, mag, jnp.float32, what=f"{backend} ragged_m")


@PENDING
@pytest.mark.parametrize("fmts", FORMAT_PAIRS, ids=lambda f: f"{f[0].name}-{f[1].name}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_contract_extreme_scales_match_float64(backend, fmts):
    """RAGGED_CONTRACT (the weight gradient): lhs (K, M) and rhs (M, N), both grouped along M, the
    extremes mixed along M's blocks (restarting at each group) in lhs, their inverses in rhs."""
    rng = _rng("ragged_contract", backend, fmts[0].name, fmts[1].name)
    sizes = jnp.asarray(SIZES)
    ql = gx.quantize_grouped(jnp.zeros((K, M)), fmts[0], sizes, axis=1)  # for the grouped scale layout
    qr = gx.quantize_grouped(jnp.zeros((M, N)), fmts[1], sizes, axis=0)
    nb = ql.scale.shape[1]
    pattern = _pattern(rng, nb)
    lc = np.broadcast_to(pattern, (K, nb)).copy()
    lc[1:] = np.where(lc[1:] == TINY, rng.choice([TINY, TINY1], lc[1:].shape), lc[1:])
    rc = _inverse(rng, pattern, (N,))  # (nb, N)
    lhs = gx.GroupedBlockScaledArray(jnp.asarray(_elements(rng, (K, M), fmts[0].elem_dtype)), _scale(lc), None,
                                     fmts[0], 1, G)
    rhs = gx.GroupedBlockScaledArray(jnp.asarray(_elements(rng, (M, N), fmts[1].elem_dtype)), _scale(rc), None,
                                     fmts[1], 0, G)
    y = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, RAGGED_CONTRACT, backend=backend))(lhs, rhs, sizes)
    with np.errstate(invalid="ignore", over="ignore"):
        want, mag = rnp.ragged_contract(rnp.dequant_grouped(lhs, SIZES), rnp.dequant_grouped(rhs, SIZES), SIZES)
    assert_exact_within_f32_accumulation(y, want, mag, jnp.float32, what=f"{backend} ragged_contract")
