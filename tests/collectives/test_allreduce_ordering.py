"""All-reduce under CUDA command buffers (issue 14 item 8): the kernels share one epoch, counters
and slots, so XLA's CONCURRENT command-buffer scheduling (which orders captured commands by their
XLA buffers only) could run two independent calls at once. Detected at trace time and refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import jax_gpuext
from jax_gpuext import collectives
from jax_gpuext.common import backends, gates
from jax_gpuext.common.gates import GateResult

GRAPH = {collectives.GRAPH_SAFE_ENV: "1"}
CONCURRENT = "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT"


@pytest.mark.parametrize("env,ok", [
    ({}, True),  # the checked target is never captured
    ({"XLA_FLAGS": CONCURRENT}, True),
    (GRAPH, True),  # LHS, the default
    ({**GRAPH, "XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=LHS"}, True),
    ({**GRAPH, "XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=SERIALIZE --xla_gpu_graph_min_graph_size=1"}, True),
    ({**GRAPH, "XLA_FLAGS": "--xla_gpu_graph_min_graph_size=1 " + CONCURRENT}, False),
    ({**GRAPH, "XLA_FLAGS": "-xla_gpu_command_buffer_scheduling_mode=concurrent"}, False),
    ({**GRAPH, "XLA_FLAGS": CONCURRENT + " --xla_gpu_command_buffer_scheduling_mode=LHS"}, True),  # last one wins
    ({collectives.GRAPH_SAFE_ENV: "0", "XLA_FLAGS": CONCURRENT}, True),
])
def test_command_buffer_ordering(env, ok):
    r = collectives.command_buffer_ordering(env)
    assert r.supported == ok, r.reason
    if not ok:
        assert "CONCURRENT" in r.reason and collectives.GRAPH_SAFE_ENV in r.reason


@pytest.fixture
def cuda_kernels_available(monkeypatch):
    """Every gate the CUDA kernels need, opened: what is left to decide is the scheduling mode."""
    monkeypatch.setattr(gates, "check_all", lambda names: GateResult(True, "opened for the test"))


def test_a_named_kernel_under_concurrent_scheduling_raises_at_trace_time(monkeypatch, cuda_kernels_available):
    monkeypatch.setenv(collectives.GRAPH_SAFE_ENV, "1")
    monkeypatch.setenv("XLA_FLAGS", CONCURRENT)
    mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
    f = jax.shard_map(lambda v: jax_gpuext.all_reduce(v, "i", algorithm="one_shot"), mesh=mesh, in_specs=P(),
                      out_specs=P(), check_vma=False)
    with backends.platform("cuda"), pytest.raises(jax_gpuext.UnsupportedError, match="CONCURRENT"):
        jax.make_jaxpr(f)(jnp.ones((2, 4)))


def test_auto_under_concurrent_scheduling_falls_back_visibly(monkeypatch, cuda_kernels_available):
    monkeypatch.setenv(collectives.GRAPH_SAFE_ENV, "1")
    monkeypatch.setenv("XLA_FLAGS", CONCURRENT)
    p = collectives.Problem("cuda", jnp.dtype(jnp.float32), "sum", 64, 2, True)
    sel = backends.select(collectives.OP, "auto", problem=p)
    assert sel.chosen == "xla" and sel.fallback
    assert all("CONCURRENT" in why for name, why in sel.rejected if name in ("one_shot", "two_shot"))
