"""all_reduce of an empty operand (issue 33).

The first GPU run (jaxlib 0.11.2) segfaulted inside XLA while compiling the GPU check's plain
program (scripts/allreduce_mps_worker.py: every algorithm on sizes 0, 1, 37, 1000, 786432 in one
jit). The cause, reproduced on a CPU machine (a deviceless sm_90 compile of that program, and
plainly on XLA:CPU): jaxlib 0.11.2 crashes compiling a shard_map whose empty operand flows into
its results beside non-empty values, e.g. ``shard_map(lambda a, b: (a, b * 2))`` with ``a`` empty
(0.10.2, 0.11.0, 0.11.1 and 0.12.0.1 do not). all_reduce returned its empty operand itself, so the
operand reached the program's results. It now returns an empty
array built from nothing: the operand is unused and JAX drops it from the shard_map. These tests
lower that exact program for CUDA (no GPU needed) and check that no empty value is used inside the
shard_map and that no custom call or collective sees an empty buffer.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import re

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_gpuext
from jax_gpuext.collectives import distributed
from jax_gpuext.common import backends, gates
from jax_gpuext.common.gates import GateResult

REPO = pathlib.Path(__file__).resolve().parents[2]
_enable_x64 = jax.enable_x64 if hasattr(jax, "enable_x64") else jax.experimental.enable_x64
ar = importlib.import_module("jax_gpuext.collectives.all_reduce")  # the module, not the function


def _worker():
    spec = importlib.util.spec_from_file_location("allreduce_mps_worker", REPO / "scripts" / "allreduce_mps_worker.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports only argparse/os/sys at module level
    return mod


@pytest.fixture
def cuda_selection(monkeypatch):
    """Backends are chosen as on a CUDA machine with NVSHMEM (one_shot, two_shot and
    nvshmem_library are taken), for lowering only: nothing runs, nothing initializes NVSHMEM."""
    monkeypatch.setattr(ar, "_cuda_kernel_checks", lambda p: GateResult(True, "test: lowering for CUDA only"))
    real = gates.check
    monkeypatch.setattr(gates, "check", lambda n: GateResult(True, "test") if n == "nvshmem" else real(n))
    monkeypatch.setattr(distributed, "ensure_initialized", lambda: None)
    monkeypatch.setattr(distributed, "workspace_bytes", lambda: 1 << 20)
    with backends.platform("cuda"):
        yield


# --------------------------------------------------------------------------- StableHLO predicates
_ZERO_SIZE = re.compile(r"tensor<(?:\d+x)*0x")  # tensor<0xf32>, tensor<2x0xi8>; not tensor<10xf32>
_VALUE_TYPE = re.compile(r"(%[\w#.]+): (tensor<[^>]*>)")


def empty_values_used_in_shard_map(text: str) -> list[str]:
    """Zero-size values that enter a shard_map body and are used there: what jaxlib 0.11.2 fails to
    compile (when they flow into the results beside non-empty values). Shardy lowers the body as the region of ``sdy.manual_computation`` (its block
    arguments are the operands); older lowerings turn each operand into a
    ``custom_call @SPMDFullToShardShape`` result. Either way, such a value may be declared but never
    referenced."""
    entering = []
    for line in text.splitlines():
        if "sdy.manual_computation" in line and "manual_axes" in line:
            args = line[line.rindex("manual_axes"):]
            entering += [name for name, ty in _VALUE_TYPE.findall(args) if _ZERO_SIZE.match(ty)]
        m = re.match(r"\s*(%[\w#.]+) = stablehlo\.custom_call @SPMDFullToShardShape\(.*-> (tensor<[^>]*>)", line)
        if m and _ZERO_SIZE.match(m.group(2)):
            entering.append(m.group(1))
    return [name for name in entering
            if len(re.findall(re.escape(name) + r"(?![\w#.])", text)) > 1]  # more than its declaration


def calls_touching_empty_buffers(text: str, targets=("gpuext_",)) -> list[str]:
    """Custom calls of ours, and XLA collectives, with a zero-size operand or result."""
    bad = []
    for line in text.splitlines():
        ours = any(f"custom_call @{t}" in line for t in targets)
        collective = re.search(r"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute)",
                               line)
        if (ours or collective) and _ZERO_SIZE.search(line.split(":")[-1] if ours else line):
            bad.append(line.strip())
    return bad


def test_predicates_see_the_construct():
    """The predicates flag what issue 33's program had (an empty operand returned as is) and what a
    bare shard_map needs to crash jaxlib 0.11.2; they pass what does not use the empty operand."""
    mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
    empty = jax.ShapeDtypeStruct((0,), jnp.float32, sharding=NamedSharding(mesh, P("i")))
    full = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=NamedSharding(mesh, P("i")))

    def lowered(body):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")), out_specs=(P("i"), P("i")),
                                  check_vma=False))
        return f.trace(empty, full).lower(lowering_platforms=("cuda",)).as_text()

    assert empty_values_used_in_shard_map(lowered(lambda a, b: (a, b * 2)))
    assert empty_values_used_in_shard_map(lowered(lambda a, b: (-a, b + jnp.sum(a))))
    assert not empty_values_used_in_shard_map(lowered(lambda a, b: (jnp.zeros_like(a), b * 2)))
    assert calls_touching_empty_buffers("%3 = stablehlo.custom_call @gpuext_all_reduce(%a, %r, %c) {x} : "
                                        "(tensor<0xf32>, tensor<i32>, tensor<i32>) -> tensor<0xf32>")
    assert not calls_touching_empty_buffers("%3 = stablehlo.custom_call @gpuext_all_reduce(%a, %r, %c) {x} : "
                                            "(tensor<10xf32>, tensor<i32>, tensor<i32>) -> tensor<10xf32>")


# --------------------------------------------------------------------------- the GPU check's program
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("bool", "or"), ("int64", "prod")])
def test_worker_plain_program_lowered_for_cuda(cuda_selection, dtype, op):
    """scripts/allreduce_mps_worker.py's plain program, exactly, lowered for CUDA with the backends a
    GPU machine takes: every non-empty size reaches our custom call once per algorithm; the empty
    operand is used nowhere (it was returned as is, which jaxlib 0.11.2 failed to compile)."""
    worker = _worker()
    with _enable_x64(True):  # the worker turns x64 on (64-bit dtypes, and it changes index types)
        mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
        sharding = NamedSharding(mesh, P("i"))
        xs = [jax.ShapeDtypeStruct((2 * s,), jnp.dtype(dtype), sharding=sharding) for s in worker.SIZES]
        algorithms = worker.KERNELS + (("nvshmem_library",) if worker.library_refusal(dtype, op) is None else ())
        f = worker.plain_program(mesh, op, algorithms, len(xs))
        text = f.trace(*xs).lower(lowering_platforms=("cuda",)).as_text()
    assert 0 in worker.SIZES, "the GPU check must keep mixing the empty operand with the others"
    assert empty_values_used_in_shard_map(text) == []
    assert calls_touching_empty_buffers(text) == []
    calls = [l for l in text.splitlines() if "custom_call @gpuext_all_reduce(" in l]
    nonempty = sum(1 for s in worker.SIZES if s)
    assert len(calls) == nonempty * len(algorithms), calls
    for code in (ar.ALGORITHM_CODES[a] for a in algorithms):
        assert sum(f"algorithm = {code} : i32" in l for l in calls) == nonempty


# --------------------------------------------------------------------------- every path, on CPU
N = 8


@pytest.fixture(scope="module")
def mesh8():
    if jax.device_count() < N:
        pytest.fail(f"need {N} host devices (tests/conftest.py sets them), have {jax.device_count()}")
    return jax.make_mesh((N,), ("i",), devices=jax.devices()[:N])


@pytest.mark.parametrize("algorithm", ["auto", "xla", "reference", "one_shot", "two_shot"])
def test_empty_operand_is_unused_on_every_backend(mesh8, algorithm):
    """An empty operand beside a non-empty one, on every backend: the result is empty, typed like
    the operand; no collective and no custom call gets an empty buffer; the empty operand is not used
    inside the shard_map; gradients flow (an empty gradient); explain says why nothing ran."""
    empty = jax.device_put(np.zeros(0, np.float32), NamedSharding(mesh8, P("i")))
    full = jax.device_put(np.arange(N * 3, dtype=np.float32), NamedSharding(mesh8, P("i")))

    def body(a, b):
        return (jax_gpuext.all_reduce(a, "i", algorithm=algorithm),
                jax_gpuext.all_reduce(b, "i", algorithm=algorithm))

    f = jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=(P("i"), P("i")), out_specs=(P("i"), P("i")),
                              check_vma=False))
    for platforms in (("cuda",), ("cpu",)):
        text = f.trace(empty, full).lower(lowering_platforms=platforms).as_text()
        assert empty_values_used_in_shard_map(text) == [], (platforms, text)
        assert calls_touching_empty_buffers(text) == [], (platforms, text)
    got_empty, got_full = f(empty, full)
    assert got_empty.shape == (0,) and got_empty.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got_full), np.tile(np.arange(N * 3).reshape(N, 3).sum(0), N))

    grad = jax.jit(jax.grad(lambda a, b: sum(jnp.sum(o) for o in f(a, b)), argnums=(0, 1)))(empty, full)
    assert grad[0].shape == (0,)
    np.testing.assert_array_equal(np.asarray(grad[1]), np.full(N * 3, N, np.float32))

    report = jax_gpuext.explain(jax.shard_map(lambda a: jax_gpuext.all_reduce(a, "i", algorithm=algorithm),
                                              mesh=mesh8, in_specs=P("i"), out_specs=P("i"), check_vma=False), empty)
    assert any("zero-size operand" in n for c in report.calls for n in c.notes), str(report)


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
def test_vmap_over_an_empty_batch_binds_no_custom_call(mesh8, algorithm):
    """vmap over a batch of 0: all_reduce sees a non-empty example, our batching rule then has an
    empty batch; the lowering emits no custom call on it (the one place that emits it checks)."""
    x = jax.device_put(np.zeros((N, 0, 5), np.float32), NamedSharding(mesh8, P("i")))
    inner = jax.vmap(lambda v: jax_gpuext.all_reduce(v, "i", algorithm=algorithm), in_axes=0)
    f = jax.jit(jax.shard_map(lambda v: inner(v[0])[None], mesh=mesh8, in_specs=P("i"), out_specs=P("i"),
                              check_vma=False))
    text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "custom_call @gpuext_all_reduce" not in text and calls_touching_empty_buffers(text) == []
    assert f(x).shape == (N, 0, 5)


@pytest.mark.parametrize("algorithm", ["one_shot", "xla"])
def test_check_vma_types_the_empty_result_like_a_kernel_result(mesh8, algorithm):
    """Under check_vma the empty result has the operand's type, varying axes included, as the
    kernels' results have (their abstract value is the operand's): a fresh jnp.zeros would not."""
    if not hasattr(jax, "typeof"):
        pytest.skip("this jax has no varying-axes types")
    empty = jax.device_put(np.zeros(0, np.float32), NamedSharding(mesh8, P("i")))
    full = jax.device_put(np.ones(N * 2, np.float32), NamedSharding(mesh8, P("i")))
    types = {}

    def body(a):
        out = jax_gpuext.all_reduce(a, "i", algorithm=algorithm)
        types[a.size] = (str(jax.typeof(a)), str(jax.typeof(out)), str(jax.typeof(jnp.zeros(a.shape, a.dtype))))
        return out

    f = jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("i"), out_specs=P("i")))
    assert f(empty).shape == (0,)
    operand, result, fresh = types[0]
    assert result == operand and fresh != operand, types
    if algorithm == "one_shot":  # the kernel's non-empty result is typed like its operand too
        f(full)
        assert types[2][1] == types[2][0], types
