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
- the caller's own one-dot path (``acc_fn``, float32 result) runs on every pair of classes that
  both hold a block (a loop over the 16 pairs, absent ones skipped), giving D_p with
  out = sum_p 2^(o_h1 + o_h2) D_p exactly as the definition states it;
- each D_p is added to a running sum s x 2^t after aligning the two exponents in integer
  arithmetic to the larger (a summand more than 2^126 below it is dropped: it is below
  float32's resolution of the larger, itself at most sum_k |l_k r_k|), and the sum is scaled
  back and rounded once to the output type on its bit pattern (``formats.reference.round_to``):
  subnormal results come out as the subnormals they are, results past the output's range as
  inf, with no float operation that FTZ could flush;
- NaN / Inf: a zeroed element of another class times an Inf element would make a NaN that the
  definition does not have (Inf x a nonzero value is Inf). So the caller's dot of the elements
  with every finite scale set to 1 (``unit``: positive scales change no sign and no zero, and
  the elements alone cannot overflow a float32 sum, so its NaN / Inf pattern is the definition's)
  runs too, and gives the result wherever it is not finite.

Float32 block scales (FP8 blockwise; the callers use this on CPU, where XLA flushes an element x
scale below 2^-126) take the same path with the scale's exponent field as its code: 0 (zero and
subnormal scales) to 255 (Inf / NaN, kept as they are), classes ``code >> 6``, rebasing on the
decoded exponent, and 2 more at the top of the window (a float32 scale is below 2^(a + 1), and
element x scale is rounded).

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


def float32_scales(q) -> bool:
    """FP8 blockwise (float32 block scales) rather than MX (E8M0)."""
    return jnp.dtype(q.scale.dtype) == jnp.dtype(jnp.float32)


def codes(q) -> jax.Array:
    """The biased exponents of ``q``'s scales, int32 in [0, 255]: E8M0's byte (255: NaN), or a
    float32 scale's exponent field (0: zero or subnormal; 255: Inf / NaN)."""
    if float32_scales(q):
        return ((lax.bitcast_convert_type(q.scale, U32) >> 23) & 0xFF).astype(I32)
    return lax.bitcast_convert_type(q.scale, jnp.uint8).astype(I32)


def _extremes(q):
    """Smallest and largest scale exponent a of ``q`` (|scale| in [2^a, 2^(a + 1)); a float32
    subnormal's from its leading bit), non-finite and zero scales left out. 0 joins both (an
    operand with no such scale passes; 0 only widens the span, so the test stays safe)."""
    c = codes(q)
    if float32_scales(q):
        _, a, m = ref.decode(lax.bitcast_convert_type(q.scale, U32), ref.F32)
        a = jnp.where((c == E8M0_NAN) | (m == 0), 0, a)
    else:
        a = jnp.where(c == E8M0_NAN, 127, c) - 127
    return jnp.min(a, initial=0), jnp.max(a, initial=0)


def _ceil_log2(k):
    """ceil(log2 K) (0 for K <= 1): a Python int, or an int32 computed on the device for a
    symbolic K (jax.export with a symbolic token count, which the grouped dot contracts in its
    weight gradient)."""
    if isinstance(k, (int, np.integer)):
        return max(int(k) - 1, 0).bit_length()
    k1 = jnp.maximum(jnp.asarray(k, I32) - 1, 0)
    return 32 - lax.clz(k1)


def in_window(lhs, rhs, k) -> jax.Array:
    """Whether one dot over float32 (or bfloat16) dequantized operands is exact here, up to the
    order of the float32 sum: every dequantized element and every product zero or a normal
    float32 (so nothing FTZ can flush, and every product exact), and K products below 2^128.

    With a_l, a_r the scale exponents and [2^low, 2^(high + 1)) the elements' magnitudes:
    min a_l + low_l >= -126 (and for rhs), min a_l + min a_r + low_l + low_r >= -126, max a + high
    <= 127 for each operand, max a_l + max a_r + high_l + high_r + 2 + ceil(log2 K) <= 128. A
    bfloat16 element x scale is then a normal bfloat16 as well (every element's significand fits
    its 8 bits), so the xla backend's bfloat16 dot is exact under the same test.

    Float32 block scales (FP8 blockwise): |scale| < 2^(a + 1) and element x scale is rounded to
    float32 (up to a power of two at most), so each operand's top counts 2 more (``high`` + 2);
    the low side is the same. Inside, the float32 dot of the dequantized operands is the
    definition's (each element x scale rounded once to a normal float32, nothing flushed)."""
    (lo_l, hi_l), (lo_r, hi_r) = element_range(lhs.data.dtype), element_range(rhs.data.dtype)
    hi_l, hi_r = hi_l + 2 * float32_scales(lhs), hi_r + 2 * float32_scales(rhs)
    (min_l, max_l), (min_r, max_r) = _extremes(lhs), _extremes(rhs)
    kbits = _ceil_log2(k)
    return ((min_l + lo_l >= MIN_NORMAL) & (min_r + lo_r >= MIN_NORMAL)
            & (min_l + min_r + lo_l + lo_r >= MIN_NORMAL)
            & (max_l + hi_l < TOP) & (max_r + hi_r < TOP)
            & (max_l + max_r + hi_l + hi_r + 2 + kbits <= TOP))


# --------------------------------------------------------------------------- operands
def replaced(q, data, scale):
    """``q`` with new data and scale (the global scale, and the type, kept; a grouped array's
    internal ``slot_data`` dropped: it holds the old codes)."""
    leaves, aux = q.tree_flatten()
    return type(q).tree_unflatten(aux, (data, scale, leaves[2]))


def expand_blocks(q, values) -> jax.Array:
    """Per-block ``values`` (shaped like ``q.scale``) broadcast to ``q.data``'s shape, for an
    array whose blocks run along ``q.axis`` (an MX ``BlockScaledArray``)."""
    ax = q.axis % q.data.ndim
    block = q.format.block[0]
    return jnp.repeat(values, block, axis=ax)[(slice(None),) * ax + (slice(0, q.data.shape[ax]),)]


def _with_codes(q, new_codes):
    return lax.bitcast_convert_type(new_codes.astype(jnp.uint8), q.scale.dtype)


def _rescaled(q, inside, offset):
    """``q``'s scales: those ``inside`` times 2^-offset (float32: a subnormal comes out normal),
    the others 1 (float32: the scale's sign times 1); zero and non-finite scales as they are."""
    c = codes(q)
    if not float32_scales(q):
        return _with_codes(q, jnp.where(c == E8M0_NAN, E8M0_NAN, jnp.where(inside, c - offset, 127)))
    bits = lax.bitcast_convert_type(q.scale, U32)
    sign, k, m = ref.decode(bits, ref.F32)
    kept = (c == E8M0_NAN) | (m == 0)
    sign = sign.astype(U32) << 31
    moved = sign | ref.encode_f32(jnp.where(inside & ~kept, k - offset, 0), m)
    return lax.bitcast_convert_type(jnp.where(kept, bits, jnp.where(inside, moved, sign | U32(ref.F32_ONE_BITS))),
                                    F32)


def class_operand(q, h, expand) -> object:
    """Class ``h`` of ``q`` (``h`` may be traced): the blocks with biased exponent c in
    [64 h, 64 h + 63], rebased by 2^-o_h (a non-finite scale stays as it is); every other block's
    elements zeroed (scale 1, or the non-finite scale: only outputs it reaches anyway). Float32
    scales: class 0 holds zero and subnormal scales too (k down to -149: rebased to 2^-53 at
    least, which keeps E4M3 products normal)."""
    inside = (codes(q) >> CLASS_BITS) == h
    keep = expand(q, inside.astype(F32)) != 0
    return replaced(q, jnp.where(keep, q.data, jnp.zeros((), q.data.dtype)),
                    _rescaled(q, inside, class_offset(h)))


def classes_present(q) -> jax.Array:
    """(4,) bool: which exponent classes hold a block of ``q`` (an absent class adds nothing)."""
    cls = codes(q) >> CLASS_BITS
    return jnp.stack([jnp.any(cls == h) for h in range(CLASSES)])


def unit(q) -> object:
    """``q`` with every finite nonzero scale set to 1 (float32: its sign times 1, so Inf elements
    of opposite signs still cancel to NaN; zero and non-finite scales kept)."""
    return replaced(q, q.data, _rescaled(q, jnp.zeros(q.scale.shape, bool), 0))


# --------------------------------------------------------------------------- the running sum
NO_TERM = -(1 << 20)  # the exponent of an empty sum: below any real one, far from int32's limits


def empty_sum(like) -> tuple[jax.Array, jax.Array]:
    """The running sum (s, t) = 0 over ``like``'s shape. Derived from ``like`` (a comparison
    nothing folds before jax types it) so that it varies over the same devices under shard_map:
    a loop carry must vary as the body's result does."""
    z = like != like
    return jnp.where(z, F32(0), F32(0)), jnp.where(z, I32(NO_TERM), I32(NO_TERM))


def _aligned(sign, k, m, top):
    """(sign, k, m) x 2^-top as a normal float32 (|.| < 2), or 0 where it is 0 or more than 2^126
    below 2^top."""
    rel = k - top
    keep = (m != 0) & (rel >= MIN_NORMAL)
    bits = (sign.astype(U32) << 31) | ref.encode_f32(jnp.where(keep, rel, 0), m)
    return jnp.where(keep, lax.bitcast_convert_type(bits, F32), F32(0))


def add_term(state, term, offset) -> tuple[jax.Array, jax.Array]:
    """The running sum (s, t), standing for s x 2^t, plus ``term`` x 2^offset (``term`` float32,
    finite; ``offset`` an int, traced or not). Both exponents are taken apart in int32 and aligned
    to the larger (which lands in [1, 2); a summand more than 2^126 below it is dropped: below
    float32's resolution of the sum's larger part, which is at most sum |l r|), the two are added
    in float32 (normal numbers, |sum| < 4) and the larger exponent becomes the new t. A sum that
    cancels below 2^-126 of it may be flushed: an error of the same size."""
    s, t = state
    ss, ks, ms = ref.decode(lax.bitcast_convert_type(s, U32), ref.F32)
    sd, kd, md = ref.decode(lax.bitcast_convert_type(term, U32), ref.F32)
    ks, kd = ks + t, kd + offset
    top = jnp.maximum(jnp.where(ms != 0, ks, NO_TERM), jnp.where(md != 0, kd, NO_TERM))
    return _aligned(ss, ks, ms, top) + _aligned(sd, kd, md, top), top


def finish_sum(state, out_dtype) -> jax.Array:
    """The running sum rounded once to ``out_dtype`` on its bits (``formats.reference.round_to``):
    subnormal results come out as the subnormals they are, results past the output's range as
    inf, and no float operation that FTZ could flush is involved."""
    out = OUT_FORMATS[jnp.dtype(out_dtype)]
    s, t = state
    sign, k, m = ref.decode(lax.bitcast_convert_type(s, U32), ref.F32)
    code = ref.round_to(sign, k + t, m, out)  # m == 0 (no term, or an exact cancellation): +-0
    if out is ref.F32:
        return lax.bitcast_convert_type(code, F32)
    return lax.bitcast_convert_type(code.astype(jnp.uint16), out_dtype)


def combine(offsets, terms, out_dtype) -> jax.Array:
    """sum_p 2^(offsets[p]) terms[p] rounded once to ``out_dtype``: ``offsets`` static ints (P,),
    ``terms`` float32 (P, ...), each finite; the running sum of ``add_term`` over p in order."""
    state = empty_sum(terms[0])
    for p, offset in enumerate(np.asarray(offsets).reshape(-1).tolist()):
        state = add_term(state, terms[p], int(offset))
    return finish_sum(state, out_dtype)


# --------------------------------------------------------------------------- the dot
def wide(acc_fn: Callable, lhs, rhs, out_dtype, expand=expand_blocks) -> jax.Array:
    """The dot of two MX operands with any E8M0 scales (the module docstring's algorithm).

    ``acc_fn(lhs, rhs)``: the caller's one-dot path, returning the float32 accumulator (any
    contraction); it is called only on operands inside ``in_window``. ``expand(q, values)``:
    per-block values broadcast to ``q.data``'s shape (``expand_blocks`` for a ``BlockScaledArray``;
    a grouped array's layout for the grouped dot).

    The 16 class pairs run one after another in a loop of static trip count (one copy of
    ``acc_fn`` in the program, so compiling costs what one more dot does), each added to a running
    sum: the program holds one pair's operands and result at a time, about the one-dot path's
    memory (stacking the 16 pairs for one vmapped dot held 16 float32 results and 4 copies of
    each operand: 25-100 times the output's bytes, reserved by every compiled MX dot since XLA
    allocates a conditional's branches whether or not they run). A pair with a class that holds
    no block of its operand adds nothing and is skipped (``lax.cond``): ordinary data mixed with a
    few extreme blocks runs a few pairs, not 16."""
    def accumulate(a, b):
        return acc_fn(a, b).astype(F32)

    u = accumulate(unit(lhs), unit(rhs))  # finite wherever no NaN scale / NaN or Inf element meets the output
    present_l, present_r = classes_present(lhs), classes_present(rhs)

    # jax outlines a loop's body as a private function (``closed_call``); as a nested jit of this
    # name it joins the wide path's functions, and the lowered module keeps all of that path in
    # functions named ``mx_wide_scales*`` (``dot``'s comment)
    @jax.jit
    def mx_wide_scales(i, state):
        h_l, h_r = i // CLASSES, i % CLASSES

        def run(state):
            d = accumulate(class_operand(lhs, h_l, expand), class_operand(rhs, h_r, expand))
            return add_term(state, d, class_offset(h_l) + class_offset(h_r))

        return lax.cond(present_l[h_l] & present_r[h_r], run, lambda state: state, state)

    y = finish_sum(lax.fori_loop(0, CLASSES * CLASSES, mx_wide_scales, empty_sum(u)), out_dtype)
    return jnp.where(jnp.isfinite(u), y, u.astype(out_dtype))


def dot(acc_fn: Callable, lhs, rhs, k, out_dtype, fast: Callable | None = None,
        expand=expand_blocks) -> jax.Array:
    """The dot of two MX (or FP8 blockwise) operands in ``out_dtype``: ``fast(lhs, rhs)``
    (default: ``acc_fn``'s result cast) where ``in_window`` holds, else ``wide`` (``lax.cond``:
    only the branch taken runs). ``k``: the contraction's length (an int, or a symbolic size)."""
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

