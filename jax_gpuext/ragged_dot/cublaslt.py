"""The ``cublaslt`` backend of ``ragged_dot``: cuBLASLt's grouped GEMM, group sizes on the device.

Hopper (sm_90), cuBLAS >= 13.4 (gate ``cublaslt_grouped_fp8``): FP8_1x128 activations
(``VEC128_32F``) x FP8_128x128 (``BLK128x128_32F``) or FP8_1x128 weights, one cuBLASLt call for
all groups. ``group_sizes`` never leaves the device: kernels on the stream turn it into the
per-group pointers and shapes cuBLASLt reads (``csrc/ragged_dot/grouped_layout.h``), so a call
launches the same work every time and XLA may capture it in a CUDA graph.

Layout. As in the dense backend (``jax_gpuext.dot.cublaslt``), cuBLAS's A is our rhs and its B our lhs,
both K-contiguous ("TN", the only FP8 layout): per group ``out_g^T (N x rows) = rhs_g (op T) .
lhs_g (op N)``. Weights stored (G, N, K) go in as they are; (G, K, N), ``lax.ragged_dot``'s
order, are transposed by XLA on every call (a full copy of the weights: store them (G, N, K)).
The rhs scales are laid out here per group as the dense backend lays out one matrix's; the lhs
scales go in as (M, K/128) and the handler rearranges them per group on the device.

Group rows. cuBLAS's grouped GEMM asks every group's m, n, k to be 16-byte multiples
(NVIDIA's grouped samples), and our groups hold any number of rows. With ``row_align=16`` (the
default) the handler copies each group into a buffer where it starts on a 16-row boundary and
copies the result back (extra traffic: the lhs once, the output twice); ``row_align=1`` hands
cuBLASLt the groups in place, which the GPU tests try, to find out whether the copies can go.

The ragged-contracted mode (the weight gradient) is not wired: see ``supports``.
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
from jax_gpuext.dot import cublaslt as _dense_layouts
from jax_gpuext.ragged_dot import fp8_cuda
from jax_gpuext.ragged_dot.common import RaggedProblem

TARGET = _ext.declare_target("gpuext_ragged_dot_cublaslt", "ragged_dot")
COMPONENT = "ragged_dot.cublaslt"  # verified.COMPONENTS, cmake/verified_sources.txt
GATES = ("cuda_extension", "cuda_device", "cuda_driver", "ragged_dot_cublaslt_built", "cublaslt_grouped_fp8")

# The handler's workspace (csrc/ragged_dot/grouped_layout.cu, Carve): cuBLASLt's 32 MiB, the
# per-group arrays, the per-group lhs scales and, with row_align 16, the padded lhs and output;
# every section starts on a 256-byte boundary, and the buffer carries 256 bytes more so the
# handler can align its start. _cuda.cublaslt_grouped_workspace_bytes computes the same (tested).
CUBLAS_WORKSPACE_BYTES = 32 << 20
WORKSPACE_ALIGNMENT = 256
ROW_ALIGN = 16
ROW_ALIGNS = (1, 16)

SCALE_VEC128_32F = _dense_layouts.SCALE_VEC128_32F
SCALE_BLK128x128_32F = _dense_layouts.SCALE_BLK128x128_32F
OUT_CODES = {jnp.dtype(jnp.bfloat16): 0, jnp.dtype(jnp.float32): 2}  # the handler's: as dot.OUT_CODES


def _section(nbytes: int) -> int:
    return -(-nbytes // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT


def workspace_bytes(m: int, n: int, k: int, g: int, row_align: int, out_itemsize: int) -> int:
    """Bytes of the workspace result, before the alignment slack (C++ GroupedWorkspaceBytes)."""
    capacity = m + g * (max(row_align, 4) - 1)  # rows of the padded layout, at most
    total = (_section(CUBLAS_WORKSPACE_BYTES) + 5 * _section(8 * g) + 9 * _section(4 * g)
             + 2 * _section(8 * (g + 1)) + _section(4 * -(-k // 128) * capacity))
    if row_align > 1:
        total += _section(capacity * k) + _section(capacity * n * out_itemsize)
    return total


def rhs_scale_mode(fmt) -> int:
    return SCALE_BLK128x128_32F if fmt == formats.FP8_128x128 else SCALE_VEC128_32F


def supports(p: RaggedProblem) -> GateResult:
    why = fp8_cuda.problem_reason(p, (formats.FP8_128x128, formats.FP8_1x128), tuple(OUT_CODES),
                                  "cuBLASLt's grouped FP8 blockwise path")
    if why is not None:
        return GateResult(False, why)
    return _prepare_on_local_gpus(p)


def _prepare_on_local_gpus(p: RaggedProblem) -> GateResult:
    """The handle and the grouped algorithm for this shape on every local GPU, now (trace time),
    so no call does that host work while running or while XLA records it, and "no algorithm" is a
    trace-time no that ``auto`` moves past. Nothing is asked where no GPU or no handler exists."""
    if not gates.check_all(["cuda_extension", "ragged_dot_cublaslt_built", "cuda_device"]).supported or p.G == 0:
        return GateResult(True, p.describe())
    _ext.set_library_path("cublaslt", _libs.path("cublaslt"))
    for dev in jax.local_devices(backend="cuda"):
        ok, why = _ext.module("cuda").cublaslt_grouped_prepare(
            dev.local_hardware_id, p.M, p.N, p.K, p.G, OUT_CODES[p.out_dtype], rhs_scale_mode(p.rhs_format), ROW_ALIGN)
        if not ok:
            return GateResult(False, f"cuBLASLt on {dev}: {why}")
    return GateResult(True, p.describe())


def rhs_operand(rhs, p: RaggedProblem):
    """(data (G, N, K), scales (G, floats per group)) in the layout cuBLASLt reads for cuBLAS's A
    with ``rhs_scale_mode(p.rhs_format)``: per group what the dense backend passes for one matrix."""
    data, scale = fp8_cuda.weights_nk(rhs, p)
    if rhs.format == formats.FP8_128x128:  # (G, N/128, K/128): K-blocks padded to 4, K fastest
        return data, _dense_layouts.blocks_k_fastest(scale)
    return data, _dense_layouts.rows_fastest(scale)  # (G, N, K/128) -> K-blocks x N, N fastest


def impl(lhs, rhs, group_sizes, p: RaggedProblem, sel=None, *, row_align: int = ROW_ALIGN):
    """out (M, N) = the groups of lhs rows times their rhs matrices; rows past sum(group_sizes) are 0."""
    if row_align not in ROW_ALIGNS:
        raise ValueError(f"row_align must be one of {ROW_ALIGNS}, got {row_align}")
    fp8_cuda.check_lhs(lhs)
    data_r, scale_r = rhs_operand(rhs, p)
    if sel is not None and p.rhs_contract == 1:
        backends.note(sel, fp8_cuda.TRANSPOSE_NOTE)
    _ext.set_library_path("cublaslt", _libs.path("cublaslt"))
    ws = workspace_bytes(p.M, p.N, p.K, p.G, row_align, p.out_dtype.itemsize) + WORKSPACE_ALIGNMENT
    out, _ = _ffi.ffi_call(
        TARGET,
        (jax.ShapeDtypeStruct((p.M, p.N), p.out_dtype), jax.ShapeDtypeStruct((ws,), jnp.uint8)),
        lhs.data, lhs.scale.astype(jnp.float32), data_r, scale_r, group_sizes.astype(jnp.int32),
        vmap_method="sequential", rhs_scale_mode=np.int32(rhs_scale_mode(p.rhs_format)),
        row_align=np.int32(row_align))
    return out



def feature(p) -> str | None:
    """The GPU tests' feature of a problem (``verifies(..., feature=)``): "fp8_blockwise" for the
    FP8_1x128 activations this backend takes; None for anything else."""
    return "fp8_blockwise" if p.lhs_format.name == "FP8_1x128" else None


BACKEND = backends.Backend(
    "cublaslt", ("cuda",), GATES,
    "cuBLASLt grouped FP8 blockwise GEMM (Hopper), group sizes read on the device", supports,
    takes="ragged_m only; FP8_1x128 lhs x FP8_128x128 / FP8_1x128 rhs; K % 128 == 0, N % 8 == 0; bfloat16 or "
          "float32 output; Hopper with cuBLAS >= 13.4; when the heuristic finds a grouped algorithm on every "
          "local GPU at trace time", feature=feature)


def register(register_impl) -> None:
    """Adds this backend through the op's ``register_impl(name, backend, impl)`` (the op imports us)."""
    register_impl("cublaslt", BACKEND, impl)
