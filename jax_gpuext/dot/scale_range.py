"""MX dots whose E8M0 block scales reach the ends of float32's range (docs/design.md, "The
smallest and largest MX scales"; issue 34, finding 2).

An E8M0 scale is 2^a, a in [-127, 127]. The one-dot paths (dequantize to float32 or bfloat16,
one XLA dot accumulating in float32) are exact up to the order of the float32 sum only while
every dequantized element and every product is zero or a *normal* float32 and no partial sum
can overflow unless the true sum does. At the ends of E8M0's range they are not: 2^-127 is a
float32 subnormal, which XLA:CPU flushes to zero (FTZ/DAZ) as does any GPU code compiled with
FTZ, so a block scaled by it read as 0; an E4M3 element of 2^-9 times 2^-126 is a subnormal
product, flushed the same way; 448 x 2^127 overflows to inf although the dot of that block with
one scaled by 2^-127 is an ordinary number. ``in_window`` says, from the scales' extremes, the
formats and K, whether the one-dot path is exact (the common case: one small reduction over the
scales); ``dot`` runs it then, else ``wide``:

- each operand's blocks fall into 4 exponent classes of 64 (``codes >> 6`` of the biased
  exponent: a in [-127, -64], [-63, 0], [1, 64], [65, 127]); class h is rebased by
  2^-o_h, o_h = 64 h - 96, so its scales lie in [2^-31, 2^32], and the other classes' elements
  are zeroed. Every rebased element and product is then a normal float32 for any element type
  (E5M2 x E5M2 products lie in [2^-94, 2^96)) and K < 2^32 cannot overflow a sum;
- the caller's own one-dot path (``acc_fn``, float32 result) runs on every pair of classes
  (vmapped over the two stacked class axes: one XLA dot of 16 times the work), giving D_p with
  out = sum_p 2^(o_h1 + o_h2) D_p exactly as the definition states it;
- the terms are added after aligning their exponents in integer arithmetic to the largest one
  (a term more than 2^126 below it is dropped: it is below float32's resolution of that term,
  itself at most sum_k |l_k r_k|), and the sum is scaled back and rounded once to the output
  type on its bit pattern (``formats.reference.round_to``): subnormal results come out as the
  subnormals they are, results past the output's range as inf, with no float operation that
  FTZ could flush;
- NaN / Inf: a zeroed element of another class times an Inf element would make a NaN that the
  definition does not have (Inf x a nonzero value is Inf). So the caller's dot of the elements
  with every finite scale set to 1 (``unit``: positive scales change no sign and no zero, and
  the elements alone cannot overflow a float32 sum, so its NaN / Inf pattern is the definition's)
  runs too, and gives the result wherever it is not finite.

Everything here is shape-static and works for any contraction ``acc_fn`` computes (dense
dot_general, grouped dots): the classes are elementwise masks of each operand. It imports only
``formats``, so ``dot.common`` and the grouped dot's modules can import it.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext.formats import reference as ref

I32, U32, F32 = jnp.int32, jnp.uint32, jnp.float32
E8M0 = jnp.dtype(jnp.float8_e8m0fnu)
E8M0_NAN = 255
CLASS_BITS = 6  # a class holds 2^6 = 64 consecutive exponents
CLASSES = 4  # biased exponents 0..254 >> 6; NaN (255) joins class 3
MIN_NORMAL = -126  # float32's smallest normal exponent
TOP = 128  # a float32 magnitude below 2^128 is finite
OUT_FORMATS = {jnp.dtype(jnp.float32): ref.F32, jnp.dtype(jnp.bfloat16): ref.BF16, jnp.dtype(jnp.float16): ref.F16}


def class_offset(h: int) -> int:
    """o_h: class h's scales 2^a are rebased to 2^(a - o_h), a - o_h in [-31, 32]."""
    return 64 * h - 96


@functools.lru_cache(maxsize=None)
def element_range(dtype) -> tuple[int, int]:
    """(low, high) of an element type: every nonzero finite |x| lies in [2^low, 2^(high + 1))."""
    info = jnp.finfo(dtype)
    return int(math.log2(float(info.smallest_subnormal))), int(math.floor(math.log2(float(info.max))))


def codes(q) -> jax.Array:
    """The biased E8M0 exponents of ``q``'s scales, int32 in [0, 255] (255: NaN)."""
    return lax.bitcast_convert_type(q.scale, jnp.uint8).astype(I32)


def _extremes(q):
    """Smallest and largest scale exponent a of ``q``, NaN scales left out. 0 joins both (an
    operand with no finite scale passes; 0 only widens the span, so the test stays safe)."""
    c = codes(q)
    a = jnp.where(c == E8M0_NAN, 127, c) - 127
    return jnp.min(a, initial=0), jnp.max(a, initial=0)


def in_window(lhs, rhs, k: int) -> jax.Array:
    """Whether one dot over float32 (or bfloat16) dequantized operands is exact here, up to the
    order of the float32 sum: every dequantized element and every product zero or a normal
    float32 (so nothing FTZ can flush, and every product exact), and K products below 2^128.

    With a_l, a_r the scale exponents and [2^low, 2^(high + 1)) the elements' magnitudes:
    min a_l + low_l >= -126 (and for rhs), min a_l + min a_r + low_l + low_r >= -126, max a + high
    <= 127 for each operand, max a_l + max a_r + high_l + high_r + 2 + ceil(log2 K) <= 128. A
    bfloat16 element x scale is then a normal bfloat16 as well (every element's significand fits
    its 8 bits), so the xla backend's bfloat16 dot is exact under the same test."""
    (lo_l, hi_l), (lo_r, hi_r) = element_range(lhs.data.dtype), element_range(rhs.data.dtype)
    (min_l, max_l), (min_r, max_r) = _extremes(lhs), _extremes(rhs)
    kbits = max(int(k) - 1, 0).bit_length()  # ceil(log2 K)
    return ((min_l + lo_l >= MIN_NORMAL) & (min_r + lo_r >= MIN_NORMAL)
            & (min_l + min_r + lo_l + lo_r >= MIN_NORMAL)
            & (max_l + hi_l < TOP) & (max_r + hi_r < TOP)
            & (max_l + max_r + hi_l + hi_r + 2 + kbits <= TOP))


# --------------------------------------------------------------------------- operands
def replaced(q, data, scale):
    """``q`` with new data and scale (the other parts, and the type, kept)."""
    leaves, aux = q.tree_flatten()
    return type(q).tree_unflatten(aux, (data, scale) + tuple(leaves[2:]))


def expand_blocks(q, values) -> jax.Array:
    """Per-block ``values`` (shaped like ``q.scale``) broadcast to ``q.data``'s shape, for an
    array whose blocks run along ``q.axis`` (an MX ``BlockScaledArray``)."""
    ax = q.axis % q.data.ndim
    block = q.format.block[0]
    return jnp.repeat(values, block, axis=ax)[(slice(None),) * ax + (slice(0, q.data.shape[ax]),)]


def _with_codes(q, new_codes):
    return lax.bitcast_convert_type(new_codes.astype(jnp.uint8), q.scale.dtype)


def class_operands(q, expand) -> object:
    """``q``'s 4 classes stacked along a new leading axis: class h holds the blocks with biased
    exponent c in [64 h, 64 h + 63], rebased to c - o_h (a NaN scale, in class 3, stays NaN);
    every other block's elements are zeroed (scale 1)."""
    c = codes(q)
    h = jnp.arange(CLASSES, dtype=I32).reshape((CLASSES,) + (1,) * c.ndim)
    inside = (c >> CLASS_BITS)[None] == h
    rebased = jnp.where(c == E8M0_NAN, E8M0_NAN, jnp.where(inside, c - (64 * h - 96), 127))
    cls = expand(q, (c >> CLASS_BITS).astype(F32)).astype(I32)  # each element's class, 0..3 (exact in f32)
    keep = cls[None] == h.reshape((CLASSES,) + (1,) * q.data.ndim)
    data = jnp.where(keep, q.data[None], jnp.zeros((), q.data.dtype))
    return replaced(q, data, _with_codes(q, rebased))


def unit(q) -> object:
    """``q`` with every finite scale set to 1 (NaN scales kept)."""
    c = codes(q)
    return replaced(q, q.data, _with_codes(q, jnp.where(c == E8M0_NAN, E8M0_NAN, 127)))


# --------------------------------------------------------------------------- the sum of the terms
def combine(offsets, terms, out_dtype) -> jax.Array:
    """sum_p 2^(offsets[p]) terms[p] rounded once to ``out_dtype``: ``offsets`` int (P,), ``terms``
    float32 (P, ...), each finite. Exponents are aligned in int32 to the largest term, which lands
    in [1, 2); the terms are added in float32 (each a normal number or dropped, |sum| < 2P); the
    sum is scaled back and rounded on its bits."""
    out = OUT_FORMATS[jnp.dtype(out_dtype)]
    offsets = jnp.asarray(offsets, I32).reshape((-1,) + (1,) * (terms.ndim - 1))
    sign, k, m = ref.decode(lax.bitcast_convert_type(terms, U32), ref.F32)
    k = k + offsets
    top = jnp.max(jnp.where(m != 0, k, jnp.int32(-(1 << 20))), axis=0)  # no term: below any real exponent
    rel = k - top  # <= 0 where m != 0
    keep = (m != 0) & (rel >= MIN_NORMAL)
    bits = (sign.astype(U32) << 31) | ref.encode_f32(jnp.where(keep, rel, 0), m)
    total = jnp.sum(jnp.where(keep, lax.bitcast_convert_type(bits, F32), F32(0)), axis=0)
    sign, k, m = ref.decode(lax.bitcast_convert_type(total, U32), ref.F32)
    code = ref.round_to(sign, k + top, m, out)  # m == 0 (no term, or an exact cancellation): +-0
    if out is ref.F32:
        return lax.bitcast_convert_type(code, F32)
    return lax.bitcast_convert_type(code.astype(jnp.uint16), out_dtype)


# --------------------------------------------------------------------------- the dot
def wide(acc_fn: Callable, lhs, rhs, out_dtype, expand=expand_blocks) -> jax.Array:
    """The dot of two MX operands with any E8M0 scales (the module docstring's algorithm).

    ``acc_fn(lhs, rhs)``: the caller's one-dot path, returning the float32 accumulator (any
    contraction); it is called only on operands inside ``in_window``. ``expand(q, values)``:
    per-block values broadcast to ``q.data``'s shape (``expand_blocks`` for a ``BlockScaledArray``;
    a grouped array's layout for the grouped dot).

    The classes are stacked along a new leading axis of each operand and ``acc_fn`` is vmapped
    over both: XLA sees one dot with the class axes as free dimensions (16 times the work of the
    one-dot path, in one op; 16 separate dots behind conditionals took XLA:CPU ~50x as long to
    compile, ~6 s, for every MX dot, which compiles this path whether or not it runs)."""
    def accumulate(a, b):
        return acc_fn(a, b).astype(F32)

    d = jax.vmap(jax.vmap(accumulate, in_axes=(None, 0)), in_axes=(0, None))(
        class_operands(lhs, expand), class_operands(rhs, expand))  # (4, 4, ...)
    offsets = np.add.outer(*(2 * [np.array([class_offset(i) for i in range(CLASSES)])])).reshape(-1)
    y = combine(offsets, d.reshape((CLASSES * CLASSES,) + d.shape[2:]), out_dtype)
    u = accumulate(unit(lhs), unit(rhs))  # finite wherever no NaN scale / NaN or Inf element meets the output
    return jnp.where(jnp.isfinite(u), y, u.astype(out_dtype))


def dot(acc_fn: Callable, lhs, rhs, k: int, out_dtype, fast: Callable | None = None,
        expand=expand_blocks) -> jax.Array:
    """The dot of two MX operands in ``out_dtype``: ``fast(lhs, rhs)`` (default: ``acc_fn``'s
    result cast) where ``in_window`` holds, else ``wide`` (``lax.cond``: only the branch taken
    runs). ``k``: the contraction's length (static)."""
    if fast is None:
        def fast(a, b):
            return acc_fn(a, b).astype(out_dtype)

    # The wide path as a function of its own (a nested jit lowers to a call of a private
    # function, ``mx_wide_scales``): the lowered module keeps the one-dot branch readable on its
    # own and the wide path's dots out of it (tests read it so). A fresh jit per trace: nothing is
    # cached past the trace.
    @jax.jit
    def mx_wide_scales(a, b):
        return wide(acc_fn, a, b, out_dtype, expand)

    return lax.cond(in_window(lhs, rhs, k), lambda a, b: fast(a, b).astype(out_dtype), mx_wide_scales, lhs, rhs)

