"""Memory spaces (issue 7): the annotation strings, validation, gates, per-platform lowering,
and place() round trips. CPU tests lower ahead of time for CUDA (no GPU needed); the
@pytest.mark.gpu tests check the compiled HLO on a GPU."""

from __future__ import annotations

import logging
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gpuext
from jax_gpuext import UnsupportedError
from jax_gpuext.common import backends, gates
from jax_gpuext.memory import spaces as memory
from jax_gpuext.memory import MemorySpace, place

GATE = memory.GATE
needs_memory_spaces = pytest.mark.gates(GATE)


def _lower(f, *args, platforms=("cuda",)) -> str:
    # Traced.lower(lowering_platforms=...) exists from jax 0.7.0 to 0.12 and needs no GPU.
    return jax.jit(f).trace(*args).lower(lowering_platforms=platforms).as_text()


def _calls(text: str, target: str) -> list[str]:
    return [l for l in text.splitlines() if f"custom_call @{target}(" in l]


def _fake_call(*args, **kw):
    """Two results from a target that is only lowered, never run."""
    shape = jax.ShapeDtypeStruct(args[0].shape, args[0].dtype)
    return memory.ffi_call("gpuext_test_only", [shape, shape], *args, **kw)


@pytest.fixture
def closed_gate(monkeypatch):
    real = gates.check

    def check(name):
        if name == GATE:
            return gates.GateResult(False, "jaxlib 0.9.0 < 0.10.0 (monkeypatched)")
        return real(name)

    monkeypatch.setattr(gates, "check", check)
    memory._warned.clear()


# --------------------------------------------------------------------------- attribute strings
@needs_memory_spaces
def test_place_collective_lowers_exact_attribute_for_cuda():
    text = _lower(lambda x: place(x, MemorySpace.COLLECTIVE), jnp.ones(4, jnp.float32))
    (call,) = _calls(text, "gpuext_place")
    assert 'mhlo.frontend_attributes = {results_memory_spaces = "{0:1}"}' in call
    assert "operands_memory_spaces" not in call


@needs_memory_spaces
def test_helper_lowers_both_attributes_sorted():
    x = jnp.ones(4, jnp.float32)
    text = _lower(lambda x, y: _fake_call(x, y, operand_spaces={1: MemorySpace.COLLECTIVE},
                                          result_spaces={1: MemorySpace.COLLECTIVE, 0: "temp"}), x, x)
    (call,) = _calls(text, "gpuext_test_only")
    assert 'operands_memory_spaces = "{1:1}"' in call
    assert 'results_memory_spaces = "{0:2,1:1}"' in call


def test_handler_attributes_named_like_the_helpers_keywords():
    """Handler attributes called `strict` or `caller` go in `attributes=`; they reach the custom
    call as attributes, while the helper's own keywords keep their meaning."""
    x = jnp.ones(4, jnp.float32)
    text = _lower(lambda x: _fake_call(x, attributes={"strict": np.int32(7), "caller": "me"}, scale=np.float32(2)),
                  x)
    (call,) = _calls(text, "gpuext_test_only")
    assert "strict = 7 : i32" in call and 'caller = "me"' in call and "scale = 2.0" in call
    with pytest.raises(ValueError, match=r"\['scale'\] given both as keywords and in `attributes`"):
        _fake_call(x, attributes={"scale": np.float32(1)}, scale=np.float32(2))


@needs_memory_spaces
def test_device_entries_and_negative_indices():
    x = jnp.ones(4, jnp.float32)
    text = _lower(lambda x, y: _fake_call(x, y, operand_spaces={-1: 1, 0: MemorySpace.DEVICE}), x, x)
    (call,) = _calls(text, "gpuext_test_only")
    assert 'operands_memory_spaces = "{1:1}"' in call and "results_memory_spaces" not in call
    text = _lower(lambda x, y: _fake_call(x, y, operand_spaces={0: MemorySpace.DEVICE}), x, x)
    assert "mhlo.frontend_attributes" not in _calls(text, "gpuext_test_only")[0]


@needs_memory_spaces
def test_alias_propagates_space_to_the_other_side():
    x = jnp.ones(4, jnp.float32)
    text = _lower(lambda x, y: _fake_call(x, y, result_spaces={1: MemorySpace.COLLECTIVE},
                                          input_output_aliases={0: 1}), x, x)
    (call,) = _calls(text, "gpuext_test_only")
    assert 'operands_memory_spaces = "{0:1}"' in call and 'results_memory_spaces = "{1:1}"' in call
    assert "output_operand_aliases" in call


@needs_memory_spaces
def test_decided_per_lowering_platform():
    x = jnp.ones(4, jnp.float32)
    f = lambda x: place(x, MemorySpace.TEMP)  # noqa: E731
    assert "mhlo.frontend_attributes" not in _calls(_lower(f, x, platforms=("cpu",)), "gpuext_place")[0]
    both = _calls(_lower(f, x, platforms=("cpu", "cuda")), "gpuext_place")
    assert len(both) == 2
    assert sum('results_memory_spaces = "{0:2}"' in c for c in both) == 1


@needs_memory_spaces
def test_slice_fusion_shield(monkeypatch):
    # openxla/xla#47461: the CUDA lowering keeps a slice producer and a DUS consumer from
    # being fused with the annotated call (that fusion drops the colouring).
    x = jnp.arange(8, dtype=jnp.float32)
    f = lambda x: place(x[1:5], MemorySpace.COLLECTIVE)  # noqa: E731
    text = _lower(f, x)
    assert re.search(r"optimization_barrier.*\n.*custom_call @gpuext_place.*\n.*optimization_barrier", text)
    monkeypatch.setenv(memory.SHIELD_ENV, "0")
    g = lambda x: place(x[1:5], MemorySpace.COLLECTIVE)  # noqa: E731  (new function: no lowering cache)
    assert "optimization_barrier" not in _lower(g, x)
    monkeypatch.delenv(memory.SHIELD_ENV)
    assert "optimization_barrier" not in _lower(f, x, platforms=("cpu",))


# --------------------------------------------------------------------------- values on CPU
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8, jnp.bool_, ml_dtypes.float8_e4m3fn])
@pytest.mark.parametrize("shape", [(), (0,), (3, 5)])
def test_place_round_trips_values_on_cpu(dtype, shape):
    x = (np.arange(int(np.prod(shape))).reshape(shape) % 7).astype(dtype)
    for space in (MemorySpace.COLLECTIVE, MemorySpace.TEMP, MemorySpace.DEVICE):
        y = jax.jit(lambda x: place(x, space))(x)
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(np.asarray(y), x)


def test_place_eager_vmap_grad_on_cpu():
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    np.testing.assert_array_equal(place(x, MemorySpace.TEMP), x)
    np.testing.assert_array_equal(jax.vmap(lambda r: place(r, MemorySpace.COLLECTIVE))(x), x)
    g = jax.jit(jax.grad(lambda x: (place(x * 3, MemorySpace.COLLECTIVE) ** 2).sum()))(x)
    np.testing.assert_allclose(g, 18 * x)


def test_helper_runs_on_cpu_sequential_vmap():
    x = jnp.arange(8, dtype=jnp.float32).reshape(2, 4)
    call = lambda r: memory.ffi_call(  # noqa: E731
        memory.PLACE_TARGET, jax.ShapeDtypeStruct(r.shape, r.dtype), r, result_spaces={0: 1})
    np.testing.assert_array_equal(jax.jit(jax.vmap(call))(x), x)
    with pytest.raises(ValueError, match="vmap"):
        jax.vmap(lambda r: memory.ffi_call(memory.PLACE_TARGET, jax.ShapeDtypeStruct(r.shape, r.dtype),
                                           r, vmap_method=None))(x)


@pytest.mark.gates("jax_memory_space_api")
def test_place_pinned_host_on_cpu():
    x = jnp.arange(4, dtype=jnp.float32)
    f = lambda x: place(x * 2, MemorySpace.PINNED_HOST)  # noqa: E731
    y = jax.jit(f)(x)
    assert y.sharding.memory_kind == "pinned_host"
    np.testing.assert_array_equal(y, x * 2)
    assert '_xla_buffer_placement = "pinned_host"' in _lower(f, x)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw, exc, match", [
    (dict(result_spaces={0: MemorySpace.PINNED_HOST}), ValueError, "rejects on custom calls"),
    (dict(operand_spaces={2: 1}), ValueError, "out of range"),
    (dict(result_spaces={-3: 1}), ValueError, "out of range"),
    (dict(operand_spaces={0: 1, -2: 2}), ValueError, "conflicting"),
    (dict(operand_spaces={0: 2}, result_spaces={1: 1}, input_output_aliases={0: 1}), ValueError,
     "different memory spaces"),
    (dict(operand_spaces={"0": 1}), TypeError, "int operand indices"),
    (dict(operand_spaces=[1]), TypeError, "mapping"),
    (dict(result_spaces={0: 3}), ValueError, "unknown memory space 3"),
    (dict(result_spaces={0: 1.0}), TypeError, "MemorySpace"),
    (dict(vmap_method="expand_dims"), ValueError, "vmap_method"),
    (dict(strict="no"), TypeError, "strict must be a bool"),
    (dict(has_side_effect=1), TypeError, "has_side_effect must be a bool"),
])
def test_helper_validation(kw, exc, match):
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(exc, match=match):
        jax.jit(lambda x, y: _fake_call(x, y, **kw)).trace(x, x)


def test_place_validation():
    x = jnp.ones(4)
    with pytest.raises(ValueError, match="unknown memory space"):
        place(x, "l2")
    with pytest.raises(TypeError, match="MemorySpace"):
        place(x, None)
    for flag in ("no", 0, None):  # "no" is truthy: it must not quietly mean strict=True
        with pytest.raises(TypeError, match="place: strict must be a bool"):
            place(x, MemorySpace.COLLECTIVE, strict=flag)
    assert place(x, MemorySpace.COLLECTIVE, strict=np.bool_(False)) is not None


@needs_memory_spaces
def test_strict_raises_on_cpu_lowering_but_not_for_cuda():
    x = jnp.ones(4, jnp.float32)
    f = lambda x: place(x, MemorySpace.COLLECTIVE, strict=True)  # noqa: E731
    with pytest.raises(UnsupportedError, match="cannot be honoured when lowering for cpu"):
        jax.jit(f)(x)
    assert 'results_memory_spaces = "{0:1}"' in _lower(f, x)


@needs_memory_spaces
def test_cpu_lowering_warns_not_silent(caplog):
    memory._warned.clear()
    with caplog.at_level(logging.WARNING, logger="jax_gpuext"):
        jax.jit(lambda x: place(x, MemorySpace.TEMP)).lower(jnp.ones(5, jnp.float32))
    assert any("not applied when lowering for cpu" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- gates / explain
def test_below_gate_strict_raises(closed_gate):
    x = jnp.ones(4, jnp.float32)
    with pytest.raises(UnsupportedError) as e:
        _lower(lambda x: _fake_call(x, x, result_spaces={0: 1}, strict=True), x)
    assert e.value.gate == GATE and "monkeypatched" in str(e.value)
    with backends.platform("cuda"), pytest.raises(UnsupportedError, match="cannot be honoured on cuda"):
        jax.make_jaxpr(lambda x: place(x, MemorySpace.COLLECTIVE, strict=True))(x)


def test_below_gate_warns_and_drops(closed_gate, caplog):
    x = jnp.ones(4, jnp.float32)
    with caplog.at_level(logging.WARNING, logger="jax_gpuext"):
        text = _lower(lambda x: _fake_call(x, x, result_spaces={0: 1}), x)
    assert "mhlo.frontend_attributes" not in _calls(text, "gpuext_test_only")[0]
    assert any("ignored: gate jaxlib_custom_call_memory_spaces" in r.getMessage() for r in caplog.records)
    ex = jax_gpuext.explain(lambda x: place(x, MemorySpace.COLLECTIVE), x, platform="cuda")
    (sel,) = ex.calls
    assert sel.chosen == "identity" and sel.fallback
    assert any("ignored" in n for n in sel.notes), str(ex)


@needs_memory_spaces
def test_explain_per_platform():
    x = jnp.ones(4, jnp.float32)
    f = lambda x: place(x, MemorySpace.COLLECTIVE)  # noqa: E731
    (cpu,) = jax_gpuext.explain(f, x, platform="cpu").calls
    assert cpu.chosen == "identity" and not cpu.fallback
    assert any("carried only by the CUDA lowering" in n for n in cpu.notes)
    (cuda,) = jax_gpuext.explain(f, x, platform="cuda").calls
    assert cuda.chosen == "custom_call" and not cuda.fallback
    assert any('results_memory_spaces={0:1}' in n for n in cuda.notes)


def test_demo_step_runs(capsys):
    for _, step in memory.demo_steps():
        step()
    assert "values unchanged: True" in capsys.readouterr().out


# --------------------------------------------------------------------------- GPU
def _compiled_place_lines(f, *args, **jit_kw) -> list[str]:
    text = jax.jit(f, **jit_kw).lower(*args).compile().as_text()
    return [l for l in text.splitlines() if 'custom_call_target="gpuext_place"' in l]


@pytest.mark.verifies("place.custom_call")
@pytest.mark.gpu
@needs_memory_spaces
@pytest.mark.parametrize("space, tag", [(MemorySpace.COLLECTIVE, "S(1)"), (MemorySpace.TEMP, "S(2)")])
def test_gpu_compiled_hlo_has_memory_space(space, tag):
    x = jnp.arange(1024, dtype=jnp.float32)
    f = lambda x: place(x * 2, space) + 1  # noqa: E731
    lines = _compiled_place_lines(f, x)
    assert lines and all(tag in l.split("custom-call(")[0] for l in lines), lines
    np.testing.assert_array_equal(jax.jit(f)(x), x * 2 + 1)


@pytest.mark.verifies("place.custom_call")
@pytest.mark.gpu
@needs_memory_spaces
def test_gpu_slice_producer_keeps_collective_space():
    # openxla/xla#47461: a sliced operand must not hide the call inside a dynamic-slice fusion.
    x = jnp.arange(4096, dtype=jnp.float32)
    f = lambda x, i: place(jax.lax.dynamic_slice(x, (i,), (256,)), MemorySpace.COLLECTIVE)  # noqa: E731
    lines = _compiled_place_lines(f, x, 7)
    assert lines and "S(1)" in lines[0].split("custom-call(")[0], lines
    np.testing.assert_array_equal(jax.jit(f)(x, 7), x[7:263])


@pytest.mark.verifies("place.custom_call")
@pytest.mark.gpu
@needs_memory_spaces
def test_gpu_place_in_command_buffer():
    # The handler claims kCmdBufferCompatible: run it where XLA may capture it in a graph.
    x = jnp.arange(2048, dtype=jnp.float32)

    def f(x):
        for _ in range(6):  # enough ops to pass --xla_gpu_graph_min_graph_size
            x = place(jnp.sin(x), MemorySpace.COLLECTIVE)
        return x

    opts = {"xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL", "xla_gpu_graph_min_graph_size": 1}
    g = jax.jit(f, compiler_options=opts)
    want = jax.jit(lambda x: jnp.sin(jnp.sin(jnp.sin(jnp.sin(jnp.sin(jnp.sin(x)))))))(x)
    for _ in range(3):  # replays of the recorded graph
        np.testing.assert_allclose(g(x), want, rtol=1e-6)
    from _hlo import custom_calls_in_command_buffers

    assert "gpuext_place" in custom_calls_in_command_buffers(g.lower(x).compile().as_text())


@pytest.mark.gpu
@pytest.mark.gates("jax_memory_space_api")
def test_gpu_pinned_host_under_jit():
    x = jnp.arange(256, dtype=jnp.float32)
    y = jax.jit(lambda x: place(x * 2, MemorySpace.PINNED_HOST))(x)
    assert y.sharding.memory_kind == "pinned_host"
    back = jax.jit(lambda y: place(y, MemorySpace.DEVICE) + 1)(y)
    assert back.sharding.memory_kind == "device"
    np.testing.assert_array_equal(back, x * 2 + 1)
