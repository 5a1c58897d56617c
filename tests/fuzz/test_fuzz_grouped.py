"""Fuzz: the grouped dot and the dense dot at the edges issue 34 found (a hostile user's inputs).

- Non-finite values in other groups and in padding rows (rows past the last group, empty
  experts): a group's result depends only on its own rows and weights. Oracle: the same call with
  those entries zeroed, on the same backend: every output the poisoned entry does not belong to is
  the same bits, and rows in no group are 0.
- The cotangent of scaled_ragged_dot with non-finite rows (finding 1's weight gradient).
- Extreme E8M0 scales: blocks of 2^-127 and 2^127 paired so that the products are ordinary
  numbers, against the float64 model of the dequantized operands (finding 2).
- Eager vs jit of the same public call, subnormals and non-finite inputs included (finding 3).
- Group sizes as Python lists of anything: read exactly as the int32 array, or refused naming the
  function and group_sizes (findings 6, 7).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import _values
from _budget import fuzz, judged, record
from _judge import assert_close, check_refusal, per_backend, worker_outcome

GROUPED_BACKENDS = ("auto", "reference", "xla")
PAIRS = {"ragged_m": [("MXFP8_E4M3", "MXFP8_E4M3"), ("NVFP4", "NVFP4"), ("FP8_1x128", "FP8_128x128"),
                      ("MXFP8_E5M2", "MXFP4")],
         "ragged_contract": [("MXFP8_E4M3", "MXFP8_E4M3"), ("NVFP4", "NVFP4"), ("FP8_1x128", "FP8_1x128")]}
NON_FINITE = (np.nan, np.inf, -np.inf)


def group_of_rows(sizes, m: int) -> np.ndarray:
    """Each row's group (G: in no group), as the docs define the sizes: negative sizes count as 0,
    groups are cut at m."""
    ends = np.minimum(np.cumsum(np.clip(np.asarray(sizes, np.int64), 0, None)), m)
    return np.searchsorted(ends, np.arange(m), side="right")


def same_bits(a, b) -> np.ndarray:
    """Elementwise: the same bits, or both NaN."""
    a, b = np.asarray(a), np.asarray(b)
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]
    same = a.view(view) == b.view(view)
    if a.dtype.kind == "f" or a.dtype.name in ("bfloat16",):
        same |= np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32))
    return same


# --------------------------------------------------------------------------- non-finite values
SIZES = st.lists(st.integers(-3, 40), min_size=1, max_size=4)


@fuzz("grouped non-finite", 6)
@given(mode=st.sampled_from(list(PAIRS)), data=st.data(), m=st.sampled_from([16, 40, 64]),
       k=st.sampled_from([32, 64, 160]), n=st.sampled_from([16, 32]), sizes=SIZES,
       value=st.sampled_from(NON_FINITE), seed=_values.seeds)
def test_non_finite_values_stay_in_their_group(worker, mode, data, m, k, n, sizes, value, seed):
    pair = data.draw(st.sampled_from(PAIRS[mode]), label="formats")
    g = len(sizes)
    rng = np.random.default_rng(seed)
    groups = group_of_rows(sizes, m)
    if mode == "ragged_m":
        lhs, rhs = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((g, k, n)).astype(np.float32)
        where = data.draw(st.sampled_from(["lhs row", "rhs expert"]), label="where")
        if where == "lhs row":
            r = data.draw(st.integers(0, m - 1), label="row")
            at, affected = ("lhs", (r, int(rng.integers(k)))), ("rows", [r] if groups[r] < g else [])
        else:
            e = data.draw(st.integers(0, g - 1), label="expert")
            at, affected = ("rhs", (e, int(rng.integers(k)), int(rng.integers(n)))), \
                ("rows", list(np.flatnonzero(groups == e)))
    else:
        lhs, rhs = rng.standard_normal((k, m)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
        r = data.draw(st.integers(0, m - 1), label="row")
        side = data.draw(st.sampled_from(["lhs", "rhs"]), label="operand")
        at = (side, (int(rng.integers(k)), r) if side == "lhs" else (r, int(rng.integers(n))))
        affected = ("groups", [int(groups[r])] if groups[r] < g else [])
    poisoned = {"lhs": lhs.copy(), "rhs": rhs.copy()}
    poisoned[at[0]][at[1]] = value
    # The clean run has that entry zeroed, not its old value: NVFP4's default global scale is the
    # finite amax of the whole tensor, so an old value that was the amax would change every group's
    # scale (the long campaign's two "failures" were exactly that, not a leak of the non-finite value).
    (lhs if at[0] == "lhs" else rhs)[at[1]] = 0.0
    case = (f"ragged_dot {mode} {pair} lhs {list(lhs.shape)} rhs {list(rhs.shape)} sizes {sizes}: {value} at "
            f"{at[0]}{list(at[1])} (row groups {groups.tolist()})")
    area = "grouped non-finite"
    with judged(area):
        results = per_backend(area, worker.run("ragged_nonfinite", dict(
            mode=mode, formats=[("const", f) for f in pair], lhs=poisoned["lhs"], rhs=poisoned["rhs"], lhs_clean=lhs,
            rhs_clean=rhs, sizes=np.asarray(sizes, np.int32), backends=GROUPED_BACKENDS)), case)
        for backend, (out, clean) in results.items():
            keep = np.ones(out.shape, bool)
            if affected[0] == "rows":
                keep[affected[1]] = False
                padding = groups >= g
                assert (out[padding] == 0).all(), f"{backend}: a row in no group is not 0 ({case})"
            else:
                keep[affected[1]] = False
            bad = np.argwhere(keep & ~same_bits(out, clean))
            assert bad.size == 0, (f"{backend}: {len(bad)} outputs outside the poisoned {affected[0][:-1]} changed, "
                                   f"first at {bad[:3].tolist()}: {out[tuple(bad[0])]} vs "
                                   f"{clean[tuple(bad[0])]} ({case})")


@fuzz("grouped cotangent non-finite", 3)
@given(fmt=st.sampled_from(["MXFP8_E4M3", "NVFP4", ("FP8_1x128", "FP8_128x128")]), m=st.sampled_from([24, 48]),
       sizes=SIZES, value=st.sampled_from(NON_FINITE), data=st.data(), seed=_values.seeds)
def test_a_non_finite_cotangent_row_stays_in_its_group(worker, fmt, m, sizes, value, data, seed):
    """Finding 1's weight gradient: a NaN / Inf cotangent row (a padding row's, or one group's)
    reaches that row's dx and its group's dw only."""
    k, n, g = 128, 32, len(sizes)
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((m, k)).astype(np.float32), (rng.standard_normal((g, k, n)) * 0.1).astype(np.float32)
    dy = rng.standard_normal((m, n)).astype(np.float32)
    groups = group_of_rows(sizes, m)
    r = data.draw(st.integers(0, m - 1), label="row")
    poisoned, c = dy.copy(), int(rng.integers(n))
    poisoned[r, c] = value
    dy[r, c] = 0.0  # the clean run: that entry zeroed (a per-tensor amax must not see its old value)
    spec = ("pair", fmt) if isinstance(fmt, tuple) else ("const", fmt)
    case = f"scaled_ragged_dot {fmt} x {[m, k]} w {[g, k, n]} sizes {sizes}: dy[{r}] holds {value} (group {groups[r]})"
    area = "grouped cotangent non-finite"
    with judged(area):
        results = per_backend(area, worker.run("scaled_ragged_vjp", dict(
            x=x, w=w, sizes=np.asarray(sizes, np.int32), dy=poisoned, dy_clean=dy, fmt=spec,
            backends=GROUPED_BACKENDS)), case)
        for backend, ((y, dx, dw), (y0, dx0, dw0)) in results.items():
            assert same_bits(y, y0).all(), f"{backend}: the forward changed ({case})"
            keep_rows = np.ones(m, bool)
            keep_rows[r] = groups[r] >= g  # its own dx row may change, unless it is in no group (then 0)
            assert same_bits(dx[keep_rows], dx0[keep_rows]).all(), f"{backend}: dx of other rows changed ({case})"
            assert (dx[groups >= g] == 0).all(), f"{backend}: dx of a row in no group is not 0 ({case})"
            keep_groups = np.ones(g, bool)
            if groups[r] < g:
                keep_groups[groups[r]] = False
            bad = np.argwhere(~same_bits(dw[keep_groups], dw0[keep_groups]))
            assert bad.size == 0, f"{backend}: dw of groups without the row changed at {bad[:3].tolist()} ({case})"


# --------------------------------------------------------------------------- extreme scales
ELEMENTS = {"MXFP8_E4M3": (ml_dtypes.float8_e4m3fn, 448.0), "MXFP8_E5M2": (ml_dtypes.float8_e5m2, 1024.0),
            "MXFP4": (ml_dtypes.float4_e2m1fn, 6.0)}
# (lhs code, rhs code) of one K-block, lhs rows and rhs columns within +-2 of it: the smallest and
# largest E8M0 scales against each other, so that products are ordinary float32 numbers (a product
# beyond float32 is not what this checks), and beside ordinary ones.
SCALE_PAIRS = [(0, 254), (1, 253), (254, 0), (0, 200), (200, 0), (127, 127), (0, 127), (2, 127), (254, 90), (60, 60)]


def _operand(rng, fmt, shape, codes_per_block, axis):
    """(data, scale codes) of a MX operand blocked by 32 along ``axis`` (-1 or 1)."""
    dtype, top = ELEMENTS[fmt]
    data = np.clip(rng.standard_normal(shape) * top / 4, -top, top).astype(dtype)
    scale_shape = list(shape)
    scale_shape[axis] = -(-shape[axis] // 32)
    jitter = rng.integers(-2, 3, scale_shape)
    codes = np.clip(np.expand_dims(codes_per_block, tuple(d for d in range(len(shape)) if d != axis % len(shape)))
                    + jitter, 0, 254).astype(np.uint8)
    return data, codes.view(ml_dtypes.float8_e8m0fnu)


def _dequantized(data, scale, axis):
    s = np.ldexp(1.0, scale.view(np.uint8).astype(np.int64) - 127)
    return data.astype(np.float64) * np.repeat(s, 32, axis=axis).take(range(data.shape[axis]), axis=axis)


@fuzz("extreme scales", 8)
@given(op=st.sampled_from(["block_scaled_dot", "ragged_dot"]), fl=st.sampled_from(sorted(ELEMENTS)),
       fr=st.sampled_from(sorted(ELEMENTS)), m=st.sampled_from([3, 16]), k=st.sampled_from([32, 64, 96]),
       n=st.sampled_from([2, 16]), blocks=st.lists(st.sampled_from(SCALE_PAIRS), min_size=3, max_size=3),
       sizes=SIZES, seed=_values.seeds)
def test_extreme_scales_against_the_float64_model(worker, op, fl, fr, m, k, n, blocks, sizes, seed):
    rng = np.random.default_rng(seed)
    nb = k // 32
    lc, rc = np.array([p[0] for p in blocks[:nb]]), np.array([p[1] for p in blocks[:nb]])
    lhs = _operand(rng, fl, (m, k), lc, -1)
    a = _dequantized(*lhs, -1)
    if op == "block_scaled_dot":
        rhs = _operand(rng, fr, (n, k), rc, -1)
        want = a @ _dequantized(*rhs, -1).T
        mag = np.abs(a) @ np.abs(_dequantized(*rhs, -1)).T
        sizes = []
    else:
        g = len(sizes)
        rhs = _operand(rng, fr, (g, k, n), rc, 1)
        b = _dequantized(*rhs, 1)
        groups = group_of_rows(sizes, m)
        want, mag = np.zeros((m, n)), np.zeros((m, n))
        for r in range(m):
            if groups[r] < g:
                want[r], mag[r] = a[r] @ b[groups[r]], np.abs(a[r]) @ np.abs(b[groups[r]])
    case = f"{op} {fl} x {fr} m={m} k={k} n={n} scale codes lhs {lc.tolist()} rhs {rc.tolist()} sizes {sizes}"
    area = "extreme scales"
    with judged(area):
        results = worker_outcome(area, worker.run("dot_of_parts", dict(
            op=op, lhs_parts=lhs, rhs_parts=rhs, formats=[("const", fl), ("const", fr)],
            sizes=np.asarray(sizes, np.int32), backends=("auto", "reference", "xla"))), case)
        assert not isinstance(results, tuple), f"[{area}] refused valid operands: {results} ({case})"
        for backend, r in results.items():
            assert r[0] == "ok", f"[{area}] {backend} refused valid operands: {r} ({case})"
            # float32 accumulation of K products, and results below float32's normal range
            tol = mag * k * 2.0**-22 + k * 2.0**-126
            assert_close(r[1], want.astype(np.float32), tol, f"{op} on {backend}", case)
        record(area, "ok")


# --------------------------------------------------------------------------- eager vs jit
CALLS = ["quantize", "quantize_grouped", "dequantize_grouped", "ragged_dot", "ragged_dot xla", "scaled_ragged_dot",
         "block_scaled_dot", "block_scaled_dot xla"]
ONE_AXIS = ["MXFP8_E4M3", "MXFP8_E5M2", "MXFP4", "NVFP4", "FP8_1x128"]


@fuzz("eager vs jit", 10)
@given(call=st.sampled_from(CALLS), fmt=st.sampled_from(ONE_AXIS), dtype=st.sampled_from(_values.FLOATS),
       out_dtype=st.sampled_from(_values.FLOATS), m=st.sampled_from([5, 32, 40]), axis=st.sampled_from([0, -1]),
       sizes=SIZES, specials=st.sampled_from([0.0, 0.05, 0.3]), tiny=st.booleans(), seed=_values.seeds)
def test_eager_and_jit_give_the_same_bits(worker, call, fmt, dtype, out_dtype, m, axis, sizes, specials, tiny, seed):
    """An eager call (op by op, or through the op's cache) and the jitted call are the same
    computation: the same bits out, subnormals and non-finite inputs included, or the same refusal."""
    k, n, g = 64, 16, len(sizes)
    # tiny: every value near the dtype's subnormal range, where a flush to zero shows
    exp = int(np.log2(float(ml_dtypes.finfo(dtype).smallest_normal))) if tiny else None
    x = _values.make((m, k), dtype, seed, specials, scale_exp=exp)
    w = _values.make((g, k, n), dtype, seed + 1, specials, scale_exp=exp)
    case = (f"{call}({dtype.name} x {[m, k]}, w {[g, k, n]}, {fmt}, sizes={sizes}, axis={axis}, out {out_dtype.name}, "
            f"specials={specials}, tiny={tiny}, seed={seed})")
    area = "eager vs jit"
    with judged(area):
        r = worker_outcome(area, worker.run("eager_vs_jit", dict(
            call=call, x=x, w=w, sizes=np.asarray(sizes, np.int32), fmt=("const", fmt), axis=axis,
            out_dtype=out_dtype)), case)
        eager, jitted = r["eager"], r["jit"]
        assert eager[0] == jitted[0], f"[{area}] eager {eager[0]} {eager[1:]} but jit {jitted[0]} {jitted[1:]} ({case})"
        if eager[0] == "raised":
            check_refusal(area, eager, case)
            assert eager[1] == jitted[1], f"[{area}] eager raised {eager[1]}, jit {jitted[1]} ({case})"
            record(area, "refused")
            return
        for i, (a, b) in enumerate(zip(eager[1], jitted[1])):
            assert a.dtype == b.dtype and a.shape == b.shape, (
                f"[{area}] output {i}: {a.dtype}{a.shape} vs {b.dtype}{b.shape} ({case})")
            bad = np.argwhere(~same_bits(a, b))
            assert bad.size == 0, (f"[{area}] output {i}: {len(bad)} elements differ eager vs jit, first at "
                                   f"{bad[:3].tolist()}: {a[tuple(bad[0])]} vs {b[tuple(bad[0])]} ({case})")
        record(area, "ok")


# --------------------------------------------------------------------------- list-typed arguments
ELEMENT_VALUES = st.one_of(
    st.integers(-3, 20), st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**40, 10**30]),
    st.sampled_from([8.0, 8.7, -0.0, float("nan"), float("inf"), True, False, "8", "", None, b"8", 1j, [8], (8,)]),
    st.sampled_from([np.int32(3), np.int64(5), np.uint8(2), np.int8(-1), np.float32(4.0), np.bool_(True),
                     np.int64(2**40)]))


@fuzz("list arguments", 12)
@given(entry=st.sampled_from(["ragged_dot", "scaled_ragged_dot", "quantize_grouped", "dequantize_grouped"]),
       values=st.lists(ELEMENT_VALUES, max_size=4), as_tuple=st.booleans(), m=st.sampled_from([16, 24]))
def test_group_sizes_as_a_list(worker, entry, values, as_tuple, m):
    sizes = tuple(values) if as_tuple else values
    case = f"{entry}(group_sizes={sizes!r}) with {m} rows"
    area = "list arguments"
    with judged(area):
        r = worker_outcome(area, worker.run("list_arguments", dict(entry=entry, sizes=sizes, m=m)), case)
        got = r["list"]
        if r["exact"]:
            want = r["array"]
            assert got[0] == want[0], f"[{area}] the list {got[0]}, the array {want[0]} ({case}): {got[1:]} {want[1:]}"
            if got[0] == "ok":
                assert same_bits(got[1], want[1]).all(), (
                    f"[{area}] the list and the array give different results ({case})")
            record(area, "same as the array")
            return
        assert got[0] == "raised", f"[{area}] accepted a list holding something other than int32 ints ({case})"
        _, exc_type, message = got
        assert exc_type in ("TypeError", "ValueError"), f"[{area}] {exc_type}: {message} ({case})"
        assert message.startswith(f"{entry}:") and "group_sizes" in message, (
            f"[{area}] the refusal does not name {entry} and group_sizes: {message!r} ({case})")
        record(area, "refused")

