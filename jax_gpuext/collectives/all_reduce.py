"""``all_reduce``: a low-latency all-reduce for ``shard_map`` / ``pmap`` that never hangs silently.

Backends of op ``"all_reduce"`` (``jax_gpuext.backends``), in preference order:

- ``one_shot`` / ``two_shot``: our kernels. On CUDA they run over NVSHMEM (module
  ``jax_gpuext._nvshmem``, one GPU per process); on CPU the same protocols run between XLA's
  host devices over a process-local heap -- a test vehicle for the protocol, used only when
  asked for by name. ``auto`` picks one_shot or two_shot by message size
  (``one_shot_max_bytes``, docs/allreduce_model.md).
- ``nvshmem_library``: ``nvshmemx_<T>_<op>_reduce_on_stream`` (CUDA), a baseline.
- ``xla`` / ``reference``: ``lax.psum`` & co. What ``auto`` falls back to, visibly, wherever
  NVSHMEM cannot run.

Numerics (the same bits on every backend for exactly representable sums): contributions are
combined in rank order; float16/bfloat16/float8 accumulate in float32 and are rounded once (the xla
backend upcasts the same way); integers wrap; a float sum is -0.0 exactly when every contribution
is -0.0 (IEEE addition without an injected +0); float max/min are IEEE 754-2019 maximum/minimum
(NaN wins, -0.0 < +0.0) like ``jnp.maximum`` / ``jnp.minimum``.

Axes bound by ``vmap`` are reduced over the batch dimension like ``lax.psum`` reduces them, on
every backend; the kernels then run over the remaining device axes (none: no kernel at all), so a
call never waits for peers that cannot exist.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import numbers
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext.common import backends, env, gates
from jax_gpuext.common import extension as _ext
from jax_gpuext.common.errors import UnsupportedError, require_bool
from jax_gpuext.common.gates import GateResult

logger = logging.getLogger("jax_gpuext")
OP = "all_reduce"
TARGET = _ext.declare_target("gpuext_all_reduce", "all_reduce")
# The command-buffer compatible CUDA variant (ffi/cuda/allreduce.cc): kernels only, the
# timeout status stays sticky in device memory and is read by distributed.check_status().
GRAPH_TARGET = _ext.declare_target("gpuext_all_reduce_graph", "all_reduce")
GRAPH_SAFE_ENV = "JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE"

# Attribute codes shared with csrc/allreduce/reduce_ops.h.
OPS = {"sum": 0, "max": 1, "min": 2, "prod": 3, "and": 4, "or": 5}
ALGORITHM_CODES = {"one_shot": 1, "two_shot": 2, "nvshmem_library": 3}
ALGORITHMS = ("auto", "one_shot", "two_shot", "nvshmem_library", "xla", "reference")

TIMEOUT_ENV = "JAX_GPUEXT_ALLREDUCE_TIMEOUT_S"
WORKSPACE_ENV = "JAX_GPUEXT_ALLREDUCE_WORKSPACE_BYTES"
ONE_SHOT_MAX_ENV = "JAX_GPUEXT_ALLREDUCE_ONE_SHOT_MAX_BYTES"
DEFAULT_TIMEOUT_S = 30.0
# Accepted timeouts, at trace time and in the handlers (ffi/common/allreduce_attrs.h): finite and at
# most 1e6 s, so a missing peer cannot hang a process; at least 1 ms, because below that healthy
# calls fail while their peers are merely being scheduled (and 1e-46 rounded to 0 in float32).
TIMEOUT_RANGE_S = (1e-3, 1e6)
# CPU: per rank and per call site (the CPU heap is per site). GPU: the one symmetric
# workspace that jax_gpuext.distributed.initialize allocates (its own default).
DEFAULT_CPU_WORKSPACE_BYTES = 1 << 20

_NARROW_FLOATS = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
SUPPORTED_DTYPES = tuple(np.dtype(d) for d in (
    "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64", "bool")) + tuple(
    jnp.dtype(d) for d in _NARROW_FLOATS)
# nvshmemx_*_reduce_on_stream has no float8 and no bool type; bitwise and/or are integer-only.
_LIBRARY_DTYPES = tuple(jnp.dtype(d) for d in (
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "uint32", "int64", "uint64"))

_sites = itertools.count(1)


# --------------------------------------------------------------------------- model
def one_shot_max_bytes(group_size: int) -> int:
    """Largest message (bytes) for which ``auto`` picks one_shot over two_shot.

    From the alpha-beta model in docs/allreduce_model.md: one_shot moves (n-1)*S bytes out of
    each GPU in one step, two_shot 2*(n-1)/n*S in two steps, so two_shot wins once the extra
    synchronisation (alpha ~ 2.5 us) costs less than the bytes saved:
    S* = alpha * B / ((n-1) * (1 - 2/n)). With B = 450 GB/s (NVLink4 per direction) and n = 8
    that is about 190 KB; we round to 256 KiB for 8 GPUs. ``JAX_GPUEXT_ALLREDUCE_ONE_SHOT_MAX_BYTES``
    overrides it (to be refitted from the GPU measurements).
    """
    override = env.get(ONE_SHOT_MAX_ENV)
    if override is not None:
        return override
    if group_size <= 2:  # two_shot saves nothing for two ranks: same bytes, one more step
        return 1 << 62
    alpha_s, bandwidth = 2.5e-6, 450e9
    s = alpha_s * bandwidth / ((group_size - 1) * (1 - 2 / group_size))
    return 1 << max(12, round(math.log2(s)))


# --------------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class _Config:
    axes: tuple
    sizes: tuple  # the size of each axis in ``axes``
    op: str
    backend: str  # the chosen backend's name
    timeout_s: float
    # Memory spaces of x / the result as sorted ((index, MemorySpace), ...): hashable, since the
    # config is a static argument of the custom_jvp.
    operand_spaces: tuple = ()
    result_spaces: tuple = ()
    strict_spaces: bool = False


def _default_timeout() -> float:
    return env.get(TIMEOUT_ENV)  # DEFAULT_TIMEOUT_S when unset; range-checked there


def _workspace_bytes(platform: str) -> int:
    if platform == "cuda":
        from jax_gpuext.collectives import distributed

        return distributed.workspace_bytes()  # refuses a value below the CUDA minimum, by name
    value = env.get(WORKSPACE_ENV)
    return DEFAULT_CPU_WORKSPACE_BYTES if value is None else value


def _check_cpu_workspace(workspace: int, backend: str, group_size: int, dtype) -> None:
    """The CPU protocol's workspace must hold one element per rank (csrc/allreduce ChunkElements:
    one_shot n slots, two_shot 2n segments). Too small a $JAX_GPUEXT_ALLREDUCE_WORKSPACE_BYTES
    failed inside the handler at run time; it is refused here, at trace time, naming the variable.
    The default (1 MiB) holds 2 x 4096 ranks x 8 bytes, the handler's largest group."""
    need = (2 if backend == "two_shot" else 1) * group_size * np.dtype(dtype).itemsize
    if workspace < need:
        raise env.EnvironmentVariableError(
            WORKSPACE_ENV, env.raw(WORKSPACE_ENV) or str(workspace),
            f"at least {need} bytes for this call ({backend} over {group_size} ranks of {np.dtype(dtype).name}: "
            "one element per rank" + (", twice" if backend == "two_shot" else "") + ")")


def _graph_safe(environ=None) -> bool:
    return env.get(GRAPH_SAFE_ENV, environ)


@dataclasses.dataclass(frozen=True)
class Problem:
    """What the backends' ``supports`` checks see."""

    platform: str
    dtype: np.dtype
    op: str
    nbytes: int
    group_size: int
    auto: bool


# --------------------------------------------------------------------------- backends
_SCHEDULING_MODE_FLAG = re.compile(r"-{1,2}xla_gpu_command_buffer_scheduling_mode=(\w+)")


def command_buffer_ordering(env=None) -> GateResult:
    """Whether consecutive kernel calls in one program keep their order on the GPU.

    The kernels share one epoch, arrival counters and slots (the symmetric workspace, which XLA does
    not see), so two calls must never run at once. Only the command-buffer target
    (``JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE=1``) is captured by XLA; under
    ``--xla_gpu_command_buffer_scheduling_mode=CONCURRENT`` XLA orders captured commands by their
    XLA buffers alone (CommandExecutor::SynchronizationMode::kConcurrent), so two all-reduces
    with no data dependency between them may interleave. LHS (the default) and SERIALIZE keep the
    schedule's order. Read from XLA_FLAGS at trace time; a per-jit ``compiler_options`` value is
    not visible here (docs/design.md)."""
    import os

    environ = os.environ if env is None else env
    if not _graph_safe(environ):
        return GateResult(True, "the checked target is not captured into command buffers: calls run in order")
    modes = _SCHEDULING_MODE_FLAG.findall(environ.get("XLA_FLAGS", ""))
    mode = modes[-1].upper() if modes else "LHS (default)"
    if mode == "CONCURRENT":
        return GateResult(False, "XLA_FLAGS sets --xla_gpu_command_buffer_scheduling_mode=CONCURRENT with "
                                 f"{GRAPH_SAFE_ENV}=1: captured all-reduces with no data dependency could run at "
                                 "once and corrupt each other's epoch, counters and slots; use LHS (the default) "
                                 f"or SERIALIZE, or unset {GRAPH_SAFE_ENV}")
    return GateResult(True, f"command-buffer scheduling mode {mode} keeps the calls in schedule order")


def _cuda_kernel_checks(p: Problem) -> GateResult:
    r = gates.check_all(["cuda_extension", "cuda_device", "nvshmem", "nvshmem_allreduce_module"])
    if not r.supported:
        return r
    r = command_buffer_ordering()
    if not r.supported:
        return r
    local = jax.local_device_count()
    if local != 1:
        return GateResult(False, f"this process drives {local} GPUs; NVSHMEM needs one GPU per process "
                                 "(launch one process per GPU with jax.distributed)")
    if p.group_size != jax.process_count():
        return GateResult(False, f"the group ({p.group_size} devices) must span all {jax.process_count()} "
                                 "processes: sub-group all-reduce needs NVSHMEM teams (not implemented)")
    return GateResult(True, "NVSHMEM, one GPU per process, group spans every process")


_KERNEL_TAKES = ("CUDA: NVSHMEM with one GPU per process and a group spanning every process; CPU: when asked "
                 "by name (the protocol emulated between host devices)")


def _one_shot_fits(p: Problem) -> GateResult:
    """auto on CUDA: one_shot up to the modelled crossover, two_shot above (docs/allreduce_model.md)."""
    if p.platform != "cuda":
        return GateResult(True, "")
    limit = one_shot_max_bytes(p.group_size)
    if p.nbytes > limit:
        return GateResult(False, f"{p.nbytes} B > one-shot limit {limit} B for {p.group_size} GPUs: two_shot "
                                 "is faster there (docs/allreduce_model.md)")
    return GateResult(True, f"{p.nbytes} B <= one-shot limit {limit} B")


def _kernel_supports(p: Problem) -> GateResult:
    if p.platform == "cpu":
        r = gates.check("cpu_extension")
        if not r.supported:
            return r
        if p.auto:
            return GateResult(False, "auto uses XLA's all-reduce on CPU; the CPU one_shot/two_shot handlers "
                                     "emulate the NVSHMEM protocol between host devices for tests (ask by name)")
        return GateResult(True, "CPU protocol handler (process-local heap)")
    return _cuda_kernel_checks(p)


def library_refusal(dtype, op: str) -> str | None:
    """Why ``nvshmem_library`` refuses ``(dtype, op)`` whatever the machine, or None if it takes it.
    The one predicate: the backend's ``supports()`` and the GPU all-reduce check
    (scripts/allreduce_mps_worker.py, which expects exactly these refusals) both ask it."""
    dtype = jnp.dtype(dtype)
    if dtype not in _LIBRARY_DTYPES:
        return f"nvshmemx reductions have no {dtype} type"
    if op in ("and", "or") and jnp.issubdtype(dtype, jnp.floating):
        return "nvshmem and/or reductions are integer-only"
    if op in ("max", "min") and jnp.issubdtype(dtype, jnp.floating):
        # all_reduce's max/min propagate NaN on every backend; NVSHMEM's reductions do not say.
        return ("nvshmem max/min do not define NaN propagation (all_reduce's max/min propagate NaN); "
                "float max/min run on one_shot/two_shot or xla")
    return None


def _library_supports(p: Problem) -> GateResult:
    r = _cuda_kernel_checks(p)
    if not r.supported:
        return r
    why = library_refusal(p.dtype, p.op)
    return GateResult(why is None, why or "NVSHMEM library collective")


def _always(_p: Problem) -> GateResult:
    return GateResult(True, "XLA collective")


def _register_backends() -> None:
    if OP in backends.ops():
        return
    backends.register(OP, backends.Backend(
        "one_shot", ("cuda", "cpu"), description="push to every peer + signal, reduce locally",
        supports=_kernel_supports, takes=_KERNEL_TAKES + "; auto: up to one_shot_max_bytes(n)",
        prefers=_one_shot_fits))
    backends.register(OP, backends.Backend(
        "two_shot", ("cuda", "cpu"), description="reduce-scatter + all-gather over NVSHMEM",
        supports=_kernel_supports, takes=_KERNEL_TAKES))
    backends.register(OP, backends.Backend(
        "nvshmem_library", ("cuda",), gates=("nvshmem",),
        description="nvshmemx_*_reduce_on_stream (NVSHMEM_DISABLE_NCCL=1), baseline",
        supports=_library_supports,
        takes=_KERNEL_TAKES + "; no float8 or bool, and/or on integers only, max/min not on floats"))
    backends.register(OP, backends.Backend(
        "xla", ("cpu", "cuda"), description="lax.psum / pmax / pmin (prod: all_gather + prod)", supports=_always))
    backends.register(OP, backends.Backend(
        backends.REFERENCE, ("cpu", "cuda"), description="same as xla: the semantic reference", supports=_always))


_register_backends()


# --------------------------------------------------------------------------- public API
def all_reduce(x, axis_name, *, op: str = "sum", algorithm: str = "auto", timeout_s: float | None = None,
               operand_spaces=None, result_spaces=None, strict_spaces: bool = False):
    """Reduces ``x`` over the mapped axis ``axis_name`` (inside ``shard_map`` or ``pmap``).

    Same result as ``lax.psum`` (``op="sum"``), ``lax.pmax``, ``lax.pmin``; ``"prod"``
    multiplies; ``"and"`` / ``"or"`` reduce bool arrays. Differentiable like ``psum``. Signed
    zeros and NaN are defined on every backend: a float sum is -0.0 only when every contribution
    is -0.0; max/min are IEEE 754-2019 maximum/minimum (NaN wins, -0.0 < +0.0).

    ``axis_name`` may name ``vmap`` axes too (alone or with device axes, as ``psum`` allows): they are
    reduced over the batch dimension, and the kernels run over the device axes that remain.

    ``algorithm``: ``"auto"`` (one_shot or two_shot by size where NVSHMEM runs, else XLA's
    collective, logged and shown by :func:`jax_gpuext.explain`), ``"one_shot"``, ``"two_shot"``,
    ``"nvshmem_library"``, ``"xla"``. ``timeout_s``: how long a device waits for its peers before
    the call fails with an error naming the missing ones: a Python or NumPy real number of seconds
    in [1e-3, 1e6] (default ``$JAX_GPUEXT_ALLREDUCE_TIMEOUT_S`` or 30 s). The result is typed as
    varying over ``axis_name`` (use ``check_vma=False`` with ``out_specs`` that replicate it).

    ``operand_spaces`` / ``result_spaces``: ``{0: MemorySpace.COLLECTIVE}`` (or TEMP) places ``x`` /
    the result in that XLA memory space (docs/memory_spaces.md); index 0 is the only one. They
    are validated on every backend; they apply to our kernels; with the ``xla`` backend valid ones
    are ignored, which is logged and shown by ``explain`` (``strict_spaces=True`` raises instead).
    Bad arguments raise at trace time, whichever backend would run.
    """
    # Every argument is validated before a backend is chosen, so a call is accepted or refused
    # the same way whichever backend would run it (issue 15).
    axes = _normalize_axes(axis_name)
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"all_reduce: op must be one of {sorted(OPS)}, got {op!r}")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"all_reduce: algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    timeout = _check_timeout(timeout_s)
    x = jnp.asarray(x)
    dtype = x.dtype
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"all_reduce: dtype {dtype} of operand with shape {x.shape} is not supported; "
                        f"supported: {[str(d) for d in SUPPORTED_DTYPES]}")
    is_bool = dtype == np.dtype(bool)
    if is_bool and op in ("sum", "prod"):
        raise TypeError(f"all_reduce: op {op!r} is not defined for bool; use 'or'/'max' or 'and'/'min'")
    if not is_bool and op in ("and", "or"):
        raise TypeError(f"all_reduce: op {op!r} needs a bool operand, got {dtype}")
    require_bool(strict_spaces, "all_reduce", "strict_spaces")
    spaces = [_spaces_tuple(operand_spaces, "operand"), _spaces_tuple(result_spaces, "result")]
    sizes = tuple(_axis_size((a,)) for a in axes)
    group_size = math.prod(sizes)

    platform = backends.current_platform()
    problem = Problem(platform, dtype, op, int(x.size) * dtype.itemsize, group_size, algorithm == "auto")
    sel = backends.select(OP, algorithm, problem=problem)
    if any(spaces) and sel.chosen in ("xla", backends.REFERENCE):
        why = f"operand/result memory spaces are ignored: backend {sel.chosen!r} is XLA's own collective"
        if strict_spaces:
            raise UnsupportedError(f"all_reduce: {why}", reason=why)
        backends.note(sel, why)
        logger.warning("all_reduce: %s", why)
        spaces = [(), ()]
    if sel.chosen not in ("xla", backends.REFERENCE):
        backends.note(sel, "axes bound by vmap, if any, are reduced over the batch dimension (as lax.psum "
                           "does); the kernel runs over the device axes that remain")
    cfg = _Config(axes, sizes, op, sel.chosen, timeout, *spaces, bool(strict_spaces))
    if x.size == 0:
        # Nothing to reduce, on any backend: no custom call and no XLA collective, and the result
        # is built from nothing, so x is not used at all (_empty_like; docs/design.md, issue 33).
        backends.note(sel, "zero-size operand: an empty result, no collective and no custom call")
        return _empty_like(x)
    # This device's index over `axes` and its group among the other mesh axes, computed here, where
    # every axis name is bound: JAX does not bind vmap's axis names inside a custom_jvp rule that it
    # batches (batch_custom_jvp_subtrace), so the rule below must not need them.
    rank = lax.axis_index(axes).astype(jnp.int32)
    color = _group_color(axes)
    if jnp.issubdtype(dtype, jnp.inexact):
        return _all_reduce_diff(x, rank, color, cfg)
    return _all_reduce_impl(x, rank, color, cfg)


def _check_timeout(timeout_s) -> float:
    """``timeout_s`` (None: the environment's default) as float seconds in TIMEOUT_RANGE_S. Python
    and NumPy real scalars are accepted; bools (True is not "1 s"), arrays and tracers are not."""
    if timeout_s is None:
        return float(_default_timeout())
    lo, hi = TIMEOUT_RANGE_S
    if isinstance(timeout_s, (bool, np.bool_)) or not isinstance(timeout_s, numbers.Real):
        raise TypeError(f"all_reduce: timeout_s must be a Python or NumPy real number of seconds, got "
                        f"{type(timeout_s).__name__} {timeout_s!r} (it is a compile-time attribute: arrays and "
                        "traced values are refused)")
    t = float(timeout_s)
    if not lo <= t <= hi:  # (NaN fails both comparisons)
        raise ValueError(f"all_reduce: timeout_s must be between {lo:g} and {hi:g} seconds, got {timeout_s!r}")
    return t


def _spaces_tuple(spaces, what: str) -> tuple:
    """Validates an all_reduce space mapping as ``jax_gpuext.memory`` validates every custom call
    (index 0 or -1, a space XLA accepts on custom calls, no conflicting requests) into a hashable
    sorted tuple. Runs for every backend, the ``xla`` one included, which then ignores it."""
    from jax_gpuext.memory import spaces as memory

    return tuple(sorted(memory._normalize(spaces, 1, what, OP).items()))


def _normalize_axes(axis_name) -> tuple:
    """One or more distinct axis names. A repeated name aborted the process in XLA's MLIR
    lowering (a C++ check), so every form is checked here, at trace time."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    bad = [a for a in axes if not isinstance(a, str)]
    if bad:
        raise TypeError(f"all_reduce: axis_name must be a str or a tuple of str, got {axis_name!r} "
                        f"({type(bad[0]).__name__} {bad[0]!r} is not a str)")
    if not axes:
        raise ValueError("all_reduce: axis_name is empty; name at least one mapped axis")
    repeated = sorted({a for a in axes if axes.count(a) > 1})
    if repeated:
        raise ValueError(f"all_reduce: axis_name {axis_name!r} repeats {repeated}; name each axis once")
    return axes


def _axis_size(axes: tuple) -> int:
    try:
        if hasattr(lax, "axis_size"):
            return int(lax.axis_size(axes))
        return int(lax.psum(1, axes))
    except NameError as e:
        raise ValueError(f"all_reduce: axis {axes} is not bound; call all_reduce inside shard_map or pmap "
                         f"over it ({e})") from None


# --------------------------------------------------------------------------- differentiation
@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _all_reduce_diff(x, rank, color, cfg: _Config):
    return _all_reduce_impl(x, rank, color, cfg)


@_all_reduce_diff.defjvp
def _all_reduce_jvp(cfg: _Config, primals, tangents):
    # The primal runs our kernel; the tangent uses XLA's collectives, which JAX knows how to
    # transpose, so reverse mode works like psum's (psum transposes to psum).
    (x, rank, color), (t, _, _) = primals, tangents
    y = _all_reduce_impl(x, rank, color, cfg)
    t_out = _like_vma(_all_reduce_tangent(x, y, t, rank, cfg), y)
    return _like_mesh(y, t_out), t_out


def _all_reduce_tangent(x, y, t, rank, cfg: _Config):
    if cfg.op == "sum":
        return lax.psum(t, cfg.axes)
    if cfg.op in ("max", "min"):  # like jnp.max: ties share the gradient evenly
        hit = (x == y).astype(t.dtype)
        return lax.psum(t * hit, cfg.axes) / lax.psum(hit, cfg.axes)
    # prod: d(prod_i x_i) = sum_i t_i * prod_{j != i} x_j, without dividing by x_i (zeros)
    gathered = lax.all_gather(x, cfg.axes)
    mask = (jnp.arange(gathered.shape[0]) == rank).reshape((-1,) + (1,) * x.ndim)
    others = jnp.prod(jnp.where(mask, jnp.ones_like(gathered), gathered), axis=0)
    return lax.psum(t * others, cfg.axes)


def _like_mesh(y, like):
    """Gives primal ``y`` the abstract mesh of tangent ``like`` when they differ.

    On jax 0.7 a custom call's result inside shard_map is typed with an empty abstract mesh while
    XLA's collectives carry the manual one, and custom_jvp rejects the pair. Multiplying by ones is
    exact for floats (keeps -0.0, NaN and Inf), takes the context mesh, and XLA simplifies it away.
    """
    sharding = lambda a: getattr(jax.typeof(a), "sharding", None)  # noqa: E731
    if sharding(y) == sharding(like):
        return y
    return y * jnp.ones_like(like)


def _like_vma(t, like):
    """Gives tangent ``t`` the varying-manual-axes type of primal ``like``.

    XLA's collectives type their result as invariant over the reduced axes while our custom call's
    result stays varying; jax 0.7's custom_jvp check rejects that mismatch (newer jax accepts it
    under check_vma=False), so the tangent is marked varying the same way.
    """
    typeof, pvary = getattr(jax, "typeof", None), getattr(lax, "pvary", None)
    if typeof is None or pvary is None:
        return t
    missing = tuple(getattr(typeof(like), "vma", frozenset()) - getattr(typeof(t), "vma", frozenset()))
    return pvary(t, missing) if missing else t


# --------------------------------------------------------------------------- implementations
def _all_reduce_impl(x, rank, color, cfg: _Config):
    if cfg.backend in ("xla", backends.REFERENCE):
        return _xla_reduce(x, cfg.axes, cfg.op)
    return _ffi_all_reduce(x, rank, color, cfg)


def _empty_like(x):
    """An empty array typed like ``x`` (shape, dtype, varying axes) that does not use its values.

    Returning ``x`` itself (as this module did) made the empty shard_map operand flow into the
    program's results. jaxlib 0.11.2 segfaults inside XLA's SPMD partitioning pipeline compiling such
    a shard_map beside non-empty values, on CPU and GPU alike (issue 33: the GPU all-reduce check's
    first program); 0.10.2, 0.11.0, 0.11.1 and 0.12.0.1 compile it. Built from nothing, the result
    leaves the operand unused, and JAX drops it from the shard_map. zeros_like reads only the
    operand's type, and gives the result its varying axes on every jax, as the kernels' results
    have; an explicit dtype keeps it strongly typed, as theirs are."""
    return jnp.zeros_like(x, dtype=x.dtype)


def _xla_reduce(x, axes, op):
    """XLA's collective with our numerics: narrow floats accumulate in float32, signed zeros and
    NaN as the kernels define them (module docstring). ``axes`` may include vmap axes, which JAX
    reduces over the batch dimension."""
    dtype = x.dtype
    if dtype.name in _NARROW_FLOATS:
        return _xla_reduce(x.astype(jnp.float32), axes, op).astype(dtype)
    if dtype == np.dtype(bool):
        u = x.astype(jnp.uint8)
        return (lax.pmax(u, axes) if op in ("or", "max") else lax.pmin(u, axes)).astype(bool)
    floating = jnp.issubdtype(dtype, jnp.floating)
    if op == "sum":
        return _signed_zero_sum(x, axes) if floating else lax.psum(x, axes)
    if op in ("max", "min"):
        if not floating:
            return lax.pmax(x, axes) if op == "max" else lax.pmin(x, axes)
        key = _order_key(x, nan_wins=op)
        return _from_order_key(lax.pmax(key, axes) if op == "max" else lax.pmin(key, axes), dtype)
    return _rank_order_prod(lax.all_gather(x, axes))


def _signed_zero_sum(x, axes):
    """``lax.psum`` that is -0.0 exactly where every contribution is -0.0, as the kernels' sum
    (IEEE additions starting from the first contribution) is. XLA:CPU starts its all-reduce from
    +0.0 (so it always returned +0.0 there) and skips it for a group of one (which kept -0.0); one
    more collective of a byte per element makes every backend and
    every group size agree (a pmin: it needs no group size, which a batched custom_jvp rule
    cannot ask for)."""
    total = lax.psum(x, axes)
    all_negative = lax.pmin(((x == 0) & jnp.signbit(x)).astype(jnp.uint8), axes) > 0
    return jnp.where(all_negative, jnp.array(-0.0, x.dtype), total)


_KEY_TYPES = {np.dtype(np.float32): (np.int32, 0x7FFFFFFF, 0x7FC00000, -0x00400000),
              np.dtype(np.float64): (np.int64, 0x7FFFFFFFFFFFFFFF, 0x7FF8000000000000, -0x0008000000000000)}


def _order_key(x, nan_wins: str):
    """Integers that order like the floats ``x`` under IEEE 754-2019 maximum/minimum: -0.0 < +0.0,
    and NaN (any payload) made the largest key for "max" and the smallest for "min", so that one
    integer pmax/pmin propagates NaN and orders signed zeros whatever XLA's float max/min do with
    them (XLA:CPU's pmax keeps the first rank's zero and drops a NaN)."""
    itype, magnitude, pos_nan, neg_nan = _KEY_TYPES[np.dtype(x.dtype)]
    bits = lax.bitcast_convert_type(x, itype)
    nan = jnp.array(pos_nan if nan_wins == "max" else neg_nan, itype)
    bits = jnp.where(jnp.isnan(x), nan, bits)
    # Sign-magnitude -> two's complement order: negative floats count down from -1 (that is -0.0).
    return jnp.where(bits < 0, bits ^ jnp.array(magnitude, itype), bits)


def _from_order_key(key, dtype):
    itype, magnitude, _, _ = _KEY_TYPES[np.dtype(dtype)]
    bits = jnp.where(key < 0, key ^ jnp.array(magnitude, itype), key)
    value = lax.bitcast_convert_type(bits, dtype)
    return jnp.where(jnp.isnan(value), jnp.array(jnp.nan, dtype), value)  # one NaN, as jnp.nan


def _rank_order_prod(g):
    # Multiply in rank order, as the kernels do, so float results agree bit for bit.
    acc = g[0]
    for i in range(1, g.shape[0]):
        acc = acc * g[i]
    return acc


def _group_color(axes: tuple):
    """Which group this device is in when the mesh has several along ``axes``.

    The CPU handler keeps one heap per (call site, color); devices that differ in the other
    manual mesh axes reduce separately. Under pmap there are no other axes: color 0.
    """
    try:
        mesh = jax.sharding.get_abstract_mesh()
        manual = tuple(getattr(mesh, "manual_axes", ()) or ())
    except Exception:  # noqa: BLE001 - older jax / pmap: a single mapped axis
        manual = ()
    others = tuple(a for a in manual if a not in axes)
    if not others:
        return jnp.zeros((), jnp.int32)
    return lax.axis_index(others).astype(jnp.int32)


def _ffi_all_reduce(x, rank, color, cfg: _Config):
    platform = backends.current_platform()
    if platform == "cuda":
        from jax_gpuext.collectives import distributed

        distributed.ensure_initialized()  # lazy: first use bootstraps NVSHMEM and registers _nvshmem
    workspace = _workspace_bytes(platform)
    if platform != "cuda":
        _check_cpu_workspace(workspace, cfg.backend, math.prod(cfg.sizes), x.dtype)
    attrs = dict(
        op=np.int32(OPS[cfg.op]),
        algorithm=np.int32(ALGORITHM_CODES[cfg.backend]),
        group_size=np.int64(math.prod(cfg.sizes)),
        site=np.int64(next(_sites)),
        workspace_bytes=np.int64(workspace),
        timeout_s=np.float32(cfg.timeout_s),
    )
    # No host check per call on the graph-safe target: timeouts surface via distributed.check_status().
    target = GRAPH_TARGET if platform == "cuda" and _graph_safe() else TARGET
    if cfg.operand_spaces or cfg.result_spaces:
        # The memory-space gate is a trace-time decision (docs/design.md "Memory spaces"); the
        # custom call itself is emitted at lowering time, by _emit.
        from jax_gpuext.memory import spaces as memory

        ops, res = (memory._drop_default(dict(sp)) for sp in (cfg.operand_spaces, cfg.result_spaces))
        kept = memory.allowed_spaces(OP, ops, res, cfg.strict_spaces, None)
        if kept != (ops, res):
            cfg = dataclasses.replace(cfg, operand_spaces=kept[0], result_spaces=kept[1])
    _ext.ensure_all_registered()
    return _kernel_primitive().bind(x, rank, color, cfg=cfg, target=target, attrs=tuple(sorted(attrs.items())))


# --------------------------------------------------------------------------- the kernel primitive
# The kernels are bound through a primitive of our own so that its batching rule learns which axis
# vmap batches (jax.ffi.ffi_call's cannot): an axis of the reduction that vmap binds has no peers
# to wait for -- the kernels would wait out the timeout for devices that do not exist and leave
# the call site's group failed (issue 26) -- so it is reduced over the batch dimension here, like
# lax.psum reduces it, and the kernel runs over the device axes that remain.
@functools.cache
def _kernel_primitive():
    from jax.extend.core import Primitive
    from jax.interpreters import batching, mlir

    p = Primitive("gpuext_all_reduce")
    p.def_impl(lambda *args, **params: jax.jit(lambda *a: p.bind(*a, **params))(*args))
    # The result has x's type (shape, dtype, mesh, varying axes): "typed as varying" (docstring).
    p.def_abstract_eval(lambda x, rank, color, **_: x.update(weak_type=False))
    mlir.register_lowering(p, mlir.lower_fun(_emit, multiple_results=False))
    batching.fancy_primitive_batchers[p] = functools.partial(_batch_kernel, p)
    return p


def _emit(x, rank, color, *, cfg: _Config, target: str, attrs: tuple):
    """The one place that emits the custom call; memory spaces go through jax_gpuext.memory."""
    # No has_side_effect: every device runs the same program, so if XLA drops an unused call
    # it drops it everywhere, and the unique `site` attribute keeps two calls from being
    # merged (CSE). A side effect would also make JAX hold runtime tokens that re-raise a
    # timed-out call's error at every later effects barrier.
    if x.size == 0:
        # all_reduce returns before binding for an empty operand; this catches the rest (vmap over
        # an empty batch), so no custom call of ours ever gets a zero-size buffer.
        return jnp.zeros(x.shape, x.dtype)
    result = jax.ShapeDtypeStruct(x.shape, x.dtype)
    if cfg.operand_spaces or cfg.result_spaces:
        from jax_gpuext.memory import spaces as memory

        return memory.ffi_call(target, result, x, rank, color, operand_spaces=dict(cfg.operand_spaces),
                               result_spaces=dict(cfg.result_spaces), strict=cfg.strict_spaces,
                               vmap_method="broadcast_all", caller=OP, **dict(attrs))
    return jax.ffi.ffi_call(target, result, vmap_method="broadcast_all")(x, rank, color, **dict(attrs))


def _batch_kernel(p, axis_data, args, dims, *, cfg: _Config, target: str, attrs: tuple):
    x, rank, color = args
    dx, drank, dcolor = dims
    size = axis_data.size
    if axis_data.name not in cfg.axes:
        # vmap over another axis: the batch is more data, every entry reduced over the same devices
        # (rank and color do not depend on this axis; take entry 0 if they arrive batched anyway).
        if dx is None:
            return p.bind(x, rank, color, cfg=cfg, target=target, attrs=attrs), None
        x = jnp.moveaxis(x, dx, 0)
        rank = rank if drank is None else jnp.take(rank, 0, axis=drank)
        color = color if dcolor is None else jnp.take(color, 0, axis=dcolor)
        return p.bind(x, rank, color, cfg=cfg, target=target, attrs=attrs), 0
    # vmap binds one of the reduced axes: reduce it over the batch dimension, then the kernel over
    # the rest. Narrow floats stay in float32 in between, so they are rounded once, as on xla.
    xb = jnp.moveaxis(x, dx, 0) if dx is not None else jnp.broadcast_to(x, (size,) + x.shape)
    narrow = xb.dtype.name in _NARROW_FLOATS
    local = _xla_reduce_batch(xb.astype(jnp.float32) if narrow else xb, cfg.op)
    pos = cfg.axes.index(axis_data.name)
    rest = cfg.axes[:pos] + cfg.axes[pos + 1:]
    if rest:
        # rank = row-major index over cfg.axes; the same index over `rest` drops this axis's digit
        # (read at batch entry 0, where it is zero).
        inner = math.prod(cfg.sizes[pos + 1:])
        r0 = rank if drank is None else jnp.take(rank, 0, axis=drank)
        rank_rest = (r0 // (size * inner)) * inner + r0 % inner
        color = color if dcolor is None else jnp.take(color, 0, axis=dcolor)
        sub = dataclasses.replace(cfg, axes=rest, sizes=cfg.sizes[:pos] + cfg.sizes[pos + 1:])
        sub_attrs = tuple((k, np.int64(math.prod(sub.sizes)) if k == "group_size" else v) for k, v in attrs)
        local = p.bind(local, rank_rest, color, cfg=sub, target=target, attrs=sub_attrs) if local.size else local
    return (local.astype(xb.dtype) if narrow else local), None


def _xla_reduce_batch(xb, op):
    """The reduction over axis 0 (a vmap batch) with the numerics of _xla_reduce: what lax.psum & co.
    do for an axis bound by vmap, with our signed-zero, NaN and rank-order rules."""
    if xb.dtype == np.dtype(bool):
        return jnp.any(xb, axis=0) if op in ("or", "max") else jnp.all(xb, axis=0)
    floating = jnp.issubdtype(xb.dtype, jnp.floating)
    if op == "sum":
        total = jnp.sum(xb, axis=0, dtype=xb.dtype)
        if not floating:
            return total
        all_negative = jnp.all((xb == 0) & jnp.signbit(xb), axis=0)
        return jnp.where(all_negative, jnp.array(-0.0, xb.dtype), total)
    if op in ("max", "min"):
        if not floating:
            return jnp.max(xb, axis=0) if op == "max" else jnp.min(xb, axis=0)
        key = _order_key(xb, nan_wins=op)
        return _from_order_key(jnp.max(key, axis=0) if op == "max" else jnp.min(key, axis=0), xb.dtype)
    # prod: XLA's reduce from 1, which is exact (1 * v == v for every v, -0.0 included); integers wrap
    return jnp.prod(xb, axis=0, dtype=xb.dtype)


# --------------------------------------------------------------------------- demo
def tensor_parallel_mlp(mesh_axis: str = "tp", *, algorithm: str = "auto", matmul_format=None):
    """The tutorial's MLP (docs/allreduce.md): W1 split by columns, W2 by rows, one all_reduce.

    ``matmul_format`` (e.g. ``jax_gpuext.MXFP8_E4M3``) runs both local matmuls through
    ``scaled_dot_general`` in that block-scaled format; None keeps them in float32.
    """
    from jax.sharding import PartitionSpec as P

    devices = np.array(jax.devices())
    mesh = jax.sharding.Mesh(devices, (mesh_axis,))

    def matmul(a, b):
        if matmul_format is None:
            return a @ b
        from jax_gpuext.dot import scaled_dot_general  # only the demo's matmuls need the dot

        dims = (((a.ndim - 1,), (0,)), ((), ()))
        return scaled_dot_general(a, b, dims, preferred_element_type=jnp.float32, format=matmul_format)

    def layer(x, w1, w2):
        h = jax.nn.gelu(matmul(x, w1))  # [batch, hidden/n]: local columns of W1
        partial = matmul(h, w2)  # [batch, d]: this device's share of the sum over hidden
        return all_reduce(partial, mesh_axis, algorithm=algorithm)

    shard_map = getattr(jax, "shard_map", None)
    kwargs = {"check_vma": False}
    if shard_map is None:  # jax < 0.7
        from jax.experimental.shard_map import shard_map

        kwargs = {"check_rep": False}
    f = shard_map(layer, mesh=mesh, in_specs=(P(), P(None, mesh_axis), P(mesh_axis, None)),
                  out_specs=P(), **kwargs)
    return jax.jit(f), mesh


def shard_mlp_params(mesh, x, w1, w2, mesh_axis: str = "tp"):
    """Places x replicated, W1 split by columns and W2 by rows over ``mesh_axis``."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    return put(x, P()), put(w1, P(None, mesh_axis)), put(w2, P(mesh_axis, None))


def demo_steps():
    def mlp():
        n = jax.device_count()
        k = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(k[0], (4, 32))
        w1 = jax.random.normal(k[1], (32, 16 * n)) / 6
        w2 = jax.random.normal(k[2], (16 * n, 32)) / 6
        want = jax.nn.gelu(x @ w1) @ w2
        algorithms = ["auto"] + (["one_shot", "two_shot"] if backends.current_platform() == "cpu" else [])
        for algorithm in algorithms:
            f, mesh = tensor_parallel_mlp(algorithm=algorithm)
            got = f(*shard_mlp_params(mesh, x, w1, w2))
            err = float(jnp.max(jnp.abs(got - want)))
            print(f"tensor-parallel MLP on {n} device(s), all_reduce algorithm={algorithm}: max |err| = {err:.2e}")
            if not err < 1e-4:
                raise AssertionError(f"MLP mismatch {err} for {algorithm}")
        from jax_gpuext.common.explain import explain
        from jax_gpuext.formats import MXFP8_E4M3

        # The same layer with MXFP8 block-scaled matmuls: error at the format's level, not 1e-6.
        f, mesh = tensor_parallel_mlp(matmul_format=MXFP8_E4M3)
        got = f(*shard_mlp_params(mesh, x, w1, w2))
        rel = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
        print(f"tensor-parallel MLP on {n} device(s) with MXFP8 scaled_dot_general: max error / max |y| = {rel:.2e}")
        if not rel < 0.1:
            raise AssertionError(f"MXFP8 MLP error {rel} is beyond MXFP8's level")
        print(explain(f, *shard_mlp_params(mesh, x, w1, w2)).table())

    return [("all_reduce: tensor-parallel MLP under shard_map", mlp)]
