"""Memory of the grouped quantizers is linear in the data (issue 34, finding 5).

``quantize_grouped`` of 1,024 values in 1,024 groups added ~700 MB to peak RSS (2,048 / 2,048:
~2.9 GB): the group arithmetic compared every slot of the padded layout with every group end, an
[nblocks * block, G + 1] array. Counting the ends at or below each position is now a histogram
and a running sum. Checked on the jaxpr, which is deterministic and cheap: no value any equation
produces (inside loops and conds too) has more elements than a small multiple of the padded
layout plus the groups.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext.ragged_dot import common
from jax_gpuext.ragged_dot.grouped import dequantize_grouped, quantize_grouped


def _largest(jaxpr) -> tuple[int, str]:
    """(elements, equation) of the largest value any equation of ``jaxpr`` (and its sub-jaxprs) makes."""
    best = (0, "")
    for e in jaxpr.eqns:
        for v in e.outvars:
            shape = getattr(v.aval, "shape", ())
            if math.prod(shape) > best[0]:
                best = (math.prod(shape), f"{e.primitive.name} -> {v.aval}")
        for p in e.params.values():
            for sub in p if isinstance(p, (list, tuple)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    best = max(best, _largest(inner))
    return best


def _bound(m: int, other: int, g: int, fmt) -> int:
    """4 x (the padded layout's elements + the data's + the groups and blocks): what a grouped
    quantization needs, with room for a few temporaries of each."""
    b = fmt.block[0]
    nblocks = common.grouped_block_count(m, g, b)
    return 4 * (nblocks * b * other + m * other + g + nblocks + 1)


CASES = [  # (shape, axis, groups): more groups than blocks, one group per row, the shapes
    ((1024,), 0, 1024),
    ((2048,), 0, 2048),
    ((256, 8), 0, 256),
    ((8, 512), 1, 700),
]


@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.NVFP4, gx.FP8_1x128], ids=lambda f: f.name)
@pytest.mark.parametrize("shape,axis,groups", CASES, ids=lambda c: str(c))
def test_no_intermediate_grows_with_rows_times_groups(shape, axis, groups, fmt):
    x = jnp.zeros(shape, jnp.float32)
    gs = jnp.ones((groups,), jnp.int32)
    m = shape[axis]
    other = math.prod(shape) // m
    bound = _bound(m, other, groups, fmt)
    q_jaxpr = jax.make_jaxpr(lambda v, s: quantize_grouped(v, fmt, s, axis=axis))(x, gs).jaxpr
    size, where = _largest(q_jaxpr)
    assert size <= bound, f"quantize_grouped: {where} ({size} elements > {bound})"
    q = jax.eval_shape(lambda v, s: quantize_grouped(v, fmt, s, axis=axis), x, gs)
    d_jaxpr = jax.make_jaxpr(lambda v, s: dequantize_grouped(v, s))(q, gs).jaxpr
    size, where = _largest(d_jaxpr)
    assert size <= bound, f"dequantize_grouped: {where} ({size} elements > {bound})"


@pytest.mark.parametrize("m,g", [(1024, 1024), (4096, 64), (37, 500)])
def test_group_arithmetic_is_linear_and_exact(m, g):
    """row_groups / row_blocks / slot_rows against a NumPy model (searchsorted), with no value larger
    than a few times the rows, slots and groups; sizes with zeros, negatives and an overflow past m."""
    rng = np.random.default_rng(m + g)
    sizes = rng.integers(-2, max(2, 3 * m // g), g).astype(np.int32)
    sizes[rng.random(g) < 0.2] = 0
    gs = jnp.asarray(sizes)
    ends = np.minimum(np.cumsum(np.maximum(sizes, 0)), m)
    np.testing.assert_array_equal(np.asarray(common.row_groups(gs, m)),
                                  np.searchsorted(ends, np.arange(m), side="right"))
    b = 32
    nblocks = common.grouped_block_count(m, g, b)
    layout = common.grouped_layout(gs, m, b)
    rows, valid = common.slot_rows(layout, nblocks)
    block, pos = common.row_blocks(layout)
    # every row is in exactly one valid slot, the one row_blocks names
    slot = np.asarray(block) * b + np.asarray(pos)
    assert np.asarray(valid)[slot].all() and np.asarray(valid).sum() == m
    np.testing.assert_array_equal(np.asarray(rows)[slot], np.arange(m))
    for fn, args in ((lambda s: common.row_groups(s, m), (gs,)),
                     (lambda s: common.slot_rows(common.grouped_layout(s, m, b), nblocks), (gs,))):
        size, where = _largest(jax.make_jaxpr(fn)(*args).jaxpr)
        assert size <= 4 * (nblocks * b + m + g + 1), where
