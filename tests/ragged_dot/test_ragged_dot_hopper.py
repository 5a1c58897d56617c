"""Our grouped sm_90a kernel, the ``hopper`` backend of ragged_dot (issue 30):
jax_gpuext/ragged_dot/hopper.py, csrc/ragged_dot/hopper_grouped*.

CPU tests: the workspace size against the handler's, the reasons ``supports`` gives, the custom
call the backend lowers to, and the kernel's schedule (csrc/ragged_dot/hopper_grouped_schedule.h,
built with g++ through tests/native/hopper_grouped_schedule.cc): for many group-size vectors, the
tile table against an independent model, every (tile, column block) computed by exactly one CTA,
and every TMA box of every K tile inside TMA's rules, the 16-byte aligned innermost coordinate the
first H200 run trapped on included (docs/design.md, "Grouped kernel trap on skewed groups").
GPU tests (marked gpu, Hopper) compare the kernel with the float64 model of tests/_ragged_model.py,
on shapes that reach each part of it: several row tiles per group and groups that end inside a
tile, groups starting at rows that are not multiples of 4, more K tiles than pipeline stages (the
barrier phases wrap), partial column tiles, empty groups, M = 0 and out-of-range sizes, and replays
under command buffers. A trap poisons the process's CUDA context, so the GPU tests are ``isolated``
(tests/_isolation.py): a failing one cannot take the later ones with it.
"""

from __future__ import annotations

import json
import pathlib
import random
import re
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
import _command_buffer as cb
import _ragged_numpy as rnp
from _ragged_model import (SIZES, check_command_buffer_replays, check_gpu_masked_result, check_gpu_result, operands,
                          problem)
from jax_gpuext.common import extension as _ext
from jax_gpuext.ragged_dot import common, hopper, masked

pytestmark = pytest.mark.isolated(only="gpu")

TARGET = hopper.TARGET
REPO = pathlib.Path(__file__).resolve().parents[2]
SMS = 132  # an H100 / H200


@pytest.mark.parametrize("m,g", [(64, 4), (0, 5), (100, 0), (32768, 256), (129, 1)])
def test_workspace_size_is_the_handlers(m, g):
    mod = _ext.module("cuda")
    if mod is None or not hasattr(mod, "ragged_dot_hopper_workspace_bytes"):
        pytest.skip("the CUDA extension was not built here")
    assert hopper.workspace_bytes(m, g) == mod.ragged_dot_hopper_workspace_bytes(m, g)


def test_supports_says_why():
    why = lambda **kw: hopper.supports(problem(**kw)).reason  # noqa: E731
    assert "ragged-contracted" in why(mode="ragged_contract")
    assert "FP8_128x128 weights" in why(rhs_format=gx.FP8_1x128)
    assert "K=200" in why(k=200)
    assert "N=100" in why(n=100)
    r = hopper.supports(problem())
    if _ext.module("cuda") is None:  # shapes pass; the build decides
        assert not r.supported and "no CUDA extension" in r.reason


def test_lowers_to_the_kernel_with_transposed_lhs_scales():
    """The lhs scales go in as (K/128, round_up(M, 4)) (TMA boxes along M), the weights (G, N, K)
    with (G, N/128, K/128) scales, the sizes int32, and a workspace of the computed size."""
    m, k, n, g = 50, 384, 264, 3
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, 1)
    sizes = jnp.array([20, 0, 19], jnp.int32)
    p = problem(m=m, k=k, n=n, g=g, rhs_contract=1)
    text = jax.jit(lambda a, b, s: hopper.impl(a, b, s, p)).trace(lhs, rhs, sizes).lower(
        lowering_platforms=("cuda",)).as_text()
    assert TARGET in text
    for t in ("tensor<3x52xf32>", f"tensor<{g}x{n}x{k}xf8E4M3FN>", f"tensor<{g}x3x3xf32>", f"tensor<{g}xi32>",
              f"tensor<{hopper.workspace_bytes(m, g) + hopper.WORKSPACE_SLACK}xui8>"):
        assert t in text, t


def _transposes(text):
    """The result types of the transposes in lowered StableHLO."""
    return re.findall(r"stablehlo.transpose.*?-> (tensor<[^>]*>)", text)


def test_dgrad_reads_the_forward_weights_in_place():
    """The dgrad, dx (M, K) = dy (M, N) x w (G, K, N) contracting N (RAGGED_M_NK), runs on the
    kernel with the forward's FP8_128x128 weights as they are: (G, K, N) is (G*K rows, N
    contiguous), its (G, K/128, N/128) scales are the kernel's (G, rows/128, contracted/128); no
    copy of the weights. The forward (RAGGED_M, weights (G, K, N)) is the pass that transposes them
    (FP8 wgmma reads both operands K-major only)."""
    m, k, n, g = 200, 256, 384, 3
    sizes = jnp.array([90, 0, 70], jnp.int32)
    qw = gx.quantize(jax.random.normal(jax.random.key(1), (g, k, n)), gx.FP8_128x128)
    qdy = gx.quantize(jax.random.normal(jax.random.key(2), (m, n)), gx.FP8_1x128)
    qx = gx.quantize(jax.random.normal(jax.random.key(3), (m, k)), gx.FP8_1x128)
    weights = f"tensor<{g}x{k}x{n}xf8E4M3FN>"
    for lhs, dims, transposed in ((qdy, common.RAGGED_M_NK, False), (qx, common.RAGGED_M, True)):
        p = common.problem(lhs, qw, sizes, dims, jnp.float32)
        why = hopper.supports(p).reason
        assert _ext.module("cuda") is not None or "no CUDA extension" in why, why  # the shapes pass
        text = jax.jit(lambda a, b, s, p=p: hopper.impl(a, b, s, p)).trace(lhs, qw, sizes).lower(
            lowering_platforms=("cuda",)).as_text()
        flipped = f"tensor<{g}x{n}x{k}xf8E4M3FN>"
        assert (flipped in _transposes(text)) == transposed, _transposes(text)
        call = re.search(r"stablehlo.custom_call @gpuext_ragged_dot_hopper\((.*?)\)", text).group(0)
        assert TARGET in call
    # the dgrad problem as the kernel sees it: contracted N = 384 (3 K tiles), output K = 256
    p = common.problem(qdy, qw, sizes, common.RAGGED_M_NK, jnp.float32)
    assert (p.M, p.K, p.N, p.rhs_contract) == (m, n, k, 2)


def test_lowers_with_no_rows():
    """M = 0: lhs scales (K/128, 0), a workspace of just the group starts: nothing to raise at trace time."""
    m, k, n, g = 0, 256, 128, 3
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, 2)
    text = jax.jit(lambda a, b, s: hopper.impl(a, b, s, problem(m=m, k=k, n=n, g=g))).trace(
        lhs, rhs, jnp.zeros(g, jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    assert TARGET in text and "tensor<2x0xf32>" in text and f"tensor<0x{n}xbf16>" in text


def test_handler_registers_an_initialize_stage():
    mod = _ext.module("cuda")
    if mod is None or TARGET not in mod.registrations():
        pytest.skip(f"{TARGET} was not built here")
    assert set(mod.registrations()[TARGET]) == {"initialize", "execute"}


# --------------------------------------------------------------------------- the schedule (CPU)
def _zipf(m, g):
    """Rows of m shared out ~ 1/rank over g experts, rounded down (the rest past the groups)."""
    w = [1.0 / (r + 1) for r in range(g)]
    return [int(m * x / sum(w)) for x in w]


# (M, N, sizes): each reaches a way a tile or a box could leave the tensor or start misaligned.
SCHEDULE_CASES = {
    **{f"model_{name}": (200, 136, sizes) for name, sizes in SIZES.items()},
    "zipf": (1000, 136, _zipf(1000, 16)),
    "empty_first_and_last": (400, 392, [0, 0, 173, 61, 129, 0, 0]),
    "all_empty_but_one": (300, 136, [0, 0, 0, 257, 0, 0]),
    "starts_not_multiple_of_4": (700, 136, [1, 130, 3, 255, 2, 129, 77]),
    "groups_not_multiple_of_tile": (768, 264, [127, 129, 255, 257]),
    "tails_at_the_warpgroup_boundary": (600, 136, [64, 65, 63, 192, 128, 1]),  # the second warpgroup idles iff <= 64
    "sizes_past_m": (300, 136, [250, 100, 50]),
    "out_of_range": (64, 128, [-5, 40, 2**31 - 1, 7]),
    "m_zero": (0, 136, [5, 3, 0, 1]),
    "no_groups": (100, 136, []),
    "one_row": (1, 8, [1]),
}


def _random_cases(count=40, seed=33):
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        m, g = rng.choice([0, 1, 3, 129, 255, 1000]), rng.randint(1, 12)
        sizes = [rng.choice([0, 0, 1, 2, 3, 5, 127, 128, 129, rng.randint(0, m + 1), -rng.randint(1, 9)])
                 for _ in range(g)]
        cases.append((m, rng.choice([8, 128, 136, 392]), sizes))
    return cases


@pytest.fixture(scope="module")
def schedule_binary(tmp_path_factory):
    """tests/native/hopper_grouped_schedule.cc built with g++: the kernel's schedule functions on the CPU."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) to build tests/native/hopper_grouped_schedule.cc")
    exe = tmp_path_factory.mktemp("schedule") / "hopper_grouped_schedule"
    src = REPO / "tests" / "native" / "hopper_grouped_schedule.cc"
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{REPO}", str(src), "-o", str(exe)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return exe


def _schedule(exe, m, n, k, sizes, capacity=-1, sms=SMS):
    r = subprocess.run([str(exe), str(capacity), str(sms), str(m), str(n), str(k), *map(str, sizes)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _model_tiles(m, sizes, capacity=-1):
    """The row tiles an independent reading of the clamping rule gives (tests/_ragged_model.py's:
    negative sizes count 0, nothing past row M), 128 rows each, each group on its own; in the
    masked layout group g's rows start at g * capacity and number clamp(size, 0, capacity)."""
    tiles, start = [], 0
    for g, s in enumerate(sizes):
        if capacity >= 0:
            start, end = g * capacity, g * capacity + min(max(s, 0), capacity)
        else:
            end = min(start + max(s, 0), m)
        tiles += [[g, r, end] for r in range(start, end, hopper.TILE_ROWS)]
        start = end
    return tiles


def _check_map(name, mp):
    """cuTensorMapEncodeTiled's rules (cuda.h) for a 3-D, non-interleaved map."""
    d, box, e = mp["dims"], mp["box"], mp["elem_bytes"]
    assert all(1 <= x <= 2**32 for x in d), f"map {name}: a dimension outside [1, 2^32]: {d}"
    for stride in (d[0] * e, d[0] * d[1] * e):
        assert stride % 16 == 0 and stride < 2**40, f"map {name}: stride {stride} not a multiple of 16 below 2^40"
    assert all(1 <= x <= 256 for x in box), f"map {name}: a box side outside [1, 256]: {box}"
    assert box[0] * e % 16 == 0, f"map {name}: inner box side {box[0] * e} bytes, not a multiple of 16"
    if mp["swizzle_128b"]:
        assert box[0] * e <= 128, f"map {name}: inner box side {box[0] * e} bytes > the 128-byte swizzle"


def _check_box(name, mp, c0, c1):
    """A box that TMA accepts and that starts inside the tensor: the innermost coordinate times the
    element size a multiple of 16 bytes (the hardware's rule: sm_90 traps on the UTMALDG
    otherwise, the first H200 run's failure), coordinates in [0, dim)."""
    assert c0 * mp["elem_bytes"] % 16 == 0, (
        f"{name}: innermost coordinate {c0} is {c0 * mp['elem_bytes']} bytes, not a multiple of 16 (TMA traps)")
    assert 0 <= c0 < mp["dims"][0] and 0 <= c1 < mp["dims"][1], f"{name}: box start ({c0}, {c1}) outside {mp['dims']}"


def check_schedule(sched, m, n, k, sizes, capacity=-1, sms=SMS):
    g = len(sizes)
    tiles = sched["tiles"]
    assert tiles == _model_tiles(m, sizes, capacity)
    assert all(row0 < end for _, row0, end in tiles), "an empty group got a tile"
    assert sched["tile_start"] == [sum(1 for t in tiles if t[0] < j) for j in range(g + 1)]
    assert sched["capacity"] == -(-m // hopper.TILE_ROWS) + g >= len(tiles)
    n_blocks, k_tiles = -(-n // 128), -(-k // 128)
    assert sched["k_tiles"] == k_tiles
    if m == 0 or g == 0:
        assert tiles == [] and sched["maps"] is None and sched["grid"] == 0
        return
    maps = sched["maps"]
    assert maps["a"]["dims"] == [k, m, 1] and maps["b"]["dims"] == [k, g * n, 1]
    assert maps["sa"]["dims"] == [-(-m // 4) * 4, k_tiles, 1]
    for name, mp in maps.items():
        _check_map(name, mp)
    box_bytes = {name: mp["box"][0] * mp["box"][1] * mp["elem_bytes"] for name, mp in maps.items()}
    assert sched["stage_tx_bytes"] == sum(box_bytes.values()), "expect_tx must equal the bytes of the three boxes"
    assert maps["a"]["box"][:2] == [128, hopper.TILE_ROWS] and maps["b"]["box"][:2] == [128, 128]
    # the persistent grid: one CTA per SM at most, never more than the largest table's items
    assert sched["grid"] == min(sms, sched["capacity"] * n_blocks) == len(sched["ctas"])
    # every (tile, column block) exactly once over all CTAs, the items shared out evenly
    done = sorted((c["t"], c["n0"]) for cta in sched["ctas"] for c in cta)
    assert done == [(t, 128 * j) for t in range(len(tiles)) for j in range(n_blocks)]
    per_cta = [len(cta) for cta in sched["ctas"]]
    assert max(per_cta) - min(per_cta) <= 1, f"items per CTA {per_cta}"
    sa_rows = maps["sa"]["box"][0]
    for cta in sched["ctas"]:
        for c in cta:
            grp, row0, end = tiles[c["t"]]
            # a consumer warpgroup computes iff some of its 64 rows are the group's
            assert c["active"] == [row0 < end, row0 + 64 < end]
            assert len(c["loads"]) == k_tiles
            for kt, (a0, a1, b0, b1, s0, s1, skip) in enumerate(c["loads"]):
                where = f"tile {c['t']} (group {grp}, row0 {row0}), n0 {c['n0']}, K tile {kt}"
                assert (a0, a1) == (128 * kt, row0), where
                assert (b0, b1) == (128 * kt, grp * n + c["n0"]), where  # this group's weight rows
                assert s1 == kt, where
                for name, c0, c1 in (("a", a0, a1), ("b", b0, b1), ("sa", s0, s1)):
                    _check_box(f"{where}, map {name}", maps[name], c0, c1)
                # the scale box holds the tile's rows row0 .. row0 + 127, the consumers read it from `skip`
                assert skip == row0 - s0 and s0 <= row0 and row0 + hopper.TILE_ROWS <= s0 + sa_rows, where


@pytest.mark.parametrize("case", list(SCHEDULE_CASES))
def test_schedule_keeps_every_tma_box_legal(schedule_binary, case):
    m, n, sizes = SCHEDULE_CASES[case]
    k = 384  # 3 K tiles
    check_schedule(_schedule(schedule_binary, m, n, k, sizes), m, n, k, sizes)


def test_schedule_on_random_sizes(schedule_binary):
    rng = random.Random(34)
    for m, n, sizes in _random_cases():
        k, sms = rng.choice([128, 256, 400, 2880]), rng.choice([1, 3, 8, SMS])
        try:
            check_schedule(_schedule(schedule_binary, m, n, k, sizes, sms=sms), m, n, k, sizes, sms=sms)
        except AssertionError as e:
            raise AssertionError(f"M={m} N={n} K={k} SMs={sms} sizes={sizes}: {e}") from e


@pytest.mark.parametrize("k", [16, 400, 2880])
def test_schedule_k_not_a_multiple_of_128(schedule_binary, k):
    """K % 16 == 0 is all TMA needs: the last K tile is partial (gpt-oss: K = 2880 = 22.5 x 128)."""
    m, n, sizes = 300, 264, [100, 0, 150]
    check_schedule(_schedule(schedule_binary, m, n, k, sizes), m, n, k, sizes)


@pytest.mark.parametrize("sms", [1, 2, 7, 132])
def test_schedule_persistent_grid_sizes(schedule_binary, sms):
    """Fewer CTAs than items (each walks several, stages running on across them) and more SMs than
    items (the grid stops at the largest table's items)."""
    m, n, sizes = 1000, 392, _zipf(1000, 16)
    check_schedule(_schedule(schedule_binary, m, n, 256, sizes, sms=sms), m, n, 256, sizes, sms=sms)


MASKED_CASES = {  # (capacity, N, counts): decode's experts x capacity, valid counts on the device
    "decode": (8, 136, [3, 0, 8, 1, 5, 0, 2, 7]),
    "over_capacity_and_negative": (130, 264, [200, -4, 129, 130, 0]),
    "several_tiles": (300, 136, [300, 1, 257, 128]),
    "unaligned_capacity": (37, 128, [37, 36, 1, 0, 20]),
    "zero_capacity": (0, 128, [3, 0, 1]),
}


@pytest.mark.parametrize("case", list(MASKED_CASES))
def test_schedule_masked_layout(schedule_binary, case):
    """The masked layout: expert g's tiles start at row g * capacity (any row: the scale box rule
    applies), clamp(count, 0, capacity) rows."""
    capacity, n, counts = MASKED_CASES[case]
    m = capacity * len(counts)
    sched = _schedule(schedule_binary, m, n, 384, counts, capacity=capacity)
    check_schedule(sched, m, n, 384, counts, capacity=capacity)


def test_schedule_puts_the_h200_trap_on_a_misaligned_scale_row(schedule_binary):
    """The first H200 run trapped on `skewed` (M=200, N=136, K=384) in the CTA that loaded group 1's
    tile at row 150, 600 bytes into a scale row (not a multiple of 16); its scale box now starts at
    row 148 and the consumers skip 2 rows."""
    sched = _schedule(schedule_binary, 200, 136, 384, SIZES["skewed"])
    t = sched["tiles"].index([1, 150, 152])
    (item,) = [c for cta in sched["ctas"] for c in cta if c["t"] == t and c["n0"] == 128]
    assert [(s0, skip) for _, _, _, _, s0, _, skip in item["loads"]] == [(148, 2)] * 3
    assert item["active"] == [True, False]  # 2 rows: the second warpgroup has none


# --------------------------------------------------------------------------- the weight gradient (CPU)
def _wgrad_schedule(exe, m, k, n, sizes, sms=SMS):
    r = subprocess.run([str(exe), "wgrad", str(sms), str(m), str(k), str(n), *map(str, sizes)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def check_wgrad_schedule(sched, m, k, n, sizes, sms=SMS):
    """The wgrad kernel's schedule against jax_gpuext's own numbering of the grouped blocks (the
    scales quantize_grouped writes: common.grouped_layout) and TMA's rules."""
    g = len(sizes)
    layout = common.grouped_layout(jnp.array(sizes, jnp.int32), m, 128)
    starts = [int(x) for x in layout.block_start]
    assert sched["tile_start"] == starts[:g] + [starts[g]], "the kernel's token blocks are not quantize_grouped's"
    assert sched["blocks"] == common.grouped_block_count(m, g, 128)
    # each group's blocks hold exactly its tokens in the slot layout the Python side gathers
    rows, valid = (np.asarray(x) for x in common.slot_rows(layout, sched["blocks"]))
    group_of_row = np.asarray(common.row_groups(jnp.array(sizes, jnp.int32), m))
    for grp in range(g):
        slots = slice(128 * starts[grp], 128 * starts[grp + 1])
        assert (group_of_row[rows[slots][valid[slots]]] == grp).all()
        assert valid[slots].sum() == (group_of_row == grp).sum()
    if sched["maps"] is None:
        assert sched["grid"] == 0 and (m == 0 or g == 0 or k == 0 or n == 0)
        return
    maps, blocks = sched["maps"], sched["blocks"]
    assert maps["a"]["dims"] == [128 * blocks, k, 1] and maps["b"]["dims"] == [128 * blocks, n, 1]
    assert maps["sa"]["dims"] == [-(-k // 4) * 4, blocks, 1] and maps["sb"]["dims"] == [-(-n // 4) * 4, blocks, 1]
    for name, mp in maps.items():
        _check_map(name, mp)
    box_bytes = {name: mp["box"][0] * mp["box"][1] * mp["elem_bytes"] for name, mp in maps.items()}
    assert sched["stage_tx_bytes"] == sum(box_bytes.values())
    items = g * -(-k // 128) * -(-n // 128)
    assert sched["grid"] == min(sms, items) == len(sched["ctas"])
    done = sorted((c["g"], c["m0"], c["n0"]) for cta in sched["ctas"] for c in cta)
    assert done == sorted((e, 128 * i, 128 * j) for e in range(g) for i in range(-(-k // 128))
                          for j in range(-(-n // 128)))
    per_cta = [len(cta) for cta in sched["ctas"]]
    assert max(per_cta) - min(per_cta) <= 1
    for cta in sched["ctas"]:
        for c in cta:
            assert c["active"] == [c["m0"] < k, c["m0"] + 64 < k]
            want = [[128 * b, c["m0"], 128 * b, c["n0"], c["m0"], b, c["n0"], b]
                    for b in range(starts[c["g"]], starts[c["g"] + 1])]
            assert c["loads"] == want
            for a0, a1, b0, b1, s0, s1, t0, t1 in c["loads"]:
                for name, c0, c1 in (("a", a0, a1), ("b", b0, b1), ("sa", s0, s1), ("sb", t0, t1)):
                    _check_box(f"group {c['g']} item ({c['m0']}, {c['n0']}), map {name}", maps[name], c0, c1)


WGRAD_CASES = {  # (M tokens, K, N, sizes)
    "model_skewed": (200, 136, 136, SIZES["skewed"]),
    "starts_not_multiple_of_16": (700, 256, 264, [1, 130, 3, 255, 2, 129, 77]),
    "empty_groups_and_tail": (400, 200, 392, [0, 0, 173, 61, 129, 0, 0]),
    "sizes_past_m": (300, 128, 128, [250, 100, 50]),
    "out_of_range": (64, 136, 128, [-5, 40, 2**31 - 1, 7]),
    "no_tokens": (0, 128, 136, [5, 3, 0, 1]),
    "k_not_a_multiple_of_128": (256, 72, 136, [100, 156]),
}


@pytest.mark.parametrize("case", list(WGRAD_CASES))
def test_wgrad_schedule(schedule_binary, case):
    m, k, n, sizes = WGRAD_CASES[case]
    check_wgrad_schedule(_wgrad_schedule(schedule_binary, m, k, n, sizes), m, k, n, sizes)


@pytest.mark.parametrize("sms", [1, 5])
def test_wgrad_schedule_few_ctas(schedule_binary, sms):
    m, k, n, sizes = 1000, 256, 392, _zipf(1000, 16)
    check_wgrad_schedule(_wgrad_schedule(schedule_binary, m, k, n, sizes, sms), m, k, n, sizes, sms)


def _wgrad_problem(m, k, n, sizes, lhs_t, rhs_t, seed=0):
    """x^T (K, M) or x (M, K) and dy (M, N) or dy^T (N, M), quantized along the tokens with blocks
    restarting per group, as scaled_ragged_dot's wgrad quantizes them."""
    sizes = jnp.array(sizes, jnp.int32)
    x = jax.random.normal(jax.random.key(seed), (m, k)) * 2
    dy = jax.random.normal(jax.random.key(seed + 1), (m, n))
    lhs = gx.quantize_grouped(x.T, gx.FP8_1x128, sizes, axis=1) if lhs_t else \
        gx.quantize_grouped(x, gx.FP8_1x128, sizes, axis=0)
    rhs = gx.quantize_grouped(dy, gx.FP8_1x128, sizes, axis=0) if not rhs_t else \
        gx.quantize_grouped(dy.T, gx.FP8_1x128, sizes, axis=1)
    dn = jax.lax.RaggedDotDimensionNumbers((([1 if lhs_t else 0], [1 if rhs_t else 0]), ([], [])),
                                           [1 if lhs_t else 0], [])
    return lhs, rhs, sizes, common.problem(lhs, rhs, sizes, dn, jnp.float32)


@pytest.mark.parametrize("lhs_t,rhs_t", [(True, False), (False, True)], ids=["xT-dy", "x-dyT"])
@pytest.mark.parametrize("case", ["model_skewed", "starts_not_multiple_of_16", "empty_groups_and_tail"])
def test_wgrad_operands_give_the_model_on_the_kernels_blocks(schedule_binary, case, lhs_t, rhs_t):
    """What the wgrad kernel is handed (hopper.wgrad_operands: the slot-layout gather, transposes,
    scales) contracted block by block over the kernel's own block ranges (the schedule), in
    float64 NumPy as the kernel's promotion does it, equals the float64 model of the grouped dot:
    the Python side and the block numbering are right, only the CUDA kernel is left to the GPU."""
    m, k, n, sizes = WGRAD_CASES[case]
    lhs, rhs, gs, p = _wgrad_problem(m, k, n, sizes, lhs_t, rhs_t, seed=4)
    a, sa, b, sb = (np.asarray(v.astype(jnp.float32), np.float64)
                    for v in jax.jit(lambda l, r, s: hopper.wgrad_operands(l, r, s, p))(lhs, rhs, gs))
    starts = _wgrad_schedule(schedule_binary, m, k, n, sizes)["tile_start"]
    got = np.zeros((len(sizes), k, n))
    for grp in range(len(sizes)):
        for blk in range(starts[grp], starts[grp + 1]):
            cols = slice(128 * blk, 128 * blk + 128)
            got[grp] += (a[:, cols] * sa[blk, :k, None]) @ (b[:, cols] * sb[blk, :n, None]).T
    lv = rnp.dequant_grouped(lhs, np.asarray(gs))
    rv = rnp.dequant_grouped(rhs, np.asarray(gs))
    want, mag = rnp.ragged_contract(lv if lhs_t else lv.T, rv if not rhs_t else rv.T, np.asarray(gs))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * (mag.max() + 1))


def test_wgrad_lowers_to_its_kernel():
    m, k, n, sizes = 200, 136, 136, SIZES["skewed"]
    lhs, rhs, gs, p = _wgrad_problem(m, k, n, sizes, True, False)
    blocks = common.grouped_block_count(m, len(sizes), 128)
    text = jax.jit(lambda a, b, s: hopper.impl(a, b, s, p)).trace(lhs, rhs, gs).lower(
        lowering_platforms=("cuda",)).as_text()
    assert hopper.WGRAD_TARGET in text and f"m = {m} : i64" in text
    for t in (f"tensor<{k}x{128 * blocks}xf8E4M3FN>", f"tensor<{blocks}x{-(-k // 4) * 4}xf32>",
              f"tensor<{n}x{128 * blocks}xf8E4M3FN>", f"tensor<{blocks}x{-(-n // 4) * 4}xf32>",
              f"tensor<{len(sizes)}x{k}x{n}xf32>",
              f"tensor<{hopper.workspace_bytes(m, len(sizes)) + hopper.WORKSPACE_SLACK}xui8>"):
        assert t in text, t


@pytest.mark.parametrize("case", ["starts_not_multiple_of_16", "out_of_range"])
def test_wgrad_reads_quantizes_output_without_moving_the_codes(case):
    """scaled_ragged_dot's weight gradient hands the kernel quantize's own padded output
    (grouped.quantize_tokens_for_wgrad): what the kernel reads is bit for bit what the gather from
    quantize_grouped's compact arrays gives, and the lowered CUDA program gathers only the bf16
    rows (one gather of whole rows per operand, no transpose of them) and transposes each operand's
    FP8 codes once; before, x^T and dy's codes were gathered back and gathered again, and x was
    transposed as bf16 (docs/design.md, "The weight gradient's operand passes")."""
    from jax_gpuext.ragged_dot import grouped

    m, k, n, sizes = WGRAD_CASES[case]
    gs = jnp.array(sizes, jnp.int32)
    x = (jax.random.normal(jax.random.key(7), (m, k)) * 2).astype(jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(8), (m, n)).astype(jnp.bfloat16)

    def slots(x, dy, s):
        return (grouped.quantize_tokens_for_wgrad(x, gx.FP8_1x128, s, tokens_last=True, quantize_backend="xla"),
                grouped.quantize_tokens_for_wgrad(dy, gx.FP8_1x128, s, tokens_last=False, quantize_backend="xla"))

    def compact(x, dy, s):
        return (gx.quantize_grouped(x.T, gx.FP8_1x128, s, axis=1, backend="xla"),
                gx.quantize_grouped(dy, gx.FP8_1x128, s, axis=0, backend="xla"))

    p = common.problem(*compact(x, dy, gs), gs, common.RAGGED_CONTRACT, jnp.float32)
    ops = {name: jax.jit(lambda a, b, s, f=f: hopper.wgrad_operands(*f(a, b, s), s, p))(x, dy, gs)
           for name, f in (("slots", slots), ("compact", compact))}
    for got, want in zip(ops["slots"], ops["compact"]):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))

    text = jax.jit(lambda a, b, s: hopper.impl(*slots(a, b, s), s, p)).trace(x, dy, gs).lower(
        lowering_platforms=("cuda",)).as_text()
    assert hopper.WGRAD_TARGET in text
    moves = [line for line in text.splitlines() if re.search(r"stablehlo\.(gather|transpose)", line)]
    result = [line.rsplit("->", 1)[-1] for line in moves]
    blocks = common.grouped_block_count(m, len(sizes), 128)
    row_gathers = sorted(r for r, line in zip(result, moves) if "gather" in line and "ui16>" in r)
    assert row_gathers == sorted([f" tensor<{128 * blocks}x{k}xui16>", f" tensor<{128 * blocks}x{n}xui16>"]), moves
    assert not [r for r in result if "bf16" in r], moves  # no transpose of the bf16 input
    codes = [(line, r) for line, r in zip(moves, result) if "f8E4M3FN" in r or "ui8>" in r]
    assert sorted(r.strip() for _, r in codes) == sorted([f"tensor<{k}x{128 * blocks}xf8E4M3FN>",
                                                          f"tensor<{n}x{128 * blocks}xf8E4M3FN>"]), codes
    assert all("transpose" in line for line, _ in codes), codes


def test_wgrad_lowers_with_no_tokens():
    """No tokens (the GPU test's last case): zero token blocks, operands (K, 0) and (N, 0), scales
    (0, K4) and (0, N4), which the handler accepts (blocks = 0) and answers with one memset."""
    m, k, n, sizes = 0, 128, 136, [5, 3, 0, 1]
    lhs, rhs, gs, _ = _wgrad_problem(1, k, n, sizes, True, False)
    lhs, rhs = (jax.tree_util.tree_map(lambda x, ax=q.axis: jax.lax.slice_in_dim(x, 0, 0, axis=ax % 2), q)
                for q in (lhs, rhs))
    p = common.problem(lhs, rhs, gs, common.RAGGED_CONTRACT, jnp.float32)
    assert (p.M, p.K, p.N, p.G) == (m, k, n, len(sizes)) and hopper.feature(p) == "wgrad"
    why = hopper.supports(p).reason
    assert _ext.module("cuda") is not None or "no CUDA extension" in why, why  # the shapes pass
    text = jax.jit(lambda a, b, s: hopper.impl(a, b, s, p)).trace(lhs, rhs, gs).lower(
        lowering_platforms=("cuda",)).as_text()
    assert hopper.WGRAD_TARGET in text and "m = 0 : i64" in text
    for t in (f"tensor<{k}x0xf8E4M3FN>", f"tensor<0x{k}xf32>", f"tensor<{n}x0xf8E4M3FN>", f"tensor<0x{n}xf32>",
              f"tensor<{len(sizes)}x{k}x{n}xf32>"):
        assert t in text, t


def test_wgrad_supports_says_why():
    lhs, rhs, gs, p = _wgrad_problem(200, 136, 136, SIZES["skewed"], True, False)
    assert hopper.feature(p) == "wgrad"
    r = hopper.supports(p)
    if _ext.module("cuda") is None:
        assert not r.supported and "no CUDA extension" in r.reason
    mx = gx.quantize_grouped(jnp.ones((136, 200)), gx.MXFP8_E4M3, gs, axis=1)
    mxr = gx.quantize_grouped(jnp.ones((200, 136)), gx.MXFP8_E4M3, gs, axis=0)
    pm = common.problem(mx, mxr, gs, common.RAGGED_CONTRACT, jnp.float32)
    assert "FP8_1x128 x FP8_1x128" in hopper.supports(pm).reason
    _, _, _, pn = _wgrad_problem(200, 136, 100, SIZES["skewed"], True, False)
    assert "N=100" in hopper.supports(pn).reason


# --------------------------------------------------------------------------- GPU (Hopper)
# Compiling is most of this module's GPU time (the H200 run of 3ff9b82 spent 150 s on it, the
# wgrad tests' in fresh child processes, and never reached the training step): the group sizes
# are run-time values, so one executable per problem serves every size vector of that shape, and
# cases whose layout lives in the sizes share a shape. Each executable is compiled once (lower /
# compile, the compiled HLO checked from the same object: jit followed by f.lower().compile()
# compiled twice). The isolated tests of this module share one child process while they pass
# (tests/_isolation.py), so the cache lasts the module.
_EXECUTABLES: dict = {}


def _compiled(key, fn, *args, **jit_kw):
    """jax.jit(fn, **jit_kw) compiled for args, once per (key, the args' shapes and dtypes)."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    full = (key, tree, tuple((x.shape, str(x.dtype)) for x in leaves), tuple(sorted(jit_kw.items(), key=str)))
    if full not in _EXECUTABLES:
        _EXECUTABLES[full] = jax.jit(fn, **jit_kw).lower(*args).compile()
    return _EXECUTABLES[full]


def _run(lhs, rhs, sizes, p):
    """The backend's impl for problem p, compiled once per problem and shapes; (executable, result)."""
    c = _compiled(("impl", p), lambda a, b, s: hopper.impl(a, b, s, p), lhs, rhs, sizes)
    return c, c(lhs, rhs, sizes)


@pytest.mark.verifies("ragged_dot.hopper", feature="fp8_blockwise")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("case", list(SIZES))
def test_gpu_matches_f64(case):
    m, k, n = 200, 384, 136  # a partial column tile; 3 K tiles
    lhs, rhs = operands(m, k, n, 6, gx.FP8_128x128, 2, seed=10)
    sizes = jnp.array(SIZES[case], jnp.int32)
    f, y = _run(lhs, rhs, sizes, problem(m=m, k=k, n=n, g=6))  # one executable for every case
    check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)
    assert TARGET in f.as_text()


@pytest.mark.verifies("ragged_dot.hopper", feature="fp8_blockwise")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("rhs_contract,out_dtype",
                         [(1, jnp.bfloat16), (2, jnp.bfloat16), (2, jnp.float32), (2, jnp.float16)],
                         ids=["GKN-bf16", "GNK-bf16", "GNK-f32", "GNK-f16"])
def test_gpu_many_tiles_and_stages(rhs_contract, out_dtype):
    """M = 1000 over 3 groups (one of 700 rows: 6 row tiles, ending mid-tile), N = 392 (4 column
    tiles, the last partial), K = 1024 (8 K tiles through 6 stages: every barrier phase wraps).
    Every output dtype once (the kernel's stores), and the (G, K, N) weights once (XLA transposes
    them: the kernel is the same)."""
    m, k, n, g = 1000, 1024, 392, 3
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, rhs_contract, seed=20)
    sizes = jnp.array([700, 1, 250], jnp.int32)  # 951 rows: the last 49 must come out zero
    _, y = _run(lhs, rhs, sizes, problem(m=m, k=k, n=n, g=g, out=out_dtype, rhs_contract=rhs_contract))
    assert y.dtype == out_dtype
    check_gpu_result(y, lhs, rhs, sizes, rhs_contract, out_dtype)


# (M, N, sizes) on the GPU: the layouts of the schedule test whose tiles start where the first
# kernel trapped (rows not a multiple of 4), skewed and Zipf-like experts, empty experts first, last
# and everywhere but one, groups that are not multiples of the tile height, and M = 0. Layouts that
# live in the sizes alone share one shape (M = 1000, N = 136, 16 groups: the schedule tests' vectors
# padded with empty groups where the layout allows, rows past the groups zero): one executable.
def _pad16(sizes, front=False):
    pad = [0] * (16 - len(sizes))
    return pad + sizes if front else sizes + pad


GPU_LAYOUTS = {
    "zipf": (1000, 136, _zipf(1000, 16)),
    "empty_first_and_last": (400, 392, [0, 0, 173, 61, 129, 0, 0]),
    "all_empty_but_one": (1000, 136, _pad16([0, 0, 0, 257, 0, 0])),
    "all_empty_but_last_unaligned": (1000, 136, _pad16([0, 0, 0, 0, 0, 3, 201], front=True)),
    "starts_not_multiple_of_4": (1000, 136, _pad16([1, 130, 3, 255, 2, 129, 77])),
    "groups_not_multiple_of_tile": (768, 264, [127, 129, 255, 257]),
    "tails_at_the_warpgroup_boundary": (1000, 136, _pad16([64, 65, 63, 192, 128, 1])),  # 2nd warpgroup idle iff <= 64
    "m_zero": (0, 136, [0, 0, 0, 0]),
    "m_zero_sizes_out_of_range": (0, 136, [5, 3, 0, 1]),
}


@pytest.mark.verifies("ragged_dot.hopper", feature="fp8_blockwise")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("layout", list(GPU_LAYOUTS))
def test_gpu_skewed_layouts_match_f64(layout):
    m, n, sizes = GPU_LAYOUTS[layout]
    k, g = 384, len(sizes)
    lhs, rhs = operands(max(m, 4), k, n, g, gx.FP8_128x128, 2, seed=50)
    if m == 0:  # no rows: cut from quantized ones (the quantizer's own empty input is not this test's subject)
        leaves, tree = jax.tree_util.tree_flatten(lhs)
        lhs = jax.tree_util.tree_unflatten(tree, [x[:0] for x in leaves])
    sizes = jnp.array(sizes, jnp.int32)
    _, y = _run(lhs, rhs, sizes, problem(m=m, k=k, n=n, g=g))
    assert y.shape == (m, n)
    check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)


@pytest.mark.verifies("ragged_dot.hopper", feature="fp8_blockwise")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("k", [400, 2880])
def test_gpu_k_not_a_multiple_of_128(k):
    """K % 16 == 0: the last K tile is partial and zero-filled by TMA (gpt-oss: K = 2880)."""
    m, n, sizes = 300, 264, [100, 0, 150]
    lhs, rhs = operands(m, k, n, len(sizes), gx.FP8_128x128, 2, seed=60)
    sizes = jnp.array(sizes, jnp.int32)
    _, y = _run(lhs, rhs, sizes, problem(m=m, k=k, n=n, g=3))
    check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)


@pytest.mark.verifies("ragged_dot.hopper", feature="fp8_blockwise")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
def test_gpu_persistent_ctas_walk_several_items():
    """More items than SMs (48 row tiles x 8 column blocks over 16 Zipf experts, some empty): each
    persistent CTA computes several tiles, the pipeline's stages and phases running on across them,
    and tails of <= 64 rows leave the second warpgroup idle."""
    m, k, n = 4096, 512, 1024
    sizes = _zipf(m, 16)
    sizes[3] = sizes[9] = 0
    lhs, rhs = operands(m, k, n, len(sizes), gx.FP8_128x128, 2, seed=70)
    sizes = jnp.array(sizes, jnp.int32)
    _, y = _run(lhs, rhs, sizes, problem(m=m, k=k, n=n, g=16))
    check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)


@pytest.mark.verifies("ragged_dot.hopper", feature="fp8_blockwise")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
def test_gpu_dgrad_matches_f64():
    """dx = dy w^T per group through the public op (RAGGED_M_NK) on the kernel: the forward's
    (G, K, N) FP8_128x128 weights read in place, contracted N = 400 (a partial last K tile), output
    K = 264 (a partial column tile), skewed groups with an empty one."""
    m, k, n = 600, 264, 400
    sizes = jnp.array([300, 0, 5, 200], jnp.int32)
    qw = gx.quantize(jax.random.normal(jax.random.key(80), (4, k, n)) * 0.1, gx.FP8_128x128)
    qdy = gx.quantize(jax.random.normal(jax.random.key(81), (m, n)), gx.FP8_1x128)
    f = _compiled("dgrad", lambda a, b, s: gx.ragged_dot(a, b, s, common.RAGGED_M_NK,
                                                         preferred_element_type=jnp.float32, backend="hopper"),
                  qdy, qw, sizes)
    dx = f(qdy, qw, sizes)
    assert dx.shape == (m, k) and TARGET in f.as_text()
    check_gpu_result(dx, qdy, qw, sizes, 2, jnp.float32)  # (G, K, N) is the model's (G, rows, contracted)


@pytest.mark.verifies("ragged_dot.hopper")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
def test_gpu_group_sizes_out_of_range_stay_in_bounds():
    m, k, n = 64, 256, 128
    lhs, rhs = operands(m, k, n, 4, gx.FP8_128x128, 2, seed=30)
    p = problem(m=m, k=k, n=n, g=4)
    for sizes in ([-5, 40, 2**31 - 1, 7], [70, 70, 70, 70], [-1, -1, -1, -1]):
        sizes = jnp.array(sizes, jnp.int32)
        _, y = _run(lhs, rhs, sizes, p)
        check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)


@pytest.mark.verifies("ragged_dot.hopper", feature="command_buffer")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_command_buffer_reads_the_sizes_of_each_call(command_buffer):
    check_command_buffer_replays(hopper.impl, TARGET, 300, command_buffer,
                                 ([75, 75, 75, 75], [0, 290, 1, 9], [300, 0, 0, 0], [75, 75, 75, 75]))


# --------------------------------------------------------------------------- GPU: the masked layout
def _masked_operands(g, c, k, n, rc, seed):
    lhs = gx.quantize(jax.random.normal(jax.random.key(seed), (g, c, k)), gx.FP8_1x128)
    w = jax.random.normal(jax.random.key(seed + 1), (g, k, n) if rc == 1 else (g, n, k)) * 0.1
    return lhs, gx.quantize(w, gx.FP8_128x128)


MASKED_GPU_CASES = {  # (G, C, K, N, counts): decode's experts x capacity, valid counts on the device
    "decode": (16, 8, 512, 256, [3, 0, 8, 1, 5, 0, 2, 7, 8, 8, 1, 0, 4, 6, 2, 3]),
    "several_tiles_and_out_of_range": (4, 300, 384, 392, [300, -3, 257, 1000]),
    "unaligned_capacity_k_2880": (5, 37, 2880, 136, [37, 36, 1, 0, 20]),
}


@pytest.mark.verifies("ragged_dot.hopper", feature="masked")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("case", list(MASKED_GPU_CASES))
@pytest.mark.parametrize("rc", [1, 2], ids=["GKN", "GNK"])
def test_gpu_masked_matches_f64(case, rc):
    """ragged_dot_masked on the kernel's masked mode: expert g's tiles from row g * C (slabs at
    rows that are no multiple of 4 when C = 37), rows past each count zero."""
    g, c, k, n, counts = MASKED_GPU_CASES[case]
    lhs, rhs = _masked_operands(g, c, k, n, rc, seed=90)
    counts_d = jnp.array(counts, jnp.int32)
    f = _compiled(("masked", rc), lambda a, b, s: gx.ragged_dot_masked(a, b, s, rc, preferred_element_type=jnp.bfloat16,
                                                                      backend="hopper"), lhs, rhs, counts_d)
    y = f(lhs, rhs, counts_d)
    assert y.shape == (g, c, n) and TARGET in f.as_text()
    check_gpu_masked_result(y, lhs, rhs, counts, rc, jnp.bfloat16)


@pytest.mark.verifies("ragged_dot.hopper", feature="command_buffer")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_masked_command_buffer_reads_the_counts_of_each_call(command_buffer):
    """Decode under CUDA graphs: one compiled program replayed with new counts each step, the
    counts reaching the call through one table that stays put (check_command_buffer_replays)."""
    g, c, k, n = 8, 16, 256, 128
    lhs, rhs = _masked_operands(g, c, k, n, 2, seed=95)
    vectors = [[16, 0, 3, 8, 1, 16, 0, 5], [0] * 8, [1, 2, 3, 4, 5, 6, 7, 8], [16] * 8]
    table = jnp.array(vectors, jnp.int32)
    p = masked.problem(lhs, rhs, table[0], 2, jnp.bfloat16)

    def pick(t, i):
        return jnp.sum(jnp.where((jnp.arange(t.shape[0]) == i)[:, None], t, 0), axis=0, dtype=jnp.int32)

    f = jax.jit(lambda a, b, t, i: hopper.masked_impl(a, b, pick(t, i), p),
                compiler_options=cb.options(command_buffer))
    runs = max(cb.RUNS, len(vectors))
    with cb.counting(TARGET) as counts:
        for r in range(runs):
            v = r % len(vectors)
            check_gpu_masked_result(f(lhs, rhs, table, jnp.int32(v)), lhs, rhs, vectors[v], 2, jnp.bfloat16)
    cb.assert_counts(counts, runs, command_buffer)


# --------------------------------------------------------------------------- GPU: the weight gradient
def _close_gpu(y, want, mag, out_dtype=jnp.float32):
    """tests/_ragged_model.py's bound: 1e-3 of sum |terms| for the tensor cores' accumulation, then
    the output's rounding."""
    y = np.asarray(jnp.asarray(y).astype(jnp.float32), np.float64)
    ulp = {jnp.dtype(jnp.bfloat16): 2.0 ** -8, jnp.dtype(jnp.float16): 2.0 ** -11}.get(jnp.dtype(out_dtype), 2.0 ** -23)
    bad = np.abs(y - want) > 1e-3 * mag + ulp * np.abs(want) + 1e-30
    assert not bad.any(), f"{bad.sum()} of {bad.size} elements off, first at {np.argwhere(bad)[0]}"


# (M tokens, K, N, sizes) on the GPU: the first three share one shape (their layouts live in the
# sizes: skewed groups, groups starting at tokens that are no multiple of 16, empty groups and
# tokens past the groups; K = 200 and N = 264 end in partial tiles, the second K tile's second
# warpgroup holds 8 rows), so one executable per operand layout serves them; K = 72 (the second
# warpgroup idle in every item) and no tokens at all (one memset) have shapes of their own.
WGRAD_GPU_CASES = {
    "model_skewed": (700, 200, 264, SIZES["skewed"] + [0]),
    "starts_not_multiple_of_16": (700, 200, 264, [1, 130, 3, 255, 2, 129, 77]),
    "empty_groups_and_tail": (700, 200, 264, [0, 0, 173, 61, 129, 0, 0]),
    "k_not_a_multiple_of_128": (256, 72, 136, [100, 156]),
    "no_tokens": (0, 128, 136, [5, 3, 0, 1]),
}


@pytest.mark.verifies("ragged_dot.hopper", feature="wgrad")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("lhs_t,rhs_t", [(True, False), (False, True)], ids=["xT-dy", "x-dyT"])
@pytest.mark.parametrize("case", list(WGRAD_GPU_CASES))
def test_gpu_wgrad_matches_f64(case, lhs_t, rhs_t):
    """dw (G, K, N) = each group's tokens of x^T times its tokens of dy on the wgrad kernel: groups
    starting at any token, empty groups (zero matrices), K = 72 (the second warpgroup idle), no
    tokens at all (one memset)."""
    m, k, n, sizes = WGRAD_GPU_CASES[case]
    lhs, rhs, gs, p = _wgrad_problem(max(m, 1), k, n, sizes, lhs_t, rhs_t, seed=100)
    if m == 0:  # no tokens: cut from quantized ones (the quantizer's own empty input is not this test's subject)
        lhs, rhs = (jax.tree_util.tree_map(lambda x, ax=q.axis: jax.lax.slice_in_dim(x, 0, 0, axis=ax % 2), q)
                    for q in (lhs, rhs))
    dims = jax.lax.RaggedDotDimensionNumbers((([1 if lhs_t else 0], [1 if rhs_t else 0]), ([], [])),
                                             [1 if lhs_t else 0], [])
    f = _compiled(("wgrad", lhs_t, rhs_t),
                  lambda a, b, s: gx.ragged_dot(a, b, s, dims, preferred_element_type=jnp.float32, backend="hopper"),
                  lhs, rhs, gs)
    dw = f(lhs, rhs, gs)
    assert dw.shape == (len(sizes), k, n) and hopper.WGRAD_TARGET in f.as_text()
    lv, rv = rnp.dequant_grouped(lhs, np.asarray(gs)), rnp.dequant_grouped(rhs, np.asarray(gs))
    want, mag = rnp.ragged_contract(lv if lhs_t else lv.T, rv if not rhs_t else rv.T, np.asarray(gs))
    _close_gpu(dw, want, mag)


@pytest.mark.verifies("ragged_dot.hopper", feature="wgrad")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
def test_gpu_training_step_runs_on_the_kernels():
    """scaled_ragged_dot's whole training step with backend="hopper": the forward and the dgrad on
    the grouped kernel, the wgrad on its ragged-contracted kernel, each against the float64 model
    of the quantized math."""
    m, k, n, sizes = 300, 256, 272, np.array([120, 0, 1, 150, 9], np.int32)
    x = jax.random.normal(jax.random.key(110), (m, k)) * 2
    w = jax.random.normal(jax.random.key(111), (len(sizes), k, n)) * 0.3
    dy = jax.random.normal(jax.random.key(112), (m, n))

    def step(x, w, dy):  # y and both gradients from one program (one compile)
        y, vjp = jax.vjp(lambda a, b: gx.scaled_ragged_dot(a, b, jnp.asarray(sizes), preferred_element_type=jnp.float32,
                                                           backend="hopper"), x, w)
        return (y, *vjp(dy))

    compiled = jax.jit(step).lower(x, w, dy).compile()
    y, dx, dw = compiled(x, w, dy)
    hlo = compiled.as_text()
    assert f'custom_call_target="{TARGET}"' in hlo and f'custom_call_target="{hopper.WGRAD_TARGET}"' in hlo
    qx, qw = gx.quantize(x, gx.FP8_1x128), gx.quantize(w, gx.FP8_128x128)
    want, mag = rnp.ragged_m(rnp.dequant(qx), rnp.dequant(qw), sizes)
    _close_gpu(y, want, mag)
    qdy = gx.quantize(dy, gx.FP8_1x128)
    want, mag = rnp.ragged_m(rnp.dequant(qdy), np.swapaxes(rnp.dequant(qw), 1, 2), sizes)
    _close_gpu(dx, want, mag)
    xt = rnp.dequant_grouped(gx.quantize_grouped(x.T, gx.FP8_1x128, jnp.asarray(sizes), axis=1), sizes)
    dyv = rnp.dequant_grouped(gx.quantize_grouped(dy, gx.FP8_1x128, jnp.asarray(sizes), axis=0), sizes)
    want, mag = rnp.ragged_contract(xt, dyv, sizes)
    _close_gpu(dw, want, mag)


# --------------------------------------------------------------------------- the bench's hopper cells (CPU)
def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_ragged_dot_under_test",
                                                  REPO / "benchmarks" / "bench_ragged_dot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _junit(cases, interrupted=False, counts=True):
    """A junit file as gpu_run.sh's tests_ragged_hopper writes it: (name, feature or None, outcome)
    per finished test; with ``counts``, the tests the group selected per feature (tests/conftest.py
    verifies_collected_counts): these plus one more wgrad test when one was ``interrupted``."""
    body, selected = [], {}
    for name, feature, outcome, *component in cases:  # component: ragged_dot.hopper unless given
        component = component[0] if component else "ragged_dot.hopper"
        props = f'<property name="verifies" value="{component}" />'
        if feature:
            props += f'<property name="verifies_feature" value="{component}={feature}" />'
        counted = selected.setdefault(component, {})
        counted[feature or ""] = counted.get(feature or "", 0) + 1
        result = {"passed": "", "failed": '<failure message="x">x</failure>', "error": '<error message="x">x</error>',
                  "skipped": '<skipped message="gate" />'}[outcome]
        body.append(f'<testcase classname="tests.ragged_dot.test_ragged_dot_hopper" name="{name}" time="1">'
                    f'<properties>{props}</properties>{result}</testcase>')
    if interrupted:  # pytest's record of the test the step's bound interrupted: no name, no outcome
        body.append('<testcase time="0.000" />')
        hopper = selected.setdefault("ragged_dot.hopper", {})
        hopper["wgrad"] = hopper.get("wgrad", 0) + 1
    suite = ""
    if counts:
        value = json.dumps({**selected, "ragged_dot.cublaslt": {"": 3}}).replace('"', "&quot;")
        suite = f'<properties><property name="verifies_collected_counts" value="{value}" /></properties>'
    return (f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="{len(cases)}">'
            f'{suite}{"".join(body)}</testsuite></testsuites>')


FORWARD_OK = [("test_gpu_matches_f64[balanced]", "fp8_blockwise", "passed"),
              ("test_gpu_dgrad_matches_f64", "fp8_blockwise", "passed"),
              ("test_gpu_group_sizes_out_of_range_stay_in_bounds", None, "passed"),
              ("test_gpu_masked_matches_f64[GKN-decode]", "masked", "passed")]
WGRAD = "test_gpu_wgrad_matches_f64[{}]"
# the one-pass operand kernel the training step runs (tests/ragged_dot/test_token_slots.py)
TOKEN_SLOTS_OK = [("test_gpu_token_slots_match_composed[skewed_with_empty-bfloat16]", "token_slots", "passed",
                   "formats.cuda")]


def test_bench_times_the_hopper_forward_when_only_the_wgrad_failed(tmp_path):
    """The H200 run of 3ff9b82: every forward, dgrad and masked test passed, the wgrad ones failed,
    and the step's bound cut off the last wgrad test; gpu_run.sh's one flag then kept the kernel
    out of the bench altogether. Per feature, its forward is timed and its training step is not."""
    bench = _bench_module()
    junit = tmp_path / "gpu-tests-ragged_hopper.xml"
    cases = FORWARD_OK + [(WGRAD.format(c), "wgrad", "failed") for c in ("model_skewed-xT-dy", "no_tokens-xT-dy")]
    junit.write_text(_junit(cases, interrupted=True))
    why = bench.hopper_features(str(junit))
    assert why["forward"] is None and "wgrad tests failed" in why["train"]
    # the wgrad tests that finished passed, but the cut-off one may hang: still no training step
    junit.write_text(_junit([(n, f, "passed") for n, f, _ in cases], interrupted=True))
    why = bench.hopper_features(str(junit))
    assert why["forward"] is None and "1 of its wgrad tests did not finish" in why["train"]
    # a file without the selected counts (written before tests/conftest.py recorded them): the
    # cut-off test could be any, so neither cell is timed
    junit.write_text(_junit(cases, interrupted=True, counts=False))
    assert all("unknown" in w for w in bench.hopper_features(str(junit)).values())


def test_bench_hopper_cells_per_test_outcome(tmp_path):
    bench = _bench_module()
    junit = tmp_path / "j.xml"

    def verdict(cases, **kw):
        junit.write_text(_junit(cases, **kw))
        return bench.hopper_features(str(junit))

    wgrad_ok = [(WGRAD.format("model_skewed-xT-dy"), "wgrad", "passed"),
                ("test_gpu_training_step_runs_on_the_kernels", "wgrad", "passed")] + TOKEN_SLOTS_OK
    assert verdict(FORWARD_OK + wgrad_ok) == {"forward": None, "train": None}
    assert verdict(FORWARD_OK + wgrad_ok, counts=False) == {"forward": None, "train": None}
    # a failed forward test, or one of the whole kernel (no feature): neither cell
    for bad in (("test_gpu_matches_f64[skewed]", "fp8_blockwise", "failed"),
                ("test_gpu_group_sizes_out_of_range_stay_in_bounds", None, "error")):
        assert all(verdict(FORWARD_OK + wgrad_ok + [bad]).values()), bad
    # what the bench does not run may fail: masked, command buffers
    assert verdict(FORWARD_OK + wgrad_ok + [("test_gpu_masked_matches_f64[GNK-decode]", "masked", "failed"),
                                            ("test_gpu_command_buffer_reads_the_sizes_of_each_call[]",
                                             "command_buffer", "failed")]) == {"forward": None, "train": None}
    # skipped (a closed gate) is not passed; another component's failed test is not the kernel's
    skipped = [(n, f, "skipped", *c) for n, f, _, *c in FORWARD_OK + wgrad_ok]
    assert "none of its fp8_blockwise tests passed" in verdict(skipped)["forward"]
    # the training step also runs the one-pass operand kernel: its failure (or absence) keeps the
    # training step out, not the forward
    slots_failed = [(n, f, "failed", *c) for n, f, _, *c in TOKEN_SLOTS_OK]
    why = verdict(FORWARD_OK + wgrad_ok[:2] + slots_failed)
    assert why["forward"] is None and "formats.cuda token_slots tests failed" in why["train"], why
    why = verdict(FORWARD_OK + wgrad_ok[:2])
    assert why["forward"] is None and "none of its formats.cuda token_slots tests passed" in why["train"], why
    other = ('<testcase name="test_other"><properties><property name="verifies" value="ragged_dot.cublaslt" />'
             '</properties><failure message="x">x</failure></testcase>')
    junit.write_text(_junit(FORWARD_OK + wgrad_ok).replace("</testsuite>", other + "</testsuite>"))
    assert bench.hopper_features(str(junit)) == {"forward": None, "train": None}
