"""Backend ``reference`` of ``ragged_dot``: the definition every other backend is tested against.

Each operand is dequantized to float32 (data x its block scale: exact for E8M0 / E4M3 scales; for
FP8 blockwise's float32 scales the product is rounded once, as in the dense reference), then one
dense float32 dot (``lax.dot``, HIGHEST precision, float32 accumulation) per group:

- ``ragged_m``: out[m, :] = lhs[m, :] @ rhs[g(m)], g(m) the group of row m; rows in no group are 0.
- ``ragged_contract``: out[g] = sum over the rows m of group g of lhs[:, m] (x) rhs[m, :], the
  other rows of both operands replaced by zeros (``where``: exact zeros, which change no float32
  sum, and never 0 x a non-finite value of another group).

A group's result depends only on its own rows and its own weights: a NaN / Inf anywhere else
(another group's rows or weights, an empty group's weights, rows past the last group) does not
reach it.

Global scales (NVFP4) multiply the float32 accumulator, per group for a per-group rhs scale, and
the result is rounded to the output dtype once (``common.apply_global_scales``). It costs G dense
dots (no data-dependent shapes): a definition, not a fast path.

MX operands whose E8M0 scales (and, on CPU, FP8 blockwise operands whose float32 scales) leave
``dot.scale_range.in_window`` (a dequantized element or a
product outside float32's normal range, or a sum that could overflow) run these dots once per pair
of scale-exponent classes and combine them by exponent arithmetic, as the dense reference does
(docs/design.md, "The smallest and largest MX scales"); inside it, exactly the dots above.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from jax_gpuext.common import backends
from jax_gpuext.dot import scale_range
from jax_gpuext.ragged_dot import common

HIGHEST = lax.Precision.HIGHEST


def _accumulate(lhs, rhs, group_sizes, p: common.RaggedProblem):
    """The float32 accumulator, global scales not applied."""
    groups = common.row_groups(group_sizes, p.M)
    if p.mode == "ragged_m":
        a = common.dequantized(lhs)  # (M, K)
        w = common.dequantized(rhs)
        w = w if p.rhs_contract == 1 else jnp.swapaxes(w, 1, 2)  # (G, K, N)

        def group(g, acc):
            y = lax.dot(a, w[g], precision=HIGHEST, preferred_element_type=jnp.float32)
            return jnp.where((groups == g)[:, None], y, acc)

        # The carry starts from group 0's rows rather than from constant zeros: under shard_map a
        # loop carry must be as device-varying as what the body returns.
        acc = group(0, jnp.zeros((), jnp.float32)) if p.G else jnp.zeros((p.M, p.N), jnp.float32)
        acc = lax.fori_loop(1, p.G, group, acc) if p.G > 1 else acc
    else:
        a = common.dequantized(lhs, jnp.float32, group_sizes)
        a = a if p.lhs_contract == 1 else a.T  # (K, M)
        b = common.dequantized(rhs, jnp.float32, group_sizes)
        b = b if p.rhs_contract == 0 else b.T  # (M, N)

        def group(g):
            # Both operands masked with `where`: a zero of one operand times a NaN / Inf row of the
            # other (another group's, or a row past the last group) would be NaN.
            rows = groups == g
            zero = jnp.zeros((), jnp.float32)
            return lax.dot(jnp.where(rows[None, :], a, zero), jnp.where(rows[:, None], b, zero), precision=HIGHEST,
                           preferred_element_type=jnp.float32)

        acc = lax.map(group, jnp.arange(p.G, dtype=jnp.int32)) if p.G else jnp.zeros((0, p.K, p.N), jnp.float32)
    return acc


def impl(lhs, rhs, group_sizes, p: common.RaggedProblem, sel=None):
    if p.family == "mx" or (p.family == "fp8_block" and backends.current_platform() == "cpu"):
        # E8M0 scales reach 2^-127 (a float32 subnormal, flushed by XLA:CPU) and 2^127 (448 x 2^127
        # overflows); float32 block scales reach 2^-126 (element x scale flushed on CPU; XLA:GPU
        # keeps float32 subnormals): the float32 dots where scale_range's window holds, else its
        # exponent classes, each a grouped dot (docs/design.md, "The smallest and largest MX scales").
        return scale_range.dot(lambda a, b: _accumulate(a, b, group_sizes, p), lhs, rhs,
                               p.K if p.mode == "ragged_m" else p.M, p.out_dtype,
                               expand=functools.partial(class_expand, group_sizes=group_sizes))
    return common.apply_global_scales(_accumulate(lhs, rhs, group_sizes, p), lhs, rhs, group_sizes, p)


def class_expand(q, values, group_sizes):
    """Per-block ``values`` (shaped like ``q.scale``) broadcast to ``q.data``'s shape by ``q``'s own
        layout (a grouped array's blocks restart at each group): ``scale_range``'s ``expand`` for the
    grouped dot's operands (the ``xla`` backend's too)."""
    return common.expanded_scale(scale_range.replaced(q, q.data, values), group_sizes)


BACKEND = backends.Backend(
    "reference", ("cpu", "cuda"), (), "dequantize to float32, then one float32 dot per group (the semantic definition)",
    takes="every format pair of one family (MX: MXFP8 E4M3/E5M2 and MXFP4 in any pairing; NVFP4; FP8_1x128 x "
          "FP8_128x128 / FP8_1x128), both modes, any shape")


def register(register_impl) -> None:
    register_impl("reference", BACKEND, impl)
