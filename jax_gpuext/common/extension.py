"""Loading the compiled extensions and registering their FFI targets with XLA.

``_cpu`` is always built; ``_cuda`` only where nvcc was found. Neither import may make
``import jax_gpuext`` fail: a missing or broken module is recorded with its reason and
reported by the ``cpu_extension`` / ``cuda_extension`` gates.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading

from jax_gpuext.common import libs as _libs

logger = logging.getLogger("jax_gpuext")

# XLA's platform names. "CUDA" must be spelled exactly so (REFERENCE section 1).
_PLATFORMS = {"cpu": "cpu", "cuda": "CUDA"}
_lock = threading.Lock()
_registered: set[str] = set()


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
    """Registers every FFI target of extension ``kind`` with XLA, once per process."""
    if kind in _registered:
        return
    import jax

    with _lock:
        if kind in _registered:
            return
        mod = module(kind)
        if mod is not None:
            for name, handler in mod.registrations().items():
                jax.ffi.register_ffi_target(name, handler, platform=_PLATFORMS[kind])
                logger.debug("registered FFI target %s for %s", name, _PLATFORMS[kind])
        _registered.add(kind)


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


@functools.cache
def load_nvshmem():
    """``(jax_gpuext._nvshmem, None)`` or ``(None, why not)``; loads libnvshmem_host first.

    Only the all-reduce bootstrap (``jax_gpuext.distributed``) and the ``nvshmem_allreduce_module``
    gate call it, so ``import jax_gpuext`` never needs libnvshmem_host."""
    lib, where = _libs.load("nvshmem")
    if lib is None:
        return None, where
    try:
        mod = importlib.import_module("jax_gpuext._nvshmem")
    except ImportError as e:
        if "No module named" in str(e):
            return None, missing_part_reason("nvshmem_allreduce") or ("jax_gpuext._nvshmem was not built (NVSHMEM headers not found at build time: "
                          "install nvidia-nvshmem-cu13 in the build environment, JAX_GPUEXT_NVSHMEM=ON)")
        return None, f"jax_gpuext._nvshmem failed to import: {e}"
    # Our libnvshmem_device.a copy needs a host library of the same major and no older minor.
    built = tuple(int(v) for v in mod.build_info()["nvshmem_version"].split(".")[:2])
    have, _ = _libs.version("nvshmem")
    if have is None or have[0] != built[0] or have[1] < built[1]:
        return None, (f"libnvshmem_host {have} cannot run device code built against NVSHMEM {built}: "
                      "needs the same major and a minor >= the build's")
    return mod, None
