"""The ``cudnn`` backend of block_scaled_dot (jax_gpuext/dot/cudnn.py, csrc/dot/cudnn_block_scaled.cc).

CPU tests check which problems the backend takes and the reasons ``explain`` gives where it
cannot run; GPU tests (Blackwell, cuDNN >= 9.7, built with JAX_GPUEXT_CUDNN) compare it with the
reference backend and check the compiled HLO really calls gpuext_block_scaled_dot_cudnn.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext.common import backends, gates
from jax_gpuext.common.gates import GateResult
from jax_gpuext.dot import common as dot_mod
from jax_gpuext.dot import cudnn as dot_cudnn


def rand(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


def _problem(fmt_l, fmt_r, m=128, n=256, k=256, out=jnp.float32):
    a = gx.quantize(rand(1, (m, k)), fmt_l)
    b = gx.quantize(rand(2, (n, k)), fmt_r)
    return dot_mod._problem(a, b, None, jnp.dtype(out))


@pytest.mark.parametrize("fmt_l,fmt_r,ok,why", [
    (gx.MXFP8_E4M3, gx.MXFP8_E4M3, True, "MXFP8_E4M3"),
    (gx.MXFP8_E4M3, gx.MXFP8_E5M2, True, "MXFP8_E5M2"),
    (gx.NVFP4, gx.NVFP4, True, "NVFP4"),
    (gx.MXFP8_E5M2, gx.MXFP8_E5M2, False, "E5M2 x E5M2"),
    (gx.FP8_1x128, gx.FP8_1x128, False, "MXFP8/NVFP4"),
])
def test_supports(fmt_l, fmt_r, ok, why):
    r = dot_cudnn.supports(_problem(fmt_l, fmt_r))
    assert r.supported is ok and why in r.reason


def test_supports_rejects_k_not_multiple_of_128():
    r = dot_cudnn.supports(_problem(gx.MXFP8_E4M3, gx.MXFP8_E4M3, k=192))
    assert not r.supported and "K=192" in r.reason


def _cudnn_rejection(platform, monkeypatch=None, failing=None):
    if monkeypatch is not None:
        real = gates.check
        monkeypatch.setattr(gates, "check", lambda g: GateResult(False, f"{g} fails here")
                            if g == failing else (GateResult(True, "ok") if g in dot_cudnn_gates() else real(g)))
    a = gx.quantize(rand(3, (128, 256)), gx.MXFP8_E4M3)
    b = gx.quantize(rand(4, (256, 256)), gx.MXFP8_E4M3)
    ex = gx.explain(lambda p, q: gx.block_scaled_dot(p, q), a, b, platform=platform)
    (call,) = [c for c in ex.calls if c.op == "block_scaled_dot"]
    return dict(call.rejected)["cudnn"]


def dot_cudnn_gates():
    (b,) = [b for b in backends.backends("block_scaled_dot") if b.name == "cudnn"]
    return b.gates


def test_explain_on_cpu_names_the_platform():
    assert _cudnn_rejection(None) == "runs on cuda, not cpu"


def test_explain_on_hopper_names_the_blackwell_gate(monkeypatch):
    why = _cudnn_rejection("cuda", monkeypatch, failing="blackwell")
    assert why == "gate blackwell: blackwell fails here"


def test_explain_without_the_build_names_the_build_gate(monkeypatch):
    why = _cudnn_rejection("cuda", monkeypatch, failing="cudnn_dot_built")
    assert why.startswith("gate cudnn_dot_built")


def test_gates_of_the_backend():
    assert {"blackwell", "cudnn_block_scale", "cudnn_dot_built"} <= set(dot_cudnn_gates())


# --------------------------------------------------------------------------- GPU (Blackwell)
CUDNN_GATES = pytest.mark.gates("blackwell", "cudnn_block_scale", "cudnn_dot_built")


@pytest.mark.gpu
@pytest.mark.verifies("block_scaled_dot.cudnn", feature="mxfp8", fmt=gx.MXFP8_E4M3)
@pytest.mark.verifies("block_scaled_dot.cudnn", feature="nvfp4", fmt=gx.NVFP4)
@CUDNN_GATES
@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.NVFP4], ids=["mxfp8", "nvfp4"])
@pytest.mark.parametrize("m,n,k", [(256, 512, 1024), (200, 72, 384)], ids=["aligned", "ragged-mn"])
@pytest.mark.parametrize("out", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_gpu_matches_reference(fmt, m, n, k, out):
    lhs = gx.quantize(rand(10, (m, k)), fmt)
    rhs = gx.quantize(rand(11, (n, k), 0.1), fmt)
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=out, backend="cudnn"))
    ref = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="reference")
    tol = 1e-3 if out == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(f(lhs, rhs), np.float32), np.asarray(ref), rtol=tol,
                               atol=tol * float(jnp.abs(ref).max()))
    assert "gpuext_block_scaled_dot_cudnn" in f.lower(lhs, rhs).compile().as_text()


@pytest.mark.gpu
@pytest.mark.verifies("block_scaled_dot.cudnn", feature="mxfp8")
@CUDNN_GATES
def test_gpu_batched_mixed_mx():
    lhs = gx.quantize(rand(12, (3, 128, 256)), gx.MXFP8_E4M3)
    rhs = gx.quantize(rand(13, (3, 384, 256), 0.1), gx.MXFP8_E5M2)
    dn = (((2,), (2,)), ((0,), (0,)))
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dn, preferred_element_type=jnp.float32, backend="cudnn"))
    ref = gx.block_scaled_dot(lhs, rhs, dn, preferred_element_type=jnp.float32, backend="reference")
    np.testing.assert_allclose(np.asarray(f(lhs, rhs)), np.asarray(ref), rtol=1e-3,
                               atol=1e-3 * float(jnp.abs(ref).max()))


@pytest.mark.gpu
@pytest.mark.verifies("block_scaled_dot.cudnn", feature="nvfp4")
@CUDNN_GATES
def test_gpu_nvfp4_global_scale_applied_once():
    """Fused (cuDNN >= 9.13) or multiplied afterwards, the global scales must apply exactly once."""
    lhs = gx.quantize(rand(14, (128, 512), 300.0), gx.NVFP4)
    rhs = gx.quantize(rand(15, (256, 512), 0.01), gx.NVFP4)
    out = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="cudnn")
    ref = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="reference")
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-3, atol=1e-3 * float(jnp.abs(ref).max()))
    note = "fused" if gates.check("cudnn_fused_global_scale").supported else "separate float32 multiply"
    ex = gx.explain(lambda a, b: gx.block_scaled_dot(a, b, backend="cudnn"), lhs, rhs)
    assert note in str(ex)


@pytest.mark.gpu
@pytest.mark.verifies("block_scaled_dot.cudnn")
@CUDNN_GATES
def test_gpu_auto_picks_cudnn_on_blackwell():
    lhs = gx.quantize(rand(16, (128, 256)), gx.MXFP8_E4M3)
    rhs = gx.quantize(rand(17, (128, 256)), gx.MXFP8_E4M3)
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b))
    assert "gpuext_block_scaled_dot_cudnn" in f.lower(lhs, rhs).compile().as_text()


# --------------------------------------------------------------------------- probe (benchmarks/probe_cudnn.py)
def test_probe_rejects_formats_and_names_its_gate():
    with pytest.raises(ValueError, match="MXFP8/NVFP4"):
        dot_cudnn.probe(gx.FP8_1x128, gx.FP8_1x128, 128, 128, 128)
    if not gates.check_all(["cuda_extension", "cudnn_dot_built", "cuda_device"]).supported:
        with pytest.raises(gx.UnsupportedError, match="dot.cudnn.probe needs gate"):
            dot_cudnn.probe(gx.MXFP8_E4M3, gx.MXFP8_E4M3, 128, 128, 128)


@pytest.mark.gpu
@pytest.mark.verifies("block_scaled_dot.cudnn")
@pytest.mark.gates("cudnn_dot_built", "cudnn_block_scale")
def test_gpu_probe_answers_and_agrees_with_the_backend():
    """The probe never raises on a GPU: it says supported or why not. Where our gates open the
    backend (Blackwell) the probe must agree that cuDNN builds the graph."""
    for fmt in (gx.MXFP8_E4M3, gx.NVFP4):
        r = dot_cudnn.probe(fmt, fmt, 256, 512, 1024)
        assert isinstance(r["supported"], bool)
        if not r["supported"]:  # an answer from cuDNN itself, not a failure to reach it
            assert re.match(r"cuDNN (validate|build_operation_graph|create_execution_plans|check_support|"
                            r"build_plans|get_workspace_size) failed", r["reason"]), r["reason"]
        if gates.check("blackwell").supported:
            assert r["supported"], r["reason"]
            assert 0 <= r["workspace_bytes"] <= dot_cudnn.WORKSPACE_BYTES


def test_cudart_gate_refuses_two_runtimes_for_the_frontend_shim(monkeypatch):
    """cudnn-frontend's dynamic-loading shim throws "Multiple libcudart libraries found" when both
    libcudart.so.12 and .so.13 load (issue 14 item 6): the gate says so first, with the files."""
    from jax_gpuext.common import libs as _libs

    found = _libs.loadable_cudarts()  # the real search on this machine: a list, never an exception
    assert all(soname in _libs.CUDART_SONAMES for soname, _ in found)
    cases = [([("libcudart.so.12", "/a/libcudart.so.12"), ("libcudart.so.13", "/b/libcudart.so.13")], False),
             ([("libcudart.so.13", "/b/libcudart.so.13")], True), ([], True)]
    try:
        for loadable, ok in cases:
            monkeypatch.setattr(_libs, "loadable_cudarts", lambda loadable=loadable: loadable)
            gates.clear_cache()
            r = gates.check("cudnn_frontend_cudart")
            assert r.supported == ok, r.reason
            if not ok:
                assert "/a/libcudart.so.12" in r.reason and "/b/libcudart.so.13" in r.reason
    finally:
        gates.clear_cache()
    backend = next(b for b in backends.backends(dot_mod.OP) if b.name == "cudnn")
    assert "cudnn_frontend_cudart" in backend.gates
