"""all_reduce (issue 6).

CPU: the one_shot / two_shot protocols run between 8 host devices (tests/conftest.py sets
--xla_force_host_platform_device_count=8) over the process-local heap, with a tiny workspace
so that every message but the smallest runs in several chunks, and must equal lax.psum & co.
GPU (skipped without one): scripts/run_allreduce_mps.sh runs 2 and 4 processes on one GPU
under CUDA MPS and checks against NumPy.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_gpuext
from jax_gpuext import collectives
from jax_gpuext.common import env as env_vars
from jax_gpuext.collectives.all_reduce import _NARROW_FLOATS, library_refusal

N = 8
REPO = pathlib.Path(__file__).resolve().parents[2]
WORKSPACE_BYTES = 512  # per rank: 300 float64 = 2400 B run in many chunks
SIZES = (0, 1, 37, 300)  # elements per device: empty, one, odd, larger than the workspace
KERNELS = ("one_shot", "two_shot")

DTYPES = ("float32", "bfloat16", "float16", "float64", "int8", "uint8", "int32", "uint32", "int64",
          "uint64", "bool", "float8_e4m3fn", "float8_e5m2")
OPS_BY_KIND = {"bool": ("and", "or", "max", "min"), "number": ("sum", "max", "min", "prod")}


# float64/int64/uint64 arrays are silently 32-bit unless x64 is on. A context manager scopes it
# to one test (jax.enable_x64 on newer jax, jax.experimental.enable_x64 on jax 0.7).
_enable_x64 = jax.enable_x64 if hasattr(jax, "enable_x64") else jax.experimental.enable_x64


def _shard_map(f, mesh, in_specs, out_specs):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() < N:
        pytest.fail(f"need {N} host devices, have {jax.device_count()}: XLA_FLAGS was set after jax started "
                    "(tests/conftest.py sets --xla_force_host_platform_device_count=8)")
    return jax.make_mesh((N,), ("i",), devices=jax.devices()[:N])


@pytest.fixture(autouse=True)
def small_workspace(monkeypatch):
    monkeypatch.setenv(collectives.WORKSPACE_ENV, str(WORKSPACE_BYTES))
    monkeypatch.setenv(collectives.TIMEOUT_ENV, "20")


def _data(dtype: str, op: str, size: int, seed: int):
    """Small integers: every sum/product is exact in float32, so results compare bit for bit."""
    rng = np.random.default_rng(seed)
    shape = (N, size)
    if dtype == "bool":
        return rng.random(shape) < 0.6
    if op == "prod":
        v = rng.choice([-2, -1, 1, 2], shape) if not dtype.startswith("uint") else rng.choice([1, 2, 3], shape)
    elif op == "sum":
        v = rng.integers(-3, 4, shape) if not dtype.startswith("uint") else rng.integers(0, 200, shape)
    else:
        v = rng.integers(-50, 51, shape) if not dtype.startswith("uint") else rng.integers(0, 250, shape)
    return v.astype(np.float32).astype(jnp.dtype(dtype)) if "float" in dtype else v.astype(dtype)


def _cases():
    for dtype in DTYPES:
        for op in OPS_BY_KIND["bool" if dtype == "bool" else "number"]:
            yield pytest.param(dtype, op, id=f"{dtype}-{op}")


@pytest.fixture
def x64():
    with _enable_x64(True):
        yield


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("dtype,op", list(_cases()))
def test_matches_xla_collective(mesh, dtype, op):
    """Every algorithm x size in one jit per (dtype, op), against lax.psum/pmax/pmin."""
    xs = [jax.device_put(_data(dtype, op, s, seed=s), NamedSharding(mesh, P("i"))) for s in SIZES]
    assert all(x.dtype == jnp.dtype(dtype) for x in xs), f"{dtype} arrays are {xs[0].dtype}"

    def body(*locals_):
        outs = []
        for x in locals_:
            outs += [jax_gpuext.all_reduce(x, "i", op=op, algorithm=a) for a in KERNELS]
            outs.append(jax_gpuext.all_reduce(x, "i", op=op, algorithm="xla"))
        return tuple(outs)

    f = _shard_map(body, mesh, (P("i"),) * len(xs), (P("i"),) * (3 * len(xs)))
    outs = f(*xs)
    for k, size in enumerate(SIZES):
        want = np.asarray(outs[3 * k + 2])
        for j, algorithm in enumerate(KERNELS):
            got = np.asarray(outs[3 * k + j])
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8),
                                          err_msg=f"{algorithm} {dtype} {op} size {size}")
    # and the xla backend against the plain lax collective / NumPy
    x = np.asarray(xs[-1])
    direct = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}.get(op)
    if direct is not None and dtype not in _NARROW_FLOATS and dtype != "bool":
        ref = _shard_map(lambda v: direct(v, "i"), mesh, P("i"), P("i"))(xs[-1])
        np.testing.assert_array_equal(np.asarray(outs[-1]), np.asarray(ref))
    if "float" in dtype and dtype != "float64":
        acc = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op](x.astype(np.float32), axis=0)
        np.testing.assert_array_equal(np.asarray(outs[-1])[0].astype(np.float32),
                                      acc.astype(jnp.dtype(dtype)).astype(np.float32))


def test_random_float32_close_to_psum(mesh):
    x = jax.device_put(np.random.default_rng(0).normal(size=(N, 1001)).astype(np.float32),
                       NamedSharding(mesh, P("i")))
    ref = _shard_map(lambda v: lax.psum(v, "i"), mesh, P("i"), P("i"))(x)
    for algorithm in KERNELS:
        got = _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm=algorithm), mesh, P("i"), P("i"))(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)
        rows = np.asarray(got).reshape(N, -1)
        assert (rows == rows[0]).all(), "every rank must hold the same bits"


def test_two_axis_mesh_reduces_per_group():
    mesh = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices()[:N])
    x = jax.device_put(np.arange(8 * 6, dtype=np.int32).reshape(8, 6), NamedSharding(mesh, P(("a", "b"))))
    for axis in ("a", "b"):
        ref = _shard_map(lambda v: lax.psum(v, axis), mesh, P(("a", "b")), P(("a", "b")))(x)
        for algorithm in KERNELS:
            got = _shard_map(lambda v: jax_gpuext.all_reduce(v, axis, algorithm=algorithm), mesh,
                             P(("a", "b")), P(("a", "b")))(x)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(ref), err_msg=f"{axis} {algorithm}")


def test_pmap_and_vmap(mesh):
    x = np.arange(N * 3 * 5, dtype=np.float32).reshape(N, 3, 5)
    got = jax.pmap(lambda v: jax.vmap(lambda r: jax_gpuext.all_reduce(r, "p", algorithm="one_shot"))(v),
                   axis_name="p")(x)
    np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(x.sum(0), x.shape))


@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_grad_like_lax(mesh, op):
    x = jax.device_put(np.random.default_rng(1).normal(size=(N, 7)).astype(np.float32), NamedSharding(mesh, P("i")))

    def loss(fn):
        f = jax.shard_map(lambda v: jnp.sum(jnp.sin(fn(v)))[None], mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                          check_vma=False)
        return jax.jit(jax.grad(lambda v: jnp.sum(f(v))))

    ref_fn = {"sum": lambda v: lax.psum(v, "i"), "max": lambda v: lax.pmax(v, "i"),
              "prod": lambda v: jnp.prod(lax.all_gather(v, "i"), axis=0)}[op]
    if op == "max":  # lax.pmax is not differentiable: the reference is jnp.max over a gather
        ref_fn = lambda v: jnp.max(lax.all_gather(v, "i"), axis=0)  # noqa: E731
    got = loss(lambda v: jax_gpuext.all_reduce(v, "i", op=op, algorithm="two_shot"))(x)
    want = loss(ref_fn)(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_timeout_names_missing_pe(mesh):
    """Device 3 skips the call: the others fail within the timeout and name PE 3; no hang. The timeout
    (3 s) leaves the devices that do call room to arrive on a busy machine: one that came later than
    it would be named too."""
    x = jax.device_put(np.ones((N, 16), np.float32), NamedSharding(mesh, P("i")))

    def body(v):
        return lax.cond(lax.axis_index("i") == 3, lambda u: u,
                        lambda u: jax_gpuext.all_reduce(u, "i", algorithm="one_shot", timeout_s=3), v)

    f = _shard_map(body, mesh, P("i"), P("i")).lower(x).compile()  # timed below: the run alone
    t0 = time.perf_counter()
    with pytest.raises(Exception, match=r"PEs \[3\] of group size 8 did not arrive"):
        jax.block_until_ready(f(x))
    assert time.perf_counter() - t0 < 15


def test_explain_shows_cpu_fallback(mesh):
    x = jax.device_put(np.ones((N, 4), np.float32), NamedSharding(mesh, P("i")))
    f = _shard_map(lambda v: jax_gpuext.all_reduce(v, "i"), mesh, P("i"), P("i"))
    ex = jax_gpuext.explain(f, x)
    (call,) = ex.calls
    assert call.op == "all_reduce" and call.chosen == "xla" and call.fallback
    assert "auto uses XLA's all-reduce on CPU" in dict(call.rejected)["one_shot"]
    assert "[FALLBACK]" in str(ex)
    ex = jax_gpuext.explain(f, x, platform="cuda")  # no GPU/NVSHMEM here: the reason says which gate
    assert ex.calls[0].chosen == "xla" and ex.calls[0].fallback


def test_hlo_has_custom_call(mesh):
    x = jax.device_put(np.ones((N, 4), np.float32), NamedSharding(mesh, P("i")))
    hlo = _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="one_shot"), mesh, P("i"), P("i")).lower(
        x).as_text()
    assert "gpuext_all_reduce" in hlo
    hlo = _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="xla"), mesh, P("i"), P("i")).lower(
        x).as_text()
    assert "gpuext_all_reduce" not in hlo


def test_trace_time_errors(mesh):
    def trace(fn, x):
        return jax.make_jaxpr(jax.shard_map(fn, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))(x)

    xf, xb = jnp.ones((N, 2)), jnp.ones((N, 2), bool)
    with pytest.raises(ValueError, match="op must be one of"):
        trace(lambda v: jax_gpuext.all_reduce(v, "i", op="mean"), xf)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        trace(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="ring"), xf)
    with pytest.raises(TypeError, match="not defined for bool"):
        trace(lambda v: jax_gpuext.all_reduce(v, "i"), xb)
    with pytest.raises(TypeError, match="needs a bool operand"):
        trace(lambda v: jax_gpuext.all_reduce(v, "i", op="or"), xf)
    with pytest.raises(TypeError, match="int16"):
        trace(lambda v: jax_gpuext.all_reduce(v, "i"), jnp.ones((N, 2), jnp.int16))
    with pytest.raises(ValueError, match="timeout_s"):
        trace(lambda v: jax_gpuext.all_reduce(v, "i", timeout_s=-1), xf)
    with pytest.raises(ValueError, match="not bound"):
        jax.make_jaxpr(lambda v: jax_gpuext.all_reduce(v, "i"))(xf)
    with pytest.raises(jax_gpuext.UnsupportedError, match="nvshmem_library"):
        trace(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="nvshmem_library"), xf)


def test_crossover_model():
    assert collectives.one_shot_max_bytes(2) > 1 << 40
    assert 128 << 10 <= collectives.one_shot_max_bytes(8) <= 512 << 10


# --------------------------------------------------------------------------- the GPU check's expectations (CPU)
def _load_script(path: pathlib.Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_library_refusals_come_from_one_predicate():
    """nvshmem_library refuses bool, float8 and float max/min (NaN propagation is not defined
    there) and takes everything else; the GPU worker expects exactly these refusals because it asks
    the same predicate, and its case count follows: 5 sizes x (2 kernels x 52 (dtype, op) pairs +
    the 32 pairs the library takes) = 680."""
    pairs = [(d, op) for d in DTYPES for op in OPS_BY_KIND["bool" if d == "bool" else "number"]]
    refused = {pair for pair in pairs if library_refusal(*pair)}
    floats = ("float32", "bfloat16", "float16", "float64")
    want = ({("bool", op) for op in OPS_BY_KIND["bool"]}
            | {(d, op) for d in ("float8_e4m3fn", "float8_e5m2") for op in OPS_BY_KIND["number"]}
            | {(d, op) for d in floats for op in ("max", "min")})
    assert refused == want
    assert "NaN" in library_refusal("float32", "max")
    worker = _load_script(REPO / "scripts" / "allreduce_mps_worker.py")
    assert worker.DTYPES == DTYPES and len(pairs) == 52 and len(pairs) - len(refused) == 32
    assert worker.expected_cases() == 680
    assert all(worker.library_refusal(*pair) == library_refusal(*pair) for pair in pairs)


def test_bench_allreduce_baselines_on_one_gpu_and_the_floor():
    """On one GPU (ranks sharing it) XLA's psum is not a baseline: NCCL refuses it; NVSHMEM's own
    reduction and the copy are. The floor is 2 * ranks * bytes at the best copy bandwidth; a row
    whose measurement failed keeps its error and shows as failed."""
    bench = _load_script(REPO / "benchmarks" / "bench_allreduce.py")
    assert bench.baselines(own_gpus=False) == ("nvshmem_library", "copy")
    assert bench.baselines(own_gpus=True) == ("nvshmem_library", "copy", "xla")
    assert "Duplicate GPU" in bench.NO_XLA_NOTE and ">= 2 GPUs" in bench.NO_XLA_NOTE
    rows = [{"bytes": 1024, "copy_us": 2.0, "one_shot_us": 9.0}, {"bytes": 1 << 20, "copy_us": 100.0},
            {"bytes": 8, "copy_error": "RuntimeError: boom"}]
    bench.add_floor(rows, 2)
    best = 2 * 2 * (1 << 20) / 100.0  # bytes per microsecond, the best of the run
    assert rows[1]["floor_us"] == pytest.approx(100.0)
    assert rows[0]["floor_us"] == pytest.approx(2 * 2 * 1024 / best) and rows[2]["floor_us"] == pytest.approx(32 / best)
    md = bench.markdown(rows, ("one_shot", "copy"), 2, ["a note"])
    assert "| 1024 | 9.0 | 2.0 |" in md and "| 8 | failed | failed |" in md and "- a note" in md


# --------------------------------------------------------------------------- NVSHMEM versions (CPU)
@pytest.mark.parametrize("built,host,ibgda,ok", [
    ((3, 4, 5), (3, 4, 5), False, True),
    ((3, 4, 5), (3, 8, 0), False, True),    # a newer host runs older device code (NVSHMEM 3.0's rule)
    ((3, 4, 5), (3, 4, 0), False, True),    # NVSHMEM compares minor versions only
    ((3, 8, 0), (3, 4, 5), False, False),   # "undefined symbol: nvshmem_selected_device_transport"
    ((3, 4, 5), (4, 0, 0), False, False),   # another major
    ((3, 4, 5), (2, 11, 0), False, False),
    ((3, 4, 5), None, False, False),
    (None, (3, 4, 5), False, False),
    ((3, 4, 5), (3, 5, 19), True, False),   # IBGDA's layout changed in 3.5.19
    ((3, 4, 5), (3, 5, 19), False, True),
    ((3, 5, 19), (3, 8, 0), True, True),
])
def test_nvshmem_version_verdict(built, host, ibgda, ok):
    from jax_gpuext.common import nvshmem_version

    got, reason = nvshmem_version.verdict(built, host, ibgda=ibgda)
    assert got == ok, reason
    if not ok and built is not None and host is not None:  # the refusal names both versions
        assert ".".join(map(str, built)) in reason and ".".join(map(str, host)) in reason


@pytest.fixture
def fake_nvshmem(monkeypatch):
    """A host library of a given version and a build record, with no NVSHMEM on this machine;
    importing _nvshmem is an error, so a verdict must come before it."""
    import types

    from jax_gpuext.common import extension, libs

    def setup(host, built):
        monkeypatch.setattr(libs, "load", lambda key: (object(), "/fake/libnvshmem_host.so.3"))
        monkeypatch.setattr(libs, "version", lambda key: (host, "/fake/libnvshmem_host.so.3"))
        monkeypatch.setattr(extension, "build_parts", lambda: {"nvshmem_allreduce": {
            "built": True, "detail": "_nvshmem against NVSHMEM " + built, "version": built}})

        def no_import(name):
            raise AssertionError(f"imported {name} before checking the NVSHMEM versions")

        monkeypatch.setattr(extension, "importlib", types.SimpleNamespace(import_module=no_import))
        extension.load_nvshmem.cache_clear()
        return extension

    yield setup
    from jax_gpuext.common import extension

    extension.load_nvshmem.cache_clear()


def _report(extension):
    from jax_gpuext.common import nvshmem_version

    return nvshmem_version.report(extension.nvshmem_built_against())


def test_older_host_nvshmem_is_refused_before_the_import(fake_nvshmem):
    extension = fake_nvshmem((3, 3, 9), "3.4.5")
    mod, why = extension.load_nvshmem()
    assert mod is None and "3.3.9" in why and "3.4.5" in why and ">= 3.4.5" in why
    assert _report(extension) == {"built_against": "3.4.5", "host": "3.3.9", "host_where": "/fake/libnvshmem_host.so.3",
                                  "compatible": False, "reason": why}


def test_newer_host_nvshmem_is_accepted_and_info_says_so(fake_nvshmem):
    from jax_gpuext.common.capabilities import format_table

    extension = fake_nvshmem((3, 8, 0), "3.4.5")
    with pytest.raises(AssertionError, match="imported jax_gpuext._nvshmem"):  # the check passed: it imports
        extension.load_nvshmem()
    v = _report(extension)
    assert v["compatible"] and v["built_against"] == "3.4.5" and v["host"] == "3.8.0"
    report = {"python": "3", "jax": "j", "jaxlib": "j", "jaxlib_ffi_api": "0.1", "cuda_driver": None, "extensions": {},
              "build_source": {"commit": "abc", "dirty": True}, "devices": [], "libraries": {}, "nvshmem": v,
              "gates": {"g": {"supported": True, "reason": "r"}},
              "verified": {"allow_unverified": False, "backends": {"b": {"architectures": {}, "here": {
                  "verified": False, "reason": "r"}}}}}
    text = format_table(report)
    assert "built against 3.4.5, host 3.8.0: compatible" in text and "commit abc with uncommitted changes" in text


# --------------------------------------------------------------------------- GPU (one H100, MPS)
@pytest.mark.verifies("all_reduce.one_shot", "all_reduce.two_shot", "all_reduce.nvshmem_library", mode="plain")
@pytest.mark.verifies("all_reduce.graph_safe", mode="command_buffer")
@pytest.mark.verifies("all_reduce.one_shot", mode="timeout")  # the timeout check runs one_shot
@pytest.mark.gpu
@pytest.mark.multiprocess
@pytest.mark.gates("nvshmem", "nvshmem_allreduce_module")
@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("mode", ["plain", "command_buffer", "timeout"])
def test_gpu_processes_under_mps(nproc, mode):
    """scripts/run_allreduce_mps.sh starts an MPS daemon, runs nproc ranks, checks vs NumPy."""
    bound = mps_test_bound()
    script = REPO / "scripts" / "run_allreduce_mps.sh"
    env = {**os.environ, "PYTHON": sys.executable, "WORKER_TIMEOUT_S": str(worker_bound(bound))}
    rc, out, err = run_in_own_session(["bash", str(script), str(nproc), mode], bound, env)
    if rc is None:
        pytest.fail(f"run_allreduce_mps.sh timed out after {bound:.0f} s\nstdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    if rc == 3:  # the script's environment status: not a failure of our code
        why = [ln for ln in err.splitlines() if ln.startswith("ENVIRONMENT:")]
        pytest.fail(f"ENVIRONMENT: this machine cannot run {nproc} ranks under MPS: {why}\nstderr:\n{err[-2000:]}")
    assert rc == 0, f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}"
    assert out.count("RANK OK") == nproc


# Bounds nest, so that a hang is stopped by the innermost one and leaves nothing running into the
# next step: each rank (WORKER_TIMEOUT_S) < this test (JAX_GPUEXT_MPS_TEST_TIMEOUT_S, set by
# scripts/gpu_run.sh from its step's bound) < the step. The margin between rank and test covers
# what run_allreduce_mps.sh spends around its ranks at worst: the MPS daemon's start (MPS_WAIT_S,
# 8 s, + 2 s), a rank's SIGKILL 5 s after its SIGTERM, the daemon's stop (5 s) and the rest.
MPS_MARGIN_S = 25.0
STOP_GRACE_S = 10.0  # SIGTERM (the script's trap kills the ranks, stops MPS) before SIGKILL


def mps_test_bound() -> float:
    return env_vars.get("JAX_GPUEXT_MPS_TEST_TIMEOUT_S")  # 600 s when unset (jax_gpuext/common/env.py)


def worker_bound(test_bound: float) -> int:
    return max(10, int(test_bound - MPS_MARGIN_S))


def run_in_own_session(cmd, bound: float, env) -> tuple[int | None, str, str]:
    """Runs ``cmd`` in a session of its own: ``(exit status, stdout, stderr)``, status None when it
    ran past ``bound``. Whenever it is left behind (the bound, or pytest interrupted at its group's
    bound), its whole process group gets SIGTERM, so the script's trap stops its ranks and the MPS
    daemon, then SIGKILL."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=bound)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        out, err = _stop_session(p)
        return None, out, err
    except BaseException:
        _stop_session(p)
        raise


def _stop_session(p: subprocess.Popen) -> tuple[str, str]:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        return p.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        return p.communicate()


def test_mps_bounds_nest_and_a_hang_is_stopped(tmp_path):
    """CPU: rank bound < test bound, and a child that hangs (ignoring nothing) is stopped at the
    bound with its whole session, grandchildren included."""
    assert worker_bound(100) + MPS_MARGIN_S <= 100 and worker_bound(600) < 600
    marker = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    rc, _, _ = run_in_own_session(["bash", "-c", f"sleep 300 & echo $! > {marker}; wait"], 2.0, dict(os.environ))
    assert rc is None and time.monotonic() - t0 < 2.0 + STOP_GRACE_S
    grandchild = int(marker.read_text())
    for _ in range(50):  # the kill is asynchronous; a zombie waiting for its reaper counts as stopped
        try:
            if pathlib.Path(f"/proc/{grandchild}/stat").read_text().split(")")[-1].split()[0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hung command's child {grandchild} survived the stop")


# --------------------------------------------------------------------------- memory spaces (issue 7)
@pytest.mark.gates("jaxlib_custom_call_memory_spaces")
def test_operand_and_result_spaces_reach_the_cuda_lowering(mesh):
    """all_reduce's buffers in XLA's collective memory: the annotation is in the CUDA lowering
    (lowered ahead of time here, no GPU needed) and absent from the CPU one, which still runs."""
    from jax_gpuext import MemorySpace

    x = jax.device_put(np.arange(N * 4, dtype=np.float32), NamedSharding(mesh, P("i")))
    f = _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="one_shot",
                                                   operand_spaces={0: MemorySpace.COLLECTIVE},
                                                   result_spaces={0: MemorySpace.COLLECTIVE}), mesh, P("i"), P("i"))
    cuda_text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "gpuext_all_reduce" in cuda_text
    assert 'operands_memory_spaces = "{0:1}"' in cuda_text, cuda_text
    assert 'results_memory_spaces = "{0:1}"' in cuda_text
    assert "memory_spaces" not in f.lower(x).as_text()
    np.testing.assert_array_equal(np.asarray(f(x)), np.tile(np.asarray(x).reshape(N, 4).sum(0), N))


def test_spaces_with_the_xla_backend_are_reported_or_refused(mesh):
    from jax_gpuext import MemorySpace, UnsupportedError

    x = jax.device_put(np.ones(N, np.float32), NamedSharding(mesh, P("i")))
    reduce = lambda v, **kw: jax_gpuext.all_reduce(v, "i", algorithm="xla",  # noqa: E731
                                                   operand_spaces={0: MemorySpace.COLLECTIVE}, **kw)
    report = jax_gpuext.explain(_shard_map(reduce, mesh, P("i"), P("i")), x)
    assert any("memory spaces are ignored" in n for n in report.calls[0].notes), str(report)
    with pytest.raises(UnsupportedError, match="memory spaces are ignored"):
        _shard_map(lambda v: reduce(v, strict_spaces=True), mesh, P("i"), P("i")).lower(x)


def test_space_arguments_are_validated(mesh):
    from jax_gpuext import MemorySpace

    x = jax.device_put(np.ones(N, np.float32), NamedSharding(mesh, P("i")))
    with pytest.raises(ValueError, match="index 1 is out of range"):
        _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="one_shot",
                                                   operand_spaces={1: MemorySpace.TEMP}), mesh, P("i"), P("i")).lower(x)
    with pytest.raises(TypeError, match="must be a jax_gpuext.MemorySpace"):
        _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="one_shot", result_spaces={0: 1.5}),
                   mesh, P("i"), P("i")).lower(x)


# --------------------------------------------------------------------------- issue 15
@pytest.mark.parametrize("algorithm", ["auto", "xla", "one_shot", "two_shot"])
def test_arguments_are_refused_alike_on_every_backend(mesh, algorithm):
    """Finding 7: validation runs before a backend is chosen, so the xla fallback refuses what
    the custom-call backends refuse (it used to drop PINNED_HOST with a warning)."""
    from jax_gpuext import MemorySpace

    x = jax.device_put(np.ones(N, np.float32), NamedSharding(mesh, P("i")))

    def lower(**kw):
        return _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm=algorithm, **kw), mesh, P("i"),
                          P("i")).lower(x)

    with pytest.raises(ValueError, match="PINNED_HOST, which XLA rejects on custom calls"):
        lower(operand_spaces={0: MemorySpace.PINNED_HOST})
    with pytest.raises(ValueError, match="PINNED_HOST, which XLA rejects on custom calls"):
        lower(result_spaces={0: MemorySpace.PINNED_HOST})
    with pytest.raises(ValueError, match="conflicting requests for operand 0"):
        lower(operand_spaces={0: MemorySpace.COLLECTIVE, -1: MemorySpace.TEMP})
    with pytest.raises(ValueError, match="index 1 is out of range"):
        lower(result_spaces={1: MemorySpace.TEMP})
    with pytest.raises(TypeError, match="strict_spaces must be a bool"):
        lower(strict_spaces="yes")


def test_repeated_axis_name_is_a_trace_time_error():
    """Finding 3: ("x", "x") aborted the process in the MLIR lowering (auto and xla); a fresh
    process, so that a regression is a failed test rather than a dead pytest."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import PartitionSpec as P
        import jax_gpuext
        mesh = jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices()[:4])
        def lower(axes, algorithm):
            f = jax.shard_map(lambda v: jax_gpuext.all_reduce(v, axes, algorithm=algorithm), mesh=mesh,
                              in_specs=P(("x", "y")), out_specs=P(("x", "y")), check_vma=False)
            return jax.jit(f).lower(jax.device_put(jnp.ones(8), jax.NamedSharding(mesh, P(("x", "y")))))
        for algorithm in ("auto", "xla", "one_shot"):
            for axes, exc, match in ((("x", "x"), ValueError, "repeats ['x']"),
                                     (["y", "x", "y"], ValueError, "repeats ['y']"),
                                     ((), ValueError, "axis_name is empty"),
                                     (("x", 3), TypeError, "int 3 is not a str"),
                                     (None, TypeError, "must be a str"),
                                     ("z", ValueError, "not bound")):
                try:
                    lower(axes, algorithm)
                except exc as e:
                    assert match in str(e), (axes, str(e))
                else:
                    raise AssertionError(f"{axes!r} accepted under {algorithm}")
        print("OK")
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                       cwd=os.path.dirname(sys.executable))  # not the source tree: the installed package
    assert p.returncode == 0 and "OK" in p.stdout, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


NAN_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float64")


@pytest.mark.parametrize("algorithm", ["auto", "xla", "one_shot", "two_shot"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("nan_ranks", [(3,), (0, 5, 7), tuple(range(N))])
def test_max_min_propagate_nan_on_every_backend(mesh, algorithm, op, nan_ranks):
    """Finding 4: NaN wins in max/min, as in jnp.max / jnp.min (a float64 NumPy model), on
    every backend -- the xla fallback (what auto picks on CPU) dropped it."""
    rng = np.random.default_rng(len(nan_ranks))
    f = _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", op=op, algorithm=algorithm), mesh, P("i"), P("i"))
    with _enable_x64():
        for dtype in NAN_DTYPES:
            v = rng.integers(-20, 21, (N, 6)).astype(np.float64)
            v[list(nan_ranks), 1] = np.nan  # element 1: NaN on the given ranks
            v[nan_ranks[0], 4] = np.nan  # element 4: NaN on one rank only
            v[:, 5] = np.inf if op == "max" else -np.inf  # infinities do not hide a NaN either
            v[nan_ranks[-1], 5] = np.nan
            if dtype == "float8_e4m3fn":  # no infinities in e4m3fn: its extreme finite value
                v[np.isinf(v)] = np.sign(v[np.isinf(v)]) * 448
            x = v.astype(jnp.dtype(dtype))
            want = getattr(np, op)(x.astype(np.float64), axis=0)  # np.max/np.min: NaN wins
            got = np.asarray(f(jax.device_put(x.reshape(-1), NamedSharding(mesh, P("i"))))).reshape(N, 6)
            for r in range(N):
                np.testing.assert_array_equal(got[r].astype(np.float64), want, err_msg=f"{dtype} rank {r}")



@pytest.mark.gpu
@pytest.mark.gates("nvshmem", "nvshmem_allreduce_module", "jaxlib_custom_call_memory_spaces")
def test_gpu_collective_space_reaches_the_compiled_program(monkeypatch):
    """One process, one GPU (a group of one PE): compiling all_reduce with COLLECTIVE operand and
    result puts both buffers in XLA's collective memory, S(1), in the optimized HLO."""
    from jax_gpuext import MemorySpace

    # This module's autouse fixture sizes the CPU protocol's workspace (512 B); the first CUDA
    # all_reduce initializes NVSHMEM lazily with the variable's value, which CUDA refuses below
    # 4096 (issue 33). Unset: NVSHMEM gets its default workspace.
    monkeypatch.delenv(collectives.WORKSPACE_ENV)

    gpu_mesh = jax.make_mesh((1,), ("i",), devices=jax.devices("cuda")[:1])
    x = jax.device_put(np.arange(256, dtype=np.float32), NamedSharding(gpu_mesh, P("i")))
    f = _shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="one_shot",
                                                   operand_spaces={0: MemorySpace.COLLECTIVE},
                                                   result_spaces={0: MemorySpace.COLLECTIVE}), gpu_mesh, P("i"), P("i"))
    hlo = f.lower(x).compile().as_text()
    calls = [line for line in hlo.splitlines() if "gpuext_all_reduce" in line]
    assert calls and all("S(1)" in line for line in calls), "\n".join(calls) or hlo
    np.testing.assert_array_equal(np.asarray(f(x)), np.arange(256, dtype=np.float32))
