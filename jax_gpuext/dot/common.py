"""Block-scaled dot: ``block_scaled_dot`` on quantized operands and ``scaled_dot_general``,
a differentiable drop-in for ``jax.lax.dot_general`` that quantizes inside.

Math (the ``reference`` backend is its definition; every other backend is tested against it):

    out[..., m, n] = cast(gs_l * gs_r * sum_k lhs[m, k] * s_l[m, k // b] * rhs[n, k] * s_r[n, k // b])

accumulated in float32, with the 2-D block index (m // 128, k // 128) for FP8_128x128 operands.

Backends of op ``block_scaled_dot``, in preference order (``jax_gpuext.explain`` shows which ran):

- ``cudnn``: Blackwell MXFP8 / NVFP4 through a cuDNN graph (``dot_cudnn.py``).
- ``cublaslt``: Hopper FP8 1x128 x 128x128 (and 1x128 x 1x128), per-tensor FP8 (FP8_TENSOR) on
  any FP8 GPU, and Blackwell MXFP8 / NVFP4 (``dot_cublaslt.py``).
- ``hopper_mx``: our own sm_90a kernel, MXFP8 / MXFP4 (any pairing) and NVFP4 on Hopper's FP8 tensor cores
  (``hopper_mx.py``, ``csrc/hopper_mx/``).
- ``xla``: XLA only, no custom call (``dot_xla.py``): MX / NVFP4 dequantized to bf16 + an XLA dot
  accumulating in f32, FP8_TENSOR through XLA's FP8 dot. What ``auto`` runs on a GPU where none of
  the above is verified (``verified.py``); on CPU it is passed over for the exact reference.
- ``reference``: dequantize + ``lax.dot_general`` in float32; every platform.

Canonical form. GPU backends see ``lhs (B, M, K)`` and ``rhs (B, N, K)``, both contiguous in K
("TN", the only FP8 layout cuBLASLt supports), built here by transposing and collapsing the
batch / free dimensions of the ``dot_general`` dimension numbers. The reference backend works on
the original layout.
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

from jax_gpuext import backends, formats
from jax_gpuext.gates import GateResult

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
    if isinstance(fmt, str) and fmt in formats.FORMATS:
        fmt = formats.FORMATS[fmt]
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
    lhs_contract: int
    rhs_contract: int
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    out_dtype: Any
    has_global_scale: bool
    # An NVFP4 global scale has leading batch dims (quantized under vmap, used outside it): one
    # value per batch entry, which a backend taking one alpha per call cannot apply.
    batched_global_scale: bool = False

    @property
    def lhs_free(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.lhs_shape)) if d != self.lhs_contract and d not in self.lhs_batch)

    @property
    def rhs_free(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.rhs_shape)) if d != self.rhs_contract and d not in self.rhs_batch)

    @property
    def bmnk(self) -> tuple[int, int, int, int]:
        b = math.prod(self.lhs_shape[d] for d in self.lhs_batch)
        m = math.prod(self.lhs_shape[d] for d in self.lhs_free)
        n = math.prod(self.rhs_shape[d] for d in self.rhs_free)
        return b, m, n, self.lhs_shape[self.lhs_contract]

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


def _check_out_dtype(dtype, what):
    return formats.float_dtype(dtype, _OUT_DTYPES, what, "preferred_element_type")


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
    if len(lc) != 1:
        raise ValueError(f"{what}: exactly one contracting dimension per operand is supported (the quantized "
                         f"axis), got {dimension_numbers!r} for lhs {ls}, rhs {rs}")
    if lf.family != rf.family:
        raise ValueError(f"{what}: formats {lf.name} (lhs) and {rf.name} (rhs) cannot be mixed; both operands "
                         "must be MX (MXFP8 E4M3/E5M2, MXFP4: any pairing), both NVFP4, both FP8 blockwise (1x128/128x128), or both "
                         "FP8_TENSOR")
    for name, f, shape, c, batch, axis in (("lhs", lf, ls, lc[0], lb, la), ("rhs", rf, rs, rc[0], rb, ra)):
        if f.two_d:
            if c not in (len(shape) - 1, len(shape) - 2):
                raise ValueError(f"{what}: {name} is {f.name} (128x128 blocks over its last two axes), so it must "
                                 f"contract one of them, not axis {c} of shape {shape}")
            if len(shape) - 2 != len(batch):
                raise ValueError(f"{what}: {name} is {f.name}: every axis before the last two must be a batch "
                                 f"dimension; shape {shape} has batch dims {batch}")
        elif c != axis and not f.per_tensor:  # one FP8_TENSOR scale covers every axis
            raise ValueError(f"{what}: {name} is quantized along axis {axis} but dimension_numbers contract "
                             f"axis {c} (shape {shape}); quantize along the contracting axis")
    if ls[lc[0]] != rs[rc[0]]:
        raise ValueError(f"{what}: contracting sizes differ: lhs {ls} axis {lc[0]} vs rhs {rs} axis {rc[0]}")
    if [ls[d] for d in lb] != [rs[d] for d in rb]:
        raise ValueError(f"{what}: batch sizes differ: lhs {ls} dims {lb} vs rhs {rs} dims {rb}")
    batched_global = False
    for name, q, f, batch in (("lhs", lhs, lf, lb), ("rhs", rhs, rf, rb)):
        batched_global |= "global_scale" in _check_leading_dims(q, f, batch, name, what)
    has_gs = lhs.global_scale is not None or rhs.global_scale is not None
    return DotProblem(ls, rs, lf, rf, lc[0], rc[0], lb, rb, out_dtype, has_gs, batched_global)


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
def _expanded_scale(q, f: FormatInfo) -> jax.Array:
    """The block scales broadcast to the data's shape, in float32 (exact: E8M0/E4M3/fp32 -> fp32)."""
    s = q.scale.astype(jnp.float32)
    if f.per_tensor:
        return formats._broadcast_leading(s, q.data.ndim)  # a scalar, or one per leading batch entry
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
    return formats._broadcast_leading(jnp.asarray(q.global_scale, jnp.float32), ndim)


def _reference(lhs, rhs, p: DotProblem) -> jax.Array:
    dl = lhs.data.astype(jnp.float32) * _expanded_scale(lhs, p.lhs_format)
    dr = rhs.data.astype(jnp.float32) * _expanded_scale(rhs, p.rhs_format)
    dn = (((p.lhs_contract,), (p.rhs_contract,)), (p.lhs_batch, p.rhs_batch))
    acc = lax.dot_general(dl, dr, dn, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    # Global scales multiply the fp32 accumulator once, as the math above states (not each element).
    return (acc * (_global(lhs, acc.ndim) * _global(rhs, acc.ndim))).astype(p.out_dtype)


# --------------------------------------------------------------------------- canonical form
def to_canonical(q, contract: int, batch: tuple[int, ...]):
    """(data, scale) of ``q`` transposed/collapsed to ``(B, X, K)`` and ``(B, X, K/blk)``.

    Free dimensions are collapsed into X. For FP8_128x128 the validation guaranteed that the
    two last axes are (free, contract) in some order, so the 2-D blocks survive. FP8_TENSOR's
    scale becomes ``(B, 1, 1)``: one value for every batch, or each batch entry's own where the
    scale has leading (batch) dims.
    """
    nd = q.data.ndim
    free = tuple(d for d in range(nd) if d != contract and d not in batch)
    perm = tuple(batch) + free + (contract,)
    data = jnp.transpose(q.data, perm)
    b = math.prod(q.data.shape[d] for d in batch)
    x = math.prod(q.data.shape[d] for d in free)
    data = data.reshape(b, x, q.data.shape[contract])
    if q.format.per_tensor:
        return data, per_batch(q.scale, q.data.shape, batch).reshape(b, 1, 1)
    scale = jnp.transpose(q.scale, perm)
    return data, scale.reshape(b, math.prod(q.scale.shape[d] for d in free), q.scale.shape[contract])


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


# --------------------------------------------------------------------------- backends
def _reference_backend_call(lhs, rhs, p):
    return _reference(lhs, rhs, p)


_IMPLS: dict[str, Any] = {"reference": _reference_backend_call}


def register_impl(name: str, backend: backends.Backend, impl) -> None:
    """Registers a backend of ``block_scaled_dot`` and the function that runs it.

    ``impl(lhs, rhs, problem, selection)`` returns the result in dot_general layout.
    """
    backends.register(OP, backend)
    _IMPLS[name] = impl


def _register_backends() -> None:
    # Imported here: each GPU backend module registers itself in preference order.
    from jax_gpuext import dot_cublaslt, dot_cudnn, dot_xla, hopper_mx

    dot_cudnn.register()
    dot_cublaslt.register()
    hopper_mx.register()  # issue 5: our sm_90a MXFP8/NVFP4 kernel
    dot_xla.register()  # issue 16: XLA's own path, what auto runs where none of ours is verified
    backends.register(OP, backends.Backend(
        "reference", ("cpu", "cuda"), (), "dequantize to float32, then lax.dot_general (the semantic definition)",
        takes="every format pair of one family (MX: MXFP8 E4M3/E5M2 and MXFP4 in any pairing), any shape"))


_register_backends()


# --------------------------------------------------------------------------- public: block_scaled_dot
def block_scaled_dot(lhs, rhs, dimension_numbers=None, *, preferred_element_type=jnp.bfloat16,
                     backend: str = "auto") -> jax.Array:
    """Dot of two ``BlockScaledArray`` operands, contracting along their quantized axes.

    ``dimension_numbers`` is ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))`` as for
    ``jax.lax.dot_general`` with one contracting axis each, which must be the quantized axis (one of
    the last two for FP8_128x128). ``None`` contracts ``lhs.axis`` with ``rhs.axis`` without batch
    dimensions. Accumulation is float32; global scales (NVFP4) multiply the accumulator; the result
    is cast to ``preferred_element_type`` (float32, bfloat16 or float16).
    """
    out_dtype = _check_out_dtype(preferred_element_type, "block_scaled_dot")
    p = _problem(lhs, rhs, dimension_numbers, out_dtype)
    sel = backends.select(OP, backend, problem=p)
    return _IMPLS[sel.chosen](lhs, rhs, p, sel) if sel.chosen != "reference" else _reference(lhs, rhs, p)


# --------------------------------------------------------------------------- public: scaled_dot_general
# Backward formats. The cotangent gets ``grad_format``; the saved high-precision operands are
# re-quantized along the backward contracting axis with the forward format when it belongs to the
# same family as grad_format (operands of one dot must share a family), else with E4M3 of that
# family. NVFP4 trains with an MXFP8 backward by default: NVFP4 gradients need stochastic rounding
# and random Hadamard transforms to converge (NVIDIA's NVFP4 recipe), which we do not implement.
# FP8_TENSOR trains in E4M3 both ways (we have no per-tensor E5M2 format; its scale, recomputed
# from each cotangent's amax every step, leaves E5M2's extra range little to do).
_DEFAULT_GRAD = {"MXFP8_E4M3": "MXFP8_E5M2", "MXFP8_E5M2": "MXFP8_E5M2", "MXFP4": "MXFP8_E5M2", "NVFP4": "MXFP8_E5M2",
                 "FP8_1x128": "FP8_1x128", "FP8_128x128": "FP8_1x128", "FP8_TENSOR": "FP8_TENSOR"}
_FAMILY_E4M3 = {"mx": "MXFP8_E4M3", "nvfp4": "NVFP4", "fp8_block": "FP8_1x128", "fp8_tensor": "FP8_TENSOR"}


def _as_pair(fmt, what):
    if isinstance(fmt, (tuple, list)):
        if len(fmt) != 2:
            raise TypeError(f"{what}: format must be a BlockFormat or a (lhs_format, rhs_format) pair, got {fmt!r}")
        return tuple(fmt)
    return fmt, fmt


@dataclasses.dataclass(frozen=True)
class _Recipe:
    lhs: Any
    rhs: Any
    grad: Any
    lhs_bwd: Any
    rhs_bwd: Any


def recipe(format=None, grad_format=None) -> _Recipe:
    """The five formats of a training step: forward lhs/rhs, cotangent, backward lhs/rhs residuals."""
    lf, rf = _as_pair(formats.MXFP8_E4M3 if format is None else format, "scaled_dot_general")
    li, ri = format_info(lf), format_info(rf)
    if li.family != ri.family:
        raise ValueError(f"scaled_dot_general: formats {li.name} and {ri.name} cannot be mixed")
    if li.two_d:
        raise ValueError("scaled_dot_general: FP8_128x128 is a weight (rhs) format; use "
                         "format=(FP8_1x128, FP8_128x128) for the DeepSeek-V3 recipe")
    g = getattr(formats, _DEFAULT_GRAD[li.name]) if grad_format is None else grad_format
    gi = format_info(g)
    if gi.two_d:
        raise ValueError("scaled_dot_general: grad_format cannot be FP8_128x128 (the cotangent is the lhs "
                         "of both backward dots); use FP8_1x128")
    same = li.family == gi.family
    lb = lf if same else getattr(formats, _FAMILY_E4M3[gi.family])
    rb = rf if same else getattr(formats, _FAMILY_E4M3[gi.family])
    return _Recipe(lf, rf, g, lb, rb)


def _quantize(x, fmt, axis=-1):
    """Quantizes canonical ``x (B, X, K)`` along K (FP8_128x128: over (X, K)), or along ``axis``.

    formats.quantize takes float32/bfloat16/float16 and handles partial blocks itself.
    """
    if x.dtype == jnp.float64:
        x = x.astype(jnp.float32)
    return formats.quantize(x, fmt, axis=axis)


def _canonical_scaled(a, b, fa, fb, out_dtype, backend):
    """(B, M, K) x (B, K, N) -> (B, M, N): a quantized along its last axis, b along its rows.

    b is (B, K, N) because that is how ``x @ w`` holds its weight (Flax's Dense kernel is (in,
    out)): no transposed copy of it goes in, and no transposed gradient comes out.
    """
    qa, qb = _quantize(a, fa), _quantize_along_rows(b, fb)
    return block_scaled_dot(qa, qb, (((2,), (1,)), ((0,), (0,))), preferred_element_type=out_dtype,
                            backend=backend)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _scaled_canonical(a, b, rec: _Recipe, out_dtype, backend):
    return _canonical_scaled(a, b, rec.lhs, rec.rhs, out_dtype, backend)


def _scaled_fwd(a, b, rec, out_dtype, backend):
    return _canonical_scaled(a, b, rec.lhs, rec.rhs, out_dtype, backend), (a, b)


def _quantize_along_rows(x, fmt):
    """Quantizes canonical ``x (B, R, C)`` along R, where a dot contracts it: blocks along
    axis -2 in place (the CPU handler's strided path, CUDA's strided kernel) rather than a
    transposed copy quantized along its last axis, which costs a read and a write of x more. The
    blocks, hence the values, are the same. FP8_128x128 tiles and FP8_TENSOR's one scale do not
    depend on the axis."""
    f = format_info(fmt)
    return _quantize(x, fmt, axis=-1 if (f.two_d or f.per_tensor) else -2)


def _scaled_bwd(rec, out_dtype, backend, res, g):
    a, b = res  # a (B, M, K), b (B, K, N), g (B, M, N)
    # g is quantized in its own dtype (formats.quantize takes f32/bf16/f16; _quantize narrows
    # float64): a bf16 -> f32 promotion here would be one more pass with identical blocks.
    # dA[b,m,k] = sum_n g[b,m,n] b[b,k,n]: contract N, the last axis of both.
    da = block_scaled_dot(_quantize(g, rec.grad), _quantize(b, rec.rhs_bwd),
                          (((2,), (2,)), ((0,), (0,))), preferred_element_type=jnp.float32, backend=backend)
    # dB[b,k,n] = sum_m a^T[b,k,m] g[b,m,n]: contract M, so a^T and g are quantized along M. a^T
    # is a transposed copy quantized along its last axis (the same blocks as a along M): a dot
    # whose lhs contracts its leading axis is about 3x slower on XLA:CPU (it converts both
    # operands to f32 and transposes them; docs/design.md "CPU speed"), and every GPU backend
    # takes an lhs that contracts its last axis as it is.
    db = block_scaled_dot(_quantize(jnp.swapaxes(a, 1, 2), rec.lhs_bwd), _quantize_along_rows(g, rec.grad),
                          (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32, backend=backend)
    return da.astype(a.dtype), db.astype(b.dtype)


_scaled_canonical.defvjp(_scaled_fwd, _scaled_bwd)


def scaled_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, *,
                       out_sharding=None, format=None, grad_format=None, backend: str = "auto") -> jax.Array:
    """``jax.lax.dot_general`` computed as a block-scaled dot, differentiable.

    Drops into ``flax.nnx.Linear(dot_general=...)`` / ``flax.linen.Dense(dot_general=...)`` (use
    ``functools.partial`` to set ``format``). ``lhs``/``rhs`` are high-precision arrays quantized
    here along their contracting axes (partial blocks allowed). ``format`` is one BlockFormat
    for both operands or a ``(lhs, rhs)`` pair, e.g. ``(FP8_1x128, FP8_128x128)``; default
    MXFP8_E4M3. ``precision`` is accepted for signature compatibility and ignored: the precision
    is the format's. ``out_sharding`` (as in ``lax.dot_general``, which Flax >= 0.12 passes) is
    applied to the result as a sharding constraint. The backward pass quantizes the cotangent
    with ``grad_format`` (default
    MXFP8_E5M2 for MXFP8, MXFP4 and NVFP4, FP8_1x128 for FP8 blockwise, FP8_TENSOR for FP8_TENSOR) and
    re-quantizes the saved operands along the backward contracting axes (see ``recipe``).
    """
    del precision
    what = "scaled_dot_general"
    backends.check_requested(OP, backend, what)
    lhs, rhs = formats.as_array(lhs, what, "lhs"), formats.as_array(rhs, what, "rhs")
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 2:
            raise TypeError(f"{what}: {name} must be float16/bfloat16/float32/float64 (it is quantized here), "
                            f"got {x.dtype} with shape {x.shape}")
    rec = recipe(format, grad_format)
    lc, rc, lb, rb = _parse_dimension_numbers(dimension_numbers, lhs.ndim, rhs.ndim, what)
    if len(lc) != 1:
        raise ValueError(f"{what}: exactly one contracting dimension per operand is supported, got "
                         f"{dimension_numbers!r} for lhs {lhs.shape}, rhs {rhs.shape}")
    if lhs.shape[lc[0]] != rhs.shape[rc[0]]:
        raise ValueError(f"{what}: contracting sizes differ: lhs {lhs.shape} axis {lc[0]} vs rhs {rhs.shape} "
                         f"axis {rc[0]}")
    if [lhs.shape[d] for d in lb] != [rhs.shape[d] for d in rb]:
        raise ValueError(f"{what}: batch sizes differ: lhs {lhs.shape} dims {lb} vs rhs {rhs.shape} dims {rb}")
    requested = jnp.promote_types(lhs.dtype, rhs.dtype) if preferred_element_type is None else preferred_element_type
    # float64 (x64 inputs, or asked for) is computed and returned in float32
    out_dtype = formats.float_dtype(requested, _OUT_DTYPES + (jnp.dtype(jnp.float64),), what,
                                    "preferred_element_type")
    out_dtype = jnp.dtype(jnp.float32) if out_dtype == jnp.float64 else out_dtype
    lfree = tuple(d for d in range(lhs.ndim) if d != lc[0] and d not in lb)
    rfree = tuple(d for d in range(rhs.ndim) if d != rc[0] and d not in rb)
    bsz = math.prod(lhs.shape[d] for d in lb)
    a = jnp.transpose(lhs, lb + lfree + lc).reshape(bsz, -1, lhs.shape[lc[0]]) if lhs.size else \
        jnp.zeros((bsz, math.prod(lhs.shape[d] for d in lfree), lhs.shape[lc[0]]), lhs.dtype)
    b = jnp.transpose(rhs, rb + rc + rfree).reshape(bsz, rhs.shape[rc[0]], -1) if rhs.size else \
        jnp.zeros((bsz, rhs.shape[rc[0]], math.prod(rhs.shape[d] for d in rfree)), rhs.dtype)
    out = _scaled_canonical(a, b, rec, out_dtype, backend)
    shape = ([lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lfree] + [rhs.shape[d] for d in rfree])
    out = out.reshape(shape)
    if out_sharding is not None:
        out = lax.with_sharding_constraint(out, out_sharding)
    return out


# --------------------------------------------------------------------------- demo
def demo_steps():
    """(title, callable) pairs for ``python -m jax_gpuext demo``."""
    from jax_gpuext.explain import explain

    def dot_step():
        k1, k2 = jax.random.split(jax.random.key(0))
        x = jax.random.normal(k1, (64, 256), jnp.float32)
        w = jax.random.normal(k2, (128, 256), jnp.float32)
        qx, qw = formats.quantize(x, formats.MXFP8_E4M3), formats.quantize(w, formats.MXFP8_E4M3)
        f = jax.jit(lambda a, b: block_scaled_dot(a, b, preferred_element_type=jnp.float32))
        y = f(qx, qw)
        err = float(jnp.max(jnp.abs(y - x @ w.T)) / jnp.max(jnp.abs(x @ w.T)))
        print(f"MXFP8 (64x256) . (128x256)^T: max error / max |x w^T| = {err:.3g}")
        print(explain(f, qx, qw))

    def train_step():
        k1, k2 = jax.random.split(jax.random.key(1))
        x = jax.random.normal(k1, (32, 128), jnp.float32)
        w = jax.random.normal(k2, (128, 64), jnp.float32) / 11.3
        dn = (((1,), (0,)), ((), ()))

        def loss(w):
            return jnp.mean(scaled_dot_general(x, w, dn, preferred_element_type=jnp.float32) ** 2)

        step = jax.jit(lambda w: w - 0.1 * jax.grad(loss)(w))
        w1 = step(w)
        print(f"one MXFP8 SGD step: loss {float(loss(w)):.4f} -> {float(loss(w1)):.4f}")
        print(explain(jax.grad(loss), w))

    return [("block_scaled_dot (MXFP8)", dot_step), ("scaled_dot_general training step", train_step)]
