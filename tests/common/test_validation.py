"""Issue 15 (reliability), findings 5, 6 and 8: formats are values (pickle / copy / rebuilt ones
dispatch like the originals), negative block scales mean data x scale on every backend, and the
public arguments (BlockScaledArray parts, empty inputs, dimension numbers, memory-space maps)
are validated before any backend is chosen, so a call is refused the same way everywhere."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_gpuext as gx
from jax_gpuext import dot as dot_mod
from jax_gpuext import formats, memory

FORMATS = list(formats.FORMATS.values())
IDS = [f.name for f in FORMATS]
BACKENDS = ["reference", "xla", "cpu"]  # every quantize/dequantize backend on a CPU machine


def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def rand(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * 3, jnp.float32)


def q_parts(fmt, shape=(4, 256), seed=0):
    return gx.quantize(rand(seed, shape), fmt, backend="cpu")


def dequantize(q, dtype=jnp.float32, backend="auto"):
    """Jitted: one compilation of the reference instead of many eager ops."""
    return jax.jit(lambda a: gx.dequantize(a, dtype, backend=backend))(q)


# --------------------------------------------------------------------------- finding 5: formats are values
def _copies(fmt):
    fields = dataclasses.astuple(fmt)
    loose = (fields[0], fmt.elem_dtype.type, fmt.scale_dtype.type, list(fmt.block)) + fields[4:]
    return {
        "pickle": pickle.loads(pickle.dumps(fmt)),
        "deepcopy": copy.deepcopy(fmt),
        "copy": copy.copy(fmt),
        "fields": gx.BlockFormat(*fields),  # a new object: only equality can dispatch it
        "loose_fields": gx.BlockFormat(*loose),  # scalar types for dtypes, a list for the block
        "replace": dataclasses.replace(fmt),
    }


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_format_copies_are_the_same_format(fmt):
    for how, c in _copies(fmt).items():
        assert c == fmt and hash(c) == hash(fmt), how
        assert c != next(f for f in FORMATS if f is not fmt), how
    # pickle / copy come back as the canonical module-level object
    for how in ("pickle", "deepcopy", "copy"):
        assert _copies(fmt)[how] is fmt, how
    # a format nobody registered survives a round trip by value
    custom = dataclasses.replace(fmt, name=fmt.name + "_custom")
    assert pickle.loads(pickle.dumps(custom)) == custom
    assert {fmt: 1}[_copies(fmt)["fields"]] == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_format_copies_quantize_dequantize_and_dot_alike(fmt, backend):
    """The reported bug: an unpickled MXFP8_E4M3 was decoded as E5M2 by the reference backend.
    pickle / copy give the canonical object back (tested above); formats rebuilt from their
    fields are new objects, which only dispatch by value can serve."""
    x, w = rand(1, (8, 256)), rand(2, (16, 256))

    def make_run(c):  # a new function per format: no trace cache shared between equal formats
        def run(x, w, q0):
            q = gx.quantize(x, c, backend=backend)
            relabeled = gx.BlockScaledArray(q0.data, q0.scale, q0.global_scale, c, q0.axis)
            d = gx.block_scaled_dot(q, gx.quantize(w, c, backend=backend), preferred_element_type=jnp.float32)
            return q, gx.dequantize(q, backend=backend), gx.dequantize(relabeled, backend=backend), d
        return jax.jit(run)

    want_q = gx.quantize(x, fmt, backend="cpu")
    want = make_run(fmt)(x, w, want_q)
    for how in ("fields", "loose_fields"):
        got = make_run(_copies(fmt)[how])(x, w, want_q)
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(bits(g), bits(e), how)
        assert got[0].format == fmt


def test_unpickled_mxfp8_e4m3_decodes_as_e4m3():
    """Independent of the other backends: E4M3 elements times 2**(e - 127), in float64."""
    q = q_parts(gx.MXFP8_E4M3, (2, 64), 3)
    c = gx.BlockFormat(*dataclasses.astuple(gx.MXFP8_E4M3))
    y = dequantize(gx.BlockScaledArray(q.data, q.scale, None, c, -1), backend="reference")
    e = bits(q.scale).astype(np.float64) - 127
    want = np.asarray(q.data).astype(np.float64) * np.repeat(np.exp2(e), 32, axis=-1)
    np.testing.assert_array_equal(np.asarray(y), want.astype(np.float32))


# --------------------------------------------------------------------------- finding 6: negative scales
NEGATIVE_SCALE_FORMATS = [f for f in FORMATS if not f.is_mx]  # E8M0 scales have no sign


def _negated_scales(q, seed):
    """q's scales with the sign of a random half flipped (sign bit: exact), one zero of each sign."""
    rng = np.random.default_rng(seed)
    s = np.array(q.scale)
    flip = np.array(rng.random(s.shape) < 0.5)
    flip.reshape(-1)[-1] = True  # at least one (FP8_TENSOR has one scale)
    s = np.where(flip, -s.astype(np.float64), s.astype(np.float64)).astype(s.dtype)
    if s.size >= 2:
        s.reshape(-1)[:2] = np.array([0.0, -0.0]).astype(s.dtype)
    return jnp.asarray(s)


def _expand(scale, fmt, shape):
    s = np.asarray(scale).astype(np.float64)
    if fmt.per_tensor:
        return np.broadcast_to(s, shape)
    for ax, b in zip(range(-len(fmt.block), 0), fmt.block):
        s = np.repeat(s, b, axis=ax)
    return s[tuple(slice(0, n) for n in shape)]


@pytest.mark.parametrize("out", [np.float32, ml_dtypes.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", NEGATIVE_SCALE_FORMATS, ids=[f.name for f in NEGATIVE_SCALE_FORMATS])
def test_negative_scales_dequantize_as_data_times_scale(fmt, backend, out):
    q = q_parts(fmt, (130, 200), seed=4)
    neg = gx.BlockScaledArray(q.data, _negated_scales(q, 5), q.global_scale, fmt, q.axis)
    y = dequantize(neg, out, backend=backend)
    g = 1.0 if q.global_scale is None else float(q.global_scale)
    # float64 products are exact (at most 4 x 24 significand bits), rounded once to `out`
    want = np.asarray(q.data).astype(np.float64) * _expand(neg.scale, fmt, q.shape) * g
    np.testing.assert_array_equal(bits(y), bits(want.astype(out)))
    assert (np.signbit(np.asarray(y, np.float32)) != np.signbit(np.asarray(q.dequantize(), np.float32))).any()


@pytest.mark.parametrize("fmt", NEGATIVE_SCALE_FORMATS, ids=[f.name for f in NEGATIVE_SCALE_FORMATS])
def test_negative_scales_in_block_scaled_dot(fmt):
    lf, rf = (gx.FP8_1x128, fmt) if fmt == gx.FP8_128x128 else (fmt, fmt)
    a, b = q_parts(lf, (8, 256), 6), q_parts(rf, (16, 256), 7)
    a = gx.BlockScaledArray(a.data, _negated_scales(a, 8), a.global_scale, lf, a.axis)
    b = gx.BlockScaledArray(b.data, _negated_scales(b, 9), b.global_scale, rf, b.axis)
    got = np.asarray(gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32))
    want = np.asarray(gx.dequantize(a), np.float64) @ np.asarray(gx.dequantize(b), np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_fold_scale_signs_keeps_every_product():
    """What the cuDNN / cuBLASLt NVFP4 paths (unsigned UE4M3 scales) run: same products, scales >= 0."""
    q = q_parts(gx.NVFP4, (3, 5, 72), seed=10)
    s = _negated_scales(q, 11)
    data, scale = dot_mod.fold_scale_signs(q.data, s)
    assert not np.signbit(np.asarray(scale, np.float32)).any()
    before = np.asarray(q.data, np.float64) * _expand(s, gx.NVFP4, q.shape)
    after = np.asarray(data, np.float64) * _expand(scale, gx.NVFP4, q.shape)
    np.testing.assert_array_equal(before, after)  # -0.0 == 0.0: products, not sign bits of zeros


# --------------------------------------------------------------------------- finding 8: BlockScaledArray parts
def _parts(fmt):
    q = q_parts(fmt, (4, 256))
    return dict(data=q.data, scale=q.scale, global_scale=q.global_scale, format=fmt, axis=q.axis)


def _build(**parts):
    return gx.BlockScaledArray(parts["data"], parts["scale"], parts["global_scale"], parts["format"], parts["axis"])


BAD_PARTS = [
    ("MXFP8_E4M3", dict(axis=2), ValueError, r"axis 2 is out of range for BlockScaledArray: data of shape \(4, 256\)"),
    ("MXFP8_E4M3", dict(axis=-3), ValueError, "axis -3 is out of range"),
    ("MXFP8_E4M3", dict(axis=1.0), TypeError, "axis must be an int, got float"),
    ("MXFP8_E4M3", dict(axis=True), TypeError, "axis must be an int"),
    ("FP8_128x128", dict(axis=0), ValueError, "axis must be -1"),
    ("MXFP8_E4M3", dict(format="MXFP8_E4M3"), TypeError, r"format must be a jax_gpuext.BlockFormat.*str 'MXFP8_E4M3'"),
    ("MXFP8_E4M3", dict(format=object()), TypeError, "format must be a jax_gpuext.BlockFormat.*object"),
    ("MXFP8_E4M3", dict(data=[[1.0] * 256] * 4), TypeError, "data must be an array.*got list"),
    ("MXFP8_E4M3", dict(scale=1.0), TypeError, "scale must be an array.*got float"),
    ("MXFP8_E4M3", dict(data=jnp.ones((4, 256))), TypeError, "data of a MXFP8_E4M3 array must have dtype float8_e4m3fn, got float32"),
    ("MXFP8_E4M3", dict(scale=jnp.ones((4, 8))), TypeError, "scale of a MXFP8_E4M3 array must have dtype float8_e8m0fnu"),
    ("MXFP8_E4M3", dict(scale=jnp.ones((4, 7), jnp.float8_e8m0fnu)), ValueError, r"scale .* must have shape \[4, 8\], got float8_e8m0fnu\[4, 7\]"),
    ("MXFP8_E4M3", dict(axis=0), ValueError, r"must have shape \[1, 256\]"),
    ("FP8_128x128", dict(scale=jnp.ones((4, 2), jnp.float32)), ValueError, r"must have shape \[1, 2\]"),
    ("MXFP8_E4M3", dict(global_scale=jnp.ones((), jnp.float32)), ValueError, "MXFP8_E4M3 has no global scale"),
    ("FP8_TENSOR", dict(scale=jnp.ones((2,), jnp.float32)), ValueError, r"must have shape \[4\]"),
    ("FP8_TENSOR", dict(scale=jnp.ones((4, 256, 1), jnp.float32)), ValueError, r"must have shape \[4, 256\]"),
    ("NVFP4", dict(global_scale=None), ValueError, "NVFP4 needs a global_scale"),
    ("NVFP4", dict(global_scale=jnp.ones((), jnp.float16)), TypeError, "global_scale must have dtype float32"),
    ("NVFP4", dict(global_scale=jnp.ones((3,), jnp.float32)), ValueError, r"leading dims of data \[4, 256\].*\[3\]"),
    ("NVFP4", dict(global_scale=jnp.ones((4, 256, 1), jnp.float32)), ValueError, "leading dims"),
    ("NVFP4", dict(global_scale="1.0"), TypeError, "global_scale must be an array"),
    ("NVFP4", dict(data=jnp.ones((4, 256), jnp.float8_e4m3fn)), TypeError, "data of a NVFP4 array must have dtype float4_e2m1fn"),
]


@pytest.mark.parametrize("fmt_name, change, exc, match", BAD_PARTS,
                         ids=[f"{f}-{next(iter(c))}-{i}" for i, (f, c, _, _) in enumerate(BAD_PARTS)])
def test_block_scaled_array_validates_its_parts(fmt_name, change, exc, match):
    parts = _parts(formats.FORMATS[fmt_name]) | change
    with pytest.raises(exc, match=match):
        _build(**parts)


def test_block_scaled_array_accepts_what_quantize_and_vmap_make():
    for fmt in FORMATS:
        p = _parts(fmt)
        q = _build(**p | dict(axis=1 if len(fmt.block) == 1 else -1))
        assert q.axis == -1  # stored negative
        # numpy parts, ShapeDtypeStructs (abstract values, e.g. checkpoint restore targets)
        _build(**{k: np.asarray(v) if k in ("data", "scale", "global_scale") and v is not None else v
                  for k, v in p.items()})
        _build(**{k: jax.ShapeDtypeStruct(v.shape, v.dtype) if k in ("data", "scale") else v for k, v in p.items()})
    # per-tensor values with leading batch dims (quantized under vmap, used outside it)
    x = rand(12, (3, 4, 64))
    for fmt in (gx.NVFP4, gx.FP8_TENSOR):
        qv = jax.vmap(lambda v, f=fmt: gx.quantize(v, f))(x)
        rebuilt = gx.BlockScaledArray(qv.data, qv.scale, qv.global_scale, fmt, qv.axis)
        np.testing.assert_array_equal(bits(rebuilt.dequantize()), bits(qv.dequantize()))
    g = gx.BlockScaledArray(*(lambda q: (q.data, q.scale, 0.5, gx.NVFP4, -1))(q_parts(gx.NVFP4)))
    assert g.global_scale.dtype == np.float32  # a Python float is taken as fp32


def test_block_scaled_array_is_a_pytree_under_transformations():
    fmt = gx.NVFP4
    q = q_parts(fmt, (4, 64))
    leaves, tree = jax.tree_util.tree_flatten(q)
    # JAX rebuilds pytrees with placeholders while it transforms: no validation there
    for fill in (object(), None, 0):
        r = jax.tree_util.tree_unflatten(tree, [fill] * len(leaves))
        assert r.format == fmt and r.data is fill
    assert jax.tree.map(lambda a: a.shape, q).data == (4, 64)
    # construction from tracers inside jit and vmap, abstract evaluation, in_axes prefixes
    build = lambda d, s, g: gx.BlockScaledArray(d, s, g, fmt, -1).dequantize()  # noqa: E731
    want = bits(q.dequantize())
    np.testing.assert_array_equal(bits(jax.jit(build)(q.data, q.scale, q.global_scale)), want)
    stacked = jax.tree.map(lambda a: jnp.stack([a, a]), q)
    np.testing.assert_array_equal(bits(jax.vmap(build)(stacked.data, stacked.scale, stacked.global_scale)),
                                  np.stack([want, want]))
    in_axes = jax.tree_util.tree_unflatten(tree, [0] * len(leaves))  # an in_axes prefix of q's structure
    np.testing.assert_array_equal(bits(jax.vmap(gx.dequantize, in_axes=(in_axes,))(stacked)), np.stack([want, want]))
    shapes = jax.eval_shape(lambda v: gx.quantize(v, fmt), jax.ShapeDtypeStruct((4, 64), jnp.float32))
    assert shapes.scale.shape == (4, 4) and shapes.global_scale.shape == ()
    assert jax.eval_shape(gx.dequantize, shapes).shape == (4, 64)
    # a jitted function taking and returning BlockScaledArrays; grad through a function that builds one
    np.testing.assert_array_equal(bits(jax.jit(lambda a: a)(q).data), bits(q.data))
    def dot_with(g):  # the reference dot is differentiable in the global scales: acc * g * g
        a = gx.BlockScaledArray(q.data, q.scale, g, fmt, -1)
        return gx.block_scaled_dot(a, a, preferred_element_type=jnp.float32, backend="reference").sum()

    g0 = q.global_scale
    np.testing.assert_allclose(jax.grad(dot_with)(g0), 2 * dot_with(g0) / g0, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ops_recheck_parts_replaced_after_construction(backend):
    q = q_parts(gx.MXFP8_E4M3)
    bad = jax.tree.map(lambda a: a[:, :100], q)  # tree_map bypasses the constructor
    with pytest.raises(ValueError, match=r"dequantize: scale .* must have shape \[4, 4\]"):
        gx.dequantize(bad, backend=backend)
    with pytest.raises(ValueError, match=r"block_scaled_dot: lhs: scale"):
        gx.block_scaled_dot(bad, q)


# --------------------------------------------------------------------------- finding 8: empty inputs
EMPTY_SHAPES = [(0,), (0, 64), (4, 0), (0, 0), (2, 0, 3)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_quantize_empty_arrays(fmt, backend):
    for shape in EMPTY_SHAPES:
        if len(fmt.block) == 2 and len(shape) < 2:
            continue
        x = jnp.zeros(shape, jnp.float32)
        q = jax.jit(lambda v: gx.quantize(v, fmt, backend=backend))(x)
        assert q.data.shape == shape and q.data.dtype == fmt.elem_dtype
        assert q.scale.shape == formats.scale_shape(shape, fmt, -1)
        if fmt.has_global_scale:
            assert float(q.global_scale) == 1.0  # amax of nothing is 0: the default g is 1
        y = gx.dequantize(q, jnp.bfloat16, backend=backend)
        assert y.shape == shape and y.dtype == jnp.bfloat16


# --------------------------------------------------------------------------- finding 8: dimension numbers
# Each is refused by lax.dot_general too, except those marked stricter (bools, strings as lists).
BAD_DN = [
    ((((1.5,), (1,)), ((), ())), TypeError),  # a float entry (was truncated to 1)
    ((((1,), (np.float32(1),)), ((), ())), TypeError),
    ((((True,), (1,)), ((), ())), TypeError),
    ((((-1,), (1,)), ((), ())), ValueError),  # negative: lax.dot_general refuses it too
    ((((2,), (1,)), ((), ())), ValueError),
    ((((1, 1), (1, 1)), ((), ())), ValueError),
    ((((1,), (1,)), ((1,), (1,))), ValueError),  # contracting and batch at once
    ((((1,), (1,)),), TypeError),  # wrong nesting
    ((((1,), (1,)), ((), ()), ()), TypeError),
    (((1, 1, 1), ((), ())), TypeError),
    ("abc", TypeError),
    ((((1,), (1,)), ("", "")), TypeError),
    ((((1,), (1,)), ((0,), ())), ValueError),
]


@pytest.mark.parametrize("dn, exc", BAD_DN, ids=[repr(d) for d, _ in BAD_DN])
def test_bad_dimension_numbers_raise_like_lax(dn, exc):
    a, b = rand(13, (4, 256)), rand(14, (6, 256))
    if "True" not in repr(dn) and "''" not in repr(dn):
        with pytest.raises((TypeError, ValueError)):
            lax.dot_general(a, b, dn)
    qa, qb = gx.quantize(a, gx.MXFP8_E4M3), gx.quantize(b, gx.MXFP8_E4M3)
    for backend in ("reference", "auto"):
        with pytest.raises(exc, match="dimension"):
            gx.block_scaled_dot(qa, qb, dn, backend=backend)
        with pytest.raises(exc, match="dimension"):
            gx.scaled_dot_general(a, b, dn, backend=backend)


def test_good_dimension_numbers_forms():
    """lax.dot_general's accepted spellings work: lists, numpy ints, a bare int per side."""
    a, b = rand(15, (4, 256)), rand(16, (6, 256))
    want = np.asarray(gx.scaled_dot_general(a, b, (((1,), (1,)), ((), ()))))
    for dn in ((([1], [1]), ([], [])), (((np.int64(1),), (np.int32(1),)), ((), ())), ((1, 1), ((), ()))):
        np.testing.assert_array_equal(np.asarray(gx.scaled_dot_general(a, b, dn)), want)


# --------------------------------------------------------------------------- finding 8: memory-space maps
def test_conflicting_operand_spaces_all_reduce():
    mesh = jax.make_mesh((8,), ("i",), devices=jax.devices()[:8])
    x = jax.device_put(np.ones(8, np.float32), NamedSharding(mesh, P("i")))
    S = gx.MemorySpace

    def lower(**kw):
        f = lambda v: gx.all_reduce(v, "i", **kw)  # noqa: E731
        jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)).lower(x)

    for algorithm in ("auto", "xla", "one_shot"):
        with pytest.raises(ValueError, match="conflicting requests for operand 0"):
            lower(algorithm=algorithm, operand_spaces={0: S.COLLECTIVE, -1: S.TEMP})
        with pytest.raises(ValueError, match="conflicting requests for result 0"):
            lower(algorithm=algorithm, result_spaces={-1: S.TEMP, 0: S.COLLECTIVE})
        with pytest.raises(TypeError, match="keys must be int operand indices"):
            lower(algorithm=algorithm, operand_spaces={0.0: S.COLLECTIVE})
    lower(operand_spaces={0: S.COLLECTIVE, -1: S.COLLECTIVE})  # the same request twice is one request


def test_conflicting_operand_spaces_ffi_helper():
    x = jnp.ones(4, jnp.float32)
    call = lambda spaces: memory.ffi_call(memory.PLACE_TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype), x,  # noqa: E731
                                          operand_spaces=spaces, caller="test")
    with pytest.raises(ValueError, match="conflicting requests for operand 0: COLLECTIVE and TEMP"):
        jax.jit(lambda v: call({0: gx.MemorySpace.COLLECTIVE, -1: gx.MemorySpace.TEMP})).trace(x)


# --------------------------------------------------------------------------- finding 8: other public arguments
X = jnp.ones((4, 64), jnp.float32)
DN = (((1,), (1,)), ((), ()))
BAD_CALLS = [
    ("quantize x=None", lambda b: gx.quantize(None, gx.MXFP8_E4M3, backend=b), TypeError, "quantize: x must be an array"),
    ("quantize x=str", lambda b: gx.quantize("abc", gx.MXFP8_E4M3, backend=b), TypeError, "quantize: x must be an array"),
    ("quantize global_scale=str", lambda b: gx.quantize(X, gx.NVFP4, global_scale="a", backend=b), TypeError,
     "quantize: global_scale must be an array"),
    ("dequantize dtype=None", lambda b: gx.dequantize(gx.quantize(X, gx.FP8_1x128), None, backend=b), TypeError,
     r"dequantize: dtype must be one of .*got None"),
    ("dequantize dtype='nope'", lambda b: gx.dequantize(gx.quantize(X, gx.FP8_1x128), "nope", backend=b), TypeError,
     r"dequantize: dtype must be one of .*got 'nope'"),
    ("block_scaled_dot pet='zz'", lambda b: gx.block_scaled_dot(*(gx.quantize(X, gx.MXFP8_E4M3),) * 2,
                                                               preferred_element_type="zz", backend=b),
     TypeError, "block_scaled_dot: preferred_element_type must be one of"),
    ("scaled_dot_general pet='zz'", lambda b: gx.scaled_dot_general(X, X, DN, preferred_element_type="zz", backend=b),
     TypeError, "scaled_dot_general: preferred_element_type must be one of"),
    ("scaled_dot_general lhs=str", lambda b: gx.scaled_dot_general("a", X, DN, backend=b), TypeError,
     "scaled_dot_general: lhs must be an array"),
]


@pytest.mark.parametrize("name, call, exc, match", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_public_arguments_are_refused_on_every_backend(name, call, exc, match):
    dot_like = name.startswith(("block_scaled_dot", "scaled_dot_general"))
    for backend in ("auto", "reference") if dot_like else ("auto",) + tuple(BACKENDS):
        with pytest.raises(exc, match=match):
            call(backend)


def test_scaled_dot_general_checks_the_backend_name_first():
    with pytest.raises(ValueError, match="scaled_dot_general: backend must be 'auto' or one of"):
        gx.scaled_dot_general(X, X, DN, backend=3)


def test_a_vmapped_array_with_its_batch_axis_inside_says_so():
    """jax.vmap(quantize, out_axes=1) rebuilds the array without validation (JAX's unflatten);
    the first op that checks it names the cause: the block axis counts from the end."""
    import jax_gpuext as gx

    q = jax.vmap(lambda v: gx.quantize(v, gx.MXFP8_E4M3, axis=0), out_axes=1)(jnp.ones((3, 64, 5)))
    with pytest.raises(ValueError, match=r"must have shape .*out_axes other than 0.*out_axes=0"):
        gx.dequantize(q)
