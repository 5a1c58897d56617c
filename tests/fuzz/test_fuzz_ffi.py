"""Fuzz: every FFI target the CPU extension registers, called directly through jax.ffi.ffi_call
the way a hostile or mistaken caller would: wrong attribute values and types, missing and extra
attributes, too few or too many operands and results, wrong dtypes and shapes. A handler must
return an error (XlaRuntimeError here) or compute the right thing; never crash, write out of
bounds (the sanitizer leg, .ci/sanitizers.sh, sees what a plain run cannot), or hang."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import _values
from _budget import fuzz, judged, record
from _judge import assert_bits, bits, check_refusal, worker_outcome
from test_formats import elem_bits, expected_quantize, scale_bits
from jax_gpuext import formats

F32, S32 = np.dtype(np.float32), np.dtype(np.int32)
FORMAT_NAMES = tuple(n for n, f in formats.FORMATS.items() if not f.per_tensor)


def quantize_call(fmt, shape):
    x = _values.make(shape, F32, 1, 0.0, scale_exp=0)
    out = [(shape, fmt.elem_dtype), (formats.scale_shape(shape, fmt, -1), fmt.scale_dtype)]
    attrs = dict(format=np.int32(fmt.code), axis=np.int64(-1), scale_rounding=np.int32(0), fp4_packed=np.int32(1))
    return [x, np.float32(0.25)], out, attrs


def dequantize_call(fmt, shape):
    data = _values.make(shape, fmt.elem_dtype, 2, 0.0, scale_exp=0)
    scale = np.ones(formats.scale_shape(shape, fmt, -1), fmt.scale_dtype)
    attrs = dict(format=np.int32(fmt.code), axis=np.int64(-1), fp4_packed=np.int32(1))
    return [data, scale, np.float32(1.0)], [(shape, F32)], attrs


def place_call(fmt, shape):
    x = _values.make(shape, F32, 3)
    return [x], [(shape, F32)], {}


def all_reduce_call(fmt, shape):
    x = _values.make(shape, F32, 4, 0.0, scale_exp=0)
    # A site far above the per-trace counter jax_gpuext.all_reduce draws from: a mutated call here
    # (group_size 4 from one device) times out and poisons its site's CPU group, which must not be
    # one a later all_reduce of the same worker process is given.
    attrs = dict(op=np.int32(0), algorithm=np.int32(1), group_size=np.int64(1), site=np.int64(1 << 40),
                 workspace_bytes=np.int64(1 << 20), timeout_s=np.float32(2.0))
    return [x, np.zeros((1,), S32), np.zeros((1,), S32)], [(shape, F32)], attrs


# The well-formed call of every CPU target, as our Python code makes it. A target registered
# without an entry here fails test_every_target_is_fuzzed: add its call when adding a handler.
CALLS = {"gpuext_quantize": quantize_call, "gpuext_dequantize": dequantize_call, "gpuext_place": place_call,
         "gpuext_all_reduce": all_reduce_call}
# Attribute values worth trying: boundaries, codes just outside the enums, the sub-byte packing
# flag flipped, huge sizes and timeouts. (No workspace sizes between 1 MiB and 2^62: a handler
# that trusted one would zero-fill gigabytes of this shared machine before failing.)
INTS = (-(1 << 31), -1, 0, 1, 2, 3, 4, 5, 6, 7, 99, (1 << 31) - 1, 1 << 62)
FLOATS = (0.0, -1.0, float("nan"), float("inf"), 1e30, 1e-3)
DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float64), np.dtype(np.int32),
          np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e8m0fnu),
          np.dtype(ml_dtypes.float4_e2m1fn), np.dtype(ml_dtypes.int4), np.dtype(np.bool_), np.dtype(np.uint16),
          np.dtype(np.complex64)) + tuple(  # element types whose buffer layout no handler knows (issue 26)
    np.dtype(getattr(ml_dtypes, n)) for n in ("float6_e2m3fn", "float6_e3m2fn") if hasattr(ml_dtypes, n))
# The operand / result that holds block scales, and the global scale operand, per target: their
# shapes are permuted or given other leading dims (same element count), which the handlers took
# as long as the count matched (issue 26).
SCALE_SLOTS = {"gpuext_quantize": ("result", 1), "gpuext_dequantize": ("operand", 1)}
GLOBAL_SLOTS = {"gpuext_quantize": 1, "gpuext_dequantize": 2}
MUTATIONS = ("attr_value", "attr_value", "attr_type", "attr_missing", "attr_extra", "operand_count",
             "operand_dtype", "operand_shape", "result_count", "result_dtype", "result_shape", "scale_layout",
             "global_layout")


def other_shape(shape, k):
    options = [shape[:-1], shape + (2,), tuple(d + 1 for d in shape), (0,) + shape[1:], (), (1 << 20,)]
    return options[k % len(options)]


def same_count_shapes(shape):
    """Other shapes with as many elements: permutations, a split or merged dim, leading ones."""
    n = int(np.prod(shape))
    options = {tuple(reversed(shape)), (n,), (1,) + tuple(shape), tuple(shape) + (1,)}
    if len(shape) >= 2:
        options.add((shape[0] * shape[1],) + tuple(shape[2:]))
        options.add(tuple(shape[1:2]) + tuple(shape[:1]) + tuple(shape[2:]))
    options.discard(tuple(shape))
    return sorted(options)


def mutate(draw, operands, results, attrs, what, target):
    """Applies mutation ``what``; returns (operands, results, attrs, description)."""
    operands, results, attrs = list(operands), list(results), dict(attrs)
    if what.startswith("attr") and not attrs:
        what = "attr_extra"
    if what == "scale_layout" and target in SCALE_SLOTS:
        kind, i = SCALE_SLOTS[target]
        seq = operands if kind == "operand" else results
        if i < len(seq):
            shape, dtype = (seq[i].shape, seq[i].dtype) if kind == "operand" else seq[i]
            options = same_count_shapes(tuple(shape))
            if options:
                new = draw(st.sampled_from(options))
                seq[i] = np.asarray(seq[i]).reshape(new) if kind == "operand" else (new, dtype)
                return operands, results, attrs, f"scale {kind} reshaped {list(shape)} -> {list(new)}"
    if what == "global_layout" and target in GLOBAL_SLOTS and GLOBAL_SLOTS[target] < len(operands):
        i = GLOBAL_SLOTS[target]
        lead = np.asarray(operands[0]).shape
        new = draw(st.sampled_from([(), (1,), (2,), lead[:1], lead[1:2], tuple(reversed(lead[:2])), lead]))
        operands[i] = np.ones(new, F32)
        return operands, results, attrs, f"global scale operand as float32{list(new)}"
    if what in ("scale_layout", "global_layout"):  # not applicable to this target or call
        what = "operand_shape"
    if what == "attr_value":
        name = draw(st.sampled_from(sorted(attrs)))
        t = type(attrs[name]) if isinstance(attrs[name], (np.integer, np.floating)) else np.int32
        attrs[name] = t(draw(st.sampled_from(FLOATS))) if issubclass(t, np.floating) else t(draw(st.sampled_from(
            [v for v in INTS if np.iinfo(t).min <= v <= np.iinfo(t).max])))
        return operands, results, attrs, f"{name}={attrs[name]!r}"
    if what == "attr_type":
        name = draw(st.sampled_from(sorted(attrs)))
        attrs[name] = draw(st.sampled_from([np.int32(1), np.int64(1), np.float32(1), "1", True, np.uint8(1)]))
        return operands, results, attrs, f"{name} as {type(attrs[name]).__name__}"
    if what == "attr_missing":
        name = draw(st.sampled_from(sorted(attrs)))
        del attrs[name]
        return operands, results, attrs, f"without {name}"
    if what == "attr_extra":
        attrs["bogus"] = np.int32(1)
        return operands, results, attrs, "extra attribute bogus"
    seq = operands if what.startswith("operand") else results
    if what.endswith("count"):
        if seq and draw(st.booleans()):
            seq.pop()
            return operands, results, attrs, f"one {what[:-6]} fewer"
        seq.append(np.ones((3,), F32) if seq is operands else ((3,), F32))
        return operands, results, attrs, f"one {what[:-6]} more"
    if not seq:
        return operands, results, attrs, f"no {what[:-6]}s"
    i = draw(st.integers(0, len(seq) - 1))
    shape, dtype = (seq[i].shape, seq[i].dtype) if seq is operands else seq[i]
    if what.endswith("dtype"):
        dtype = draw(st.sampled_from(DTYPES))
    else:
        shape = other_shape(tuple(shape), draw(st.integers(0, 5)))
    seq[i] = _values.make(shape, dtype, 5) if seq is operands else (shape, dtype)
    return operands, results, attrs, f"{what[:-6]} {i} as {dtype.name}{list(shape)}"


def check_quantize_result(values, operands, attrs, case):
    """A quantize call the handler accepted must have computed that format (FP4 unpacked into a
    packed buffer is not a format: accepting fp4_packed=0 on CPU is itself the bug)."""
    code = int(attrs.get("format", -1))
    fmt = next((f for f in formats.FORMATS.values() if f.code == code), None)
    if fmt is None or fmt.per_tensor or int(attrs.get("axis", 0)) != -1 or int(attrs.get("scale_rounding", -1)) != 0:
        return
    assert not (fmt is formats.NVFP4 and int(attrs.get("fp4_packed", 1)) == 0), (
        f"accepted fp4_packed=0 for an NVFP4 buffer XLA packs: the handler wrote one byte per element ({case})")
    x = operands[0]
    if len(values) == 2 and values[1].size and np.ndim(x) >= 1:
        # a scale buffer of another shape (a permutation holds as many entries) is not this format
        want_shape = formats.scale_shape(np.shape(x), fmt, -1)
        assert values[1].shape == want_shape, (
            f"accepted a scale result of shape {values[1].shape}, the format's is {want_shape} ({case})")
    if len(values) != 2 or len(operands) != 2 or np.ndim(operands[1]) != 0 or x.dtype != F32 or values[0].shape != x.shape or values[0].dtype != fmt.elem_dtype:
        return
    want, scale, _ = expected_quantize(x, fmt, -1, "up", np.float32(operands[1]) if fmt.has_global_scale else None)
    assert_bits(values[0], elem_bits(want, fmt), f"direct gpuext_quantize {fmt.name} data", case)
    assert_bits(values[1], scale_bits(scale, fmt), f"direct gpuext_quantize {fmt.name} scale", case)


def check_dequantize_result(values, operands, results, attrs, case):
    """A dequantize call the handler accepted must describe a BlockScaledArray that Python accepts
    too (the same shape rules on both sides), and must have computed its dequantization."""
    code, axis = int(attrs.get("format", -1)), int(attrs.get("axis", 1))
    fmt = next((f for f in formats.FORMATS.values() if f.code == code), None)
    if fmt is None or len(operands) != 3 or len(values) != 1 or values[0].size == 0:
        return  # (XLA runs no call whose results are all empty)
    data, scale, g = (np.asarray(o) for o in operands)
    glob = g if fmt.has_global_scale else None
    try:
        q = formats.BlockScaledArray(data, scale, glob, fmt, axis)
    except (TypeError, ValueError) as e:
        raise AssertionError(f"the handler accepted what BlockScaledArray refuses ({e}): {case}") from None
    want = formats.dequantize(q, values[0].dtype, backend="reference")
    assert_bits(values[0], bits(want), f"direct gpuext_dequantize {fmt.name}", case)


def test_every_target_is_fuzzed(worker):
    outcome = worker.run("registrations", {})
    names = worker_outcome("ffi", outcome, "registrations()")
    assert set(names) <= set(CALLS), f"registered CPU targets without a fuzz call in CALLS: {set(names) - set(CALLS)}"


@fuzz("ffi", 150)
@given(target=st.sampled_from(sorted(CALLS)), fmt=st.sampled_from(FORMAT_NAMES),
       shape=st.sampled_from([(4, 64), (1, 33), (3, 5, 16), (256, 128), (2048,)]),
       n_mutations=st.sampled_from([0, 1, 1, 1, 2]), data=st.data())
def test_ffi_target(worker, target, fmt, shape, n_mutations, data):
    f = formats.FORMATS[fmt]
    if len(shape) < 2 and len(f.block) == 2:
        shape = (1,) + shape
    operands, results, attrs = CALLS[target](f, shape)
    done = []
    for _ in range(n_mutations):
        operands, results, attrs, what = mutate(data.draw, operands, results, attrs,
                                                data.draw(st.sampled_from(MUTATIONS), label="mutation"), target)
        done.append(what)
    case = (f"jax.ffi.ffi_call({target!r}, results={[(list(s), np.dtype(d).name) for s, d in results]})"
            f"(*[{', '.join(np.dtype(o.dtype).name + str(list(o.shape)) for o in map(np.asarray, operands))}], "
            f"**{attrs}) [{fmt}; {', '.join(done) or 'well-formed'}]")
    with judged("ffi"):
        out = worker_outcome("ffi", worker.run("ffi_call", dict(
            target=target, operands=operands, results=results, attributes=attrs), timeout=60), case)
        if isinstance(out, tuple):  # ("raised", type, message)
            check_refusal("ffi", out, case)
            record("ffi", "refused")
            return
        record("ffi", "ok")
        values = out
        assert done or len(values) == len(results), case
        if target == "gpuext_quantize":
            check_quantize_result(values, operands, attrs, case)
        elif target == "gpuext_dequantize":
            check_dequantize_result(values, operands, results, attrs, case)
        elif target == "gpuext_place" and values and values[0].size:
            # place accepts only its operand's own type and shape, and then copies it exactly (XLA
            # runs no call whose results are all empty, or that has none: nothing to check then)
            x = np.asarray(operands[0])
            x = x.astype(jax.dtypes.canonicalize_dtype(x.dtype))  # float64 is float32 without x64
            assert len(values) == 1 and values[0].dtype == x.dtype, case
            assert_bits(values[0], bits(x), target, case)
        elif target == "gpuext_all_reduce" and not done:
            assert_bits(values[0], bits(operands[0]), target, case)  # a group of one
