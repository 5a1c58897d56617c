"""Quantization along a ragged axis with blocks that restart at each group's first row.

``quantize_grouped(x, fmt, group_sizes, axis=...)`` is ``jax_gpuext.quantize`` with one change: along
``axis`` (length M, split by ``group_sizes`` into G groups and the rows past them), a block never
holds rows of two groups. Block j of a group holds its rows j*b .. j*b + b - 1 (b the format's
block; the group's last block may be partial, as a tensor's last block is). This is what a
per-expert kernel computes, and what the weight gradient of a grouped dot needs (its tokens are
contracted within each group).

Exact and on the device, without a host sync and with static shapes: the rows are gathered into
the padded "slot" layout (``common.slot_rows``: every grouped block is then an ordinary, aligned
block, padded with zeros, which no format's rule sees: zeros change no block maximum), quantized
there by ``jax_gpuext.quantize`` (any of its backends; bit for bit its rules) and gathered back.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext import formats
from jax_gpuext.common import backends, export
from jax_gpuext.ragged_dot import common, token_slots


def _along(mask, axis: int, ndim: int):
    """A (n,) mask shaped to broadcast along ``axis`` of a rank-``ndim`` array."""
    shape = [1] * ndim
    shape[axis] = -1
    return mask.reshape(shape)


_FP4 = jnp.dtype(jnp.float4_e2m1fn)
_BITS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _take(x, rows, valid, axis: int):
    """x's rows ``rows`` along ``axis`` where ``valid`` (None: everywhere), zero elsewhere, bit for bit.

    The elements move as unsigned integers of their width, xor-ed with a constant on the way:
    XLA may compute a move of floats, or of their bits converted back to floats, as float
    arithmetic, which XLA:CPU does with denormals flushed. It did: jax 0.12's eager bfloat16 row
    gather returned zeros for subnormals (issue 34, finding 3: eager ``quantize_grouped`` lost
    values that ``quantize`` keeps), and under jit on jax 0.7-0.12 a gather of the bits with
    ``jnp.take``'s out-of-bounds fill (0xFFFF, a NaN as bfloat16) converted back to bfloat16 in
    the same fusion flushed them too. The xor leaves no float value to rewrite the move into;
    ``mode="clip"`` drops the fill (every index here is in range).

    float4 is moved as float32 (every E2M1 value is exact in float32, both ways), itself moved as
    bits, and converted back only after an optimization barrier, so no XLA gather or select
    ever produces 4-bit elements: jaxlib 0.7's CPU compiler miscompiles such fusions (a jitted
    ``jnp.take(v, idx).astype(float4_e2m1fn)`` returned with a second output corrupts the heap,
    without any jax_gpuext code involved; a uint4 carrier fails LLVM verification), newer
    jaxlibs do not. An elementwise conversion of a materialized float32 array is safe there."""
    fp4 = jnp.dtype(x.dtype) == _FP4
    wide = x.astype(jnp.float32) if fp4 else x
    carrier = _BITS[jnp.dtype(wide.dtype).itemsize]
    key = carrier(0x5A)
    moved = jnp.take(lax.bitcast_convert_type(wide, carrier) ^ key, rows, axis=axis, mode="clip")
    if valid is not None:
        moved = jnp.where(_along(valid, axis, x.ndim), moved, key)
    out = lax.bitcast_convert_type(moved ^ key, wide.dtype)
    return lax.optimization_barrier(out).astype(_FP4) if fp4 else out


def _transposed(x):
    """x.T, bit for bit; float4 moved as float32 and converted back after an optimization barrier
    (the reason is ``_take``'s: jaxlib 0.7's CPU compiler miscompiles fusions that produce 4-bit
    elements; a jitted transpose of float4 codes crashed it)."""
    if jnp.dtype(x.dtype) != _FP4:
        return x.T
    return lax.optimization_barrier(lax.optimization_barrier(x.astype(jnp.float32)).T).astype(_FP4)


def _axis(axis, ndim: int, shape, what: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: axis must be an int, got {type(axis).__name__} {axis!r}")
    if ndim == 0 or not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis} is out of range for x of shape {tuple(shape)}")
    return int(axis) % ndim


def quantize_grouped(x, fmt, group_sizes, *, axis: int = -1, scale_rounding: str | None = None, global_scale=None,
                     backend: str = "auto") -> common.GroupedBlockScaledArray:
    """Quantizes ``x`` to ``fmt`` along ``axis``, blocks restarting at each group of ``group_sizes``.

    ``fmt``: a format with one block axis (MXFP8_E4M3 / E5M2, MXFP4, NVFP4, FP8_1x128).
    ``group_sizes``: (G,) int32 on the device, as ``ragged_dot`` takes it (the same sizes must go
    with the result to ``ragged_dot``). ``scale_rounding``, ``global_scale`` (NVFP4: default
    amax / (6 * 448) of all of ``x``) and ``backend`` are ``jax_gpuext.quantize``'s.
    """
    what = "quantize_grouped"
    fmt = common.check_grouped_format(fmt, what)
    x = formats.as_array(x, what, "x")
    if x.dtype not in formats.INPUT_DTYPES:
        raise TypeError(f"{what}: x must be float32, bfloat16 or float16, got {x.dtype} (shape {x.shape})")
    ax = _axis(axis, x.ndim, x.shape, what)
    group_sizes = common.check_group_sizes(group_sizes, what)
    return _quantize_padded(x, fmt, group_sizes, ax, scale_rounding, global_scale, backend, what)[0]


def _quantize_padded(x, fmt, group_sizes, ax: int, scale_rounding, global_scale, backend, what: str):
    """(the GroupedBlockScaledArray, the BlockScaledArray of the padded slot layout it was gathered from)."""
    g, m, b = int(group_sizes.shape[0]), x.shape[ax], fmt.block[0]
    nblocks = common.grouped_block_count(m, g, b)
    layout = common.grouped_layout(group_sizes, m, b)
    rows, valid = common.slot_rows(layout, nblocks)
    padded = _take(x, rows, valid, ax)
    # NVFP4's default global scale, amax / (6 * 448), comes out the same from `padded`: it holds
    # every element of x once, plus zeros.
    with common.named_errors(what):  # scale_rounding, global_scale and backend are checked by quantize
        q = formats.quantize(padded, fmt, axis=ax, scale_rounding=scale_rounding, global_scale=global_scale,
                             backend=backend)
    block, pos = common.row_blocks(layout)
    data = _take(q.data, block * b + pos, None, ax)
    return common.GroupedBlockScaledArray(data, q.scale, q.global_scale, fmt, ax, g), q


def quantize_tokens_for_wgrad(x, fmt, group_sizes, *, tokens_last: bool, backend: str = "auto",
                              quantize_backend: str = "auto"):
    """``quantize_grouped`` of the tokens of a 2-D ``x`` (M, X) (tokens first, as x and dy come),
    bit for bit, given back as (X, M) quantized along axis 1 (``tokens_last``) or as (M, X) along
    axis 0, with the codes also kept in the padded slot layout, tokens last ((X, S): the array's
    internal ``slot_data``), which the weight-gradient kernel reads (``hopper.wgrad_operands``).

    ``backend``: op ``quantize_token_slots``'s (``token_slots.py``): ``cuda``, one kernel that
    reads x once and writes the codes transposed into the slot layout (FP8_1x128, ~3 B an
    element at bf16), or ``composed``: the rows gathered whole into the slot layout (coalesced),
    quantized along axis 0 there (``quantize`` on ``quantize_backend``: its column kernel on
    CUDA), the codes transposed once into (X, S): gather 2 + 2 B, quantize 2 + 1 B, transpose
    1 + 1 B. The compact array (what every other backend reads) is gathered back from the slot
    codes only where something reads it (XLA drops it otherwise). A 1-D block format's blocks are
    the same in either orientation, so (X, M) along axis 1 is ``quantize_grouped(x.T, axis=1)``
    bit for bit. Made for ``scaled_ragged_dot``'s weight gradient (x^T and dy; docs/design.md,
    "The weight gradient's operand passes"); not public: ``slot_data`` holds the codes as they
    were, and an array whose ``data`` is replaced afterwards must not keep it."""
    what = "quantize_grouped"
    if x.ndim != 2:
        raise ValueError(f"{what}: the weight gradient's operands are 2-D (tokens, features), got shape "
                         f"{tuple(x.shape)}")
    g = int(group_sizes.shape[0])
    p = token_slots.problem(fmt, x, g)
    sel = backends.select(token_slots.OP, backend, problem=p)

    def on(sel):
        if sel.chosen == "cuda":
            nblocks = common.grouped_block_count(x.shape[0], g, token_slots.BLOCK)
            slots, scale = token_slots.cuda_slots(x, group_sizes, nblocks)  # (X, S), (blocks, X)
            slots = export.mark_choice(slots, sel, p)  # before the gather below, so that the compact codes carry the mark
            # the compact codes, token t of its group at slot 128 block + position: (X, M)
            block, pos = common.row_blocks(common.grouped_layout(group_sizes, x.shape[0], token_slots.BLOCK))
            data = _take(slots, block * token_slots.BLOCK + pos, None, 1)
            q = common.GroupedBlockScaledArray(_transposed(data), scale, None, fmt, 0, g)  # (M, X) along axis 0
        else:
            q, padded = _quantize_padded(x, fmt, group_sizes, 0, None, None, quantize_backend, what)
            slots = export.mark_choice(_transposed(padded.data), sel, p)
        if tokens_last:  # (X, M) along axis 1: the codes and the (blocks, X) scales transposed
            q = common.GroupedBlockScaledArray(_transposed(q.data), q.scale.T, q.global_scale, fmt, 1, g)
        q.slot_data = slots
        return q

    return export.per_platform(sel, p, on, (x, group_sizes))


def dequantize_grouped(q, group_sizes, dtype=jnp.float32, *, backend: str = "auto"):
    """The values of a ``GroupedBlockScaledArray`` (``jax_gpuext.dequantize``'s rule, per grouped
    block), rounded once to ``dtype``; ``group_sizes`` must be those it was quantized with."""
    what = "dequantize_grouped"
    if not isinstance(q, common.GroupedBlockScaledArray):
        raise TypeError(f"{what}: q must be a GroupedBlockScaledArray (from quantize_grouped), got {type(q).__name__}")
    q.check(what)
    dtype = formats.float_dtype(dtype, formats.INPUT_DTYPES, what, "dtype")
    group_sizes = common.check_group_sizes(group_sizes, what)
    if group_sizes.shape[0] != q.groups:
        raise ValueError(f"{what}: the array was quantized in {q.groups} groups but group_sizes has shape "
                         f"{tuple(group_sizes.shape)}")
    ax = q.axis % q.data.ndim
    m, b = q.data.shape[ax], q.format.block[0]
    layout = common.grouped_layout(group_sizes, m, b)
    rows, valid = common.slot_rows(layout, q.scale.shape[ax])
    padded = _take(q.data, rows, valid, ax)
    with common.named_errors(what):  # dtype and backend are checked by dequantize
        values = formats.dequantize(formats.BlockScaledArray(padded, q.scale, q.global_scale, q.format, ax), dtype,
                                    backend=backend)
    block, pos = common.row_blocks(layout)
    return _take(values, block * b + pos, None, ax)
