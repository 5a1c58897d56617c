"""Loading the compiled extensions and registering their FFI targets with XLA.

``_cpu`` is always built; ``_cuda`` only where nvcc was found. Neither import may make
``import jax_gpuext`` fail: a missing or broken module, or targets XLA refused to register,
are recorded with the reason and reported by the ``cpu_extension`` / ``cuda_extension`` gates.

``import jax_gpuext`` registers every target of ``_cpu`` and ``_cuda`` (``ensure_all_registered``),
so a program exported with our ops runs after a plain import (docs/design.md, "jax.export").
``_nvshmem``'s targets register in ``jax_gpuext.distributed.initialize``, which the CUDA
all-reduce needs first in any process (the NVSHMEM heap).
``TARGETS`` lists every target our ops may emit, declared by the op modules where they name
them (``declare_target``): the list ``jax_gpuext.export_disabled_checks`` hands jax.export.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading

from jax_gpuext.common import libs as _libs
from jax_gpuext.common import nvshmem_version

logger = logging.getLogger("jax_gpuext")

# XLA's platform names. "CUDA" must be spelled exactly so (REFERENCE section 1).
_PLATFORMS = {"cpu": "cpu", "cuda": "CUDA"}
_lock = threading.Lock()
_registered: set[str] = set()
_registration_errors: dict[str, str] = {}

# Every custom-call target our ops may emit -> the op that emits it. Filled by the op modules
# (``declare_target``) when the package root imports them; a test holds it equal to the
# targets the C++ sources register (ffi/**: GPUEXT_REGISTER_FFI_TARGET).
TARGETS: dict[str, str] = {}


def declare_target(name: str, op: str) -> str:
    """Records that ``op`` may emit FFI target ``name``; returns ``name`` (for the module constant)."""
    if TARGETS.setdefault(name, op) != op:
        raise ValueError(f"FFI target {name} declared by both {TARGETS[name]} and {op}")
    return name


@functools.cache
def load(kind: str):
    """Returns ``(module, None)`` or ``(None, reason)`` for kind "cpu" or "cuda"."""
    try:
        return importlib.import_module(f"jax_gpuext._{kind}"), None
    except ImportError as e:  # not built, or a shared library it needs is missing
        if kind == "cuda" and "No module named" in str(e):
            return None, missing_part_reason("cuda_extension") or ("jax_gpuext._cuda was not built (no CUDA compiler when the package "
                          "was installed; reinstall with nvcc on PATH or JAX_GPUEXT_CUDA=ON)")
        return None, f"jax_gpuext._{kind} failed to import: {e}"


def module(kind: str):
    return load(kind)[0]


def parse_fingerprints(text: str) -> dict[str, str]:
    """The modules' "component=fingerprint,..." (cmake/source_fingerprints.cmake) as a dict."""
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


@functools.cache
def build_parts() -> dict:
    """What the build recorded about each part (cmake/build_parts.cmake): ``{part: {"built": bool,
    "detail"|"why"+"fix": str}}`` for cuda_extension, cublaslt_dot, cudnn_dot, nvshmem_allreduce;
    {} for a build without the record."""
    import json
    from importlib import resources

    try:
        return json.loads(resources.files("jax_gpuext").joinpath("build_parts.json").read_text())
    except (OSError, ValueError):
        return {}


def build_source() -> dict:
    """The commit the installed build came from (cmake/build_source.cmake): ``{"commit": sha or
    "unknown", "dirty": bool or None}``; {} for a build without the record."""
    import json
    from importlib import resources

    try:
        return json.loads(resources.files("jax_gpuext").joinpath("build_source.json").read_text())
    except (OSError, ValueError):
        return {}


def missing_part_reason(part: str) -> str | None:
    """"not built: <why>; to get it: <fix>" for a part the build left out, else None."""
    rec = build_parts().get(part)
    if not rec or rec.get("built"):
        return None
    return f"not built: {rec['why']}; to get it: {rec['fix']}"


def build_info(kind: str) -> dict | None:
    mod = module(kind)
    if mod is None:
        return None
    info = dict(mod.build_info())
    if isinstance(info.get("source_fingerprints"), str):
        info["source_fingerprints"] = parse_fingerprints(info["source_fingerprints"])
    return info


def ensure_registered(kind: str) -> None:
    """Registers every FFI target of extension ``kind`` with XLA, once per process.

    Never raises: XLA refusing a target (a jaxlib that cannot take our handlers) is recorded
    (``registration_error``) and turns the extension's gate off, so every op falls back visibly
    to a path without our handlers. Registering for "CUDA" before (or without) a CUDA backend
    only queues the handler in jaxlib; it initializes no backend.
    """
    if kind in _registered:
        return
    import jax

    with _lock:
        if kind in _registered:
            return
        mod = module(kind)
        if mod is not None:
            try:
                for name, handler in mod.registrations().items():
                    jax.ffi.register_ffi_target(name, handler, platform=_PLATFORMS[kind])
                    logger.debug("registered FFI target %s for %s", name, _PLATFORMS[kind])
            except Exception as e:  # noqa: BLE001 - import must not fail; the gate reports it
                _registration_errors[kind] = f"registering its FFI targets failed: {type(e).__name__}: {e}"
        _registered.add(kind)


def registration_error(kind: str) -> str | None:
    """Why XLA did not take extension ``kind``'s targets, or None."""
    return _registration_errors.get(kind)


def ensure_all_registered() -> None:
    for kind in _PLATFORMS:
        ensure_registered(kind)


def set_library_path(name: str, path: str | None) -> None:
    """Tells the ``_cuda`` handlers where to dlopen library ``name`` ("cublaslt", "cudnn") from.

    Called at trace time by the backends that need it, so the path never enters the HLO.
    """
    mod = module("cuda")
    if mod is not None and mod.library_path(name) != (path or ""):
        mod.set_library_path(name, path or "")


def nvshmem_built_against() -> tuple[int, ...] | None:
    """The NVSHMEM version _nvshmem was built against, from the build record (no import needed)."""
    v = build_parts().get("nvshmem_allreduce", {}).get("version")
    return tuple(int(x) for x in v.split(".")) if v else None


@functools.cache
def load_nvshmem():
    """``(jax_gpuext._nvshmem, None)`` or ``(None, why not)``; loads libnvshmem_host first and checks
    its version against the one the build recorded *before* the import (``nvshmem_version``): an
    incompatible host fails the import with an undefined symbol at best.

    Only the all-reduce bootstrap (``jax_gpuext.distributed``) and the ``nvshmem_allreduce_module``
    gate call it, so ``import jax_gpuext`` never needs libnvshmem_host."""
    lib, where = _libs.load("nvshmem")
    if lib is None:
        return None, where
    built = nvshmem_built_against()
    if built is not None:
        ok, reason = nvshmem_version.check(built)
        if not ok:
            return None, reason
    try:
        mod = importlib.import_module("jax_gpuext._nvshmem")
    except ImportError as e:
        if "No module named" in str(e):
            return None, missing_part_reason("nvshmem_allreduce") or ("jax_gpuext._nvshmem was not built (NVSHMEM headers not found at build time: "
                          "install nvidia-nvshmem-cu13 in the build environment, JAX_GPUEXT_NVSHMEM=ON)")
        return None, f"jax_gpuext._nvshmem failed to import: {e}"
    if built is None:  # a build from before the record had the version: ask the module
        ok, reason = nvshmem_version.check(tuple(int(v) for v in mod.build_info()["nvshmem_version"].split(".")))
        if not ok:
            return None, reason
    return mod, None
