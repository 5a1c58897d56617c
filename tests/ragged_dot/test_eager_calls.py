"""Eager calls (outside jit) of the grouped and dense dots and of the grouped quantizers (issue 34).

- Finding 3: eager ``quantize_grouped`` equals the jitted call and ``quantize`` on the same rows bit
  for bit, subnormal inputs of every input dtype included (jax 0.12's eager bfloat16 row gather
  flushed subnormals to zero: the rows now move as unsigned integers of their width).
- Finding 4: an eager call of the same shapes hits a cache: no compilation after the first call,
  RSS and time flat over 1,000 calls (every eager call compiled again before, +0.5-1 MB each).
"""

from __future__ import annotations

import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import monitoring

import jax_gpuext as gx
from jax_gpuext.common import backends
from jax_gpuext.ragged_dot import common
from jax_gpuext.ragged_dot.grouped import dequantize_grouped, quantize_grouped
from jax_gpuext.ragged_dot.ragged_dot import ragged_dot
from jax_gpuext.ragged_dot.scaled_ragged_dot import scaled_ragged_dot

GROUPED_FORMATS = [gx.MXFP8_E4M3, gx.MXFP8_E5M2, gx.MXFP4, gx.NVFP4, gx.FP8_1x128]
INPUT_DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def _bits(a) -> np.ndarray:
    a = jnp.asarray(a)
    if a.dtype == jnp.float4_e2m1fn:  # no 4-bit view: its float32 values are exact
        a = a.astype(jnp.float32)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return np.asarray(jax.lax.bitcast_convert_type(a, width))


def _subnormal_rows(dtype, m: int, k: int, seed: int) -> jax.Array:
    """Rows whose blocks hold subnormals of ``dtype`` only, or subnormals beside normal values
    (whose scale keeps some subnormals representable), with both signs."""
    fi = jnp.finfo(dtype)
    rng = np.random.default_rng(seed)
    tiny = rng.integers(1, 64, (m, k)) * float(fi.smallest_subnormal) * rng.choice([-1.0, 1.0], (m, k))
    normal = rng.standard_normal((m, k)) * float(fi.smallest_normal) * 4
    x = np.where(rng.random((m, 1)) < 0.5, tiny, np.where(rng.random((m, k)) < 0.7, tiny, normal))
    return jnp.asarray(x.astype(np.float32)).astype(dtype)


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("fmt", GROUPED_FORMATS, ids=lambda f: f.name)
def test_eager_quantize_grouped_is_the_jitted_call_and_quantize_bit_for_bit(fmt, dtype):
    b = fmt.block[0]
    sizes = [b, 2 * b - 3, 3]  # aligned, partial and short groups; rows past the last group
    m, k = sum(sizes) + 5, 32
    x = _subnormal_rows(dtype, m, k, seed=sizes[1])
    assert bool(jnp.any(jnp.abs(x.astype(jnp.float32)) < float(jnp.finfo(dtype).smallest_normal)))
    gs = jnp.asarray(sizes, jnp.int32)
    g = jnp.float32(1e-30) if fmt.has_global_scale else None  # per-group quantize needs the same global scale
    eager = quantize_grouped(x, fmt, gs, axis=0, global_scale=g)
    jitted = jax.jit(lambda v, s: quantize_grouped(v, fmt, s, axis=0, global_scale=g))(x, gs)
    for part in ("data", "scale"):
        np.testing.assert_array_equal(_bits(getattr(eager, part)), _bits(getattr(jitted, part)), err_msg=part)
    layout = common.grouped_layout(gs, m, b)
    starts, block_starts = np.asarray(layout.row_start), np.asarray(layout.block_start)
    rows = np.asarray(x)  # sliced in NumPy: jax 0.12's eager bfloat16 slice on CPU flushes subnormals itself
    for i, size in enumerate(sizes + [m - sum(sizes)]):
        r0, b0 = int(starts[i]), int(block_starts[i])
        alone = gx.quantize(jnp.asarray(rows[r0:r0 + size]), fmt, axis=0, global_scale=g)
        nb = alone.scale.shape[0]
        np.testing.assert_array_equal(_bits(eager.data[r0:r0 + size]), _bits(alone.data), err_msg=f"group {i}")
        np.testing.assert_array_equal(_bits(eager.scale[b0:b0 + nb]), _bits(alone.scale), err_msg=f"group {i}")
    # and back: dequantize_grouped is dequantize of each group, eager as jitted
    for out in INPUT_DTYPES:
        back = dequantize_grouped(eager, gs, out)
        back_jit = jax.jit(lambda q, s: dequantize_grouped(q, s, out))(eager, gs)
        np.testing.assert_array_equal(_bits(back), _bits(back_jit))


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in v if isinstance(v, (list, tuple)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.NVFP4, gx.FP8_1x128], ids=lambda f: f.name)
def test_grouped_quantizers_move_elements_as_integers(fmt):
    """The cause of finding 3, shown on any jax: no gather or select of the grouped quantizers moves
    floating-point elements (XLA:CPU may compute those through float32 with denormals flushed;
    integer moves are exact), and no gather fills out-of-bounds rows (jnp.take's fill, a NaN as
    bfloat16, let XLA rewrite the bit move back into a flushing float one)."""
    x, gs = jnp.ones((64, 32), jnp.bfloat16), jnp.array([20, 44], jnp.int32)
    q = quantize_grouped(x, fmt, gs, axis=0)
    for name, fn, args in (("quantize_grouped", lambda v, s: quantize_grouped(v, fmt, s, axis=0), (x, gs)),
                           ("dequantize_grouped", lambda v, s: dequantize_grouped(v, s, jnp.bfloat16), (q, gs))):
        with backends.platform("cpu"):  # XLA:CPU's flushing is the finding; traced for it alone
            jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
        # the moves: gathers, and selects of arrays (NVFP4's default global scale selects a scalar)
        moved = [(e.primitive.name, v.aval.dtype) for e in _eqns(jaxpr) if e.primitive.name in ("gather", "select_n")
                 for v in (e.invars[:1] if e.primitive.name == "gather" else e.invars[1:]) if v.aval.shape]
        assert moved, name
        floats = [m for m in moved if jnp.issubdtype(m[1], jnp.floating)]
        assert not floats, (name, floats)
        modes = {str(e.params["mode"]) for e in _eqns(jaxpr) if e.primitive.name == "gather"}
        assert not any("FILL" in m for m in modes), (name, modes)


# --------------------------------------------------------------------------- finding 4: eager caches
_COMPILES = [0]


def _count_compiles(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES[0] += 1


# Registered once (jax 0.7 has no public way to unregister a listener); it only counts.
monitoring.register_event_duration_secs_listener(_count_compiles)


class _Since:
    def __init__(self):
        self.start = _COMPILES[0]

    @property
    def count(self) -> int:
        return _COMPILES[0] - self.start


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


M, K, N, G = 64, 64, 32, 3
SIZES = [20, 0, 37]  # >= 2 groups, one empty, 7 rows past the last group


def _calls():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((G, K, N)), jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((K, N)), jnp.float32)
    gs = jnp.asarray(SIZES, jnp.int32)
    qx, qw = gx.quantize(x, gx.MXFP8_E4M3), gx.quantize(w, gx.MXFP8_E4M3, axis=1)
    qw2 = gx.quantize(w2, gx.MXFP8_E4M3, axis=0)
    fx, fw = gx.quantize(x, gx.FP8_1x128), gx.quantize(w, gx.FP8_128x128)
    dn = (((1,), (0,)), ((), ()))
    return {
        "ragged_dot": lambda: ragged_dot(qx, qw, gs),
        "ragged_dot-fp8-reference": lambda: ragged_dot(fx, fw, gs, backend="reference"),
        "ragged_dot-xla": lambda: ragged_dot(qx, qw, gs, backend="xla"),
        "scaled_ragged_dot": lambda: scaled_ragged_dot(x, w, gs),
        "scaled_ragged_dot-grad": lambda: jax.grad(lambda a, b: scaled_ragged_dot(a, b, gs).sum(), (0, 1))(x, w),
        "block_scaled_dot-xla": lambda: gx.block_scaled_dot(qx, qw2, dn, backend="xla"),
        "block_scaled_dot-auto": lambda: gx.block_scaled_dot(qx, qw2, dn),
        "scaled_dot_general": lambda: gx.scaled_dot_general(x, w2, dn),
        "quantize_grouped": lambda: quantize_grouped(x, gx.MXFP8_E4M3, gs, axis=0).data,
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_an_eager_call_of_the_same_shapes_compiles_once(name):
    call = _calls()[name]
    jax.block_until_ready(call())  # the first call may compile
    jax.block_until_ready(call())
    since = _Since()
    for _ in range(5):
        jax.block_until_ready(call())
    assert since.count == 0, f"{name}: {since.count} compilations in 5 eager calls"


def test_rss_and_time_of_eager_grouped_dots_stay_flat_over_1000_calls():
    """The issue's measurement: +0.5-1 MB RSS and 50-180 ms per eager ragged_dot with >= 2 groups,
    growing without bound. After a warm-up, 1,000 calls add no compilation, a few MB of RSS at
    most (allocator noise), and the last calls take no longer than the first. Time is this process's
    CPU time (all its threads): the work per call, which another process's load does not change (CI
    runs two suites at once; a wall-clock median moved with what the other one was doing)."""
    calls = _calls()
    call = calls["ragged_dot"]
    for _ in range(20):
        jax.block_until_ready(call())
    since, rss0, times = _Since(), _rss_mb(), []
    for _ in range(1000):
        t = time.process_time()
        jax.block_until_ready(call())
        times.append(time.process_time() - t)
    grown = _rss_mb() - rss0
    assert since.count == 0
    assert grown < 32, f"RSS grew {grown:.1f} MB over 1,000 eager calls"
    first, last = np.median(times[:100]), np.median(times[-100:])
    assert last < 2 * first + 5e-3, (first, last)


def test_eager_calls_keep_their_explanations_and_follow_the_environment(monkeypatch):
    """What the cache keeps is keyed by the backend chosen on every call: forcing the reference
    takes effect at the next eager call; the remarks a backend attached when it was traced are
    replayed on the selections of the calls that hit the cache."""
    calls = _calls()
    with backends.recording() as log:
        calls["ragged_dot-xla"]()
        calls["ragged_dot-xla"]()
    first, second = [s for s in log if s.op == "ragged_dot"]
    assert first.chosen == second.chosen == "xla"
    assert first.notes and second.notes == first.notes
    monkeypatch.setenv(backends.FORCE_REFERENCE_ENV, "ragged_dot")
    with backends.recording() as log:
        calls["ragged_dot"]()
    assert [s.chosen for s in log if s.op == "ragged_dot"] == ["reference"]


def test_traced_calls_are_unchanged_by_the_eager_cache():
    """Inside jit the op runs as before: no nested call of ours in the jaxpr, the same result as
    the eager (cached) call."""
    x = jnp.asarray(np.random.default_rng(5).standard_normal((M, K)), jnp.float32)
    qx = gx.quantize(x, gx.MXFP8_E4M3)
    qw = gx.quantize(jnp.ones((G, K, N)), gx.MXFP8_E4M3, axis=1)
    gs = jnp.asarray(SIZES, jnp.int32)
    f = lambda a, b, s: ragged_dot(a, b, s)  # noqa: E731
    text = str(jax.make_jaxpr(f)(qx, qw, gs))
    assert "name=_trace" not in text  # common/eager.py's jit runs eager calls only
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(qx, qw, gs)), np.asarray(f(qx, qw, gs)))
