"""Fuzz: all_reduce over every kind of axis (issue 26): shard_map mesh axes (one or two), pmap,
named vmap axes nested up to two deep (reduced or only carried), jit inside the vmaps, and tuples
mixing them in any order. Every algorithm must equal the float64 NumPy reduction over the named
dims, signed zeros included (-0.0 exactly when every contribution is -0.0; max/min order -0.0 below
+0.0; NaN wins), and none may wait for peers that do not exist (a hang is a finding)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from _budget import fuzz, judged
from _judge import assert_bits, per_backend

MESHES = {"i4": ((4,), ("i",)), "i2": ((2,), ("i",)), "ab": ((2, 2), ("a", "b"))}
DTYPES = (np.dtype(np.float32), np.dtype(np.int32))


def model(x, reduced_dims, op):
    """x reduced over ``reduced_dims`` and broadcast back; the rules of the module docstring."""
    v = x.astype(np.float64)
    if op == "sum":
        r = v.sum(axis=reduced_dims, keepdims=True)
        all_negative = np.all((v == 0) & np.signbit(v), axis=reduced_dims, keepdims=True)
        r = np.where(all_negative, -0.0, np.where(r == 0, 0.0, r))
    else:
        r = (np.max if op == "max" else np.min)(v, axis=reduced_dims, keepdims=True)  # NaN wins
        has_pos = np.any((v == 0) & ~np.signbit(v), axis=reduced_dims, keepdims=True)
        has_neg = np.any((v == 0) & np.signbit(v), axis=reduced_dims, keepdims=True)
        zero = np.where(has_pos, 0.0, -0.0) if op == "max" else np.where(has_neg, -0.0, 0.0)
        r = np.where(r == 0, zero, r)
    return np.broadcast_to(r, x.shape).astype(x.dtype)


def _bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


@fuzz("all_reduce_axes", 12)
@given(mesh=st.sampled_from(sorted(MESHES)), use_pmap=st.booleans(),
       vmap_sizes=st.lists(st.sampled_from([1, 2, 3]), min_size=0, max_size=2),
       op=st.sampled_from(["sum", "max", "min"]), dtype=st.sampled_from(DTYPES), jit_inside=st.booleans(),
       seed=st.integers(0, 2**31 - 1), data=st.data())
def test_all_reduce_axis_kinds(worker, mesh, use_pmap, vmap_sizes, op, dtype, jit_inside, seed, data):
    shape, axes = MESHES[mesh]
    if use_pmap and len(shape) > 1:
        use_pmap = False
    vmaps = [(size, f"v{k}") for k, size in enumerate(vmap_sizes)]
    names = list(axes) + [name for _, name in vmaps]
    reduce = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True), label="reduce")
    reduce = tuple(data.draw(st.permutations(reduce), label="order"))
    rng = np.random.default_rng(seed)
    full = tuple(shape) + tuple(vmap_sizes) + (3,)
    x = rng.integers(-4, 5, full).astype(dtype)
    if dtype.kind == "f":  # signed zeros and a NaN now and then
        x[rng.random(full) < 0.3] = -0.0
        if rng.random() < 0.3:
            x.flat[rng.integers(x.size)] = np.nan
    reduced_dims = tuple(names.index(n) for n in reduce)
    case = (f"all_reduce(x={dtype.name}{list(full)} seed={seed}, {reduce!r}, op={op!r}) over "
            f"{'pmap' if use_pmap else 'shard_map'} {shape} {axes}, vmaps {vmaps}, jit inside: {jit_inside}")
    with judged("all_reduce_axes"):
        results = per_backend("all_reduce_axes", worker.run("all_reduce_axes", dict(
            x=x, mesh_shape=shape, mesh_axes=axes, vmaps=vmaps, reduce=reduce, op=op, jit_inside=jit_inside,
            use_pmap=use_pmap, algorithms=("xla", "one_shot", "two_shot", "auto")), timeout=150), case)
        want = _bits(model(x, reduced_dims, op))
        for algorithm, r in results.items():
            assert_bits(r, want, f"all_reduce {op} {algorithm}", case)
