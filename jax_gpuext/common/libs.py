"""Finding and loading the GPU runtime libraries (cuDNN, cuBLASLt, NVSHMEM) at run time.

Search order for each library: the pip ``nvidia-*`` packages in every site-packages
directory on ``sys.path`` (``nvidia/<pkg>/lib`` for CUDA 12 wheels, ``nvidia/cu13/lib`` for
CUDA 13 wheels), then the system loader (``LD_LIBRARY_PATH``, ldconfig). Only versioned
sonames are tried because the wheels ship only those (REFERENCE section 4).

Nothing is loaded at import: a library is opened the first time an op or a capability
query needs it, and a failure is an answer ("not found: ..."), never an exception.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import os
import sys


@dataclasses.dataclass(frozen=True)
class LibrarySpec:
    name: str
    sonames: tuple[str, ...]
    wheel_dirs: tuple[str, ...]  # relative to site-packages/nvidia
    version_fn: str  # the exported function version() calls; also names the file (dladdr)


LIBRARIES = {
    "cudnn": LibrarySpec("cuDNN", ("libcudnn.so.9",), ("cudnn/lib", "cu13/lib", "cu12/lib"), "cudnnGetVersion"),
    "cublaslt": LibrarySpec("cuBLASLt", ("libcublasLt.so.13", "libcublasLt.so.12"),
                            ("cu13/lib", "cublas/lib", "cu12/lib"), "cublasLtGetVersion"),
    # nvshmemx_vendor_get_version_info: the library's own version, safe before init
    # (nvshmem_info_get_version answers the OpenSHMEM spec version it implements, 1.3).
    "nvshmem": LibrarySpec("NVSHMEM", ("libnvshmem_host.so.3",), ("nvshmem/lib", "cu13/lib", "cu12/lib"),
                           "nvshmemx_vendor_get_version_info"),
}


@dataclasses.dataclass(frozen=True)
class LoadedLibrary:
    key: str
    path: str | None  # the file the loader opened; None only if even dladdr cannot name it
    handle: ctypes.CDLL


def _site_dirs() -> list[str]:
    return [p for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]


def candidates(key: str) -> list[str]:
    """Every file path (wheel locations first) that could provide library ``key``."""
    spec = LIBRARIES[key]
    found = []
    for site in _site_dirs():
        for sub in spec.wheel_dirs:
            for soname in spec.sonames:
                found += sorted(glob.glob(os.path.join(site, "nvidia", sub, soname)))
    return found


@functools.cache
def load(key: str) -> tuple[LoadedLibrary | None, str]:
    """Opens library ``key``; returns ``(library, where)`` or ``(None, why not)``."""
    spec = LIBRARIES[key]
    errors = []
    for path in candidates(key):
        try:
            return LoadedLibrary(key, path, ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    for soname in spec.sonames:
        try:
            handle = ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{soname}: {e}")
            continue
        # C++ code dlopens the same file by path (never by soname, which could pick another
        # copy), so name the file the loader chose.
        return LoadedLibrary(key, _file_of(handle, spec.version_fn), handle), f"system {soname}"
    hint = {"cudnn": "nvidia-cudnn-cu12/-cu13", "cublaslt": "nvidia-cublas(-cu12)",
            "nvshmem": "nvidia-nvshmem-cu12/-cu13"}[key]
    return None, f"{spec.name} not found (install {hint}, or jax-gpuext[cuda12|cuda13]); tried " + "; ".join(errors)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _file_of(handle: ctypes.CDLL, symbol: str) -> str | None:
    """The real path of the shared object that defines ``symbol`` in ``handle`` (dladdr)."""
    try:
        address = ctypes.cast(getattr(handle, symbol), ctypes.c_void_p)
    except AttributeError:
        return None
    for libc_name in (None, "libc.so.6", "libdl.so.2"):  # dladdr moved into libc in glibc 2.34
        try:
            dladdr = ctypes.CDLL(libc_name).dladdr
        except (OSError, AttributeError):
            continue
        info = _DlInfo()
        if dladdr(address, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
        return None
    return None


@functools.cache
def version(key: str) -> tuple[tuple[int, ...] | None, str]:
    """``((major, minor, patch), where)`` of library ``key``, or ``(None, why not)``."""
    lib, where = load(key)
    if lib is None:
        return None, where
    fn_name = LIBRARIES[key].version_fn
    try:
        fn = getattr(lib.handle, fn_name)
    except AttributeError:
        return None, f"{where} has no {fn_name}"
    if key == "nvshmem":  # (int* major, int* minor, int* patch)
        parts = [ctypes.c_int(0) for _ in range(3)]
        fn(*map(ctypes.byref, parts))
        return tuple(p.value for p in parts), where
    # cudnnGetVersion (since cuDNN 9) / cublasLtGetVersion: major*10000 + minor*100 + patch
    fn.restype = ctypes.c_size_t
    v = int(fn())
    return (v // 10000, (v % 10000) // 100, v % 100), where


def path(key: str) -> str | None:
    """Path of the library file, for handing to C++ code that dlopens it itself."""
    lib, _ = load(key)
    return None if lib is None else lib.path


# What cudnn-frontend's dynamic-loading shim dlopens by name (include/cudnn_frontend_shim.h,
# load_cudart_so) for the few CUDA runtime calls it makes itself; it throws "Multiple libcudart
# libraries found" when more than one of them loads.
CUDART_SONAMES = ("libcudart.so.12", "libcudart.so.13")


def loadable_cudarts() -> list[tuple[str, str | None]]:
    """``(soname, file)`` of every libcudart the cudnn-frontend shim would find now, by the same
    search (dlopen by soname: libraries already loaded, LD_LIBRARY_PATH, ldconfig). Like the shim,
    this loads what it finds (RTLD_LOCAL; libcudart does nothing until called)."""
    found = []
    for soname in CUDART_SONAMES:
        try:
            handle = ctypes.CDLL(soname)
        except OSError:
            continue
        found.append((soname, _file_of(handle, "cudaRuntimeGetVersion")))
    return found
