"""NVSHMEM bootstrap over ``jax.distributed`` for :func:`jax_gpuext.all_reduce`.

One GPU per process. Rank 0 creates NVSHMEM's 128-byte unique id, the others read it from
JAX's distributed key-value store, and every process then calls
``nvshmemx_set_attr_uniqueid_args`` + ``nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID)``
(in ``jax_gpuext._nvshmem``). ``nvshmemx_hostlib_init_attr`` runs first because the inline
``nvshmemx_init_attr`` calls ``exit(-1)`` on failure (REFERENCE section 5), and
``nvshmemx_init_status()`` is checked after it, because NVSHMEM reports a failed setup
(transports, heap, MPS) or limited multi-process-per-GPU support only there: both are a Python
exception here, not a later ``exit(-1)`` inside NVSHMEM.

``jax_gpuext._nvshmem`` is a module of its own, linked against ``libnvshmem_host.so.3`` and
loaded only for it (``jax_gpuext.common.extension.load_nvshmem``), so ``import jax_gpuext`` works
without NVSHMEM.
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import logging
import numbers
import os
import threading

from jax_gpuext.common import env
from jax_gpuext.common import extension as _ext
from jax_gpuext.common.errors import UnsupportedError

logger = logging.getLogger("jax_gpuext")

WORKSPACE_ENV = "JAX_GPUEXT_ALLREDUCE_WORKSPACE_BYTES"
FINALIZE_ENV = "JAX_GPUEXT_NVSHMEM_FINALIZE"
DEFAULT_GPU_WORKSPACE_BYTES = 32 << 20  # per PE; messages above it run in chunks
# (nvshmem_library stages through a second symmetric region of the same size)
# The smallest workspace per PE that initialize accepts (as it always has): the CPU protocol's
# few hundred test bytes are a configuration mistake on CUDA, refused naming the variable.
MIN_GPU_WORKSPACE_BYTES = 4096
UID_KEY = "jax_gpuext/nvshmem_uniqueid"
UID_TIMEOUT_MS = 120_000

# nvshmemx_init_status_t (device_host_transport/nvshmem_constants.h)
STATUS_NAMES = {0: "not initialized", 1: "bootstrapped", 2: "initialized", 3: "limited MPG", 4: "full MPG"}
IS_INITIALIZED = 2
FULL_MPG = 4  # several PEs per GPU under CUDA MPS, all of NVSHMEM's API available


@dataclasses.dataclass(frozen=True)
class NvshmemInfo:
    my_pe: int
    n_pes: int
    workspace_bytes: int
    external: bool  # another library in this process had initialized NVSHMEM first
    init_status: int  # nvshmemx_init_status(): IS_INITIALIZED, or FULL_MPG when PEs share a GPU

    @property
    def status(self) -> str:
        return STATUS_NAMES.get(self.init_status, "?")


_lock = threading.RLock()
_info: NvshmemInfo | None = None


def workspace_bytes() -> int:
    """The symmetric workspace per PE: the initialized value, else what initialize would use."""
    if _info is not None:
        return _info.workspace_bytes
    return _configured_workspace_bytes()


def _configured_workspace_bytes() -> int:
    """$JAX_GPUEXT_ALLREDUCE_WORKSPACE_BYTES as CUDA reads it. The variable also sizes the CPU
    protocol's workspace, where a few hundred bytes are valid (the CPU tests use 512), so the
    table's range admits them; on CUDA a value below MIN_GPU_WORKSPACE_BYTES is refused here, where
    it is read, naming the variable (it used to surface as a wrapped ValueError from inside the
    lazy NVSHMEM initialization, issue 33)."""
    value = env.get(WORKSPACE_ENV)
    if value is None:
        return DEFAULT_GPU_WORKSPACE_BYTES
    if value < MIN_GPU_WORKSPACE_BYTES:
        raise env.EnvironmentVariableError(
            WORKSPACE_ENV, env.raw(WORKSPACE_ENV),
            f"on CUDA an integer of at least {MIN_GPU_WORKSPACE_BYTES} (the NVSHMEM workspace per PE; "
            f"values below it are valid only for the CPU protocol); unset it for the default "
            f"{DEFAULT_GPU_WORKSPACE_BYTES}")
    return value


def is_initialized() -> bool:
    return _info is not None


def info() -> NvshmemInfo | None:
    return _info


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, workspace_bytes: int | None = None,
               **jax_distributed_kwargs) -> NvshmemInfo:
    """Bootstraps NVSHMEM (and ``jax.distributed`` when given its arguments). Idempotent.

    Call it after (or instead of) ``jax.distributed.initialize``, before the first jitted
    ``all_reduce``; otherwise the first ``all_reduce`` traced for CUDA calls it with no arguments.
    Raises :class:`UnsupportedError` (with the reason) where NVSHMEM cannot run and
    ``RuntimeError`` when NVSHMEM itself fails.
    """
    global _info
    with _lock:
        if _info is not None:
            return _info
        # Checked before anything starts: a refused size must not leave NVSHMEM initialized
        # without its workspace.
        ws = workspace_bytes if workspace_bytes is not None else _configured_workspace_bytes()
        if isinstance(ws, bool) or not isinstance(ws, numbers.Integral) or ws < MIN_GPU_WORKSPACE_BYTES:
            raise ValueError(f"jax_gpuext.distributed.initialize: workspace_bytes must be an int of at least "
                             f"{MIN_GPU_WORKSPACE_BYTES}, got {ws!r}")
        import jax

        if coordinator_address is not None or num_processes is not None or jax_distributed_kwargs:
            if not _jax_distributed_client():
                jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                           **jax_distributed_kwargs)
        devices = jax.local_devices()
        if not devices or devices[0].platform != "gpu":
            raise UnsupportedError("jax_gpuext.distributed.initialize needs a CUDA GPU",
                                   reason=f"JAX's local devices are {devices}")
        if len(devices) != 1:
            raise UnsupportedError("jax_gpuext.distributed.initialize needs one GPU per process",
                                   reason=f"this process drives {len(devices)} GPUs; start one process per GPU "
                                          "(or set CUDA_VISIBLE_DEVICES) and jax.distributed.initialize")
        mod, why = _ext.load_nvshmem()
        if mod is None:
            raise UnsupportedError("NVSHMEM all-reduce module unavailable", reason=why)
        # On-stream library reductions would otherwise silently call ncclAllReduce (REFERENCE 5).
        os.environ.setdefault("NVSHMEM_DISABLE_NCCL", "1")
        rank, n = jax.process_index(), jax.process_count()
        device = devices[0].local_hardware_id
        status = mod.init_status()
        external = status >= IS_INITIALIZED
        if external:
            logger.info("NVSHMEM already initialized by another library (%s); attaching", STATUS_NAMES.get(status))
            mod.attach(device)  # device state of our copy of libnvshmem_device only
        else:
            uid = _exchange_uniqueid(mod, rank, n)
            mod.initialize(rank, n, uid, device)  # raises RuntimeError naming the NVSHMEM call
        ws = int(ws)
        mod.allocate_workspace(ws)  # collective nvshmem_malloc: every PE must call it
        for name, handler in mod.registrations().items():
            jax.ffi.register_ffi_target(name, handler, platform="CUDA")
        _info = NvshmemInfo(mod.my_pe(), mod.n_pes(), ws, external, mod.init_status())
        if _info.n_pes != n:
            raise RuntimeError(f"NVSHMEM has {_info.n_pes} PEs but jax.distributed has {n} processes")
        atexit.register(shutdown)
        logger.info("NVSHMEM initialized: PE %d of %d, workspace %d bytes", _info.my_pe, _info.n_pes, ws)
        return _info


def ensure_initialized() -> NvshmemInfo:
    """Lazy initialization for the first all_reduce traced for CUDA."""
    if _info is not None:
        return _info
    try:
        return initialize()
    except (UnsupportedError, env.EnvironmentVariableError):
        raise  # already say what to change
    except Exception as e:  # noqa: BLE001 - say where it came from
        raise RuntimeError(f"all_reduce: lazy NVSHMEM initialization failed ({e}); call "
                           "jax_gpuext.distributed.initialize(...) explicitly after jax.distributed.initialize") from e


def check_status() -> None:
    """Raises RuntimeError naming the missing PEs if an all_reduce timed out.

    Waits for all work queued on this process's GPU first, so it sees every call dispatched
    before it. Needed with ``JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE=1`` (the command-buffer compatible
    target does not check per call); a no-op before initialization.
    """
    if _info is None:
        return
    mod, _ = _ext.load_nvshmem()
    mod.check_status()


def shutdown() -> None:
    """Frees the workspace and finalizes NVSHMEM if we initialized it (runs at exit).

    Both steps are collective: every PE must reach them, which is the case when every process
    exits normally. ``JAX_GPUEXT_NVSHMEM_FINALIZE=0`` skips them (e.g. a process that dies
    alone would otherwise wait for its peers at exit).
    """
    global _info
    with _lock:
        if _info is None:
            return
        mod, _ = _ext.load_nvshmem()
        if env.get(FINALIZE_ENV) and mod is not None:
            mod.free_workspace()
            if not _info.external:
                mod.finalize()
        _info = None


def _jax_distributed_client():
    try:
        from jax._src import distributed as jd  # the only place JAX exposes its KV store

        return jd.global_state.client
    except Exception:  # noqa: BLE001
        return None


def _exchange_uniqueid(mod, rank: int, n: int) -> bytes:
    if n == 1:
        return mod.get_uniqueid()
    client = _jax_distributed_client()
    if client is None:
        raise RuntimeError("several processes but no jax.distributed client: call jax.distributed.initialize "
                           "(or pass its arguments to jax_gpuext.distributed.initialize) first")
    if rank == 0:
        uid = mod.get_uniqueid()
        # str values work on every jaxlib; the *_bytes variants are newer.
        client.key_value_set(UID_KEY, base64.b64encode(uid).decode())
        return uid
    return base64.b64decode(client.blocking_key_value_get(UID_KEY, UID_TIMEOUT_MS))
