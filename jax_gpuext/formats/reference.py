"""The pure-jnp reference of block-scaled quantize / dequantize: the semantic definition.

Everything numeric runs on integer bit patterns, never on float arithmetic that could meet a
subnormal: XLA's CPU runtime flushes denormals (FTZ/DAZ), so ``jnp.max`` or ``x * 2**-e`` on
floats is not exact there. The only float operations are products of two *significands* in
[1, 2) (IEEE fp32, round to nearest even, both operands and the result normal), with the
exponents added in int32, and *estimates* of quotients, which ``floor_quotient`` makes exact with
integer arithmetic (no loop: the reference once divided with a 24-step long division). ``csrc/formats/block_scaled_math.h`` is the same algorithm in
C++/CUDA; docs/formats.md states it in words. A value in flight is a triple
``(sign, k, m)``: ``value = (-1)**sign * m * 2**(k - 23)`` with ``m`` in [2**23, 2**24) (``m == 0``
means zero) and ``k`` an int32 that may lie outside fp32's exponent range.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax import export as _export  # a submodule jax 0.7 does not import by itself
from jax import lax

I32, U32 = jnp.int32, jnp.uint32
F32_ABS_MASK = 0x7FFFFFFF
F32_INF_BITS = 0x7F800000
F32_NAN_BITS = 0x7FC00000
F32_ONE_BITS = 0x3F800000
MIN_NORMAL_EXP = -126  # scales are clamped to fp32 normals: they must survive FTZ consumers


@dataclasses.dataclass(frozen=True)
class BitFormat:
    """A small IEEE-like binary format: what rounding and decoding need to know."""

    ebits: int
    mbits: int
    bias: int
    max_code: int  # largest finite magnitude code
    has_inf: bool  # overflow rounds to inf (code max_code + 1) unless saturating
    nan_code: int | None

    @property
    def sign_shift(self) -> int:
        return self.ebits + self.mbits

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def emax(self) -> int:
        return (self.max_code >> self.mbits) - self.bias


E4M3 = BitFormat(4, 3, 7, 0x7E, False, 0x7F)
E5M2 = BitFormat(5, 2, 15, 0x7B, True, 0x7F)
E2M1 = BitFormat(2, 1, 1, 0x7, False, None)
F32 = BitFormat(8, 23, 127, 0x7F7FFFFF, True, F32_NAN_BITS)
BF16 = BitFormat(8, 7, 127, 0x7F7F, True, 0x7FC0)
F16 = BitFormat(5, 10, 15, 0x7BFF, True, 0x7E00)


# --------------------------------------------------------------------------- decode / encode
def decode(code, f: BitFormat):
    """Finite code -> (sign, k, m); zero gives m == 0. Callers handle inf/NaN themselves."""
    code = code.astype(U32)
    sign = ((code >> f.sign_shift) & 1).astype(I32)
    e = ((code >> f.mbits) & ((1 << f.ebits) - 1)).astype(I32)
    raw = ((code & ((1 << f.mbits) - 1)) << (23 - f.mbits)).astype(U32)
    # subnormal: normalise the fraction so its leading one sits at bit 23
    norm = jnp.where(raw == 0, 0, lax.clz(raw).astype(I32) - 8)
    m = jnp.where(e == 0, raw << norm.astype(U32), raw | (1 << 23)).astype(I32)
    k = jnp.where(e == 0, f.emin - norm, e - f.bias)
    return sign, k, m


def round_to(sign, k, m, f: BitFormat, *, mode: str = "nearest", saturate: bool = False):
    """(sign, k, m) -> code of ``f``. mode "nearest" (ties to even) or "up" (ceil of magnitude).

    Subnormals of ``f`` are produced exactly; overflow saturates to max_code or becomes inf.
    """
    kk = jnp.clip(k, -1000, f.emax + 1)  # beyond emax + 1 every value overflows anyway
    shift = (23 - f.mbits) + jnp.maximum(f.emin - kk, 0)
    shift = jnp.minimum(shift, 25).astype(U32)  # m < 2**24: shift 25 leaves less than half an ulp
    mu = m.astype(U32)
    q = mu >> shift
    rem = mu & ((U32(1) << shift) - 1)
    half = (U32(1) << shift) >> 1
    if mode == "nearest":
        bump = (shift > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    else:
        bump = rem != 0
    q = q + bump.astype(U32)
    exp_field = jnp.maximum(kk + f.bias - 1, 0).astype(U32)
    code = (exp_field << f.mbits) + q
    limit = f.max_code if (saturate or not f.has_inf) else f.max_code + 1
    code = jnp.minimum(code, U32(limit))
    code = jnp.where(m == 0, U32(0), code)
    return code | (sign.astype(U32) << f.sign_shift)


def significand_f32(m):
    """m (24-bit, leading one at bit 23) as an fp32 in [1, 2)."""
    return lax.bitcast_convert_type((jnp.asarray(m).astype(U32) & 0x7FFFFF) | F32_ONE_BITS, jnp.float32)


def _split_f32(v):
    """An fp32 in [0.5, 4) from a significand operation -> (k, m)."""
    _, k, m = decode(lax.bitcast_convert_type(v, U32), F32)
    return k, m


def floor_quotient(a, shift, b, estimate, rcp_b):
    """Exact ``q = floor(a * 2**shift / b)`` and ``r = a * 2**shift - q * b`` (``0 <= r < b``), no loop.

    ``a``, ``b``: positive integers (int32 / uint32 arrays) with ``2**23 <= b < 2**27``; ``shift``
    >= 0 (``a * 2**shift`` may exceed 32 bits: only its value modulo 2**32 is used); ``q < 2**31``.
    ``estimate``: a float32 approximation of the quotient T = a * 2**shift / b with
    ``|trunc(estimate) - T| * b < 2**31``; ``rcp_b``: a float32 approximation of ``1 / b`` within a
    relative 2**-10. Neither needs to be correctly rounded (XLA:GPU divides with ``div.full.f32``,
    2 ulp; XLA rewrites a division by a constant into a product with its rounded reciprocal): the
    result is exact whatever they are within those bounds (docs/formats.md, "Division without a
    loop"). Integer arithmetic is uint32, wrapping; signs are read by a bitcast to int32.

    1. ``q0 = trunc(estimate)``, ``r0 = a * 2**shift - q0 * b`` modulo 2**32: the true value lies
       in (-2**31, 2**31), so the int32 reading of the wrapped one is it.
    2. ``d = floor(float32(r0) * rcp_b)`` is within 1 of ``floor(r0 / b)`` (relative error below
       2**-9 on |r0 / b| < 2**8), so ``r1 = r0 - d * b`` lies in [-b, 2b): one step down, then one
       step up, bring it into [0, b), with q adjusted alongside.
    """
    a, b = jnp.asarray(a).astype(U32), jnp.asarray(b).astype(U32)
    q = estimate.astype(I32).astype(U32)
    r = (a << jnp.asarray(shift).astype(U32)) - q * b
    d = jnp.floor(lax.bitcast_convert_type(r, I32).astype(jnp.float32) * rcp_b).astype(I32).astype(U32)
    q, r = q + d, r - d * b
    low = lax.bitcast_convert_type(r, I32) < 0
    q, r = q - low.astype(U32), jnp.where(low, r + b, r)
    high = r >= b  # r is now in [0, 2b): unsigned compare
    return q + high.astype(U32), jnp.where(high, r - b, r)


def divide(ka, ma, kb, mb):
    """RN_fp32(a / b) with an unbounded exponent, a and b nonzero.

    ``floor_quotient`` of the significands, normalised so the 24-bit quotient has its leading one
    at bit 23, then rounded to nearest even from the remainder. The float32 division of the
    significands (both in [1, 2): operands and result normal, so FTZ/DAZ cannot touch them) only
    supplies the estimate; its rounding does not matter. The C++/CUDA code divides the
    significands with IEEE fp32 division, which gives the same bits.
    """
    a, b = jnp.asarray(ma).astype(U32), jnp.asarray(mb).astype(U32)
    c = a < b  # a / b in [1/2, 1): one more bit of quotient keeps its leading one at bit 23
    shift = 23 + c.astype(I32)
    ratio = significand_f32(a) / significand_f32(b)
    estimate = ratio * jnp.where(c, np.float32(2.0**24), np.float32(2.0**23))
    rcp_b = np.float32(1.0) / b.astype(jnp.float32)
    q, r = floor_quotient(a, shift, b, estimate, rcp_b)
    return round_quotient(ka - kb - c.astype(I32), q, r, b)


def round_quotient(k, q, r, b):
    """(k, q + r / b) rounded to 24 bits, ties to even: q in [2**23, 2**24), 0 <= r < b < 2**31."""
    twice = r << 1
    q = q + ((twice > b) | ((twice == b) & ((q & 1) == 1))).astype(U32)
    carry = (q >> 24).astype(I32)  # q rounded up to 2**24: the next binade
    return k + carry, (q >> carry.astype(U32)).astype(I32)


def multiply(ka, ma, kb, mb):
    """RN_fp32(a * b) with an unbounded exponent, a and b nonzero."""
    k, m = _split_f32(significand_f32(ma) * significand_f32(mb))
    return k + ka + kb, m


def encode_f32(k, m):
    """Positive (k, m) -> fp32 bits, flushing nothing: k must lie in fp32's normal range."""
    return ((k + 127).astype(U32) << 23) | (m.astype(U32) & 0x7FFFFF)


def clamp_to_min_normal(k, m):
    """Scales below 2**-126 become 2**-126, so no consumer (FTZ or not) sees a subnormal scale."""
    small = k < MIN_NORMAL_EXP
    return jnp.where(small, MIN_NORMAL_EXP, k), jnp.where(small, 1 << 23, m)


# --------------------------------------------------------------------------- inputs
def to_f32_bits(x):
    """float32 / bfloat16 / float16 -> fp32 bit patterns, exactly (subnormals included)."""
    if x.dtype == jnp.float32:
        return lax.bitcast_convert_type(x, U32)
    if x.dtype == jnp.bfloat16:
        return lax.bitcast_convert_type(x, jnp.uint16).astype(U32) << 16
    if x.dtype == jnp.float16:
        h = lax.bitcast_convert_type(x, jnp.uint16).astype(U32)
        sign, k, m = decode(h, F16)
        finite = sign.astype(U32) << 31 | jnp.where(m == 0, U32(0), encode_f32(k, m))
        special = sign.astype(U32) << 31 | F32_INF_BITS | ((h & 0x3FF) << 13)
        return jnp.where((h & 0x7C00) == 0x7C00, special, finite)
    raise TypeError(f"unsupported input dtype {x.dtype}")


def abs_max_bits(bits, axes):
    """Largest |x| as fp32 bits (integer max: exact on subnormals). NaN/Inf give >= 0x7F800000."""
    return jnp.max(bits & U32(F32_ABS_MASK), axis=axes)


def global_amax_bits(x):
    """Largest finite |x| of the whole tensor (NaN and Inf ignored), as fp32 bits; 0 if empty."""
    return tensor_amax_bits(x, finite_only=True)


TENSOR_AMAX_CHUNK = (2048, 4)  # elements per partial maximum (see tensor_amax_bits)


def block_length(block: int, k) -> int:
    """Elements per block along an axis of length ``k``: ``block``, or ``k`` when the axis is one
    partial block (no padding needed; zeros would change nothing). A symbolic ``k`` (jax.export
    with a symbolic dimension) cannot be compared with the block: the whole block then, padded."""
    return block if _export.is_symbolic_dim(k) else min(block, k)  # public in jax 0.7-0.12


def tensor_amax_bits(x, finite_only: bool):
    """Largest |x| of the whole tensor as fp32 bits (of its finite values, or with NaN / Inf bits
    winning); 0 for an empty tensor. Integer maxima on the input's own bits (|x| orders like its
    bits, subnormals included), widened exactly.

    In chunks: a max over all of x compiled on XLA:CPU to one serial loop, 3.5x the time of a pass
    ``x * 2`` (measured; 5.9 ms of an NVFP4 quantize's 1.2 ms + this). So maxima of 8192-element
    chunks (as [n, 2048, 4]: a non-minor max, vectorised across the 4), widened, then their max
    (the widening also keeps XLA from merging the two reductions back into one; smaller chunks
    left a second reduction big enough to be slow again: 4.5x at 32 x 4). The same value."""
    raw, inf = (jnp.uint16, 0x7C00 if x.dtype == jnp.float16 else 0x7F80) if x.dtype.itemsize == 2 else \
        (U32, F32_INF_BITS)
    a = lax.bitcast_convert_type(x, raw).reshape(-1) & raw(0x7FFF if raw == jnp.uint16 else F32_ABS_MASK)
    if finite_only:
        a = jnp.where(a < inf, a, raw(0))
    chunk = TENSOR_AMAX_CHUNK[0] * TENSOR_AMAX_CHUNK[1]
    # smaller tensors (many, under vmap) take one reduction; so does a symbolic size (jax.export),
    # whose padding to whole chunks could not be proved a multiple of them
    if not _export.is_symbolic_dim(a.size) and a.size > chunk:
        a = jnp.pad(a, (0, -a.size % chunk)).reshape((-1,) + TENSOR_AMAX_CHUNK)
        a = jnp.max(a, axis=1, initial=raw(0))
    m = a.reshape(-1)
    m = m.astype(U32) if raw == U32 else to_f32_bits(lax.bitcast_convert_type(m, x.dtype))
    return jnp.max(m, initial=np.uint32(0))


def nvfp4_global_scale(x):
    """Dequantisation global scale g = RN(amax / (6 * 448)), amax over finite values; 1 if 0."""
    return nvfp4_global_scale_of(global_amax_bits(x))


def nvfp4_global_scale_of(amax):
    """NVFP4's default global scale from the tensor's finite amax (fp32 bits)."""
    _, ka, ma = decode(amax, F32)
    _, kd, md = decode(jnp.uint32(np.float32(6 * 448).view(np.uint32)), F32)
    k, m = clamp_to_min_normal(*divide(ka, ma, kd, md))
    g = jnp.where(amax == 0, U32(F32_ONE_BITS), encode_f32(k, m))
    return lax.bitcast_convert_type(g, jnp.float32)


# --------------------------------------------------------------------------- formats
# Element formats: (bit format, significand of elem_max as m, exponent of elem_max).
# 448 = 1.75 * 2**8, 57344 = 1.75 * 2**15, 6 = 1.5 * 2**2.
ELEMENTS = {
    "e4m3": (E4M3, 0xE00000, 8),
    "e5m2": (E5M2, 0xE00000, 15),
    "e2m1": (E2M1, 0xC00000, 2),
}
E8M0_NAN = 0xFF
E8M0_BIAS = 127


def _where_m(mask_zero, m):
    return jnp.where(mask_zero, 0, m)


def mx_quantize_blocks(bits, amax, elem: str, rounding: str):
    """MX (OCP MX v1.0 with an E8M0 scale). bits: blocked fp32 bits; amax broadcastable."""
    f, fm, em = ELEMENTS[elem]
    special = amax >= F32_INF_BITS
    _, ka, ma = decode(amax, F32)
    e = ka - em
    if rounding == "up":  # smallest e with amax <= elem_max * 2**e: nothing saturates
        e = e + (ma > fm).astype(I32)
    e = jnp.clip(e, -E8M0_BIAS, E8M0_BIAS)
    e = jnp.where(amax == 0, 0, e)
    scale = jnp.where(special, U32(E8M0_NAN), (e + E8M0_BIAS).astype(U32))
    sign, k, m = decode(bits, F32)
    code = round_to(sign, k - e, m, f, saturate=True)
    return jnp.where(special, U32(0), code), scale


def fp8_blockwise_quantize_blocks(bits, amax):
    """E4M3 elements, fp32 scale = RN(amax / 448) (>= 2**-126; 1 for an all-zero block)."""
    f, fm, em = ELEMENTS["e4m3"]
    special = amax >= F32_INF_BITS
    _, ka, ma = decode(amax, F32)
    ks, ms = clamp_to_min_normal(*divide(ka, ma, em, fm))
    scale = jnp.where(special, U32(F32_NAN_BITS), jnp.where(amax == 0, U32(F32_ONE_BITS), encode_f32(ks, ms)))
    _, ks, ms = decode(scale, F32)
    sign, k, m = decode(bits, F32)
    kq, mq = divide(k, m, ks, ms)
    code = round_to(sign, kq, _where_m(m == 0, mq), f, saturate=True)
    return jnp.where(special, U32(0), code), scale


def _global_scale_invalid(g_bits):
    """g must be a positive normal fp32: zero, subnormal (FTZ), negative, Inf, NaN are not."""
    exp = (g_bits >> 23) & 0xFF
    return ((g_bits >> 31) == 1) | (exp == 0) | (exp == 0xFF)


def nvfp4_block_scale(amax, g_bits, rounding: str):
    """NVFP4's E4M3 block scale code, in jax.nn's order (docs/formats.md "NVFP4"): y = RN(amax / g);
    scale = E4M3 of RN(y / 6) ("nearest": ties to even, 0 for an all-zero or tiny block; "up":
    ceil, 1.0 for an all-zero block), saturating at 448; the NaN code for a block holding NaN / Inf
    or a global scale that is not a positive normal fp32."""
    _, fm, em = ELEMENTS["e2m1"]
    special = (amax >= F32_INF_BITS) | _global_scale_invalid(g_bits)
    _, kg, mg = decode(g_bits, F32)
    _, ka, ma = decode(amax, F32)
    ky, my = divide(ka, ma, kg, mg)
    kq, mq = divide(ky, my, em, fm)  # RN(y / 6): rounding it first changes no E4M3 bit (docs)
    mode = "up" if rounding == "up" else "nearest"
    scale = round_to(jnp.zeros_like(kq), kq, _where_m(ma == 0, mq), E4M3, mode=mode, saturate=True)
    if mode == "up":
        scale = jnp.where(amax == 0, U32(0x38), scale)  # 1.0 for an all-zero block
    return jnp.where(special, U32(E4M3.nan_code), scale)


def nvfp4_quantize_blocks(bits, amax, g_bits, rounding: str):
    """E2M1 elements with the E4M3 block scale of ``nvfp4_block_scale``: elements
    RN_E2M1(RN(RN(x / g) / scale)), +-6 where the scale is 0 (x / 0 saturates) and +-0 for zeros;
    0 in a special block."""
    f = ELEMENTS["e2m1"][0]
    scale = nvfp4_block_scale(amax, g_bits, rounding)
    _, kg, mg = decode(g_bits, F32)
    _, ks, ms = decode(scale, E4M3)
    sign, k, m = decode(bits, F32)
    kx, mx = divide(k, m, kg, mg)
    kq, mq = divide(kx, mx, ks, ms)
    code = round_to(sign, kq, _where_m(m == 0, mq), f, saturate=True)
    saturated = (sign.astype(U32) << f.sign_shift) | U32(f.max_code)
    code = jnp.where((ms == 0) & (m != 0), saturated, code)  # scale 0: x / 0 saturates
    return jnp.where(scale == E4M3.nan_code, U32(0), code), scale


def _nan_out(out: BitFormat):
    return U32(out.nan_code)


def mx_dequantize_blocks(codes, scale, elem: str, out: BitFormat):
    f = ELEMENTS[elem][0]
    sign, k, m = decode(codes, f)
    y = round_to(sign, k + scale.astype(I32) - E8M0_BIAS, m, out)
    return _dequant_specials(y, codes, f, out, scale == E8M0_NAN)


def fp8_blockwise_dequantize_blocks(codes, scale_bits, out: BitFormat):
    f = ELEMENTS["e4m3"][0]
    sign, k, m = decode(codes, f)
    ss, ks, ms = decode(scale_bits, F32)
    ky, my = multiply(k, m, ks, ms)
    # data x scale: a negative scale (never made by quantize, possible in a hand-built array)
    # flips the sign, as the product does (docs/design.md, issue 15)
    y = round_to(sign ^ ss, ky, _where_m((m == 0) | (ms == 0), my), out)
    bad_scale = (scale_bits & F32_ABS_MASK) >= F32_INF_BITS
    return _dequant_specials(y, codes, f, out, bad_scale)


def nvfp4_dequantize_blocks(codes, scale, g_bits, out: BitFormat):
    f = ELEMENTS["e2m1"][0]
    sign, k, m = decode(codes, f)
    ss, ks, ms = decode(scale, E4M3)
    _, kg, mg = decode(g_bits, F32)
    kt, mt = multiply(k, m, ks, ms)  # exact: 2 x 4 significand bits
    ky, my = multiply(kt, mt, kg, mg)
    y = round_to(sign ^ ss, ky, _where_m((m == 0) | (ms == 0), my), out)
    bad_scale = ((scale & 0x7F) == E4M3.nan_code) | _global_scale_invalid(g_bits)
    return _dequant_specials(y, codes, f, out, bad_scale)


def _dequant_specials(y, codes, f: BitFormat, out: BitFormat, bad_scale):
    """NaN scale -> NaN; NaN / Inf elements (E4M3 0x7F, E5M2 exponent 31) stay NaN / Inf."""
    mag = codes.astype(U32) & ((1 << f.sign_shift) - 1)
    if f.nan_code is not None:
        exp_all_ones = (mag >> f.mbits) == (1 << f.ebits) - 1
        elem_nan = (mag == f.nan_code) if not f.has_inf else (exp_all_ones & ((mag & ((1 << f.mbits) - 1)) != 0))
        elem_inf = exp_all_ones & ((mag & ((1 << f.mbits) - 1)) == 0) if f.has_inf else jnp.zeros_like(elem_nan)
        sign = (codes.astype(U32) >> f.sign_shift) & 1
        inf = (sign << out.sign_shift) | U32(out.max_code + 1)
        y = jnp.where(elem_inf, inf, y)
        bad_scale = bad_scale | elem_nan
    return jnp.where(bad_scale, _nan_out(out), y)
