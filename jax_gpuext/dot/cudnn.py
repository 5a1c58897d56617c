"""The ``cudnn`` backend of ``block_scaled_dot``: a cuDNN graph on Blackwell.

Graph (cudnn-frontend >= 1.13, cuDNN >= 9.7, sm_10x): ``block_scale_dequantize(lhs, s_lhs)`` and
``block_scale_dequantize(rhs, s_rhs)`` feeding one ``matmul`` with float32 compute; cuDNN fuses
them into a block-scaled tensor-core kernel. Scales in the F8_128x4 tiled layout
(``formats.to_blackwell_scale_layout``).

Global scale (NVFP4). cuDNN >= 9.13 fuses it (gate ``cudnn_fused_global_scale``); before 9.13 a
graph with it compiles but silently ignores it (REFERENCE section 3), so there we multiply the
float32 result separately, and say so through ``backends.note`` (``explain`` shows it).

The handler (``ffi/cuda/block_scaled_dot_cudnn.cc``) is compiled only with ``JAX_GPUEXT_CUDNN``
on (gate ``cudnn_dot_built``); it dlopens the cuDNN that ``_libs`` found.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_gpuext import formats
from jax_gpuext.common import backends, gates
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import ffi as _ffi
from jax_gpuext.common import libs as _libs
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot import common as _dot

TARGET = _ext.declare_target("gpuext_block_scaled_dot_cudnn", "block_scaled_dot")
# Largest workspace we let a plan use; plans wanting more are skipped at build time.
WORKSPACE_BYTES = 64 * 1024 * 1024


def supports(p) -> GateResult:
    fam = p.lhs_format.family
    if fam not in ("mx", "nvfp4"):
        return GateResult(False, f"cuDNN block_scale_dequantize takes MXFP8/NVFP4, not {p.lhs_format.name}")
    if _dot.mx_fp4_operand(p):
        return GateResult(False, f"{p.lhs_format.name} x {p.rhs_format.name}: the cuDNN handler builds E2M1 "
                                 "operands as NVFP4 (16-blocks, E4M3 scales); an MXFP4 graph (E2M1 with E8M0 per "
                                 "32) needs a scale-type attribute it does not have yet")
    b, m, n, k = p.bmnk
    if k % 128:  # whole 4-wide columns of the 128x4 scale tiles, and 16-byte aligned FP4 rows
        return GateResult(False, f"K={k} is not a multiple of 128")
    e5 = jnp.dtype(jnp.float8_e5m2)
    if p.lhs_format.element_dtype == e5 and p.rhs_format.element_dtype == e5:
        return GateResult(False, "no E5M2 x E5M2 block-scaled MMA")
    if p.batched_global_scale:
        return GateResult(False, "the NVFP4 global scales are per batch entry (quantized under vmap, used "
                                 "outside it); the graph takes one alpha scalar")
    return _prepare_on_local_gpus(p)


# --------------------------------------------------------------------------- trace-time graphs
def _graph_config(p):
    """(graph output dtype, fuse the global scale, drop cuBLASLt-dependent plans) of a call: one
    definition for the trace-time build and the handler's attributes, so both use one cache key.

    Plans are never filtered by graph safety: the handler is not kCmdBufferCompatible (so XLA
    never captures it), and dropping cuBLASLt-backed plans could only remove the fastest plan, or
    every plan. The filter (gate ``cudnn_graph_safety_notes``) belongs with that trait, once the
    GPU tests show cuDNN's execute meets REFERENCE section 2; ``probe`` can already try it."""
    fused = p.has_global_scale and gates.check("cudnn_fused_global_scale").supported
    out_dtype = jnp.dtype(jnp.float32) if p.has_global_scale and not fused else p.out_dtype
    return out_dtype, fused, False


def _prepare(device: int, lhs_info, rhs_info, b, m, n, k, out_dtype, fused, drop_cublaslt) -> dict:
    _ext.set_library_path("cudnn", _libs.path("cudnn"))
    ok, why, ws = _ext.module("cuda").cudnn_prepare(
        device, b, m, n, k, _dot.element_code(lhs_info), _dot.element_code(rhs_info),
        _dot.OUT_CODES[jnp.dtype(out_dtype)], bool(fused), bool(drop_cublaslt), WORKSPACE_BYTES)
    return {"supported": bool(ok), "reason": why, "workspace_bytes": int(ws)}


def _prepare_on_local_gpus(p) -> GateResult:
    """Builds (and caches) the graph on every local GPU now, at trace time, so no call builds one
    while running or being captured into a CUDA graph, and a graph cuDNN cannot build is a
    trace-time "no" that ``auto`` moves past (``explain`` shows cuDNN's reason). Where no GPU or
    no cuDNN build is present (CPU tests, AOT lowering) nothing is asked here."""
    if not gates.check_all(["cuda_extension", "cudnn_dot_built", "cuda_device"]).supported:
        return GateResult(True, p.describe())
    out_dtype, fused, drop = _graph_config(p)
    b, m, n, k = p.bmnk
    for dev in jax.local_devices(backend="cuda"):
        r = _prepare(dev.local_hardware_id, p.lhs_format, p.rhs_format, b, m, n, k, out_dtype, fused, drop)
        if not r["supported"]:
            return GateResult(False, f"cuDNN cannot build this graph on {dev}: {r['reason']}")
    return GateResult(True, p.describe())


def probe(lhs_format, rhs_format, m: int, n: int, k: int, *, batch: int = 1, out_dtype=jnp.bfloat16,
          fuse_alpha: bool = False, drop_cublaslt_plans: bool = False, device: int = -1) -> dict:
    """Asks a GPU's cuDNN directly, past our gates, whether it builds this backend's graph for one
    problem: ``{"supported", "reason", "workspace_bytes"}``. Nothing runs.

    For recording what cuDNN supports on a GPU the ``blackwell`` gate excludes
    (benchmarks/probe_cudnn.py; issue 4 asks for the H100). ``device``: CUDA ordinal, -1 current.
    """
    infos = [_dot.format_info(f) for f in (lhs_format, rhs_format)]
    if any(i.family not in ("mx", "nvfp4") for i in infos):
        raise ValueError(f"dot.cudnn.probe: the cuDNN graph takes MXFP8/NVFP4, got {lhs_format}, {rhs_format}")
    for g in ("cuda_extension", "cudnn_dot_built", "cuda_device", "cudnn_frontend_cudart"):
        gates.require(g, "dot.cudnn.probe")
    return _prepare(device, infos[0], infos[1], batch, m, n, k, out_dtype, fuse_alpha, drop_cublaslt_plans)


# --------------------------------------------------------------------------- the call
def _operand(data, scale, info):
    if info.family == "nvfp4":  # the graph reads the E4M3 scales as unsigned
        data, scale = _dot.fold_scale_signs(data, scale)
        data = _dot.pack_fp4(data)
    tiled = formats.to_blackwell_scale_layout(scale)
    return data, jax.lax.bitcast_convert_type(tiled, jnp.uint8)


def impl(lhs, rhs, p, sel):
    la, ls = _dot.to_canonical(lhs, p.lhs_contract, p.lhs_batch)
    ra, rs = _dot.to_canonical(rhs, p.rhs_contract, p.rhs_batch)
    k = la.shape[2]
    la, ls = _operand(la, ls, p.lhs_format)
    ra, rs = _operand(ra, rs, p.rhs_format)
    alpha = _dot.global_alpha(lhs, rhs, p)
    out_dtype, fused, graph_safe = _graph_config(p)
    if p.has_global_scale and not fused:
        backends.note(sel, "global scale applied by a separate float32 multiply (cuDNN < 9.13 would ignore "
                           "it inside the graph)")
    elif fused:
        backends.note(sel, "global scale fused into the cuDNN graph (cuDNN >= 9.13)")
    bsz, m, n = la.shape[0], la.shape[1], ra.shape[1]
    _ext.set_library_path("cudnn", _libs.path("cudnn"))
    out, _ = _ffi.ffi_call(
        TARGET,
        (jax.ShapeDtypeStruct((bsz, m, n), out_dtype), jax.ShapeDtypeStruct((WORKSPACE_BYTES,), jnp.uint8)),
        la, ls, ra, rs, alpha,
        vmap_method="sequential",
        k=np.int64(k), lhs_type=np.int32(_dot.element_code(p.lhs_format)),
        rhs_type=np.int32(_dot.element_code(p.rhs_format)), fuse_alpha=np.int32(bool(fused)),
        graph_safe=np.int32(graph_safe))
    if p.has_global_scale and not fused:
        out = (out * alpha[0]).astype(p.out_dtype)
    return _dot.from_canonical(out, p)


def feature(p) -> str | None:
    """The GPU tests' feature of a problem (``verifies(..., feature=)``): mxfp8 or nvfp4; None for
    formats it does not take."""
    return {"mx": "mxfp8", "nvfp4": "nvfp4"}.get(p.lhs_format.family)


# Backend ``cudnn`` of ``block_scaled_dot``: dot/block_scaled_dot.py registers it with ``impl``.
BACKEND = backends.Backend(
    "cudnn", ("cuda",),
    ("cuda_extension", "cuda_device", "cuda_driver", "blackwell", "cudnn_block_scale", "cudnn_dot_built",
     "cudnn_frontend_cudart"),
    "cuDNN graph: block_scale_dequantize x2 + matmul (Blackwell MXFP8/NVFP4)", supports,
    takes="MXFP8 (not E5M2 x E5M2) and NVFP4 with K % 128 == 0, when cuDNN builds the graph on every "
          "local GPU at trace time", feature=feature)
