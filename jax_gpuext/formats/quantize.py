"""Block-scaled formats: MXFP8 (E4M3 / E5M2), MXFP4, NVFP4, FP8 blockwise (1x128, 128x128) and
per-tensor FP8 (FP8_TENSOR: the FP8 blockwise rule with the whole tensor as the block).

``quantize(x, fmt)`` returns a :class:`BlockScaledArray` (data, per-block scales, optional
per-tensor global scale); ``dequantize(q)`` turns it back into floats. Four implementations
agree bit for bit: the pure-jnp reference (``formats.reference``, the definition), the ``xla``
backend (``formats.xla``: the same rules as one pass of XLA, what ``auto`` runs on a GPU until
our CUDA kernels are verified there), the CPU FFI handler (``ffi/cpu/formats.cc``) and the CUDA
kernels (``csrc/formats/``). docs/formats.md states the rules.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext.common import backends, export, gates, verified
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import ffi as _ffi
from jax_gpuext.common.errors import UnsupportedError, require_bool
from jax_gpuext.formats import reference as ref
from jax_gpuext.formats import xla as formats_xla

QUANTIZE_OP = "quantize"
DEQUANTIZE_OP = "dequantize"
QUANTIZE_TARGET = _ext.declare_target("gpuext_quantize", "quantize")
DEQUANTIZE_TARGET = _ext.declare_target("gpuext_dequantize", "dequantize")
# quantize_both_axes on CUDA: one kernel, x read once, both axes written (ffi/cuda/formats.cc).
QUANTIZE_BOTH_TARGET = _ext.declare_target("gpuext_quantize_both_axes", "quantize")
INPUT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
SCALE_ROUNDINGS = ("up", "nearest", "ocp")


@dataclasses.dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format. ``block`` is (n,) along one axis, (r, c) over the last two axes, or
    () for one scale over the whole tensor (FP8_TENSOR).

    ``code`` is the value of the ``format`` attribute of our custom calls (keep in step with
    ``csrc/formats/block_scaled_math.h``).
    """

    name: str
    elem_dtype: jnp.dtype
    scale_dtype: jnp.dtype
    block: tuple[int, ...]
    code: int
    has_global_scale: bool = False

    def __post_init__(self):
        # Formats compare, hash and dispatch by value (never by identity: pickle, deepcopy and
        # config systems make new objects). Normalizing the fields makes a format rebuilt from
        # equivalent facts (a scalar type for a dtype, a list for the block) equal to the original.
        if not isinstance(self.name, str):
            raise TypeError(f"BlockFormat.name must be a str, got {self.name!r}")
        object.__setattr__(self, "elem_dtype", jnp.dtype(self.elem_dtype))
        object.__setattr__(self, "scale_dtype", jnp.dtype(self.scale_dtype))
        object.__setattr__(self, "block", tuple(operator.index(b) for b in self.block))
        object.__setattr__(self, "code", operator.index(self.code))
        object.__setattr__(self, "has_global_scale", bool(self.has_global_scale))

    def __reduce__(self):
        # pickle / copy / deepcopy come back as the canonical module-level format when one is equal
        return (_format_from_fields, dataclasses.astuple(self))

    @property
    def elem_max(self) -> float:
        return float(jnp.finfo(self.elem_dtype).max)

    @property
    def per_tensor(self) -> bool:
        return len(self.block) == 0

    @property
    def is_mx(self) -> bool:
        return self.scale_dtype == jnp.float8_e8m0fnu

    def __repr__(self) -> str:
        return f"BlockFormat({self.name})"


MXFP8_E4M3 = BlockFormat("MXFP8_E4M3", jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e8m0fnu), (32,), 0)
MXFP8_E5M2 = BlockFormat("MXFP8_E5M2", jnp.dtype(jnp.float8_e5m2), jnp.dtype(jnp.float8_e8m0fnu), (32,), 1)
NVFP4 = BlockFormat("NVFP4", jnp.dtype(jnp.float4_e2m1fn), jnp.dtype(jnp.float8_e4m3fn), (16,), 2,
                    has_global_scale=True)
FP8_1x128 = BlockFormat("FP8_1x128", jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float32), (128,), 3)
FP8_128x128 = BlockFormat("FP8_128x128", jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float32), (128, 128), 4)
# Per-tensor FP8 ("current scaling"): what cuBLASLt's SCALAR_32F mode multiplies in on any FP8 GPU.
FP8_TENSOR = BlockFormat("FP8_TENSOR", jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float32), (), 5)
# OCP MX v1.0 MXFP4: E2M1 elements, one E8M0 scale per 32 (gpt-oss weights); packed like NVFP4.
MXFP4 = BlockFormat("MXFP4", jnp.dtype(jnp.float4_e2m1fn), jnp.dtype(jnp.float8_e8m0fnu), (32,), 6)
FORMATS = {f.name: f for f in (MXFP8_E4M3, MXFP8_E5M2, NVFP4, FP8_1x128, FP8_128x128, FP8_TENSOR, MXFP4)}
# Names match case-insensitively: "mxfp8_e4m3" and "nvfp4" are how other libraries spell them.
_FORMATS_BY_FOLDED_NAME = {name.casefold(): f for name, f in FORMATS.items()}


def format_named(name: str, what: str = "quantize", role: str = "block format") -> BlockFormat:
    """The registered format called ``name`` (case-insensitive), or a ValueError naming the known
    ones. ``what`` and ``role`` say in the message which call and which argument gave the name."""
    fmt = _FORMATS_BY_FOLDED_NAME.get(name.casefold())
    if fmt is None:
        prefix = "" if what == "quantize" else f"{what}: "
        raise ValueError(f"{prefix}unknown {role} {name!r}; known formats: {sorted(FORMATS)}")
    return fmt


def _format_from_fields(*fields) -> BlockFormat:
    """Unpickling: the registered format equal to ``fields`` (so ``is`` still holds for code
    outside this package that uses it), else a new BlockFormat."""
    fmt = BlockFormat(*fields)
    return FORMATS.get(fmt.name) if FORMATS.get(fmt.name) == fmt else fmt


# The reference's name of each element type (``formats.reference.ELEMENTS``): formats dispatch on
# their element dtype, a value, so that an equal copy of a format is the same format.
_REF_ELEMENTS = {jnp.dtype(jnp.float8_e4m3fn): "e4m3", jnp.dtype(jnp.float8_e5m2): "e5m2",
                 jnp.dtype(jnp.float4_e2m1fn): "e2m1"}
_ROUNDING_CODES = {"up": 0, "ocp": 1, "nearest": 2}  # csrc ScaleRounding


class _Fp4Packed(collections.abc.MutableMapping):
    """How XLA lays out float4_e2m1fn buffers, per platform, as the handlers' ``fp4_packed``
    attribute: True = two per byte, element 2i in the low nibble; False = one per byte (low
    nibble). FFI buffers cannot tell, so the layout is measured on the device once per process
    (``jax_gpuext.formats.fp4_layout``); a platform whose layout the handlers cannot read raises (the
    formats backends' ``supports()`` refuse it first). ``FP4_PACKED[platform] = bool`` overrides the
    probe (said in every ``explain``); ``del`` restores it."""

    def __init__(self):
        self._overrides: dict[str, bool] = {}

    def layout(self, platform: str):
        from jax_gpuext.formats import fp4_layout

        if platform in self._overrides:
            name = fp4_layout.LOW_FIRST if self._overrides[platform] else fp4_layout.ONE_PER_BYTE
            return fp4_layout.Layout(platform, name, "set by hand in jax_gpuext.formats.FP4_PACKED")
        return fp4_layout.probe(platform)

    def __getitem__(self, platform: str) -> bool:
        layout = self.layout(platform)
        if layout.packed is None:
            raise UnsupportedError(f"our handlers cannot read {layout.describe()}", reason=layout.how)
        return layout.packed

    def __setitem__(self, platform: str, packed: bool) -> None:
        self._overrides[platform] = require_bool(packed, "FP4_PACKED", f"FP4_PACKED[{platform!r}]")

    def __delitem__(self, platform: str) -> None:
        del self._overrides[platform]

    def __iter__(self):
        return iter(("cpu", "cuda"))

    def __len__(self) -> int:
        return 2


FP4_PACKED = _Fp4Packed()


@jax.tree_util.register_pytree_node_class
class BlockScaledArray:
    """Quantized data plus scales. ``data`` keeps the logical shape of the input (no padding);
    ``scale`` has one entry per (possibly partial) block; ``global_scale`` is an fp32 scalar
    (leading batch dims under vmap) for formats that have one, else None. ``axis`` is stored
    negative so that it stays right when vmap adds leading batch dimensions.

    Construction validates the parts (``data`` / ``scale`` / ``global_scale``: arrays, tracers or
    ``jax.ShapeDtypeStruct``; dtypes and shapes as ``format`` and ``axis`` require; a per-tensor
    value may carry leading batch dims of ``data``). JAX's own rebuilding of the pytree
    (``tree_unflatten``, which transformations call with placeholder leaves) does not validate.
    """

    def __init__(self, data, scale, global_scale, format: BlockFormat, axis: int):
        parts = _check_parts(data, scale, global_scale, format, axis, "BlockScaledArray")
        self.data, self.scale, self.global_scale, self.format, self.axis = parts

    def check(self, what: str = "BlockScaledArray") -> None:
        """Validates the parts again: they may have been replaced since construction (tree_map,
        tree_unflatten). Ops call it before choosing a backend; errors start with ``what``."""
        _check_parts(self.data, self.scale, self.global_scale, self.format, self.axis, what)

    def tree_flatten(self):
        return (self.data, self.scale, self.global_scale), (self.format, self.axis)

    @classmethod
    def tree_unflatten(cls, aux, children):
        # JAX unflattens with leaves that are not arrays (object() sentinels, None, in_axes ints,
        # shardings) while it transforms: build the object without __init__'s checks.
        q = object.__new__(cls)
        q.data, q.scale, q.global_scale = children
        q.format, q.axis = aux
        return q

    @property
    def shape(self):
        return self.data.shape

    def dequantize(self, dtype=jnp.float32):
        return dequantize(self, dtype)

    def __repr__(self) -> str:
        return (f"BlockScaledArray({self.format.name}, shape={tuple(self.data.shape)}, axis={self.axis}, "
                f"scale.shape={tuple(self.scale.shape)})")


export.register_array_serialization(BlockScaledArray, "jax_gpuext.BlockScaledArray", FORMATS)


# --------------------------------------------------------------------------- validation
def _array_part(part: str, x, what: str):
    """An array-like part of a BlockScaledArray: anything with a shape and a dtype (jax.Array,
    numpy array, tracer, ShapeDtypeStruct). Lists, scalars and other objects are refused."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(x, type):
        raise TypeError(f"{what}: {part} must be an array (jax.Array, numpy.ndarray or jax.ShapeDtypeStruct), "
                        f"got {type(x).__name__}")
    return x


def as_array(x, what: str, name: str):
    """``jnp.asarray(x)`` with an error that names the argument (None, strings, objects)."""
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what}: {name} must be an array or array-like of numbers, got "
                        f"{type(x).__name__} ({e})") from None


def float_dtype(dtype, allowed, what: str, name: str):
    """``jnp.dtype(dtype)`` if it is one of ``allowed``, else a TypeError naming ``name``
    (None is refused: jnp.dtype(None) would be float64)."""
    try:
        dt = None if dtype is None else jnp.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt not in allowed:  # (np.dtype("float64") == None is True: test None first)
        got = repr(dtype) if dt is None else dt.name
        raise TypeError(f"{what}: {name} must be one of {[d.name for d in allowed]}, got {got}")
    return dt


def _check_parts(data, scale, global_scale, fmt, axis, what: str):
    """Validated (data, scale, global_scale, format, axis) of a BlockScaledArray; axis negative.
    Dtype mismatches are TypeErrors, shape mismatches ValueErrors, each naming the part."""
    if not isinstance(fmt, BlockFormat):
        hint = (f" (use jax_gpuext.{_FORMATS_BY_FOLDED_NAME[fmt.casefold()].name})"
                if isinstance(fmt, str) and fmt.casefold() in _FORMATS_BY_FOLDED_NAME else "")
        raise TypeError(f"{what}: format must be a jax_gpuext.BlockFormat (one of {sorted(FORMATS)}), "
                        f"got {type(fmt).__name__} {fmt!r}{hint}")
    data, scale = _array_part("data", data, what), _array_part("scale", scale, what)
    shape = tuple(data.shape)
    ax = _normalize_axis(axis, len(shape), fmt, shape, what=f"{what}: data")
    for part, x, want in (("data", data, fmt.elem_dtype), ("scale", scale, fmt.scale_dtype)):
        if jnp.dtype(x.dtype) != want:
            raise TypeError(f"{what}: {part} of a {fmt.name} array must have dtype {want.name}, "
                            f"got {jnp.dtype(x.dtype).name} (shape {tuple(x.shape)})")
    # FP8_TENSOR: one scale per tensor; quantized under vmap, the scale holds the leading batch dims
    expected = _leading(scale, shape) if fmt.per_tensor else scale_shape(shape, fmt, ax)
    if tuple(scale.shape) != expected:
        raise ValueError(f"{what}: scale of {fmt.name} data {jnp.dtype(data.dtype).name}{list(shape)} "
                         f"(axis {ax}) must have shape {list(expected)}, got "
                         f"{jnp.dtype(scale.dtype).name}{list(scale.shape)} (the block axis is counted from "
                         "the end, which leading batch dimensions keep; an array returned by jax.vmap with "
                         "out_axes other than 0 has its batch dimension inside: return it with out_axes=0)")
    if not fmt.has_global_scale:
        if global_scale is not None:
            raise ValueError(f"{what}: {fmt.name} has no global scale; global_scale must be None, got "
                             f"{type(global_scale).__name__}")
        return data, scale, None, fmt, ax
    if global_scale is None:
        raise ValueError(f"{what}: {fmt.name} needs a global_scale (float32 scalar), got None")
    if isinstance(global_scale, (float, int)) and not isinstance(global_scale, bool):
        global_scale = np.asarray(global_scale, np.float32)
    g = _array_part("global_scale", global_scale, what)
    if jnp.dtype(g.dtype) != jnp.float32:
        raise TypeError(f"{what}: global_scale must have dtype float32, got {jnp.dtype(g.dtype).name}")
    if tuple(g.shape) != _leading(g, shape):
        raise ValueError(f"{what}: global_scale must be a scalar or have leading dims of data {list(shape)} "
                         f"(one value per batch entry), got shape {list(g.shape)}")
    return data, scale, g, fmt, ax


def _leading(x, shape) -> tuple[int, ...]:
    """The shape a per-tensor value like ``x`` must have: the leading dims of ``shape`` it spans
    (none for a scalar; all of ``shape``, which x then fails to match, when x has more dims)."""
    return tuple(shape[:len(x.shape)])


def _check_format(fmt) -> BlockFormat:
    if isinstance(fmt, str):
        return format_named(fmt)
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"fmt must be a jax_gpuext.BlockFormat (one of {sorted(FORMATS)}), got {fmt!r}")
    return fmt


def _normalize_axis(axis, ndim: int, fmt: BlockFormat, shape, what: str = "x") -> int:
    """Returns the axis as a negative index (FP8_TENSOR keeps it only as the default contracting
    axis of block_scaled_dot: its one scale covers every axis)."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {type(axis).__name__} {axis!r}")
    if len(fmt.block) == 2:
        if ndim < 2:
            raise ValueError(f"{fmt.name} blocks the last two axes: {what} needs rank >= 2, got shape {shape}")
        if axis not in (-1, ndim - 1):
            raise ValueError(f"{fmt.name} blocks the last two axes; axis must be -1, got {axis} for shape {shape}")
        return -1
    if ndim == 0 or not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {what} of shape {shape}")
    return int(axis) - ndim if axis >= 0 else int(axis)


def scale_shape(shape, fmt: BlockFormat, axis: int = -1) -> tuple[int, ...]:
    """Shape of the scales of an array of ``shape``: partial blocks count as whole ones."""
    if fmt.per_tensor:
        return ()
    shape = list(shape)
    if len(fmt.block) == 2:
        shape[-2] = -(-shape[-2] // fmt.block[0])
        shape[-1] = -(-shape[-1] // fmt.block[1])
    else:
        shape[axis] = -(-shape[axis] // fmt.block[0])
    return tuple(shape)


def _check_global_scale(global_scale, fmt: BlockFormat):
    if not fmt.has_global_scale:
        if global_scale is not None:
            raise ValueError(f"{fmt.name} has no global scale; global_scale must be None")
        return None
    if global_scale is None:
        return None
    g = as_array(global_scale, "quantize", "global_scale")
    if g.shape != ():
        raise ValueError(f"global_scale must be a scalar (shape ()), got shape {g.shape}")
    if not jnp.issubdtype(g.dtype, jnp.floating):
        raise TypeError(f"global_scale must be a float scalar, got dtype {g.dtype}")
    return g.astype(jnp.float32)


# --------------------------------------------------------------------------- backends
def _handler_supports(platform: str):
    """The FFI backends take every format, dtype and shape, once XLA's float4 layout on
    ``platform`` is one the handlers read (measured, jax_gpuext.formats.fp4_layout)."""
    def supports(problem) -> gates.GateResult:
        fmt = problem[0]
        if fmt.elem_dtype != jnp.dtype(jnp.float4_e2m1fn):
            return gates.GateResult(True, "every format, dtype and shape")
        layout = FP4_PACKED.layout(platform)
        return gates.GateResult(layout.packed is not None, layout.describe())
    return supports


def _note_fp4_layout(sel, fmt) -> None:
    if sel.chosen in ("cpu", "cuda") and fmt.elem_dtype == jnp.dtype(jnp.float4_e2m1fn):
        backends.note(sel, FP4_PACKED.layout(sel.chosen).describe())


def _format_feature(problem) -> str:
    """The GPU tests' feature of a (format, shape, dtype) problem: the format's name
    (``verifies("formats.cuda", feature=...)``); auto needs that format verified."""
    return problem[0].name


backends.register(QUANTIZE_OP, backends.Backend(
    "cuda", ("cuda",), ("cuda_extension", "cuda_device"),
    "CUDA kernels (gpuext_quantize): one pass for block formats, amax + rounding for FP8_TENSOR",
    _handler_supports("cuda"), feature=_format_feature))
# CPU order = a recorded measurement, not an assumption: benchmarks/bench_cpu.py times both exact
# paths in one process and prints which is faster (docs/design.md "CPU speed (issue 18)").
_CPU_MEASURED = ("measured faster than the xla backend and the jnp reference for every format (vectorised, "
                 "threaded; benchmarks/bench_cpu.py, docs/design.md 'CPU speed')")
backends.register(QUANTIZE_OP, backends.Backend(
    "cpu", ("cpu",), ("cpu_extension",), f"C++ CPU handler (gpuext_quantize), {_CPU_MEASURED}",
    _handler_supports("cpu")))
# XLA's own ops, bit-identical to the reference in one pass (no loop): auto's choice on a GPU
# where the CUDA kernels are not verified (docs/design.md "The xla backend of quantize").
_XLA_DESCRIPTION = ("pure XLA, one pass, bit-identical to the reference (formats.xla: integer rules, "
                    "loop-free exact division)")
backends.register(QUANTIZE_OP, backends.Backend("xla", ("cuda", "cpu"), (), _XLA_DESCRIPTION))
backends.register(QUANTIZE_OP, backends.Backend(
    "reference", ("cpu", "cuda"), (), "pure-jnp reference on bit patterns"))
backends.register(DEQUANTIZE_OP, backends.Backend(
    "cuda", ("cuda",), ("cuda_extension", "cuda_device"),
    "CUDA kernel (gpuext_dequantize), 8 elements per thread where rows allow", _handler_supports("cuda"),
    feature=_format_feature))
backends.register(DEQUANTIZE_OP, backends.Backend(
    "cpu", ("cpu",), ("cpu_extension",), f"C++ CPU handler (gpuext_dequantize), {_CPU_MEASURED}",
    _handler_supports("cpu")))
backends.register(DEQUANTIZE_OP, backends.Backend("xla", ("cuda", "cpu"), (), _XLA_DESCRIPTION))
backends.register(DEQUANTIZE_OP, backends.Backend(
    "reference", ("cpu", "cuda"), (), "pure-jnp reference on bit patterns"))


# --------------------------------------------------------------------------- quantize
def default_scale_rounding(fmt: BlockFormat) -> str:
    """The scale rounding ``quantize`` uses for ``fmt`` when none is given: what jax.nn,
    TransformerEngine and cuDNN do for that format. MX (E8M0 scales): "up", the scale rounded up
    to a power of two so no element saturates (jax.nn's ``cast_to_e8m0_with_rounding_up``, TE's
    and cuDNN's MXFP8 quantizers). NVFP4 (E4M3 scales): "nearest", the scale rounded to nearest
    even (jax.nn's float8_e4m3fn cast, TE's saturating ``cvt.rn``, ModelOpt). FP8 blockwise and
    per-tensor: "up", which for their unrounded fp32 scales means amax / 448 (DeepSeek-V3)."""
    return "nearest" if _check_format(fmt).has_global_scale else "up"


def _check_scale_rounding(scale_rounding, fmt: BlockFormat) -> str:
    if scale_rounding is None:
        return default_scale_rounding(fmt)
    if not isinstance(scale_rounding, str) or scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding must be None (the format's default) or one of {SCALE_ROUNDINGS}, "
                         f"got {scale_rounding!r}")
    if scale_rounding == "ocp" and not fmt.is_mx:
        raise ValueError(f"scale_rounding='ocp' (OCP MX v1.0 floor rule) applies to power-of-two E8M0 scales "
                         f"only; {fmt.name} scales are {fmt.scale_dtype.name}")
    if scale_rounding == "nearest" and not fmt.has_global_scale:
        raise ValueError(f"scale_rounding='nearest' (an E4M3 block scale rounded to nearest even) applies to "
                         f"NVFP4 only; {fmt.name} takes {default_scale_rounding(fmt)!r}"
                         + (" or 'ocp'" if fmt.is_mx else ""))
    return scale_rounding


def quantize(x, fmt, *, axis: int = -1, scale_rounding: str | None = None, global_scale=None,
             backend: str = "auto") -> BlockScaledArray:
    """Quantizes ``x`` (float32 / bfloat16 / float16) to block format ``fmt``.

    ``axis``: the axis blocks run along (1-D formats; FP8_128x128 always blocks the last two;
    FP8_TENSOR has one scale and keeps ``axis`` only as block_scaled_dot's default contraction).
    ``scale_rounding``: None (default) takes the format's own (:func:`default_scale_rounding`):
    "up" for MX and FP8, "nearest" for NVFP4 -- bit for bit what jax.nn's quantizer stores.
    "up" rounds the block scale up so no element saturates (jax.nn, cuDNN and TE for MX scales;
    for NVFP4 an option). "nearest" rounds NVFP4's E4M3 block scale to nearest even (jax.nn, TE,
    ModelOpt; NVFP4 only). "ocp" is OCP MX v1.0's floor rule (elements saturate), MX only.
    docs/formats.md states each rule exactly.
    ``global_scale``: NVFP4's fp32 dequantisation scale; default amax / (6 * 448).
    """
    fmt = _check_format(fmt)
    x = _checked_input(x, "quantize")
    ax = _normalize_axis(axis, x.ndim, fmt, x.shape)
    scale_rounding, g, sel, problem = _checked_rounding_and_backend(x, fmt, scale_rounding, global_scale, backend, ax)

    def on(sel):
        def run(x, *gs):
            return _quantize_on(sel.chosen, x, fmt, ax, scale_rounding, gs[0] if gs else None)

        # One derivative rule for every backend, above the backend choice (docs/formats.md, "Gradients").
        data, scale = _refuse_derivatives(run)(x, *(() if g is None else (g,)))
        return BlockScaledArray(export.mark_choice(data, sel, problem), scale, g, fmt, ax)

    return export.per_platform(sel, problem, on, (x, g))


def _checked_input(x, what: str):
    """x as an array of a quantizable dtype, or the error naming ``what``."""
    x = as_array(x, what, "x")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{what}: x must be float32, bfloat16 or float16, got {x.dtype} (shape {x.shape})")
    return x


def _checked_rounding_and_backend(x, fmt: BlockFormat, scale_rounding, global_scale, backend: str, axis):
    """(scale_rounding, global scale, backend selection, problem): the keywords checked before any
    backend is chosen, then the choice; NVFP4's default global scale (amax / (6 * 448)) filled in.
    The problem is (format, shape, dtype, axis): ``axis`` the blocks' (verified.BOTH_AXES for
    quantize_both_axes), so that auto ranks the call by its own layout's measurements
    (verified.speed_key)."""
    scale_rounding = _check_scale_rounding(scale_rounding, fmt)
    g = _check_global_scale(global_scale, fmt)
    problem = (fmt, x.shape, x.dtype, axis)
    sel = backends.select(QUANTIZE_OP, backend, problem=problem)
    _note_fp4_layout(sel, fmt)
    if fmt.has_global_scale and g is None:
        g = ref.nvfp4_global_scale(x)
    return scale_rounding, g, sel, problem


def _quantize_on(chosen: str, x, fmt: BlockFormat, ax: int, scale_rounding: str, g):
    """(data, scale) of x along ax on the chosen backend."""
    if x.size == 0 and not fmt.per_tensor and chosen in ("reference", "xla"):
        return _quantize_empty(x, fmt, ax)
    if chosen == "reference":
        return _quantize_reference(x, fmt, ax, scale_rounding, g)
    if chosen == "xla":
        return formats_xla.quantize(x, fmt, ax, scale_rounding, g)
    return _quantize_ffi(x, fmt, ax, scale_rounding, g, chosen)


def quantize_both_axes(x, fmt, *, scale_rounding: str | None = None, global_scale=None,
                       backend: str = "auto") -> tuple[BlockScaledArray, BlockScaledArray]:
    """``(quantize(x, fmt, axis=-1), quantize(x, fmt, axis=-2))`` from one read of x where it can.

    Both results are bit for bit the two ``quantize`` calls with the same keywords, on every backend
    (``scale_rounding``, ``global_scale`` and ``backend`` as for :func:`quantize`; NVFP4's default
    global scale is computed once and shared). A training step needs both: a GEMM's operand is
    quantized along its contracting axis, and the backward GEMMs contract the other one (the
    transposed layout, in place). The ``cuda`` backend runs one fused kernel that reads x once and
    writes both copies and both scale arrays (docs/design.md, "Quantize at memory speed on
    Hopper"); the other backends run the two quantizations. x needs rank >= 2. FP8_TENSOR's one
    scale does not depend on the axis: one quantization serves both (axes -1 and -2 recorded).
    FP8_128x128 blocks the last two axes and has no axis -2 quantization: it raises as
    ``quantize(x, FP8_128x128, axis=-2)`` does (its tiles serve both GEMM directions as they are).
    """
    what = "quantize_both_axes"
    fmt = _check_format(fmt)
    x = _checked_input(x, what)
    if x.ndim < 2:
        raise ValueError(f"{what}: x needs rank >= 2 (it is quantized along axes -1 and -2), got shape {x.shape}")
    ax_last = _normalize_axis(-1, x.ndim, fmt, x.shape)
    ax_second = _normalize_axis(-2, x.ndim, fmt, x.shape)  # FP8_128x128 raises here, as quantize does
    # ranked by the fused pair's measurements (one read of x writing both copies), not the last axis's
    scale_rounding, g, sel, problem = _checked_rounding_and_backend(x, fmt, scale_rounding, global_scale, backend,
                                                                    verified.BOTH_AXES)

    def on(sel):
        def run(x, *gs):
            g = gs[0] if gs else None
            if fmt.per_tensor:
                data, scale = _quantize_on(sel.chosen, x, fmt, ax_last, scale_rounding, g)
                return data, scale, data, scale
            if sel.chosen == "cuda":
                return _quantize_both_ffi(x, fmt, scale_rounding, g)
            return (*_quantize_on(sel.chosen, x, fmt, ax_last, scale_rounding, g),
                    *_quantize_on(sel.chosen, x, fmt, ax_second, scale_rounding, g))

        d_last, s_last, d_second, s_second = _refuse_derivatives(run)(x, *(() if g is None else (g,)))
        d_last, d_second = (export.mark_choice(d, sel, problem) for d in (d_last, d_second))
        return (BlockScaledArray(d_last, s_last, g, fmt, ax_last),
                BlockScaledArray(d_second, s_second, g, fmt, ax_second))

    return export.per_platform(sel, problem, on, (x, g))


def _quantize_both_ffi(x, fmt: BlockFormat, rounding: str, g):
    out = (jax.ShapeDtypeStruct(x.shape, fmt.elem_dtype),
           jax.ShapeDtypeStruct(scale_shape(x.shape, fmt, -1), fmt.scale_dtype),
           jax.ShapeDtypeStruct(x.shape, fmt.elem_dtype),
           jax.ShapeDtypeStruct(scale_shape(x.shape, fmt, -2), fmt.scale_dtype))
    return _ffi.ffi_call(QUANTIZE_BOTH_TARGET, out, x, _ffi_global_scale(g), vmap_method="broadcast_all",
                         format=np.int32(fmt.code), scale_rounding=np.int32(_ROUNDING_CODES[rounding]),
                         fp4_packed=_fp4_packed("cuda", fmt))


# --------------------------------------------------------------------------- gradients
# Defined once, above the backend choice, so that every backend differentiates alike (issue 26: the
# cpu backend refused jax.grad while the reference one returned zeros). The rule: we never hand out
# a derivative that JAX would have to round to an 8- or 4-bit format -- JAX types the tangent of a
# float8 array as float8, where a gradient saturates at 448 and vanishes below 2^-9. So quantize is
# not differentiable, and dequantize is differentiable exactly in its float32 inputs: the FP8
# blockwise / per-tensor scales and NVFP4's global scale. docs/formats.md says how to train through
# quantization (a straight-through estimator around dequantize(quantize(x))).
QUANTIZE_GRADIENT_ERROR = (
    "jax_gpuext.quantize is not differentiable: its outputs are low-precision codes, and their tangents "
    "would have to be rounded to the element format (JAX types the tangent of a float8 array as float8), "
    "which gives silently wrong gradients. For quantization-aware training use a straight-through "
    "estimator around dequantize(quantize(x)) (docs/formats.md, 'Gradients'), or stop_gradient the input")


@contextlib.contextmanager
def first_order_only(what: str):
    """Around a quantized op's backward pass (a ``custom_vjp`` bwd): a second derivative reaches
    ``quantize`` inside it, whose refusal would name a function the caller never called and advise
    a straight-through estimator. Said as what it is instead."""
    try:
        yield
    except TypeError as e:
        if QUANTIZE_GRADIENT_ERROR not in str(e):
            raise
        raise TypeError(f"{what}: differentiable once, in reverse mode (jax.grad, jax.vjp, jax.jacrev): a second "
                        "derivative (jax.hessian, jax.jacfwd of a gradient) would differentiate its backward pass, "
                        "which quantizes the cotangent and the saved operands, and quantize has no derivative "
                        "(its outputs are low-precision codes)") from e


def _is_zero(t) -> bool:
    return type(t) is jax.custom_derivatives.SymbolicZero


def _refuse_derivatives(fn):
    """``fn`` with a JVP rule that refuses: JAX calls it only when some input carries a tangent."""
    @jax.custom_jvp
    def f(*args):
        return fn(*args)

    def jvp(primals, tangents):
        raise TypeError(QUANTIZE_GRADIENT_ERROR)

    f.defjvp(jvp)
    return f


def _differentiable_dequantize(run, fmt: BlockFormat, axis: int, dtype):
    """``run(data, scale[, global_scale])`` with dequantize's derivative: y = data * scale (*
    global_scale), so dy = data * dscale (* global_scale) + data * scale * dglobal_scale, evaluated in
    float32 and rounded once to ``dtype``. Its transpose gives each block's scale the sum over the
    block of data * cotangent (* global_scale). Tangents of the codes (data) and of 8-bit scales
    (E8M0, E4M3) are refused with a TypeError: they would have to be rounded to those formats."""
    def what(name):
        return (f"dequantize: cannot differentiate with respect to the {name} of a {fmt.name} array: its "
                "cotangent would have to be rounded to that low-precision format, which gives silently wrong "
                "gradients. Differentiate with respect to float32 parts only (FP8 blockwise / per-tensor scales, "
                "NVFP4's global_scale: close over the rest, or wrap it in jax.lax.stop_gradient); see "
                "docs/formats.md, 'Gradients'")

    @jax.custom_jvp
    def f(data, scale, *gs):
        return run(data, scale, *gs)

    def jvp(primals, tangents):
        data, scale, *gs = primals
        t_data, t_scale, *t_gs = tangents
        if not _is_zero(t_data):
            raise TypeError(what(f"data ({jnp.dtype(data.dtype).name} codes)"))
        if not _is_zero(t_scale) and jnp.dtype(scale.dtype) != jnp.float32:
            raise TypeError(what(f"block scales ({jnp.dtype(scale.dtype).name})"))
        values = data.astype(jnp.float32)
        ndim, terms = data.ndim, []
        g = _broadcast_leading(gs[0].astype(jnp.float32), ndim) if gs else None
        if not _is_zero(t_scale):
            term = values * _expand_scale(t_scale, fmt, axis, data.shape)
            terms.append(term if g is None else term * g)
        if gs and not _is_zero(t_gs[0]):
            per_element = values * _expand_scale(scale.astype(jnp.float32), fmt, axis, data.shape)
            terms.append(per_element * _broadcast_leading(t_gs[0].astype(jnp.float32), ndim))
        tangent = terms[0] if len(terms) == 1 else terms[0] + terms[1]
        return f(*primals), tangent.astype(dtype)

    f.defjvp(jvp, symbolic_zeros=True)
    return f


def _blocked_1d(bits, block: int, axis: int):
    """[..., K, ...] -> moved to [..., nb, block] (zero padded); returns (blocked, K)."""
    b = jnp.moveaxis(bits, axis, -1)
    k = b.shape[-1]
    block = ref.block_length(block, k)  # one partial block: no padding needed (zeros change nothing)
    nb = -(-k // block)
    b = jnp.pad(b, [(0, 0)] * (b.ndim - 1) + [(0, nb * block - k)])
    return b.reshape(b.shape[:-1] + (nb, block)), k


def _unblock_1d(codes, k: int, axis: int):
    c = codes.reshape(codes.shape[:-2] + (-1,))[..., :k]
    return jnp.moveaxis(c, -1, axis)


def _blocked_2d(bits, block):
    *lead, m, n = bits.shape
    block = (ref.block_length(block[0], m), ref.block_length(block[1], n))
    mb, nb = -(-m // block[0]), -(-n // block[1])
    b = jnp.pad(bits, [(0, 0)] * len(lead) + [(0, mb * block[0] - m), (0, nb * block[1] - n)])
    return b.reshape(tuple(lead) + (mb, block[0], nb, block[1])), (m, n)


def _unblock_2d(codes, mn):
    *lead, mb, r, nb, c = codes.shape
    return codes.reshape(tuple(lead) + (mb * r, nb * c))[..., : mn[0], : mn[1]]


def _codes_to_elements(codes, dtype):
    if dtype == jnp.float4_e2m1fn:
        # No 4-bit bitcast: go through the exactly representable fp32 values, by a 16-entry table.
        # Not built from the code's fields (bitcast to float32, then to float4): jaxlib 0.7's XLA:CPU
        # miscompiles that conversion for a quantize along a non-last axis (wrong codes, then heap
        # corruption; docs/design.md, "jaxlib 0.12 compile hang"). The table was one of jaxlib 0.12's
        # slow loops only when fused with a consumer, which _quantize_reference's barrier prevents.
        values = jnp.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], jnp.float32)
        return values[codes.astype(jnp.int32)].astype(dtype)
    return lax.bitcast_convert_type(codes.astype(jnp.uint8), dtype)


def _elements_to_codes(data):
    if data.dtype == jnp.float4_e2m1fn:
        sign, k, m = ref.decode(ref.to_f32_bits(data.astype(jnp.float32)), ref.F32)
        return ref.round_to(sign, k, m, ref.E2M1)
    return lax.bitcast_convert_type(data, jnp.uint8).astype(jnp.uint32)


def _broadcast_leading(g, ndim: int):
    """A per-tensor value (global scale, FP8_TENSOR scale) with leading batch dims (vmap), shaped
    to broadcast against data of rank ndim."""
    return g.reshape(g.shape + (1,) * (ndim - g.ndim))


def _quantize_blocks(bits, amax, fmt: BlockFormat, rounding: str, g_bits):
    if fmt.is_mx:
        return ref.mx_quantize_blocks(bits, amax, _REF_ELEMENTS[fmt.elem_dtype], rounding)
    if fmt.has_global_scale:
        return ref.nvfp4_quantize_blocks(bits, amax, g_bits, rounding)
    return ref.fp8_blockwise_quantize_blocks(bits, amax)


def _quantize_empty(x, fmt: BlockFormat, axis: int):
    """No blocks (and a block length of 0 to divide by): zero data, zero scale bits."""
    return (_codes_to_elements(jnp.zeros(x.shape, jnp.uint32), fmt.elem_dtype),
            _scale_from_bits(jnp.zeros(scale_shape(x.shape, fmt, axis), jnp.uint32), fmt))


def _quantize_reference(x, fmt: BlockFormat, axis: int, rounding: str, g):
    """(data, scale) by the reference rules, passed through an optimization barrier: the reference
    hands its results over as stored, so its consumers (a dequantize, the reference dot's
    ``data.astype(float32) * scale``) are not fused into its element loop. XLA:CPU of jaxlib 0.12
    fused an NVFP4 quantize's whole bit-level computation with such consumers into one loop, and
    LLVM's loop vectorizer never finished planning it (docs/design.md, "jaxlib 0.12 compile hang":
    no end after 25 min; 1.1 s with the barrier, as on jaxlib 0.10). The reference is the
    semantic definition, not a fast path: the boundary changes no bit and costs nothing that
    matters."""
    return lax.optimization_barrier(_quantize_reference_parts(x, fmt, axis, rounding, g))


def _quantize_reference_parts(x, fmt: BlockFormat, axis: int, rounding: str, g):
    if x.size == 0 and not fmt.per_tensor:
        return _quantize_empty(x, fmt, axis)
    bits = ref.to_f32_bits(x)
    if fmt.per_tensor:  # one block: the whole tensor (initial=0: an empty tensor gets scale 1)
        amax = jnp.max(bits & jnp.uint32(ref.F32_ABS_MASK), initial=np.uint32(0))
        codes, scale = ref.fp8_blockwise_quantize_blocks(bits, amax)
        return _codes_to_elements(codes, fmt.elem_dtype), _scale_from_bits(scale, fmt)
    g_bits = None if g is None else _broadcast_leading(lax.bitcast_convert_type(g, jnp.uint32), x.ndim)
    if len(fmt.block) == 2:
        blocked, mn = _blocked_2d(bits, fmt.block)
        amax = ref.abs_max_bits(blocked, (-3, -1))
        if g_bits is not None:
            g_bits = g_bits[..., None, None]
        codes, scale = _quantize_blocks(blocked, amax[..., :, None, :, None], fmt, rounding, g_bits)
        data = _unblock_2d(codes, mn)
    else:
        blocked, k = _blocked_1d(bits, fmt.block[0], axis)
        if g_bits is not None:
            g_bits = g_bits[..., None]
        amax = ref.abs_max_bits(blocked, -1)
        codes, scale = _quantize_blocks(blocked, amax[..., None], fmt, rounding, g_bits)
        scale = jnp.moveaxis(scale[..., 0], -1, axis)
        data = _unblock_1d(codes, k, axis)
    if len(fmt.block) == 2:
        scale = scale[..., :, 0, :, 0]
    return _codes_to_elements(data, fmt.elem_dtype), _scale_from_bits(scale, fmt)


def _scale_from_bits(scale_bits, fmt: BlockFormat):
    if fmt.scale_dtype == jnp.float32:
        return lax.bitcast_convert_type(scale_bits.astype(jnp.uint32), jnp.float32)
    return lax.bitcast_convert_type(scale_bits.astype(jnp.uint8), fmt.scale_dtype)


def _scale_to_bits(scale):
    if scale.dtype == jnp.float32:
        return lax.bitcast_convert_type(scale, jnp.uint32)
    return lax.bitcast_convert_type(scale, jnp.uint8).astype(jnp.uint32)


def _fp4_packed(backend: str, fmt: BlockFormat):
    """The handlers' fp4_packed attribute; only formats with float4 elements ask for (and so probe)
    the layout."""
    return np.int32(fmt.elem_dtype == jnp.dtype(jnp.float4_e2m1fn) and FP4_PACKED[backend])


def _ffi_global_scale(g):
    return jnp.ones((), jnp.float32) if g is None else g


def _quantize_ffi(x, fmt: BlockFormat, axis: int, rounding: str, g, backend: str):
    out = (jax.ShapeDtypeStruct(x.shape, fmt.elem_dtype),
           jax.ShapeDtypeStruct(scale_shape(x.shape, fmt, axis), fmt.scale_dtype))
    # broadcast_all puts vmap's batch dims first: the negative axis still names the same axis,
    # and the handler gives each leading index of the global scale its own value.
    return _ffi.ffi_call(QUANTIZE_TARGET, out, x, _ffi_global_scale(g), vmap_method="broadcast_all",
                         format=np.int32(fmt.code), axis=np.int64(axis),
                         scale_rounding=np.int32(_ROUNDING_CODES[rounding]), fp4_packed=_fp4_packed(backend, fmt))


# --------------------------------------------------------------------------- dequantize
_OUT_FORMATS = {jnp.dtype(jnp.float32): ref.F32, jnp.dtype(jnp.bfloat16): ref.BF16, jnp.dtype(jnp.float16): ref.F16}


def dequantize(q: BlockScaledArray, dtype=jnp.float32, *, backend: str = "auto"):
    """``data * scale (* global_scale)`` rounded once to ``dtype`` (float32, bfloat16, float16)."""
    if not isinstance(q, BlockScaledArray):
        raise TypeError(f"dequantize expects a jax_gpuext.BlockScaledArray, got {type(q).__name__}")
    dtype = float_dtype(dtype, INPUT_DTYPES, "dequantize", "dtype")
    q.check("dequantize")
    fmt = q.format
    problem = (fmt, q.data.shape, dtype, q.axis)  # ranked by the layout of q's blocks (verified.speed_key)
    sel = backends.select(DEQUANTIZE_OP, backend, problem=problem)
    _note_fp4_layout(sel, fmt)

    gs = () if q.global_scale is None else (jnp.asarray(q.global_scale),)

    def on(sel):
        def run(data, scale, *gs):
            parts = BlockScaledArray.tree_unflatten((fmt, q.axis), (data, scale, gs[0] if gs else None))
            if sel.chosen == "reference":
                return _dequantize_reference(parts, dtype)
            if sel.chosen == "xla":
                return jnp.zeros(data.shape, dtype) if data.size == 0 else formats_xla.dequantize(parts, dtype)
            out = jax.ShapeDtypeStruct(data.shape, dtype)
            g = _ffi_global_scale(parts.global_scale).astype(jnp.float32)
            return _ffi.ffi_call(DEQUANTIZE_TARGET, out, data, scale, g, vmap_method="broadcast_all",
                                 format=np.int32(fmt.code), axis=np.int64(q.axis),
                                 fp4_packed=_fp4_packed(sel.chosen, fmt))

        out = _differentiable_dequantize(run, fmt, q.axis, dtype)(q.data, q.scale, *gs)
        return export.mark_choice(out, sel, problem)

    return export.per_platform(sel, problem, on, (q.data, q.scale, *gs))


def _expand_scale(scale, fmt: BlockFormat, axis: int, shape):
    """Per-block values repeated to per-element, cropped to the logical shape."""
    if fmt.per_tensor:  # the scale's (batch) dims are the leading ones, not trailing as numpy aligns
        return jnp.broadcast_to(_broadcast_leading(scale, len(shape)), shape)
    if len(fmt.block) == 2:
        s = jnp.repeat(jnp.repeat(scale, fmt.block[0], axis=-2), fmt.block[1], axis=-1)
        return s[..., : shape[-2], : shape[-1]]
    s = jnp.repeat(scale, fmt.block[0], axis=axis)
    return lax.slice_in_dim(s, 0, shape[axis], axis=axis % len(shape))


def _dequantize_reference(q: BlockScaledArray, dtype):
    if q.data.size == 0:
        return jnp.zeros(q.data.shape, dtype)
    # The reference reads its operands as given: a fusion boundary, so that whatever computed them
    # (a reference quantize, which has its own barrier; any user code) is not fused into this
    # bit-level loop. XLA:CPU of jaxlib 0.12 hands LLVM such fused loops whose vectorization never
    # finishes (docs/design.md, "jaxlib 0.12 compile hang"). The reference is the semantic
    # definition, not a fast path: the boundary costs nothing that matters.
    data, scale, g = lax.optimization_barrier((q.data, q.scale, q.global_scale))
    q = BlockScaledArray(data, scale, g, q.format, q.axis)
    fmt, out = q.format, _OUT_FORMATS[dtype]
    codes = _elements_to_codes(q.data)
    scale = _expand_scale(_scale_to_bits(q.scale), fmt, q.axis, q.data.shape)
    if fmt.is_mx:
        y = ref.mx_dequantize_blocks(codes, scale, _REF_ELEMENTS[fmt.elem_dtype], out)
    elif fmt.has_global_scale:
        g_bits = _broadcast_leading(lax.bitcast_convert_type(q.global_scale.astype(jnp.float32), jnp.uint32),
                                    codes.ndim)
        y = ref.nvfp4_dequantize_blocks(codes, scale, g_bits, out)
    else:
        y = ref.fp8_blockwise_dequantize_blocks(codes, scale, out)
    if dtype == jnp.float32:
        return lax.bitcast_convert_type(y, jnp.float32)
    return lax.bitcast_convert_type(y.astype(jnp.uint16), dtype)


# --------------------------------------------------------------------------- Blackwell scale layout
def to_blackwell_scale_layout(scale):
    """[..., R, C] scales -> the 128x4-tiled layout of Blackwell block-scaled MMA (cuDNN F8_128x4,
    cuBLASLt VEC32_UE8M0 / VEC16_UE4M3): rows padded to 128, columns to 4 (padding is zero bits),
    each 128x4 tile stored as [4 (row groups of 32)] x [32] x [4] interleaved (REFERENCE section 3:
    [B, R/128, 4, 32, C/4, 4] transposed {0,1,4,3,2,5}). Returns [..., R_pad, C_pad] in that order."""
    *lead, r, c = scale.shape
    rp, cp = -(-r // 128) * 128, -(-c // 4) * 4
    s = jnp.pad(scale, [(0, 0)] * len(lead) + [(0, rp - r), (0, cp - c)])
    s = s.reshape(tuple(lead) + (rp // 128, 4, 32, cp // 4, 4))
    n = len(lead)
    perm = tuple(range(n)) + tuple(n + i for i in (0, 3, 2, 1, 4))
    return s.transpose(perm).reshape(tuple(lead) + (rp, cp))


def from_blackwell_scale_layout(tiled, shape):
    """Inverse of :func:`to_blackwell_scale_layout`; ``shape`` is the unpadded [..., R, C]."""
    *lead, rp, cp = tiled.shape
    r, c = shape[-2], shape[-1]
    if rp % 128 or cp % 4 or rp < r or cp < c:
        raise ValueError(f"tiled scales {tiled.shape} do not hold a 128x4-padded layout of {tuple(shape)}")
    s = tiled.reshape(tuple(lead) + (rp // 128, cp // 4, 32, 4, 4))
    n = len(lead)
    perm = tuple(range(n)) + tuple(n + i for i in (0, 3, 2, 1, 4))
    return s.transpose(perm).reshape(tuple(lead) + (rp, cp))[..., :r, :c]


# --------------------------------------------------------------------------- demo
def demo_steps():
    """One demo step per format: quantize, dequantize, error stats and the backend verdict."""
    from jax_gpuext.common.explain import explain

    def step(fmt):
        def run():
            x = jax.random.normal(jax.random.key(0), (256, 256), jnp.float32) * 3.0
            f = jax.jit(lambda v: quantize(v, fmt).dequantize(jnp.float32))
            y = f(x)
            err = jnp.abs(y - x)
            rel = float(jnp.linalg.norm(y - x) / jnp.linalg.norm(x))
            q = quantize(x, fmt)
            print(f"{fmt.name}: data {q.data.dtype}{list(q.data.shape)}, scale {q.scale.dtype}"
                  f"{list(q.scale.shape)}; max |err| {float(err.max()):.4g}, relative L2 error {rel:.3e}")
            print(explain(lambda v: quantize(v, fmt).dequantize(), x).table())
        return run

    return [(f"formats: quantize / dequantize {f.name}", step(f)) for f in FORMATS.values()]
