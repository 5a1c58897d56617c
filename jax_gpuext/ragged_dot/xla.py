"""Backend ``xla`` of ``ragged_dot``: a grouped dot in XLA's own ops whose work is bounded by the
useful work (docs/design.md, "A grouped XLA path bounded by the useful work", issue 36).

What ``auto`` runs on a GPU until one of our grouped kernels is verified (``verified.py``), and
on CPU (3-7x faster than the reference there, which computes every group's dot over all rows:
benchmarks/bench_ragged_dot_cpu.py, docs/design.md). No custom call, and no
``lax.ragged_dot``: XLA:GPU without a recent cuDNN expands it into one dense dot over all G
groups (jax's CPU lowering does the same with a mask), G times the work, and lets a non-finite
weight of one expert reach every other expert's rows (0 x Inf).

The row tiles. Each group's rows are cut into tiles of ``TILE`` = 128 rows (its last tile
partial), the tiles of all groups laid end to end: tile t holds rows of one group only. Their
number depends on the sizes, which live on the device, so the shapes use the most any sizes can
need, ``T = tile_count(M, G) <= ceil(M / 128) + G``: the rows computed are at most
``M + 127 G``, the useful rows plus less than one tile per group. Each tile's group, rows and
row mask are computed on the device (``tile_table``: comparisons and prefix sums, no host sync,
the same work every call); tiles past the last used one are marked unused.

- ``ragged_m`` (the forward, ``RAGGED_M``; the dgrad, ``RAGGED_M_NK``): per tile, its 128 rows
  of lhs and its group's weights, gathered quantized (data and block scales) and dequantized as
  they are gathered, one batched ``dot_general`` over the tiles ([C, 128, K] x [C, K, N], float32
  accumulation), and each output row gathered back from its tile. A row's result is its own row
  times its own group's weights, whatever the other rows and experts hold.
- ``ragged_contract`` (the wgrad, out[g] = sum over group g's rows of lhs^T rhs): per tile, its
  128 rows of both operands (rows outside the tile's group replaced by zeros with ``where``,
  never multiplied by zero), one batched dot giving a (K, N) partial per tile, each added to its
  group's output in tile order (a loop, deterministic; unused tiles add nothing).

The tiles run ``C`` at a time (``chunk_size``: the gathered weights or the float32 partials of a
chunk stay under ``CHUNK_BYTES``), in a ``lax.map`` / ``fori_loop`` of static trip count when
T > C: XLA:GPU runs such a loop without reading anything back to the host.

Numerics: NVFP4 operands dequantized to bfloat16 (element x scale is exact there for these
formats, ``dot.xla.exact_statically``); MX operands too where ``dot.scale_range.in_window`` holds
(every element x scale and product a normal number, nothing overflows: checked on the scales by
``lax.cond``), else the same tiles once per pair of scale-exponent classes, combined by exponent
arithmetic (``scale_range.dot``, docs/design.md "The smallest and largest MX scales"); FP8
blockwise in float32 at HIGHEST precision (float32 block scales make element x scale inexact in
bfloat16), on CPU behind the same window (XLA:CPU flushes an element x scale below 2^-126).
Global scales multiply the float32 result (``common.apply_global_scales``). The result equals the
reference up to the order of the float32 accumulation. Group sizes go in as
``common.group_ends`` clamps them (negative sizes 0, groups cut at M). Transformations: vmap and
shard_map batch the gathers, dots and loops with jax's own rules; a symbolic M (jax.export) gets
a symbolic T (``plan``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jax_gpuext.common import backends
from jax_gpuext.dot import scale_range
from jax_gpuext.ragged_dot import common, reference

TILE = 128  # rows per tile: the padding bound (< one tile per group) and the rows each weight read serves
# Bytes of a chunk's gathered weights (ragged_m) or float32 partials (ragged_contract): C = CHUNK_BYTES
# // one tile's, at least 1. Large enough that a chunk's batched dot fills a GPU at DeepSeek-V3's
# shapes (C = 9 at K = 7168, N = 4096 in bf16), small beside its memory.
CHUNK_BYTES = 512 << 20
_F4 = jnp.dtype(jnp.float4_e2m1fn)
_UNROLL = 8  # ragged_contract: a chunk's partials are added to their groups unrolled up to this many, else in a loop


def tile_count(m, g: int):
    """The most row tiles any group sizes need: sum over groups of ceil(size / TILE) with the sizes
    summing to at most m is at most floor((m + G (TILE - 1)) / TILE), and at most m (every used
    tile holds a row). A symbolic m (jax.export) keeps the first bound only."""
    if g <= 0 or (isinstance(m, int) and m <= 0):
        return 0
    t = (m + g * (TILE - 1)) // TILE
    return min(m, t) if isinstance(m, int) else t


def chunk_size(tiles, tile_bytes: int) -> int:
    """Tiles per batched dot: as many as fit ``CHUNK_BYTES``, at least 1, at most all."""
    c = max(1, CHUNK_BYTES // max(tile_bytes, 1))
    return min(tiles, c) if isinstance(tiles, int) else c


class Plan(NamedTuple):
    """The static schedule: ``tiles`` row tiles (T), ``chunk`` (C) at a time: ``full`` chunks, then
    ``rest`` tiles. With a symbolic M, T is rounded up to whole chunks (unused tiles: at most C - 1
    more) so that no test of a symbolic size is needed."""

    tiles: object
    chunk: int
    full: object
    rest: int


def plan(m, g: int, tile_bytes: int) -> Plan:
    tiles = tile_count(m, g)
    c = chunk_size(tiles, tile_bytes)
    if not isinstance(tiles, int):
        full = (tiles + c - 1) // c
        return Plan(full * c, c, full, 0)
    if tiles == 0:
        return Plan(0, 1, 0, 0)
    return Plan(tiles, c, tiles // c, tiles % c)


class TileTable(NamedTuple):
    """Where each of the T tiles lies and where each row's result is (device arrays).

    ``group`` (T,): the tile's group, G for an unused tile; ``weight`` (T,): the group clamped to
    [0, G - 1] (an index that is always valid); ``rows`` (T, TILE): the row of each slot (0 where
    unused); ``valid`` (T, TILE): whether the slot holds a row of the tile's group; ``slot`` (M,):
    the slot (tile * TILE + position) of each row (0 for a row in no group); ``in_group`` (M,)."""

    group: jax.Array
    weight: jax.Array
    rows: jax.Array
    valid: jax.Array
    slot: jax.Array
    in_group: jax.Array


def tile_table(group_sizes, m: int, g: int, tiles: int) -> TileTable:
    ends = common.group_ends(group_sizes, m)  # (G,), clamped: the definition every backend computes
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    count = (ends - starts + (TILE - 1)) // TILE  # tiles of each group
    tile_end = jnp.cumsum(count, dtype=jnp.int32)  # <= tiles (tile_count's bound)
    tile_start = tile_end - count
    t = jnp.arange(tiles, dtype=jnp.int32)
    group = common._count_at_or_below(tile_end, t)  # in [0, G]; G: past the last used tile
    weight = jnp.minimum(group, g - 1)
    rows = (starts[weight] + (t - tile_start[weight]) * TILE)[:, None] + jnp.arange(TILE, dtype=jnp.int32)
    valid = (group < g)[:, None] & (rows < ends[weight][:, None])
    row = jnp.arange(m, dtype=jnp.int32)
    row_group = common._count_at_or_below(ends, row)
    in_group = row_group < g
    rg = jnp.minimum(row_group, g - 1)
    slot = jnp.where(in_group, tile_start[rg] * TILE + row - starts[rg], 0)
    return TileTable(group, weight, jnp.where(valid, rows, 0), valid, slot, in_group)


def _slice(x, start, size: int):
    return lax.dynamic_slice_in_dim(x, start, size, axis=0)


def _take_dequantized(q, index, dtype):
    """Entries ``index`` of ``q`` along axis 0 (lhs rows; rhs experts), dequantized to ``dtype``:
    the quantized data and its block scales are gathered, then multiplied (XLA fuses the
    product into the gather), so a tile reads its own expert's weights in their stored width.
    Axis 0 is never a block axis here (lhs blocks run along K, rhs blocks along K / N within an
    expert). float4 data is widened before the gather: no XLA gather produces 4-bit elements
    (jaxlib 0.7's CPU compiler miscompiles such fusions: ``grouped._take``)."""
    data = q.data.astype(dtype) if jnp.dtype(q.data.dtype) == _F4 else q.data
    aux = q.tree_flatten()[1]
    picked = type(q).tree_unflatten(aux, (jnp.take(data, index, axis=0, mode="clip"),
                                          jnp.take(q.scale.astype(jnp.float32), index, axis=0, mode="clip"), None))
    return common.dequantized(picked, dtype)


def _stacked(chunk, sched: Plan):
    """chunk(start, size) -> (size, ...) for the T tiles, C at a time, stacked to (T, ...): a
    lax.map over the full chunks (a loop only when there are several), the rest after it."""
    c, full, parts = sched.chunk, sched.full, []
    if isinstance(full, int) and full == 1:
        parts.append(chunk(jnp.int32(0), c))
    elif not isinstance(full, int) or full > 1:
        ys = lax.map(lambda start: chunk(start, c), jnp.arange(full, dtype=jnp.int32) * c)
        parts.append(ys.reshape((full * c,) + ys.shape[2:]))
    if sched.rest:
        parts.append(chunk(jnp.int32(sched.tiles - sched.rest), sched.rest))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def _ragged_m(lhs, rhs, table: TileTable, p: common.RaggedProblem, sched: Plan, dtype, precision):
    dims = (((2,), (p.rhs_contract,)), ((0,), (0,)))

    def chunk(start, size):
        a = _take_dequantized(lhs, _slice(table.rows, start, size), dtype)  # (C, TILE, K)
        w = _take_dequantized(rhs, _slice(table.weight, start, size), dtype)  # (C, K, N) or (C, N, K)
        return lax.dot_general(a, w, dims, precision=precision, preferred_element_type=jnp.float32)

    y = _stacked(chunk, sched).reshape(sched.tiles * TILE, p.N)
    # Every output row is gathered from its own slot; rows in no group are zeros, not whatever a
    # slot holds.
    return jnp.where(table.in_group[:, None], jnp.take(y, table.slot, axis=0, mode="clip"), jnp.float32(0))


def _ragged_contract(lhs, rhs, group_sizes, table: TileTable, p: common.RaggedProblem, sched: Plan, dtype,
                     precision):
    a = common.dequantized(lhs, dtype, group_sizes)
    a = a.T if p.lhs_contract == 1 else a  # (M, K)
    b = common.dequantized(rhs, dtype, group_sizes)
    b = b if p.rhs_contract == 0 else b.T  # (M, N)
    zero = jnp.zeros((), dtype)

    def partials(start, size):  # (C, K, N): each tile's rows of its own group only
        valid = _slice(table.valid, start, size)[..., None]
        rows = _slice(table.rows, start, size)
        at = jnp.where(valid, jnp.take(a, rows, axis=0, mode="clip"), zero)  # (C, TILE, K)
        bt = jnp.where(valid, jnp.take(b, rows, axis=0, mode="clip"), zero)  # (C, TILE, N)
        return lax.dot_general(at, bt, (((1,), (1,)), ((0,), (0,))), precision=precision,
                               preferred_element_type=jnp.float32)

    def add_chunk(start, size, out):
        part = partials(start, size)
        group = _slice(table.group, start, size)

        def add(i, out):
            g = group[i]
            gi = jnp.minimum(g, p.G - 1)
            cur = lax.dynamic_index_in_dim(out, gi, axis=0, keepdims=False)
            return lax.dynamic_update_index_in_dim(out, jnp.where(g < p.G, cur + part[i], cur), gi, axis=0)

        if size <= _UNROLL:  # a few in-place adds in a row, no loop
            for i in range(size):
                out = add(i, out)
            return out
        return lax.fori_loop(0, size, add, out)

    # The carry starts as zeros derived from the tile table (0 x an integer: no NaN can arise):
    # under shard_map a loop carry must vary over the devices as the body's result does.
    out = jnp.zeros((p.G, p.K, p.N), jnp.float32) + (table.group[0] * 0).astype(jnp.float32)
    c, full = sched.chunk, sched.full
    if isinstance(full, int) and full == 1:
        out = add_chunk(jnp.int32(0), c, out)
    elif not isinstance(full, int) or full > 1:
        out = lax.fori_loop(0, full, lambda i, out: add_chunk(i * c, c, out), out)
    if sched.rest:
        out = add_chunk(jnp.int32(sched.tiles - sched.rest), sched.rest, out)
    return out


def _accumulate(lhs, rhs, group_sizes, p: common.RaggedProblem, dtype, precision):
    # One tile's big operand: its gathered weights (ragged_m) or its float32 (K, N) partial.
    per_tile = p.K * p.N * (jnp.dtype(dtype).itemsize if p.mode == "ragged_m" else 4)
    sched = plan(p.M, p.G, per_tile)
    if isinstance(sched.tiles, int) and sched.tiles == 0:  # no rows or no groups: nothing is in a group
        return jnp.zeros(p.out_shape, jnp.float32)
    table = tile_table(group_sizes, p.M, p.G, sched.tiles)
    if p.mode == "ragged_m":
        return _ragged_m(lhs, rhs, table, p, sched, dtype, precision)
    return _ragged_contract(lhs, rhs, group_sizes, table, p, sched, dtype, precision)


def impl(lhs, rhs, group_sizes, p: common.RaggedProblem, sel=None):
    f32 = functools.partial(_accumulate, p=p, dtype=jnp.float32, precision=lax.Precision.HIGHEST)
    bf16 = functools.partial(_accumulate, p=p, dtype=jnp.bfloat16, precision=None)
    tiles = tile_count(p.M, p.G)
    if sel is not None:
        backends.note(sel, f"{tiles} row tiles of {TILE} (<= ceil(M/{TILE}) + G), each against its own group's "
                           "operands: batched XLA dots, no lax.ragged_dot")
    if p.family == "fp8_block":
        if sel is not None:
            backends.note(sel, "FP8 blockwise: float32 operands at HIGHEST precision (float32 block scales are not "
                               "exact in bf16)")
        if backends.current_platform() == "cpu":
            # element x scale below 2^-126 is flushed by XLA:CPU (quantize clamps scales at 2^-126):
            # the exponent classes where the scales leave the window, as for MX below
            return scale_range.dot(lambda a, b: f32(a, b, group_sizes), lhs, rhs,
                                   p.K if p.mode == "ragged_m" else p.M, p.out_dtype,
                                   expand=functools.partial(reference.class_expand, group_sizes=group_sizes))
        acc = f32(lhs, rhs, group_sizes)
    elif p.family == "mx":
        # Exact in bf16 is not enough: XLA:CPU flushes subnormals (an element x 2^-127, a product
        # below 2^-126) and 448 x 2^127 overflows. Inside scale_range's window every element x
        # scale and product is a normal number and the bf16 tiles are exact; else the same tiles
        # per pair of scale-exponent classes (a loop; the tiles' work times at most 17), combined
        # by exponent arithmetic (docs/design.md, "The smallest and largest MX scales").
        if sel is not None:
            backends.note(sel, "bf16 dequantize (f32 accumulation) when the E8M0 scales keep every element x scale and "
                               "product a normal float (scale_range.in_window); else the same tiles per class of 64 "
                               "scale exponents, combined by exponent arithmetic (lax.cond on the scales)")
        return scale_range.dot(lambda a, b: bf16(a, b, group_sizes), lhs, rhs, p.K if p.mode == "ragged_m" else p.M,
                               p.out_dtype, expand=functools.partial(reference.class_expand, group_sizes=group_sizes))
    else:
        # NVFP4: E2M1 x E4M3 products are normal bfloat16 values whatever the scales
        # (dot.xla.exact_statically; the smallest, 0.5 x 2^-9, is far from the subnormals)
        if sel is not None:
            backends.note(sel, "bf16 dequantize (f32 accumulation): element x scale is exact in bf16 for these "
                               "formats")
        acc = bf16(lhs, rhs, group_sizes)
    return common.apply_global_scales(acc, lhs, rhs, group_sizes, p)


BACKEND = backends.Backend(
    "xla", ("cuda", "cpu"), (),
    "XLA only: 128-row tiles, each against its own group's operands (dequantized: bf16 for MX / NVFP4, MX with "
    "extreme scales per exponent class; f32 for FP8 blockwise), batched dots with f32 accumulation; work <= the "
    "useful rows + one tile per group",
    takes="every format pair of one family, both modes, any shape")


def register(register_impl) -> None:
    register_impl("xla", BACKEND, impl)
