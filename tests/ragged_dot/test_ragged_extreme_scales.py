"""The grouped dot at the smallest and largest MX scales (issue 34, finding 2; docs/design.md,
"The smallest and largest MX scales").

``ragged_dot`` in both modes on every CPU backend with E8M0 scales 2^-127, 2^-126, 2^-100 and
2^127 mixed within each operand, against the float64 model of tests/_ragged_numpy.py (which reads
the scales exactly: NumPy keeps float32 subnormals). The dense dot's tests
(tests/dot/test_extreme_scales.py) hold the cases' rationale and the comparison rule.

Both backends route MX operands through ``jax_gpuext.dot.scale_range.dot`` (its exponent
classes, with the grouped array's own scale layout as ``expand``).
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


# --------------------------------------------------------------------------- NVFP4's global scales
def _with_global(q, g):
    """``q`` with its NVFP4 global scale replaced by ``g`` (a scalar or one per group)."""
    leaves, aux = q.tree_flatten()
    return type(q).tree_unflatten(aux, (leaves[0], leaves[1], jnp.asarray(g, jnp.float32)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_m_nvfp4_global_scales_whose_product_leaves_float32(backend):
    """NVFP4's global scales multiply the accumulator; with a per-group rhs scale each row takes its
    group's. Products below float32 (2^-80 x 2^-80 = 2^-160: results among float32's subnormals,
    flushed by XLA:CPU when formed in float32) and acc x 2^120 past it although acc x 2^120 x
    2^-125 is ordinary: the exact products, rounded once."""
    rng = _rng("nvfp4 ragged_m", backend)
    x = rng.standard_normal((M, K)).astype(np.float32) * 30
    w = rng.standard_normal((G, K, N)).astype(np.float32) * 30
    ql, qr = gx.quantize(jnp.asarray(x), gx.NVFP4), gx.quantize(jnp.asarray(w), gx.NVFP4, axis=1)
    for gl, gr in ((2.0 ** -80, [2.0 ** -70, 2.0 ** -60, 2.0 ** -80, 2.0 ** -50]),
                   (2.0 ** 120, [2.0 ** -125, 2.0 ** -126, 2.0 ** -110, 2.0 ** -100])):
        a, b = _with_global(ql, gl), _with_global(qr, gr)
        y = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, RAGGED_M, backend=backend))(a, b, jnp.asarray(SIZES))
        want, mag = rnp.ragged_m(rnp.dequant(a), rnp.dequant(b), SIZES)
        per_row = np.ones(M)
        for g, (start, stop) in enumerate(rnp.segments(SIZES, M)[:-1]):
            per_row[start:stop] = gl * gr[g]
        want, mag = want * per_row[:, None], mag * per_row[:, None]
        assert_exact_within_f32_accumulation(y, want, mag, jnp.float32, what=f"{backend} {gl}")
        if gl < 1:
            assert ((want != 0) & (np.abs(want) < 2.0 ** -126)).sum() > 100  # the subnormal results this is about


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_contract_nvfp4_global_scales_whose_product_leaves_float32(backend):
    rng = _rng("nvfp4 ragged_contract", backend)
    sizes = jnp.asarray(SIZES)
    ql = gx.quantize_grouped(jnp.asarray(rng.standard_normal((K, M)).astype(np.float32) * 30), gx.NVFP4, sizes, axis=1)
    qr = gx.quantize_grouped(jnp.asarray(rng.standard_normal((M, N)).astype(np.float32) * 30), gx.NVFP4, sizes, axis=0)
    for gl, gr in ((2.0 ** -80, 2.0 ** -80), (2.0 ** 120, 2.0 ** -125)):
        a, b = _with_global(ql, gl), _with_global(qr, gr)
        y = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, RAGGED_CONTRACT, backend=backend))(a, b, sizes)
        want, mag = rnp.ragged_contract(rnp.dequant_grouped(a, SIZES), rnp.dequant_grouped(b, SIZES), SIZES)
        assert_exact_within_f32_accumulation(y, want * gl * gr, mag * gl * gr, jnp.float32, what=f"{backend} {gl}")


# --------------------------------------------------------------------------- FP8 blockwise (float32 block scales)
FP8_EXPONENTS = np.array([-140, -127, -100, 120])  # a subnormal scale, 2^-127 .. 2^120


def _f32_scales(rng, exps):
    return jnp.asarray(np.ldexp(rng.uniform(1, 2, exps.shape), exps).astype(np.float32))


@pytest.mark.parametrize("rhs_format", [gx.FP8_128x128, gx.FP8_1x128], ids=lambda f: f.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_m_fp8_blockwise_extreme_scales_match_float64(backend, rhs_format):
    """RAGGED_M, FP8_1x128 activations x FP8_128x128 / FP8_1x128 weights with hand-built float32
    block scales mixed along K (a subnormal one, 2^-127, 2^-100, 2^120; one row all subnormal, one
    all 2^120), the weights' blocks about the inverse: element x scale below 2^-126 was flushed
    by XLA:CPU and 448 x 2^120 x (2 - ..) overflowed; both CPU backends now take the exponent
    classes outside the window."""
    rng = _rng("fp8 ragged_m", backend, rhs_format.name)
    k, n = 512, 256
    nb = k // 128
    pattern = np.resize(FP8_EXPONENTS, nb)
    rng.shuffle(pattern)
    le = np.broadcast_to(pattern, (M, nb)).copy()
    le[0], le[21] = FP8_EXPONENTS[0], FP8_EXPONENTS[-1]
    ql = gx.quantize(jnp.asarray(rng.standard_normal((M, k)), jnp.float32), gx.FP8_1x128)
    ql = gx.BlockScaledArray(ql.data, _f32_scales(rng, le), None, gx.FP8_1x128, -1)
    qr = gx.quantize(jnp.asarray(rng.standard_normal((G, k, n)), jnp.float32), rhs_format,
                     axis=-1 if rhs_format is gx.FP8_128x128 else 1)
    tail = qr.scale.shape[2:]  # (G, K / 128, N / 128 or N)
    re = np.clip(-pattern.reshape((1, nb) + (1,) * len(tail)) + rng.integers(-3, 4, (G, nb) + tail), -149, 127)
    qr = gx.BlockScaledArray(qr.data, _f32_scales(rng, re), None, rhs_format, qr.axis)
    y = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, RAGGED_M, backend=backend))(ql, qr, jnp.asarray(SIZES))
    with np.errstate(invalid="ignore", over="ignore"):
        want, mag = rnp.ragged_m(rnp.dequant(ql), rnp.dequant(qr), SIZES)
    assert_exact_within_f32_accumulation(y, want, mag, jnp.float32, what=f"{backend} ragged_m")


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_contract_fp8_blockwise_extreme_scales_match_float64(backend):
    """RAGGED_CONTRACT with FP8_1x128 grouped along M on both sides, the extremes mixed along M's
    blocks in lhs, their inverses in rhs; and what quantize_grouped makes of groups of N(0, 2^-125)
    rows (scales clamped at 2^-126) against rows of N(0, 2^100)."""
    rng = _rng("fp8 ragged_contract", backend)
    sizes = jnp.asarray(SIZES)
    ql = gx.quantize_grouped(jnp.asarray(rng.standard_normal((K, M)), jnp.float32), gx.FP8_1x128, sizes, axis=1)
    qr = gx.quantize_grouped(jnp.asarray(rng.standard_normal((M, N)), jnp.float32), gx.FP8_1x128, sizes, axis=0)
    nb = ql.scale.shape[1]
    pattern = np.resize(FP8_EXPONENTS, nb)
    rng.shuffle(pattern)
    lhs = gx.GroupedBlockScaledArray(ql.data, _f32_scales(rng, np.broadcast_to(pattern, (K, nb))), None,
                                     gx.FP8_1x128, 1, G)
    re = np.clip(-pattern[:, None] + rng.integers(-3, 4, (nb, N)), -149, 127)
    rhs = gx.GroupedBlockScaledArray(qr.data, _f32_scales(rng, re), None, gx.FP8_1x128, 0, G)
    tiny = (gx.quantize_grouped(jnp.asarray(rng.standard_normal((K, M)) * 2.0 ** -125, jnp.float32), gx.FP8_1x128,
                                sizes, axis=1),
            gx.quantize_grouped(jnp.asarray(rng.standard_normal((M, N)) * 2.0 ** 100, jnp.float32), gx.FP8_1x128,
                                sizes, axis=0))
    assert (np.asarray(tiny[0].scale) == np.float32(2.0 ** -126)).any()
    f = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, RAGGED_CONTRACT, backend=backend))
    for what, (a, b) in (("opposite", (lhs, rhs)), ("tiny", tiny)):
        with np.errstate(invalid="ignore", over="ignore"):
            want, mag = rnp.ragged_contract(rnp.dequant_grouped(a, SIZES), rnp.dequant_grouped(b, SIZES), SIZES)
        assert_exact_within_f32_accumulation(f(a, b, sizes), want, mag, jnp.float32, what=f"{backend} {what}")


@pytest.mark.gpu
@pytest.mark.gates("cuda_device")
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_fp8_blockwise_keeps_subnormal_products(backend):
    """On CUDA both backends keep their float32 dots for FP8 blockwise (XLA:GPU keeps float32
    subnormals by default): what quantize makes of rows of N(0, 2^-125) (scales clamped at
    2^-126) against weights of N(0, 2^100), exact."""
    rng = _rng("gpu fp8 ragged_m", backend)
    x = rng.standard_normal((M, 512)) * np.repeat(np.where(rng.random((M, 4)) < 0.5, 2.0 ** -125, 2.0 ** -100), 128,
                                                   axis=1)
    ql = gx.quantize(jnp.asarray(x, jnp.float32), gx.FP8_1x128)
    qr = gx.quantize(jnp.asarray(rng.standard_normal((G, 512, 256)) * 2.0 ** 100, jnp.float32), gx.FP8_128x128)
    y = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, RAGGED_M, backend=backend))(ql, qr, jnp.asarray(SIZES))
    want, mag = rnp.ragged_m(rnp.dequant(ql), rnp.dequant(qr), SIZES)
    assert_exact_within_f32_accumulation(y, want, mag, jnp.float32, what=f"{backend} on CUDA")


@pytest.mark.parametrize("fmts", FORMAT_PAIRS, ids=lambda f: f"{f[0].name}-{f[1].name}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_extreme_scales_match_float64(backend, fmts):
    """ragged_dot_masked (G, C, K) x (G, K, N): the same extremes along K, their inverses in the
    weights, rows past each expert's count zero. A float32 dot of float32-dequantized operands
    flushes 2^-127 x element on XLA:CPU and overflows 448 x 2^127; the exponent classes do not."""
    rng = _rng("masked", backend, fmts[0].name, fmts[1].name)
    c, nb = 24, K // 32
    counts = np.array([20, 0, 24, 9], np.int32)
    pattern = _pattern(rng, nb)
    lc = np.broadcast_to(pattern, (G, c, nb)).copy()
    lc[0, 0], lc[2, 5] = TINY, HUGE
    lc[:, 1:] = np.where(lc[:, 1:] == TINY, rng.choice([TINY, TINY1], lc[:, 1:].shape), lc[:, 1:])
    rc = np.moveaxis(_inverse(rng, pattern, (G, N)), 0, 1)  # (G, nb, N)
    lhs = gx.BlockScaledArray(jnp.asarray(_elements(rng, (G, c, K), fmts[0].elem_dtype)), _scale(lc), None, fmts[0],
                              2)
    rhs = gx.BlockScaledArray(jnp.asarray(_elements(rng, (G, K, N), fmts[1].elem_dtype)), _scale(rc), None,
                              fmts[1], 1)
    y = jax.jit(lambda a, b, v: gx.ragged_dot_masked(a, b, v, backend=backend))(lhs, rhs, jnp.asarray(counts))
    with np.errstate(invalid="ignore", over="ignore"):
        dl, dr = rnp.dequant(lhs), rnp.dequant(rhs)
        keep = (np.arange(c)[None, :] < counts[:, None])[:, :, None]
        want = np.where(keep, np.einsum("gck,gkn->gcn", dl, dr), 0.0)
        mag = np.where(keep, np.einsum("gck,gkn->gcn", np.abs(dl), np.abs(dr)), 0.0)
    assert_exact_within_f32_accumulation(y, want, mag, jnp.float32, what=f"{backend} masked")
