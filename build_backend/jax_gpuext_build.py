"""PEP 517 backend: scikit-build-core, plus the GPU parts' build inputs when a CUDA compiler exists.

The complete CUDA build (docs/design.md, "Complete builds and the wheel") needs headers that a CUDA
toolkit may lack: cublasLt.h (cuBLASLt dot), cudnn-frontend + cudnn.h + nvrtc.h (cuDNN dot), and
NVSHMEM's headers + libnvshmem_device.a (_nvshmem). NVIDIA ships them in pip wheels, so they are
build requirements: but only for a build that compiles CUDA, and only of the CUDA major version of
the compiler that will be used (cu12 and cu13 wheels differ). Static `build-system.requires` cannot
say that; `get_requires_for_build_wheel` can. Everything else is scikit-build-core unchanged.

Nothing here is needed at run time: the package never links these libraries (it dlopens the ones
the `cuda12` / `cuda13` extras install) and the wheels stay in pip's temporary build environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from scikit_build_core.build import build_editable as _skbuild_build_editable
from scikit_build_core.build import build_wheel as _skbuild_build_wheel
from scikit_build_core.build import (  # noqa: F401  (re-exported PEP 517 hooks)
    build_sdist,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)
from scikit_build_core.build import get_requires_for_build_editable as _skbuild_requires_editable
from scikit_build_core.build import get_requires_for_build_wheel as _skbuild_requires_wheel

# Per CUDA major version: part -> requirements. Versions (docs/design.md, same section):
# - cublas >= 12.9 on cu12: csrc/dot/cublaslt_block_scaled.cc uses the 12.9 blockwise-FP8 scale modes.
# - nvshmem pinned to the OLDEST version we support, 3.4.5: device code built against NVSHMEM 3.m runs
#   with any host library 3.n, n >= m (NVSHMEM's own rule, checked by jax_gpuext/common/nvshmem_version.py
#   before _nvshmem is imported), never with an older one (a 3.8.0 build does not even import against 3.4.5:
#   "undefined symbol: nvshmem_selected_device_transport"). torch 2.11 pins nvidia-nvshmem-cu13==3.4.5,
#   so a newer build would refuse to run next to it. Pinned, not ">=", so the build never drifts up.
# - cudnn-frontend < 1.29: from 1.29 its wheel requires nvidia-cutlass-dsl, cuda-bindings and more
#   (hundreds of MB for its Python DSL); we only need its headers, identical in kind in 1.28.
_FRONTEND = "nvidia-cudnn-frontend>=1.13,<1.29"
NVSHMEM_BUILD_VERSION = "3.4.5"
_WHEELS = {
    12: {
        "cublaslt": ["nvidia-cublas-cu12>=12.9,<13"],
        "cudnn": [_FRONTEND, "nvidia-cudnn-cu12>=9.7,<10"],
        "nvrtc": ["nvidia-cuda-nvrtc-cu12>=12.8,<13"],
        "nvshmem": ["nvidia-nvshmem-cu12==" + NVSHMEM_BUILD_VERSION],
    },
    13: {
        "cublaslt": ["nvidia-cublas>=13.0,<14"],
        "cudnn": [_FRONTEND, "nvidia-cudnn-cu13>=9.12,<10"],
        "nvrtc": ["nvidia-cuda-nvrtc>=13.0,<14"],
        "nvshmem": ["nvidia-nvshmem-cu13==" + NVSHMEM_BUILD_VERSION],
    },
}


def _log(msg: str) -> None:
    # pip shows a backend's output with -v (or when the build fails).
    print(f"jax-gpuext build: {msg}", file=sys.stderr, flush=True)


def _setting(config_settings: dict | None, name: str, default: str = "") -> str:
    """A CMake option as scikit-build-core will see it: -C cmake.define.NAME, else the environment."""
    value = (config_settings or {}).get(f"cmake.define.{name}")
    if value is None:
        value = os.environ.get(name, default)
    return str(value).strip()


def find_cuda_compiler(config_settings: dict | None = None) -> str | None:
    """The nvcc CMake's check_language(CUDA) would pick: CMAKE_CUDA_COMPILER, CUDACXX, PATH, CUDA_PATH."""
    for candidate in (_setting(config_settings, "CMAKE_CUDA_COMPILER"), os.environ.get("CUDACXX", "")):
        if candidate:
            return shutil.which(candidate) or (candidate if os.path.isfile(candidate) else None)
    found = shutil.which("nvcc")
    if found:
        return found
    cuda_path = os.environ.get("CUDA_PATH", "")
    nvcc = os.path.join(cuda_path, "bin", "nvcc")
    return nvcc if cuda_path and os.access(nvcc, os.X_OK) else None


def cuda_version(nvcc: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def toolkit_include_dirs(nvcc: str) -> list[str]:
    """The include directories nvcc itself uses (asked with --dryrun: nvcc may be a wrapper script)."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=120).stderr
    except (OSError, subprocess.SubprocessError):
        return []
    return re.findall(r'-I"?([^"\s]+)', "".join(l for l in out.splitlines() if "INCLUDES=" in l))


def _toolkit_has(include_dirs: list[str], header: str) -> bool:
    return any(os.path.isfile(os.path.join(d, header)) for d in include_dirs)


def gpu_build_requires(config_settings: dict | None = None) -> list[str]:
    """The header/library wheels the complete CUDA build needs here, or [] for a CPU-only build."""
    if _setting(config_settings, "JAX_GPUEXT_CUDA", "AUTO").upper() == "OFF":
        return []
    nvcc = find_cuda_compiler(config_settings)
    if nvcc is None:
        return []  # CMake builds the CPU extension only (AUTO) or stops with the fix (ON)
    version = cuda_version(nvcc)
    wheels = _WHEELS.get(version[0]) if version else None
    if wheels is None:
        _log(f"{nvcc} reports CUDA {version}; header wheels exist for CUDA 12 and 13 only, so the "
             "cuBLASLt/cuDNN/NVSHMEM parts need their headers found by CMake (see its messages)")
        return []
    toolkit = toolkit_include_dirs(nvcc)
    wanted = []
    if not _setting(config_settings, "JAX_GPUEXT_CUBLASLT_INCLUDE_DIR") and not _toolkit_has(toolkit, "cublasLt.h"):
        wanted.append("cublaslt")
    cudnn = _setting(config_settings, "JAX_GPUEXT_CUDNN", "AUTO").upper()
    if cudnn != "OFF" and not _setting(config_settings, "JAX_GPUEXT_CUDNN_INCLUDE_DIRS"):
        wanted.append("cudnn")
        if not _toolkit_has(toolkit, "nvrtc.h"):
            wanted.append("nvrtc")
    nvshmem = _setting(config_settings, "JAX_GPUEXT_NVSHMEM", "AUTO").upper()
    if nvshmem != "OFF" and not _setting(config_settings, "JAX_GPUEXT_NVSHMEM_HOME"):
        wanted.append("nvshmem")
    requires = [r for part in wanted for r in wheels[part]]
    _log(f"CUDA {version[0]}.{version[1]} compiler {nvcc}: build requirements for {', '.join(wanted) or 'nothing'}")
    return requires


def get_requires_for_build_wheel(config_settings=None):
    return [*_skbuild_requires_wheel(config_settings), *gpu_build_requires(config_settings)]


def get_requires_for_build_editable(config_settings=None):
    return [*_skbuild_requires_editable(config_settings), *gpu_build_requires(config_settings)]


# --------------------------------------------------------------------------- the build directory
def build_configuration(config_settings: dict | None = None) -> str:
    """A short name of what this build compiles: "cpu", or "cuda<major>-<architectures>". Each
    configuration keeps its own persistent build directory, so switching between a CPU-only and a
    CUDA build (or between architectures) never reconfigures or recompiles the other one."""
    if _setting(config_settings, "JAX_GPUEXT_CUDA", "AUTO").upper() == "OFF":
        return "cpu"
    nvcc = find_cuda_compiler(config_settings)
    version = cuda_version(nvcc) if nvcc else None
    if version is None:
        return "cpu"
    archs = _setting(config_settings, "JAX_GPUEXT_CUDA_ARCHITECTURES", "default") or "default"
    return f"cuda{version[0]}-" + re.sub(r"[^A-Za-z0-9]+", "_", archs).strip("_")


def with_build_dir(config_settings: dict | None) -> dict:
    """config_settings with build-dir = build/{wheel_tag}-<configuration>, unless the caller set
    one. The directory is inside the checkout and survives the build: a second `pip install .`
    reuses its objects (the inputs from pip's temporary build environment are mirrored at stable
    paths by cmake/stable_inputs.cmake, so an unchanged header never triggers a recompile)."""
    settings = dict(config_settings or {})
    if "build-dir" not in settings and "build_dir" not in settings:
        settings["build-dir"] = "build/{wheel_tag}-" + build_configuration(config_settings)
    return settings


def adopt_build_dirs(configuration: str, source_dir: str | None = None) -> list[str]:
    """Keeps the persistent build directories of ``configuration`` across build environments.

    scikit-build-core records its own path (inside pip's temporary build environment) in
    ``<build dir>/.skbuild-info.json`` and, when the next build runs from another temporary
    environment, deletes CMakeCache.txt and CMakeFiles/ -- where every object file lives -- "since
    the cache may hold paths into the old environment". Ours holds none that survive a configure:
    scikit-build-core's own entries (the FindPython resources, the prefix path) are written with
    FORCE on every configure, our headers come from stable mirrors (cmake/stable_inputs.cmake), and
    our find_path results are searched again every time. So, for a directory of this checkout and
    of the same scikit-build-core version, the record is updated to the current environment and
    the objects survive. Returns the directories adopted."""
    import glob
    import json

    import scikit_build_core
    from scikit_build_core import cmake as _skb_cmake

    source = os.path.realpath(source_dir or os.getcwd())
    adopted = []
    for info_path in glob.glob(os.path.join(source, "build", f"*-{configuration}", ".skbuild-info.json")):
        try:
            with open(info_path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue  # unreadable: scikit-build-core clears it, as it should
        if (not isinstance(info, dict) or info.get("source_dir") != source
                or info.get("skbuild_version") != scikit_build_core.__version__
                or info.get("skbuild_path") == str(_skb_cmake.DIR)):
            continue
        info["skbuild_path"] = str(_skb_cmake.DIR)
        with open(info_path, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
        adopted.append(os.path.dirname(info_path))
    for d in adopted:
        _log(f"reusing the objects in {d} (a new temporary build environment; inputs are mirrored)")
    return adopted


def _prepared(config_settings):
    settings = with_build_dir(config_settings)
    if settings["build-dir"].startswith("build/{wheel_tag}-"):
        adopt_build_dirs(build_configuration(config_settings))
    return settings


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _skbuild_build_wheel(wheel_directory, _prepared(config_settings), metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _skbuild_build_editable(wheel_directory, _prepared(config_settings), metadata_directory)
