"""MXFP4 weights re-encoded, exactly, as FP8_128x128 (E4M3 elements, one fp32 scale per 128x128
tile), so that Hopper's FP8 tensor cores run them through the FP8 1x128 x 128x128 path (cuBLASLt).

Once, at load time, on the host: the check needs concrete values, and a tile that cannot be
exact is refused (``InexactTileError`` names the tile and the reason) rather than rounded.

The rule (docs/formats.md, "MXFP4 -> FP8_128x128 without loss", has the proof). Every nonzero
MXFP4 value is ``sig * 2**P`` with ``sig`` in {1, 1.5} and ``P = t + s - 127`` (``t`` in -1..2
from the E2M1 code, ``s`` the E8M0 scale byte). A tile gets the scale ``2**E`` with
``E = max(P_max - 8, -126)``: its largest binade lands on E4M3's top one (1.5 * 2**8 = 384 <= 448,
2**9 > 448), and the scale stays an fp32 normal. Element ``sig * 2**(P - E)`` is exact in E4M3 iff
``P - E >= -9`` (sig 1: 2**-9 is the smallest subnormal) or ``P - E >= -8`` (sig 1.5 = 3 * 2**-1
needs a quantum of 2**-9 at 2**-8). With E from P_max this is ``P_max - P <= 17`` (16 for sig 1.5);
any tile whose E8M0 scale exponents span at most 13 passes whatever its elements (docs/formats.md).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_gpuext.formats.quantize import BlockFormat, BlockScaledArray, FP8_128x128, FP8_1x128, MXFP4, MXFP8_E4M3

# E4M3: largest binade exponent with room for 1.5 (1.5 * 2**8 = 384 <= 448), smallest exact
# exponent of sig 1 (2**-9, the smallest subnormal) and of sig 1.5 (3 * 2**-9).
E4M3_TOP_EXP = 8
E4M3_MIN_EXP = {1.0: -9, 1.5: -8}
MIN_NORMAL_EXP = -126  # fp32 tile scales stay normal: FTZ consumers (XLA's CPU runtime) keep them
# Largest span of E8M0 exponents in a tile that is exact for every possible E2M1 content:
# (s_max + 2) - (s_min - 1) <= 16, the sig-1.5 limit (docs/formats.md).
SAFE_SCALE_SPAN = 13
TILE = 128


class InexactTileError(ValueError):
    """A 128x128 tile whose MXFP4 values have no exact E4M3 x one-fp32-scale encoding."""

    def __init__(self, message: str, tile: tuple[int, ...], reason: str):
        super().__init__(message)
        self.tile = tile
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class _Decoded:
    sign: np.ndarray  # bool, per element
    sig: np.ndarray  # float64 in {0, 1, 1.5} (0: zero element)
    p: np.ndarray  # int64 binary exponent of the value (meaningless where sig == 0)
    nan: np.ndarray  # bool: the element's E8M0 scale is 0xFF (NaN)


def _decode(q: BlockScaledArray) -> _Decoded:
    """Per-element (sign, significand, exponent) of an MXFP4 array, in exact integer terms."""
    codes = np.asarray(q.data).astype(np.float64)  # every E2M1 value is exact in float64
    s = np.asarray(q.scale).view(np.uint8).astype(np.int64)
    ax = q.axis % codes.ndim
    s = np.take(np.repeat(s, MXFP4.block[0], axis=ax), np.arange(codes.shape[ax]), axis=ax)
    frac, e = np.frexp(np.abs(codes))  # |c| = frac * 2**e, frac in [0.5, 1)
    sig = np.where(codes == 0, 0.0, 2.0 * frac)
    t = e.astype(np.int64) - 1
    return _Decoded(np.signbit(codes), sig, t + s - 127, s == 0xFF)


def _tiles(a: np.ndarray) -> np.ndarray:
    """[..., M, N] -> [..., Mt, Nt, 128, 128] (padded with the given array's fill by the caller)."""
    *lead, m, n = a.shape
    return a.reshape(tuple(lead) + (m // TILE, TILE, n // TILE, TILE)).swapaxes(-3, -2)


def _pad(a: np.ndarray, fill) -> np.ndarray:
    *lead, m, n = a.shape
    pad = [(0, 0)] * len(lead) + [(0, -m % TILE), (0, -n % TILE)]
    return np.pad(a, pad, constant_values=fill)


def _refuse(tile_index, sig_tile, p_tile, what: str) -> InexactTileError:
    exps = p_tile[sig_tile > 0]
    reason = what
    if exps.size:
        reason += (f"; its element exponents span {int(exps.min())}..{int(exps.max())} "
                   f"({int(exps.max() - exps.min())} binades; E4M3 under one power-of-two tile scale holds "
                   f"at most 17, 16 when the smallest value has significand 1.5)")
    tile = tuple(int(i) for i in tile_index)
    return InexactTileError(f"MXFP4 -> FP8_128x128: tile {tile} (rows {tile[-2] * TILE}.., cols "
                            f"{tile[-1] * TILE}..) cannot be re-encoded exactly: {reason}", tile, reason)


def mxfp4_to_fp8_128x128(q: BlockScaledArray) -> BlockScaledArray:
    """The same values as FP8_128x128 (tiles over the last two axes), bit for bit, or
    ``InexactTileError`` for the first tile that cannot be exact. Host-side (NumPy), once."""
    if not isinstance(q, BlockScaledArray) or q.format.name != "MXFP4":
        raise TypeError(f"mxfp4_to_fp8_128x128 takes an MXFP4 BlockScaledArray, got {q!r}")
    if q.data.ndim < 2:
        raise ValueError(f"FP8_128x128 tiles the last two axes: the MXFP4 array needs rank >= 2, "
                         f"got shape {tuple(q.data.shape)}")
    d = _decode(q)
    shape = d.sig.shape
    sig_t, p_t, nan_t = _tiles(_pad(d.sig, 0.0)), _tiles(_pad(d.p, np.iinfo(np.int64).min)), _tiles(_pad(d.nan, False))
    nonzero = sig_t > 0
    p_max = np.max(np.where(nonzero, p_t, np.iinfo(np.int64).min), axis=(-2, -1))
    any_nonzero = nonzero.any(axis=(-2, -1))
    e = np.where(any_nonzero, np.maximum(p_max - E4M3_TOP_EXP, MIN_NORMAL_EXP), 0)  # all-zero tile: scale 1
    qexp = p_t - e[..., None, None]
    min_exp = np.where(sig_t == 1.5, E4M3_MIN_EXP[1.5], E4M3_MIN_EXP[1.0])
    bad = (nonzero & (qexp < min_exp)) | nan_t
    if bad.any():
        idx = np.argwhere(bad.any(axis=(-2, -1)))[0]
        tile_bad = bad[tuple(idx)]
        if nan_t[tuple(idx)].any():
            what = "a 32-block in it has the NaN scale 0xFF, which one fp32 tile scale cannot confine to that block"
        else:
            r, c = np.argwhere(tile_bad)[0]
            what = (f"element ({int(idx[-2]) * TILE + r}, {int(idx[-1]) * TILE + c}) = "
                    f"{sig_t[tuple(idx)][r, c]} * 2**{int(p_t[tuple(idx)][r, c])} falls below E4M3's subnormals "
                    f"under the tile scale 2**{int(e[tuple(idx)])}")
        raise _refuse(idx, sig_t[tuple(idx)], p_t[tuple(idx)], what)
    # Exact by the check above: sig * 2**qexp lies on E4M3's grid and within +-448.
    vals = np.where(nonzero, np.ldexp(sig_t, np.where(nonzero, qexp, 0)), 0.0)
    *lead, mt, nt, _, _ = vals.shape
    vals = vals.swapaxes(-3, -2).reshape(tuple(lead) + (mt * TILE, nt * TILE))[..., : shape[-2], : shape[-1]]
    vals = np.where(d.sign, -vals, vals)
    data = vals.astype(ml_dtypes.float8_e4m3fn)
    scale = np.ldexp(np.float32(1), e.astype(np.int32)).astype(np.float32)
    return BlockScaledArray(jnp.asarray(data), jnp.asarray(scale), None, FP8_128x128, -1)


# --------------------------------------------------------------------------- choosing at load time
HOPPER_FP8_GATES = ("hopper", "cublaslt_blockwise_fp8", "cublaslt_dot_built", "cuda_device")


@dataclasses.dataclass(frozen=True)
class ServingWeight:
    """A weight as it will be served: the array, the activation format to pair with it, and why."""

    weight: BlockScaledArray
    activation_format: BlockFormat
    reason: str


def serving_weight(q: BlockScaledArray) -> ServingWeight:
    """Load-time choice for an MXFP4 weight. On Hopper with cuBLASLt's FP8 blockwise scaling, the
    weight is re-encoded exactly to FP8_128x128 and paired with FP8_1x128 activations (the cuBLASLt
    path); where a tile cannot be exact, or elsewhere, it stays MXFP4 with MXFP8_E4M3 activations
    (hopper_mx on Hopper, cuDNN/cuBLASLt where they take it, the reference on CPU). The reason is
    logged on logger ``jax_gpuext``, never silent."""
    from jax_gpuext.common import backends, gates

    if not isinstance(q, BlockScaledArray) or q.format.name != "MXFP4":
        raise TypeError(f"serving_weight takes an MXFP4 BlockScaledArray, got {q!r}")
    r = gates.check_all(HOPPER_FP8_GATES)
    if not r.supported:
        why = f"kept MXFP4 with MXFP8_E4M3 activations: the Hopper FP8 blockwise path is closed ({r.reason})"
        backends.logger.info("serving_weight: %s", why)
        return ServingWeight(q, MXFP8_E4M3, why)
    try:
        f = mxfp4_to_fp8_128x128(q)
    except InexactTileError as e:
        why = f"kept MXFP4 with MXFP8_E4M3 activations (hopper_mx): {e}"
        backends.logger.warning("serving_weight: %s", why)
        return ServingWeight(q, MXFP8_E4M3, why)
    why = "re-encoded exactly to FP8_128x128 (docs/formats.md), FP8_1x128 activations: cuBLASLt on Hopper"
    backends.logger.info("serving_weight: %s", why)
    return ServingWeight(f, FP8_1x128, why)
