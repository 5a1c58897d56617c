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

Numerics: contributions are combined in rank order; float16/bfloat16/float8 accumulate in
float32 and are rounded once (the xla backend upcasts the same way); integers wrap; float
max/min propagate NaN like ``jnp.max`` / ``jnp.min`` on every backend.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_gpuext.common import backends, gates
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
    env = os.environ.get(ONE_SHOT_MAX_ENV)
    if env:
        return int(env)
    if group_size <= 2:  # two_shot saves nothing for two ranks: same bytes, one more step
        return 1 << 62
    alpha_s, bandwidth = 2.5e-6, 450e9
    s = alpha_s * bandwidth / ((group_size - 1) * (1 - 2 / group_size))
    return 1 << max(12, round(math.log2(s)))


# --------------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class _Config:
    axes: tuple
    op: str
    backend: str  # the chosen backend's name
    timeout_s: float
    # Memory spaces of x / the result as sorted ((index, MemorySpace), ...): hashable, since the
    # config is a static argument of the custom_jvp.
    operand_spaces: tuple = ()
    result_spaces: tuple = ()
    strict_spaces: bool = False


def _default_timeout() -> float:
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def _workspace_bytes(platform: str) -> int:
    if platform == "cuda":
        from jax_gpuext.collectives import distributed

        return distributed.workspace_bytes()
    return int(os.environ.get(WORKSPACE_ENV, DEFAULT_CPU_WORKSPACE_BYTES))


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
    env = os.environ if env is None else env
    if env.get(GRAPH_SAFE_ENV, "0") in ("", "0"):
        return GateResult(True, "the checked target is not captured into command buffers: calls run in order")
    modes = _SCHEDULING_MODE_FLAG.findall(env.get("XLA_FLAGS", ""))
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
    multiplies; ``"and"`` / ``"or"`` reduce bool arrays. Differentiable like ``psum``.

    ``algorithm``: ``"auto"`` (one_shot or two_shot by size where NVSHMEM runs, else XLA's
    collective, logged and shown by :func:`jax_gpuext.explain`), ``"one_shot"``, ``"two_shot"``,
    ``"nvshmem_library"``, ``"xla"``. ``timeout_s``: how long a device waits for its peers before
    the call fails with an error naming the missing ones (default ``$JAX_GPUEXT_ALLREDUCE_TIMEOUT_S``
    or 30 s). The result is typed as varying over ``axis_name`` (use ``check_vma=False`` with
    ``out_specs`` that replicate it).

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
    timeout = _default_timeout() if timeout_s is None else timeout_s
    if not isinstance(timeout, (int, float)) or not (0 < float(timeout) < 1e6):
        raise ValueError(f"all_reduce: timeout_s must be a positive number of seconds, got {timeout_s!r}")
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
    group_size = _axis_size(axes)

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
    cfg = _Config(axes, op, sel.chosen, float(timeout), *spaces, bool(strict_spaces))
    if jnp.issubdtype(dtype, jnp.inexact):
        return _all_reduce_diff(x, cfg)
    return _all_reduce_impl(x, cfg)


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
@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _all_reduce_diff(x, cfg: _Config):
    return _all_reduce_impl(x, cfg)


@_all_reduce_diff.defjvp
def _all_reduce_jvp(cfg: _Config, primals, tangents):
    # The primal runs our kernel; the tangent uses XLA's collectives, which JAX knows how to
    # transpose, so reverse mode works like psum's (psum transposes to psum).
    (x,), (t,) = primals, tangents
    y = _all_reduce_impl(x, cfg)
    t_out = _like_vma(_all_reduce_tangent(x, y, t, cfg), y)
    return _like_mesh(y, t_out), t_out


def _all_reduce_tangent(x, y, t, cfg: _Config):
    if cfg.op == "sum":
        return _xla_reduce(t, cfg.axes, "sum")
    if cfg.op in ("max", "min"):  # like jnp.max: ties share the gradient evenly
        hit = (x == y).astype(t.dtype)
        return _xla_reduce(t * hit, cfg.axes, "sum") / _xla_reduce(hit, cfg.axes, "sum")
    # prod: d(prod_i x_i) = sum_i t_i * prod_{j != i} x_j, without dividing by x_i (zeros)
    gathered = lax.all_gather(x, cfg.axes)
    me = lax.axis_index(cfg.axes)
    mask = (jnp.arange(gathered.shape[0]) == me).reshape((-1,) + (1,) * x.ndim)
    others = jnp.prod(jnp.where(mask, jnp.ones_like(gathered), gathered), axis=0)
    return _xla_reduce(t * others, cfg.axes, "sum")


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
def _all_reduce_impl(x, cfg: _Config):
    if cfg.backend in ("xla", backends.REFERENCE):
        return _xla_reduce(x, cfg.axes, cfg.op)
    if x.size == 0:
        return x
    return _ffi_all_reduce(x, cfg)


def _xla_reduce(x, axes, op):
    """XLA's collective with our numerics: narrow floats accumulate in float32."""
    dtype = x.dtype
    if dtype.name in _NARROW_FLOATS:
        return _xla_reduce(x.astype(jnp.float32), axes, op).astype(dtype)
    if dtype == np.dtype(bool):
        u = x.astype(jnp.uint8)
        return (lax.pmax(u, axes) if op in ("or", "max") else lax.pmin(u, axes)).astype(bool)
    if op == "sum":
        return lax.psum(x, axes)
    if op == "max":
        return _nan_wins(x, axes, lax.pmax(x, axes))
    if op == "min":
        return _nan_wins(x, axes, lax.pmin(x, axes))
    return _rank_order_prod(lax.all_gather(x, axes))


def _nan_wins(x, axes, reduced):
    """max/min propagate NaN as jnp.max / jnp.min do and as our kernels do (reduce_ops.h
    Combine): a NaN on any rank makes that element NaN. XLA's pmax/pmin do not promise it (on
    CPU they drop a NaN), which would hide a NaN from an amax or a norm and silently break FP8
    scaling; one extra collective of a byte per element makes the fallback agree."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return reduced
    any_nan = lax.pmax(jnp.isnan(x).astype(jnp.uint8), axes) > 0
    return jnp.where(any_nan, jnp.array(jnp.nan, x.dtype), reduced)


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


def _ffi_all_reduce(x, cfg: _Config):
    platform = backends.current_platform()
    if platform == "cuda":
        from jax_gpuext.collectives import distributed

        distributed.ensure_initialized()  # lazy: first use bootstraps NVSHMEM and registers _nvshmem
    rank = lax.axis_index(cfg.axes).astype(jnp.int32)
    attrs = dict(
        op=np.int32(OPS[cfg.op]),
        algorithm=np.int32(ALGORITHM_CODES[cfg.backend]),
        group_size=np.int64(_axis_size(cfg.axes)),
        site=np.int64(next(_sites)),
        workspace_bytes=np.int64(_workspace_bytes(platform)),
        timeout_s=np.float32(cfg.timeout_s),
    )
    return _lower(x, rank, _group_color(cfg.axes), attrs, cfg)


def _lower(x, rank, color, attrs, cfg: _Config):
    """The one place that emits the custom call; memory spaces go through jax_gpuext.memory."""
    # No has_side_effect: every device runs the same program, so if XLA drops an unused call
    # it drops it everywhere, and the unique `site` attribute keeps two calls from being
    # merged (CSE). A side effect would also make JAX hold runtime tokens that re-raise a
    # timed-out call's error at every later effects barrier.
    # broadcast_all under vmap: the op is elementwise across devices, so a batch is just a
    # bigger message; rank/color are broadcast with every element equal.
    _ext.ensure_all_registered()
    target = TARGET
    if backends.current_platform() == "cuda" and os.environ.get(GRAPH_SAFE_ENV, "0") not in ("", "0"):
        target = GRAPH_TARGET  # no host check per call: timeouts surface via distributed.check_status()
    result = jax.ShapeDtypeStruct(x.shape, x.dtype)
    if cfg.operand_spaces or cfg.result_spaces:
        from jax_gpuext.memory import spaces as memory

        return memory.ffi_call(target, result, x, rank, color, operand_spaces=dict(cfg.operand_spaces),
                               result_spaces=dict(cfg.result_spaces), strict=cfg.strict_spaces,
                               vmap_method="broadcast_all", caller=OP, **attrs)
    return jax.ffi.ffi_call(target, result, vmap_method="broadcast_all")(x, rank, color, **attrs)


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
        print(explain(f, *shard_mlp_params(mesh, x, w1, w2)))

    return [("all_reduce: tensor-parallel MLP under shard_map", mlp)]
