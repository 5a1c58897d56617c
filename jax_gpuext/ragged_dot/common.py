"""What the ``ragged_dot`` op and its backends share.

- ``RaggedProblem``: one validated call, what a backend's ``supports`` is asked about;
  ``problem(...)`` builds it and raises the op's errors (the same on every backend).
- ``GroupedBlockScaledArray``: an operand quantized along a ragged axis, its blocks restarting at
  each group's first row (``ragged_contract``, the weight gradient).
- The group arithmetic, on the device and with static shapes (``group_sizes`` is never read by
  the host): effective sizes, each row's group, each row's block along a ragged axis, and the
  padded "slot" layout in which grouped blocks are ordinary blocks.

Backends import this module, ``jax_gpuext``'s common plumbing and ``formats``, never the op
(``ragged_dot.py``), so the op can import them.

Group semantics (docs/block_scaled_dot.md, "Grouped dot"). ``group_sizes`` (G,) int32 splits the
ragged axis of length M into G contiguous groups, in order. Rows from ``sum(group_sizes)`` to M
belong to no group: they give zero output rows (``ragged_m``) or contribute nothing
(``ragged_contract``). Sizes are data on the device and are not checked; a negative size counts
as 0 and groups are cut at M (row M onwards exists in no group), which is what every backend
computes (the effective sizes below are what they are handed).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext import formats
from jax_gpuext.common import export
from jax_gpuext.common.errors import UnsupportedError
from jax_gpuext.dot.common import format_info, scaled_product

OP = "ragged_dot"
MODES = ("ragged_m", "ragged_contract")
OUT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
FAMILIES = ("mx", "nvfp4", "fp8_block")

# The two modes as lax.RaggedDotDimensionNumbers (the API's way to choose the mode: docs/design.md).
RAGGED_M = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [1]), ([], [])),
                                         lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
# ragged_m with the weights stored (G, N, K), as checkpoints hold them (gpt-oss, DeepSeek-V3)
RAGGED_M_NK = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [2]), ([], [])),
                                            lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
RAGGED_CONTRACT = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [0]), ([], [])),
                                                lhs_ragged_dimensions=[1], rhs_group_dimensions=[])


# --------------------------------------------------------------------------- the problem
@dataclasses.dataclass(frozen=True)
class RaggedProblem:
    """One call of ``ragged_dot``, as backends see it.

    ``ragged_m``: lhs (M, K) rows grouped by ``group_sizes`` (G,), rhs one matrix per group,
    (G, K, N) (``rhs_contract`` 1, as ``lax.ragged_dot`` takes it) or (G, N, K) (``rhs_contract``
    2, how checkpoints store weights) -> out (M, N). ``ragged_contract``: lhs (K, M)
    (``lhs_contract`` 1) or (M, K) (0) times rhs (M, N) (``rhs_contract`` 0) or (N, M) (1), M
    grouped and contracted within each group -> out (G, K, N) (the weight gradient); both operands
    are ``GroupedBlockScaledArray``s along M.
    ``rhs_global_per_group``: an NVFP4 rhs global scale with one value per group (weights
    quantized per expert under vmap) rather than one scalar.
    """

    mode: str
    M: int
    K: int
    N: int
    G: int
    lhs_format: formats.BlockFormat
    rhs_format: formats.BlockFormat
    out_dtype: Any
    rhs_contract: int = 1
    lhs_contract: int = 1
    has_global_scale: bool = False
    rhs_global_per_group: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "out_dtype", jnp.dtype(self.out_dtype))

    @property
    def family(self) -> str:
        return format_info(self.lhs_format).family

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (self.M, self.N) if self.mode == "ragged_m" else (self.G, self.K, self.N)

    def describe(self) -> str:
        return (f"{self.mode} M={self.M} K={self.K} N={self.N} G={self.G} "
                f"{self.lhs_format.name} x {self.rhs_format.name} -> {self.out_dtype.name}")


# --------------------------------------------------------------------------- group arithmetic
def group_ends(group_sizes, m: int) -> jax.Array:
    """(G,) int32 end row of each group: the running sum of the sizes, negative sizes counted as 0
    and saturating at ``m`` (no int32 overflow however large the sizes: each partial sum <= 2m)."""
    sizes = jnp.clip(jnp.asarray(group_sizes, jnp.int32), 0, m)
    if sizes.shape[-1] == 0:
        return sizes
    return lax.associative_scan(lambda a, b: jnp.minimum(a + b, m), sizes, axis=-1)


def effective_group_sizes(group_sizes, m: int) -> jax.Array:
    """The sizes every backend computes with: non-negative, summing to at most ``m``."""
    ends = group_ends(group_sizes, m)
    return ends - jnp.concatenate([jnp.zeros(ends.shape[:-1] + (1,), jnp.int32), ends[..., :-1]], axis=-1)


def _count_at_or_below(sorted_ends, queries) -> jax.Array:
    """For each query, how many of ``sorted_ends`` are <= it (searchsorted, side "right"), as one
    broadcast comparison: jnp.searchsorted (its binary-search loop, and its compare_all method)
    mixes the ends, which vary per device under shard_map, with queries that do not, which jax
    0.7 refuses ("requires varying manual axes to match"); jnp's comparison broadcasts them.
    O(len(queries) x (G + 1)) elements: for queries 0 .. n - 1, ``count_at_or_below`` is O(n + G)."""
    return jnp.sum(queries[:, None] >= sorted_ends[None, :], axis=1, dtype=jnp.int32)


def count_at_or_below(ends, n: int) -> jax.Array:
    """(n,) int32: for each q in 0 .. n - 1, how many of ``ends`` are <= q (searchsorted of
    ``arange(n)``, side "right", when the ends are sorted; any order counts the same).

    O(n + G) elements and work: a histogram of the ends (an end >= n counts for no q, a negative
    one for every q) and its running sum. The broadcast comparison it replaces (queries x ends)
    made ``quantize_grouped`` of 1,024 values in 1,024 groups allocate ~700 MB (issue 34, finding
    5). Under shard_map the scatter and the cumsum take device-varying ends with jax's own rules."""
    idx = jnp.clip(jnp.asarray(ends, jnp.int32), 0, n)
    hist = jnp.zeros((n + 1,), jnp.int32).at[idx].add(jnp.ones_like(idx), mode="promise_in_bounds")
    return jnp.cumsum(hist[:n], dtype=jnp.int32)


def row_groups(group_sizes, m: int) -> jax.Array:
    """(m,) int32 group of each row; G for the rows past the last group."""
    return count_at_or_below(group_ends(group_sizes, m), m)


def grouped_block_count(m: int, groups: int, block: int) -> int:
    """Scale entries along a ragged axis of length ``m`` blocked by ``block`` with restarts at each of
    ``groups`` groups: the most any group sizes can need. The G groups and the rows past them (one
    more segment) each take ceil(size / block) blocks; their sum is at most
    floor((m + (G + 1) (block - 1)) / block), and never more than m (a block holds a row).
    ``m`` may be symbolic (``jax.export`` with a symbolic token count): ``jax.core.min_dim`` keeps
    the minimum symbolic where Python's ``min`` would have to decide it (issue 34)."""
    return jax.core.min_dim(m, (m + (groups + 1) * (block - 1)) // block)


@dataclasses.dataclass(frozen=True)
class GroupedLayout:
    """Where each segment's blocks lie along a ragged axis (device arrays, (G + 1,) each: the G
    groups, then the rows past them). Segment s holds rows [row_start[s], row_start[s] + size[s])
    and blocks [block_start[s], block_start[s] + ceil(size[s] / block)) of the scale axis: the
    blocks of consecutive segments are consecutive ("compact": with every group a multiple of the
    block long, the layout is the ordinary one)."""

    block: int
    m: int
    row_start: jax.Array
    size: jax.Array
    block_start: jax.Array
    block_end: jax.Array


def grouped_layout(group_sizes, m: int, block: int) -> GroupedLayout:
    ends = group_ends(group_sizes, m)
    row_end = jnp.concatenate([ends, jnp.full((1,), m, jnp.int32)])
    row_start = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])
    size = row_end - row_start
    blocks = (size + (block - 1)) // block
    block_end = jnp.cumsum(blocks, dtype=jnp.int32)  # <= m + G + 1: no overflow
    return GroupedLayout(block, m, row_start, size, block_end - blocks, block_end)


def row_blocks(layout: GroupedLayout) -> tuple[jax.Array, jax.Array]:
    """(block index, position within the block) of each row along the ragged axis, (m,) each."""
    rows = jnp.arange(layout.m, dtype=jnp.int32)
    seg = count_at_or_below(layout.row_start[1:], layout.m)
    local = rows - layout.row_start[seg]
    return layout.block_start[seg] + local // layout.block, local % layout.block


def slot_block_rows(layout: GroupedLayout, nblocks: int) -> tuple[jax.Array, jax.Array]:
    """Block j of the padded layout holds rows first[j] .. first[j] + count[j] - 1 (one segment's,
    count <= block); returns (first, count), (nblocks,) int32 each, (0, 0) for an unused block.
    Each block's segment is found once: O(nblocks + G)."""
    b, nseg = layout.block, layout.size.shape[0]
    blk = jnp.arange(nblocks, dtype=jnp.int32)
    seg = count_at_or_below(layout.block_end, nblocks)
    used = seg < nseg
    seg = jnp.minimum(seg, nseg - 1)
    local = (blk - layout.block_start[seg]) * b  # the block's first row within its segment
    count = jnp.where(used, jnp.clip(layout.size[seg] - local, 0, b), 0)
    return jnp.where(count > 0, layout.row_start[seg] + local, 0), count


def slot_rows(layout: GroupedLayout, nblocks: int) -> tuple[jax.Array, jax.Array]:
    """The padded layout: ``nblocks * block`` slots, block j's slots holding its rows in order. Returns
    (row of each slot, whether the slot holds a row) ((nblocks * block,) each; unused slots name row 0)."""
    b = layout.block
    first, count = slot_block_rows(layout, nblocks)
    pos = jnp.arange(b, dtype=jnp.int32)[None, :]
    valid = pos < count[:, None]
    rows = jnp.where(valid, first[:, None] + pos, 0)
    return rows.reshape(nblocks * b), valid.reshape(nblocks * b)


def expanded_scale(q, group_sizes=None) -> jax.Array:
    """The block scales of ``q`` broadcast to its data's shape, float32 (exact for E8M0 / E4M3 /
    float32 scales). A ``GroupedBlockScaledArray`` needs its ``group_sizes``."""
    s = q.scale.astype(jnp.float32)
    shape = q.data.shape
    if isinstance(q, GroupedBlockScaledArray):
        ax = q.axis % len(shape)
        layout = grouped_layout(group_sizes, shape[ax], q.format.block[0])
        return jnp.take(s, row_blocks(layout)[0], axis=ax)
    blocks = q.format.block
    axes = (len(shape) - 2, len(shape) - 1) if len(blocks) == 2 else (q.axis % len(shape),)
    for ax, blk in zip(axes, blocks):
        s = jnp.repeat(s, blk, axis=ax)[(slice(None),) * ax + (slice(0, shape[ax]),)]
    return s


def dequantized(q, dtype=jnp.float32, group_sizes=None) -> jax.Array:
    """data x block scale, formed in float32 and rounded once to ``dtype``; global scales are not
    applied (they multiply the accumulator, as in the dense dot's definition)."""
    return (q.data.astype(jnp.float32) * expanded_scale(q, group_sizes)).astype(dtype)


def global_scale_of(q) -> jax.Array:
    """The operand's global scale, float32 (1 without one)."""
    return jnp.float32(1) if q.global_scale is None else jnp.asarray(q.global_scale, jnp.float32)


def apply_global_scales(acc, lhs, rhs, group_sizes, p: RaggedProblem) -> jax.Array:
    """The float32 accumulator times the operands' global scales (NVFP4), cast to the output dtype.
    A per-group rhs scale (``rhs_global_per_group``) multiplies each row by its group's value. The
    two scales' product is formed with an unbounded exponent (``dot.common.scaled_product``, as the
    dense dot's): two scales of 2^-80 multiply to 2^-160, below float32, although acc x 2^-160
    may be an ordinary number (issue 34, finding 2)."""
    if not p.has_global_scale:
        return acc.astype(p.out_dtype)
    gr = global_scale_of(rhs)
    if p.rhs_global_per_group:  # ragged_m: rows past the groups are zero whatever they are scaled by
        gr = jnp.concatenate([gr, jnp.ones((1,), jnp.float32)])[row_groups(group_sizes, p.M)][:, None]
    return scaled_product(acc, global_scale_of(lhs), gr, p.out_dtype)


# --------------------------------------------------------------------------- grouped arrays
@jax.tree_util.register_pytree_node_class
class GroupedBlockScaledArray:
    """A block-scaled array whose blocks along ``axis`` restart at the first row of each of
    ``groups`` groups (and once more after the last group), from ``quantize_grouped``.

    ``data`` has the logical shape; ``scale`` has it too except along ``axis``, which holds
    ``grouped_block_count(M, groups, block)`` entries laid out by ``grouped_layout`` (entries no
    group size needs hold the format's scale of an all-zero block). What the scales mean depends on
    the ``group_sizes`` it was quantized with, which the op is handed with it: the same sizes must
    go to ``ragged_dot``. 1-D block formats only (MX, NVFP4, FP8_1x128). ``axis`` is stored
    negative; ``global_scale`` is NVFP4's float32 scalar, else None.

    ``slot_data`` is internal (None unless ``grouped.quantize_tokens_for_wgrad`` made the array):
    the same codes in the padded slot layout, tokens last, (X, S) for 2-D ``data``, as quantize
    produced them before they were gathered into ``data``. The weight-gradient kernel reads that
    layout; handing it over spares two passes over the codes (docs/design.md, "The weight
    gradient's operand passes"). Whatever is not the kernel ignores it (and XLA drops ``data``'s
    gather when nothing reads it). jax's rebuilds keep it; ours from three children (code that
    replaces the codes) drop it.
    """

    def __init__(self, data, scale, global_scale, format, axis: int, groups: int):
        self.data, self.scale, self.global_scale, self.format, self.axis, self.groups = _check_grouped(
            data, scale, global_scale, format, axis, groups, "GroupedBlockScaledArray")
        self.slot_data = None

    def check(self, what: str = "GroupedBlockScaledArray") -> None:
        """Validates the parts again (they may have been replaced since construction)."""
        _check_grouped(self.data, self.scale, self.global_scale, self.format, self.axis, self.groups, what)

    def tree_flatten(self):
        return (self.data, self.scale, self.global_scale, self.slot_data), (self.format, self.axis, self.groups)

    @classmethod
    def tree_unflatten(cls, aux, children):
        # As BlockScaledArray: JAX rebuilds pytrees with placeholder leaves while it transforms.
        q = object.__new__(cls)
        q.data, q.scale, q.global_scale = children[:3]
        q.slot_data = children[3] if len(children) > 3 else None
        q.format, q.axis, q.groups = aux
        return q

    @property
    def shape(self):
        return self.data.shape

    def __repr__(self) -> str:
        return (f"GroupedBlockScaledArray({self.format.name}, shape={tuple(self.data.shape)}, axis={self.axis}, "
                f"groups={self.groups}, scale.shape={tuple(self.scale.shape)})")


export.register_array_serialization(GroupedBlockScaledArray, "jax_gpuext.GroupedBlockScaledArray", formats.FORMATS)


def check_grouped_format(fmt, what: str) -> formats.BlockFormat:
    """A format whose blocks can restart per group: one block axis, not per-tensor."""
    if isinstance(fmt, str):  # a name, as quantize takes it
        fmt = formats.format_named(fmt, what, "format")
    if not isinstance(fmt, formats.BlockFormat):
        raise TypeError(f"{what}: format must be a jax_gpuext.BlockFormat (one of {sorted(formats.FORMATS)}), "
                        f"got {fmt!r}")
    if len(fmt.block) != 1:
        kind = "one scale for the whole tensor" if fmt.per_tensor else "128x128 tiles over two axes"
        raise ValueError(f"{what}: {fmt.name} has {kind}; blocks restarting per group along a ragged axis need a "
                         "format with one block axis (MXFP8_E4M3/E5M2, MXFP4, NVFP4, FP8_1x128)")
    return fmt


def _check_grouped(data, scale, global_scale, fmt, axis, groups, what: str):
    fmt = check_grouped_format(fmt, what)
    for part, x in (("data", data), ("scale", scale)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(f"{what}: {part} must be an array, got {type(x).__name__}")
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 0:
        raise TypeError(f"{what}: groups must be a non-negative int (the number of groups), got {groups!r}")
    shape = tuple(data.shape)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -len(shape) <= axis < len(shape):
        raise ValueError(f"{what}: axis {axis!r} is out of range for data of shape {shape}")
    ax = int(axis) % len(shape)
    for part, x, want in (("data", data, fmt.elem_dtype), ("scale", scale, fmt.scale_dtype)):
        if jnp.dtype(x.dtype) != want:
            raise TypeError(f"{what}: {part} of a {fmt.name} array must have dtype {want.name}, got "
                            f"{jnp.dtype(x.dtype).name} (shape {tuple(x.shape)})")
    want_scale = shape[:ax] + (grouped_block_count(shape[ax], int(groups), fmt.block[0]),) + shape[ax + 1:]
    if tuple(scale.shape) != want_scale:
        raise ValueError(f"{what}: scale of {fmt.name} data {list(shape)} grouped along axis {ax} in {groups} groups "
                         f"must have shape {list(want_scale)} (grouped_block_count along the axis), got "
                         f"{list(scale.shape)}")
    if not fmt.has_global_scale:
        if global_scale is not None:
            raise ValueError(f"{what}: {fmt.name} has no global scale; global_scale must be None")
    else:
        if global_scale is None or not hasattr(global_scale, "shape") or jnp.dtype(global_scale.dtype) != jnp.float32 \
                or tuple(global_scale.shape) != ():
            raise TypeError(f"{what}: {fmt.name} needs a float32 scalar global_scale, got {global_scale!r}")
    return data, scale, global_scale, fmt, ax - len(shape), int(groups)


# --------------------------------------------------------------------------- validation
# The public functions whose checks a grouped entry point reaches through another: their errors
# are re-raised under the entry point's name (issue 34, finding 7).
_INNER = ("quantize", "dequantize", "ragged_dot", "block_scaled_dot", "scaled_dot_general")


def _renamed_message(message: str, what: str) -> str:
    if message.startswith(f"{what}:") or message.startswith(f"{what} "):
        return message
    for inner in _INNER:
        if message.startswith(f"{inner}: "):
            return f"{what}: {message[len(inner) + 2:]}"
    return f"{what}: {message}"


@contextlib.contextmanager
def named_errors(what: str):
    """Re-raises a TypeError / ValueError / UnsupportedError from the block as the same class with
    a message naming ``what``, the public function the caller called: a bad argument handed on to
    ``quantize`` or ``ragged_dot`` (a scale rounding, a backend that cannot run here) is reported
    as the caller's, not as a function the caller never called. The original is chained."""
    try:
        yield
    except UnsupportedError as e:
        if str(e).startswith(f"{what}:"):
            raise
        new = UnsupportedError(_renamed_message(str(e), what), gate=e.gate)
        new.reason = e.reason
        raise new from e
    except (TypeError, ValueError) as e:
        message = str(e)
        if message.startswith(f"{what}:") or type(e) not in (TypeError, ValueError):
            raise
        raise type(e)(_renamed_message(message, what)) from e


def _group_sizes_from_list(values, what: str) -> np.ndarray:
    """A Python list / tuple of group sizes: ints only, each in int32's range, read exactly (an
    array of floats, bools or strings is refused by dtype; the same values in a list are too, never
    truncated or parsed)."""
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{what}: group_sizes[{i}] must be an int (group_sizes is a list of ints or a (G,) int32 "
                            f"array), got {type(v).__name__} {v!r}")
        if not -(1 << 31) <= int(v) < (1 << 31):
            raise ValueError(f"{what}: group_sizes[{i}] = {int(v)} does not fit in int32 (group_sizes is int32, as "
                             "lax.ragged_dot takes it)")
    return np.asarray([int(v) for v in values], np.int32).reshape(len(values))


def check_group_sizes(group_sizes, what: str):
    """``group_sizes`` as every backend takes it: a (G,) int32 array (a tracer is fine: its values
    are never read on the host). Any integer dtype ``lax.ragged_dot`` takes is taken too (int64
    from NumPy or x64 code, ``jnp.bincount``'s, int16, unsigned) and converted on the device,
    saturating at int32's largest value (sizes are clamped to [0, M] later, so a size past int32
    means the same as one of 2^31 - 1: the group runs to the last row). A NumPy array is first
    taken as jax takes it (``jnp.asarray``), so an eager call accepts what the same call under
    ``jit`` does. Booleans and floats are refused."""
    if isinstance(group_sizes, (np.ndarray, np.generic)):
        group_sizes = jnp.asarray(group_sizes)
    if not (hasattr(group_sizes, "shape") and hasattr(group_sizes, "dtype")):
        if isinstance(group_sizes, (list, tuple)):
            group_sizes = _group_sizes_from_list(group_sizes, what)
        else:
            raise TypeError(f"{what}: group_sizes must be a (G,) int32 array, got {type(group_sizes).__name__}")
    dtype = jnp.dtype(group_sizes.dtype)
    if dtype == jnp.bool_ or not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{what}: group_sizes must have an integer dtype (int32, as lax.ragged_dot takes it; other "
                        f"integer types are converted), got {dtype.name} with shape {tuple(group_sizes.shape)}")
    if len(group_sizes.shape) != 1:
        raise ValueError(f"{what}: group_sizes must have shape (G,), got {tuple(group_sizes.shape)}")
    if dtype != jnp.int32:
        top = np.iinfo(np.int32).max
        if jnp.iinfo(dtype).max > top:  # wider than int32 (a negative size already means 0)
            group_sizes = jnp.clip(group_sizes, 0, top)
        group_sizes = group_sizes.astype(jnp.int32)
    return group_sizes


def _dims(dn, what: str):
    if not isinstance(dn, lax.RaggedDotDimensionNumbers):
        raise TypeError(f"{what}: ragged_dot_dimension_numbers must be a jax.lax.RaggedDotDimensionNumbers "
                        f"(e.g. jax_gpuext.RAGGED_M / RAGGED_M_NK / RAGGED_CONTRACT) or None, got {dn!r}")
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    ragged, group = tuple(dn.lhs_ragged_dimensions), tuple(dn.rhs_group_dimensions)
    if lb or rb:
        raise ValueError(f"{what}: batch dimensions are not supported ({dn}); vmap over a leading axis instead")
    if len(lc) != 1 or len(rc) != 1 or len(ragged) != 1:
        raise ValueError(f"{what}: exactly one contracting dimension per operand and one lhs ragged dimension are "
                         f"supported, got {dn}")
    return int(lc[0]), int(rc[0]), int(ragged[0]), group


def _operand(x, name: str, what: str, grouped: bool, mode: str):
    want = GroupedBlockScaledArray if grouped else formats.BlockScaledArray
    if not isinstance(x, want):
        if isinstance(x, (formats.BlockScaledArray, GroupedBlockScaledArray)):
            why = ("its blocks run along the contracted ragged axis and must restart at each group: quantize it "
                   "with jax_gpuext.quantize_grouped" if grouped else
                   "its ragged axis is not blocked in this mode: quantize it with jax_gpuext.quantize")
            raise TypeError(f"{what}: in {mode}, {name} must be a {want.__name__}, got a {type(x).__name__} ({why})")
        raise TypeError(f"{what}: {name} must be a {want.__name__}, got {type(x).__name__}; use scaled_ragged_dot "
                        "for high-precision inputs")
    x.check(f"{what}: {name}")
    fmt = x.format
    if fmt.per_tensor:
        raise ValueError(f"{what}: {name} is {fmt.name} (one scale per tensor), which ragged_dot does not take; use "
                         "FP8_1x128 (activations) / FP8_128x128 (weights)")
    return fmt


def _scalar_global(q, name: str, what: str):
    if q.global_scale is not None and tuple(q.global_scale.shape) != ():
        raise ValueError(f"{what}: {name}'s global scale must be a scalar here, got shape "
                         f"{list(q.global_scale.shape)}")


def check_same_family(lf, rf, what: str) -> None:
    """The grouped dots' operands are one family (the dense dot also takes FP8_TENSOR)."""
    if format_info(lf).family != format_info(rf).family:
        raise ValueError(f"{what}: formats {lf.name} (lhs) and {rf.name} (rhs) cannot be mixed; both operands must be "
                         "MX (MXFP8 E4M3/E5M2, MXFP4: any pairing), both NVFP4, or both FP8 blockwise "
                         "(FP8_1x128 x FP8_128x128 / FP8_1x128)")


def problem(lhs, rhs, group_sizes, dimension_numbers, out_dtype, what: str = "ragged_dot") -> RaggedProblem:
    """The validated problem, or a TypeError / ValueError naming the argument, shapes and dtypes."""
    group_sizes = check_group_sizes(group_sizes, what)
    g = int(group_sizes.shape[0])
    if dimension_numbers is None:  # contract the quantized axes, as block_scaled_dot does
        both_grouped = isinstance(lhs, GroupedBlockScaledArray) and isinstance(rhs, GroupedBlockScaledArray)
        if both_grouped:
            dimension_numbers = lax.RaggedDotDimensionNumbers(
                (([lhs.axis % 2], [rhs.axis % 2]), ([], [])), [lhs.axis % 2], [])
        else:
            rc = 2 if (isinstance(rhs, formats.BlockScaledArray) and rhs.data.ndim == 3 and len(rhs.format.block) == 1
                       and rhs.axis % 3 == 2) else 1
            dimension_numbers = lax.RaggedDotDimensionNumbers((([1], [rc]), ([], [])), [0], [0])
    lc, rc, ragged, group = _dims(dimension_numbers, what)
    mode = "ragged_contract" if ragged == lc else "ragged_m"
    grouped = mode == "ragged_contract"
    lf = _operand(lhs, "lhs", what, grouped, mode)
    rf = _operand(rhs, "rhs", what, grouped, mode)
    ls, rs = tuple(lhs.data.shape), tuple(rhs.data.shape)
    li, ri = format_info(lf), format_info(rf)
    check_same_family(lf, rf, what)
    _scalar_global(lhs, "lhs", what)
    if mode == "ragged_m":
        if len(ls) != 2 or ragged != 0 or lc != 1:
            raise ValueError(f"{what}: ragged_m takes lhs (M, K) with rows grouped (ragged dim 0, contracting dim 1), "
                             f"got lhs shape {ls} with {dimension_numbers}")
        if group != (0,) or len(rs) != 3 or rc not in (1, 2):
            raise ValueError(f"{what}: ragged_m takes rhs (G, K, N) or (G, N, K) (group dim 0, contracting dim 1 or "
                             f"2), got rhs shape {rs} with {dimension_numbers}")
        if len(lf.block) == 2:
            raise ValueError(f"{what}: lhs is {lf.name}, whose 128-row tiles would straddle the groups of its rows; "
                             "quantize activations with FP8_1x128 (FP8_128x128 is the weights' format)")
        if lhs.axis % 2 != 1:
            raise ValueError(f"{what}: lhs {ls} is quantized along axis {lhs.axis % 2}; in ragged_m it must be "
                             "quantized along K (axis 1), the contracted axis")
        if len(rf.block) == 1 and rhs.axis % 3 != rc:
            raise ValueError(f"{what}: rhs {rs} is quantized along axis {rhs.axis % 3} but contracted along axis {rc}; "
                             "quantize it along the contracting axis (or give dimension numbers that contract it)")
        m, k = ls
        n = rs[3 - rc]
        if rs[rc] != k:
            raise ValueError(f"{what}: contracting sizes differ: lhs {ls} axis 1 vs rhs {rs} axis {rc}")
        if rs[0] != g:
            raise ValueError(f"{what}: rhs has {rs[0]} groups (shape {rs}) but group_sizes has {g} (shape "
                             f"{tuple(group_sizes.shape)})")
        per_group = False
        if rhs.global_scale is not None and tuple(rhs.global_scale.shape) != ():
            if tuple(rhs.global_scale.shape) != (g,):
                raise ValueError(f"{what}: rhs's global scale must be a scalar or one value per group ({g},), got "
                                 f"shape {list(rhs.global_scale.shape)}")
            per_group = True
    else:
        if group:
            raise ValueError(f"{what}: ragged_contract (the ragged dimension is contracted) takes an rhs without a "
                             f"group dimension, got rhs_group_dimensions {group}")
        if len(ls) != 2 or len(rs) != 2:
            raise ValueError(f"{what}: ragged_contract takes lhs (K, M) or (M, K) and rhs (M, N) or (N, M), got "
                             f"lhs {ls} and rhs {rs}")
        for name, q, c in (("lhs", lhs, lc), ("rhs", rhs, rc)):
            if q.axis % 2 != c:
                raise ValueError(f"{what}: {name} {tuple(q.data.shape)} is grouped along axis {q.axis % 2} but "
                                 f"contracted along axis {c}; the grouped axis must be the contracted (ragged) one")
            if q.groups != g:
                raise ValueError(f"{what}: {name} was quantized in {q.groups} groups but group_sizes has {g} (shape "
                                 f"{tuple(group_sizes.shape)})")
        m = ls[lc]
        if rs[rc] != m:
            raise ValueError(f"{what}: contracting (ragged) sizes differ: lhs {ls} axis {lc} vs rhs {rs} axis {rc}")
        k, n = ls[1 - lc], rs[1 - rc]
        _scalar_global(rhs, "rhs", what)
        per_group = False
    has_gs = lhs.global_scale is not None or rhs.global_scale is not None
    return RaggedProblem(mode, m, k, n, g, lf, rf, out_dtype, rc, lc, has_gs, per_group)
