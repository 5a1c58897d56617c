"""What ``block_scaled_dot`` and its backends share: the format facts a dot needs
(:class:`FormatInfo`), the validated problem handed to every backend (:class:`DotProblem`, built
and checked by ``_problem``), the reference math (the definition: dequantize, ``lax.dot_general``
in float32, global scales on the accumulator), the canonical form, and the codes and packing the
GPU handlers read.

Canonical form. GPU backends see ``lhs (B, M, K)`` and ``rhs (B, N, K)``, both contiguous in K
("TN", the only FP8 layout cuBLASLt supports), built here by transposing and collapsing the
batch / free dimensions of the ``dot_general`` dimension numbers. The reference backend works on
the original layout.

Imports only ``jax_gpuext.common``, ``jax_gpuext.formats`` and ``dot.scale_range`` (which imports
only ``formats``): the backends import this module, and the op (``dot.block_scaled_dot``) imports
the backends, never the reverse.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext import formats
from jax_gpuext.common import backends
from jax_gpuext.dot import scale_range
from jax_gpuext.formats import reference as _fref
from jax_gpuext.formats.quantize import _broadcast_leading

OP = "block_scaled_dot"
_OUT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


# --------------------------------------------------------------------------- format facts
@dataclasses.dataclass(frozen=True)
class FormatInfo:
    """What this module needs to know of a ``formats.BlockFormat``."""

    name: str
    family: str  # "mx", "nvfp4", "fp8_block", "fp8_tensor": operands of one dot must share a family
    element_dtype: Any
    scale_dtype: Any
    block: int  # block length along the contracting axis (0: FP8_TENSOR, one scale for all)
    two_d: bool  # FP8_128x128: 128x128 blocks over the last two axes
    per_tensor: bool = False  # FP8_TENSOR


def format_info(fmt) -> FormatInfo:
    """Family, dtypes and block of ``fmt`` (a ``formats.BlockFormat`` or its name)."""
    if isinstance(fmt, str):
        fmt = formats.format_named(fmt, "block_scaled_dot")
    if not isinstance(fmt, formats.BlockFormat):
        raise TypeError(f"expected a jax_gpuext.BlockFormat (one of {sorted(formats.FORMATS)}), got {fmt!r}")
    if fmt.per_tensor:
        return FormatInfo(fmt.name, "fp8_tensor", jnp.dtype(fmt.elem_dtype), jnp.dtype(fmt.scale_dtype), 0,
                          False, per_tensor=True)
    family = "mx" if fmt.is_mx else ("nvfp4" if fmt.has_global_scale else "fp8_block")
    return FormatInfo(fmt.name, family, jnp.dtype(fmt.elem_dtype), jnp.dtype(fmt.scale_dtype), fmt.block[-1],
                      len(fmt.block) == 2)


def mx_fp4_operand(p) -> bool:
    """Does an MX-family dot have an MXFP4 (E2M1) operand? The library handlers tie E2M1 to NVFP4."""
    e2m1 = jnp.dtype(jnp.float4_e2m1fn)
    return p.lhs_format.family == "mx" and e2m1 in (p.lhs_format.element_dtype, p.rhs_format.element_dtype)


def _is_bsa(x) -> bool:
    return isinstance(x, formats.BlockScaledArray)


def _norm_axis(axis: int, ndim: int) -> int:
    return axis % ndim


# --------------------------------------------------------------------------- dimension numbers
@dataclasses.dataclass(frozen=True)
class DotProblem:
    """A validated block-scaled dot, handed to backends' ``supports``."""

    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    lhs_format: FormatInfo
    rhs_format: FormatInfo
    # Contracting dims, paired position by position, in the order they flatten into the one
    # canonical K axis: the quantized (blocked) pair last, the others in ascending lhs order
    # (``_flatten_order``; docs/block_scaled_dot.md, "Several contracting dimensions").
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    out_dtype: Any
    has_global_scale: bool
    # An NVFP4 global scale has leading batch dims (quantized under vmap, used outside it): one
    # value per batch entry, which a backend taking one alpha per call cannot apply.
    batched_global_scale: bool = False

    @property
    def lhs_free(self) -> tuple[int, ...]:
        return _free(len(self.lhs_shape), self.lhs_contract, self.lhs_batch)

    @property
    def rhs_free(self) -> tuple[int, ...]:
        return _free(len(self.rhs_shape), self.rhs_contract, self.rhs_batch)

    @property
    def bmnk(self) -> tuple[int, int, int, int]:
        """The canonical problem's sizes; K is what ``to_canonical`` gives (padded rows
        included, see ``canonical_k``)."""
        b = math.prod(self.lhs_shape[d] for d in self.lhs_batch)
        m = math.prod(self.lhs_shape[d] for d in self.lhs_free)
        n = math.prod(self.rhs_shape[d] for d in self.rhs_free)
        return b, m, n, canonical_k(self.lhs_shape, self.lhs_contract, self.lhs_format)

    def describe(self) -> str:
        b, m, n, k = self.bmnk
        return (f"{self.lhs_format.name} x {self.rhs_format.name}, B={b} M={m} N={n} K={k}, "
                f"out {jnp.dtype(self.out_dtype).name}")


def _dims(dims, name: str, ndim: int, what: str, dimension_numbers) -> tuple[int, ...]:
    """One list of dimension numbers: ints (a bare int counts as one), each in [0, ndim), as
    lax.dot_general requires (no negative indices, no floats)."""
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        dims = (dims,)
    if isinstance(dims, np.ndarray):
        dims = dims.tolist()
    if not isinstance(dims, (tuple, list)) or any(isinstance(d, bool) or not isinstance(d, (int, np.integer))
                                                  for d in dims):
        raise TypeError(f"{what}: {name} dimensions must be a tuple of ints, got {dims!r} in dimension_numbers "
                        f"{dimension_numbers!r}")
    if any(not 0 <= d < ndim for d in dims):
        raise ValueError(f"{what}: {name} dimensions {tuple(dims)} must be in [0, {ndim}) (the {name.split()[0]} "
                         f"operand has rank {ndim}; negative indices are refused as by lax.dot_general)")
    return tuple(int(d) for d in dims)


def _parse_dimension_numbers(dimension_numbers, lhs_ndim, rhs_ndim, what):
    """``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))`` checked as lax.dot_general
    checks it: TypeError for a wrong structure or non-int entries, ValueError for bad values."""
    def pair(x):
        return isinstance(x, (tuple, list)) and len(x) == 2

    if not pair(dimension_numbers) or not all(pair(x) for x in dimension_numbers):
        raise TypeError(f"{what}: dimension_numbers must be ((lhs_contracting, rhs_contracting), "
                        f"(lhs_batch, rhs_batch)) as for jax.lax.dot_general, got {dimension_numbers!r}")
    (lc, rc), (lb, rb) = dimension_numbers
    lc, lb = (_dims(d, n, lhs_ndim, what, dimension_numbers) for d, n in ((lc, "lhs contracting"), (lb, "lhs batch")))
    rc, rb = (_dims(d, n, rhs_ndim, what, dimension_numbers) for d, n in ((rc, "rhs contracting"), (rb, "rhs batch")))
    if len(set(lc + lb)) != len(lc + lb) or len(set(rc + rb)) != len(rc + rb):
        raise ValueError(f"{what}: a dimension appears twice in dimension_numbers {dimension_numbers!r}")
    if len(lb) != len(rb) or len(lc) != len(rc):
        raise ValueError(f"{what}: lhs and rhs must name as many contracting and batch dimensions, "
                         f"got {dimension_numbers!r}")
    return lc, rc, lb, rb


def result_dtype(lhs_dtype, rhs_dtype, preferred_element_type, supported, what: str):
    """(the dtype ``jax.lax.dot_general`` / ``lax.ragged_dot`` would return for these operand dtypes,
    the dtype we compute it in). A drop-in returns lax's dtype: float16 x bfloat16 gives bfloat16
    there (not ``promote_types``' float32), and float64 (x64 inputs, or asked for) gives float64,
    which we compute in float32 (the accumulation our kernels and XLA paths have) and cast exactly.
    ``preferred_element_type`` is checked against ``supported`` plus float64 first (a clear error
    for an integer or unknown type)."""
    if preferred_element_type is not None:
        out = formats.float_dtype(preferred_element_type, tuple(supported) + (jnp.dtype(jnp.float64),), what,
                                  "preferred_element_type")
        out = jax.dtypes.canonicalize_dtype(out)  # float64 without x64 is float32, as in lax
    else:  # lax's own rule for the operand dtypes, asked of lax (it has changed between versions)
        out = jax.eval_shape(lambda a, b: lax.dot_general(a, b, (((0,), (0,)), ((), ()))),
                             jax.ShapeDtypeStruct((1,), lhs_dtype), jax.ShapeDtypeStruct((1,), rhs_dtype)).dtype
        out = formats.float_dtype(out, tuple(supported) + (jnp.dtype(jnp.float64),), what, "result dtype")
    return jnp.dtype(out), (jnp.dtype(jnp.float32) if out == jnp.float64 else jnp.dtype(out))


def _check_out_dtype(dtype, what):
    return formats.float_dtype(dtype, _OUT_DTYPES, what, "preferred_element_type")


def _free(ndim: int, contract, batch) -> tuple[int, ...]:
    return tuple(d for d in range(ndim) if d not in contract and d not in batch)


def canonical_k(shape, contract: tuple[int, ...], info: FormatInfo) -> int:
    """Length of the canonical K axis: the contracting dims flattened, the last one innermost.

    With several contracting dims, each row of the innermost (blocked) dim is zero-padded to a
    whole number of blocks, so that no block of the canonical K straddles two rows: the blocks
    are then exactly the operand's own, and the padding zeros add nothing to the dot.
    """
    inner = shape[contract[-1]] if contract else 1
    outer = math.prod(shape[d] for d in contract[:-1])
    if outer > 1 and info.block and inner % info.block:
        inner = -(-inner // info.block) * info.block
    return outer * inner


def _blocked_axis(name: str, f: FormatInfo, shape, axis: int, contract, batch, what: str) -> int | None:
    """The contracting dim of operand ``name`` along which its blocks run (None for FP8_TENSOR,
    whose one scale covers every axis), after checking that the dimension numbers keep its
    blocks whole."""
    if f.per_tensor:
        return None
    if not f.two_d:
        if axis not in contract:
            raise ValueError(f"{what}: {name} is quantized along axis {axis} but dimension_numbers contract "
                             f"axes {tuple(contract)} (shape {shape}); quantize along a contracting axis")
        return axis
    last2 = (len(shape) - 2, len(shape) - 1)
    contracted = [d for d in last2 if d in contract]
    other = [d for d in last2 if d not in contract]
    if len(contracted) != 1 or other[0] in batch:
        raise ValueError(f"{what}: {name} is {f.name} (128x128 blocks over its last two axes {last2}), so "
                         f"dimension_numbers must contract exactly one of them and leave the other free; they "
                         f"contract {tuple(contract)} with batch {tuple(batch)} (shape {shape})")
    free_lead = [d for d in range(len(shape) - 2) if d not in batch and d not in contract]
    if free_lead:
        raise ValueError(f"{what}: {name} is {f.name}: every axis before its last two must be a batch or "
                         f"contracting dimension (a free one would cut its 128x128 blocks); axes {free_lead} of "
                         f"shape {shape} are free")
    return contracted[0]


def _flatten_order(lc: tuple[int, ...], blocked: int | None) -> list[int]:
    """Positions of the contracting pairs in the order they flatten into K: ascending lhs dim
    (jax.nn's canonicalisation), with the blocked pair moved last (innermost)."""
    order = sorted(range(len(lc)), key=lambda i: lc[i])
    if blocked is not None:
        order.remove(lc.index(blocked))
        order.append(lc.index(blocked))
    return order


def _problem(lhs, rhs, dimension_numbers, out_dtype) -> DotProblem:
    what = "block_scaled_dot"
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if not _is_bsa(x):
            raise TypeError(f"{what}: {name} must be a jax_gpuext.BlockScaledArray (from jax_gpuext.quantize), "
                            f"got {type(x).__name__}; use scaled_dot_general for high-precision inputs")
        x.check(f"{what}: {name}")
    lf, rf = format_info(lhs.format), format_info(rhs.format)
    ls, rs = tuple(lhs.data.shape), tuple(rhs.data.shape)
    la, ra = _norm_axis(lhs.axis, len(ls)), _norm_axis(rhs.axis, len(rs))
    if dimension_numbers is None:
        dimension_numbers = (((la,), (ra,)), ((), ()))
    lc, rc, lb, rb = _parse_dimension_numbers(dimension_numbers, len(ls), len(rs), what)
    if lf.family != rf.family:
        raise ValueError(f"{what}: formats {lf.name} (lhs) and {rf.name} (rhs) cannot be mixed; both operands "
                         "must be MX (MXFP8 E4M3/E5M2, MXFP4: any pairing), both NVFP4, both FP8 blockwise (1x128/128x128), or both "
                         "FP8_TENSOR")
    for a, b in zip(lc, rc):
        if ls[a] != rs[b]:
            raise ValueError(f"{what}: contracting sizes differ: lhs {ls} axis {a} vs rhs {rs} axis {b}")
    if [ls[d] for d in lb] != [rs[d] for d in rb]:
        raise ValueError(f"{what}: batch sizes differ: lhs {ls} dims {lb} vs rhs {rs} dims {rb}")
    lq = _blocked_axis("lhs", lf, ls, la, lc, lb, what)
    rq = _blocked_axis("rhs", rf, rs, ra, rc, rb, what)
    if lq is not None and rc[lc.index(lq)] != rq:
        raise ValueError(f"{what}: lhs's blocks run along its axis {lq}, which dimension_numbers contract with rhs "
                         f"axis {rc[lc.index(lq)]}, but rhs's blocks run along its axis {rq}: the two blocked axes "
                         f"must be contracted with each other (lhs {ls}, rhs {rs}, dimension_numbers "
                         f"{dimension_numbers!r})")
    order = _flatten_order(lc, lq)
    lc, rc = tuple(lc[i] for i in order), tuple(rc[i] for i in order)
    batched_global = False
    for name, q, f, batch in (("lhs", lhs, lf, lb), ("rhs", rhs, rf, rb)):
        batched_global |= "global_scale" in _check_leading_dims(q, f, batch, name, what)
    has_gs = lhs.global_scale is not None or rhs.global_scale is not None
    return DotProblem(ls, rs, lf, rf, lc, rc, lb, rb, out_dtype, has_gs, batched_global)


def _per_tensor_values(q, f: FormatInfo):
    """(what, value) of each per-tensor value of ``q``: FP8_TENSOR's scale, NVFP4's global scale."""
    found = [("scale", q.scale)] if f.per_tensor else []
    if q.global_scale is not None:
        found.append(("global_scale", jnp.asarray(q.global_scale)))
    return found


def _check_leading_dims(q, f: FormatInfo, batch: tuple[int, ...], name: str, what: str) -> set[str]:
    """A per-tensor value with leading dims (quantized under vmap, used outside it) gives one
    value per entry of those axes; they must be the operand's first batch dimensions, in order,
    so each value scales exactly the batch entries it was computed from. Returns the names of
    the values that have leading dims."""
    batched = set()
    for label, v in _per_tensor_values(q, f):
        r = v.ndim
        if r == 0:
            continue
        if tuple(v.shape) != tuple(q.data.shape[:r]):
            raise TypeError(f"{what}: {name}'s {label} has shape {list(v.shape)}; a per-tensor value is a scalar, "
                            f"or has the leading dims of the data {list(q.data.shape[:r])} (quantized under vmap)")
        if tuple(batch[:r]) != tuple(range(r)):
            raise ValueError(f"{what}: {name}'s {label} has one value per entry of axes {list(range(r))} "
                             f"(shape {list(v.shape)}, quantized under vmap), so those axes must be its first "
                             f"batch dimensions, in order; dimension_numbers give batch dims {list(batch)}")
        batched.add(label)
    return batched


# --------------------------------------------------------------------------- reference
def _expanded_scale(q, f: FormatInfo, dtype=jnp.float32) -> jax.Array:
    """The block scales broadcast to the data's shape, in ``dtype`` (float32: exact for E8M0 /
    E4M3 / fp32 scales; bfloat16 only where the caller knows them to be bfloat16 values)."""
    s = q.scale.astype(dtype)
    if f.per_tensor:
        return _broadcast_leading(s, q.data.ndim)  # a scalar, or one per leading batch entry
    shape = q.data.shape
    axes = (len(shape) - 2, len(shape) - 1) if f.two_d else (_norm_axis(q.axis, len(shape)),)
    for ax in axes:
        s = jnp.repeat(s, f.block, axis=ax)[(slice(None),) * ax + (slice(0, shape[ax]),)]
    return s


def _global(q, ndim: int = 0) -> jax.Array:
    """The global scale (1 without one), shaped to broadcast against rank ``ndim`` from the
    left: its leading dims are the first batch dims, which lead dot_general's output too."""
    if q.global_scale is None:
        return jnp.float32(1)
    return _broadcast_leading(jnp.asarray(q.global_scale, jnp.float32), ndim)


def _reference_acc(lhs, rhs, p: DotProblem) -> jax.Array:
    """The float32 accumulator: each operand dequantized to float32, one dot at HIGHEST precision."""
    dl = lhs.data.astype(jnp.float32) * _expanded_scale(lhs, p.lhs_format)
    dr = rhs.data.astype(jnp.float32) * _expanded_scale(rhs, p.rhs_format)
    dn = ((p.lhs_contract, p.rhs_contract), (p.lhs_batch, p.rhs_batch))
    return lax.dot_general(dl, dr, dn, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _reference(lhs, rhs, p: DotProblem) -> jax.Array:
    family = p.lhs_format.family
    if family == "mx":
        # E8M0 scales reach 2^-127 (a float32 subnormal, flushed by XLA:CPU) and 2^127 (448 x 2^127
        # overflows): the one float32 dot where it is exact, else scale_range's exponent classes
        # (docs/design.md, "The smallest and largest MX scales").
        return scale_range.dot(functools.partial(_reference_acc, p=p), lhs, rhs, p.bmnk[3], p.out_dtype)
    if family == "fp8_block" and backends.current_platform() == "cpu":
        # float32 block scales down to 2^-126 (quantize's clamp; hand-built: any): element x scale
        # below 2^-126 is flushed by XLA:CPU; the same exponent classes where the scales leave
        # the window. XLA:GPU keeps float32 subnormals (docs/design.md, same section).
        return scale_range.dot(functools.partial(_reference_acc, p=p), lhs, rhs, p.bmnk[3], p.out_dtype,
                               expand=expand_per_block)
    if family == "fp8_tensor":
        return _per_tensor_reference(lhs, rhs, p)
    # Global scales multiply the fp32 accumulator once, as the math above states (not each element).
    return apply_global_scales(_reference_acc(lhs, rhs, p), lhs, rhs, p.out_dtype)


def expand_per_block(q, values) -> jax.Array:
    """Per-block ``values`` (shaped like ``q.scale``) broadcast to ``q.data``'s shape by ``q``'s own
    blocks (1-D or FP8_128x128's 2-D): ``scale_range``'s ``expand`` for the dense dot."""
    return _expanded_scale(scale_range.replaced(q, q.data, values), format_info(q.format))


def _per_tensor_reference(lhs, rhs, p: DotProblem) -> jax.Array:
    """FP8_TENSOR: one scale per operand (or per leading batch entry) factors out of the sum, so
    the float32 dot of the elements (E4M3 / E5M2 products are normal float32 numbers: nothing
    to flush) times s_l * s_r formed with an unbounded exponent (``scaled_product``): element x
    scale below 2^-126, flushed by XLA:CPU, and s_l * s_r below float32's range (issue 34) are
    both out of the way, and no operand is dequantized."""
    dn = ((p.lhs_contract, p.rhs_contract), (p.lhs_batch, p.rhs_batch))
    acc = lax.dot_general(lhs.data.astype(jnp.float32), rhs.data.astype(jnp.float32), dn,
                          precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return scaled_product(acc, *[_broadcast_leading(q.scale.astype(jnp.float32), acc.ndim) for q in (lhs, rhs)],
                          p.out_dtype)


def apply_global_scales(acc, lhs, rhs, out_dtype) -> jax.Array:
    """``acc * (gs_l * gs_r)`` cast to ``out_dtype`` (NVFP4; without global scales the cast alone),
    by ``scaled_product``: two float32 scales of 2^-80 multiply to 2^-160, below float32's range,
    although acc x 2^-160 may be an ordinary number (issue 34: a representable result is not lost
    to an intermediate scale factor)."""
    if lhs.global_scale is None and rhs.global_scale is None:
        return acc.astype(out_dtype)
    return scaled_product(acc, _global(lhs, acc.ndim), _global(rhs, acc.ndim), out_dtype)


def scaled_product(acc, gl, gr, out_dtype) -> jax.Array:
    """``(acc * (gl * gr)).astype(out_dtype)`` for float32 ``acc`` and scale factors ``gl``, ``gr``
    (broadcasting against it), with the products formed with an unbounded exponent: the same
    roundings as the float32 expression (gl * gr to 24 bits, the product to 24 bits, then the
    output type) wherever that stays in float32's normal range, on bit patterns
    (``formats.reference``: no float operation XLA:CPU could flush), and a result that is
    representable although a factor or an intermediate product is not (2^-80 x 2^-80) comes out.
    A NaN / Inf anywhere takes the float32 expression's result. Differentiable as the float32
    expression is (the bit patterns have no derivative). Shared by the dense and grouped dots
    (NVFP4's global scales, FP8_TENSOR's per-tensor scales)."""
    acc, gl, gr = (jnp.asarray(v, jnp.float32) for v in (acc, gl, gr))
    return _scaled_product(acc, gl, gr, jnp.dtype(out_dtype))


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _scaled_product(acc, gl, gr, out_dtype):
    plain = (acc * (gl * gr)).astype(out_dtype)
    parts = [_fref.decode(lax.bitcast_convert_type(v, jnp.uint32), _fref.F32) for v in (acc, gl, gr)]
    (sa, ka, ma), (sl, kl, ml), (sr, kr, mr) = parts
    kg, mg = _fref.multiply(kl, ml, kr, mr)
    ky, my = _fref.multiply(ka, ma, kg, mg)
    zero = (ma == 0) | (ml == 0) | (mr == 0)
    code = _fref.round_to(sa ^ sl ^ sr, ky, jnp.where(zero, 0, my), scale_range.OUT_FORMATS[out_dtype])
    if out_dtype == jnp.float32:
        exact = lax.bitcast_convert_type(code, jnp.float32)
    else:
        exact = lax.bitcast_convert_type(code.astype(jnp.uint16), out_dtype)
    finite = jnp.isfinite(acc) & jnp.isfinite(gl) & jnp.isfinite(gr)
    return jnp.where(finite, exact, plain)


@_scaled_product.defjvp
def _scaled_product_jvp(out_dtype, primals, tangents):
    acc, gl, gr = primals
    da, dl, dr = tangents
    y = _scaled_product(acc, gl, gr, out_dtype)
    dy = da * (gl * gr) + acc * (dl * gr) + acc * (gl * dr)
    return y, jnp.broadcast_to(dy, y.shape).astype(out_dtype)


# --------------------------------------------------------------------------- canonical form
def to_canonical(q, contract, batch: tuple[int, ...]):
    """(data, scale) of ``q`` transposed/collapsed to ``(B, X, K)`` and ``(B, X, K/blk)``.

    ``contract``: the contracting dims in flattening order (``DotProblem.lhs_contract``; one int
    is one dim), the blocked one last. Batch and free dims collapse into B and X, the contracting
    dims into K, each row of the blocked dim zero-padded to whole blocks where there are several
    (``canonical_k``). For FP8_128x128 the validation guaranteed that the last two axes are
    (free, blocked contracting) in some order and every other axis is batch or contracting, so
    the 2-D blocks survive. FP8_TENSOR's scale becomes ``(B, 1, 1)``: one value for every batch,
    or each batch entry's own where the scale has leading (batch) dims.
    """
    contract = (int(contract),) if isinstance(contract, (int, np.integer)) else tuple(contract)
    nd = q.data.ndim
    free = _free(nd, contract, batch)
    perm = tuple(batch) + free + contract
    data = jnp.transpose(q.data, perm)
    b = math.prod(q.data.shape[d] for d in batch)
    x = math.prod(q.data.shape[d] for d in free)
    k = canonical_k(q.data.shape, contract, format_info(q.format))
    outer = math.prod(q.data.shape[d] for d in contract[:-1])
    if contract and k != outer * q.data.shape[contract[-1]]:  # rows of the blocked dim padded to whole blocks
        data = jnp.pad(data, [(0, 0)] * (nd - 1) + [(0, k // outer - q.data.shape[contract[-1]])])
    data = data.reshape(b, x, k)
    if q.format.per_tensor:
        return data, per_batch(q.scale, q.data.shape, batch).reshape(b, 1, 1)
    scale = jnp.transpose(q.scale, perm)
    return data, scale.reshape(b, math.prod(q.scale.shape[d] for d in free),
                               math.prod(q.scale.shape[d] for d in contract))


def from_canonical(out: jax.Array, p: DotProblem) -> jax.Array:
    """(B, M, N) back to dot_general's output layout (batch, lhs free, rhs free)."""
    shape = ([p.lhs_shape[d] for d in p.lhs_batch] + [p.lhs_shape[d] for d in p.lhs_free]
             + [p.rhs_shape[d] for d in p.rhs_free])
    return out.reshape(shape)


def per_batch(value, data_shape, batch: tuple[int, ...]) -> jax.Array:
    """A per-tensor value (scalar, or with leading batch dims) as float32 ``(B,)`` over the
    canonical batch (the batch dims in dimension-number order, collapsed)."""
    value = jnp.asarray(value, jnp.float32)
    batch_shape = tuple(data_shape[d] for d in batch)
    lead = value.reshape(value.shape + (1,) * (len(batch_shape) - value.ndim))
    return jnp.broadcast_to(lead, batch_shape).reshape(-1)


def global_alpha(lhs, rhs, p: DotProblem) -> jax.Array:
    """gs_l * gs_r as a float32 vector of length 1 (one scalar applies to every batch). Backends
    that take it refuse problems whose global scales are per batch (``batched_global_scale``)."""
    return (_global(lhs) * _global(rhs)).reshape(1)


# Codes the GPU handlers read as attributes (cuBLASLt: csrc/dot/cublaslt_block_scaled.h
# ElementTypeOfCode / OutTypeOfCode; cuDNN: csrc/dot/cudnn_block_scaled.h CudnnElement / CudnnOut).
OUT_CODES = {jnp.dtype(jnp.bfloat16): 0, jnp.dtype(jnp.float16): 1, jnp.dtype(jnp.float32): 2}


def element_code(info: FormatInfo) -> int:
    """0 E4M3, 1 E5M2, 2 E2M1 (packed two per byte by ``pack_fp4``)."""
    return {jnp.dtype(jnp.float8_e4m3fn): 0, jnp.dtype(jnp.float8_e5m2): 1}.get(info.element_dtype, 2)


def fold_scale_signs(data, scale):
    """Canonical NVFP4 (B, X, K) E2M1 data and (B, X, ceil(K/16)) E4M3 scales -> the same
    products with non-negative scales: a negative scale's sign moves into its block's elements.

    For backends whose hardware reads the block scales as unsigned E4M3 (UE4M3: Blackwell
    block-scaled MMA through cuDNN / cuBLASLt). quantize never makes a negative scale; a
    hand-built array may, and data x scale is the definition (docs/design.md, issue 15). Exact:
    only sign bits change; XLA fuses it into ``pack_fp4``.
    """
    sbits = jax.lax.bitcast_convert_type(scale, jnp.uint8)
    block = formats.NVFP4.block[0]
    flip = jnp.repeat(sbits >> 7, block, axis=-1)[..., : data.shape[-1]] << 3  # E2M1 sign: bit 3
    codes = jax.lax.bitcast_convert_type(data, jnp.uint4).astype(jnp.uint8) ^ flip
    data = jax.lax.bitcast_convert_type(codes.astype(jnp.uint4), data.dtype)
    return data, jax.lax.bitcast_convert_type(sbits & jnp.uint8(0x7F), scale.dtype)


def pack_fp4(data):
    """(B, X, K) float4_e2m1fn -> (B, X, K/2) uint8, element 2i in the low nibble.

    The GPU backends get FP4 packed by us rather than relying on how XLA lays out F4E2M1FN in
    device buffers, which is unconfirmed (REFERENCE section 1).
    """
    codes = jax.lax.bitcast_convert_type(data, jnp.uint4).astype(jnp.uint8)
    lo, hi = codes[..., 0::2], codes[..., 1::2]
    return lo | (hi << 4)
