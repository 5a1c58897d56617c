"""Every capability gate of jax_gpuext, in one table.

A gate answers ``(supported, reason)``; the reason is stated whichever way it goes. The same
table feeds backend dispatch (``backends.py``), pytest skip markers (``tests/conftest.py``),
``jax_gpuext.capabilities()`` / ``python -m jax_gpuext info`` and the generated docs table
(``python -m jax_gpuext gates --markdown``). Add a gate here, with the reason it exists, and
nowhere else.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

from jax_gpuext.common import extension as _ext
from jax_gpuext.common import libs as _libs
from jax_gpuext.common.errors import UnsupportedError


class GateResult(NamedTuple):
    supported: bool
    reason: str

    def __bool__(self) -> bool:
        return self.supported


@dataclasses.dataclass(frozen=True)
class Gate:
    name: str
    category: str  # "build", "device", "library", "jax"
    requires: str  # the condition, in words
    why: str  # why the gate exists: what breaks without it
    check: Callable[[], GateResult]


GATES: dict[str, Gate] = {}


def _gate(name: str, category: str, requires: str, why: str):
    def register(fn: Callable[[], GateResult]) -> Callable[[], GateResult]:
        GATES[name] = Gate(name, category, requires, why, functools.cache(fn))
        return fn

    return register


def check(name: str) -> GateResult:
    """Evaluates gate ``name`` (cached per process)."""
    try:
        gate = GATES[name]
    except KeyError:
        raise KeyError(f"unknown gate {name!r}; known gates: {sorted(GATES)}") from None
    return gate.check()


def check_all(names) -> GateResult:
    """All of ``names`` open? The reason is the first closed gate's, or all reasons joined."""
    results = [(n, check(n)) for n in names]
    for n, r in results:
        if not r.supported:
            return GateResult(False, f"{n}: {r.reason}")
    return GateResult(True, "; ".join(f"{n}: {r.reason}" for n, r in results))


def require(name: str, what: str) -> None:
    """Raises UnsupportedError for ``what`` unless gate ``name`` is open."""
    r = check(name)
    if not r.supported:
        raise UnsupportedError(f"{what} needs gate {name!r}", gate=name, reason=r.reason)


def clear_cache() -> None:
    for g in GATES.values():
        g.check.cache_clear()


# --------------------------------------------------------------------------- facts
def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        digits = "".join(c for c in p if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _fmt(v) -> str:
    return ".".join(str(x) for x in v)


@functools.cache
def jax_version() -> tuple[int, ...]:
    import jax

    return _version_tuple(jax.__version__)


@functools.cache
def jaxlib_version() -> tuple[int, ...]:
    import jaxlib

    return _version_tuple(jaxlib.__version__)


@functools.cache
def cuda_devices() -> tuple:
    """JAX's CUDA devices, or () when JAX has no CUDA backend."""
    import jax

    try:
        return tuple(jax.devices("cuda"))
    except RuntimeError:
        return ()


def compute_capability(device=None) -> tuple[int, int] | None:
    devs = cuda_devices() if device is None else (device,)
    if not devs:
        return None
    cc = getattr(devs[0], "compute_capability", None)
    if cc is None:
        return None
    major, minor = str(cc).split(".")
    return int(major), int(minor)


@functools.cache
def driver_version() -> int | None:
    """CUDA driver API version as an int (13000 = 13.0), via cuda-python, else our extension."""
    try:
        from cuda.bindings import driver as cuda_driver  # cuda-python >= 12.6

        err, v = cuda_driver.cuDriverGetVersion()
        if int(err) == 0:
            return int(v)
    except Exception:  # noqa: BLE001 - cuda-python missing or no driver: try the extension
        pass
    mod = _ext.module("cuda")
    v = mod.driver_version() if mod is not None else 0
    return v or None


# --------------------------------------------------------------------------- build
@_gate("cpu_extension", "build", "jax_gpuext._cpu imports and XLA takes its FFI targets",
       "the CPU FFI handlers live there; without it only the pure-XLA paths (xla, reference) run")
def _cpu_extension():
    mod, why = _ext.load("cpu")
    if mod is None or _ext.registration_error("cpu"):
        return GateResult(False, why or f"jax_gpuext._cpu imported, but {_ext.registration_error('cpu')}")
    info = mod.build_info()
    return GateResult(True, f"built against XLA FFI API {info['ffi_api_major']}.{info['ffi_api_minor']}")


@_gate("cuda_extension", "build", "jax_gpuext._cuda imports and XLA takes its FFI targets",
       "every GPU handler and kernel lives there; it is built only where a CUDA compiler was found")
def _cuda_extension():
    mod, why = _ext.load("cuda")
    if mod is None or _ext.registration_error("cuda"):
        return GateResult(False, why or f"jax_gpuext._cuda imported, but {_ext.registration_error('cuda')}")
    info = mod.build_info()
    return GateResult(True, f"CUDA {info['cuda_version']}, architectures {info['architectures']}")


# --------------------------------------------------------------------------- jax
# The FFI C API minor version each jaxlib speaks (REFERENCE section 1). XLA accepts any
# handler built against an older or equal minor version.
FFI_API_MINOR_BY_JAXLIB = [((0, 6, 0), 1), ((0, 8, 1), 2), ((0, 9, 1), 3), ((0, 11, 1), 4), ((0, 12, 0), 5)]
SUPPORTED_JAXLIB = ((0, 7, 0), (0, 13, 0))


def jaxlib_ffi_api_minor() -> int | None:
    minor = None
    for first, m in FFI_API_MINOR_BY_JAXLIB:
        if jaxlib_version()[:3] >= first:
            minor = m
    return minor


@_gate("jaxlib_supported", "jax", "0.7.0 <= jaxlib < 0.13",
       "the range CI tests at both ends; our handlers are built against FFI API 0.1, which all of it accepts")
def _jaxlib_supported():
    lo, hi = SUPPORTED_JAXLIB
    v = jaxlib_version()
    ok = lo <= v[:3] < hi
    return GateResult(ok, f"jaxlib {_fmt(v)} {'is' if ok else 'is not'} in [{_fmt(lo)}, {_fmt(hi)})")


def _jaxlib_at_least(minimum: tuple[int, ...]) -> GateResult:
    v = jaxlib_version()
    ok = v[:3] >= minimum
    return GateResult(ok, f"jaxlib {_fmt(v)} {'>=' if ok else '<'} {_fmt(minimum)}")


@_gate("jaxlib_custom_call_memory_spaces", "jax", "jaxlib >= 0.10.0",
       "older XLA ignores the operands_memory_spaces / results_memory_spaces frontend attributes")
def _jaxlib_memory_spaces():
    return _jaxlib_at_least((0, 10, 0))


@_gate("jax_memory_space_api", "jax", "jax >= 0.7.1",
       "jax.memory.Space (device_put to pinned_host inside jit, used by place(x, PINNED_HOST)) first appears in 0.7.1")
def _jax_memory_space_api():
    import jax

    ok = hasattr(jax, "memory") and hasattr(jax.memory, "Space")
    return GateResult(ok, f"jax {_fmt(jax_version())} {'has' if ok else 'lacks'} jax.memory.Space")


@_gate("jax_scaled_matmul_cpu", "jax", "jax >= 0.11.0",
       "jax.nn.scaled_matmul has a CPU lowering only from 0.11.0; used as a cross-check baseline")
def _jax_scaled_matmul_cpu():
    v = jax_version()
    ok = v[:3] >= (0, 11, 0)
    return GateResult(ok, f"jax {_fmt(v)} {'>=' if ok else '<'} 0.11.0")


@_gate("jaxlib_ffi_collectives", "jax", "jaxlib >= 0.11.2",
       "the FFI collectives extension (XLA's ncclComm_t inside a handler) first appears in 0.11.2")
def _jaxlib_ffi_collectives():
    return _jaxlib_at_least((0, 11, 2))


# --------------------------------------------------------------------------- device
@_gate("cuda_device", "device", "JAX sees at least one CUDA GPU",
       "GPU handlers need a device and JAX's CUDA plugin (jax[cuda12] / jax[cuda13])")
def _cuda_device():
    devs = cuda_devices()
    if not devs:
        return GateResult(False, "JAX has no CUDA devices (jax.devices('cuda') failed)")
    cc = compute_capability()
    return GateResult(True, f"{len(devs)} x {devs[0].device_kind} (sm_{cc[0]}{cc[1]})" if cc else
                      f"{len(devs)} x {devs[0].device_kind}")


@_gate("cuda_driver", "device", "driver CUDA version >= the CUDA major the extension was built with",
       "cudart is linked statically, so the driver must support the toolkit that built _cuda")
def _cuda_driver():
    info = _ext.build_info("cuda")
    if info is None:
        return GateResult(False, "no CUDA extension to run")
    dv = driver_version()
    if dv is None:
        return GateResult(False, "no CUDA driver found")
    need = info["cuda_runtime_version"] // 1000
    ok = dv // 1000 >= need
    return GateResult(ok, f"driver supports CUDA {dv // 1000}.{dv % 1000 // 10}, "
                          f"extension built with CUDA {info['cuda_version']}")


def _cc_gate(predicate, text):
    cc = compute_capability()
    if cc is None:
        return GateResult(False, "no CUDA device")
    ok = predicate(cc)
    return GateResult(ok, f"sm_{cc[0]}{cc[1]} {'is' if ok else 'is not'} {text}")


@_gate("sm80", "device", "compute capability >= 8.0",
       "the oldest SASS we build (sm_80); bf16 kernels need Ampere")
def _sm80():
    return _cc_gate(lambda cc: cc >= (8, 0), ">= sm_80")


@_gate("fp8_tensor_cores", "device", "compute capability >= 8.9",
       "FP8 (E4M3/E5M2) tensor-core matmuls exist from Ada/Hopper on")
def _fp8_tensor_cores():
    return _cc_gate(lambda cc: cc >= (8, 9), ">= sm_89")


@_gate("hopper", "device", "compute capability == 9.0",
       "sm_90a code (wgmma, TMA) runs only on sm_90; cuBLASLt's 1x128/128x128 FP8 scale modes are Hopper-only")
def _hopper():
    return _cc_gate(lambda cc: cc == (9, 0), "sm_90")


@_gate("blackwell", "device", "compute capability 10.x",
       "MXFP8/NVFP4 block-scaled tensor-core MMA (tcgen05) exists only on sm_100-class GPUs")
def _blackwell():
    return _cc_gate(lambda cc: cc[0] == 10, "sm_10x")


# --------------------------------------------------------------------------- libraries
def _library_at_least(key: str, minimum: tuple[int, ...]) -> GateResult:
    v, where = _libs.version(key)
    name = _libs.LIBRARIES[key].name
    if v is None:
        return GateResult(False, where)
    ok = v >= minimum
    return GateResult(ok, f"{name} {_fmt(v)} {'>=' if ok else '<'} {_fmt(minimum)} ({where})")


@_gate("cudnn_block_scale", "library", "cuDNN >= 9.7",
       "block_scale_dequantize / block_scale_quantize graph ops first appear in cuDNN 9.7")
def _cudnn_block_scale():
    return _library_at_least("cudnn", (9, 7, 0))


@_gate("cudnn_fused_global_scale", "library", "cuDNN >= 9.13",
       "before 9.13 a graph with the NVFP4 global scale compiles but silently does not apply it")
def _cudnn_fused_global_scale():
    return _library_at_least("cudnn", (9, 13, 0))


@_gate("cudnn_frontend_cudart", "library", "at most one of libcudart.so.12 / .so.13 can be loaded",
       "cudnn-frontend's dynamic-loading shim dlopens libcudart.so.12 and .so.13 by name and throws "
       "'Multiple libcudart libraries found' when both load (a CUDA 12 runtime on LD_LIBRARY_PATH or in "
       "ldconfig beside jax's CUDA 13 wheels); refused here with the files rather than failing inside a call")
def _cudnn_frontend_cudart():
    found = _libs.loadable_cudarts()
    where = ", ".join(f"{soname} ({path or 'file unknown'})" for soname, path in found)
    if len(found) > 1:
        return GateResult(False, f"both load: {where}; make only the one matching jaxlib's CUDA loadable "
                                 "(take the other off LD_LIBRARY_PATH / out of ldconfig, or uninstall its wheel)")
    if not found:
        return GateResult(True, "no libcudart.so.12/.13 loads: the block-scaled graph needs none (we set the SM "
                                "version), only the frontend's logging would fail, cleanly")
    return GateResult(True, f"only {where}")


@_gate("cudnn_graph_safety_notes", "library", "cuDNN >= 9.15",
       "CUDNN_BEHAVIOR_NOTE_CUBLASLT_DEPENDENCY marks plans that are unsafe inside CUDA graphs")
def _cudnn_graph_safety_notes():
    return _library_at_least("cudnn", (9, 15, 0))


@_gate("cublaslt_mx_scales", "library", "cuBLASLt >= 12.8.4",
       "the VEC32_UE8M0 (MXFP8) and VEC16_UE4M3 (NVFP4) scale modes first appear in CUDA 12.8, and "
       "up to 12.8.3 cuBLASLt's heuristic cache can confuse an MXFP8 key with a non-block-scaled one")
def _cublaslt_mx_scales():
    return _library_at_least("cublaslt", (12, 8, 4))


@_gate("cublaslt_fp8", "library", "cuBLASLt 12.x/13.x loads; >= 12.1.3 on Ada (sm_89)",
       "FP8 cublasLtMatmul (per-tensor SCALAR_32F scales, the mode every FP8 GPU has): TransformerEngine "
       "requires cuBLASLt 12.1.3 for FP8 on Ada (quantization.py); Hopper FP8 is in every cuBLAS 12. We set no "
       "A/B_SCALE_MODE for SCALAR_32F (the default), since cuBLAS < 12.8 rejects that attribute")
def _cublaslt_fp8():
    cc = compute_capability()
    if cc is None:
        return GateResult(False, "no CUDA device")
    return _library_at_least("cublaslt", (12, 1, 3) if cc == (8, 9) else (12, 0, 0))


@_gate("cublaslt_blockwise_fp8", "library", "cuBLASLt >= 12.9",
       "the VEC128_32F / BLK128x128_32F (DeepSeek-style FP8) scale modes first appear in cuBLAS 12.9")
def _cublaslt_blockwise_fp8():
    return _library_at_least("cublaslt", (12, 9, 0))


@_gate("cublaslt_grouped_fp8", "library", "cuBLASLt >= 13.4 and an sm_90 GPU",
       "cuBLASLt's grouped GEMM with device-side shapes (cublasLtGroupedMatrixLayoutCreate) first appears in "
       "cuBLAS 13.2 (CUDA 13.1) for Blackwell; Hopper, and the VEC128_32F / BLK128x128_32F FP8 scale modes in "
       "grouped mode, from 13.4 (what TransformerEngine's cublaslt_grouped_gemm.cu requires); those scale modes "
       "exist on sm_90 only, and no CUDA 12 cuBLAS has the grouped API (docs/design.md, issue 30)")
def _cublaslt_grouped_fp8():
    cc = compute_capability()
    if cc is None:
        return GateResult(False, "no CUDA device")
    if cc != (9, 0):
        return GateResult(False, f"sm_{cc[0]}{cc[1]} is not sm_90: the grouped FP8 blockwise scale modes are "
                                 "Hopper-only")
    return _library_at_least("cublaslt", (13, 4, 0))


@_gate("nvshmem", "library", "libnvshmem_host.so.3 loads (NVSHMEM 3.x)",
       "the NVSHMEM all-reduce needs the host library and a symmetric heap")
def _nvshmem():
    return _library_at_least("nvshmem", (3, 0, 0))


# --------------------------------------------------------------------------- block-scaled dot (issue 4)
def _cuda_target_built(target: str, part: str, missing: str) -> GateResult:
    mod = _ext.module("cuda")
    if mod is None:
        return GateResult(False, "no CUDA extension")
    ok = target in mod.registrations()
    # The build's own record (build_parts.json) says why a part is missing and how to get it.
    return GateResult(ok, f"_cuda has {target}" if ok else (_ext.missing_part_reason(part) or missing))


_NO_CUBLASLT_H = ("built without cublasLt.h (pip install nvidia-cublas in the build env, or set "
                  "JAX_GPUEXT_CUBLASLT_INCLUDE_DIR)")


@_gate("cublaslt_dot_built", "build", "_cuda built with cublasLt.h",
       "the cuBLASLt block-scaled dot handler is compiled only where cublasLt.h was found at build time")
def _cublaslt_dot_built():
    return _cuda_target_built("gpuext_block_scaled_dot_cublaslt", "cublaslt_dot", _NO_CUBLASLT_H)


@_gate("ragged_dot_cublaslt_built", "build", "_cuda built with cublasLt.h",
       "the grouped cuBLASLt ragged_dot handler is compiled with the cuBLASLt dot, only where cublasLt.h was "
       "found at build time (any version: the grouped entry point is looked up at run time)")
def _ragged_dot_cublaslt_built():
    return _cuda_target_built("gpuext_ragged_dot_cublaslt", "cublaslt_dot", _NO_CUBLASLT_H)


@_gate("cudnn_dot_built", "build", "_cuda built with JAX_GPUEXT_CUDNN on",
       "the cuDNN block-scaled dot needs the cudnn-frontend headers at build time (JAX_GPUEXT_CUDNN=AUTO|ON)")
def _cudnn_dot_built():
    return _cuda_target_built("gpuext_block_scaled_dot_cudnn", "cudnn_dot",
                              "built without the cuDNN backend (JAX_GPUEXT_CUDNN=OFF, or AUTO found no "
                              "cudnn-frontend headers)")


@_gate("nvshmem_allreduce_module", "build", "jax_gpuext._nvshmem imports (libnvshmem_host.so.3 loaded first)",
       "the NVSHMEM all-reduce kernels live in their own module, built only where NVSHMEM headers "
       "were found, so that `import jax_gpuext` never needs libnvshmem_host")
def _nvshmem_allreduce_module():
    mod, why = _ext.load_nvshmem()
    if mod is None:
        return GateResult(False, why)
    info = mod.build_info()
    return GateResult(True, f"built against NVSHMEM {info['nvshmem_version']}")


# --------------------------------------------------------------------------- memory spaces (issue 33)
# Probes that need a layer above common/ (a program of ours run on the device): registered by that
# layer at import, so gates never import upward (docs/design.md, "Where things are").
_PROBES: dict = {}


def set_probe(name: str, fn) -> None:
    _PROBES[name] = fn


@_gate("gpu_temp_memory_space", "jax",
       "JAX's GPU client can allocate XLA memory space 2 (TEMP): the process started with "
       "XLA_FLAGS=--xla_gpu_temp_buffer_use_separate_color=true (a probe program placed in it runs)",
       "XLA:GPU compiles a buffer into space 2 whenever a custom call asks (results_memory_spaces), but the "
       "PJRT GPU client adds an allocator for that space only when --xla_gpu_temp_buffer_use_separate_color is "
       "true in XLA_FLAGS as the client is created (xla/pjrt/gpu/se_gpu_pjrt_client.cc); without it every run "
       "fails with 'No allocator found in MultiDeviceAdapter for device ordinal 0 and memory space 2' (H200, "
       "jaxlib 0.11.2). The flag is read once per process and newer clients may differ, so the gate runs a "
       "small program in TEMP memory rather than reading XLA_FLAGS")
def _gpu_temp_memory_space():
    r = check_all(["cuda_extension", "cuda_device", "jaxlib_custom_call_memory_spaces"])
    if not r.supported:
        return r
    import os
    import re

    probe = _PROBES.get("temp_memory_space")
    if probe is None:
        return GateResult(False, "jax_gpuext.memory is not imported (it registers this gate's probe)")
    flags = re.findall(r"--xla_gpu_temp_buffer_use_separate_color(?:=(\w+))?", os.environ.get("XLA_FLAGS", ""))
    flag_on = bool(flags) and flags[-1].lower() in ("", "true", "1")
    why = probe()
    if why is None:
        return GateResult(True, "a program with a buffer in memory space 2 ran on this GPU client")
    if "No allocator found" in why:
        hint = ("XLA_FLAGS has the flag now, but it was not there when JAX created its GPU client (set it before "
                "the process starts)" if flag_on else
                "start the process with XLA_FLAGS=--xla_gpu_temp_buffer_use_separate_color=true")
        return GateResult(False, f"JAX's GPU client has no allocator for memory space 2 (TEMP): {hint}")
    return GateResult(False, f"a program with a buffer in memory space 2 failed: {why[:300]}")
