"""``scaled_dot_general``: a differentiable drop-in for ``jax.lax.dot_general`` that quantizes its
high-precision operands inside and runs ``block_scaled_dot`` forward and backward (a
``custom_vjp``), with the formats of a training step chosen by ``recipe``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jax_gpuext import formats
from jax_gpuext.common import backends, export
from jax_gpuext.dot.block_scaled_dot import block_scaled_dot
from jax_gpuext.dot.common import OP, _OUT_DTYPES, _parse_dimension_numbers, format_info, result_dtype
from jax_gpuext.formats.quantize import first_order_only


# --------------------------------------------------------------------------- public: scaled_dot_general
# Backward formats. The cotangent gets ``grad_format``; the saved high-precision operands are
# re-quantized along the backward contracting axis with the forward format when it belongs to the
# same family as grad_format (operands of one dot must share a family), else with E4M3 of that
# family. NVFP4 trains with an MXFP8 backward by default: NVFP4 gradients need stochastic rounding
# and random Hadamard transforms to converge (NVIDIA's NVFP4 recipe), which we do not implement.
# FP8_TENSOR trains in E4M3 both ways (we have no per-tensor E5M2 format; its scale, recomputed
# from each cotangent's amax every step, leaves E5M2's extra range little to do).
_DEFAULT_GRAD = {"MXFP8_E4M3": "MXFP8_E5M2", "MXFP8_E5M2": "MXFP8_E5M2", "MXFP4": "MXFP8_E5M2", "NVFP4": "MXFP8_E5M2",
                 "FP8_1x128": "FP8_1x128", "FP8_128x128": "FP8_1x128", "FP8_TENSOR": "FP8_TENSOR"}
_FAMILY_E4M3 = {"mx": "MXFP8_E4M3", "nvfp4": "NVFP4", "fp8_block": "FP8_1x128", "fp8_tensor": "FP8_TENSOR"}


def _as_pair(fmt, what):
    if isinstance(fmt, (tuple, list)):
        if len(fmt) != 2:
            raise TypeError(f"{what}: format must be a BlockFormat or a (lhs_format, rhs_format) pair, got {fmt!r}")
        return tuple(fmt)
    return fmt, fmt


@dataclasses.dataclass(frozen=True)
class _Recipe:
    lhs: Any
    rhs: Any
    grad: Any
    lhs_bwd: Any
    rhs_bwd: Any


def _named_format(fmt, what: str, role: str):
    """A BlockFormat, or its name as ``quantize`` takes it (``jax_gpuext.formats.FORMATS``)."""
    if isinstance(fmt, str):
        return formats.format_named(fmt, what, role)
    if not isinstance(fmt, formats.BlockFormat):
        raise TypeError(f"{what}: {role} must be a jax_gpuext.BlockFormat or its name (one of "
                        f"{sorted(formats.FORMATS)}), got {type(fmt).__name__} {fmt!r}")
    return fmt


def recipe(format=None, grad_format=None, what: str = "scaled_dot_general") -> _Recipe:
    """The five formats of a training step: forward lhs/rhs, cotangent, backward lhs/rhs residuals.

    Formats may be given by name, alone or in pairs (as ``quantize`` takes them); the recipe holds
    the BlockFormats, so a name and its format give the same recipe. ``what`` names the public
    function in errors (``scaled_ragged_dot`` uses this recipe too)."""
    lf, rf = _as_pair(formats.MXFP8_E4M3 if format is None else format, what)
    lf, rf = _named_format(lf, what, "format"), _named_format(rf, what, "format")
    li, ri = format_info(lf), format_info(rf)
    if li.family != ri.family:
        raise ValueError(f"{what}: formats {li.name} and {ri.name} cannot be mixed")
    if li.two_d:
        raise ValueError(f"{what}: FP8_128x128 is a weight (rhs) format; use "
                         "format=(FP8_1x128, FP8_128x128) for the DeepSeek-V3 recipe")
    g = getattr(formats, _DEFAULT_GRAD[li.name]) if grad_format is None else \
        _named_format(grad_format, what, "grad_format")
    gi = format_info(g)
    if gi.two_d:
        raise ValueError(f"{what}: grad_format cannot be FP8_128x128 (the cotangent is the lhs "
                         "of both backward dots); use FP8_1x128")
    same = li.family == gi.family
    lb = lf if same else getattr(formats, _FAMILY_E4M3[gi.family])
    rb = rf if same else getattr(formats, _FAMILY_E4M3[gi.family])
    return _Recipe(lf, rf, g, lb, rb)


def _quantize(x, fmt, axis=-1):
    """Quantizes canonical ``x (B, X, K)`` along K (FP8_128x128: over (X, K)), or along ``axis``.

    formats.quantize takes float32/bfloat16/float16 and handles partial blocks itself.
    """
    if x.dtype == jnp.float64:
        x = x.astype(jnp.float32)
    return formats.quantize(x, fmt, axis=axis)


def _canonical_scaled(a, b, fa, fb, out_dtype, backend):
    """(B, M, K) x (B, K, N) -> (B, M, N): a quantized along its last axis, b along its rows.

    b is (B, K, N) because that is how ``x @ w`` holds its weight (Flax's Dense kernel is (in,
    out)): no transposed copy of it goes in, and no transposed gradient comes out.
    """
    qa, qb = _quantize(a, fa), _quantize_along_rows(b, fb)
    return block_scaled_dot(qa, qb, (((2,), (1,)), ((0,), (0,))), preferred_element_type=out_dtype,
                            backend=backend)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _scaled_canonical(a, b, rec: _Recipe, out_dtype, backend, in_dtypes):
    return _canonical_scaled(a, b, rec.lhs, rec.rhs, out_dtype, backend)


def _scaled_fwd(a, b, rec, out_dtype, backend, in_dtypes):
    # under a second derivative (jax.hessian: jvp of the vjp) jax runs this rule with tangents
    with first_order_only("scaled_dot_general"):
        # The backward quantizes each operand along its other axis (a along M for the wgrad, b
        # along N for the dgrad), in its backward format: done here, so the residuals are those
        # 8- / 4-bit copies, not a and b. Where that format is the forward's (every recipe but
        # NVFP4 / MXFP4 under MXFP8 gradients), both quantizations of an operand come from one
        # read of it (issue 35).
        qa, qa_rows = _quantize_both(a, rec.lhs, rec.lhs_bwd)  # along K (this dot), along M (the wgrad)
        qb_cols, qb = _quantize_both(b, rec.rhs_bwd, rec.rhs)  # along N (the dgrad), along K (this dot)
        out = block_scaled_dot(qa, qb, (((2,), (1,)), ((0,), (0,))), preferred_element_type=out_dtype,
                               backend=backend)
        return out, (qa_rows, qb_cols)


def _quantize_along_rows(x, fmt):
    """Quantizes canonical ``x (B, R, C)`` along R, where a dot contracts it: blocks along
    axis -2 in place (the CPU handler's strided path, CUDA's strided kernel) rather than a
    transposed copy quantized along its last axis, which costs a read and a write of x more. The
    blocks, hence the values, are the same. FP8_128x128 tiles and FP8_TENSOR's one scale do not
    depend on the axis."""
    f = format_info(fmt)
    return _quantize(x, fmt, axis=-1 if (f.two_d or f.per_tensor) else -2)


def _quantize_both(x, fmt, rows_fmt=None):
    """(_quantize(x, fmt), _quantize_along_rows(x, rows_fmt or fmt)): from one read of x where the
    two are one format and differ (formats.quantize_both_axes, issue 35: the same bits as the two
    calls); two quantizations where the formats differ."""
    rows_fmt = fmt if rows_fmt is None else rows_fmt
    if rows_fmt != fmt:
        return _quantize(x, fmt), _quantize_along_rows(x, rows_fmt)
    f = format_info(fmt)
    if f.two_d or f.per_tensor:
        q = _quantize(x, fmt)
        return q, q
    return formats.quantize_both_axes(x.astype(jnp.float32) if x.dtype == jnp.float64 else x, fmt)


def _grad_dtype(dtype):
    """The dtype a gradient dot returns: the operand's own (float64 ones come back from float32)."""
    return dtype if dtype in _OUT_DTYPES else jnp.dtype(jnp.float32)


def _swap_last_two(q):
    """``q`` quantized along axis -2 of (B, R, C), as the same blocks of its transpose (B, C, R)
    quantized along axis -1: the bits ``quantize(swapaxes(x), fmt)`` gives, without quantizing
    again (a per-tensor scale has no axis to move)."""
    swap = functools.partial(jnp.swapaxes, axis1=-1, axis2=-2)
    scale = q.scale if q.format.per_tensor and q.scale.ndim < 2 else swap(q.scale)
    return formats.BlockScaledArray(swap(q.data), scale, q.global_scale, q.format, -1)


def _scaled_bwd(rec, out_dtype, backend, in_dtypes, res, g):
    with first_order_only("scaled_dot_general"):
        return _backward(rec, backend, in_dtypes, res, g)


def _backward(rec, backend, in_dtypes, res, g):
    # res: a (B, M, K) quantized along M and b (B, K, N) along N, in the backward formats
    # (_scaled_fwd); g (B, M, N); in_dtypes: a's and b's dtypes.
    qa_rows, qb_cols = res
    a_dtype, b_dtype = in_dtypes
    # g is quantized in its own dtype (formats.quantize takes f32/bf16/f16; _quantize narrows
    # float64): a bf16 -> f32 promotion here would be one more pass with identical blocks.
    # The gradient dots return the operands' dtype (float32 accumulation, one rounding), not a
    # float32 result converted afterwards, which on a GPU is one more write and read of it.
    # dA[b,m,k] = sum_n g[b,m,n] b[b,k,n]: contract N, the last axis of both.
    # g is quantized along N (dA) and along M (dB): both from one read of g.
    qg, qg_rows = _quantize_both(g, rec.grad)
    da = block_scaled_dot(qg, qb_cols, (((2,), (2,)), ((0,), (0,))), preferred_element_type=_grad_dtype(a_dtype),
                          backend=backend)
    # dB[b,k,n] = sum_m a[b,m,k] g[b,m,n]: contract M, so a and g are quantized along M. On CPU, the
    # transpose of a quantized along M (the same blocks): a dot whose lhs contracts its leading
    # axis is about 3x slower on XLA:CPU (it converts both operands to f32 and transposes them;
    # docs/design.md "CPU speed"). On CUDA, a quantized along M as it is: XLA's GEMM takes a
    # transposed operand as it is (our GPU kernels' canonical form transposes the 8-bit data).
    # (each platform's way traced where both may be lowered for: common/export.py by_platform)
    def db_along_rows():
        return block_scaled_dot(qa_rows, qg_rows, (((1,), (1,)), ((0,), (0,))),
                                preferred_element_type=_grad_dtype(b_dtype), backend=backend)

    def db_transposed():
        return block_scaled_dot(_swap_last_two(qa_rows), qg_rows, (((2,), (1,)), ((0,), (0,))),
                                preferred_element_type=_grad_dtype(b_dtype), backend=backend)

    db = export.by_platform({"cuda": db_along_rows, "cpu": db_transposed}, (qa_rows, qg_rows))
    return da.astype(a_dtype), db.astype(b_dtype)


_scaled_canonical.defvjp(_scaled_fwd, _scaled_bwd)


def scaled_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
                       out_sharding=None, format=None, grad_format=None, backend: str = "auto") -> jax.Array:
    """``jax.lax.dot_general`` computed as a block-scaled dot, differentiable.

    Drops into ``flax.nnx.Linear(dot_general=...)`` / ``flax.linen.Dense(dot_general=...)`` (use
    ``functools.partial`` to set ``format``), and into ``nnx.LinearGeneral`` / ``linen.DenseGeneral``
    / ``nnx.MultiHeadAttention`` (``qkv_dot_general`` / ``out_dot_general``): any dimension numbers
    ``lax.dot_general`` takes. ``lhs``/``rhs`` are high-precision arrays quantized here along
    their contracting axes flattened into one (jax.nn's canonicalisation: lhs's contracting dims
    in ascending order, rhs's paired with them; partial blocks allowed). ``format`` is one BlockFormat
    for both operands or a ``(lhs, rhs)`` pair, e.g. ``(FP8_1x128, FP8_128x128)``; default
    MXFP8_E4M3. ``precision`` is accepted for signature compatibility and ignored: the precision
    is the format's. ``out_sharding`` (as in ``lax.dot_general``, which Flax >= 0.12 passes) is
    applied to the result as a sharding constraint. The backward pass quantizes the cotangent
    with ``grad_format`` (default
    MXFP8_E5M2 for MXFP8, MXFP4 and NVFP4, FP8_1x128 for FP8 blockwise, FP8_TENSOR for FP8_TENSOR) and
    re-quantizes the saved operands along the backward contracting axes (the free dims,
    flattened the same way; see ``recipe``). The result has ``lax.dot_general``'s dtype for the
    same operands and ``preferred_element_type`` (float16 x bfloat16: bfloat16; float64 under
    x64: computed in float32, cast exactly). Differentiable once, in reverse mode.
    """
    del precision
    what = "scaled_dot_general"
    backends.check_requested(OP, backend, what)
    lhs, rhs = formats.as_array(lhs, what, "lhs"), formats.as_array(rhs, what, "rhs")
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 2:
            raise TypeError(f"{what}: {name} must be float16/bfloat16/float32/float64 (it is quantized here), "
                            f"got {x.dtype} with shape {x.shape}")
    rec = recipe(format, grad_format)
    lc, rc, lb, rb = _parse_dimension_numbers(dimension_numbers, lhs.ndim, rhs.ndim, what)
    for a, b in zip(lc, rc):
        if lhs.shape[a] != rhs.shape[b]:
            raise ValueError(f"{what}: contracting sizes differ: lhs {lhs.shape} axis {a} vs rhs {rhs.shape} "
                             f"axis {b}")
    if [lhs.shape[d] for d in lb] != [rhs.shape[d] for d in rb]:
        raise ValueError(f"{what}: batch sizes differ: lhs {lhs.shape} dims {lb} vs rhs {rhs.shape} dims {rb}")
    # lax.dot_general's result dtype; float64 (x64 inputs, or asked for) computed in float32
    result, out_dtype = result_dtype(lhs.dtype, rhs.dtype, preferred_element_type, _OUT_DTYPES, what)
    # The quantized axis is the contracting dims flattened (jax.nn's canonicalisation): lhs's in
    # ascending order, rhs's in the order that pairs them with lhs's (jax.nn sorts rhs's too,
    # which is the same order whenever the pairing is monotone). Batch dims in dimension-number
    # order and free dims in ascending order, as lax.dot_general lays out its result.
    order = sorted(range(len(lc)), key=lambda i: lc[i])
    lc, rc = tuple(lc[i] for i in order), tuple(rc[i] for i in order)
    lfree = tuple(d for d in range(lhs.ndim) if d not in lc and d not in lb)
    rfree = tuple(d for d in range(rhs.ndim) if d not in rc and d not in rb)
    bsz, k = math.prod(lhs.shape[d] for d in lb), math.prod(lhs.shape[d] for d in lc)
    m, n = math.prod(lhs.shape[d] for d in lfree), math.prod(rhs.shape[d] for d in rfree)
    a = jnp.transpose(lhs, lb + lfree + lc).reshape(bsz, m, k)
    b = jnp.transpose(rhs, rb + rc + rfree).reshape(bsz, k, n)
    out = _scaled_canonical(a, b, rec, out_dtype, backend, (a.dtype, b.dtype))
    shape = ([lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lfree] + [rhs.shape[d] for d in rfree])
    out = out.reshape(shape)
    out = out.astype(result)  # float64: exact (computed in float32)
    if out_sharding is not None:
        out = lax.with_sharding_constraint(out, out_sharding)
    return out


# --------------------------------------------------------------------------- demo
def demo_steps():
    """(title, callable) pairs for ``python -m jax_gpuext demo``."""
    from jax_gpuext.common.explain import explain

    def dot_step():
        k1, k2 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k1, (64, 256), jnp.float32)
        w = jax.random.normal(k2, (128, 256), jnp.float32)
        qx, qw = formats.quantize(x, formats.MXFP8_E4M3), formats.quantize(w, formats.MXFP8_E4M3)
        f = jax.jit(lambda a, b: block_scaled_dot(a, b, preferred_element_type=jnp.float32))
        y = f(qx, qw)
        err = float(jnp.max(jnp.abs(y - x @ w.T)) / jnp.max(jnp.abs(x @ w.T)))
        print(f"MXFP8 (64x256) . (128x256)^T: max error / max |x w^T| = {err:.3g}")
        print(explain(f, qx, qw).table())

    def train_step():
        k1, k2 = jax.random.split(jax.random.key(1))
        x = jax.random.normal(k1, (32, 128), jnp.float32)
        w = jax.random.normal(k2, (128, 64), jnp.float32) / 11.3
        dn = (((1,), (0,)), ((), ()))

        def loss(w):
            return jnp.mean(scaled_dot_general(x, w, dn, preferred_element_type=jnp.float32) ** 2)

        step = jax.jit(lambda w: w - 0.1 * jax.grad(loss)(w))
        w1 = step(w)
        print(f"one MXFP8 SGD step: loss {float(loss(w)):.4f} -> {float(loss(w1)):.4f}")
        print(explain(jax.grad(loss), w).table())

    return [("block_scaled_dot (MXFP8)", dot_step), ("scaled_dot_general training step", train_step)]
