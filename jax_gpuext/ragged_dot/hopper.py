"""The ``hopper`` backend of ``ragged_dot``: our sm_90a grouped FP8 blockwise kernel.

DeepSeek-V3's recipe on Hopper's FP8 tensor cores without any library: FP8_1x128 activations x
FP8_128x128 expert weights, every group in one launch, group sizes read on the device
(``csrc/ragged_dot/hopper_grouped.h``; docs/design.md, "Our own Hopper kernel"). It exists
because cuBLASLt's grouped GEMM needs cuBLAS >= 13.4, which the GPU image lacks, and it needs
neither aligned groups nor padding copies: each group is tiled on its own and rows of a tile
past the group's end are not stored.

Operands: lhs data as it is, its scales transposed to (K/128, round_up(M, 4)) by XLA (TMA boxes
run along M; a copy of M*K/32 bytes), weights (G, N, K) with their (G, N/128, K/128) scales
(weights stored (G, K, N) are transposed every call: see ``fp8_cuda.weights_nk``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_gpuext import formats
from jax_gpuext.common import backends
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import ffi as _ffi
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot.hopper_mx import built_for_sm90a
from jax_gpuext.ragged_dot import fp8_cuda
from jax_gpuext.ragged_dot.common import RaggedProblem

TARGET = _ext.declare_target("gpuext_ragged_dot_hopper", "ragged_dot")
COMPONENT = "ragged_dot.hopper"  # verified.COMPONENTS, cmake/verified_sources.txt
GATES = ("cuda_extension", "cuda_device", "cuda_driver", "hopper")
OUT_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32), jnp.dtype(jnp.float16))
TILE_ROWS = 128
WORKSPACE_SLACK = 256


def _section(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def workspace_bytes(m: int, g: int) -> int:
    """The tile table (16 bytes per row tile), its count and the G + 1 group starts
    (csrc/ragged_dot/hopper_grouped_host.cc WorkspaceBytes), before the alignment slack."""
    tiles = -(-m // TILE_ROWS) + g
    return _section(16 * tiles) + _section(4) + _section(8 * (g + 1))


def supports(p: RaggedProblem) -> GateResult:
    why = fp8_cuda.problem_reason(p, (formats.FP8_128x128,), OUT_DTYPES, "the grouped Hopper kernel")
    if why is not None:
        return GateResult(False, why)
    if (-(-p.M // TILE_ROWS) + p.G) * -(-p.N // 128) >= fp8_cuda.INT32_LIMIT:
        return GateResult(False, "too many output tiles for one grid (< 2^31)")
    r = built_for_sm90a("the grouped Hopper kernel")
    return r if not r.supported else GateResult(True, p.describe())


def impl(lhs, rhs, group_sizes, p: RaggedProblem, sel=None):
    """out (M, N) = the groups of lhs rows times their rhs matrices; rows past sum(group_sizes) are 0."""
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


BACKEND = backends.Backend(
    "hopper", ("cuda",), GATES,
    "our sm_90a grouped FP8 blockwise kernel (wgmma, promotion every 128 of K), group sizes read on the device",
    supports,
    takes="ragged_m only; FP8_1x128 lhs x FP8_128x128 rhs; K % 128 == 0, N % 8 == 0; bfloat16, float32 or "
          "float16 output; any group sizes; _cuda built for 90a")


def register(register_impl) -> None:
    """Adds this backend through the op's ``register_impl(name, backend, impl)`` (the op imports us)."""
    register_impl("hopper", BACKEND, impl)
