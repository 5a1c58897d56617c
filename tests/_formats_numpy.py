"""An independent float64 NumPy statement of the block-scaled format rules (docs/formats.md).

It shares no code with jax_gpuext: rounding is done on float64 values with frexp/ldexp and
np.round (ties to even), which is exact because every intermediate fits in 53 bits. Rounding a
quotient computed in float64 to 24 bits is the same as rounding the exact quotient once
(53 >= 2 * 24 + 2, Figueroa's double-rounding theorem), so fp32 division/products are modelled
exactly, with an unbounded exponent as the rules require.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# element / output formats: (mantissa bits, smallest normal exponent, largest finite value)
E4M3 = (3, -6, 448.0)
E5M2 = (2, -14, 57344.0)
E2M1 = (1, 0, 6.0)
OUT = {
    np.dtype(np.float32): (23, -126, float(np.finfo(np.float32).max)),
    np.dtype(ml_dtypes.bfloat16): (7, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
    np.dtype(np.float16): (10, -14, 65504.0),
}
MIN_NORMAL_F32 = 2.0 ** -126


def round_to(v, fmt, *, mode="nearest", saturate=True):
    """Rounds float64 ``v`` to a format given as (mbits, emin, max); emin=None: unbounded."""
    mbits, emin, vmax = fmt
    v = np.asarray(v, np.float64)
    a = np.abs(v)
    _, e2 = np.frexp(a)
    e = e2 - 1 if emin is None else np.maximum(e2 - 1, emin)
    quantum = np.ldexp(1.0, (e - mbits).astype(np.int64))
    steps = a / quantum
    r = (np.round(steps) if mode == "nearest" else np.ceil(steps)) * quantum
    if vmax is not None:
        r = np.where(r > vmax, vmax if saturate else np.inf, r)
    return np.copysign(r, v)


def rn24(v):
    """Round to fp32 precision with an unbounded exponent."""
    return round_to(v, (23, None, None))


def blocks_1d(x, block, axis):
    """-> (xb [..., nb, block] zero padded, k)."""
    xb = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    k = xb.shape[-1]
    block = min(block, k)
    nb = -(-k // block)
    xb = np.concatenate([xb, np.zeros(xb.shape[:-1] + (nb * block - k,))], axis=-1)
    return xb.reshape(xb.shape[:-1] + (nb, block)), k


def unblock_1d(d, k, axis):
    return np.moveaxis(d.reshape(d.shape[:-2] + (-1,))[..., :k], -1, axis)


def blocks_2d(x):
    x = np.asarray(x, np.float64)
    *lead, m, n = x.shape
    br, bc = min(128, m), min(128, n)
    mb, nb = -(-m // br), -(-n // bc)
    pad = [(0, 0)] * len(lead) + [(0, mb * br - m), (0, nb * bc - n)]
    return np.pad(x, pad).reshape(tuple(lead) + (mb, br, nb, bc)), (m, n)


def unblock_2d(d, mn):
    *lead, mb, r, nb, c = d.shape
    return d.reshape(tuple(lead) + (mb * r, nb * c))[..., : mn[0], : mn[1]]


def _amax(xb, axes):
    special = ~np.all(np.isfinite(xb), axis=axes, keepdims=True)
    amax = np.max(np.where(np.isfinite(xb), np.abs(xb), 0), axis=axes, keepdims=True)
    return amax, special


def mx(xb, elem, rounding):
    """Returns (element values, scale exponent or NaN) for blocks xb [..., nb, block]."""
    amax, special = _amax(xb, -1)
    fm = {E4M3: 1.75, E5M2: 1.75, E2M1: 1.5}[elem]
    em = {E4M3: 8, E5M2: 15, E2M1: 2}[elem]
    frac, e2 = np.frexp(amax)
    ea, fa = e2 - 1, 2 * frac
    e = ea - em + ((fa > fm) if rounding == "up" else 0)
    e = np.where(amax == 0, 0, np.clip(e, -127, 127))
    data = round_to(xb / np.ldexp(1.0, e), elem)
    return np.where(special, 0, data), np.where(special, np.nan, e)


def fp8_blockwise(xb, axes):
    amax, special = _amax(xb, axes)
    s = np.maximum((amax / 448.0).astype(np.float32).astype(np.float64), MIN_NORMAL_F32)
    s = np.where(amax == 0, 1.0, s)
    data = round_to(rn24(xb / s), E4M3)
    return np.where(special, 0, data), np.where(special, np.nan, s)


def nvfp4_global_scale(x):
    x = np.asarray(x, np.float64)
    amax = np.max(np.where(np.isfinite(x), np.abs(x), 0))
    if amax == 0:
        return np.float32(1)
    return np.float32(max(float(np.float32(amax / 2688.0)), MIN_NORMAL_F32))


def nvfp4(xb, g, rounding="nearest"):
    """jax.nn's order: y = RN(amax / g); scale = E4M3 of y / 6 (nearest even, or up with 1.0 for an
    all-zero block), saturating; elements RN_E2M1(RN(RN(x / g) / scale)), x / 0 saturating."""
    g = float(g)
    amax, special = _amax(xb, -1)
    if not (np.isfinite(g) and g >= MIN_NORMAL_F32):
        special = np.ones_like(special)
    y = rn24(amax / g)
    sb = round_to(y / 6.0, E4M3, mode="up" if rounding == "up" else "nearest")
    if rounding == "up":
        sb = np.where(amax == 0, 1.0, sb)
    xs = rn24(xb / g)
    with np.errstate(divide="ignore", invalid="ignore"):
        data = round_to(rn24(np.where(sb == 0, 1.0, xs / np.where(sb == 0, 1.0, sb))), E2M1)
    data = np.where(sb == 0, np.copysign(np.where(xb == 0, 0.0, 6.0), xb), data)
    return np.where(special, 0, data), np.where(special, np.nan, sb)


def dequant(values, scale, out_dtype, g=None, power_of_two=False):
    """values and scale broadcast per element; scale is an exponent when power_of_two."""
    out = OUT[np.dtype(out_dtype)]
    with np.errstate(invalid="ignore", over="ignore"):
        if power_of_two:
            y = values * np.ldexp(1.0, np.nan_to_num(scale).astype(np.int64))
        elif g is None:
            y = rn24(values * scale)
        else:
            y = rn24(rn24(values * scale) * float(g))
        y = round_to(np.nan_to_num(y), out, saturate=False)
    return np.where(np.isnan(scale), np.nan, y).astype(out_dtype)
