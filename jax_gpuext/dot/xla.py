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
  (docs/formats.md, "Exactness of the bf16 dequantization"). Where the formats alone prove it
  (E2M1 elements, E4M3 scales: NVFP4), the bf16 path is taken outright; otherwise the smallest
  block scale of each operand decides at run time, by ``lax.cond`` (only the branch taken runs;
  no ``where`` computing both), between the bf16 dot and the f32 one. NVFP4's global scales
  multiply the float32 accumulator, as in the reference.
- FP8_TENSOR: XLA's own FP8 dot. The operands stay float8, the dot accumulates in float32, and
  the two per-tensor scales multiply the float32 result: the pattern XLA's GEMM rewriter turns
  into one cuBLASLt FP8 matmul with its scales as alpha.
- FP8 blockwise (1x128, 128x128): the float32 reference (dequantize, ``lax.dot_general`` at
  HIGHEST precision): its fp32 block scales make element x scale inexact in bfloat16.

The result equals the reference up to the order of the float32 accumulation.
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
    value for every element (None for formats without E8M0 scales).

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
    if lhs.global_scale is None and rhs.global_scale is None:
        return acc.astype(p.out_dtype)
    return (acc * (_dot._global(lhs, acc.ndim) * _dot._global(rhs, acc.ndim))).astype(p.out_dtype)


def _block_dot(lhs, rhs, p: _dot.DotProblem, sel) -> jax.Array:
    out = _direct_out(lhs, rhs, p)

    def bf16_dot(lhs, rhs):
        return _dot_general(_dequantized(lhs, p.lhs_format, jnp.bfloat16),
                            _dequantized(rhs, p.rhs_format, jnp.bfloat16), p, out=out)

    def f32_dot(lhs, rhs):
        return _dot_general(_dequantized(lhs, p.lhs_format, jnp.float32),
                            _dequantized(rhs, p.rhs_format, jnp.float32), p, lax.Precision.HIGHEST).astype(out)

    checks = [(q, f) for q, f in ((lhs, p.lhs_format), (rhs, p.rhs_format)) if not exact_statically(f)]
    if not checks:
        backends.note(sel, "bf16 dequantize + XLA dot (f32 accumulation): element x scale is exact in bf16 "
                           "for these formats")
        return _finish(bf16_dot(lhs, rhs), lhs, rhs, p)
    backends.note(sel, "bf16 dequantize + XLA dot (f32 accumulation) when every E8M0 scale is >= 2^"
                       f"{max(min_exact_scale_exponent(f) for _, f in checks)} (element x scale exact in bf16); "
                       "else the f32 dot (lax.cond on the scales)")
    ok = functools.reduce(jnp.logical_and, [scales_exact(q, f) for q, f in checks])
    return _finish(lax.cond(ok, bf16_dot, f32_dot, lhs, rhs), lhs, rhs, p)


def _per_tensor_dot(lhs, rhs, p: _dot.DotProblem, sel) -> jax.Array:
    backends.note(sel, "FP8_TENSOR: XLA FP8 dot (float8 operands, f32 accumulation), scales on the f32 result")
    acc = _dot_general(lhs.data, rhs.data, p)
    # A scale with leading dims (quantized under vmap) has one value per entry of the first
    # batch dims (validated in dot._problem), which lead dot_general's output too.
    scales = [_broadcast_leading(q.scale.astype(jnp.float32), acc.ndim) for q in (lhs, rhs)]
    return (acc * (scales[0] * scales[1])).astype(p.out_dtype)


def impl(lhs, rhs, p: _dot.DotProblem, sel) -> jax.Array:
    family = p.lhs_format.family
    if family == "fp8_tensor":
        return _per_tensor_dot(lhs, rhs, p, sel)
    if family == "fp8_block":
        backends.note(sel, "FP8 blockwise: the f32 reference (fp32 block scales are not exact in bf16)")
        return _dot._reference(lhs, rhs, p)
    return _block_dot(lhs, rhs, p, sel)


def _prefers(p) -> GateResult:
    """On CPU, ``auto`` takes this path where it was measured faster than the float32 reference
    (benchmarks/bench_cpu.py prints both; docs/design.md "CPU speed"): MX and NVFP4 on a CPU with
    bf16 dot-product instructions, where XLA:CPU's bf16 dot with f32 accumulation runs at about
    twice the f32 dot's speed. Without them it was no faster (Zen 3: MXFP8 0.9-1.1x, NVFP4
    1.2-2.1x the reference's time), so the reference is taken. FP8_TENSOR's FP8 dot was slower than the reference and FP8 blockwise is
    the reference, so both stay on it."""
    if backends.current_platform() != "cpu":
        return GateResult(True, "")
    if p.lhs_format.family in ("fp8_tensor", "fp8_block"):
        return GateResult(False, "on CPU the float32 reference is taken for FP8_TENSOR / FP8 blockwise (measured "
                                 "no slower); name backend='xla' to run it")
    if not cpu_features.has_bf16_dot_instructions():
        return GateResult(False, "on a CPU without bf16 dot instructions (avx512_bf16 / amx_bf16 / Arm bf16) XLA's "
                                 "bf16 dot is no faster than the float32 reference (measured at 2048^3: MXFP8 0.9-1.1x, NVFP4 1.2-2.1x its time); "
                                 "name backend='xla' to run it")
    return GateResult(True, "")


# Backend ``xla`` of ``block_scaled_dot``: dot/block_scaled_dot.py registers it with ``impl``.
BACKEND = backends.Backend(
    "xla", ("cuda", "cpu"), (),
    "XLA only: MX / NVFP4 dequantized to bf16 + XLA dot with f32 accumulation (f32 where bf16 is not "
    "exact); FP8_TENSOR through XLA's FP8 dot; FP8 blockwise on the f32 reference",
    takes="every format pair of one family, any shape; auto on CPU: MX and NVFP4 where the CPU has bf16 dot "
          "instructions", prefers=_prefers)
