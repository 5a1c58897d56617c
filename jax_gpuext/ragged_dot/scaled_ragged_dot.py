"""``scaled_ragged_dot``: a differentiable drop-in for ``jax.lax.ragged_dot`` that quantizes its
high-precision operands and runs ``ragged_dot``, with a ``custom_vjp`` whose two gradients are
grouped block-scaled dots as well (docs/block_scaled_dot.md, "Grouped dot: training"):

- forward  y (M, N)     = ragged_m(x (M, K) along K, w (G, K, N) along K / 128x128 tiles)
- dgrad    dx (M, K)    = ragged_m(dy (M, N) along N, w per group contracted along N). With
  FP8_128x128 weights the forward's quantized weights are reused, transposed in meaning only:
  a 128x128 tile is the same block whichever of its axes is contracted, so it is exact and
  costs no second quantization.
- wgrad    dw (G, K, N) = ragged_contract(x^T (K, M), dy (M, N)), tokens contracted within each
  group: both quantized along the tokens with blocks restarting at each group
  (``quantize_grouped``), which is what a per-expert weight-gradient kernel computes.

Formats follow ``scaled_dot_general``'s recipe (``jax_gpuext.dot.recipe``): the cotangent in
``grad_format``, the residuals re-quantized along the backward contracting axis.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_gpuext import formats
from jax_gpuext.common import backends
from jax_gpuext.dot.common import result_dtype
from jax_gpuext.formats.quantize import first_order_only
from jax_gpuext.dot.scaled_dot_general import recipe
from jax_gpuext.ragged_dot import common
from jax_gpuext.ragged_dot.grouped import quantize_tokens_for_wgrad
from jax_gpuext.ragged_dot.ragged_dot import ragged_dot

OP = common.OP
DEFAULT_FORMAT = (formats.FP8_1x128, formats.FP8_128x128)  # DeepSeek-V3's recipe
_DGRAD = common.RAGGED_M_NK  # dy (M, N) x w (G, K, N) contracting N: w read as (G, "N", "K")


def _quantize(x, fmt, axis):
    return formats.quantize(x.astype(jnp.float32) if x.dtype == jnp.float64 else x, fmt, axis=axis)


def _quantize_weights(w, fmt, axis):
    """w (G, K, N) along ``axis`` (1: K, 2: N); FP8_128x128 tiles (K, N) whichever is contracted."""
    return _quantize(w, fmt, -1 if len(fmt.block) == 2 else axis)


def _reuse_weights(rec) -> bool:
    """The forward's quantized weights serve the dgrad as they are: 128x128 tiles, same format."""
    return len(rec.rhs.block) == 2 and rec.rhs_bwd == rec.rhs


def _both_weights(rec) -> bool:
    """The weights' two quantizations (forward along K, dgrad along N) share a 1-D format: the
    forward writes both from one read of w (quantize_both_axes, issue 35; the same bits as two
    quantize calls) and the dgrad's copy is the residual."""
    return len(rec.rhs.block) == 1 and rec.rhs_bwd == rec.rhs


def _forward(x, w, group_sizes, rec, out_dtype, backend, both=False):
    """y and the forward's quantized weights; with ``both``, also the dgrad's (else None)."""
    qw_bwd = None
    if both:
        qw_bwd, qw = formats.quantize_both_axes(w.astype(jnp.float32) if w.dtype == jnp.float64 else w, rec.rhs)
    else:
        qw = _quantize_weights(w, rec.rhs, 1)
    y = ragged_dot(_quantize(x, rec.lhs, -1), qw, group_sizes, common.RAGGED_M, preferred_element_type=out_dtype,
                   backend=backend)
    return y, qw, qw_bwd


# w_dtype: the weights' cotangent has the primal's dtype, and the residual may be the quantized
# weights rather than w.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _scaled(x, w, group_sizes, rec, out_dtype, backend, w_dtype):
    return _forward(x, w, group_sizes, rec, out_dtype, backend)[0]


def _scaled_fwd(x, w, group_sizes, rec, out_dtype, backend, w_dtype):
    # under a second derivative (jax.hessian: jvp of the vjp) jax runs this rule with tangents
    with first_order_only("scaled_ragged_dot"):
        y, qw, qw_bwd = _forward(x, w, group_sizes, rec, out_dtype, backend, both=_both_weights(rec))
    return y, (x, qw if _reuse_weights(rec) else (qw_bwd if qw_bwd is not None else w), group_sizes)


def _scaled_bwd(rec, out_dtype, backend, w_dtype, res, dy):
    with common.named_errors("scaled_ragged_dot"), first_order_only("scaled_ragged_dot"):
        return _backward(rec, backend, w_dtype, res, dy)  # raised while jax differentiates, outside the call


def _backward(rec, backend, w_dtype, res, dy):
    x, w, group_sizes = res
    qw = w if (_reuse_weights(rec) or _both_weights(rec)) else _quantize_weights(w, rec.rhs_bwd, 2)
    dx = ragged_dot(_quantize(dy, rec.grad, -1), qw, group_sizes, _DGRAD, preferred_element_type=jnp.float32,
                    backend=backend)
    # x^T (K, M) quantized along its last axis (the tokens): an lhs contracting its leading axis
    # is ~3x slower on XLA:CPU (docs/design.md "CPU speed"), and K-major is what GPU grouped GEMMs
    # take. Both operands are quantize_grouped's bits, with the padded slot layout kept for the
    # weight-gradient kernel (grouped.quantize_tokens_for_wgrad; other backends read the compact
    # arrays).
    xf = x.astype(jnp.float32) if x.dtype == jnp.float64 else x
    dyf = dy.astype(jnp.float32) if dy.dtype == jnp.float64 else dy
    dw = ragged_dot(quantize_tokens_for_wgrad(xf, rec.lhs_bwd, group_sizes, tokens_last=True),
                    quantize_tokens_for_wgrad(dyf, rec.grad, group_sizes, tokens_last=False), group_sizes,
                    common.RAGGED_CONTRACT, preferred_element_type=jnp.float32, backend=backend)
    return dx.astype(x.dtype), dw.astype(w_dtype), None


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def scaled_ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None, *,
                      format=None, grad_format=None, backend: str = "auto") -> jax.Array:
    """``jax.lax.ragged_dot`` computed as a grouped block-scaled dot, differentiable.

    ``lhs`` (M, K) rows grouped by ``group_sizes`` ((G,) integers, converted to int32; rows past
    the sum give zeros), ``rhs`` (G, K, N) -> (M, N), as ``lax.ragged_dot``. Both are
    high-precision arrays (float16, bfloat16, float32; float64 is quantized from float32)
    quantized here. The result has ``lax.ragged_dot``'s dtype for the same operands and
    ``preferred_element_type`` (float64 under x64: computed in float32, cast exactly).
    Differentiable once, in reverse mode (``grad``, ``vjp``, ``jacrev``). ``format`` is one format or
    an ``(lhs, rhs)`` pair, default ``(FP8_1x128, FP8_128x128)`` (DeepSeek-V3); MX formats in any
    pairing and NVFP4 work too. ``grad_format`` quantizes the cotangent (default as
    ``scaled_dot_general``: FP8_1x128 for FP8 blockwise, MXFP8_E5M2 for MX / NVFP4).
    ``precision`` is accepted and ignored (the precision is the format's); ``group_offset`` must
    be None.
    """
    what = "scaled_ragged_dot"
    del precision
    backends.check_requested(OP, backend, what)
    if group_offset is not None:
        raise ValueError(f"{what}: group_offset is not supported (jax's own ragged_dot lowerings do not implement it "
                         "either); pass the groups to compute in group_sizes")
    lhs, rhs = formats.as_array(lhs, what, "lhs"), formats.as_array(rhs, what, "rhs")
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 2:
            raise TypeError(f"{what}: {name} must be float16/bfloat16/float32/float64 (it is quantized here), got "
                            f"{x.dtype} with shape {x.shape}")
    if lhs.ndim != 2 or rhs.ndim != 3:
        raise ValueError(f"{what}: lhs must be (M, K) and rhs (G, K, N) as for lax.ragged_dot, got lhs {lhs.shape} "
                         f"and rhs {rhs.shape}")
    if lhs.shape[1] != rhs.shape[1]:
        raise ValueError(f"{what}: contracting sizes differ: lhs {lhs.shape} axis 1 vs rhs {rhs.shape} axis 1")
    group_sizes = common.check_group_sizes(group_sizes, what)
    if group_sizes.shape[0] != rhs.shape[0]:
        raise ValueError(f"{what}: rhs has {rhs.shape[0]} groups (shape {rhs.shape}) but group_sizes has shape "
                         f"{tuple(group_sizes.shape)}")
    rec = recipe(DEFAULT_FORMAT if format is None else format, grad_format, what)
    for role, fmt in (("format", rec.lhs), ("format", rec.rhs), ("grad_format", rec.grad)):
        if fmt.per_tensor:
            raise ValueError(f"{what}: {role} {fmt.name} (one scale per tensor) is not a grouped format; use "
                             "FP8_1x128 / FP8_128x128, MX or NVFP4")
    # lax.ragged_dot's result dtype (its rule is dot_general's); float64 computed in float32
    result, out_dtype = result_dtype(lhs.dtype, rhs.dtype, preferred_element_type, common.OUT_DTYPES, what)
    with common.named_errors(what):  # what the grouped dots refuse (a backend that cannot run here)
        return _scaled(lhs, rhs, jnp.asarray(group_sizes), rec, out_dtype, backend, rhs.dtype).astype(result)

