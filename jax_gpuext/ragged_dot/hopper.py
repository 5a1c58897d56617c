"""The ``hopper`` backend of ``ragged_dot``: our sm_90a grouped FP8 blockwise kernel.

DeepSeek-V3's recipe on Hopper's FP8 tensor cores without any library: FP8_1x128 activations x
FP8_128x128 expert weights, every group in one launch, group sizes read on the device
(``csrc/ragged_dot/hopper_grouped.h``; docs/design.md, "Our own Hopper kernel"). It exists
because cuBLASLt's grouped GEMM needs cuBLAS >= 13.4, which the GPU image lacks, and it needs
neither aligned groups nor padding copies: each group is tiled on its own and rows of a tile
past the group's end are not stored.

Operands: lhs data as it is, its scales transposed to (ceil(K/128), round_up(M, 4)) by XLA (TMA
boxes run along M; a copy of M*K/32 bytes), weights (G, N, K) with their (G, ceil(N/128),
ceil(K/128)) scales (weights stored (G, K, N) are transposed every call: see
``fp8_cuda.weights_nk``; the dgrad's ``RAGGED_M_NK`` reads them in place). K % 16 == 0: the last K
block may be partial (TMA zero-fills it; gpt-oss's K = 2880). The kernel is persistent and
warp-specialised (docs/design.md, "Grouped FP8 kernel at DeepGEMM's speed").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_gpuext import formats
from jax_gpuext.common import backends
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import ffi as _ffi
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot.hopper_mx import built_for_sm90a
from jax_gpuext.ragged_dot import common, fp8_cuda
from jax_gpuext.ragged_dot.common import RaggedProblem

TARGET = _ext.declare_target("gpuext_ragged_dot_hopper", "ragged_dot")
WGRAD_TARGET = _ext.declare_target("gpuext_ragged_dot_hopper_wgrad", "ragged_dot")
COMPONENT = "ragged_dot.hopper"  # verified.COMPONENTS, cmake/verified_sources.txt
GATES = ("cuda_extension", "cuda_device", "cuda_driver", "hopper")
OUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32), jnp.dtype(jnp.float16))
TILE_ROWS = 128
WORKSPACE_SLACK = 256


def _section(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def workspace_bytes(m: int, g: int) -> int:
    """The tile table (16 bytes per row tile), its count, the G + 1 group starts (int64) and the
    G + 1 first tiles of the groups (int32) (csrc/ragged_dot/hopper_grouped_host.cc WorkspaceBytes),
    before the alignment slack."""
    tiles = -(-m // TILE_ROWS) + g
    return _section(16 * tiles) + _section(4) + _section(8 * (g + 1)) + _section(4 * (g + 1))


def _wgrad_reason(p: RaggedProblem) -> str | None:
    """Why the weight-gradient kernel cannot take ``p`` (ragged_contract)."""
    if p.lhs_format != formats.FP8_1x128 or p.rhs_format != formats.FP8_1x128:
        return (f"{p.lhs_format.name} x {p.rhs_format.name}: the grouped Hopper kernel's ragged-contracted mode (the "
                "weight gradient) takes FP8_1x128 x FP8_1x128 grouped along the tokens")
    if p.out_dtype not in OUT_DTYPES:
        return f"output dtype {p.out_dtype}: the grouped Hopper kernel writes {', '.join(str(d) for d in OUT_DTYPES)}"
    if p.N % 8:
        return f"N={p.N} is not a multiple of 8 (16-byte output rows)"
    slots = common.grouped_block_count(p.M, p.G, TILE_ROWS) * TILE_ROWS
    if max(p.M, p.K, p.N, slots) + TILE_ROWS >= fp8_cuda.INT32_LIMIT:
        return "M, K, N and the padded tokens must stay below 2^31 - 128 (int32 coordinates)"
    if p.G * -(-p.K // TILE_ROWS) * -(-p.N // 128) >= fp8_cuda.INT32_LIMIT // 2:
        return "too many output tiles (< 2^30: the persistent loop's int32 item index)"
    return None


def supports(p: RaggedProblem) -> GateResult:
    if p.mode == "ragged_contract":
        why = _wgrad_reason(p)
    else:
        why = fp8_cuda.problem_reason(p, (formats.FP8_128x128,), OUT_DTYPES, "the grouped Hopper kernel",
                                      k_multiple=16)
        if why is None and (-(-p.M // TILE_ROWS) + p.G) * -(-p.N // 128) >= fp8_cuda.INT32_LIMIT // 2:
            why = "too many output tiles (< 2^30: the persistent loop's int32 item index)"
    if why is not None:
        return GateResult(False, why)
    r = built_for_sm90a("the grouped Hopper kernel")
    return r if not r.supported else GateResult(True, p.describe())


def _has_slots(q, slots: int) -> bool:
    """Whether ``q`` carries its codes in the (X, slots) slot layout (``slot_data``)."""
    data = getattr(q, "slot_data", None)
    return data is not None and tuple(data.shape) == (q.data.shape[1 - q.axis % 2], slots)


def _slot_operand(q, token_axis: int, rows, valid):
    """A grouped operand's data in the padded slot layout with the tokens contiguous, (X, S), and
    its scales (blocks, round_up(X, 4)) float32: block j of the slot layout is tokens [128 j,
    128 j + 128), zeros where the block has fewer (``common.slot_rows``); the scales are already
    one per block (quantize_grouped's compact numbering, which the kernel's tile table shares).
    An operand from ``grouped.quantize_tokens_for_wgrad`` already holds that (X, S) array
    (``slot_data``, quantize's output before the gather back): it is taken as it is."""
    if _has_slots(q, rows.shape[0]):
        data = q.slot_data  # quantize's own (X, S) output (grouped.quantize_tokens_for_wgrad): no gather
    else:
        zero = jnp.zeros((), q.data.dtype)
        data = jnp.take(q.data, rows, axis=token_axis)
        data = data if token_axis == 1 else data.T  # (X, S)
        data = jnp.where(valid[None, :], data, zero)
    scale = q.scale.astype(jnp.float32)
    scale = scale.T if token_axis == 1 else scale  # (blocks, X)
    x = scale.shape[1]
    return data, jnp.pad(scale, ((0, 0), (0, -(-x // 4) * 4 - x)))


def wgrad_operands(lhs, rhs, group_sizes, p: RaggedProblem):
    """What the weight-gradient kernel reads: x^T (K, S) and its scales (blocks, K4), dy^T (N, S)
    and its scales (blocks, N4), S = 128 x blocks. Both operands go in the padded slot layout (a
    gather of the FP8 data: TMA cannot start a box at a group's first token when it is not
    16-byte aligned), tokens contiguous."""
    blocks = int(lhs.scale.shape[p.lhs_contract])
    layout = common.grouped_layout(group_sizes, p.M, TILE_ROWS)
    rows, valid = common.slot_rows(layout, blocks)
    a, sa = _slot_operand(lhs, p.lhs_contract, rows, valid)
    b, sb = _slot_operand(rhs, p.rhs_contract, rows, valid)
    return a, sa, b, sb


def _wgrad(lhs, rhs, group_sizes, p: RaggedProblem, sel=None):
    """out (G, K, N): each group's tokens of x^T times its tokens of dy (wgrad_operands)."""
    a, sa, b, sb = wgrad_operands(lhs, rhs, group_sizes, p)
    if sel is not None:
        how = {True: "handed over by quantize", False: "gathered into it (one copy of the FP8 codes)"}
        parts = [f"{name} {how[_has_slots(q, a.shape[1])]}" for name, q in (("x^T", lhs), ("dy", rhs))]
        backends.note(sel, "weight gradient: both operands in the padded slot layout (128-token blocks, tokens "
                           f"contiguous) for TMA: {'; '.join(parts)}")
    ws = workspace_bytes(p.M, p.G) + WORKSPACE_SLACK
    out, _ = _ffi.ffi_call(
        WGRAD_TARGET,
        (jax.ShapeDtypeStruct((p.G, p.K, p.N), p.out_dtype), jax.ShapeDtypeStruct((ws,), jnp.uint8)),
        a, sa, b, sb, group_sizes.astype(jnp.int32), vmap_method="sequential", m=np.int64(p.M))
    return out


def impl(lhs, rhs, group_sizes, p: RaggedProblem, sel=None):
    """ragged_m: out (M, N) = the groups of lhs rows times their rhs matrices; rows past
    sum(group_sizes) are 0. ragged_contract: out (G, K, N), the weight gradient."""
    if p.mode == "ragged_contract":
        return _wgrad(lhs, rhs, group_sizes, p, sel)
    fp8_cuda.check_lhs(lhs)
    data_r, scale_r = fp8_cuda.weights_nk(rhs, p)  # (G, N, K), (G, N/128, K/128)
    if sel is not None and p.rhs_contract == 1:
        backends.note(sel, fp8_cuda.TRANSPOSE_NOTE)
    m4 = -(-p.M // 4) * 4
    scale_l = jnp.pad(lhs.scale.astype(jnp.float32).T, ((0, 0), (0, m4 - p.M)))  # (K/128, M4)
    ws = workspace_bytes(p.M, p.G) + WORKSPACE_SLACK
    out, _ = _ffi.ffi_call(
        TARGET,
        (jax.ShapeDtypeStruct((p.M, p.N), p.out_dtype), jax.ShapeDtypeStruct((ws,), jnp.uint8)),
        lhs.data, scale_l, data_r, scale_r, group_sizes.astype(jnp.int32), vmap_method="sequential")
    return out


def feature(p) -> str | None:
    """The GPU tests' feature of a problem (``verifies(..., feature=)``): "fp8_blockwise" for the
    FP8_1x128 activations this backend takes in ragged_m, "wgrad" for the ragged-contracted mode
    (its own kernel); None for anything else."""
    if p.lhs_format.name != "FP8_1x128":
        return None
    return "wgrad" if p.mode == "ragged_contract" else "fp8_blockwise"


BACKEND = backends.Backend(
    "hopper", ("cuda",), GATES,
    "our sm_90a grouped FP8 blockwise kernel (wgmma, promotion every 128 of K), group sizes read on the device",
    supports,
    takes="ragged_m: FP8_1x128 lhs x FP8_128x128 rhs, K % 16 == 0, N % 8 == 0; ragged_contract (the weight "
          "gradient): FP8_1x128 x FP8_1x128 grouped along the tokens, N % 8 == 0; bfloat16, float32 or float16 "
          "output; any group sizes; _cuda built for 90a", feature=feature)


def register(register_impl) -> None:
    """Adds this backend through the op's ``register_impl(name, backend, impl)`` (the op imports us)."""
    register_impl("hopper", BACKEND, impl)


# --------------------------------------------------------------------------- the masked layout
def masked_supports(p) -> GateResult:
    """``ragged_dot_masked``'s problem (``masked.MaskedProblem``): the same kernel, its tile table
    in the masked mode (expert g's tiles at row g * C)."""
    if p.lhs_format != formats.FP8_1x128 or p.rhs_format != formats.FP8_128x128:
        return GateResult(False, f"{p.lhs_format.name} x {p.rhs_format.name}: the grouped Hopper kernel takes "
                                 "FP8_1x128 activations x FP8_128x128 weights")
    if p.out_dtype not in OUT_DTYPES:
        return GateResult(False, f"output dtype {p.out_dtype}: the grouped Hopper kernel writes "
                                 f"{', '.join(str(d) for d in OUT_DTYPES)}")
    if p.K <= 0 or p.K % 16:
        return GateResult(False, f"K={p.K} is not a positive multiple of 16 (16-byte rows for TMA)")
    if p.N % 8:
        return GateResult(False, f"N={p.N} is not a multiple of 8 (16-byte output rows)")
    m = p.G * p.C
    if max(m + TILE_ROWS, p.N * max(p.G, 1), p.K) >= fp8_cuda.INT32_LIMIT:
        return GateResult(False, "G * C + 128, G * N and K must stay below 2^31 (int32 coordinates)")
    if (-(-m // TILE_ROWS) + p.G) * -(-p.N // 128) >= fp8_cuda.INT32_LIMIT // 2:
        return GateResult(False, "too many output tiles (< 2^30: the persistent loop's int32 item index)")
    r = built_for_sm90a("the grouped Hopper kernel")
    return r if not r.supported else GateResult(True, p.describe())


def masked_impl(lhs, rhs, valid_counts, p, sel=None):
    """out (G, C, N): each expert's first valid_counts[g] rows times its weights, the rest 0. The
    handler sees a 3-D lhs and output and runs the kernel's masked mode."""
    data_r, scale_r = fp8_cuda.weights_nk(rhs, p)  # (G, N, K), (G, N/128, K/128)
    if sel is not None and p.rhs_contract == 1:
        backends.note(sel, fp8_cuda.TRANSPOSE_NOTE)
    m = p.G * p.C
    m4 = -(-m // 4) * 4
    kb = lhs.scale.shape[-1]
    scale_l = jnp.pad(lhs.scale.astype(jnp.float32).reshape(m, kb).T, ((0, 0), (0, m4 - m)))  # (K/128, M4)
    ws = workspace_bytes(m, p.G) + WORKSPACE_SLACK
    out, _ = _ffi.ffi_call(
        TARGET,
        (jax.ShapeDtypeStruct((p.G, p.C, p.N), p.out_dtype), jax.ShapeDtypeStruct((ws,), jnp.uint8)),
        lhs.data, scale_l, data_r, scale_r, valid_counts.astype(jnp.int32), vmap_method="sequential")
    return out


def masked_feature(p) -> str | None:
    """"masked" for the FP8_1x128 activations this backend takes (its own GPU tests verify it)."""
    return "masked" if p.lhs_format.name == "FP8_1x128" else None


MASKED_BACKEND = backends.Backend(
    "hopper", ("cuda",), GATES,
    "our sm_90a grouped FP8 blockwise kernel in its masked mode (expert g's tiles at row g * C), counts read on "
    "the device", masked_supports,
    takes="FP8_1x128 lhs (G, C, K) x FP8_128x128 rhs; K % 16 == 0, N % 8 == 0; bfloat16, float32 or float16 "
          "output; any counts; _cuda built for 90a", feature=masked_feature)


def register_masked(register_impl) -> None:
    """Adds the masked mode to ``ragged_dot_masked`` (jax_gpuext/ragged_dot/masked.py imports us)."""
    register_impl("hopper", MASKED_BACKEND, masked_impl)
