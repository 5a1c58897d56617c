"""The weight gradient's operands in one pass: op ``quantize_token_slots`` (internal; used by
``grouped.quantize_tokens_for_wgrad``, which ``scaled_ragged_dot``'s backward calls for x and dy).

Its result is the padded slot layout of ``quantize_grouped`` along the tokens, tokens last: x
(M, X), tokens first, gives FP8_1x128 codes (X, 128 * blocks) and scales (blocks, X), block j of
the layout holding one group's rows 128 j' .. 128 j' + 127 (``common.slot_rows``), zeros where the
group has fewer. Backends:

- ``cuda``: one kernel (csrc/formats/token_slots_kernel.cuh) reads x once, rows picked by a
  (first row, count) table per block that XLA computes from the device-side group sizes, and
  writes the codes transposed: ~3 B an element at bf16, where the composed path moves ~9 B
  (docs/design.md, "The weight gradient's operand passes").
- ``composed``: gather the rows into the slot layout, ``quantize`` along the tokens (any of its
  backends), transpose the codes: three passes, every platform, every grouped format.

Both are quantize's rules bit for bit (the kernel computes its scales and codes with the same code
as every CUDA quantize kernel). ``auto`` takes ``cuda`` where a GPU run has verified it (feature
``token_slots`` of ``formats.cuda``), else ``composed``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_gpuext import formats
from jax_gpuext.common import backends
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import ffi as _ffi
from jax_gpuext.common.gates import GateResult
from jax_gpuext.ragged_dot import common

OP = "quantize_token_slots"
TARGET = _ext.declare_target("gpuext_quantize_token_slots", OP)
FEATURE = "token_slots"  # @pytest.mark.verifies("formats.cuda", feature=FEATURE)
BLOCK = 128
_INPUTS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_GRID_Y = 65535


def problem(fmt, x, groups: int) -> tuple:
    """The op's problem (hashable): (format, x's shape, x's dtype, groups)."""
    return (fmt, tuple(x.shape), jnp.dtype(x.dtype), int(groups))


def _kernel_reason(p) -> str | None:
    fmt, shape, dtype, groups = p
    if not all(isinstance(d, (int, np.integer)) for d in shape):
        return f"x {list(shape)}: a symbolic shape (jax.export); the kernel's grid is fixed when it is lowered"
    if fmt != formats.FP8_1x128:
        return f"{fmt.name}: the one-pass kernel writes FP8_1x128 (what the weight-gradient kernel reads)"
    if dtype not in _INPUTS or len(shape) != 2:
        return f"x {dtype}{list(shape)}: the kernel takes 2-D float32 / bfloat16 / float16"
    m, cols = shape
    piece = 16 // dtype.itemsize
    if m == 0 or cols == 0:
        return "no tokens or no features: nothing for a kernel to do"
    if cols % piece:
        return f"{cols} features is not a multiple of {piece} (16-byte row pieces of {dtype})"
    if -(-cols // (256 if dtype.itemsize == 2 else 128)) > _GRID_Y:
        return f"{cols} features: more column tiles than a grid holds"
    if BLOCK * common.grouped_block_count(m, groups, BLOCK) + BLOCK >= 2**31:
        return "the padded tokens must stay below 2^31 - 128 (int32 slot indices, as the wgrad kernel's)"
    return None


def _supports(p) -> GateResult:
    why = _kernel_reason(p)
    return GateResult(why is None, why or "FP8_1x128 along the tokens, one pass")


def _feature(p) -> str | None:
    return FEATURE if p[0] == formats.FP8_1x128 else None


backends.register(OP, backends.Backend(
    "cuda", ("cuda",), ("cuda_extension", "cuda_device"),
    "one CUDA kernel (gpuext_quantize_token_slots): x read once, codes written transposed into the slot layout",
    _supports, takes="FP8_1x128; 2-D float32 / bfloat16 / float16 x with features % 16 bytes == 0", feature=_feature))
backends.register(OP, backends.Backend(
    "composed", ("cuda", "cpu"), (),
    "row gather into the slot layout, quantize along the tokens (quantize's own backend choice), code transpose"))


def block_table(group_sizes, m: int, nblocks: int):
    """(nblocks, 2) int32: each block's first row and row count (``common.slot_block_rows``)."""
    first, count = common.slot_block_rows(common.grouped_layout(group_sizes, m, BLOCK), nblocks)
    return jnp.stack([first, count], axis=1).astype(jnp.int32)  # the handler takes int32 (x64 or not)


def cuda_slots(x, group_sizes, nblocks: int):
    """The kernel's (codes (X, 128 nblocks) float8_e4m3fn, scales (nblocks, X) float32)."""
    m, cols = x.shape
    out = (jax.ShapeDtypeStruct((cols, BLOCK * nblocks), formats.FP8_1x128.elem_dtype),
           jax.ShapeDtypeStruct((nblocks, cols), jnp.float32))
    return _ffi.ffi_call(TARGET, out, x, block_table(group_sizes, m, nblocks), vmap_method="sequential")
