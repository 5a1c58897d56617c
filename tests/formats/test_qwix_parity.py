"""Our MXFP8 / MXFP4 quantizers against qwix's (google/qwix ``qwix.quantize``), bit for bit.

qwix picks an MX scale as ``2^ceil(log2(absmax / elem_max))`` (qwix 0.1.8,
``qwix/_src/core/qarray.py`` ``compute_scale_zero_point``): the "up" rule, computed in floating
point in the input's dtype, with any ratio below ``sqrt(finfo(dtype).tiny)`` replaced by 1. It
stores the scale as a value of the input's dtype and the elements as float8_e4m3fn /
float4_e2m1fn. So its blocks are ours bit for bit except in two places, both qwix's rounding:
(1) a ratio below ``sqrt(tiny)`` (float32: 2^-63, bfloat16: 2^-63, float16: 2^-7) gets scale 1;
(2) where ``log2(ratio)`` lies within rounding of an integer, qwix's float ``log2`` (in the input
dtype: 8 significant bits for bfloat16) and ``ceil`` can put the scale one binade off either way
(one binade too small saturates the block's largest elements). The tests check that every other
block is identical, scales and elements, and that those two windows are all that differs.
docs/coming_from.md says the same. qwix is optional: skipped when absent or too old (< 0.1.8 has
no MX formats; it is what pip picks beside jax 0.7).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gpuext as gx

try:
    import qwix
except Exception as e:  # absent, or an old qwix that does not import beside this jax
    pytest.skip(f"qwix is not usable here ({type(e).__name__}: {e}); the [test] extra installs it",
                allow_module_level=True)

CASES = [("mxfp8", gx.MXFP8_E4M3, 448.0), ("mxfp4", gx.MXFP4, 6.0)]


def qwix_quantize(x, qtype):
    """qwix's MX quantization along the last axis of a 2-D x (tiles of 32; one scale per row tile)."""
    try:
        return qwix.quantize(jnp.asarray(x), qtype, channelwise_axes=[0], tiled_axes={1: 32})
    except (ValueError, TypeError, AttributeError, NotImplementedError) as e:  # qwix < 0.1.8: no MX formats
        pytest.skip(f"qwix {getattr(qwix, '__version__', '?')} cannot quantize to {qtype}: {e}")


def blocks(seed, n, dtype, spread):
    """n blocks of 32: normal values times 2^U(-8, 0) per element and 2^U(-spread, spread) per
    block, cast to dtype; as (n / 8, 256) rows (8 blocks per row)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 32)) * np.ldexp(1.0, rng.integers(-8, 1, (n, 32)))
    x = np.ldexp(x, rng.integers(-spread, spread + 1, (n, 1)))
    x[0] = 0.0  # an all-zero block: scale 1 in both
    return x.astype(dtype).reshape(-1, 256)


def values(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32))


def qwix_may_differ(amax, elem_max, dtype):
    """The blocks where qwix's own rounding may move its scale: ratio below sqrt(tiny) (scale 1),
    or log2(ratio) within two ulps of the input dtype (times |log2|) of an integer."""
    ratio = amax / elem_max
    with np.errstate(divide="ignore"):
        log = np.log2(np.where(ratio > 0, ratio, 1.0))
    fi = ml_dtypes.finfo(dtype)
    tiny = (ratio > 0) & (ratio < 2 * np.sqrt(float(fi.tiny)))
    near = np.abs(log - np.round(log)) <= 2 * float(fi.eps) * np.maximum(1.0, np.abs(log))
    return tiny | (near & (ratio > 0)), tiny


def boundary_blocks(elem_max, dtype):
    """Blocks whose amax is elem_max * 2^k exactly or one ulp of dtype either side, k in [-40, 40]."""
    rows = []
    for k in range(-40, 41):
        top = np.asarray(elem_max * 2.0 ** k, dtype)
        for v in (top, np.nextafter(top, np.asarray(np.inf, dtype)), np.nextafter(top, np.asarray(0, dtype))):
            row = np.zeros(32, dtype)
            row[:4] = np.asarray([v, -v / 3, v / 7, -v / 2], dtype)
            rows.append(row)
    return np.stack(rows)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("qtype,fmt,elem_max", CASES, ids=[c[0] for c in CASES])
def test_identical_to_qwix_outside_its_rounding_windows(qtype, fmt, elem_max, dtype):
    """Random blocks (float32: 2^-60 .. 2^60; half dtypes: 2^-8 .. 2^8 of the unit range) plus
    boundary blocks (amax = elem_max * 2^k and its neighbours): outside qwix_may_differ every
    scale and element equals qwix's bit for bit (as values: qwix's scale is a power of two in the
    input dtype, ours an E8M0 byte); inside, qwix's scale is 1 (tiny ratios) or ours times 2^{-1, 0, 1}."""
    spread = 60 if dtype is np.float32 else 8
    x = blocks(1, 8000, dtype, spread).reshape(-1, 32)
    if dtype is not np.float16:  # float16 cannot hold elem_max * 2^+-40
        x = np.concatenate([x, boundary_blocks(elem_max, dtype)])
    x = x.reshape(-1, 256) if len(x) % 8 == 0 else np.concatenate([x, np.zeros((-len(x) % 8, 32), dtype)]).reshape(-1, 256)
    q, ours = qwix_quantize(x, qtype), gx.quantize(x, fmt)
    assert q.scale.shape == ours.scale.shape and q.qvalue.dtype == ours.data.dtype
    qs, os_ = values(q.scale).ravel(), values(ours.scale).ravel()
    amax = np.abs(x.astype(np.float64)).reshape(-1, 32).max(axis=1)
    may, tiny = qwix_may_differ(amax, elem_max, dtype)
    differ = qs != os_
    assert not (differ & ~may).any(), f"{np.flatnonzero(differ & ~may)[:5]}: scales differ outside qwix's windows"
    assert (qs[differ & tiny] == 1).all()
    near = differ & ~tiny
    assert np.isin(qs[near] / os_[near], (0.5, 2.0)).all()
    same = np.repeat(~differ, 32)
    np.testing.assert_array_equal(values(ours.data).ravel()[same], values(q.qvalue).ravel()[same])
    assert (~may).sum() >= 2500, f"only {(~may).sum()} of {may.size} blocks compared bit for bit"
