"""What ragged_dot's FP8 blockwise CUDA backends (``cublaslt``, ``hopper``) share: the rules a
problem must meet and the weights in the K-contiguous order FP8 tensor cores read."""

from __future__ import annotations

import jax.numpy as jnp

from jax_gpuext import formats
from jax_gpuext.ragged_dot.common import RaggedProblem

INT32_LIMIT = 2**31


def problem_reason(p: RaggedProblem, rhs_formats, out_dtypes, what: str, k_multiple: int = 128) -> str | None:
    """Why backend ``what`` cannot take ``p`` (None: it can, as far as shapes and formats go).
    ``k_multiple``: what K must be a multiple of (128: whole scale blocks; 16: TMA's 16-byte row
    strides, the last K block partial and zero-filled)."""
    if p.mode != "ragged_m":
        return ("the ragged-contracted mode (weight gradient: per-group K) is not wired: each group's K "
                "would need padding to 128 and its restarting 1x128 scales a per-group layout, copies the xla "
                "backend does not need; it runs there")
    if p.lhs_format != formats.FP8_1x128 or p.rhs_format not in rhs_formats:
        names = " or ".join(f.name for f in rhs_formats)
        return f"{p.lhs_format.name} x {p.rhs_format.name}: {what} takes FP8_1x128 activations x {names} weights"
    if p.out_dtype not in out_dtypes:
        return f"output dtype {p.out_dtype}: {what} writes {', '.join(str(d) for d in out_dtypes)}"
    if p.K <= 0 or p.K % k_multiple:
        why = "whole 128-wide scale blocks along K" if k_multiple == 128 else "16-byte rows for TMA"
        return f"K={p.K} is not a positive multiple of {k_multiple} ({why})"
    if p.N % 8:
        return f"N={p.N} is not a multiple of 8 (16-byte output rows; cuBLAS's m in a block-scaling mode)"
    if p.rhs_contract not in (1, 2):
        return f"rhs_contract={p.rhs_contract}: the rhs must be (G, K, N) or (G, N, K)"
    if max(p.M + p.G * 15, p.N * max(p.G, 1), p.K) >= INT32_LIMIT:
        return "M (with 15 padding rows per group), G * N and K must stay below 2^31 (int32 shapes and coordinates)"
    return None


def weights_nk(rhs, p: RaggedProblem):
    """(data (G, N, K), scales with K blocks last: (G, N/128, K/128) for FP8_128x128, (G, N, K/128)
    for FP8_1x128). Weights stored (G, K, N), lax.ragged_dot's order, are transposed by XLA on
    every call: a full copy of the weights."""
    data, scale = rhs.data, rhs.scale.astype(jnp.float32)
    k_axis = p.rhs_contract
    if rhs.format == formats.FP8_1x128 and rhs.axis % 3 != k_axis:
        raise ValueError(f"ragged_dot: FP8_1x128 rhs blocks must run along its contracted axis {k_axis}, "
                         f"got axis {rhs.axis % 3} of {rhs.data.shape}")
    if k_axis == 1:  # (G, K, N) -> (G, N, K); both formats' scales swap the same two axes
        data, scale = jnp.swapaxes(data, 1, 2), jnp.swapaxes(scale, 1, 2)
    return data, scale


def check_lhs(lhs) -> None:
    if lhs.axis % 2 != 1:
        raise ValueError(f"ragged_dot: FP8_1x128 lhs blocks must run along K (axis 1), got axis {lhs.axis % 2}")


TRANSPOSE_NOTE = ("rhs (G, K, N) transposed to (G, N, K) on every call (FP8 needs K-contiguous weights): store the "
                  "weights (G, N, K) to save the copy")
