"""Memory spaces for the buffers of our custom calls, and ``place(x, space)``.

XLA:GPU (jaxlib >= 0.10.0) reads two frontend attributes on any custom call,
``operands_memory_spaces`` / ``results_memory_spaces`` = ``"{index:space,...}"``, and colours
those buffers: 0 default, 1 collective (ncclMemAlloc), 2 temp. Host memory (5) is rejected on
custom calls; host placement goes through JAX's memory kinds instead. JAX has no public API
for these attributes (``jax.ffi.ffi_call`` takes no extra attributes), so this module binds
its own primitive whose lowering is ``jax.ffi.ffi_lowering(..., extra_attributes=...)``.

Decisions (docs/design.md, "Memory spaces"):

- Requests are validated at trace time (``TypeError`` / ``ValueError``); the gate
  ``jaxlib_custom_call_memory_spaces`` is checked at trace time too: below it ``strict=True``
  raises ``UnsupportedError``, otherwise the annotation is dropped with a warning on logger
  ``jax_gpuext`` and a note in ``explain``.
- Whether a lowering carries the annotation is decided per *lowering* platform (one lowering
  rule per platform), never from the host's default backend: lowering ahead of time for CUDA
  on a CPU-only machine carries it; the CPU lowering never does (XLA:CPU has no such spaces),
  and there ``strict=True`` raises.
- TEMP (space 2) runs only where JAX's GPU client has an allocator for it: XLA adds one only when
  the process starts with ``XLA_FLAGS=--xla_gpu_temp_buffer_use_separate_color=true``; elsewhere
  the compiled program fails at every run ("No allocator found in MultiDeviceAdapter ... memory
  space 2", issue 33). Gate ``gpu_temp_memory_space`` asks the client itself (a probe program),
  at trace time on a CUDA machine: closed, ``strict=True`` raises and otherwise the TEMP requests
  are dropped loudly, like a closed jaxlib gate.
- openxla/xla#47461: dynamic-slice fusion wraps a custom call whose operand is a slice (or
  whose result feeds a dynamic-update-slice) into a fusion, and the colouring is lost. The CUDA
  lowering therefore puts every operand and result of an annotated call behind its own
  ``stablehlo.optimization_barrier``, which that fusion cannot look through. Set
  ``JAX_GPUEXT_MEMORY_SHIELD=0`` to lower without the barriers; ``DSF_WORKAROUND_OPTIONS`` are
  the ``jax.jit(..., compiler_options=...)`` that switch that fusion off instead.
"""

from __future__ import annotations

import enum
import functools
import logging
from typing import Any, Mapping, Sequence

import numpy as np

from jax_gpuext.common import backends, eager, env, gates
from jax_gpuext.common import extension as _ext
from jax_gpuext.common.errors import UnsupportedError, require_bool

logger = logging.getLogger("jax_gpuext")

GATE = "jaxlib_custom_call_memory_spaces"
# XLA:GPU compiles a buffer into space 2 (TEMP) whatever the client can allocate; the client has an
# allocator for it only when started with --xla_gpu_temp_buffer_use_separate_color=true (issue 33).
TEMP_GATE = "gpu_temp_memory_space"
TEMP_FLAG = "--xla_gpu_temp_buffer_use_separate_color=true"
OPERANDS_ATTR = "operands_memory_spaces"
RESULTS_ATTR = "results_memory_spaces"
SHIELD_ENV = "JAX_GPUEXT_MEMORY_SHIELD"
# The other workaround for openxla/xla#47461: no dynamic-slice fusion at all in this jit.
DSF_WORKAROUND_OPTIONS = {"xla_gpu_enable_dynamic_slice_fusion": False}
PLACE_TARGET = _ext.declare_target("gpuext_place", "place")


def _known_layout_dtypes() -> frozenset:
    """The element types whose bytes in an XLA buffer our handlers can size exactly: the list in
    ffi/common/ffi_util.h (ElementBits). Every whole-byte type, and the 2- and 4-bit types XLA packs
    (measured on CPU). Not float6_e2m3fn / float6_e3m2fn: the FFI headers we build against predate
    them, and gpuext_place copied a made-up number of bytes for them (issue 26)."""
    import ml_dtypes

    names = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
             "float32", "float64", "complex64", "complex128", "bfloat16", "float8_e5m2", "float8_e4m3",
             "float8_e4m3fn", "float8_e4m3b11fnuz", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e3m4",
             "float8_e8m0fnu", "int4", "uint4", "int2", "uint2", "float4_e2m1fn"]
    known = set()
    for name in names:
        try:
            known.add(np.dtype(getattr(ml_dtypes, name, name)))
        except TypeError:  # an ml_dtypes too old to have it: nobody can pass such an array
            pass
    return frozenset(known)


KNOWN_LAYOUT_DTYPES = _known_layout_dtypes()


class MemorySpace(enum.IntEnum):
    """Where XLA puts a buffer. The values are XLA's memory-space numbers."""

    DEVICE = 0  # ordinary device memory (XLA's default)
    COLLECTIVE = 1  # ncclMemAlloc'd, registrable as an NCCL window / peer-visible
    TEMP = 2  # XLA's temp-buffer space
    PINNED_HOST = 5  # page-locked host memory; only through memory kinds, not custom calls

    @classmethod
    def parse(cls, value) -> "MemorySpace":
        """Accepts a MemorySpace, its int value or its name ("collective")."""
        if isinstance(value, cls):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            try:
                return cls(int(value))
            except ValueError:
                raise ValueError(f"unknown memory space {int(value)}; valid: "
                                 f"{', '.join(f'{m.name}={m.value}' for m in cls)}") from None
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError(f"unknown memory space {value!r}; valid: {[m.name for m in cls]}") from None
        raise TypeError(f"memory space must be a jax_gpuext.MemorySpace, got {type(value).__name__}: {value!r}")


# Spaces XLA accepts in the custom-call attributes (xla/service/gpu/gpu_memory_space_assignment.cc).
CUSTOM_CALL_SPACES = (MemorySpace.DEVICE, MemorySpace.COLLECTIVE, MemorySpace.TEMP)


def format_spaces(spaces: Mapping[int, MemorySpace]) -> str:
    """The attribute value XLA parses: ``{0:1,2:2}``, indices ascending, no spaces."""
    return "{" + ",".join(f"{i}:{int(s)}" for i, s in sorted(spaces.items())) + "}"


# --------------------------------------------------------------------------- validation
def _normalize(spaces, count: int, what: str, op: str) -> dict[int, MemorySpace]:
    """index -> space with indices in [0, count); raises on anything XLA would reject."""
    if spaces is None:
        return {}
    if not isinstance(spaces, Mapping):
        raise TypeError(f"{op}: {what}_spaces must be a mapping index -> MemorySpace, "
                        f"got {type(spaces).__name__}")
    out: dict[int, MemorySpace] = {}
    for key, value in spaces.items():
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"{op}: {what}_spaces keys must be int {what} indices, got {key!r}")
        space = MemorySpace.parse(value)
        if not -count <= key < count:
            raise ValueError(f"{op}: {what}_spaces index {key} is out of range for {count} {what}(s)")
        if space not in CUSTOM_CALL_SPACES:
            raise ValueError(
                f"{op}: {what} {key} requests {space.name}, which XLA rejects on custom calls "
                f"(valid: {', '.join(s.name for s in CUSTOM_CALL_SPACES)}); move arrays to host "
                "memory with jax_gpuext.place(x, MemorySpace.PINNED_HOST) instead")
        idx = int(key) % count
        if idx in out and out[idx] != space:
            raise ValueError(f"{op}: conflicting requests for {what} {idx}: {out[idx].name} and {space.name}")
        out[idx] = space
    return out


def _reconcile_aliases(ops: dict, res: dict, aliases: Mapping[int, int], op: str) -> None:
    """An aliased operand/result pair is one buffer, so it has one space: copy a request to
    the other side, and reject two different ones (XLA would colour one buffer twice)."""
    for i, j in aliases.items():
        a, b = ops.get(i), res.get(j)
        if a is not None and b is not None and a != b:
            raise ValueError(f"{op}: operand {i} aliases result {j} but they request different "
                             f"memory spaces ({a.name} vs {b.name})")
        if a is not None:
            res[j] = a
        elif b is not None:
            ops[i] = b


def _drop_default(spaces: dict) -> tuple[tuple[int, int], ...]:
    # DEVICE is XLA's default: leaving it out keeps the attribute minimal (and absent when empty).
    return tuple((i, int(s)) for i, s in sorted(spaces.items()) if s != MemorySpace.DEVICE)


_warned: set[tuple] = set()


def _warn_once(key: tuple, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def _describe(operand_spaces, result_spaces) -> str:
    parts = []
    if operand_spaces:
        parts.append(f"{OPERANDS_ATTR}={format_spaces(dict(operand_spaces))}")
    if result_spaces:
        parts.append(f"{RESULTS_ATTR}={format_spaces(dict(result_spaces))}")
    return ", ".join(parts)


def _gate_allows(op: str, operand_spaces, result_spaces, strict: bool, selection) -> bool:
    """Trace-time gate check. False: the annotation is dropped (loudly)."""
    if not operand_spaces and not result_spaces:
        return True
    r = gates.check(GATE)
    if r.supported:
        return True
    desc = _describe(operand_spaces, result_spaces)
    if strict:
        raise UnsupportedError(f"{op}: memory-space annotation {desc} needs gate {GATE!r}", gate=GATE,
                               reason=r.reason)
    msg = f"memory-space annotation {desc} ignored: gate {GATE}: {r.reason}"
    _warn_once((op, "gate", desc), f"{op}: {msg}")
    if selection is not None:
        backends.note(selection, msg)
    return False


def _temp_refusal() -> str | None:
    """Why this process's GPU client cannot run a buffer in TEMP memory, or None: it can, or this
    process has no GPU client to ask (lowering ahead of time, or explain(platform="cuda"), on a
    host without a GPU keeps the request: the machine that runs it is not known here)."""
    if not gates.check("cuda_device").supported:
        return None
    r = gates.check(TEMP_GATE)
    return None if r.supported else f"gate {TEMP_GATE}: {r.reason}"


def _temp_allowed(op: str, operand_spaces, result_spaces, strict: bool, selection):
    """Trace-time check of TEMP requests against JAX's GPU client (gate ``gpu_temp_memory_space``),
    where the trace is for CUDA (backends.current_platform()) on a machine with a GPU: that client
    runs the program. Closed: strict raises UnsupportedError; otherwise the TEMP entries are
    dropped (the others stay) with a warning and an explain note; values are unchanged."""
    temp = int(MemorySpace.TEMP)
    if not any(sp == temp for _, sp in (*operand_spaces, *result_spaces)) or backends.current_platform() != "cuda":
        return operand_spaces, result_spaces
    why = _temp_refusal()
    if why is None:
        return operand_spaces, result_spaces
    desc = _describe(operand_spaces, result_spaces)
    if strict:
        raise UnsupportedError(f"{op}: memory-space annotation {desc} asks for TEMP memory, which this GPU "
                               f"client cannot allocate", gate=TEMP_GATE, reason=why)
    msg = f"TEMP requests of {desc} dropped (the program would fail at run time): {why}"
    _warn_once((op, "temp", desc), f"{op}: {msg}")
    if selection is not None:
        backends.note(selection, msg)
    keep = lambda spaces: tuple((i, sp) for i, sp in spaces if sp != temp)  # noqa: E731
    return keep(operand_spaces), keep(result_spaces)


def allowed_spaces(op: str, operand_spaces, result_spaces, strict: bool, selection=None):
    """The (operand, result) space requests, as ``((index, int space), ...)`` without DEVICE, that
    this trace may put on a custom call: both trace-time gates applied (``_gate_allows``: all or
    nothing; ``_temp_allowed``: TEMP entries)."""
    if not _gate_allows(op, operand_spaces, result_spaces, strict, selection):
        return (), ()
    return _temp_allowed(op, operand_spaces, result_spaces, strict, selection)


def probe_space(space) -> str | None:
    """Compiles and runs a copy into ``space`` (gpuext_place) on the first CUDA device, now, even
    while another function is being traced. None when it ran and copied exactly, else why not
    (the error's text: XLA reports a space without an allocator only when the program runs).
    DEVICE copies without an annotation (a check of the probe itself)."""
    import jax

    space = MemorySpace.parse(space)
    try:
        dev = jax.devices("cuda")[0]
    except RuntimeError as e:  # no CUDA client in this process (a simulated GPU, or lowering only)
        return f"{type(e).__name__}: {e}"
    x = np.arange(64, dtype=np.float32)
    avals = ((x.shape, x.dtype),)
    _ext.ensure_all_registered()

    requested = () if space == MemorySpace.DEVICE else ((0, int(space)),)  # DEVICE: a plain copy

    def copy(v):  # the primitive itself: ffi_call would consult the gate that is asking
        return _primitive().bind(v, target=PLACE_TARGET, result_avals=avals, operand_spaces=(),
                                 result_spaces=requested, aliases=(), has_side_effect=False,
                                 strict=True, attributes=(), vmap_method="broadcast_all",
                                 op=f"probe of {space.name} memory")[0]

    try:
        with jax.ensure_compile_time_eval():
            sharding = jax.sharding.SingleDeviceSharding(dev)
            compiled = jax.jit(copy).lower(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)).compile()
            y = np.asarray(compiled(jax.device_put(x, dev)))
    except Exception as e:  # noqa: BLE001 - the reason is the answer
        return f"{type(e).__name__}: {e}"
    return None if np.array_equal(y, x) else f"the copy into {space.name} memory returned other values"


# --------------------------------------------------------------------------- primitive
class _Attr:
    """Makes a numpy array attribute hashable, as primitive parameters must be."""

    def __init__(self, value: np.ndarray):
        self.value = value

    def __hash__(self):
        return hash((self.value.dtype.str, self.value.shape, self.value.tobytes()))

    def __eq__(self, other):
        return isinstance(other, _Attr) and np.array_equal(self.value, other.value) \
            and self.value.dtype == other.value.dtype


@functools.cache
def _primitive():
    """Created on first use so that importing jax_gpuext stays cheap."""
    import jax
    from jax.core import ShapedArray
    from jax.extend.core import Primitive
    from jax.interpreters import batching, mlir

    p = Primitive("gpuext_memory_space_call")
    p.multiple_results = True
    p.def_impl(eager.primitive_impl(p))  # eager calls: one compile per parameters and shapes
    p.def_abstract_eval(lambda *args, result_avals, **_: [ShapedArray(s, d) for s, d in result_avals])
    # Default rule (cpu, rocm, tpu, ...): no memory spaces; CUDA: annotate. JAX picks the rule
    # by the platform being lowered for, so AOT lowering for CUDA on a CPU host annotates.
    mlir.register_lowering(p, functools.partial(_lower, None))
    mlir.register_lowering(p, functools.partial(_lower, "cuda"), platform="cuda")
    batching.primitive_batchers[p] = functools.partial(_batch, p)
    del jax
    return p


def _shield_enabled() -> bool:
    return env.get(SHIELD_ENV)


def _barrier(value):
    """One stablehlo.optimization_barrier around ``value`` (see module docstring, #47461)."""
    from jax.interpreters.mlir import ir

    op = ir.Operation.create("stablehlo.optimization_barrier", results=[value.type], operands=[value])
    return op.results[0]


def _lower(platform, ctx, *args, target, result_avals, operand_spaces, result_spaces, aliases,
           has_side_effect, strict, attributes, vmap_method, op):
    import jax
    from jax.interpreters.mlir import ir

    del result_avals, vmap_method
    annotated = bool(operand_spaces or result_spaces)
    extra, shield = {}, False
    if annotated and platform == "cuda":
        fa = {}
        if operand_spaces:
            fa[OPERANDS_ATTR] = ir.StringAttr.get(format_spaces(dict(operand_spaces)))
        if result_spaces:
            fa[RESULTS_ATTR] = ir.StringAttr.get(format_spaces(dict(result_spaces)))
        extra["mhlo.frontend_attributes"] = ir.DictAttr.get(fa)
        shield = _shield_enabled()
    elif annotated:
        # ctx.platforms narrows module_context.platforms inside a multi-platform lowering.
        lowered_for = "/".join(getattr(ctx, "platforms", None) or ctx.module_context.platforms)
        desc = _describe(operand_spaces, result_spaces)
        if strict:
            raise UnsupportedError(f"{op}: memory-space annotation {desc} cannot be honoured when "
                                   f"lowering for {lowered_for}", reason="only the CUDA lowering carries "
                                   "custom-call memory spaces (XLA:CPU has none)")
        _warn_once((op, "platform", str(lowered_for), desc),
                   f"{op}: memory-space annotation {desc} not applied when lowering for {lowered_for} "
                   "(only CUDA has collective/temp memory); values are unchanged")
    if shield:
        args = [_barrier(a) for a in args]
    rule = jax.ffi.ffi_lowering(
        target, has_side_effect=has_side_effect,
        operand_output_aliases=dict(aliases) or None, extra_attributes=extra or None)
    kwargs = {k: (v.value if isinstance(v, _Attr) else v) for k, v in attributes}
    results = list(rule(ctx, *args, **kwargs))
    if shield:
        results = [_barrier(r) for r in results]
    return results


def _batch(p, args, dims, *, vmap_method, **params):
    import jax
    import jax.numpy as jnp

    # JAX marks unbatched operands with dimension None (batching.not_mapped, not public).
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    op = params["op"]
    if vmap_method is None:
        raise ValueError(f"{op}: this call does not support vmap (vmap_method=None)")
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    if vmap_method == "broadcast_all":
        # Elementwise-like targets: one call on the batched shapes (the batch is just more data).
        full = [a if d is not None else jnp.broadcast_to(a, (size,) + a.shape)
                for a, d in zip(moved, dims)]
        avals = tuple(((size,) + tuple(s), dt) for s, dt in params["result_avals"])
        outs = p.bind(*full, vmap_method=vmap_method, **{**params, "result_avals": avals})
        return outs, [0] * len(outs)
    # "sequential": one call per batch element, in a loop XLA keeps on device.
    batched = [i for i, d in enumerate(dims) if d is not None]

    def body(xs):
        full = list(moved)
        for i, x in zip(batched, xs):
            full[i] = x
        return tuple(p.bind(*full, vmap_method=vmap_method, **params))

    outs = jax.lax.map(body, tuple(moved[i] for i in batched))
    return list(outs), [0] * len(outs)


# --------------------------------------------------------------------------- the helper
VMAP_METHODS = ("sequential", "broadcast_all", None)


def ffi_call(
    target: str,
    result_shape_dtypes,
    *args,
    operand_spaces: Mapping[int, MemorySpace] | None = None,
    result_spaces: Mapping[int, MemorySpace] | None = None,
    strict: bool = False,
    input_output_aliases: Mapping[int, int] | None = None,
    has_side_effect: bool = False,
    vmap_method: str | None = "sequential",
    selection: backends.Selection | None = None,
    caller: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    **attrs: Any,
):
    """Calls our FFI target ``target`` with its buffers placed in memory spaces.

    Like ``jax.ffi.ffi_call(target, result_shape_dtypes, ...)(*args, **attributes)``, plus:

    - ``operand_spaces`` / ``result_spaces``: ``{index: MemorySpace}`` for operands / results
      (negative indices count from the end). DEVICE, COLLECTIVE and TEMP are allowed;
      PINNED_HOST raises ValueError (XLA rejects it on custom calls).
    - ``input_output_aliases``: ``{operand: result}`` as in ``jax.ffi.ffi_call``. An aliased
      pair is one buffer: a space requested on one side applies to both, different spaces on
      the two sides raise ValueError.
    - ``strict``: raise UnsupportedError instead of warning when the annotation cannot be
      honoured (jaxlib below the gate at trace time; TEMP on a GPU client without an allocator
      for it, gate ``gpu_temp_memory_space``, at trace time; a non-CUDA platform at lowering time).
    - ``selection``: the caller's ``backends.select`` result; decisions about the annotation
      are attached to it as notes, so ``explain`` shows them. ``caller`` names the op in
      messages (default: the selection's op, else ``target``).
    - ``vmap_method``: "sequential" (default), "broadcast_all" or None (vmap raises).

    Attributes are passed to the handler as in ``jax.ffi.ffi_call`` (Python/NumPy scalars,
    strings, NumPy arrays), as keywords or, for names this function's own keywords take
    (``strict``, ``caller``, ...), in the ``attributes`` mapping; a name given both ways raises.
    Returns one array when ``result_shape_dtypes`` is a single shape/dtype, else a list.
    Validation errors are raised at trace time.
    """
    import jax

    op = caller or (selection.op if selection is not None else target)
    strict = require_bool(strict, op, "strict")
    has_side_effect = require_bool(has_side_effect, op, "has_side_effect")
    single = hasattr(result_shape_dtypes, "shape") and hasattr(result_shape_dtypes, "dtype")
    results = [result_shape_dtypes] if single else list(result_shape_dtypes)
    for i, r in enumerate(results):
        if not (hasattr(r, "shape") and hasattr(r, "dtype")):
            raise TypeError(f"{op}: result_shape_dtypes[{i}] has no shape/dtype: {r!r}")
    if vmap_method not in VMAP_METHODS:
        raise ValueError(f"{op}: vmap_method must be one of {VMAP_METHODS}, got {vmap_method!r}")
    args = [jax.numpy.asarray(a) for a in args]
    ops = _normalize(operand_spaces, len(args), "operand", op)
    res = _normalize(result_spaces, len(results), "result", op)
    aliases = {}
    for i, j in (input_output_aliases or {}).items():
        if not (0 <= i < len(args) and 0 <= j < len(results)):
            raise ValueError(f"{op}: input_output_aliases {{{i}: {j}}} out of range "
                             f"({len(args)} operands, {len(results)} results)")
        if (args[i].shape, args[i].dtype) != (tuple(results[j].shape), np.dtype(results[j].dtype)):
            raise ValueError(f"{op}: operand {i} {args[i].dtype}{list(args[i].shape)} cannot alias "
                             f"result {j} {np.dtype(results[j].dtype)}{list(results[j].shape)}")
        aliases[int(i)] = int(j)
    _reconcile_aliases(ops, res, aliases, op)
    op_spaces, res_spaces = allowed_spaces(op, _drop_default(ops), _drop_default(res), strict, selection)
    if (op_spaces or res_spaces) and selection is not None and selection.platform != "cuda":
        backends.note(selection, f"{_describe(op_spaces, res_spaces)} is carried only by the CUDA "
                                 f"lowering; the {selection.platform} lowering omits it"
                                 + (" (strict: lowering raises)" if strict else ""))
    elif op_spaces or res_spaces:
        if selection is not None:
            backends.note(selection, f"CUDA lowering carries {_describe(op_spaces, res_spaces)}")

    both = sorted(set(attrs) & set(attributes or {}))
    if both:
        raise ValueError(f"{op}: attribute(s) {both} given both as keywords and in `attributes`")
    handler_attrs = {**attrs, **(attributes or {})}
    _ext.ensure_all_registered()
    attr_items = tuple(sorted((k, _Attr(v) if isinstance(v, np.ndarray) else v) for k, v in handler_attrs.items()))
    outs = _primitive().bind(
        *args, target=target,
        result_avals=tuple((tuple(r.shape), np.dtype(r.dtype)) for r in results),
        operand_spaces=op_spaces, result_spaces=res_spaces, aliases=tuple(sorted(aliases.items())),
        has_side_effect=bool(has_side_effect), strict=bool(strict), attributes=attr_items,
        vmap_method=vmap_method, op=op)
    return outs[0] if single else list(outs)


# --------------------------------------------------------------------------- place
def _is_host(space) -> gates.GateResult:
    ok = space in (MemorySpace.PINNED_HOST, MemorySpace.DEVICE)
    return gates.GateResult(ok, f"{space.name} {'is' if ok else 'is not'} a JAX memory kind")


def _is_custom_call_space(space) -> gates.GateResult:
    ok = space in (MemorySpace.COLLECTIVE, MemorySpace.TEMP)
    why = _temp_refusal() if ok and space == MemorySpace.TEMP else None  # (this backend runs on cuda only)
    if why is not None:
        return gates.GateResult(False, why)
    return gates.GateResult(ok, f"{space.name} {'is' if ok else 'is not'} a custom-call memory space")


def _not_host(space) -> gates.GateResult:
    ok = space != MemorySpace.PINNED_HOST
    return gates.GateResult(ok, "host placement needs memory kinds" if not ok else "any device space")


# Preference order matters for the fallback flag: "auto" only chooses between custom_call and
# identity (COLLECTIVE / TEMP); host and device placement name memory_kind explicitly, so a
# request for collective memory never counts as "falling back" past the memory-kind path.
backends.register("place", backends.Backend(
    "custom_call", ("cuda",), (GATE,),
    f"identity custom call {PLACE_TARGET} whose result carries {RESULTS_ATTR}", _is_custom_call_space,
    takes="COLLECTIVE and TEMP"))
backends.register("place", backends.Backend(
    "identity", ("cpu", "cuda"), (),
    f"identity custom call {PLACE_TARGET}; values unchanged, no memory space on this platform",
    _not_host, takes="every space but PINNED_HOST"))
backends.register("place", backends.Backend(
    "memory_kind", ("cpu", "cuda"), ("jax_memory_space_api",),
    "jax.device_put to a JAX memory kind (pinned_host / device) inside jit", _is_host,
    takes="PINNED_HOST and DEVICE"))
# Issue 16: what auto takes on CUDA while the gpuext_place handler is not verified on this GPU
# (jax_gpuext.common.verified): no custom call, so no memory space; logged and shown by explain.
backends.register("place", backends.Backend(
    "xla", ("cpu", "cuda"), (), "no custom call: x returned unchanged, the memory space is not applied",
    _not_host, takes="every space but PINNED_HOST (placement not applied)"))


def place(x, space, *, strict: bool = False, backend: str = "auto"):
    """Returns ``x`` placed in memory ``space`` (use inside ``jax.jit``).

    COLLECTIVE / TEMP: an identity custom call (``gpuext_place``) whose result buffer XLA
    allocates in that space; on CUDA the handler copies once into it. PINNED_HOST / DEVICE:
    ``jax.device_put`` to the memory kind. Differentiable (the tangent passes through) and
    vmappable. On CPU, COLLECTIVE / TEMP pass values through unchanged with a warning;
    ``strict=True`` raises UnsupportedError wherever the placement cannot be honoured.
    """
    import jax

    strict = require_bool(strict, "place", "strict")
    space = MemorySpace.parse(space)
    if space in (MemorySpace.COLLECTIVE, MemorySpace.TEMP):
        _check_copyable(x, space)
    if backend == "auto" and space == MemorySpace.PINNED_HOST:
        backend = "memory_kind"  # the only way to host memory; raises with the gate's reason
    elif backend == "auto" and space == MemorySpace.DEVICE:
        backend = "memory_kind" if gates.check("jax_memory_space_api") else "xla"  # unchanged either way
    sel = backends.select("place", backend, problem=space)
    if sel.chosen == "memory_kind":
        target = jax.memory.Space.Host if space == MemorySpace.PINNED_HOST else jax.memory.Space.Device
        return jax.device_put(x, target)
    if space == MemorySpace.DEVICE:
        backends.note(sel, "DEVICE is where arrays already live: returned unchanged")
        return x
    if strict and sel.chosen != "custom_call" and sel.platform == "cuda":
        raise UnsupportedError(f"place: {space.name} placement cannot be honoured on cuda",
                               reason="; ".join(f"{n}: {w}" for n, w in sel.rejected))
    if sel.chosen == "xla":
        why = f"{space.name} placement not applied: x returned unchanged (no custom call)"
        backends.note(sel, why)
        _warn_once(("place", "xla", space.name), f"place: {why}")
        return x
    return _place_call(jax.numpy.asarray(x), int(space), bool(strict), sel)


def _check_copyable(x, space) -> None:
    """COLLECTIVE / TEMP placement is a byte copy by gpuext_place: refused, on every backend (so a
    call means the same whichever runs), for an element type the handler cannot size exactly."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    try:
        dtype = np.dtype(dtype)
    except TypeError:  # extended dtypes (PRNG keys)
        raise TypeError(f"place: {dtype} arrays cannot be placed in {space.name} memory: gpuext_place copies "
                        "plain element types") from None
    if dtype not in KNOWN_LAYOUT_DTYPES:
        raise TypeError(f"place: dtype {dtype.name} cannot be placed in {space.name} memory: gpuext_place copies "
                        f"bytes and cannot size {dtype.name} buffers exactly (XLA's layout for it is unknown to "
                        f"our handlers); supported: {sorted(d.name for d in KNOWN_LAYOUT_DTYPES)}")


def _place_call(x, space: int, strict: bool, sel):
    import jax

    @jax.custom_jvp
    def call(x):
        return ffi_call(PLACE_TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                        result_spaces={0: MemorySpace(space)}, strict=strict,
                        vmap_method="broadcast_all", selection=sel, caller="place")

    # Placement does not change values, so the tangent passes through (in default memory).
    call.defjvp(lambda primals, tangents: (call(*primals), tangents[0]))
    return call(x)


# --------------------------------------------------------------------------- demo
def _demo_place():
    import jax
    import jax.numpy as jnp

    from jax_gpuext.common.explain import explain

    x = jnp.arange(8, dtype=jnp.float32)
    f = jax.jit(lambda x: place(x * 2, MemorySpace.COLLECTIVE))
    y = f(x)
    print("values unchanged:", bool(jnp.array_equal(y, x * 2)), "on", backends.current_platform())
    text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    line = next(l.strip() for l in text.splitlines() if PLACE_TARGET in l)
    print("CUDA lowering (ahead of time):", line[:160] + ("..." if len(line) > 160 else ""))
    print(explain(lambda x: place(x * 2, MemorySpace.COLLECTIVE), x).table())


def demo_steps():
    return [("memory spaces: place(x, COLLECTIVE)", _demo_place)]


# The gate `gpu_temp_memory_space` (common/gates.py) runs this probe; common/ may not import memory/.
gates.set_probe("temp_memory_space", lambda: probe_space(MemorySpace.TEMP))
