"""The ``cublaslt`` backend of ``block_scaled_dot``: one cuBLASLt matmul per call.

- Hopper (sm_90), cuBLAS >= 12.9: FP8 blockwise, the DeepSeek-V3 recipe. lhs FP8_1x128
  (``VEC128_32F``) x rhs FP8_128x128 (``BLK128x128_32F``) or FP8_1x128.
- Blackwell (sm_10x), cuBLAS >= 12.8.4: MXFP8 (``VEC32_UE8M0``) and NVFP4 (``VEC16_UE4M3``),
  scales in the 128x4 tiled layout.
- Any FP8 GPU (sm_89+): per-tensor FP8, FP8_TENSOR x FP8_TENSOR (``SCALAR_32F``): the classic
  recipe, and the benchmark's per-tensor baseline.

Layout. cuBLASLt is column-major; our canonical operands are row-major ``lhs (B, M, K)`` and
``rhs (B, N, K)``. Computing ``out^T (N x M, column-major) = rhs (op T) . lhs (op N)`` makes
cuBLAS's A our rhs and its B our lhs, both K-contiguous: the "TN" layout, the only one cuBLASLt
accepts for FP8. The scale tensors are rearranged here, in XLA, into the layouts the cuBLAS
docs ("Block scaling factors layout") prescribe for cuBLAS's A (= our rhs) and B (= our lhs).

The global scales (NVFP4) are applied as cuBLASLt's alpha, read from device memory
(``CUBLASLT_POINTER_MODE_DEVICE``), so they are fused and no host sync is needed.
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

TARGET = _ext.declare_target("gpuext_block_scaled_dot_cublaslt", "block_scaled_dot")
# cuBLAS recommends 32 MiB of workspace on Hopper/Blackwell; passed as an extra result so the
# handler never allocates (REFERENCE section 2), with WORKSPACE_SLACK more bytes so the handler
# can align its start to the 256 bytes cuBLASLt requires.
WORKSPACE_BYTES = 32 * 1024 * 1024
WORKSPACE_SLACK = 256

# cublasLtMatmulMatrixScale_t (cublasLt.h, CUDA 13); the handler static_asserts the same values.
SCALE_SCALAR_32F = 0
SCALE_VEC16_UE4M3 = 1
SCALE_VEC32_UE8M0 = 2
SCALE_VEC128_32F = 4
SCALE_BLK128x128_32F = 5
BLOCK_SCALE_MODES = (SCALE_VEC16_UE4M3, SCALE_VEC32_UE8M0, SCALE_VEC128_32F, SCALE_BLK128x128_32F)

# Rows of the 1-D-scaled (VEC128_32F) lhs, which is cuBLAS's B operand, are padded to this multiple
# (zero rows, scale 1; the padding rows of the output are sliced off). TransformerEngine's
# cublaslt_gemm.cu requires that operand's row count % 8 ("only present for B tensor is 1D
# quantized") and every shape NVIDIA tests is % 16; 16 satisfies both and the VEC128 layout's % 4.
# The handler (csrc/dot/cublaslt_block_scaled.cc, CheckBlockScaledMatmul) refuses any other M.
FP8_BLOCK_ROW_MULTIPLE = 16
# A per-tensor (SCALAR_32F) scale occupies a slot of this many float32s per batch entry, its value
# first: the handler hands cuBLASLt batch i's scale at byte offset 16 * i. Packed one float per batch,
# every odd batch's scale pointer was only 4- or 8-byte aligned, and cuBLASLt's FP8 matmul returned
# CUBLAS_STATUS_NOT_SUPPORTED for a batched per-tensor dot on the H200 (docs/design.md, issue 33);
# every other scale layout's per-batch size is already a multiple of 16 bytes. The handler's
# stand-in scale pointers at trace time are 16-byte aligned: the plan is chosen for the pointers
# the calls really pass. csrc/dot/cublaslt_block_scaled.h kScalarScaleSlotBytes is the same size.
SCALAR_SCALE_SLOT = 4
# cuBLAS's m (our N) in every block-scaling mode: TE checks m % 8 for block-scaled A operands
# ("(m * CTypeSize) % 16 == 0", the smallest output type being 2 bytes), and the 1x128 rhs's
# VEC128 scale rows need N % 4. Weights are not padded per call (it would copy them): a gate.
BLOCK_SCALED_N_MULTIPLE = 8


def _fp8_pair_ok(p) -> GateResult:
    e5 = jnp.dtype(jnp.float8_e5m2)
    if p.lhs_format.element_dtype == e5 and p.rhs_format.element_dtype == e5:
        return GateResult(False, "cuBLASLt has no E5M2 x E5M2 FP8 matmul")
    return GateResult(True, "")


def supports(p) -> GateResult:
    b, m, n, k = p.bmnk
    fam = p.lhs_format.family
    if p.out_dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32), jnp.dtype(jnp.float16)):
        return GateResult(False, f"output dtype {p.out_dtype} not supported")
    if k == 0:
        return GateResult(False, "K=0: nothing to contract (the reference returns zeros)")
    if p.batched_global_scale:
        return GateResult(False, "the NVFP4 global scales are per batch entry (quantized under vmap, used "
                                 "outside it); cuBLASLt takes one alpha per call")
    # out^T is cuBLAS's D, column-major with leading dimension N: its columns (our rows) must
    # start 16-byte aligned, as every FP8 matmul requires (cuBLAS docs, cublasLtMatmul).
    row_multiple = 16 // p.out_dtype.itemsize
    if n % row_multiple:
        return GateResult(False, f"N={n} is not a multiple of {row_multiple} ({p.out_dtype} output rows must be "
                                 f"16-byte aligned)")
    if fam in ("fp8_block", "mx", "nvfp4") and n % BLOCK_SCALED_N_MULTIPLE:
        return GateResult(False, f"N={n} is not a multiple of {BLOCK_SCALED_N_MULTIPLE} (cuBLAS's m in a "
                                 f"block-scaling mode; TransformerEngine's cublaslt_gemm.cu requires it)")
    if fam == "fp8_block":
        if p.out_dtype == jnp.dtype(jnp.float16):
            return GateResult(False, "float16 output with VEC128_32F / BLK128x128_32F scales is not in NVIDIA's "
                                     "tests (TransformerEngine tests bfloat16 and float32): refused until a GPU "
                                     "test shows it works; ask for bfloat16 or float32")
        r = gates.check_all(["hopper", "cublaslt_blockwise_fp8"])
        if not r.supported:
            return GateResult(False, f"FP8 blockwise needs Hopper and cuBLAS >= 12.9 ({r.reason})")
        if p.lhs_format.two_d:
            return GateResult(False, "cuBLASLt takes 128x128 scales only on the weight side (rhs); lhs must be "
                                     "FP8_1x128")
        if k % 128:
            return GateResult(False, f"K={k} is not a multiple of 128")
        # (M is padded to FP8_BLOCK_ROW_MULTIPLE in impl.)
        if p.has_global_scale:
            return GateResult(False, "FP8 blockwise operands carry no global scale")
    elif fam == "fp8_tensor":  # SCALAR_32F: every FP8 GPU (the fp8_tensor_cores gate)
        if k % 16 or n % 16:  # FP8 kernels need 16-byte aligned operand rows and output rows
            return GateResult(False, f"per-tensor FP8 needs K and N multiples of 16, got K={k}, N={n}")
    elif fam in ("mx", "nvfp4"):
        if _dot.mx_fp4_operand(p):
            return GateResult(False, f"{p.lhs_format.name} x {p.rhs_format.name}: the handler maps E2M1 to NVFP4's "
                                     "VEC16_UE4M3 only; cuBLASLt's E2M1 with VEC32_UE8M0 (MXFP4) and FP8 x FP4 "
                                     "operand pairs are not wired or GPU-tested (hopper_mx and the reference take them)")
        r = gates.check_all(["blackwell", "cublaslt_mx_scales"])
        if not r.supported:
            return GateResult(False, f"MXFP8/NVFP4 tensor-core scaling needs Blackwell and cuBLAS >= 12.8.4 "
                                     f"({r.reason})")
        if k % 32:  # 16-byte aligned rows of packed FP4 / FP8 and whole 4-wide scale columns
            return GateResult(False, f"K={k} is not a multiple of 32")
    else:
        return GateResult(False, f"format family {fam} not supported")
    r = _fp8_pair_ok(p)
    if not r.supported:
        return r
    return _prepare_on_local_gpus(p)


def _prepare_on_local_gpus(p) -> GateResult:
    """Creates the cuBLASLt handle and asks the heuristic for this matmul on every local GPU now,
    at trace time, so no call does host work while running or being captured into a CUDA graph,
    and "no algorithm" is a trace-time "no" that ``auto`` moves past (``explain`` shows it).
    Where no GPU or no cuBLASLt build is present (CPU tests, AOT lowering) nothing is asked."""
    if not gates.check_all(["cuda_extension", "cublaslt_dot_built", "cuda_device"]).supported:
        return GateResult(True, p.describe())
    _ext.set_library_path("cublaslt", _libs.path("cublaslt"))
    b, m, n, k = p.bmnk
    if p.lhs_format.family == "fp8_block":
        m = _round_up(m, FP8_BLOCK_ROW_MULTIPLE)  # the M the call will run with (impl's _pad_rows)
    for dev in jax.local_devices(backend="cuda"):
        ok, why = _ext.module("cuda").cublaslt_prepare(
            dev.local_hardware_id, m, n, k, _dot.element_code(p.lhs_format), _dot.element_code(p.rhs_format),
            _dot.OUT_CODES[jnp.dtype(p.out_dtype)], _scale_mode(p.lhs_format), _scale_mode(p.rhs_format),
            WORKSPACE_BYTES)
        if not ok:
            return GateResult(False, f"cuBLASLt on {dev}: {why}")
    return GateResult(True, p.describe())


# --------------------------------------------------------------------------- scale layouts
def _round_up(x, m):
    return -(-x // m) * m


def _tile_128x4(s):
    """(B, R, C) block scales -> the Blackwell 128x4 tiled layout (formats helper), flat per batch.

    Padding scales (rows to 128, columns to 4) never meet data: cuBLAS reads only real blocks.
    """
    return formats.to_blackwell_scale_layout(s).reshape(s.shape[0], -1)


# The two FP8-blockwise scale layouts, from the cuBLAS docs ("Scaling factors layouts"), for cuBLAS's
# A (= our rhs) and B (= our lhs); M and N (our rows) must be multiples of 4 (we pad M to 16 and
# require N % 8, which TransformerEngine checks too). The grouped backend (ragged_dot/cublaslt.py)
# lays out each group's rhs scales with them: a group is one matrix to cuBLAS.
def rows_fastest(s):
    """VEC128_32F: (B, rows, Kb) fp32 -> per batch a rows x Kb matrix, rows contiguous ("M-major")."""
    return jnp.swapaxes(s, 1, 2).reshape(s.shape[0], -1)


def blocks_k_fastest(s):
    """BLK128x128_32F: (B, row blocks, Kb) fp32 -> per batch "K-major" with the Kb column padded to
    a multiple of 4 (the stride between consecutive row blocks)."""
    bsz, _, kb = s.shape
    return jnp.pad(s, ((0, 0), (0, 0), (0, _round_up(kb, 4) - kb))).reshape(bsz, -1)


def _scale_mode(info) -> int:
    if info.per_tensor:
        return SCALE_SCALAR_32F
    if info.family == "nvfp4":
        return SCALE_VEC16_UE4M3
    if info.family == "mx":
        return SCALE_VEC32_UE8M0
    return SCALE_BLK128x128_32F if info.two_d else SCALE_VEC128_32F


def _operand(data, scale, info):
    """(data, scale) in the layouts cuBLASLt reads for ``_scale_mode(info)``."""
    if info.per_tensor:  # (B, 1, 1): one fp32 scale per batch, in a 16-byte slot each (SCALAR_SCALE_SLOT)
        s = scale.reshape(scale.shape[0], 1).astype(jnp.float32)
        return data, jnp.pad(s, ((0, 0), (0, SCALAR_SCALE_SLOT - 1)))
    if info.family == "nvfp4":  # VEC16_UE4M3: unsigned scales
        data, scale = _dot.fold_scale_signs(data, scale)
        return _dot.pack_fp4(data), jax.lax.bitcast_convert_type(_tile_128x4(scale), jnp.uint8)
    if info.family == "mx":
        return data, jax.lax.bitcast_convert_type(_tile_128x4(scale), jnp.uint8)
    scale = scale.astype(jnp.float32)
    return data, blocks_k_fastest(scale) if info.two_d else rows_fastest(scale)


def _pad_rows(data, scale, multiple=FP8_BLOCK_ROW_MULTIPLE):
    """FP8_1x128 lhs: zero rows (scale 1) up to a multiple of ``multiple`` rows (cuBLAS's B operand
    with VEC128_32F scales; the scale leading dimension becomes the padded M); their output rows
    are sliced off."""
    extra = -data.shape[1] % multiple
    if not extra:
        return data, scale
    return (jnp.pad(data, ((0, 0), (0, extra), (0, 0))),
            jnp.pad(scale, ((0, 0), (0, extra), (0, 0)), constant_values=1))


def _call(a, sa, mode_a, code_a, b, sb, mode_b, code_b, alpha, k, out_dtype):
    """cuBLASLt on canonical operands: a = our lhs (B, M, ...), b = our rhs (B, N, ...)."""
    bsz, m, n = a.shape[0], a.shape[1], b.shape[1]
    _ext.set_library_path("cublaslt", _libs.path("cublaslt"))
    out, _ = _ffi.ffi_call(
        TARGET,
        (jax.ShapeDtypeStruct((bsz, m, n), out_dtype),
         jax.ShapeDtypeStruct((WORKSPACE_BYTES + WORKSPACE_SLACK,), jnp.uint8)),
        a, sa, b, sb, jnp.concatenate([alpha.astype(jnp.float32), jnp.zeros((1,), jnp.float32)]),
        vmap_method="sequential",
        k=np.int64(k), lhs_scale_mode=np.int32(mode_a), rhs_scale_mode=np.int32(mode_b),
        lhs_type=np.int32(code_a), rhs_type=np.int32(code_b))
    return out


def impl(lhs, rhs, p, sel):
    la, ls = _dot.to_canonical(lhs, p.lhs_contract, p.lhs_batch)
    ra, rs = _dot.to_canonical(rhs, p.rhs_contract, p.rhs_batch)
    k, m = la.shape[2], la.shape[1]
    if p.lhs_format.family == "fp8_block":
        la, ls = _pad_rows(la, ls)
    (la, ls), lmode = _operand(la, ls, p.lhs_format), _scale_mode(p.lhs_format)
    (ra, rs), rmode = _operand(ra, rs, p.rhs_format), _scale_mode(p.rhs_format)
    alpha = _dot.global_alpha(lhs, rhs, p)
    if p.has_global_scale:
        backends.note(sel, "global scale fused as cuBLASLt alpha (device pointer)")
    out = _call(la, ls, lmode, _dot.element_code(p.lhs_format), ra, rs, rmode,
                _dot.element_code(p.rhs_format), alpha, k, p.out_dtype)
    return _dot.from_canonical(out[:, :m], p)


def feature(p) -> str:
    """What of cuBLASLt a problem runs, as the GPU tests name it (``verifies(..., feature=)``): auto
    needs that feature verified on the GPU (docs/design.md, "Speed-aware auto and per-feature
    verification"). A batched per-tensor dot is its own: the first H200 run failed it alone."""
    fam = p.lhs_format.family
    if fam == "fp8_tensor":
        return "per_tensor_batched" if p.bmnk[0] > 1 else "per_tensor"
    if fam == "mx":
        return "mxfp4" if _dot.mx_fp4_operand(p) else "mxfp8"
    return {"fp8_block": "fp8_blockwise"}.get(fam, fam)


# Backend ``cublaslt`` of ``block_scaled_dot``: dot/block_scaled_dot.py registers it with ``impl``.
_GATES_NEEDED = ("cuda_extension", "cuda_device", "cuda_driver", "fp8_tensor_cores", "cublaslt_dot_built",
                 "cublaslt_fp8")
BACKEND = backends.Backend(
    "cublaslt", ("cuda",), _GATES_NEEDED,
    "cuBLASLt scaled FP8/FP4 matmul (per-tensor FP8; Hopper: 1x128/128x128; Blackwell: MXFP8/NVFP4)", supports,
    takes="N with 16-byte output rows, K > 0; FP8_TENSOR (K, N % 16 == 0); "
          "N % 8 in every block-scaling mode; on Hopper with cuBLAS >= 12.9 FP8_1x128 x FP8_128x128 or "
          "FP8_1x128 (K % 128 == 0; bfloat16 / float32 output); on Blackwell with cuBLAS >= 12.8.4 MXFP8 / NVFP4 (K % 32 == 0); never E5M2 x E5M2; "
          "when the heuristic finds an algorithm on every local GPU at trace time", feature=feature)
