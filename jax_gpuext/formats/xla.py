"""Backend ``xla`` of quantize / dequantize: pure XLA, one pass over the data, no loop, no custom call.

Bit-identical to the reference (``formats.reference``, the definition) for every format, input
and output dtype, scale rounding and axis, on XLA:CPU (denormals flushed) and XLA:GPU alike:
the rules run on integer bit patterns; the only float operations are products of significands
in [1, 2) and *estimates* of quotients, which ``reference.floor_quotient`` corrects
exactly with integer arithmetic (docs/formats.md, "Division without a loop"), so neither FTZ,
XLA:GPU's ``div.full.f32`` nor XLA rewriting a division by a constant can change a bit.

What makes it cheaper than the reference (which states the rules as plainly as possible):
- blocks are formed by reshaping around the blocked axis (``[..., nb, block, inner...]``), never
  by moving it last: no transpose, whatever the axis;
- the per-block values (scale, divisor, reciprocal) are computed once per block and pass
  through ``lax.optimization_barrier``, so XLA cannot fuse their computation into the element
  loop (it would recompute them for every element of the block);
- per element: one product by the block's reciprocal instead of a division (the estimate), and
  FP4 codes reach ``float4_e2m1fn`` by a bitcast, not a table lookup.

So a quantize compiles to an amax reduction over x, a small loop over the blocks and one loop
over the elements: x is read twice (the amax must be known before any element is rounded) and
the codes written once. NVFP4 divides nothing per element: its two roundings
(RN(RN(x / g) / s_b), then E2M1) become 7 exact thresholds on |x| per block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext.formats import reference as ref

U32, I32, F32 = jnp.uint32, jnp.int32, jnp.float32


# --------------------------------------------------------------------------- magnitudes as extended bits
# An "extended bits" value is an int32 t read as fp32 bits whose exponent field may leave [1, 254]:
# value = (1 + (t & 0x7FFFFF) / 2**23) * 2**((t >> 23) - 127), with an arithmetic shift. Scaling by
# 2**e is then t + (e << 23), exact; only the final rounding looks at the value.
MAGNITUDE = 0x7FFFFFFF
# Zero as extended bits: 2**-191, which every scaling here (by at most 2**127 up) leaves far
# below half the smallest subnormal of any element format, and whose exponent field stays far
# from int32's limits (an exponent of -149 - 127 shifted by 127 more would wrap).
ZERO_BITS = -(64 << 23)


def magnitude_bits(x):
    """|x| of float32 / bfloat16 / float16 as extended bits, exactly (subnormal inputs normalised),
    and the sign bit. Subnormals are normalised by converting their integer significand to
    float32 (exact below 2**24, and a normal result: nothing for FTZ/DAZ to flush), not by a
    count-leading-zeros."""
    if x.dtype == jnp.float16:
        h = lax.bitcast_convert_type(x, jnp.uint16).astype(I32)
        a, sign = h & 0x7FFF, (h >> 15).astype(U32)
        normal = (((a >> 10) + (127 - 15)) << 23) | ((a & 0x3FF) << 13)  # f16 exponent rebiased
        sub = lax.bitcast_convert_type(a.astype(F32), I32) - (24 << 23)  # a * 2**-24
        return jnp.where(a == 0, ZERO_BITS, jnp.where(a < 0x400, sub, normal)), sign
    b = ref.to_f32_bits(x)
    a = lax.bitcast_convert_type(b & U32(MAGNITUDE), I32)
    sub = lax.bitcast_convert_type(a.astype(F32), I32) - (149 << 23)  # a * 2**-149
    return jnp.where(a == 0, ZERO_BITS, jnp.where(a < (1 << 23), sub, a)), b >> 31


def round_magnitude(t, f: ref.BitFormat):
    """RN_f of the extended-bits magnitude t, saturating at f's largest finite code.

    - f's normal range (value >= 2**emin): round the bits to f's mantissa width, ties to even;
    - f's subnormal range, down to 2**-126: the IEEE float32 sum value + 2**(emin - mbits + 23),
      whose ulp is f's subnormal step, rounds the value to nearest even on that step exactly
      (both operands and the sum are normal float32 numbers, so FTZ/DAZ change nothing, and no
      product feeds it, so nothing can be fused into an FMA); the code is the sum's bits minus
      the addend's;
    - below 2**-126 (far below half f's smallest subnormal): code 0."""
    drop = 23 - f.mbits
    et = t >> 23
    rebias = (127 - f.bias) << f.mbits
    normal = ((t + ((1 << (drop - 1)) - 1) + ((t >> drop) & 1)) >> drop) - rebias
    magic = np.float32(2.0 ** (f.emin - f.mbits + 23))
    sum_bits = lax.bitcast_convert_type(lax.bitcast_convert_type(t, F32) + magic, I32)
    sub = jnp.where(et >= 1, sum_bits - int(magic.view(np.int32)), 0)
    code = jnp.where(et >= f.emin + 127, normal, sub)
    return jnp.minimum(code, f.max_code).astype(U32)


# --------------------------------------------------------------------------- division by a block value
def reciprocal(md):
    """Per block: RN_fp32(1 / significand(md)), in (1/2, 1], computed exactly (``ref.divide``:
    XLA:GPU's own division is not correctly rounded)."""
    k, m = ref.divide(jnp.zeros_like(md), jnp.full_like(md, 1 << 23), 0, md)
    return lax.bitcast_convert_type(ref.encode_f32(k, m), F32)


def divided_quotient(mag, kd, md, rcp, *, short: bool = False):
    """RN_fp32(|x| / d) as (k, q): q * 2**(k - 23), q in [2**23, 2**24] (2**24 where the rounding
    carried into the next binade; callers read it as it is). ``mag`` from ``magnitude_bits``, the
    divisor d = (kd, md) with its reciprocal ``rcp`` = RN_fp32(1 / significand(md)); ``short``:
    the input is bfloat16 / float16, whose significands have at most 11 bits. docs/formats.md,
    "Division without a loop":

    - c = (mx < md) puts the quotient of significands times 2**c in [1, 2); the 24-bit
      quotient is T = mx * 2**(23 + c) / md, in [2**23, 2**24);
    - the estimate y = RN(significand(x) * 2**c * rcp), read as q0 = y * 2**23 (its bits minus
      126 << 23, y clamped below at 1), is within 1.5 of T;
    - r = mx * 2**(23 + c) - q0 * md is exact in wrapping 32-bit arithmetic (|r| < 1.5 md); for a
      short significand mx * 2**(23 + c) is 0 modulo 2**32 (its lowest set bit is at 36 or above);
    - RN(T) = q0 + d, d = round(r / md): -1, 0 or 1 by comparing 2r with +-md. T is never a tie
      (2r = +-md would make mx * 2**(24 + c) = (2 q0 + 1) * md, an odd part of at least 2**24 + 1
      on the right and of mx < 2**24 on the left), so no rule for ties is needed."""
    kx = (mag >> 23) - 127
    frac = mag & 0x7FFFFF
    c = ((frac | (1 << 23)) < md).astype(I32)
    fa = lax.bitcast_convert_type((frac | ref.F32_ONE_BITS) + (c << 23), F32)  # in [1, 4)
    q = jnp.maximum(lax.bitcast_convert_type(fa * rcp, I32), ref.F32_ONE_BITS) - (126 << 23)
    product = q.astype(U32) * md.astype(U32)
    a = U32(0) if short else (((frac | (1 << 23)) << c) << 23).astype(U32)  # mx * 2**(23 + c) mod 2**32
    tw = lax.bitcast_convert_type(a - product, I32) << 1
    q = q + (tw > md).astype(I32) - (tw < -md).astype(I32)
    return kx - kd - c, q


def round_quotient_to(k, q, f: ref.BitFormat):
    """RN_f of q * 2**(k - 23) (q in [2**23, 2**24], k unbounded), saturating at f's largest code:
    ``round_magnitude`` of its extended bits (k << 23) + q + (126 << 23), where q = 2**24 carries
    into the exponent field as it should. k is clamped at -200 first (2**-200 and below: code 0
    for every element format), which keeps k << 23 inside int32."""
    return round_magnitude((jnp.maximum(k, -200) << 23) + q + (126 << 23), f)


# --------------------------------------------------------------------------- per block
def _materialize(*values):
    """Per-block uint32 values, computed once per block: XLA would otherwise fuse their cheap
    integer computation into the element loop and redo it for every element of the block (XLA:CPU
    removes ``optimization_barrier`` before fusion). A reduction is never duplicated into its
    consumers, so each value goes through a max over a new axis of two, itself and 0 (the unsigned
    max's identity): the same bits, computed in the reduction's fusion. A performance device only:
    a compiler that simplified it away would change no result."""
    def once(v):
        u = lax.bitcast_convert_type(v, U32)
        u = jnp.max(jnp.stack([u, jnp.zeros_like(u)], axis=-1), axis=-1)
        return lax.bitcast_convert_type(u, v.dtype)
    return tuple(once(v) for v in values)


def _mx_block(amax, elem: str, rounding: str):
    """The stored E8M0 scale: the reference's MX rule (mx_quantize_blocks), per block."""
    _, fm, em = ref.ELEMENTS[elem]
    _, ka, ma = ref.decode(amax, ref.F32)
    e = ka - em
    if rounding == "up":
        e = e + (ma > fm).astype(I32)
    e = jnp.where(amax == 0, 0, jnp.clip(e, -ref.E8M0_BIAS, ref.E8M0_BIAS))
    return jnp.where(amax >= ref.F32_INF_BITS, U32(ref.E8M0_NAN), (e + ref.E8M0_BIAS).astype(U32))


def _fp8_block(amax):
    """The stored fp32 scale bits: RN(amax / 448) >= 2**-126; 1 for an all-zero block, NaN for a
    special one. The scale is also the elements' divisor."""
    _, fm, em = ref.ELEMENTS["e4m3"]
    _, ka, ma = ref.decode(amax, ref.F32)
    ks, ms = ref.clamp_to_min_normal(*ref.divide(ka, ma, em, fm))
    stored = jnp.where(amax == 0, U32(ref.F32_ONE_BITS), ref.encode_f32(ks, ms))
    return jnp.where(amax >= ref.F32_INF_BITS, U32(ref.F32_NAN_BITS), stored)


# --------------------------------------------------------------------------- per element
def _signed(code, sign, f: ref.BitFormat):
    return code | (sign << f.sign_shift)


def _mx_codes(mag, sign, stored, f):
    """Element codes of an MX block: RN_f(|x| / 2**e), e = stored - 127; 0 in a NaN-scale block."""
    e = stored.astype(I32) - ref.E8M0_BIAS
    code = _signed(round_magnitude(mag - (e << 23), f), sign, f)
    return jnp.where(stored == ref.E8M0_NAN, U32(0), code)


def _divided_codes(mag, sign, kd, md, rcp, special, f, short):
    """Element codes RN_f(RN(x / d)) (FP8 blockwise and per-tensor); 0 in special blocks."""
    code = round_quotient_to(*divided_quotient(mag, kd, md, rcp, short=short), f)
    return jnp.where(special, U32(0), _signed(code, sign, f))


# NVFP4's E2M1 rounding steps as exact bounds on a real v: RN_E2M1(RN_fp32(v)) is at least code
# i + 1 iff RN_fp32(v) > 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5 (ties to the even
# code), i.e. iff v > bound_i, bound_i = t_i +- ulp(t_i) / 2 (the fp32 tie at the bound goes to
# t_i, whose last bit is 0). Each bound is N * 2**w with N an odd 25-bit integer.
NVFP4_BOUNDS = ((2**24 + 1, -26), (3 * 2**23 - 1, -25), (5 * 2**22 + 1, -24), (7 * 2**22 - 1, -24),
                (5 * 2**22 + 1, -23), (7 * 2**22 - 1, -23), (5 * 2**22 + 1, -22))


def truncated_product(n, w, kd, md):
    """fp32 bit pattern U with |x| > d  iff  bits(|x|) > U, for d = n * md * 2**(w + kd - 23): n an
    odd integer in (2**24, 2**25), md a significand in [2**23, 2**24), w and kd int32 (unbounded).

    d has at least 25 significant bits, so it is never a float32 value (normal or subnormal) and
    |x| exceeds it iff |x| exceeds its truncation U onto the float32 grid (+Inf's pattern past
    float32's range). The 49-bit product n * md is truncated to 24 bits as floor(n * md / 2**s):
    a float32 estimate, then exact by the remainder modulo 2**32 (the device of
    ``reference.floor_quotient``; the divisor is 2**s, so the correction is a shift)."""
    n = jnp.asarray(n)
    pf = n.astype(F32) * md.astype(F32)  # ~ n * md, within a few 2**-24 relative
    s = (lax.bitcast_convert_type(pf, I32) >> 23) - 127 - 23  # 24 or 25
    q = (pf * lax.bitcast_convert_type((127 - s) << 23, F32)).astype(I32)  # pf / 2**s
    r = lax.bitcast_convert_type(n.astype(U32) * md.astype(U32) - (q.astype(U32) << s.astype(U32)), I32)
    q = q + (r >> s)  # r / 2**s floored: now q = floor(n * md / 2**s) exactly
    r = r & ((1 << s) - 1)
    low = q < (1 << 23)  # the estimate's binade was one too high
    q = jnp.where(low, (q << 1) | ((r >> (s - 1)) & 1), q)
    s = s - low.astype(I32)
    high = q >= (1 << 24)  # one too low
    q, s = jnp.where(high, q >> 1, q), s + high.astype(I32)
    e = s + w + kd + 127  # the float32 exponent field of the truncation's leading bit
    normal = (e << 23) | (q & 0x7FFFFF)
    sub = q >> jnp.clip(1 - e, 0, 31)  # onto the subnormal grid (floor of a floor)
    return jnp.where(e >= 255, ref.F32_INF_BITS, jnp.where(e >= 1, normal, sub)).astype(U32)


def nvfp4_thresholds(ks, ms, kg, mg):
    """Per block: fp32 bit patterns X_i with RN_E2M1(RN(RN(|x| / g) / s_b)) >= code i + 1  iff
    bits(|x|) > X_i, for the E4M3 block scale s_b = (ks, ms) and the global scale g = (kg, mg)
    (docs/formats.md, "The xla backend, proved exact"), all exponents unbounded:

    - the last two roundings: code >= i + 1 iff w / s_b > bound_i, w = RN(|x| / g);
    - bound_i s_b = P 2**(w_i + ks - 3), P = N_i (ms >> 20) in [2**27, 2**29) (E4M3 significands
      have 4 bits), is never on the 24-bit grid (its odd part is at least N_i > 2**24), so
      w > bound_i s_b iff w > V_i, V_i = floor24(bound_i s_b): P shifted right by 4 or 5;
    - w = RN(|x| / g) > V_i iff |x| / g > M_i = (2 V + 1) 2**(...), the midpoint between V_i and the
      next 24-bit value (never equal: M_i g has an odd part above 2**24);
    - |x| > M_i g iff bits(|x|) > ``truncated_product``.
    A zero block scale (x / 0 saturates to +-6) has thresholds 0: every nonzero |x| exceeds all 7.
    The 7 lie along a new last axis (one copy of the arithmetic: 7 unrolled copies took XLA:CPU
    3.5x as long to compile, 1.9 s against 0.55 s, for the same run time)."""
    n_i = np.array([n for n, _ in NVFP4_BOUNDS], np.uint32)
    w_i = np.array([w for _, w in NVFP4_BOUNDS], np.int32)
    ks, ms, kg, mg = (jnp.asarray(v)[..., None] for v in (ks, ms, kg, mg))
    p = n_i * (ms.astype(U32) >> 20)  # E4M3 significand: 4 bits, 8..15
    high = (p >> 28).astype(I32)  # p has 28 + high bits
    v = p >> (4 + high).astype(U32)  # V_i = v 2**(w + ks + 1 + high), v in [2**23, 2**24)
    x_i = jnp.where(ms == 0, U32(0), truncated_product((v << 1) | 1, w_i + ks + high, kg, mg))
    return x_i


def _threshold_codes(abs_bits, sign, thresholds, special, f):
    """NVFP4 element codes by counting the thresholds |x| exceeds (no division); 0 in special blocks."""
    code = sum((abs_bits > u).astype(U32) for u in thresholds)
    return jnp.where(special, U32(0), _signed(code, sign, f))


def _to_elements(codes, dtype):
    if dtype == jnp.float4_e2m1fn:
        return lax.bitcast_convert_type(codes.astype(jnp.uint4), dtype)
    return lax.bitcast_convert_type(codes.astype(jnp.uint8), dtype)


def _from_elements(data):
    if data.dtype == jnp.float4_e2m1fn:
        return lax.bitcast_convert_type(data, jnp.uint4).astype(U32)
    return lax.bitcast_convert_type(data, jnp.uint8).astype(U32)


def _scale_out(stored, fmt):
    if fmt.scale_dtype == jnp.float32:
        return lax.bitcast_convert_type(stored, F32)
    return lax.bitcast_convert_type(stored.astype(jnp.uint8), fmt.scale_dtype)


def _block_view(x, fmt, axis: int):
    """x -> (blocked x, reduction axes, scale shape, unblock): x zero-padded to whole blocks and
    reshaped so that each block is one index along the reduction axes (no transpose)."""
    shape = x.shape
    if fmt.per_tensor:
        return x, tuple(range(x.ndim)), (), lambda c: c
    if len(fmt.block) == 2:
        *lead, rows, cols = shape
        br, bc = ref.block_length(fmt.block[0], rows), ref.block_length(fmt.block[1], cols)
        nr, nc = -(-rows // br), -(-cols // bc)
        xb = jnp.pad(x, [(0, 0)] * len(lead) + [(0, nr * br - rows), (0, nc * bc - cols)])
        xb = xb.reshape(tuple(lead) + (nr, br, nc, bc))

        def unblock(c):
            return c.reshape(tuple(lead) + (nr * br, nc * bc))[..., :rows, :cols]
        return xb, (-3, -1), tuple(lead) + (nr, nc), unblock
    ax = axis % x.ndim
    k = shape[ax]
    block = ref.block_length(fmt.block[0], k)  # one partial block: no padding needed
    nb = -(-k // block)
    xb = jnp.pad(x, [(0, 0)] * ax + [(0, nb * block - k)] + [(0, 0)] * (x.ndim - ax - 1))
    xb = xb.reshape(shape[:ax] + (nb, block) + shape[ax + 1:])

    def unblock(c):
        c = c.reshape(shape[:ax] + (nb * block,) + shape[ax + 1:])
        return lax.slice_in_dim(c, 0, k, axis=ax)
    return xb, (ax + 1,), shape[:ax] + (nb,) + shape[ax + 1:], unblock


AMAX_LANES = 4


def _abs_max(x, fmt, axis: int):
    """Per block, the largest |x| as fp32 bits (kept axes of size 1, blocked like ``_block_view``).

    Computed on the input's own bits (16-bit lanes for bfloat16 / float16: |x| orders like its
    bits, subnormals included), then widened exactly. A reduction along the minor axis runs as
    ``_minor_max``: XLA:CPU compiled a direct minor-axis max over 16-128 elements, and one over
    bits already widened to 32, to scalar code 5-30x slower (measured). FP8_TENSOR: the whole
    tensor in chunks (``reference.tensor_amax_bits``: 0 for an empty tensor, so scale 1, as in
    the reference)."""
    if fmt.per_tensor:  # one block: the whole tensor, NaN and Inf included (they make its scale NaN)
        return ref.tensor_amax_bits(x, finite_only=False)
    raw = jnp.uint16 if x.dtype.itemsize == 2 else U32
    a = lax.bitcast_convert_type(x, raw) & (raw(0x7FFF) if raw == jnp.uint16 else U32(ref.F32_ABS_MASK))
    ab, axes, _, _ = _block_view(a, fmt, axis)
    widen = (lambda m: m) if raw == U32 else (lambda m: ref.to_f32_bits(lax.bitcast_convert_type(m, x.dtype)))
    if len(fmt.block) == 2:
        # A tile's rows first (a non-minor max, vectorised along the columns), widened (exact),
        # then the columns: in one reduction XLA:CPU materialised x and reduced it serially.
        return _minor_max(widen(jnp.max(ab, axis=-3, keepdims=True)), U32)
    return widen(_minor_max(ab, raw) if axes == (ab.ndim - 1,) else jnp.max(ab, axis=axes, keepdims=True))


def _minor_max(a, raw):
    """Max over the last axis, kept: as one over [..., n / 4, 4] (a non-minor max, vectorised
    across the 4), then over the 4."""
    if a.shape[-1] % AMAX_LANES or a.shape[-1] <= AMAX_LANES:
        return jnp.max(a, axis=-1, keepdims=True, initial=raw(0))
    a = a.reshape(a.shape[:-1] + (a.shape[-1] // AMAX_LANES, AMAX_LANES))
    return jnp.max(jnp.max(a, axis=-2, initial=raw(0)), axis=-1, keepdims=True)


def _abs_f32_bits(x, mag):
    """|x| as genuine float32 bits (subnormals kept as such), for threshold comparisons."""
    if x.dtype == jnp.float16:  # float16 values are all normal float32 numbers
        return jnp.where(lax.bitcast_convert_type(x, jnp.uint16) & 0x7FFF == 0, 0, mag).astype(U32)
    return ref.to_f32_bits(x) & U32(ref.F32_ABS_MASK)


def quantize(x, fmt, axis: int, rounding: str, g):
    """(data, scale) of ``x`` in ``fmt`` (validated arguments, ``x`` not empty unless ``fmt`` is
    per-tensor; ``rounding``: the scale rounding, resolved; ``g``: NVFP4's float32 global scale,
    with vmap's leading batch dims, or None)."""
    xv, _, sshape, unblock = _block_view(x, fmt, axis)
    amax = _abs_max(x, fmt, axis)
    mag, sign = magnitude_bits(xv)
    elem = _element_name(fmt)
    f = ref.ELEMENTS[elem][0]
    if fmt.is_mx:
        (stored,) = _materialize(_mx_block(amax, elem, rounding))
        codes = _mx_codes(mag, sign, stored, f)
    elif fmt.has_global_scale:
        g_bits = lax.bitcast_convert_type(g.astype(F32), U32)
        g_bits = g_bits.reshape(g.shape + (1,) * (xv.ndim - g.ndim))
        stored = ref.nvfp4_block_scale(amax, g_bits, rounding)
        _, ks, ms = ref.decode(stored, ref.E4M3)
        _, kg, mg = ref.decode(g_bits, ref.F32)
        stored, thresholds = _materialize(stored, nvfp4_thresholds(ks, ms, kg, mg))
        thresholds = [thresholds[..., i] for i in range(len(NVFP4_BOUNDS))]
        codes = _threshold_codes(_abs_f32_bits(xv, mag), sign, thresholds, stored == ref.E4M3.nan_code, f)
    else:
        stored = _fp8_block(amax)
        _, kd, md = ref.decode(stored, ref.F32)
        # each in the form the element loop uses: it reads them, it computes nothing per block
        stored, kd, md, rcp = _materialize(stored, kd, md, reciprocal(md))
        codes = _divided_codes(mag, sign, kd, md, rcp, stored == ref.F32_NAN_BITS, f, short=x.dtype.itemsize == 2)
    return _to_elements(unblock(codes), fmt.elem_dtype), _scale_out(stored.reshape(sshape), fmt)


# --------------------------------------------------------------------------- dequantize
OUT_FORMATS = {jnp.dtype(jnp.float32): ref.F32, jnp.dtype(jnp.bfloat16): ref.BF16, jnp.dtype(jnp.float16): ref.F16}


def _per_tensor(value, ndim: int):
    """A per-tensor value (FP8_TENSOR scale, NVFP4 global scale) with vmap's leading batch dims,
    shaped to broadcast against rank ``ndim``."""
    return value.reshape(value.shape + (1,) * (ndim - value.ndim))


def dequantize(q, dtype):
    """``q.data * q.scale (* q.global_scale)`` rounded once to ``dtype`` (validated arguments):
    the reference's per-element rules (``ref.*_dequantize_blocks``) applied to the data viewed as
    blocks, each block's scale broadcast to it (no repeated copy of the scales)."""
    fmt, out = q.format, OUT_FORMATS[jnp.dtype(dtype)]
    codes, _, _, unblock = _block_view(_from_elements(q.data), fmt, q.axis)
    scale = lax.bitcast_convert_type(q.scale, U32) if q.scale.dtype == jnp.float32 else \
        lax.bitcast_convert_type(q.scale, jnp.uint8).astype(U32)
    if fmt.per_tensor:
        scale = _per_tensor(scale, codes.ndim)
    elif len(fmt.block) == 2:
        scale = scale[..., :, None, :, None]
    else:
        scale = jnp.expand_dims(scale, q.axis % q.data.ndim + 1)
    if fmt.is_mx:
        y = ref.mx_dequantize_blocks(codes, scale, _element_name(fmt), out)
    elif fmt.has_global_scale:
        g_bits = _per_tensor(lax.bitcast_convert_type(q.global_scale.astype(F32), U32), codes.ndim)
        y = ref.nvfp4_dequantize_blocks(codes, scale, g_bits, out)
    else:
        y = ref.fp8_blockwise_dequantize_blocks(codes, scale, out)
    y = unblock(y)
    if dtype == jnp.float32:
        return lax.bitcast_convert_type(y, F32)
    return lax.bitcast_convert_type(y.astype(jnp.uint16), dtype)


def _element_name(fmt) -> str:
    return {jnp.dtype(jnp.float8_e4m3fn): "e4m3", jnp.dtype(jnp.float8_e5m2): "e5m2",
            jnp.dtype(jnp.float4_e2m1fn): "e2m1"}[fmt.elem_dtype]
