"""Exporting for another platform than this host's (issue 34, "also seen"; issue 36's "show on CPU
from the lowered CUDA HLO").

jax_gpuext chooses each op's backend while tracing; jax.export traces once and lowers for the
platforms it is given, and ``jit(f).trace(x).lower(lowering_platforms=...)`` lowers for any. An
op whose choice differs between platforms traces each platform's choice as a branch of
``lax.platform_dependent`` (common/export.py ``per_platform``): a CUDA export from a CPU host holds
CUDA's choices, a (cpu, cuda) export both, picked at run time. A platform that cannot run a choice
(a backend named that runs on one platform only) refuses at lowering, saying why (``mark_choice``).
Checked on CPU: the FP8 blockwise dense dot runs the reference on CPU and the xla backend on CUDA,
the quantizers our C++ CPU handler on CPU and the xla path on CUDA (where none of ours can run on
this host).
"""

from __future__ import annotations

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export  # a submodule jax 0.7 does not import by itself

import jax_gpuext as gx
from jax_gpuext.common import backends
from jax_gpuext.common.export import lowering_for
from jax_gpuext.ragged_dot.ragged_dot import ragged_dot

DN = (((1,), (0,)), ((), ()))
FP8 = (gx.FP8_1x128, gx.FP8_128x128)


def _operands():
    rng = np.random.default_rng(34)
    return (jnp.asarray(rng.standard_normal((32, 256)), jnp.float32),
            jnp.asarray(rng.standard_normal((256, 128)), jnp.float32))


def _step(x, w):
    return jax.value_and_grad(lambda a, b: jnp.sum(gx.scaled_dot_general(a, b, DN, format=FP8) ** 2), (0, 1))(x, w)


def _export(platforms):
    return jax_export.export(jax.jit(_step), platforms=platforms, disabled_checks=gx.export_disabled_checks())


def _choices(platform: str) -> list[str]:
    x, w = _operands()
    return [c.chosen for c in gx.explain(_step, x, w, platform=platform).calls if c.op == "block_scaled_dot"]


def test_the_choices_differ_between_the_platforms():
    """The premise of the tests below (if it stops holding, pick another problem)."""
    assert set(_choices("cpu")) == {"reference"} and set(_choices("cuda")) == {"xla"}


def _ops(text: str) -> dict:
    """How often each dot, loop, transpose and custom call occurs in a module (the platform
    branches' one-branch wrappers aside): what tells one platform's trace from another's."""
    names = re.findall(r"stablehlo\.(?:dot_general|while|transpose)|custom_call @[\w.]+", text)
    return {n: names.count(n) for n in set(names)}


def test_exporting_for_cuda_from_this_host_holds_cudas_choices():
    """No lowering_for needed: the CUDA module holds what CUDA chooses (the xla dot and quantize,
    no CPU handler), the same dots and calls as an export traced for CUDA alone."""
    jax.clear_caches()
    x, w = _operands()
    cuda = _export(("cuda",))(x, w).mlir_module()
    with lowering_for("cuda"):
        alone = _export(("cuda",))(x, w).mlir_module()
    assert "gpuext_" not in cuda and "gpuext_" not in alone
    assert _ops(cuda) == _ops(alone)
    host = _export(("cpu",))(x, w).mlir_module()
    assert "custom_call @gpuext_quantize" in host and _ops(host) != _ops(cuda)  # the premise: they differ
    # and jit's own lowering for CUDA, the other way to ask
    lowered = jax.jit(_step).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    assert _ops(lowered) == _ops(alone)


def test_the_grouped_training_step_lowered_for_cuda_here_is_cudas():
    """Issue 36's check, as a user would write it: the MoE step (``scaled_ragged_dot``, forward and
    both gradients) lowered for CUDA on this CPU host holds XLA's own grouped path as traced for
    CUDA (its implementations read the platform: on CPU they add XLA:CPU's subnormal workarounds),
    no custom call, no ``ragged_dot`` for XLA to expand and no dot contracting G x K."""
    rng = np.random.default_rng(36)
    m, k, n, g = 256, 256, 128, 4
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)), jnp.bfloat16)
    sizes = jnp.asarray([100, 0, 28, 128], jnp.int32)

    def step(a, b, s):
        return jax.value_and_grad(lambda a, b: jnp.sum(gx.scaled_ragged_dot(a, b, s).astype(jnp.float32) ** 2),
                                  (0, 1))(a, b)

    jax.clear_caches()
    text = jax.jit(step).trace(lhs, rhs, sizes).lower(lowering_platforms=("cuda",)).as_text()
    with lowering_for("cuda"):
        alone = jax.jit(step).trace(lhs, rhs, sizes).lower(lowering_platforms=("cuda",)).as_text()
    assert _ops(text) == _ops(alone) and "custom_call" not in text and "ragged_dot" not in text.replace(
        "scaled_ragged_dot", "")
    for contracting in re.findall(r"contracting_dims = \[([\d, ]+)\] x", text):
        assert contracting  # parsed
    shapes = re.findall(r"stablehlo\.dot_general[^\n]*?contracting_dims = \[(\d+)\] x[^\n]*?: \(tensor<([\dx]+)x", text)
    assert shapes
    for dim, shape in shapes:
        assert int(shape.split("x")[int(dim)]) != g * k, (dim, shape)
    host = jax.jit(step).trace(lhs, rhs, sizes).lower().as_text()
    assert _ops(host) != _ops(text)  # the premise: this host's own trace differs


def test_a_two_platform_export_runs_here_as_jit_does():
    jax.clear_caches()
    x, w = _operands()
    exported = _export(("cpu", "cuda"))(x, w)
    assert exported.platforms == ("cpu", "cuda")
    for a, b in zip(jax.tree.leaves(exported.call(x, w)), jax.tree.leaves(jax.jit(_step)(x, w))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # through serialization too, as a serving process would load it
    loaded = jax_export.deserialize(exported.serialize())
    for a, b in zip(jax.tree.leaves(loaded.call(x, w)), jax.tree.leaves(jax.jit(_step)(x, w))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_other_platforms_choices_are_quiet(caplog):
    """Tracing CUDA's branch on this host logs no CUDA fallback and adds nothing to explain: this
    host runs its own choices."""
    x, w = _operands()
    jax.clear_caches()
    with caplog.at_level(logging.DEBUG, logger="jax_gpuext"), backends.recording() as log:
        jax.jit(_step).trace(x, w)
    assert log and {c.platform for c in log} == {"cpu"}
    assert not [r for r in caplog.records if "on cuda" in r.getMessage()]
    assert {c.platform for c in gx.explain(_step, x, w).calls} == {"cpu"}


def test_one_trace_where_nothing_differs_or_the_platform_is_pinned():
    """A branch per platform only where the choices differ: an op named to the same backend on both
    platforms, a pinned platform and eager calls trace once (no platform_index in the jaxpr)."""
    x, _ = _operands()
    same = jax.make_jaxpr(lambda a: gx.quantize(a, gx.MXFP8_E4M3, backend="xla").data)(x)
    assert "platform_index" not in str(same)
    differs = jax.make_jaxpr(lambda a: gx.quantize(a, gx.MXFP8_E4M3).data)(x)
    assert "platform_index" in str(differs)
    with backends.platform("cpu"):
        pinned = jax.make_jaxpr(lambda a: gx.quantize(a, gx.MXFP8_E4M3).data)(x)
    assert "platform_index" not in str(pinned)


def test_a_backend_named_for_one_platform_refuses_the_other_with_the_reason():
    """backend="cpu" (our C++ handler) cannot run on CUDA: no CUDA branch; lowering for CUDA refuses
    and says why, lowering for this host runs it."""
    x, _ = _operands()
    f = jax.jit(lambda a: gx.quantize(a, gx.MXFP8_E4M3, backend="cpu").data)
    traced = f.trace(x)
    with pytest.raises(ValueError, match=r"quantize: backend 'cpu' was chosen while tracing for cpu, but this "
                                         r"lowering is for cuda, where quantize cannot run .*platforms=\('cpu',\)"):
        traced.lower(lowering_platforms=("cuda",))
    assert "gpuext_quantize" in traced.lower(lowering_platforms=("cpu",)).as_text()


def test_lowering_for_exports_the_platforms_own_choices():
    x, w = _operands()
    with lowering_for("cuda"), backends.recording() as log:
        exported = _export(("cuda",))(x, w)
    assert {(c.platform, c.chosen) for c in log if c.op == "block_scaled_dot"} == {("cuda", "xla")}
    assert exported.platforms == ("cuda",)
    with lowering_for("cuda"):
        assert "platform_index" not in str(jax.make_jaxpr(_step)(x, w))
    # and the host's own export is untouched by it: traced anew, it runs as jit does
    exported = _export(("cpu",))(x, w)
    for a, b in zip(jax.tree.leaves(exported.call(x, w)), jax.tree.leaves(jax.jit(_step)(x, w))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_mark_lowers_to_nothing():
    """The mark is in the jaxpr (where lowering can see it) and not in the module: no op, no cost."""
    x, w = _operands()
    qx, qw = gx.quantize(x, FP8[0]), gx.quantize(w.T, FP8[1])
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b))
    assert "backend_choice" in str(jax.make_jaxpr(f)(qx, qw))
    text = f.lower(qx, qw).as_text()
    assert "backend_choice" not in text and "custom_call" not in text
    np.testing.assert_array_equal(np.asarray(f(qx, qw)), np.asarray(gx.block_scaled_dot(qx, qw)))


def test_ragged_dot_refuses_a_choice_its_lowering_platform_would_not_make(monkeypatch):
    """A choice made while tracing that the platform lowered for would not make (here the reference
    forced while tracing, for this host alone) refuses for that platform and lowers for the one
    traced for."""
    x, _ = _operands()
    qx = gx.quantize(x, gx.MXFP8_E4M3)
    qw = gx.quantize(jnp.ones((2, 256, 64), jnp.float32), gx.MXFP8_E4M3, axis=1)
    sizes = jnp.array([10, 20], jnp.int32)
    f = jax.jit(lambda a, b, s: ragged_dot(a, b, s))
    jax.clear_caches()
    monkeypatch.setenv(backends.FORCE_REFERENCE_ENV, "ragged_dot")
    with backends.platform("cpu"):  # pinned: no CUDA branch of its own
        traced = f.trace(qx, qw, sizes)
    monkeypatch.delenv(backends.FORCE_REFERENCE_ENV)
    with pytest.raises(ValueError, match="ragged_dot: backend 'reference' was chosen while tracing for cpu"):
        traced.lower(lowering_platforms=("cuda",))
    assert "backend_choice" not in traced.lower(lowering_platforms=("cpu",)).as_text()
    jax.clear_caches()


_FORMAT_OPS = {
    "quantize": lambda x: gx.quantize(x, gx.MXFP8_E4M3).data,
    "quantize_both_axes": lambda x: gx.quantize_both_axes(x, gx.MXFP8_E4M3)[1].data,
    "dequantize": lambda x: gx.dequantize(gx.quantize(x, gx.MXFP8_E4M3, backend="xla"), jnp.float32),
}


@pytest.mark.parametrize("name", _FORMAT_OPS)
def test_quantize_and_dequantize_export_cudas_choice_from_this_host(name):
    """The formats ops choose per platform too: on CPU `auto` runs our C++ CPU handler
    (gpuext_quantize / gpuext_dequantize), on CUDA the xla path. A CUDA export traced here used to
    carry the CPU handler's call into the CUDA module; it holds XLA's own path, as one traced for
    CUDA alone, and a (cpu, cuda) export runs here as jit."""
    f = _FORMAT_OPS[name]
    x = jnp.asarray(np.random.default_rng(7).standard_normal((64, 128)), jnp.float32)
    op = "dequantize" if name == "dequantize" else "quantize"
    assert {c.chosen for c in gx.explain(f, x, platform="cpu").calls if c.op == op} == {"cpu"}  # the premise
    jax.clear_caches()
    checks = gx.export_disabled_checks()
    text = jax_export.export(jax.jit(f), platforms=("cuda",), disabled_checks=checks)(x).mlir_module()
    with lowering_for("cuda"):
        alone = jax_export.export(jax.jit(f), platforms=("cuda",), disabled_checks=checks)(x).mlir_module()
    assert "gpuext_" not in text and _ops(text) == _ops(alone)
    both = jax_export.export(jax.jit(f), platforms=("cpu", "cuda"), disabled_checks=checks)(x)
    assert f"gpuext_{op}" in both.mlir_module()  # the CPU branch
    np.testing.assert_array_equal(np.asarray(both.call(x)), np.asarray(jax.jit(f)(x)))


def test_a_gpu_hosts_trace_lowers_for_cuda_as_before(monkeypatch):
    """The other side, simulated: a host whose default backend is the GPU traces CUDA's choices as
    its own (logged, in explain) and the CPU's quietly; its CUDA lowering equals a trace for CUDA
    alone (what a GPU host lowered before the branches), and its CPU branch runs here as this
    host's jit."""
    x, w = _operands()
    with lowering_for("cuda"):
        alone = jax.jit(_step).trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    jax.clear_caches()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with backends.recording() as log:
        traced = jax.jit(_step).trace(x, w)
    assert log and {c.platform for c in log} == {"cuda"}
    assert _ops(traced.lower(lowering_platforms=("cuda",)).as_text()) == _ops(alone)
    cpu_module = traced.lower(lowering_platforms=("cpu",))
    monkeypatch.undo()
    got = cpu_module.compile()(x, w)
    jax.clear_caches()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(jax.jit(_step)(x, w))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_one_two_platform_export_of_the_moe_step_serves_every_token_count():
    """What a serving or training pipeline builds once: the FP8 MoE step exported for (cpu, cuda)
    with a symbolic token count, run here at two counts bit for bit as jit."""
    (m,) = jax_export.symbolic_shape("m")
    g, k, n = 4, 256, 128

    def step(a, b, s):
        return jax.value_and_grad(lambda a, b: jnp.sum(gx.scaled_ragged_dot(a, b, s).astype(jnp.float32) ** 2),
                                  (0, 1))(a, b)

    exported = jax_export.export(jax.jit(step), platforms=("cpu", "cuda"), disabled_checks=gx.export_disabled_checks())(
        jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((g, k, n), jnp.bfloat16),
        jax.ShapeDtypeStruct((g,), jnp.int32))
    rng = np.random.default_rng(28)
    for tokens, sizes in ((64, [16, 0, 40, 8]), (300, [100, 100, 0, 90])):
        args = (jnp.asarray(rng.standard_normal((tokens, k)), jnp.bfloat16),
                jnp.asarray(rng.standard_normal((g, k, n)), jnp.bfloat16), jnp.asarray(sizes, jnp.int32))
        for a, b in zip(jax.tree.leaves(exported.call(*args)), jax.tree.leaves(jax.jit(step)(*args))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
