"""Backend ``xla`` of ``block_scaled_dot``: XLA's own path, as fast as XLA gets, no custom call.

What ``auto`` runs on a GPU where none of our kernels is verified (``jax_gpuext.common.verified``),
and on CPU for MX and NVFP4 operands where the CPU has bf16 dot-product instructions (measured
about twice as fast there as the f32 reference, and slower than it on a CPU without them;
``cpu_features``, docs/design.md "CPU speed"):

- MX (E8M0 block scales: MXFP8 E4M3 / E5M2, and any MX element type) and NVFP4: each operand
  dequantized to bfloat16 (converted and multiplied in bfloat16) and one XLA dot with float32
  accumulation, the work ``jax.nn.scaled_matmul`` does on Hopper; on CUDA a bfloat16 / float16 MX
  result comes straight out of the dot (docs/design.md "The dot's default on GPU"). Every
  element x block scale is then exactly a bfloat16 value except when an E8M0 block scale is
  below 2^(-133 - log2(smallest subnormal of the element type)): 2^-124 for E4M3, 2^-117 for E5M2
  (docs/formats.md, "Exactness of the bf16 dequantization"). NVFP4 (E2M1 elements, E4M3 scales)
  takes the bf16 path outright: the formats alone prove it exact. MX takes it where
  ``scale_range.in_window`` holds (every element x scale and every product a *normal* number,
  which XLA:CPU's flushing of subnormals requires beyond bf16 exactness, and no overflow), by
  ``lax.cond`` on the scales (only the branch taken runs); else ``scale_range.wide``, the same bf16
  dot over exponent classes of the scales combined by exponent arithmetic (docs/design.md, "The
  smallest and largest MX scales"). NVFP4's global scales multiply the float32 accumulator, as in
  the reference (``dot.common.apply_global_scales``).
- FP8_TENSOR: XLA's own FP8 dot. The operands stay float8, the dot accumulates in float32, and
  the two per-tensor scales multiply the float32 result: the pattern XLA's GEMM rewriter turns
  into one cuBLASLt FP8 matmul with its scales as alpha.
- FP8 blockwise (1x128, 128x128): each operand's element x float32 block scale, computed in
  float32 and rounded once to bfloat16, and one bf16 XLA dot with float32 accumulation: the same
  GEMM as MXFP8's. Not exact (a float32 scale has 24 significant bits): each dequantized element
  is off by at most 2^-9 of itself, so the dot by at most about 2^-8 of sum_k |l_k r_k|, 16 times
  below FP8 E4M3's own rounding (docs/formats.md, "FP8 blockwise through bf16: the error bound").
  An exact path in XLA would cost a float32 partial result per K block or a float32 GEMM (0.06x
  bf16 on an H200): docs/design.md, issue 33. The ``reference`` backend stays exact.

MX, NVFP4 and FP8_TENSOR results equal the reference up to the order of the float32
accumulation; FP8 blockwise within the bound above.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext.common import backends, cpu_features
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot import common as _dot
from jax_gpuext.dot import scale_range
from jax_gpuext.formats.quantize import _broadcast_leading

BF16_MIN_EXPONENT = -133  # the smallest bfloat16 subnormal is 2^-133
BF16_SIGNIFICAND_BITS = 8  # 7 stored + the implicit bit


def _low_exponent(dtype) -> int:
    """log2 of the smallest positive (subnormal) value of ``dtype``: every nonzero finite value
    is an integer multiple of it."""
    return int(math.log2(float(jnp.finfo(dtype).smallest_subnormal)))


def _significand_bits(dtype) -> int:
    return int(jnp.finfo(dtype).nmant) + 1


def min_exact_scale_exponent(info: _dot.FormatInfo) -> int | None:
    """For an MX operand (E8M0 scales 2^e): the smallest e for which element x 2^e is a bfloat16
    value for every element (None for formats without E8M0 scales). Representable is not enough for
    a dot under FTZ (XLA:CPU flushes bf16 / f32 subnormals): the dense MX path uses
    ``scale_range.in_window`` instead; this bound is kept for the grouped dot until it does too.

    x = M * 2^t with |M| < 2^p (p significand bits, at most 4 for FP8 / 2 for FP4, within
    bfloat16's 8) and t >= low(elem); x * 2^e is a bfloat16 value iff its lowest bit t + e is at
    or above bfloat16's 2^-133 (at the top, bfloat16 and float32 share their exponent range: what
    overflows one overflows the other, in the reference as here).
    """
    if info.scale_dtype != jnp.dtype(jnp.float8_e8m0fnu):
        return None
    return BF16_MIN_EXPONENT - _low_exponent(info.element_dtype)


def exact_statically(info: _dot.FormatInfo) -> bool:
    """Whether the formats alone prove every element x block scale a bfloat16 value."""
    if info.family not in ("mx", "nvfp4"):
        return False
    if info.scale_dtype == jnp.dtype(jnp.float8_e8m0fnu):  # 2^e, e >= -127
        return min_exact_scale_exponent(info) <= -127
    # A floating scale (NVFP4's E4M3): the product's significand has at most p_elem + p_scale
    # bits and its lowest bit is at least low(elem) + low(scale).
    bits = _significand_bits(info.element_dtype) + _significand_bits(info.scale_dtype)
    low = _low_exponent(info.element_dtype) + _low_exponent(info.scale_dtype)
    return bits <= BF16_SIGNIFICAND_BITS and low >= BF16_MIN_EXPONENT


def scales_exact(q, info: _dot.FormatInfo) -> jax.Array:
    """Run-time check for an MX operand: is its smallest E8M0 scale at or above the bound?
    (E8M0's bits are the biased exponent e + 127; 0xFF, NaN, passes: NaN stays NaN in bf16.)"""
    bits = lax.bitcast_convert_type(q.scale, jnp.uint8)
    return jnp.min(bits, initial=np.uint8(255)) >= np.uint8(min_exact_scale_exponent(info) + 127)


def _dequantized(q, info: _dot.FormatInfo, dtype) -> jax.Array:
    """Element x block scale, computed in ``dtype`` itself: for bfloat16 every operand and product
    is a bfloat16 value where this path is taken (min_exact_scale_exponent, exact_statically), so
    the product is exact, and XLA sees one convert-and-multiply per operand writing bfloat16 (no
    float32 copy of the operand, the pattern of XLA's own block-scaled dot on Hopper)."""
    return q.data.astype(dtype) * _dot._expanded_scale(q, info, dtype)


def _dot_general(a, b, p: _dot.DotProblem, precision=None, out=jnp.float32) -> jax.Array:
    dn = ((p.lhs_contract, p.rhs_contract), (p.lhs_batch, p.rhs_batch))
    if backends.current_platform() == "cpu":
        return canonical_dot_general(a, b, dn, precision, out)
    return lax.dot_general(a, b, dn, precision=precision, preferred_element_type=out)


def canonical_dot_general(a, b, dimension_numbers, precision=None, out=jnp.float32) -> jax.Array:
    """``lax.dot_general`` with the operands transposed first to lhs (batch, free, contracting) and
    rhs (batch, contracting, free); the result is the same (dot_general's output is batch, lhs
    free, rhs free whatever the operands' order). XLA:CPU (jaxlib 0.10-0.12) compiles a bf16 x bf16
    -> f32 dot whose rhs batch dimension is not leading (``rhs_batch_dims={1}``) into a thunk that
    fails at run time ("Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"; found
    by the long fuzz campaign; tests/dot/test_dot_dimension_numbers.py); every canonical layout
    runs. XLA:GPU picks its own layouts, so the CUDA lowering keeps the dot as given."""
    (lc, rc), (lb, rb) = dimension_numbers
    lf = [d for d in range(a.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(b.ndim) if d not in rc and d not in rb]
    a = jnp.transpose(a, (*lb, *lf, *lc))
    b = jnp.transpose(b, (*rb, *rc, *rf))
    nb, nc = len(lb), len(lc)
    dn = ((tuple(range(nb + len(lf), a.ndim)), tuple(range(nb, nb + nc))), (tuple(range(nb)), tuple(range(nb))))
    return lax.dot_general(a, b, dn, precision=precision, preferred_element_type=out)


def _direct_out(lhs, rhs, p: _dot.DotProblem):
    """On CUDA, a bfloat16 / float16 result without global scales comes straight out of the dot:
    XLA:GPU's GEMMs accumulate bf16 x bf16 in float32 and round once at the end, the same
    arithmetic as a float32 result rounded afterwards, without writing and reading back a float32
    copy of the output (1.5x the bf16 output's bytes, measured in HLO: docs/design.md "The dot's
    default on GPU"). On CPU the float32 result is kept (what XLA:CPU accumulates a narrower
    result in is not documented)."""
    if backends.current_platform() != "cuda" or lhs.global_scale is not None or rhs.global_scale is not None:
        return jnp.dtype(jnp.float32)
    return p.out_dtype


def _finish(acc, lhs, rhs, p: _dot.DotProblem) -> jax.Array:
    """Global scales (NVFP4) on the float32 accumulator, as the reference does, then the cast."""
    return _dot.apply_global_scales(acc, lhs, rhs, p.out_dtype)


def _block_dot(lhs, rhs, p: _dot.DotProblem, sel) -> jax.Array:
    out = _direct_out(lhs, rhs, p)

    def bf16_dot(lhs, rhs, out=out):
        return _dot_general(_dequantized(lhs, p.lhs_format, jnp.bfloat16),
                            _dequantized(rhs, p.rhs_format, jnp.bfloat16), p, out=out)

    if p.lhs_format.family == "mx":
        # Exact in bf16 is not enough: XLA:CPU flushes bf16 / f32 subnormals (an element x 2^-127,
        # or a product below 2^-126), and 448 x 2^127 overflows. Where scale_range's window holds,
        # every element x scale and product is a normal number and the bf16 dot is exact; else its
        # exponent classes, each a bf16 dot (docs/design.md, "The smallest and largest MX scales").
        backends.note(sel, "bf16 dequantize + XLA dot (f32 accumulation) when the E8M0 scales keep every element x "
                           "scale and product a normal float (scale_range.in_window); else the same dot per class "
                           "of 64 scale exponents, combined by exponent arithmetic (lax.cond on the scales)")
        return scale_range.dot(functools.partial(bf16_dot, out=jnp.float32), lhs, rhs, p.bmnk[3], p.out_dtype,
                               fast=bf16_dot)

    # NVFP4: E2M1 x E4M3 products are normal bfloat16 values whatever the scales (exact_statically;
    # the smallest, 0.5 x 2^-9, is far from bf16's subnormals)
    backends.note(sel, "bf16 dequantize + XLA dot (f32 accumulation): element x scale is exact in bf16 "
                       "for these formats")
    return _finish(bf16_dot(lhs, rhs), lhs, rhs, p)


def _rounded_to_bf16(q, info: _dot.FormatInfo) -> jax.Array:
    """Element x float32 block scale in float32 (one rounding, as the reference computes it), then
    rounded once more to bfloat16: within 2^-9 + 2^-24 of element x scale (relative; below 2^-126
    an absolute error, docs/formats.md "FP8 blockwise through bf16"). XLA fuses both into one
    pass writing bfloat16 (the float32 product never reaches memory). Rounding the scale to bf16
    first and multiplying in bf16 (the MX pattern) would round twice in bf16: twice this error for
    no fewer bytes."""
    return (q.data.astype(jnp.float32) * _dot._expanded_scale(q, info, jnp.float32)).astype(jnp.bfloat16)


def _fp8_block_dot(lhs, rhs, p: _dot.DotProblem, sel) -> jax.Array:
    backends.note(sel, "FP8 blockwise: element x fp32 scale rounded to bf16 + XLA bf16 dot (f32 accumulation); "
                       "within about 2^-8 * sum|l r| of the exact dot (docs/formats.md); the reference is exact")
    out = _direct_out(lhs, rhs, p)
    acc = _dot_general(_rounded_to_bf16(lhs, p.lhs_format), _rounded_to_bf16(rhs, p.rhs_format), p, out=out)
    return acc.astype(p.out_dtype)


def _per_tensor_dot(lhs, rhs, p: _dot.DotProblem, sel) -> jax.Array:
    backends.note(sel, "FP8_TENSOR: XLA FP8 dot (float8 operands, f32 accumulation), scales on the f32 result")
    acc = _dot_general(lhs.data, rhs.data, p)
    # A scale with leading dims (quantized under vmap) has one value per entry of the first
    # batch dims (validated in dot._problem), which lead dot_general's output too.
    scales = [_broadcast_leading(q.scale.astype(jnp.float32), acc.ndim) for q in (lhs, rhs)]
    if backends.current_platform() == "cpu":
        # s_l * s_r can leave float32 (2^-80 x 2^-80), and XLA:CPU flushes a subnormal product:
        # formed with an unbounded exponent, rounded once (as the reference; issue 34)
        return _dot.scaled_product(acc, *scales, p.out_dtype)
    # On CUDA the pattern XLA's GEMM rewriter turns into one cuBLASLt FP8 matmul with its scales as
    # alpha; subnormals are kept there, and only a scale product beyond float32's range (which
    # quantize's scales, amax / 448 of real data, do not reach) is not representable
    return (acc * (scales[0] * scales[1])).astype(p.out_dtype)


def impl(lhs, rhs, p: _dot.DotProblem, sel) -> jax.Array:
    family = p.lhs_format.family
    if family == "fp8_tensor":
        return _per_tensor_dot(lhs, rhs, p, sel)
    if family == "fp8_block":
        return _fp8_block_dot(lhs, rhs, p, sel)
    return _block_dot(lhs, rhs, p, sel)


def _prefers(p) -> GateResult:
    """On CPU, ``auto`` takes this path where it was measured faster than the float32 reference
    (benchmarks/bench_cpu.py prints both; docs/design.md "CPU speed"): MX and NVFP4 on a CPU with
    bf16 dot-product instructions, where XLA:CPU's bf16 dot with f32 accumulation runs at about
    twice the f32 dot's speed. Without them it was no faster (Zen 3: MXFP8 0.9-1.1x, NVFP4
    1.2-2.1x the reference's time), so the reference is taken. FP8_TENSOR's FP8 dot was slower than
    the reference, so it stays on it; so does FP8 blockwise, which this path rounds to bf16 for
    the GPU's sake (issue 33) where the CPU can keep the exact reference."""
    if backends.current_platform() != "cpu":
        return GateResult(True, "")
    if p.lhs_format.family in ("fp8_tensor", "fp8_block"):
        return GateResult(False, "on CPU the float32 reference is taken for FP8_TENSOR (measured no slower) and FP8 "
                                 "blockwise (exact; this path rounds its operands to bf16); name backend='xla' to run it")
    if not cpu_features.has_bf16_dot_instructions():
        return GateResult(False, "on a CPU without bf16 dot instructions (avx512_bf16 / amx_bf16 / Arm bf16) XLA's "
                                 "bf16 dot is no faster than the float32 reference (measured at 2048^3: MXFP8 0.9-1.1x, NVFP4 1.2-2.1x its time); "
                                 "name backend='xla' to run it")
    return GateResult(True, "")


# Backend ``xla`` of ``block_scaled_dot``: dot/block_scaled_dot.py registers it with ``impl``.
BACKEND = backends.Backend(
    "xla", ("cuda", "cpu"), (),
    "XLA only: MX / NVFP4 dequantized to bf16 + XLA dot with f32 accumulation (f32 where bf16 is not "
    "exact); FP8_TENSOR through XLA's FP8 dot; FP8 blockwise rounded to bf16 (within 2^-8 of sum |l r|)",
    takes="every format pair of one family, any shape; auto on CPU: MX and NVFP4 where the CPU has bf16 dot "
          "instructions", prefers=_prefers)
