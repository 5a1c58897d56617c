"""A float64 NumPy statement of the grouped (ragged) block-scaled dot and of quantization with
blocks restarting at each group (docs/block_scaled_dot.md, "Grouped dot"), sharing no code with
jax_gpuext: groups are Python loops over explicit row ranges, block indices are counted by hand,
and the format rules are tests/_formats_numpy.py's.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import _formats_numpy as npref

MX_ELEM = {"MXFP8_E4M3": npref.E4M3, "MXFP8_E5M2": npref.E5M2, "MXFP4": npref.E2M1}


def segments(sizes, m: int) -> list[tuple[int, int]]:
    """(start, stop) of each group, in order, then of the rows past the last group. A negative size
    counts as 0; a group running past row m is cut there (and every later group is empty)."""
    out, start = [], 0
    for s in np.asarray(sizes).tolist():
        stop = min(start + max(int(s), 0), m)
        out.append((start, stop))
        start = stop
    out.append((start, m))
    return out


def max_blocks(m: int, groups: int, block: int) -> int:
    """The most scale blocks any group sizes can need along a ragged axis of m rows (the G groups
    and the rows past them each take ceil(size / block)), by exhaustive search: small m only."""
    def best(left, parts):
        if parts == 1:
            return -(-left // block)
        return max(-(-s // block) + best(left - s, parts - 1) for s in range(left + 1))
    return best(m, groups + 1)


def _quantize_rows(x, fmt, axis, g):
    """One segment's rows (already sliced) quantized along ``axis`` by the format's rules."""
    xb, k = npref.blocks_1d(x, fmt.block[0], axis)
    if fmt.name in MX_ELEM:
        data, scale = npref.mx(xb, MX_ELEM[fmt.name], "up")
    elif fmt.name == "NVFP4":
        data, scale = npref.nvfp4(xb, g)
    else:
        data, scale = npref.fp8_blockwise(xb, -1)
    return npref.unblock_1d(np.broadcast_to(data, xb.shape), k, axis), np.moveaxis(scale[..., 0], -1, axis)


def quantize_grouped(x, fmt, sizes, axis: int):
    """-> (element values float64 with x's shape, the used scales along ``axis`` in segment order
    (exponents for MX), NVFP4 global scale or None)."""
    x = np.asarray(x, np.float64)
    axis %= x.ndim
    g = npref.nvfp4_global_scale(x) if fmt.name == "NVFP4" else None
    values, scales = np.zeros_like(x), []
    for start, stop in segments(sizes, x.shape[axis]):
        if stop > start:
            rows = np.arange(start, stop)
            v, s = _quantize_rows(np.take(x, rows, axis), fmt, axis, g)
            idx = [slice(None)] * x.ndim
            idx[axis] = rows
            values[tuple(idx)] = v
            scales.append(s)
    shape = list(x.shape)
    shape[axis] = 0
    return values, (np.concatenate(scales, axis) if scales else np.zeros(shape)), g


def expand_grouped(scales, sizes, m: int, block: int, axis: int):
    """Used scales along ``axis`` (segment order) -> one per row of the ragged axis."""
    idx, offset = np.zeros(m, np.int64), 0
    for start, stop in segments(sizes, m):
        idx[start:stop] = offset + np.arange(stop - start) // block
        offset += -(-(stop - start) // block)
    return np.take(scales, idx, axis=axis)


def grouped_values(x, fmt, sizes, axis: int):
    """quantize_grouped's values in float64 (element x block scale; NVFP4's global scale not
    applied) and the NVFP4 global scale (1 for other formats)."""
    data, scales, g = quantize_grouped(x, fmt, sizes, axis)
    per_row = expand_grouped(np.exp2(scales) if fmt.name in MX_ELEM else scales, sizes, data.shape[axis % data.ndim],
                             fmt.block[0], axis % data.ndim)
    return data * per_row, (1.0 if g is None else np.float64(g))


def _scale_f64(q):
    return np.asarray(q.scale.astype(jnp.float32), np.float64)


def dequant(q) -> np.ndarray:
    """A BlockScaledArray's data x block scale in float64, block indices counted explicitly."""
    data = np.asarray(q.data.astype(jnp.float32), np.float64)
    scale = _scale_f64(q)
    if len(q.format.block) == 2:
        r = np.arange(data.shape[-2]) // q.format.block[0]
        c = np.arange(data.shape[-1]) // q.format.block[1]
        return data * scale[..., r, :][..., c]
    ax = q.axis % data.ndim
    return data * np.take(scale, np.arange(data.shape[ax]) // q.format.block[0], axis=ax)


def dequant_grouped(q, sizes) -> np.ndarray:
    """A GroupedBlockScaledArray's data x block scale: each segment's blocks follow the previous
    segment's, and restart at its first row."""
    data = np.asarray(q.data.astype(jnp.float32), np.float64)
    ax = q.axis % data.ndim
    return data * expand_grouped(_scale_f64(q), sizes, data.shape[ax], q.format.block[0], ax)


def ragged_m(lhs, rhs, sizes):
    """(M, K) x (G, K, N) -> (M, N) and the magnitude sum_k |terms| (for error bounds)."""
    out, mag = np.zeros((lhs.shape[0], rhs.shape[2])), np.zeros((lhs.shape[0], rhs.shape[2]))
    for g, (start, stop) in enumerate(segments(sizes, lhs.shape[0])[:-1]):
        out[start:stop] = lhs[start:stop] @ rhs[g]
        mag[start:stop] = np.abs(lhs[start:stop]) @ np.abs(rhs[g])
    return out, mag


def ragged_contract(lhs, rhs, sizes):
    """(K, M) x (M, N) -> (G, K, N): each group contracts its own rows; and the magnitude."""
    segs = segments(sizes, lhs.shape[1])[:-1]
    out = np.stack([lhs[:, a:b] @ rhs[a:b] for a, b in segs]) if segs else np.zeros((0, lhs.shape[0], rhs.shape[1]))
    mag = np.stack([np.abs(lhs[:, a:b]) @ np.abs(rhs[a:b]) for a, b in segs]) if segs else out
    return out, mag


def assert_close(y, want, mag, rtol=2e-6):
    """float32 accumulation of float64-exact terms: |error| <= rtol * sum |terms| (+ an ulp)."""
    y = np.asarray(y, np.float64)
    assert y.shape == want.shape, (y.shape, want.shape)
    bound = rtol * mag + 1e-6 * np.abs(want) + 1e-30
    bad = np.abs(y - want) > bound
    assert not bad.any(), f"max excess {np.max(np.abs(y - want) - bound)} at {np.argwhere(bad)[:3]}"
