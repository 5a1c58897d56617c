"""Fuzz: place (every space, dtypes down to 2-bit, sizes up to 2^20 elements) and all_reduce
(ops, algorithms, dtypes, axis names repeated / unbound / not strings, timeouts, memory spaces,
NaN). place must return its input bit for bit; all_reduce must equal the NumPy reduction over the
devices (max/min propagate NaN, as jnp.max) and accept or refuse a call alike on every backend."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import _values
from _budget import fuzz, judged
from _judge import assert_bits, assert_close, bits, per_backend
from jax_gpuext import MemorySpace

SUB_BYTE = tuple(np.dtype(getattr(ml_dtypes, n)) for n in ("int4", "uint4", "int2", "uint2", "float4_e2m1fn")
                 if hasattr(ml_dtypes, n))
# float6: a type whose buffer layout the handlers do not know; refused for COLLECTIVE / TEMP (issue 26)
FLOAT6 = tuple(np.dtype(getattr(ml_dtypes, n)) for n in ("float6_e2m3fn", "float6_e3m2fn") if hasattr(ml_dtypes, n))
PLACE_DTYPES = SUB_BYTE + FLOAT6 + _values.FLOATS + tuple(np.dtype(d) for d in (np.int8, np.uint8, np.int32, np.bool_))


@fuzz("place", 24)
@given(n=st.sampled_from([0, 1, 7, 1024, 4097, 1 << 20]), dtype=st.sampled_from(PLACE_DTYPES), seed=_values.seeds,
       space=st.sampled_from(list(MemorySpace) + ["collective", "temp", 3, -1, None]),
       strict=st.booleans(), backend=st.sampled_from(["auto", "identity", "custom_call"]))
def test_place(worker, n, dtype, seed, space, strict, backend):
    x = _values.make((n,), dtype, seed)
    case = f"place(x={dtype.name}[{n}] seed={seed}, {space!r}, strict={strict}, backend={backend!r})"
    with judged("place"):
        results = per_backend("place", worker.run("place", dict(x=x, space=space, strict=strict, backends=(backend,))),
                              case)
        for r in results.values():
            assert r.dtype == x.dtype and r.shape == x.shape, f"place returned {r.dtype}{r.shape} ({case})"
            assert_bits(r, bits(x), "place", case)


# --------------------------------------------------------------------------- all_reduce
OPS = ("sum", "max", "min", "prod", "and", "or")
AR_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.int32),
             np.dtype(np.int8), np.dtype(np.bool_))
MESHES = {"i": ((4,), ("i",)), "ab": ((2, 2), ("a", "b")), "i2": ((2,), ("i",))}
ALL_REDUCE_PARAMS = {
    "op": (st.sampled_from(OPS), st.sampled_from(["mean", None, 1])),
    "dtype": (st.sampled_from(AR_DTYPES), st.sampled_from([np.dtype(np.complex64), np.dtype(ml_dtypes.int4)])),
    "axis_name": (st.sampled_from(["all", "first"]),
                  st.sampled_from([("i", "i"), ("a", "a"), ("zz",), (), 3, ["i", 3]])),
    "timeout_s": (st.sampled_from([None, 5.0]), st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e7, "1"])),
    "spaces": (st.sampled_from([None, {"operand_spaces": {0: MemorySpace.COLLECTIVE}},
                                {"result_spaces": {0: MemorySpace.TEMP}}]),
               st.sampled_from([{"operand_spaces": {0: MemorySpace.PINNED_HOST}},
                                {"operand_spaces": {0: MemorySpace.COLLECTIVE, -1: MemorySpace.TEMP}},
                                {"operand_spaces": {1: MemorySpace.COLLECTIVE}},
                                {"result_spaces": {0: 1}}, {"operand_spaces": [0]}])),
}


def model(x, op, n_reduced, groups):
    """NumPy all-reduce of x [devices, ...] within groups of devices; NaN wins in max/min."""
    out = np.empty_like(x)
    for g in groups:
        v = x[list(g)]
        if op == "sum":
            r = v.astype(np.float64).sum(0) if v.dtype.kind == "f" or v.dtype == ml_dtypes.bfloat16 else v.sum(0, dtype=v.dtype)
        elif op == "prod":
            r = v.astype(np.float64).prod(0) if v.dtype.kind == "f" or v.dtype == ml_dtypes.bfloat16 else v.prod(0, dtype=v.dtype)
        elif op in ("max", "or"):
            r = np.max(v.astype(np.float64) if v.dtype == ml_dtypes.bfloat16 else v, 0)
        else:
            r = np.min(v.astype(np.float64) if v.dtype == ml_dtypes.bfloat16 else v, 0)
        for d in g:
            out[d] = np.asarray(r).astype(x.dtype)
    return out


@fuzz("all_reduce", 30)
@given(mesh=st.sampled_from(sorted(MESHES)), rows=st.sampled_from([0, 1, 3, 40]), seed=_values.seeds,
       specials=_values.special_fractions, data=st.data())
def test_all_reduce(worker, mesh, rows, seed, specials, data):
    p = _values.one_bad(data, ALL_REDUCE_PARAMS)
    shape, axes = MESHES[mesh]
    ndev = int(np.prod(shape))
    drawn = p["axis_name"]  # a name, "all"/"first", or a bad value (maybe unhashable: a list)
    axis_name = (axes if len(axes) > 1 else axes[0]) if drawn == "all" else axes[0] if drawn == "first" else drawn
    op, dtype = p["op"], p["dtype"]
    if isinstance(op, str) and dtype == np.bool_ and op in ("sum", "prod"):
        op = "or"
    if isinstance(op, str) and dtype != np.bool_ and op in ("and", "or"):
        op = "max"
    x = _values.make((ndev * max(rows, 1), 3), dtype, seed, specials if dtype.kind == "f" else 0.0)
    if dtype.kind == "f" or dtype == ml_dtypes.bfloat16:  # moderate values: sums stay finite
        x = np.clip(np.nan_to_num(x.astype(np.float32), nan=np.nan, posinf=np.inf, neginf=-np.inf), -100, 100).astype(dtype)
    kwargs = dict(op=op, timeout_s=p["timeout_s"], **(p["spaces"] or {}))
    case = f"all_reduce(x={dtype.name}{list(x.shape)} seed={seed}, {axis_name!r}, {kwargs}) on mesh {shape} {axes}"
    with judged("all_reduce"):
        results = per_backend("all_reduce", worker.run("all_reduce", dict(
            x=x, mesh_shape=shape, mesh_axes=axes, axis_name=axis_name, kwargs=kwargs,
            algorithms=("xla", "one_shot", "two_shot", "auto"))), case)
        if not results:
            return
        reduced = axes if p["axis_name"] == "all" else axes[:1]
        dev = x.reshape((ndev, -1, 3))
        idx = np.arange(ndev).reshape(shape)
        if reduced == axes:
            groups = [tuple(idx.ravel())]
        else:  # mesh ("a", "b"), reduce over "a": devices that share b
            groups = [tuple(idx[:, j]) for j in range(shape[1])] if len(axes) == 2 else [tuple(idx.ravel())]
        want = model(dev, op, len(groups[0]), groups).reshape(x.shape)
        for algorithm, r in results.items():
            tol = 0 if dtype.kind in "iub" else 2.0 ** -7 * np.abs(np.asarray(want, np.float64)) + 1e-6 + 2 * 2.0 ** -8 * 100
            assert_close(r, want, tol, f"all_reduce {op} {algorithm}", case)
