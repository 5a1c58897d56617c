"""Fuzz: quantize / dequantize and hand-built BlockScaledArrays, every format (the module
constants, pickled and deep-copied copies of them, names, junk), shapes of rank 0-5 with empty
dimensions, in- and out-of-range axes, every input dtype and some that are not, special values.
Every backend that runs on this platform must give the same answer: bits equal to the float64
NumPy model (tests/_formats_numpy.py via test_formats' helpers), or the same clean refusal."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import _values
from _budget import fuzz, judged
from _judge import assert_bits, per_backend
from test_formats import as_bits, elem_bits, expected_dequantize, expected_per_tensor, expected_quantize, scale_bits
import jax_gpuext as gx
from jax_gpuext import formats

BACKENDS = ("cpu", "reference")
NAMES = tuple(formats.FORMATS)
OUT_DTYPES = _values.FLOATS
BAD_DTYPES = (np.dtype(np.float64), np.dtype(np.int8), np.dtype(np.int32), np.dtype(ml_dtypes.float8_e4m3fn),
              np.dtype(np.bool_), np.dtype(ml_dtypes.int4))

FORMAT_SPECS = (st.tuples(st.sampled_from(["const", "const", "pickled", "copied"]), st.sampled_from(NAMES)),
                st.tuples(st.just("raw"), st.sampled_from(NAMES + ("MXFP6", "nvfp4", "", 3, None, 2.5))))
QUANTIZE_PARAMS = {
    "dtype": (st.sampled_from(_values.FLOATS), st.sampled_from(BAD_DTYPES)),
    "fmt": FORMAT_SPECS,
    "axis": (st.sampled_from([-1, -1, -2, 0, 1, np.int64(-1)]),
             st.one_of(st.integers(-6, 5), st.sampled_from([1.5, True, None, "0"]))),
    # None: the format's default ("nearest" for NVFP4, "up" otherwise); "ocp" is MX-only and
    # "nearest" NVFP4-only, so drawn with another format each is a clean refusal on every backend.
    "rounding": (st.sampled_from([None, "up", "up", "ocp", "nearest"]), st.sampled_from(["down", "Nearest", 2])),
    "global_scale": (st.none(), st.sampled_from([0.5, 2.0**-130, 0.0, -1.0, float("nan"), np.ones(2), 3])),
    "out_dtype": (st.sampled_from(OUT_DTYPES), st.just(np.dtype(np.int8))),
}


def format_of(spec):
    """The format a spec stands for, by name (None: not a format)."""
    how, value = spec
    name = value if how != "raw" else (value if isinstance(value, str) and value in formats.FORMATS else None)
    return None if name is None else formats.FORMATS[name]


def expected_scale_shape(shape, fmt, axis):
    if fmt.per_tensor:
        return ()
    s = list(shape)
    for a, b in ([(-2, 128), (-1, 128)] if len(fmt.block) == 2 else [(axis, fmt.block[0])]):
        s[a] = -(-s[a] // b)
    return tuple(s)


def check_quantized(r, x, fmt, axis, rounding, g_given, out_dtype, case):
    """One backend's quantize + dequantize result against the float64 model."""
    assert r["data"].shape == x.shape and r["data"].dtype == fmt.elem_dtype, f"data {r['data'].dtype}{r['data'].shape} ({case})"
    assert r["axis"] < 0, f"stored axis {r['axis']} must be negative ({case})"
    if x.size == 0:  # nothing to model but the shapes: an empty input is an empty result
        assert r["scale"].shape == expected_scale_shape(x.shape, fmt, r["axis"]), f"scale {r['scale'].shape} ({case})"
        assert r["y"].shape == x.shape, case
        return
    x = _values.as_jax_sees(x)  # the model gets what quantize got
    if fmt.per_tensor:
        values, scale = expected_per_tensor(x[None])
        values, scale, g = values[0], scale[0], None
        y = expected_dequantize_per_tensor(values, scale, out_dtype)
    else:
        values, scale, g = expected_quantize(x, fmt, r["axis"], rounding, g_given)
        y = expected_dequantize(np.asarray(values, np.float64), scale, fmt, out_dtype, r["axis"], g)
    assert_bits(r["data"], elem_bits(values, fmt), f"{fmt.name} data", case)
    assert_bits(r["scale"], scale_bits(scale, fmt), f"{fmt.name} scale", case)
    if g is not None:
        assert np.float32(r["global_scale"]).view(np.uint32) == np.float32(g).view(np.uint32), f"global scale ({case})"
    assert_bits(r["y"], as_bits(y), f"{fmt.name} dequantized", case)


def expected_dequantize_per_tensor(values, scale, out_dtype):
    import _formats_numpy as npref
    return npref.dequant(np.asarray(values, np.float64), np.asarray(scale, np.float64), out_dtype)


@fuzz("quantize", 45)
@given(shape=_values.shapes(), seed=_values.seeds, specials=_values.special_fractions, data=st.data())
def test_quantize_dequantize(worker, shape, seed, specials, data):
    p = _values.one_bad(data, QUANTIZE_PARAMS)
    dtype, fmt, axis, rounding, global_scale, out_dtype = (p[k] for k in QUANTIZE_PARAMS)
    x = _values.make(shape, dtype, seed, specials)
    case = (f"quantize(x={dtype.name}{list(shape)} seed={seed} specials={specials}, fmt={fmt}, axis={axis!r}, "
            f"scale_rounding={rounding!r}, global_scale={global_scale!r}) then dequantize({out_dtype})")
    with judged("quantize"):
        results = per_backend("quantize", worker.run("quantize", dict(
            x=x, fmt=fmt, axis=axis, scale_rounding=rounding, global_scale=global_scale, backends=BACKENDS,
            out_dtype=out_dtype)), case)
        for backend, r in results.items():
            f = format_of(fmt)
            g = None if global_scale is None or not f.has_global_scale else np.float32(global_scale)
            check_quantized(r, x, f, axis, rounding, g, out_dtype, f"{case} on backend {backend}")


# --------------------------------------------------------------------------- hand-built arrays
def parts_for(fmt, shape, axis, seed, mutation):
    """(data, scale, global_scale) of a BlockScaledArray of ``fmt`` and ``shape``, then one
    mutation: a wrong dtype, shape or rank, a list, negative scales, a global scale where none
    belongs or of a shape that matches nothing."""
    rng = np.random.default_rng(seed)
    data = _values.make(shape, fmt.elem_dtype, seed, 0.0, scale_exp=0)  # finite: data x scale is the model
    ss = expected_scale_shape(shape, fmt, axis)
    if fmt.is_mx:
        scale = rng.integers(120, 134, size=ss).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    else:
        scale = (rng.random(ss) * 4 + 0.25).astype(fmt.scale_dtype)
    g = np.float32(0.5) if fmt.has_global_scale else None
    if mutation == "negative_scale" and not fmt.is_mx:
        scale = (-np.asarray(scale, np.float32)).astype(fmt.scale_dtype)
    elif mutation == "scale_dtype":
        scale = np.asarray(scale, np.float32).astype(np.float16)
    elif mutation == "data_dtype":
        data = np.asarray(data, np.float32)
    elif mutation == "scale_shape":
        # per-tensor scales may be batched over leading dims: (shape[0] + 1,) is never such a prefix
        scale = np.ones(tuple(d + 1 for d in ss) or (shape[0] + 1,), fmt.scale_dtype)
    elif mutation == "data_list":
        data = np.asarray(data, np.float32).tolist()
    elif mutation == "global_scale_extra":
        g = np.float32(2.0)
    elif mutation == "global_scale_shape":
        g = np.ones((7, 3), np.float32)
    elif mutation == "no_global_scale":
        g = None
    return data, scale, g


@fuzz("BlockScaledArray", 30)
@given(name=st.sampled_from(NAMES), shape=_values.shapes(1, 4, 4000, (1, 2, 16, 33, 64, 130)), axis=st.one_of(st.none(), st.integers(-5, 4)),
       seed=_values.seeds, fmt_how=st.sampled_from(["const", "const", "pickled", "string"]),
       mutation=st.sampled_from([None, None, None, None, "negative_scale", "scale_dtype", "data_dtype", "scale_shape",
                                 "data_list", "global_scale_extra", "global_scale_shape", "no_global_scale"]),
       out_dtype=st.sampled_from(OUT_DTYPES))
def test_hand_built_arrays(worker, name, shape, axis, seed, fmt_how, mutation, out_dtype):
    fmt = formats.FORMATS[name]
    if len(fmt.block) == 2 and len(shape) < 2:
        shape = (3,) + shape
    ax = -1 if len(fmt.block) == 2 else ((axis or -1) % len(shape)) - len(shape)
    axis = ax if axis is None else axis  # None: the valid (negative) axis; else as drawn
    data, scale, g = parts_for(fmt, shape, ax, seed, mutation)
    spec = ("raw", name) if fmt_how == "string" else (fmt_how, name)
    case = (f"BlockScaledArray({name} via {fmt_how}, shape={list(shape)}, axis={axis}, seed={seed}, "
            f"mutation={mutation}).dequantize({np.dtype(out_dtype).name})")
    with judged("BlockScaledArray"):
        results = per_backend("BlockScaledArray", worker.run("dequantize_parts", dict(
            data=data, scale=scale, global_scale=g, fmt=spec, axis=axis, backends=BACKENDS, out_dtype=out_dtype)),
            case)
        if results:
            check_hand_built(results, fmt, ax, data, scale, g, mutation, out_dtype, case)


def check_hand_built(results, fmt, ax, data, scale, g, mutation, out_dtype, case):
    """Accepted parts must have been valid, and the values are data x scale (x global scale), the
    definition, whatever the sign of the scale."""
    valid = mutation in (None, "negative_scale", "no_global_scale") or (
        mutation == "global_scale_extra" and fmt.has_global_scale)
    assert valid, f"accepted invalid parts ({mutation}) instead of a ValueError/TypeError naming the part: {case}"
    values = np.asarray(data, np.float64)
    if fmt.per_tensor:
        y = expected_dequantize_per_tensor(values, np.asarray(scale, np.float64), out_dtype)
    else:
        s = np.asarray(scale, np.float64)
        if fmt.is_mx:
            s = np.log2(s)
        y = expected_dequantize(values, s, fmt, out_dtype, ax, None if g is None else np.float32(g))
    for backend, r in results.items():
        assert_bits(r, as_bits(y), f"{fmt.name} dequantized", f"{case} on backend {backend}")
