"""Backend ``xla`` of ``ragged_dot``: dequantize, then XLA's own ``lax.ragged_dot_general``.

What ``auto`` runs on a GPU until one of our grouped kernels is verified (``verified.py``); on
CPU ``auto`` passes it over for the reference, measured faster there (``_prefers``). No custom
call: on GPU jax lowers it to XLA's ``ragged-dot`` instruction (``chlo.ragged_dot``), on CPU to a
masked dense dot.

- MX and NVFP4: each operand dequantized to bfloat16 and the ragged dot accumulates in float32,
  exact for the same reason and under the same run-time check as the dense dot's ``xla`` backend
  (``dot_xla``: element x E8M0 scale is a bfloat16 value above a scale bound; NVFP4 always). Where
  the check fails (``lax.cond`` on the smallest scale), float32 operands at HIGHEST precision.
- FP8 blockwise: float32 operands (its float32 block scales make element x scale inexact in
  bfloat16) at HIGHEST precision.

Group sizes go in as ``common.effective_group_sizes`` (clamped: the op's definition of negative
sizes and of sizes past M). The result equals the reference up to the order of the float32
accumulation.

vmap. ``lax.ragged_dot_general`` batches only when lhs, rhs and group sizes all carry the batch
dimension (jax 0.10: "ragged_dot vmap over any dim but 0 - NYI" otherwise), so the call is a
``custom_vmap`` that broadcasts the unbatched ones first.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_gpuext.common import backends
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot import xla as dot_xla
from jax_gpuext.dot.common import format_info
from jax_gpuext.ragged_dot import common


def _lax_ragged(a, b, sizes, dn, precision):
    """``lax.ragged_dot_general`` (float32 accumulation) that batches whatever vmap batches: under
    vmap the batch is folded into one bigger ragged dot (``_folded``) rather than left to jax's
    batching rule, which needs all three operands batched and fails under nested vmaps on CPU
    (jax 0.10's "vmap over any dim but 0 - NYI" / in_axes errors)."""
    @jax.custom_batching.custom_vmap
    def call(a, b, sizes):
        return lax.ragged_dot_general(a, b, sizes, dn, precision=precision, preferred_element_type=jnp.float32)

    @call.def_vmap
    def _rule(axis_size, in_batched, a, b, sizes):
        a, b, sizes = (x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)
                       for x, batched in zip((a, b, sizes), in_batched))
        return _folded(a, b, sizes, dn, precision), True

    return call(a, b, sizes)


def _folded(a, b, sizes, dn, precision):
    """B ragged dots as one: batch element i's rows follow element i-1's, its G groups plus one more
    for its rows past them (against zero weights in ragged_m; dropped from the output in
    ragged_contract), so every element's groups stay its own. Calls ``_lax_ragged`` again, so an
    enclosing vmap folds its batch the same way."""
    (lc, rc), _ = dn.dot_dimension_numbers
    contract = tuple(dn.lhs_ragged_dimensions) == tuple(lc)
    nb, g = sizes.shape
    m = a.shape[1 + (lc[0] if contract else 0)]
    sizes = jnp.concatenate([sizes, m - jnp.sum(sizes, axis=1, keepdims=True)], axis=1).reshape(-1)
    if not contract:  # a (B, M, K), b (B, G, ., .)
        b = jnp.concatenate([b, jnp.zeros((nb, 1) + b.shape[2:], b.dtype)], axis=1)
        out = _lax_ragged(a.reshape((nb * m,) + a.shape[2:]), b.reshape((nb * (g + 1),) + b.shape[2:]), sizes, dn,
                          precision)
        return out.reshape((nb, m) + out.shape[1:])

    def fold(x, axis):  # (B, ...) with the ragged axis at 1 + axis -> the B runs of it laid end to end
        x = jnp.moveaxis(x, 0, axis)
        return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + 2:])

    out = _lax_ragged(fold(a, lc[0]), fold(b, rc[0]), sizes, dn, precision)  # (B * (G + 1), K, N)
    return out.reshape((nb, g + 1) + out.shape[1:])[:, :g]


def _dimension_numbers(p: common.RaggedProblem) -> lax.RaggedDotDimensionNumbers:
    if p.mode == "ragged_m":
        return lax.RaggedDotDimensionNumbers((([1], [p.rhs_contract]), ([], [])), [0], [0])
    return lax.RaggedDotDimensionNumbers((([p.lhs_contract], [p.rhs_contract]), ([], [])), [p.lhs_contract], [])


def _accumulate(lhs, rhs, group_sizes, p: common.RaggedProblem, dtype, precision):
    grouped = group_sizes if p.mode == "ragged_contract" else None
    a = common.dequantized(lhs, dtype, grouped)
    b = common.dequantized(rhs, dtype, grouped)
    return _lax_ragged(a, b, common.effective_group_sizes(group_sizes, p.M), _dimension_numbers(p), precision)


def impl(lhs, rhs, group_sizes, p: common.RaggedProblem, sel=None):
    f32 = functools.partial(_accumulate, p=p, dtype=jnp.float32, precision=lax.Precision.HIGHEST)
    bf16 = functools.partial(_accumulate, p=p, dtype=jnp.bfloat16, precision=None)
    if p.family == "fp8_block":
        if sel is not None:
            backends.note(sel, "FP8 blockwise: float32 operands, lax.ragged_dot at HIGHEST precision (float32 block "
                               "scales are not exact in bfloat16)")
        acc = f32(lhs, rhs, group_sizes)
    else:
        infos = [(q, format_info(q.format)) for q in (lhs, rhs)]
        checks = [(q, i) for q, i in infos if not dot_xla.exact_statically(i)]
        if not checks:
            if sel is not None:
                backends.note(sel, "bf16 dequantize + lax.ragged_dot (f32 accumulation): element x scale is exact in "
                                   "bf16 for these formats")
            acc = bf16(lhs, rhs, group_sizes)
        else:
            if sel is not None:
                bound = max(dot_xla.min_exact_scale_exponent(i) for _, i in checks)
                backends.note(sel, f"bf16 dequantize + lax.ragged_dot (f32 accumulation) when every E8M0 scale is >= "
                                   f"2^{bound} (element x scale exact in bf16); else float32 (lax.cond on the scales)")
            ok = functools.reduce(jnp.logical_and, [dot_xla.scales_exact(q, i) for q, i in checks])
            acc = lax.cond(ok, bf16, f32, lhs, rhs, group_sizes)
    return common.apply_global_scales(acc, lhs, rhs, group_sizes, p)


def _prefers(p: common.RaggedProblem) -> GateResult:
    """On CPU ``auto`` takes the reference: measured faster there for every format and group split
    (benchmarks/bench_ragged_dot_cpu.py; docs/design.md "Grouped block-scaled dot (issue 30)").
    jax lowers lax.ragged_dot on CPU to one dot over all groups with the lhs masked per group, G
    times the work like the reference's G dots, plus a (G, M, K) select the reference does not
    have; bf16 operands do not make up for it (XLA:CPU widens them)."""
    if backends.current_platform() != "cpu":
        return GateResult(True, "")
    return GateResult(False, "on CPU the reference is faster (jax's CPU lowering of lax.ragged_dot is a masked dot "
                             "over all groups; benchmarks/bench_ragged_dot_cpu.py); name backend='xla' to run it")


BACKEND = backends.Backend(
    "xla", ("cuda", "cpu"), (),
    "XLA only: operands dequantized (bf16 for MX / NVFP4 where exact, else f32) + lax.ragged_dot_general with f32 "
    "accumulation",
    takes="every format pair of one family, both modes, any shape; auto on CPU: never (the reference, measured "
          "faster there)", prefers=_prefers)


def register(register_impl) -> None:
    register_impl("xla", BACKEND, impl)
