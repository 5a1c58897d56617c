"""Exporting for another platform than this host's (issue 34, "also seen").

jax_gpuext chooses each op's backend while tracing, for the platform traced for; jax.export traces
once and lowers for the platforms it is given. ``jax.export(..., platforms=("cuda",))`` on a CPU
host used to put the CPU's choices into the CUDA module silently. Now each dot and formats op marks its result
with its choice (common/export.py ``mark_choice``), and lowering for another platform either finds
that platform would choose the same backend or refuses, saying how to export for it
(``lowering_for``). Checked on CPU: the FP8 blockwise dense dot runs the reference on CPU and the
xla backend on CUDA (where none of ours can run on this host).
"""

from __future__ import annotations

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


@pytest.mark.parametrize("platforms", [("cuda",), ("cpu", "cuda")])
def test_lowering_for_a_platform_whose_choice_differs_refuses(platforms):
    jax.clear_caches()  # traced now, for this host
    x, w = _operands()
    # the step's first marked op refuses: its activations' quantize (cpu handler here) or the dot
    with pytest.raises(ValueError, match=r"(quantize|block_scaled_dot): backend '(cpu|reference)' was chosen while "
                                         r"tracing for cpu, but this lowering is for cuda, where \1 runs backend "
                                         r"'xla'.*lowering_for\('cuda'\)"):
        _export(platforms)(x, w)


def test_lowering_for_exports_the_platforms_own_choices():
    x, w = _operands()
    with lowering_for("cuda"), backends.recording() as log:
        exported = _export(("cuda",))(x, w)
    assert {(c.platform, c.chosen) for c in log if c.op == "block_scaled_dot"} == {("cuda", "xla")}
    assert exported.platforms == ("cuda",)
    # and the host's own export is untouched by it: traced anew for cpu, it runs as jit does
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
    forced while tracing only) refuses for that platform and lowers for the one traced for."""
    x, _ = _operands()
    qx = gx.quantize(x, gx.MXFP8_E4M3)
    qw = gx.quantize(jnp.ones((2, 256, 64), jnp.float32), gx.MXFP8_E4M3, axis=1)
    sizes = jnp.array([10, 20], jnp.int32)
    f = jax.jit(lambda a, b, s: ragged_dot(a, b, s))
    jax.clear_caches()
    monkeypatch.setenv(backends.FORCE_REFERENCE_ENV, "ragged_dot")
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
def test_quantize_and_dequantize_refuse_a_cuda_export_of_this_hosts_handler(name):
    """The formats ops carry the mark too: on CPU `auto` runs our C++ CPU handler (gpuext_quantize /
    gpuext_dequantize), on CUDA the xla path; a CUDA export traced here put the CPU handler's call
    into the CUDA module. It refuses now, and ``lowering_for("cuda")`` exports CUDA's own choice."""
    f = _FORMAT_OPS[name]
    x = jnp.asarray(np.random.default_rng(7).standard_normal((64, 128)), jnp.float32)
    op = "dequantize" if name == "dequantize" else "quantize"
    assert {c.chosen for c in gx.explain(f, x, platform="cpu").calls if c.op == op} == {"cpu"}  # the premise
    jax.clear_caches()
    export = jax_export.export(jax.jit(f), platforms=("cuda",), disabled_checks=gx.export_disabled_checks())
    with pytest.raises(ValueError, match=rf"{op}: backend 'cpu' was chosen while tracing for cpu, but this lowering "
                                         rf"is for cuda, where {op} runs backend 'xla'"):
        export(x)
    with lowering_for("cuda"):
        text = jax_export.export(jax.jit(f), platforms=("cuda",),
                                 disabled_checks=gx.export_disabled_checks())(x).mlir_module()
    assert "gpuext_" not in text  # CUDA's choice here is XLA's own path
