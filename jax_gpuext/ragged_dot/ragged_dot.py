"""The op ``ragged_dot``: a grouped (ragged) block-scaled dot on quantized operands, and its
backend table.

Math (the ``reference`` backend is its definition; docs/block_scaled_dot.md, "Grouped dot"):

    ragged_m:        out[m, n]    = gs_l * gs_r(g) * sum_k  L[m, k] * R[g(m), k, n]   (0 where m is in no group)
    ragged_contract: out[g, k, n] = gs_l * gs_r    * sum_{m in group g} L[k, m] * R[m, n]

with ``L``, ``R`` the operands' elements times their block scales (blocks along a ragged axis
restart at each group: ``GroupedBlockScaledArray``), float32 accumulation, cast once.

Backends, in preference order (``jax_gpuext.explain`` shows which ran and why):

- ``cublaslt`` (``cublaslt.py``): cuBLASLt's grouped FP8 blockwise GEMM on Hopper, group sizes
  read on the device.
- ``hopper`` (``hopper.py``): our sm_90a grouped FP8 blockwise kernel, group sizes read on the
  device.
- ``xla``: 128-row tiles, each against its own group's dequantized operands, as batched XLA
  dots (``xla.py``): work bounded by the useful rows plus one tile per group.
- ``reference``: dequantize to float32 + one float32 dot per group (``reference.py``).

A backend module registers itself through ``register_impl`` (its ``register(register_impl)``);
it imports ``common`` (never this module) and is called as
``impl(lhs, rhs, group_sizes, problem, selection) -> out``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jax_gpuext import formats
from jax_gpuext.common import backends, eager, export
from jax_gpuext.ragged_dot import common, cublaslt, hopper, reference, xla

OP = common.OP
_IMPLS: dict[str, Any] = {}


def register_impl(name: str, backend: backends.Backend, impl) -> None:
    """Registers a backend of ``ragged_dot`` (in preference order) and the function that runs it."""
    backends.register(OP, backend)
    _IMPLS[name] = impl


def _register_backends() -> None:
    cublaslt.register(register_impl)  # cuBLASLt's grouped FP8 GEMM (Hopper, cuBLAS with grouped GEMM)
    hopper.register(register_impl)  # our sm_90a grouped FP8 blockwise kernel
    xla.register(register_impl)  # tiled XLA dots: auto's choice on CPU, and on a GPU until ours are verified
    reference.register(register_impl)


_register_backends()


def _run(statics, sel, lhs, rhs, group_sizes):
    p, chosen = statics
    return _IMPLS[chosen](lhs, rhs, group_sizes, p, sel)


# Eager calls compile once per problem (common/eager.py; issue 34, finding 4: the reference's
# fori_loop / lax.map and the xla backend's loops compiled again on every eager call).
_cached = eager.Cached(_run)


def ragged_dot(lhs, rhs, group_sizes, ragged_dot_dimension_numbers=None, *, preferred_element_type=jnp.float32,
               backend: str = "auto") -> jax.Array:
    """Grouped dot of two block-scaled operands, with ``jax.lax.ragged_dot_general``'s meaning.

    ``group_sizes``: (G,) int32 on the device; rows from ``sum(group_sizes)`` on are in no group.
    ``ragged_dot_dimension_numbers`` (a ``jax.lax.RaggedDotDimensionNumbers``) chooses the mode:

    - the ragged dimension is lhs's row axis (``common.RAGGED_M``, ``lax.ragged_dot``'s): lhs
      (M, K) ``BlockScaledArray`` quantized along K, rhs (G, K, N) or (G, N, K) (contracting dim
      1 or 2) quantized along K per group (or FP8_128x128 tiles per group) -> (M, N);
    - the ragged dimension is contracted (``common.RAGGED_CONTRACT``): lhs (K, M) or (M, K), rhs
      (M, N) or (N, M), both ``GroupedBlockScaledArray`` along M (``quantize_grouped``) -> (G, K, N).

    ``None`` contracts the quantized axes: ``ragged_contract`` when both operands are grouped
    arrays, else ``ragged_m`` (rhs contracting its quantized axis, axis 1 for FP8_128x128).
    Formats: MX (MXFP8 E4M3/E5M2, MXFP4) in any pairing, NVFP4 x NVFP4, FP8_1x128 x FP8_128x128
    or FP8_1x128. Accumulation is float32; the result is cast to ``preferred_element_type``
    (float32 by default, as ``block_scaled_dot`` and ``jax.nn.scaled_matmul``; bfloat16 or float16).
    """
    what = "ragged_dot"
    out_dtype = formats.float_dtype(preferred_element_type, common.OUT_DTYPES, what, "preferred_element_type")
    backends.check_requested(OP, backend, what)
    p = common.problem(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, out_dtype, what)
    sel = backends.select(OP, backend, problem=p)
    sizes = common.check_group_sizes(group_sizes, what)  # int32 (other integer types converted)

    def on(sel):
        out = _cached((p, sel.chosen), sel, lhs, rhs, sizes)
        return export.mark_choice(out, sel, p)

    # traced: each platform's own trace (its choice; the implementations read the platform too),
    # lowering for a platform keeps its own (common/export.py)
    return export.per_platform(sel, p, on, (lhs, rhs, sizes), specializes=True)
