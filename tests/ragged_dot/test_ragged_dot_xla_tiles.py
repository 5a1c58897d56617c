"""The ``xla`` backend of ragged_dot as 128-row tiles (issue 36, item 4): its work is bounded by the
useful rows plus less than one tile per group, it never leaves XLA a ragged dot to expand, and it
is what ``auto`` runs on CUDA while our grouped kernels are unverified.

CPU only, cheap: the tile table against a Python model (with a small tile, so few rows reach every
case), the chunked loops against the float64 model, and the CUDA lowering (exported for cuda on
this host, nothing compiled) read for its dots. The per-format and per-mode results of the
unchunked path are tests/ragged_dot/test_ragged_dot.py's.
"""

from __future__ import annotations

import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export  # a submodule jax 0.7 does not import by itself

import _ragged_numpy as rnp
import jax_gpuext as gx
from jax_gpuext.common import backends
from jax_gpuext.ragged_dot import RAGGED_CONTRACT, RAGGED_M, RAGGED_M_NK
from jax_gpuext.ragged_dot import xla as ragged_xla

M, K, N = 260, 256, 160
SIZES = np.array([0, 1, 150, 0, 70, 3], np.int32)  # as test_ragged_dot.py: empty groups, rows past the last
G = len(SIZES)
MODES = {"ragged_m": RAGGED_M, "ragged_m_nk": RAGGED_M_NK, "ragged_contract": RAGGED_CONTRACT}


def rand(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


def operands(mode, lf, rf, m=M, k=K, n=N, sizes=SIZES, seed=0):
    g = len(sizes)
    if mode == "ragged_contract":
        s = jnp.asarray(sizes)
        return (gx.quantize_grouped(rand(seed, (k, m), 2.0), lf, s, axis=1),
                gx.quantize_grouped(rand(seed + 1, (m, n)), rf, s, axis=0))
    w = rand(seed + 1, (g, n, k) if mode == "ragged_m_nk" else (g, k, n), 0.5)
    axis = 2 if mode == "ragged_m_nk" else 1
    return gx.quantize(rand(seed, (m, k), 3.0), lf), gx.quantize(w, rf, axis=-1 if len(rf.block) == 2 else axis)


def float64_result(mode, ql, qr, sizes):
    sizes = np.asarray(sizes)
    if mode == "ragged_contract":
        want, mag = rnp.ragged_contract(rnp.dequant_grouped(ql, sizes), rnp.dequant_grouped(qr, sizes), sizes)
    else:
        w = rnp.dequant(qr)
        want, mag = rnp.ragged_m(rnp.dequant(ql), np.swapaxes(w, 1, 2) if mode == "ragged_m_nk" else w, sizes)
    g = np.float64(1)
    for q in (ql, qr):
        g = g * (1.0 if q.global_scale is None else np.float64(q.global_scale))
    return want * g, mag * g


# --------------------------------------------------------------------------- the tile table
def max_tiles(m, groups, tile):
    """The most tiles any sizes summing to <= m need, by exhaustive search (small m)."""
    def best(left, parts):
        if parts == 0:
            return 0
        return max(-(-s // tile) + best(left - s, parts - 1) for s in range(left + 1))
    return best(m, groups)


@pytest.mark.parametrize("m,groups", [(0, 3), (5, 0), (1, 1), (7, 2), (9, 3), (12, 4), (3, 5)])
def test_tile_count_is_the_most_any_sizes_need(monkeypatch, m, groups):
    monkeypatch.setattr(ragged_xla, "TILE", 4)
    assert ragged_xla.tile_count(m, groups) == max_tiles(m, groups, 4)
    assert ragged_xla.tile_count(m, groups) <= -(-m // 4) + groups  # the padding bound, in tiles


def model_tiles(sizes, m, tile):
    """(group, rows) of each used tile, in order, by Python loops over the clamped sizes."""
    out = []
    for g, (start, stop) in enumerate(rnp.segments(sizes, m)[:-1]):
        for first in range(start, stop, tile):
            out.append((g, list(range(first, min(first + tile, stop)))))
    return out


@pytest.mark.parametrize("sizes", [[0, 1, 9, 0, 6, 3], [4, 4, 4], [-3, 5, 40, 2], [0, 0, 0], [19, 0, 0],
                                   [2**31 - 1, 3]])
def test_tile_table_matches_a_model(monkeypatch, sizes):
    tile, m = 4, 19
    monkeypatch.setattr(ragged_xla, "TILE", tile)
    sizes = np.array(sizes, np.int32)
    g = len(sizes)
    tiles = ragged_xla.tile_count(m, g)
    t = jax.jit(ragged_xla.tile_table, static_argnums=(1, 2, 3))(jnp.asarray(sizes), m, g, tiles)
    group, weight, rows, valid, slot, in_group = (np.asarray(v) for v in (t.group, t.weight, t.rows, t.valid,
                                                                          t.slot, t.in_group))
    want = model_tiles(sizes, m, tile)
    assert len(want) <= tiles
    for i, (wg, wrows) in enumerate(want):
        assert group[i] == weight[i] == wg
        assert rows[i][valid[i]].tolist() == wrows and valid[i].tolist() == [True] * len(wrows) + \
            [False] * (tile - len(wrows))
    assert (group[len(want):] == g).all() and not valid[len(want):].any()  # unused tiles
    assert ((0 <= weight) & (weight < g)).all() and ((0 <= rows) & (rows < m)).all()  # every index valid
    flat = rows.reshape(-1)
    grouped = [r for _, rs in want for r in rs]
    assert in_group.tolist() == [r in grouped for r in range(m)]
    for r in grouped:  # each row's slot holds it
        assert flat[slot[r]] == r and valid.reshape(-1)[slot[r]]


# --------------------------------------------------------------------------- chunked loops vs float64
CHUNK_CASES = [("ragged_m", (gx.FP8_1x128, gx.FP8_128x128)), ("ragged_m_nk", (gx.MXFP8_E4M3, gx.MXFP4)),
               ("ragged_contract", (gx.NVFP4, gx.NVFP4)), ("ragged_contract", (gx.FP8_1x128, gx.FP8_1x128))]


@pytest.mark.parametrize("mode,pair", CHUNK_CASES, ids=[f"{m}-{a.name}-{b.name}" for m, (a, b) in CHUNK_CASES])
def test_chunked_tiles_match_float64(monkeypatch, mode, pair):
    """T = 7 tiles two at a time: three chunks in a loop (lax.map, or the wgrad's fori_loop) and one
    after it; the same result as the float64 model."""
    ql, qr = operands(mode, *pair, seed=3)
    per_tile = K * N * (4 if mode == "ragged_contract" or pair[0] is gx.FP8_1x128 else 2)
    monkeypatch.setattr(ragged_xla, "CHUNK_BYTES", 2 * per_tile)
    assert ragged_xla.tile_count(M, G) == 7 and ragged_xla.chunk_size(7, per_tile) == 2
    f = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, MODES[mode], backend="xla"))
    y = f(ql, qr, jnp.asarray(SIZES))
    assert "while" in f.lower(ql, qr, jnp.asarray(SIZES)).as_text()
    want, mag = float64_result(mode, ql, qr, SIZES)
    rnp.assert_close(y, want, mag)


def test_many_groups_and_one_row_groups_match_float64():
    """More groups than tiles of rows (G = 40 over 50 rows, most groups one row or empty), where the
    G term of the bound dominates."""
    sizes = np.array(([1, 0, 2, 1] * 10), np.int32)
    m = 50
    ql, qr = operands("ragged_m", gx.MXFP8_E5M2, gx.MXFP8_E4M3, m=m, k=64, n=32, sizes=sizes, seed=5)
    y = gx.ragged_dot(ql, qr, jnp.asarray(sizes), backend="xla")
    want, mag = float64_result("ragged_m", ql, qr, sizes)
    rnp.assert_close(y, want, mag)


# --------------------------------------------------------------------------- the CUDA lowering
DOT = re.compile(r"stablehlo\.dot_general (?P<args>.*?)contracting_dims = \[(?P<lc>[\d, ]*)\] x \[(?P<rc>[\d, ]*)\]"
                 r".*?: \(tensor<(?P<lhs>[^>]*)>, tensor<(?P<rhs>[^>]*)>\) -> tensor<(?P<out>[^>]*)>")


def _dims(t):
    return [int(d) for d in t.split("x")[:-1]]


def _region_end(lines, i):
    """The last line of the region (braces) that opens on or after line i."""
    depth, opened = 0, False
    for j in range(i, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        opened |= "{" in lines[j]
        if opened and depth <= 0:
            return j
    return len(lines) - 1


CALL = re.compile(r"call @([\w.$-]+)\(")
FUNC = re.compile(r"func\.func (?:public |private )?@([\w.$-]+)\(")


def _in_loops(lines):
    """Whether each line of the StableHLO text runs in a while loop: in a while's regions, or in a
    function called (directly or not) from one (jax outlines loop bodies as private functions)."""
    inside, funcs = [False] * len(lines), {}
    for i, line in enumerate(lines):
        f = FUNC.search(line)
        if f is not None:
            funcs[f[1]] = (i, _region_end(lines, i))
        if "stablehlo.while" in line:
            for j in range(i, _region_end(lines, i) + 1):
                inside[j] = True
    looped = {c for line, ins in zip(lines, inside) if ins for c in CALL.findall(line)}
    todo = list(looped)
    while todo:
        first, last = funcs[todo.pop()]
        for line in lines[first:last + 1]:
            for c in CALL.findall(line):
                if c not in looped:
                    looped.add(c)
                    todo.append(c)
    for name in looped:
        first, last = funcs[name]
        for j in range(first, last + 1):
            inside[j] = True
    return inside


WIDE = re.compile(r"mx_wide_scales(_\d+)?$")  # scale_range.dot's function for MX scales outside its window


def cuda_dots(mode, pair, m=M, k=K, n=N, sizes=SIZES):
    """The StableHLO ops exported for cuda from this host, and (contracting size, FLOPs, in a loop)
    of each dot: those outside and those inside the ``mx_wide_scales`` function (MX operands whose
    scales leave ``scale_range.in_window`` run it instead of the one-dot branch: a ``lax.cond``)."""
    ql, qr = operands(mode, *pair, m=m, k=k, n=n, sizes=sizes)
    f = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, MODES[mode], backend="xla"))
    with backends.platform("cuda"):
        text = jax_export.export(f, platforms=["cuda"])(ql, qr, jnp.asarray(sizes)).mlir_module()
    # the ops only: source locations name this file (tests/ragged_dot/...)
    text = "\n".join(line.split(" loc(")[0] for line in text.splitlines() if not line.startswith("#loc"))
    dots, wide = [], []
    lines = text.splitlines()
    for line, in_loop, in_wide in zip(lines, _in_loops(lines), _in_functions(lines, WIDE)):
        d = DOT.search(line)
        if d is not None:
            lhs, out = _dims(d["lhs"]), _dims(d["out"])
            contract = int(np.prod([lhs[int(i)] for i in d["lc"].split(",")]))
            (wide if in_wide else dots).append((contract, 2 * int(np.prod(out)) * contract, in_loop))
    return text, dots, wide


def _in_functions(lines, name):
    """Whether each line lies in a function whose name matches ``name`` or in one it calls (directly
    or not: jax outlines loop bodies as private functions)."""
    of_line, calls, current = [], {}, None  # functions are top-level: one runs until the next begins
    for line in lines:
        f = FUNC.search(line)
        current = f[1] if f is not None else current
        of_line.append(current)
        calls.setdefault(current, set()).update(CALL.findall(line))
    todo = [f for f in calls if f is not None and name.match(f)]
    reached = set(todo)
    while todo:
        for c in calls.get(todo.pop(), ()):
            if c not in reached:
                reached.add(c)
                todo.append(c)
    return [f in reached for f in of_line]


LOWERING_CASES = [(mode, pair) for mode in MODES for pair in
                  ([(gx.FP8_1x128, gx.FP8_128x128), (gx.MXFP8_E4M3, gx.MXFP8_E4M3)] if mode != "ragged_contract"
                   else [(gx.FP8_1x128, gx.FP8_1x128), (gx.MXFP8_E4M3, gx.MXFP8_E4M3)])]


@pytest.mark.parametrize("mode,pair", LOWERING_CASES, ids=[f"{m}-{a.name}" for m, (a, _) in LOWERING_CASES])
def test_cuda_lowering_has_no_ragged_dot_and_no_dot_over_all_groups(mode, pair):
    """Exported for cuda: no ragged dot for XLA to expand, no custom call, no host transfer; every
    dot contracts K (ragged_m: one tile's rows times its group's weights) or one tile's 128 rows
    (ragged_contract), never G x K, and does at most the work of M + G x 127 rows: with G = 32
    groups over 512 rows that is 4,480 rows where XLA's expansion computes G x M = 16,384."""
    m, k, n, g = 512, 256, 128, 32
    sizes = np.full((g,), m // g - 1, np.int32)  # 15 rows each: every group ends in a partial tile
    text, dots, wide = cuda_dots(mode, pair, m, k, n, sizes)
    assert "ragged" not in text  # chlo.ragged_dot (or jax 0.7's custom call of that name)
    assert "custom_call" not in text
    for forbidden in ("callback", "infeed", "outfeed", "stablehlo.send", "stablehlo.recv"):
        assert forbidden not in text, forbidden
    assert len(dots) == 1, dots  # MX: the one-dot branch of scale_range.dot's lax.cond
    rows = ragged_xla.tile_count(m, g) * ragged_xla.TILE
    assert rows <= m + g * (ragged_xla.TILE - 1) and rows < g * m
    for contract, flops, in_loop in dots + wide:
        assert contract == (ragged_xla.TILE if mode == "ragged_contract" else k) and contract != g * k
        # one chunk here: each dot is one chunk's (the wgrad's adds may loop), so its FLOPs are the total
        assert flops == 2 * rows * k * n
    assert not dots[0][2]
    if pair[0].is_mx:
        # MX scales outside the window: the same tiles once with unit scales (the NaN / Inf
        # pattern) and once per pair of exponent classes, in a loop of 16 trips: at most 17 times
        # the bounded work, never a dot over all groups
        assert sorted(in_loop for *_, in_loop in wide) == [False, True], wide
        assert "stablehlo.while" in text
    else:
        assert not wide


def test_cuda_lowering_in_chunks_loops_without_host_work(monkeypatch):
    """With more tiles than one chunk holds, a loop of static trip count runs the chunks: the dot
    inside it is one chunk's (C tiles of 128 rows), the loop reads nothing back to the host."""
    mode, pair = "ragged_m", (gx.FP8_1x128, gx.FP8_128x128)
    monkeypatch.setattr(ragged_xla, "CHUNK_BYTES", 2 * K * N * 4)
    text, dots, _ = cuda_dots(mode, pair)
    assert "stablehlo.while" in text and "ragged" not in text and "custom_call" not in text
    assert "callback" not in text and "outfeed" not in text
    # T = 7: chunks of 2 tiles in the loop (3 trips), the last tile after it
    assert sorted(dots) == [(K, 2 * 1 * 128 * K * N, False), (K, 2 * 2 * 128 * K * N, True)]


# --------------------------------------------------------------------------- auto on CUDA
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "common"))
from test_verified import SimulatedH100  # noqa: E402  (the simulated H100 of the verification tests)


@pytest.mark.parametrize("mode", list(MODES))
def test_auto_on_cuda_runs_xla_while_the_grouped_kernels_are_unverified(monkeypatch, mode):
    SimulatedH100(monkeypatch)
    try:
        ql, qr = operands(mode, gx.FP8_1x128, gx.FP8_1x128 if mode == "ragged_contract" else gx.FP8_128x128)
        fn = lambda a, b, s: gx.ragged_dot(a, b, s, MODES[mode])  # noqa: E731
        ex = gx.explain(fn, ql, qr, jnp.asarray(SIZES), platform="cuda")
        [call] = [c for c in ex.calls if c.op == "ragged_dot"]
        assert call.chosen == "xla", call
        rejected = dict(call.rejected)
        if mode != "ragged_contract":  # the FP8 kernels take ragged_m: passed over as unverified, or gated off
            assert rejected["hopper"].startswith(backends.PASSED_OVER) and "not verified" in rejected["hopper"]
            assert "cublaslt" in rejected
        with backends.platform("cuda"):
            jaxpr = str(jax.make_jaxpr(fn)(ql, qr, jnp.asarray(SIZES)))
        assert "ragged_dot" not in jaxpr and "ffi_call" not in jaxpr
    finally:
        from jax_gpuext.common import gates
        gates.clear_cache()


def test_auto_on_cpu_runs_xla():
    """On CPU too (measured faster there than the reference: benchmarks/bench_ragged_dot_cpu.py)."""
    ql, qr = operands("ragged_m", gx.MXFP8_E4M3, gx.MXFP8_E4M3)
    ex = gx.explain(lambda a, b, s: gx.ragged_dot(a, b, s), ql, qr, jnp.asarray(SIZES), platform="cpu")
    assert [c.chosen for c in ex.calls if c.op == "ragged_dot"] == ["xla"]


# --------------------------------------------------------------------------- transformations
def test_shard_map_over_experts_matches_per_device_calls():
    """Under shard_map (experts sharded, each device its own group sizes: the expert-parallel
    layout), both modes give each device what an unsharded call on its shard gives."""
    from jax.sharding import Mesh, PartitionSpec as P
    try:
        from jax import shard_map
    except ImportError:  # jax < 0.8
        from jax.experimental.shard_map import shard_map
    devices = np.array(jax.devices()[:2])
    if len(devices) < 2:
        pytest.skip("needs 2 host devices")
    mesh = Mesh(devices, ("e",))
    m, k, n, g = 64, 128, 32, 3
    sizes = jnp.array([[5, 0, 40], [64, 1, 0]], jnp.int32)
    x = rand(7, (2, m, k))
    w = rand(8, (2, g, k, n))

    def local(x, w, s):
        qx, qw = gx.quantize(x[0], gx.MXFP8_E4M3), gx.quantize(w[0], gx.MXFP8_E4M3, axis=1)
        y = gx.ragged_dot(qx, qw, s[0], backend="xla")
        ql = gx.quantize_grouped(x[0].T, gx.MXFP8_E4M3, s[0], axis=1)
        qr = gx.quantize_grouped(y, gx.MXFP8_E4M3, s[0], axis=0)
        return y[None], gx.ragged_dot(ql, qr, s[0], RAGGED_CONTRACT, backend="xla")[None]

    spec = P("e")
    sharded = jax.jit(shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=(spec, spec)))
    ys, dws = sharded(x, w, sizes)
    for i in range(2):
        y, dw = jax.jit(local)(x[i:i + 1], w[i:i + 1], sizes[i:i + 1])
        np.testing.assert_allclose(np.asarray(ys[i]), np.asarray(y[0]), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(dws[i]), np.asarray(dw[0]), rtol=1e-5, atol=1e-5)


def test_export_with_a_symbolic_number_of_rows():
    """jax.export with M symbolic (the forward and the dgrad, ragged_m): the tile count is then a
    symbolic size, rounded up to whole chunks; the exported call gives the jitted call's result."""
    m = jax_export.symbolic_shape("m")[0]
    w = rand(11, (G, K, N), 0.3)

    def f(x, s):
        y = gx.ragged_dot(gx.quantize(x, gx.MXFP8_E4M3), gx.quantize(w, gx.MXFP8_E4M3, axis=1), s, backend="xla")
        return gx.ragged_dot(gx.quantize(y, gx.FP8_1x128), gx.quantize(w, gx.FP8_128x128), s, RAGGED_M_NK,
                             backend="xla")

    exp = jax_export.export(jax.jit(f), disabled_checks=gx.export_disabled_checks())(
        jax.ShapeDtypeStruct((m, K), jnp.float32), jax.ShapeDtypeStruct((G,), jnp.int32))
    x, sizes = rand(12, (M, K)), jnp.asarray(SIZES)
    np.testing.assert_array_equal(np.asarray(exp.call(x, sizes)), np.asarray(jax.jit(f)(x, sizes)))


def test_grad_through_the_tiles_matches_the_reference():
    """scaled_ragged_dot's three grouped dots (forward, dgrad, wgrad) on the xla backend against the
    reference backend, every format family."""
    x, w = rand(9, (M, K)), rand(10, (G, K, N), 0.3)
    sizes = jnp.asarray(SIZES)
    for fmt in (None, gx.MXFP8_E4M3):
        def loss(x, w, backend):
            return jnp.sum(gx.scaled_ragged_dot(x, w, sizes, format=fmt, backend=backend) ** 2)
        got = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(x, w, "xla")
        want = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)(x, w, "reference")
        for a, b in zip(got, want):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())



# --------------------------------------------------------------------------- GPU: XLA:GPU's own kernels
GPU_CASES = [("ragged_m", (gx.FP8_1x128, gx.FP8_128x128)), ("ragged_m", (gx.MXFP8_E4M3, gx.MXFP4)),
             ("ragged_m_nk", (gx.FP8_1x128, gx.FP8_128x128)), ("ragged_m", (gx.NVFP4, gx.NVFP4)),
             ("ragged_contract", (gx.FP8_1x128, gx.FP8_1x128)), ("ragged_contract", (gx.MXFP8_E5M2, gx.MXFP8_E4M3))]


@pytest.mark.gpu
@pytest.mark.gates("cuda_device")
@pytest.mark.parametrize("chunked", [False, True], ids=["one_chunk", "chunked"])
@pytest.mark.parametrize("mode,pair", GPU_CASES, ids=[f"{m}-{a.name}-{b.name}" for m, (a, b) in GPU_CASES])
def test_gpu_xla_matches_float64_and_compiles_without_a_dot_over_all_groups(monkeypatch, mode, pair, chunked):
    """On a GPU: the float64 model's result, and XLA's optimized program holds no ragged dot and no
    GEMM whose operand spans G x K (XLA's expansion of a ragged dot) after all its passes."""
    if chunked:
        monkeypatch.setattr(ragged_xla, "CHUNK_BYTES", 2 * K * N * 4)
    ql, qr = operands(mode, *pair, seed=13)
    f = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, MODES[mode], backend="xla"))
    sizes = jnp.asarray(SIZES)
    want, mag = float64_result(mode, ql, qr, SIZES)
    rnp.assert_close(f(ql, qr, sizes), want, mag)
    hlo = f.lower(ql, qr, sizes).compile().as_text()
    assert " ragged-dot(" not in hlo and not re.search(r'custom_call_target="[^"]*ragged', hlo)
    for line in hlo.splitlines():
        if "custom_call_target=\"__cublas" in line or " dot(" in line:
            dims = {int(d) for shape in re.findall(r"\[([\d,]+)\]", line) for d in shape.split(",")}
            assert G * K not in dims and G * M not in dims, line
