"""The op ``ragged_dot_masked``: the grouped dot in the masked layout, for decoding under CUDA
graphs (DeepGEMM's ``m_grouped_fp8_gemm_nt_masked``; docs/design.md, "Grouped FP8 kernel at
DeepGEMM's speed").

Every expert has a fixed-capacity slab of rows, and how many of them hold tokens is data on the
device (``valid_counts``, written by the dispatch that filled the slabs): shapes never change, so
one captured graph serves every step.

    out[g, r, n] = gs_l * gs_r(g) * sum_k L[g, r, k] * R[g, k, n]   for r < clamp(valid_counts[g], 0, C)
    out[g, r, n] = 0                                                  for the other rows

with ``L``, ``R`` the operands' elements times their block scales, float32 accumulation, cast
once. Rows past an expert's count are written as zeros whatever they hold (NaN included); an
expert's rows depend on its own rows and weights only.

Why a function of its own rather than a mode of ``ragged_dot``: a masked batch is none of
``lax.ragged_dot_general``'s modes (its ragged-batch mode splits one batch axis into groups; here
every expert owns a slab of its own), so a ``ragged_dot`` mode would need a second meaning for
its dimension numbers; DeepGEMM and vLLM name the masked layout separately too.

Backends, in preference order: ``hopper`` (our sm_90a kernel: the same kernel as ``ragged_dot``'s,
its tile table putting expert g's tiles at row g * C, FP8_1x128 x FP8_128x128), ``xla`` (one
batched XLA dot over the slabs: the layout's own work, G * C rows, never G times more;
dequantized to bf16 where exact for MX / NVFP4 as ``ragged_dot``'s xla backend, else float32 at
HIGHEST precision), ``reference`` (float32 at HIGHEST precision, the definition).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jax_gpuext import formats
from jax_gpuext.common import backends, export
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot import scale_range
from jax_gpuext.dot import xla as dot_xla
from jax_gpuext.dot.common import format_info
from jax_gpuext.ragged_dot import common, hopper

OP = "ragged_dot_masked"
HIGHEST = lax.Precision.HIGHEST
_IMPLS: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class MaskedProblem:
    """One call of ``ragged_dot_masked``: lhs (G, C, K), rhs (G, K, N) (``rhs_contract`` 1) or
    (G, N, K) (2) -> out (G, C, N). ``rhs_global_per_group``: an NVFP4 rhs global scale per expert."""

    G: int
    C: int
    K: int
    N: int
    lhs_format: formats.BlockFormat
    rhs_format: formats.BlockFormat
    out_dtype: Any
    rhs_contract: int = 1
    has_global_scale: bool = False
    rhs_global_per_group: bool = False
    mode = "masked"

    def __post_init__(self):
        object.__setattr__(self, "out_dtype", jnp.dtype(self.out_dtype))

    @property
    def family(self) -> str:
        return format_info(self.lhs_format).family

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return (self.G, self.C, self.N)

    def describe(self) -> str:
        return (f"masked G={self.G} C={self.C} K={self.K} N={self.N} {self.lhs_format.name} x {self.rhs_format.name} "
                f"-> {self.out_dtype.name}")


def problem(lhs, rhs, valid_counts, rhs_contracting_dim, out_dtype, what: str = OP) -> MaskedProblem:
    """The validated problem, or a TypeError / ValueError naming the argument, shapes and dtypes
    (``valid_counts`` as ``common.check_group_sizes`` returns it)."""
    lf = common._operand(lhs, "lhs", what, False, "the masked layout")
    rf = common._operand(rhs, "rhs", what, False, "the masked layout")
    ls, rs = tuple(lhs.data.shape), tuple(rhs.data.shape)
    common.check_same_family(lf, rf, what)
    if len(ls) != 3 or len(rs) != 3:
        raise ValueError(f"{what}: lhs must be (G, C, K) (C rows of capacity per expert) and rhs (G, K, N) or "
                         f"(G, N, K), got lhs {ls} and rhs {rs}")
    if len(lf.block) == 2:
        raise ValueError(f"{what}: lhs is {lf.name}; quantize activations with a 1-D block format along K "
                         "(FP8_1x128 is FP8_128x128's partner)")
    if lhs.axis % 3 != 2:
        raise ValueError(f"{what}: lhs {ls} is quantized along axis {lhs.axis % 3}; it must be quantized along K "
                         "(axis 2), the contracted axis")
    if rhs_contracting_dim is None:  # the rhs's quantized axis; FP8_128x128 tiles: (G, K, N), lax.ragged_dot's order
        rc = 2 if len(rf.block) == 1 and rhs.axis % 3 == 2 else 1
    elif isinstance(rhs_contracting_dim, bool) or rhs_contracting_dim not in (1, 2):
        raise ValueError(f"{what}: rhs_contracting_dim must be 1 (rhs (G, K, N)), 2 (rhs (G, N, K)) or None, got "
                         f"{rhs_contracting_dim!r}")
    else:
        rc = int(rhs_contracting_dim)
    if len(rf.block) == 1 and rhs.axis % 3 != rc:
        raise ValueError(f"{what}: rhs {rs} is quantized along axis {rhs.axis % 3} but contracted along axis {rc}; "
                         "quantize it along the contracting axis")
    g, c, k = ls
    if rs[0] != g or rs[rc] != k:
        raise ValueError(f"{what}: rhs {rs} does not match lhs {ls}: want {g} experts and K = {k} along axis {rc}")
    if tuple(valid_counts.shape) != (g,):
        raise ValueError(f"{what}: valid_counts must have shape ({g},) (one count per expert), got "
                         f"{tuple(valid_counts.shape)}")
    if lhs.global_scale is not None and tuple(lhs.global_scale.shape) != ():
        raise ValueError(f"{what}: lhs's global scale must be a scalar, got shape {list(lhs.global_scale.shape)}")
    per_group = False
    if rhs.global_scale is not None and tuple(rhs.global_scale.shape) != ():
        if tuple(rhs.global_scale.shape) != (g,):
            raise ValueError(f"{what}: rhs's global scale must be a scalar or one value per expert ({g},), got shape "
                             f"{list(rhs.global_scale.shape)}")
        per_group = True
    has_gs = lhs.global_scale is not None or rhs.global_scale is not None
    return MaskedProblem(g, c, k, rs[3 - rc], lf, rf, out_dtype, rc, has_gs, per_group)


# --------------------------------------------------------------------------- XLA paths
def valid_rows(valid_counts, g: int, c: int) -> jax.Array:
    """(G, C) bool: row r of expert g holds a token (r < clamp(valid_counts[g], 0, C))."""
    counts = jnp.clip(jnp.asarray(valid_counts, jnp.int32), 0, c)
    return jnp.arange(c, dtype=jnp.int32)[None, :] < counts[:, None]


def _finish(acc, lhs, rhs, valid_counts, p: MaskedProblem) -> jax.Array:
    """Rows past the counts to exact zeros (``where``: whatever they computed, NaN included), the
    global scales on the float32 accumulator, one cast."""
    acc = jnp.where(valid_rows(valid_counts, p.G, p.C)[:, :, None], acc, jnp.float32(0))
    if p.has_global_scale:
        acc = acc * common.global_scale_of(lhs)
        gr = common.global_scale_of(rhs)
        acc = acc * (gr[:, None, None] if p.rhs_global_per_group else gr)
    return acc.astype(p.out_dtype)


def _batched(lhs, rhs, p: MaskedProblem, dtype, precision, dequantize) -> jax.Array:
    """(G, C, K) x (G, K, N) (or (G, N, K)) -> (G, C, N) float32, one batched dot."""
    a, w = dequantize(lhs, dtype), dequantize(rhs, dtype)
    return lax.dot_general(a, w, (((2,), (p.rhs_contract,)), ((0,), (0,))), precision=precision,
                           preferred_element_type=jnp.float32)


def _mx_exact(lhs, rhs, valid_counts, p: MaskedProblem, fast=None) -> jax.Array:
    """MX: E8M0 scales reach 2^-127 (element x scale a float32 subnormal, flushed by XLA:CPU) and
    2^127 (448 x 2^127 overflows). One batched dot where scale_range's window holds (``fast``, or
    the float32 dot), else its exponent classes, each the float32 batched dot, combined exactly and
    rounded once (the dense and grouped dots' rule; docs/design.md, "The smallest and largest MX
    scales"). The masked operands are plain BlockScaledArrays blocked along K, so the classes use
    the dense expansion. Rows past the counts: exact zeros."""
    f32 = functools.partial(_batched, p=p, dtype=jnp.float32, precision=HIGHEST, dequantize=common.dequantized)
    y = scale_range.dot(f32, lhs, rhs, p.K, p.out_dtype, fast=fast)
    return jnp.where(valid_rows(valid_counts, p.G, p.C)[:, :, None], y, jnp.zeros((), p.out_dtype))


def reference_impl(lhs, rhs, valid_counts, p: MaskedProblem, sel=None):
    if p.family == "mx":
        return _mx_exact(lhs, rhs, valid_counts, p)
    acc = _batched(lhs, rhs, p, jnp.float32, HIGHEST, common.dequantized)
    return _finish(acc, lhs, rhs, valid_counts, p)


def _dequantized_as(q, dtype):
    """Element x block scale computed in ``dtype`` (bf16 only where that is exact: the dense xla
    backend's rule, dot_xla)."""
    return dot_xla._dequantized(q, format_info(q.format), dtype) if dtype == jnp.bfloat16 else \
        common.dequantized(q, dtype)


def xla_impl(lhs, rhs, valid_counts, p: MaskedProblem, sel=None):
    f32 = functools.partial(_batched, p=p, dtype=jnp.float32, precision=HIGHEST, dequantize=common.dequantized)
    bf16 = functools.partial(_batched, p=p, dtype=jnp.bfloat16, precision=None, dequantize=_dequantized_as)
    if p.family == "fp8_block":
        if sel is not None:
            backends.note(sel, "FP8 blockwise: float32 operands at HIGHEST precision (float32 block scales are not "
                               "exact in bf16)")
        acc = f32(lhs, rhs)
    elif p.family == "mx":
        if sel is not None:
            backends.note(sel, "bf16 dequantize + one batched dot (f32 accumulation) when the E8M0 scales keep every "
                               "element x scale and product a normal float (scale_range.in_window); else the float32 "
                               "dot per class of scale exponents, combined by exponent arithmetic")
        return _mx_exact(lhs, rhs, valid_counts, p, fast=bf16)
    else:
        checks = [(q, i) for q in (lhs, rhs) for i in (format_info(q.format),) if not dot_xla.exact_statically(i)]
        if not checks:
            acc = bf16(lhs, rhs)
        else:
            ok = functools.reduce(jnp.logical_and, [dot_xla.scales_exact(q, i) for q, i in checks])
            acc = lax.cond(ok, bf16, f32, lhs, rhs)
    return _finish(acc, lhs, rhs, valid_counts, p)


def _xla_prefers(p: MaskedProblem) -> GateResult:
    """On CPU ``auto`` takes the reference (the same batched dot in float32; the bf16 path is not
    measured faster there), as ``ragged_dot`` does."""
    if backends.current_platform() != "cpu":
        return GateResult(True, "")
    return GateResult(False, "on CPU auto takes the reference; name backend='xla' to run it")


XLA_BACKEND = backends.Backend(
    "xla", ("cuda", "cpu"), (),
    "XLA only: one batched dot over the experts' slabs (G x C rows: the layout's own work), bf16 for MX / NVFP4 "
    "(MX with extreme scales: per exponent class, exact), f32 for FP8 blockwise; rows past the counts zeroed",
    takes="every format pair of one family; rhs (G, K, N) or (G, N, K); any shape; auto on CPU: never (the "
          "reference)", prefers=_xla_prefers)
REFERENCE_BACKEND = backends.Backend(
    "reference", ("cpu", "cuda"), (), "dequantize to float32, one float32 batched dot (the semantic definition)",
    takes="every format pair of one family; rhs (G, K, N) or (G, N, K); any shape")


def register_impl(name: str, backend: backends.Backend, impl) -> None:
    backends.register(OP, backend)
    _IMPLS[name] = impl


hopper.register_masked(register_impl)  # our sm_90a kernel in its masked mode
register_impl("xla", XLA_BACKEND, xla_impl)
register_impl("reference", REFERENCE_BACKEND, reference_impl)


def ragged_dot_masked(lhs, rhs, valid_counts, rhs_contracting_dim=None, *, preferred_element_type=jnp.float32,
                      backend: str = "auto") -> jax.Array:
    """Grouped dot in the masked layout (decode): expert g multiplies the first
    ``valid_counts[g]`` rows of its slab by its weights; the other rows of the result are 0.

    ``lhs``: (G, C, K) ``BlockScaledArray`` quantized along K (C rows of capacity per expert);
    ``rhs``: (G, K, N) or (G, N, K) ``BlockScaledArray`` quantized along K per expert (or
    FP8_128x128 tiles); ``valid_counts``: (G,) int32 on the device (clamped to [0, C]; never read
    by the host). ``rhs_contracting_dim``: 1 for (G, K, N), 2 for (G, N, K); None contracts the
    rhs's quantized axis (axis 1 for FP8_128x128). Formats as ``ragged_dot``'s ragged_m. Result
    (G, C, N) in ``preferred_element_type`` (float32 by default, bfloat16 or float16), float32
    accumulation.
    """
    what = OP
    out_dtype = formats.float_dtype(preferred_element_type, common.OUT_DTYPES, what, "preferred_element_type")
    backends.check_requested(OP, backend, what)
    valid_counts = common.check_group_sizes(valid_counts, what)
    p = problem(lhs, rhs, valid_counts, rhs_contracting_dim, out_dtype, what)
    sel = backends.select(OP, backend, problem=p)
    counts = jnp.asarray(valid_counts)

    def on(sel):
        out = _IMPLS[sel.chosen](lhs, rhs, counts, p, sel)
        return export.mark_choice(out, sel, p)

    # traced: each platform's own trace (its choice; the implementations read the platform too),
    # lowering for a platform keeps its own (common/export.py)
    return export.per_platform(sel, p, on, (lhs, rhs, counts), specializes=True)
