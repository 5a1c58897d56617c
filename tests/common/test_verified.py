"""Safe defaults (issue 16): the verification record, the `verified` gate `auto` consults, and the
visible state. A simulated H100 (platform forced to cuda, the device, build and library facts
patched) shows what `auto` does on a GPU with no committed results: XLA's own paths everywhere.
Issue 33: verification per (component, feature), speed-aware `auto` from the record's benchmark
numbers, scheme-2 fingerprints; a simulated H200 with the committed record shows the choices."""

from __future__ import annotations

import json
import logging
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_gpuext as gx
from jax_gpuext.common import backends
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import gates
from jax_gpuext.common import libs as _libs
from jax_gpuext.common import verified

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import update_verified  # noqa: E402

NOT_VERIFIED = "not verified on sm_90 at this source (see benchmarks/results)"
XLA_NATIVE = {("block_scaled_dot", "xla"), ("block_scaled_dot", "reference"), ("quantize", "xla"),
              ("quantize", "reference"), ("dequantize", "xla"), ("dequantize", "reference"), ("all_reduce", "xla"),
              ("all_reduce", "reference"), ("place", "memory_kind"), ("place", "xla"), ("ragged_dot", "xla"),
              ("ragged_dot", "reference"), ("ragged_dot_masked", "xla"), ("ragged_dot_masked", "reference"),
              # XLA's gather and transpose around a nested quantize, which has its own choice and record
              ("quantize_token_slots", "composed")}


# --------------------------------------------------------------------------- a simulated H100
class _Device:
    id, platform, device_kind, compute_capability = 0, "gpu", "NVIDIA H100 80GB HBM3", "9.0"


class _CudaModule:
    """Stands in for jax_gpuext._cuda: a CUDA 12.9 build for sm_90a with every optional part."""

    def __init__(self, fingerprints):
        self.fingerprints = fingerprints

    def build_info(self):
        return {"ffi_api_major": 0, "ffi_api_minor": 1, "compiler": "simulated", "platform": "cuda",
                "cuda_version": "12.9", "cuda_runtime_version": 12090, "architectures": "90a-real",
                "source_fingerprints": ",".join(f"{k}={v}" for k, v in self.fingerprints.items())}

    def registrations(self):
        return {t: None for t in ("gpuext_quantize", "gpuext_dequantize", "gpuext_place",
                                  "gpuext_block_scaled_dot_cublaslt", "gpuext_block_scaled_dot_cudnn",
                                  "gpuext_hopper_mx")}

    def driver_version(self):
        return 12090

    def library_path(self, name):
        return ""


class _NvshmemModule:
    def build_info(self):
        return {"nvshmem_version": "3.3.0"}


def record_entry(component, arch, fingerprint, features=None, wide=(1, 0), results="benchmarks/results/sim.json"):
    """A record entry as build_record writes it: ``features`` {name: (passed, failed)}, ``wide`` the
    component-wide tests' (passed, failed)."""
    feats = {f: {"passed": p, "failed": n, "skipped": 0, "results": results, "verified": bool(p) and not n}
             for f, (p, n) in (features or {}).items()}
    failed = wide[1] + sum(n for _, n in (features or {}).values())
    return {"component": component, "architecture": arch, "fingerprint": fingerprint, "results": results,
            "commit": "c0ffee", "date": "", "verified": not failed, "cut_short": [],
            "component_wide": {"passed": wide[0], "failed": wide[1], "skipped": 0, "results": results},
            "features": feats}


class SimulatedH100:
    def __init__(self, monkeypatch):
        self.fingerprints = {c: "00000000000000aa" for c in verified.COMPONENTS}
        self.record = {**verified.EMPTY_RECORD, "entries": [], "speeds": []}
        cuda, load = _CudaModule(self.fingerprints), _ext.load
        monkeypatch.setattr(_ext, "load", lambda kind: (cuda, None) if kind == "cuda" else load(kind))
        monkeypatch.setattr(_ext, "_registered", _ext._registered | {"cuda"})  # nothing to register
        monkeypatch.setattr(gates, "cuda_devices", lambda: (_Device(),))
        monkeypatch.setattr(gates, "driver_version", lambda: 12090)
        versions = {"cudnn": (9, 15, 0), "cublaslt": (12, 9, 1), "nvshmem": (3, 3, 0)}
        monkeypatch.setattr(_libs, "version", lambda key: (versions.get(key, (99,)), "simulated"))
        monkeypatch.setattr(_ext, "load_nvshmem", lambda: (_NvshmemModule(), None))
        monkeypatch.setattr(verified, "record", lambda: self.record)
        monkeypatch.setattr(backends, "_warned", set())
        gates.clear_cache()

    def verify(self, component, arch="sm_90", fingerprint=None, features=None, wide=(1, 0)):
        """Verifies ``component`` (every feature in ``features``, {name: (passed, failed)}; default:
        every feature its backends' problems below name)."""
        if features is None:
            features = {f: (1, 0) for f in ("mxfp8", "mxfp4", "nvfp4", "fp8_blockwise", "per_tensor",
                                             "per_tensor_batched", *gx.formats.FORMATS)}
        self.record["entries"].append(record_entry(component, arch, fingerprint or self.fingerprints[component],
                                                   features, wide))

    def measure(self, op, pairing, backend, value, shape, unit="TFLOP/s", arch="sm_90"):
        work = 2.0 * np.prod(shape) if unit == "TFLOP/s" else float(np.prod(shape) * 4)
        self.record["speeds"].append({"op": op, "pairing": pairing, "backend": backend, "shape": list(shape),
                                      "work": work, "size_class": verified.size_class(work), "value": value,
                                      "unit": unit, "architecture": arch, "device": "NVIDIA H100 80GB HBM3",
                                      "results": "benchmarks/results/sim.json", "commit": "c0ffee", "date": "",
                                      "benchmark": "sim"})


@pytest.fixture
def h100(monkeypatch):
    sim = SimulatedH100(monkeypatch)
    yield sim
    gates.clear_cache()


def _operands(fmt, m=64, n=32, k=256):
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (n, k), jnp.float32)
    rhs_fmt = gx.FP8_128x128 if fmt is gx.FP8_1x128 else fmt
    return gx.quantize(x, fmt), gx.quantize(w, rhs_fmt)


def _cuda_calls(fn, *args):
    """explain for cuda, and the traced jaxpr: no FFI call may appear in it."""
    ex = gx.explain(fn, *args, platform="cuda")
    with backends.platform("cuda"):
        text = str(jax.make_jaxpr(fn)(*args))
    return ex, text


def _check_passed_over(sel, expect_unverified):
    rejected = dict(sel.rejected)
    for name in expect_unverified:
        assert rejected[name] == f"{backends.PASSED_OVER}: {NOT_VERIFIED}", (name, rejected[name])


# --------------------------------------------------------------------------- Done when: every auto choice is XLA's
@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.MXFP8_E5M2, gx.NVFP4, gx.FP8_TENSOR, gx.FP8_1x128],
                         ids=lambda f: f.name)
def test_simulated_h100_without_results_runs_xla_for_the_dot_and_formats(h100, fmt):
    qx, qw = _operands(fmt)
    x = qx.dequantize()

    def step(x, qw):
        q = gx.quantize(x, fmt, backend="auto") if fmt is not gx.FP8_1x128 else gx.quantize(x, fmt)
        return gx.block_scaled_dot(q, qw, preferred_element_type=jnp.float32) + gx.dequantize(qw).sum()

    ex, jaxpr = _cuda_calls(step, x, qw)
    assert "ffi_call" not in jaxpr and "gpuext_" not in jaxpr
    assert "while" not in jaxpr  # the xla formats backend divides without a loop (issue 28)
    chosen = {(c.op, c.chosen) for c in ex.calls}
    assert chosen <= XLA_NATIVE, chosen
    by_op = {c.op: c for c in ex.calls}
    assert by_op["quantize"].chosen == by_op["dequantize"].chosen == "xla"
    _check_passed_over(by_op["quantize"], ["cuda"])
    _check_passed_over(by_op["dequantize"], ["cuda"])
    dot = by_op["block_scaled_dot"]
    assert dot.chosen == "xla"
    # cuBLASLt and hopper_mx are open on an H100 (gates), so they are passed over as unverified;
    # cuDNN is Blackwell-only and says so; hopper_mx names no feature for FP8 (not a format it
    # takes), so its own supports() says why instead.
    fp8 = fmt in (gx.FP8_TENSOR, gx.FP8_1x128)
    _check_passed_over(dot, ["cublaslt"] + ([] if fp8 else ["hopper_mx"]))
    if fp8:
        assert "hopper_mx runs MXFP8, MXFP4 and NVFP4 only" in dict(dot.rejected)["hopper_mx"]
    assert dict(dot.rejected)["cudnn"].startswith("gate blackwell")
    assert NOT_VERIFIED in str(ex)


def test_simulated_h100_without_results_all_reduce_and_place_use_xla(h100):
    mesh = jax.make_mesh((8,), ("i",), devices=jax.devices()[:8])
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("i")))
    f = jax.jit(jax.shard_map(lambda v: gx.all_reduce(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                              check_vma=False))
    ex, jaxpr = _cuda_calls(f, x)
    (call,) = ex.calls
    assert call.chosen == "xla" and "ffi_call" not in jaxpr
    _check_passed_over(call, ["one_shot", "two_shot", "nvshmem_library"])

    ex, jaxpr = _cuda_calls(lambda v: gx.place(v, gx.MemorySpace.COLLECTIVE), jnp.ones(4))
    (call,) = ex.calls
    assert call.chosen == "xla" and "gpuext_memory_space_call" not in jaxpr
    # Below jaxlib 0.10 the custom_call backend's own gate rejects it first (CI's jax 0.7.0 leg): the
    # verified gate only passes over a backend whose other gates are open.
    memory_gate = gates.check("jaxlib_custom_call_memory_spaces")
    _check_passed_over(call, ["custom_call", "identity"] if memory_gate else ["identity"])
    if not memory_gate:
        assert "jaxlib_custom_call_memory_spaces" in dict(call.rejected)["custom_call"]
    assert any("not applied" in n for n in call.notes)


@pytest.mark.parametrize("fmt", [f for f in gx.formats.FORMATS.values()], ids=lambda f: f.name)
def test_simulated_h100_auto_quantizes_like_the_reference(h100, fmt):
    """What an H100 user gets by default (auto: the xla backend, the CUDA kernels unverified),
    executed here on the CPU: the reference's bits, quantize and dequantize."""
    x = (jax.random.normal(jax.random.key(3), (2, 96, 160), jnp.float32) * 50).astype(jnp.bfloat16)
    x = x.at[0, 0, 0].set(jnp.inf).at[1, 5].set(0)
    # auto's choices for CUDA, then those backends run here (tracing for CUDA and lowering for this
    # CPU is refused by the ops' export mark, common/export.py: the simulation names the backends)
    chosen = {c.op: c.chosen for c in gx.explain(lambda v: gx.dequantize(gx.quantize(v, fmt), jnp.bfloat16), x,
                                                 platform="cuda").calls}
    assert chosen == {"quantize": "xla", "dequantize": "xla"}, chosen
    q = jax.jit(lambda v: gx.quantize(v, fmt, backend=chosen["quantize"]))(x)
    y = jax.jit(lambda q: gx.dequantize(q, jnp.bfloat16, backend=chosen["dequantize"]))(q)
    r = jax.jit(lambda v: gx.quantize(v, fmt, backend="reference"))(x)
    for part in ("data", "scale", "global_scale"):
        if getattr(r, part) is not None:
            np.testing.assert_array_equal(np.atleast_1d(np.asarray(getattr(q, part))).view(np.uint8),
                                          np.atleast_1d(np.asarray(getattr(r, part))).view(np.uint8), err_msg=part)
    want = jax.jit(lambda q: gx.dequantize(q, jnp.bfloat16, backend="reference"))(r)
    np.testing.assert_array_equal(np.asarray(y).view(np.uint16), np.asarray(want).view(np.uint16))


def test_passing_over_is_logged_once(h100, caplog):
    qx, _ = _operands(gx.MXFP8_E4M3)
    with caplog.at_level(logging.WARNING, logger="jax_gpuext"):
        for _ in range(3):
            gx.explain(lambda v: gx.dequantize(v), qx, platform="cuda")
    msgs = [r.getMessage() for r in caplog.records if "passes over backend 'cuda'" in r.getMessage()]
    assert len(msgs) == 1 and NOT_VERIFIED in msgs[0] and verified.ALLOW_ENV in msgs[0]


# --------------------------------------------------------------------------- Done when: the record turns it on/off
def test_a_record_entry_turns_a_backend_on_and_a_changed_fingerprint_off(h100):
    qx, qw = _operands(gx.MXFP8_E4M3)

    def chosen():
        ex = gx.explain(lambda a, b: gx.block_scaled_dot(a, b), qx, qw, platform="cuda")
        return ex.calls[0]

    assert chosen().chosen == "xla"
    h100.verify("block_scaled_dot.hopper_mx", arch="sm_100")  # another architecture: still off here
    assert chosen().chosen == "xla"
    h100.verify("block_scaled_dot.hopper_mx")
    # verified, but no benchmark measured it against the xla path: not preferred over XLA's own
    sel = chosen()
    assert sel.chosen == "xla" and "not measured against the xla path" in dict(sel.rejected)["hopper_mx"]
    pairing = "MXFP8_E4M3 x MXFP8_E4M3"
    h100.measure("block_scaled_dot", pairing, "xla", 100.0, (128, 4096, 4096))
    h100.measure("block_scaled_dot", pairing, "hopper_mx", 150.0, (128, 4096, 4096))
    sel = chosen()
    assert sel.chosen == "hopper_mx" and not any("unverified" in n for n in sel.notes)
    assert dict(sel.rejected)["cublaslt"] == f"{backends.PASSED_OVER}: {NOT_VERIFIED}"
    # the hopper_mx sources change: the build's fingerprint no longer matches the passing run's
    h100.fingerprints["block_scaled_dot.hopper_mx"] = "00000000000000bb"
    sel = chosen()
    assert sel.chosen == "xla"
    why = dict(sel.rejected)["hopper_mx"]
    assert NOT_VERIFIED in why and "passed at source 00000000000000aa, this build is 00000000000000bb" in why


def test_quantize_turns_on_with_its_record_entry(h100):
    x = jnp.ones((4, 64), jnp.float32)
    sel = lambda: gx.explain(lambda v: gx.quantize(v, gx.MXFP8_E4M3), x, platform="cuda").calls[0]  # noqa: E731
    assert sel().chosen == "xla"
    h100.verify("formats.cuda")
    assert sel().chosen == "xla"  # verified, never measured: XLA's own path
    h100.measure("quantize", "MXFP8_E4M3", "xla", 200.0, (4096, 4096), unit="GB/s")
    h100.measure("quantize", "MXFP8_E4M3", "cuda", 900.0, (4096, 4096), unit="GB/s")
    assert sel().chosen == "cuda"
    assert verified.check("formats.cuda").reason == "verified on sm_90 at this source (benchmarks/results/sim.json)"
    assert verified.check("formats.cuda", "MXFP8_E4M3").reason.startswith("verified on sm_90 at this source for "
                                                                          "MXFP8_E4M3")


def test_graph_safe_all_reduce_needs_its_own_entry(h100, monkeypatch):
    assert verified.components("all_reduce", "one_shot") == ("all_reduce.one_shot",)
    monkeypatch.setenv(verified.GRAPH_SAFE_ENV, "1")
    assert verified.components("all_reduce", "one_shot") == ("all_reduce.one_shot", "all_reduce.graph_safe")
    h100.verify("all_reduce.one_shot")
    assert not verified.check_all(verified.components("all_reduce", "one_shot"))
    h100.verify("all_reduce.graph_safe")
    assert verified.check_all(verified.components("all_reduce", "one_shot"))


def test_naming_an_unverified_backend_runs_it_with_one_warning(h100, caplog):
    x = jnp.ones((4, 64), jnp.float32)
    with caplog.at_level(logging.WARNING, logger="jax_gpuext"):
        for _ in range(2):
            sel = gx.explain(lambda v: gx.quantize(v, gx.MXFP8_E4M3, backend="cuda"), x, platform="cuda").calls[0]
    assert sel.chosen == "cuda" and any(NOT_VERIFIED in n for n in sel.notes)
    assert len([r for r in caplog.records if "runs because it was named" in r.getMessage()]) == 1


def test_allow_unverified_lets_auto_take_it(h100, monkeypatch):
    monkeypatch.setenv(verified.ALLOW_ENV, "1")
    x = jnp.ones((4, 64), jnp.float32)
    sel = gx.explain(lambda v: gx.quantize(v, gx.MXFP8_E4M3), x, platform="cuda").calls[0]
    assert sel.chosen == "cuda" and any(verified.ALLOW_ENV in n for n in sel.notes)


def test_cpu_is_not_gated():
    sel = gx.explain(lambda v: gx.quantize(v, gx.MXFP8_E4M3), jnp.ones((4, 64))).calls[0]
    assert sel.platform == "cpu" and not any(NOT_VERIFIED in w for _, w in sel.rejected)


def test_every_backend_running_our_gpu_code_is_in_the_table():
    """A new CUDA backend must be classified: our GPU code (verified.BACKENDS) or XLA's own."""
    cuda = {(op, b.name) for op in backends.ops() if not op.startswith("test")  # ops other tests register
            for b in backends.backends(op) if "cuda" in b.platforms}
    assert cuda == set(verified.BACKENDS) | XLA_NATIVE
    for components in verified.BACKENDS.values():
        assert set(components) <= set(verified.COMPONENTS)


# --------------------------------------------------------------------------- the record from results
def _result(cases, fps, cc="9.0", date="2026-01-01T00:00:00+00:00", cut_short=(), features=None, commit="c0ffee"):
    """A results file; ``cases`` (test, outcome, components[, {component: feature}]); ``fps`` carry
    the current fingerprint scheme unless they name one."""
    out = []
    for case in cases:
        t, o, v = case[:3]
        out.append({"test": t, "outcome": o, "verifies": v, **({"features": case[3]} if len(case) > 3 else {})})
    return {"date": date, "commit": commit, "device": {"compute_cap": cc},
            "versions": {"cuda_extension": {"source_fingerprints": {verified.SCHEME_KEY: verified.FINGERPRINT_SCHEME,
                                                                     **fps} if fps else {}}},
            "gpu_tests": {"ran": True, "cases": out, "cut_short": list(cut_short),
                          "features_recorded": features is not False}}


FPS = {c: "f" * 16 for c in verified.COMPONENTS}


def _verified_features(rec, component):
    (e,) = [e for e in rec["entries"] if e["component"] == component]
    return sorted(f for f, t in e["features"].items() if t["verified"]), e


def test_build_record_from_results():
    hm, fc = "block_scaled_dot.hopper_mx", "formats.cuda"
    results = {"r1.json": _result([("t::a", "passed", [hm]), ("t::b", "skipped", [hm]), ("t::c", "passed", [fc]),
                                   ("t::d", "failure", [fc])], FPS)}
    rec = verified.build_record(results)
    assert [(e["component"], e["architecture"], e["fingerprint"], e["results"], e["verified"], e["tests_passed"])
            for e in rec["entries"]] == [(hm, "sm_90", "f" * 16, "r1.json", True, 1), (fc, "sm_90", "f" * 16, "r1.json",
                                                                                       False, 1)]
    # a later run at the same source that fails revokes it; one at another source does not
    results["r2.json"] = _result([("t::a", "failure", [hm])], FPS, date="2026-02-01T00:00:00+00:00")
    assert not [e for e in verified.build_record(results)["entries"] if e["verified"]]
    results["r2.json"]["versions"]["cuda_extension"]["source_fingerprints"] = {"scheme": "2", hm: "e" * 16}
    assert [e["fingerprint"] for e in verified.build_record(results)["entries"] if e["verified"]] == ["f" * 16]


def test_a_failure_in_one_feature_leaves_the_others_verified():
    """Issue 33 item 3: the H200 run's per-tensor batched failure must not switch off cuBLASLt's
    FP8 blockwise; a component-wide failure does switch off every feature."""
    cl = "block_scaled_dot.cublaslt"
    cases = [("t::blockwise[a]", "passed", [cl], {cl: "fp8_blockwise"}),
             ("t::blockwise[b]", "passed", [cl], {cl: "fp8_blockwise"}),
             ("t::per_tensor", "passed", [cl], {cl: "per_tensor"}),
             ("t::per_tensor_batched", "failure", [cl], {cl: "per_tensor_batched"}),
             ("t::command_buffer", "failure", [cl], {cl: "command_buffer"}),
             ("t::mxfp8", "skipped", [cl], {cl: "mxfp8"})]
    rec = verified.build_record({"r.json": _result(cases, FPS)})
    ok, e = _verified_features(rec, cl)
    assert ok == ["fp8_blockwise", "per_tensor"] and not e["verified"]
    assert e["features"]["per_tensor_batched"]["failed"] == 1 and e["features"]["mxfp8"]["skipped"] == 1
    # a later run that passes per_tensor_batched at the same source turns it on, keeping the rest
    later = _result([("t::per_tensor_batched", "passed", [cl], {cl: "per_tensor_batched"})], FPS,
                    date="2026-02-01T00:00:00+00:00")
    ok, _ = _verified_features(verified.build_record({"r.json": _result(cases, FPS), "s.json": later}), cl)
    assert ok == ["fp8_blockwise", "per_tensor", "per_tensor_batched"]
    # a test naming no feature is about the whole component: its failure turns everything off
    wide = cases + [("t::handler_registers", "failure", [cl])]
    ok, e = _verified_features(verified.build_record({"r.json": _result(wide, FPS)}), cl)
    assert e["component_wide"]["failed"] == 1


def test_per_feature_check_on_a_simulated_h100(h100):
    cl = "block_scaled_dot.cublaslt"
    h100.record["entries"].append(record_entry(cl, "sm_90", h100.fingerprints[cl], {
        "fp8_blockwise": (5, 0), "per_tensor": (1, 0), "per_tensor_batched": (0, 1), "command_buffer": (2, 3)}))
    assert verified.check(cl, "fp8_blockwise").supported
    r = verified.check(cl, "per_tensor_batched")
    assert not r.supported and "for per_tensor_batched: 1 failed" in r.reason
    r = verified.check(cl, "mxfp8")
    assert not r.supported and "no GPU test of it ran (verified: fp8_blockwise, per_tensor" in r.reason
    assert not verified.check(cl).supported  # the whole component: something failed
    assert any("command_buffer failed" in c for c in verified.caveats(cl))
    # the backend's own feature of a problem decides: a batched per-tensor dot is passed over
    a = gx.quantize(jax.random.normal(jax.random.key(0), (3, 64, 256)), gx.FP8_TENSOR)
    b = gx.quantize(jax.random.normal(jax.random.key(1), (3, 128, 256)), gx.FP8_TENSOR)
    dn = (((2,), (2,)), ((0,), (0,)))
    (call,) = gx.explain(lambda p, q: gx.block_scaled_dot(p, q, dn), a, b, platform="cuda").calls
    assert call.chosen == "xla" and "for per_tensor_batched: 1 failed" in dict(call.rejected)["cublaslt"]


def test_legacy_results_get_features_by_test_name():
    """Results written before tests named features (the eff6f45 H200 run): LEGACY_FEATURES."""
    cl, fc = "block_scaled_dot.cublaslt", "formats.cuda"
    cases = [("tests.dot.test_block_scaled_dot::test_gpu_backend_matches_reference[cublaslt-fp8-1x128x128x128]",
              "passed", [cl]),
             ("tests.dot.test_block_scaled_dot::test_gpu_per_tensor_batched_and_vmapped", "failure", [cl]),
             ("tests.dot.test_block_scaled_dot::test_gpu_training_step_uses_cublaslt", "failure", [cl]),
             ("tests.formats.test_formats_gpu::test_cuda_matches_reference_bit_for_bit[bfloat16-FP8_128x128]",
              "failure", [fc]),
             ("tests.formats.test_formats_gpu::test_cuda_matches_reference_bit_for_bit[bfloat16-NVFP4]", "passed", [fc]),
             ("tests.formats.test_formats_gpu::test_float4_buffer_layout", "passed", [fc])]
    rec = verified.build_record({"r.json": _result(cases, FPS, features=False)})
    assert _verified_features(rec, cl)[0] == ["fp8_blockwise"]
    ok, e = _verified_features(rec, fc)
    assert ok == ["NVFP4"] and e["features"]["FP8_128x128"]["failed"] == 1 and e["component_wide"]["passed"] == 1
    # where features are recorded, a test that names none is component-wide, whatever its name
    rec = verified.build_record({"r.json": _result(cases, FPS)})
    assert _verified_features(rec, cl)[0] == [] and _verified_features(rec, cl)[1]["component_wide"]["failed"] == 2


def _collected_features(paths) -> dict[str, dict[str, str]]:
    """``{"module::test[params]": {component: feature}}`` as the markers give them, collected on CPU."""
    plugin = ("import json, os\n"
              "def pytest_collection_finish(session):\n"
              "    out = {}\n"
              "    for item in session.items:\n"
              "        props = dict(p for p in item.user_properties if p[0] == 'verifies_feature')\n"
              "        feats = dict(v.split('=', 1) for k, v in item.user_properties if k == 'verifies_feature')\n"
              "        comps = [v for k, v in item.user_properties if k == 'verifies']\n"
              "        out[item.nodeid] = {'components': comps, 'features': feats}\n"
              "    json.dump(out, open(os.environ['FEATURES_OUT'], 'w'))\n")
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "features_plugin.py").write_text(plugin)
        # No empty entry: an empty PYTHONPATH component means the working directory, the source tree
        # here, whose jax_gpuext has no compiled extension under a non-editable install (CI's).
        path = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH", "")) if p)
        env = os.environ | {"PYTHONPATH": path,
                            "FEATURES_OUT": f"{tmp}/out.json"}
        r = subprocess.run([sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "-p", "features_plugin",
                            "-p", "no:cacheprovider", *map(str, paths)], capture_output=True, text=True, cwd=ROOT,
                           env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        collected = json.loads((pathlib.Path(tmp) / "out.json").read_text())
    out = {}
    for nodeid, v in collected.items():
        path, _, name = nodeid.partition("::")
        out[path.removesuffix(".py").replace("/", ".") + "::" + name] = v
    return out


def test_markers_name_the_features_the_legacy_table_gives_the_committed_results():
    """The committed eff6f45 results get features from LEGACY_FEATURES; the tests now name theirs
    in their markers. For every test of those results that is still collected, both agree."""
    results = update_verified.load_results(ROOT)
    cases = {c["test"]: c for r in results.values() for c in r["gpu_tests"].get("cases", [])
             if c.get("verifies") and "features" not in c}  # only results written before cases named features
    files = sorted({ROOT / (t.split("::")[0].replace(".", "/") + ".py") for t in cases})
    collected = _collected_features([f for f in files if f.exists()])
    compared = 0
    for test, case in cases.items():
        if test not in collected:
            continue  # renamed or re-parametrized since
        for component in case["verifies"]:
            assert component in collected[test]["components"], (test, component)
            want = verified.legacy_feature(component, test)
            got = collected[test]["features"].get(component, verified.COMPONENT_WIDE)
            assert got == want, (test, component, got, want)
            compared += 1
    assert compared >= 60, compared


def test_every_feature_a_backend_names_is_one_its_tests_name():
    """Backend.feature and the tests' markers use one vocabulary: each feature a backend returns
    for the benchmarked problems is what the defaults table assumes (verified._BENCH_FEATURES)."""
    from jax_gpuext.dot import common as dot_common

    for (op, backend, pairing), feature in verified._BENCH_FEATURES.items():
        b = next(x for x in backends.backends(op) if x.name == backend)
        fl, fr = (gx.formats.FORMATS[n] for n in pairing.split(" x "))
        if op == "block_scaled_dot":
            a, w = gx.quantize(jnp.ones((128, 256)), fl), gx.quantize(jnp.ones((128, 256)), fr)
            p = dot_common._problem(a, w, None, jnp.dtype(jnp.bfloat16))
        else:
            from jax_gpuext.ragged_dot.common import RaggedProblem

            p = RaggedProblem("ragged_m", 256, 256, 128, 4, fl, fr, jnp.bfloat16, rhs_contract=2)
        assert b.feature(p) == feature, (op, backend, pairing)


def test_speeds_from_a_results_file_tolerate_added_fields():
    """The benchmark sections as the committed results hold them (bench_dot, hopper_mx, quantize,
    bench_ragged_dot), plus fields another version may add: only known columns become speeds."""
    result = {"date": "d", "commit": "c", "device": {"compute_cap": "9.0", "name": "NVIDIA H200"}, "benchmarks": [
        {"benchmark": "bench_dot", "rows": [{"M": 8192, "N": 8192, "K": 8192, "bf16": 800.0, "cublaslt_fp8_blockwise": 1280.0,
                                             "xla_fp8_blockwise": 50.0, "hopper_mx_mxfp8": 335.0, "fp8_per_tensor": 1400.0,
                                             "jax_scaled_matmul_mxfp8": 600.0, "new_field": 3.0,
                                             "xla_fp8_per_tensor_error": "x", "cudnn_nvfp4": None}]},
        {"benchmark": "hopper_mx", "rows": [{"case": "hopper_mx (end to end)", "format": "NVFP4", "M": 4096, "N": 4096,
                                             "K": 4096, "tflops": 132.0},
                                            {"case": "hopper_mx kernel only (m128n128)", "format": "NVFP4", "M": 4096,
                                             "N": 4096, "K": 4096, "tflops": 158.0}]},
        {"benchmark": "quantize", "rows": [{"format": "MXFP8_E4M3", "shape": [4096, 4096], "dtype": "bfloat16",
                                            "time_us": 172.0, "dequantize_time_us": 195.0, "extra": 1}],
         "xla_rows": [{"format": "MXFP8_E4M3", "backend": "xla", "time_us": 138.0}]},
        {"benchmark": "bench_ragged_dot", "rows": [{"layer": "up", "G": 32, "M": 4096, "K": 7168, "N": 4096,
                                                    "bf16_ragged_dot": 25.0, "hopper": 400.0, "cublaslt_row_align1": 1.0,
                                                    "cublaslt_row_align16": 300.0, "cublaslt_error": None}]},
        {"benchmark": "bench_something_new", "rows": [{"M": 1}]}]}
    got = {(m["op"], m["pairing"], m["backend"]): m for m in verified.measurements(result, "r.json")}
    assert set(got) == {("block_scaled_dot", "FP8_1x128 x FP8_128x128", "cublaslt"),
                        ("block_scaled_dot", "FP8_1x128 x FP8_128x128", "xla"),
                        ("block_scaled_dot", "MXFP8_E4M3 x MXFP8_E4M3", "hopper_mx"),
                        ("block_scaled_dot", "FP8_TENSOR x FP8_TENSOR", "cublaslt"),
                        ("block_scaled_dot", "NVFP4 x NVFP4", "hopper_mx"),
                        ("quantize", "MXFP8_E4M3", "cuda"), ("quantize", "MXFP8_E4M3", "xla"),
                        ("dequantize", "MXFP8_E4M3", "cuda"),
                        ("ragged_dot", "FP8_1x128 x FP8_128x128", "hopper"),
                        ("ragged_dot", "FP8_1x128 x FP8_128x128", "cublaslt")}
    blk = got[("block_scaled_dot", "FP8_1x128 x FP8_128x128", "cublaslt")]
    assert (blk["size_class"], blk["value"], blk["bf16"], blk["device"]) == (40, 1280.0, 800.0, "NVIDIA H200")
    q = got[("quantize", "MXFP8_E4M3", "xla")]  # xla rows have no shape: the run's rows give it
    assert q["shape"] == [4096, 4096] and q["size_class"] == 25 and q["time_us"] == 138.0
    assert got[("ragged_dot", "FP8_1x128 x FP8_128x128", "cublaslt")]["value"] == 300.0  # impl's row_align 16


def test_speeds_from_the_benchmarks_long_form():
    """The long-form `measurements` the benchmarks write since issue 33 (benchmarks/_devtime.py):
    preferred over their rows where present; errors and other ops are left out, and quantize's
    layouts are kept apart (test_long_form_keys_each_quantize_layout_apart)."""
    ms = [{"op": "dot", "backend": "xla_bf16", "format": None, "shape": [8192, 8192, 8192], "time_us": 1390.0,
           "tflops": 791.0},
          {"op": "block_scaled_dot", "backend": "cublaslt", "format": "FP8_1x128xFP8_128x128",
           "shape": [8192, 8192, 8192], "time_us": 860.0, "tflops": 1279.0, "k": 20, "samples": 5},
          {"op": "block_scaled_dot", "backend": "cudnn", "format": "MXFP8_E4M3xMXFP8_E4M3",
           "shape": [8192, 8192, 8192], "error": "gate blackwell"},
          {"op": "ragged_dot", "mode": "forward", "backend": "hopper", "format": "FP8_1x128xFP8_128x128",
           "shape": [4096, 7168, 4096, 32], "time_us": 600.0, "tflops": 400.0, "flops": 2.4e11},
          {"op": "ragged_dot", "mode": "wgrad", "backend": "hopper", "format": "FP8_1x128xFP8_128x128",
           "shape": [4096, 7168, 4096, 32], "time_us": 600.0, "tflops": 400.0},
          {"op": "quantize", "backend": "cuda", "format": "NVFP4", "variant": "NVFP4", "dtype": "bfloat16",
           "shape": [16384, 16384], "axis": -1, "time_us": 800.0, "gbps": 1000.0},
          {"op": "quantize", "backend": "cuda", "format": "NVFP4", "variant": "NVFP4", "dtype": "bfloat16",
           "shape": [16384, 16384], "axis": -2, "time_us": 900.0},
          {"op": "quantize_both_axes", "backend": "cuda", "format": "NVFP4", "dtype": "bfloat16",
           "shape": [16384, 16384], "axis": [-1, -2], "time_us": 900.0},
          {"op": "copy", "backend": "xla", "format": None, "dtype": "bfloat16", "shape": [16384, 16384],
           "time_us": 250.0}]
    result = {"date": "d", "commit": "c", "device": {"compute_cap": "9.0"},
              "benchmarks": [{"benchmark": "bench_dot", "device": "NVIDIA H100 80GB HBM3", "measurements": ms,
                              "rows": [{"M": 8192, "N": 8192, "K": 8192, "xla_mxfp8": 700.0}]}]}
    got = {(m["op"], m["pairing"], m["backend"]): m for m in verified.measurements(result, "r.json")}
    assert set(got) == {("block_scaled_dot", "FP8_1x128 x FP8_128x128", "cublaslt"),
                        ("ragged_dot", "FP8_1x128 x FP8_128x128", "hopper"), ("quantize", "NVFP4", "cuda"),
                        ("quantize", "NVFP4 axis -2", "cuda"), ("quantize", "NVFP4 both axes", "cuda")}
    blk = got[("block_scaled_dot", "FP8_1x128 x FP8_128x128", "cublaslt")]
    assert (blk["value"], blk["bf16"], blk["device"]) == (1279.0, 791.0, "NVIDIA H100 80GB HBM3")
    q = got[("quantize", "NVFP4", "cuda")]
    assert q["size_class"] == 29 and q["time_us"] == 800.0 and q["value"] == round(16384 * 16384 * 2 / 800.0 / 1e3, 2)


def test_format_names_are_the_formats():
    assert set(verified.FORMAT_NAMES) == set(gx.formats.FORMATS)
    # the formats whose blocks do not depend on the axis: 2-D tiles, or one scale for the tensor
    assert set(verified.AXIS_FREE_FORMATS) == {f.name for f in gx.formats.FORMATS.values()
                                               if f.per_tensor or len(f.block) == 2}


# --------------------------------------------------------------------------- quantize's layouts
def _quantize_rows(fmt="MXFP8_E4M3", shape=(4096, 4096), dtype="bfloat16"):
    """bench_quantize's long-form rows (benchmarks/bench_quantize.py dtype_rows): each layout, cuda and xla."""
    rows = []
    for backend, t in (("cuda", 100.0), ("xla", 200.0)):
        base = {"backend": backend, "format": fmt, "variant": fmt, "dtype": dtype, "shape": list(shape),
                "passes_over_x": 1, "time_us": t}
        rows += [dict(base, op="quantize", axis=-1), dict(base, op="quantize", axis=-2, time_us=t + 10),
                 dict(base, op="quantize_both_axes", axis=[-1, -2], time_us=t + 20),
                 dict(base, op="dequantize", axis=-1, passes_over_x=None, time_us=t + 30),
                 dict(base, op="dequantize", axis=-2, passes_over_x=None, time_us=t + 40)]
    return rows


def _long_form_speeds(rows):
    result = {"date": "d", "commit": "c", "device": {"compute_cap": "9.0"},
              "benchmarks": [{"benchmark": "quantize", "device": "NVIDIA H100 80GB HBM3", "measurements": rows}]}
    return {(m["op"], m["pairing"], m["backend"]): m for m in verified.measurements(result, "r.json")}


def test_long_form_keys_each_quantize_layout_apart():
    """Axis -2 and the fused pair get their own keys; the last axis keeps the format's name (the key
    of the committed results); dequantize of an axis -2 array is keyed axis -2; the fused pair's work
    is x's bytes read once, as speed_key counts a quantize_both_axes call."""
    got = _long_form_speeds(_quantize_rows())
    assert set(got) == {(op, "MXFP8_E4M3" + suffix, b) for b in ("cuda", "xla")
                        for op, suffix in (("quantize", ""), ("quantize", " axis -2"), ("quantize", " both axes"),
                                           ("dequantize", ""), ("dequantize", " axis -2"))}
    times = {k: m["time_us"] for k, m in got.items() if k[2] == "cuda"}
    assert times == {("quantize", "MXFP8_E4M3", "cuda"): 100.0, ("quantize", "MXFP8_E4M3 axis -2", "cuda"): 110.0,
                     ("quantize", "MXFP8_E4M3 both axes", "cuda"): 120.0,
                     ("dequantize", "MXFP8_E4M3", "cuda"): 130.0, ("dequantize", "MXFP8_E4M3 axis -2", "cuda"): 140.0}
    nbytes = 4096 * 4096 * 2
    for fmt, axis in ((gx.MXFP8_E4M3, -1), (gx.MXFP8_E4M3, -2), (gx.MXFP8_E4M3, verified.BOTH_AXES)):
        pairing, work, unit = verified.speed_key("quantize", (fmt, (4096, 4096), jnp.bfloat16, axis))
        m = got[("quantize", pairing, "cuda")]
        assert (m["work"], m["size_class"], unit) == (nbytes, verified.size_class(nbytes), "B")
        assert work == m["work"] and m["value"] == round(nbytes / m["time_us"] / 1e3, 2)
    # a problem without an axis (benchmarks/bench_cpu.py) is the last axis
    assert verified.speed_key("quantize", (gx.MXFP8_E4M3, (8, 32), jnp.float32))[0] == "MXFP8_E4M3"
    assert verified.speed_key("dequantize", (gx.NVFP4, (2, 8, 32), jnp.float32, -3))[0] == "NVFP4 axis -2"
    # formats whose blocks do not depend on the axis: one key for every layout, rows and calls alike
    tensor = _long_form_speeds(_quantize_rows("FP8_TENSOR"))
    assert {k[1] for k in tensor} == {"FP8_TENSOR"}
    for axis in (-1, -2, verified.BOTH_AXES):
        assert verified.speed_key("quantize", (gx.FP8_TENSOR, (64, 256), jnp.bfloat16, axis))[0] == "FP8_TENSOR"
    assert verified.speed_key("quantize", (gx.FP8_128x128, (256, 256), jnp.bfloat16, -1))[0] == "FP8_128x128"


def _quantize_call(fn, x):
    (call,) = gx.explain(fn, x, platform="cuda").calls
    return call


def test_auto_ranks_quantize_by_its_own_layout(h100):
    """CUDA measured faster on the last axis, the xla path on axis -2: auto takes cuda for
    quantize(axis=-1) and xla for quantize(axis=-2), and says which key it looked up."""
    h100.verify("formats.cuda")
    h100.measure("quantize", "MXFP8_E4M3", "xla", 200.0, (4096, 4096), unit="GB/s")
    h100.measure("quantize", "MXFP8_E4M3", "cuda", 900.0, (4096, 4096), unit="GB/s")
    h100.measure("quantize", "MXFP8_E4M3 axis -2", "xla", 400.0, (4096, 4096), unit="GB/s")
    h100.measure("quantize", "MXFP8_E4M3 axis -2", "cuda", 150.0, (4096, 4096), unit="GB/s")
    x = jnp.ones((64, 256), jnp.float32)
    last = _quantize_call(lambda v: gx.quantize(v, gx.MXFP8_E4M3, axis=-1), x)
    assert last.chosen == "cuda" and "MXFP8_E4M3 (last axis) on sm_90" in last.reason, last
    second = _quantize_call(lambda v: gx.quantize(v, gx.MXFP8_E4M3, axis=-2), x)
    assert second.chosen == "xla", second
    assert "slower than the xla path's" in dict(second.rejected)["cuda"] and "MXFP8_E4M3 axis -2 on sm_90" \
        in dict(second.rejected)["cuda"]
    assert _quantize_call(lambda v: gx.quantize(v, gx.MXFP8_E4M3, axis=0), x).chosen == "xla"  # axis 0 is axis -2
    # dequantize of an axis -2 array: its own key, never measured here, so the xla path (as any unmeasured key)
    h100.measure("dequantize", "MXFP8_E4M3", "xla", 200.0, (4096, 4096), unit="GB/s")
    h100.measure("dequantize", "MXFP8_E4M3", "cuda", 900.0, (4096, 4096), unit="GB/s")
    q_last, q_second = (jax.eval_shape(lambda v, a=a: gx.quantize(v, gx.MXFP8_E4M3, axis=a), x) for a in (-1, -2))
    assert _quantize_call(lambda q: gx.dequantize(q), q_last).chosen == "cuda"
    deq = _quantize_call(lambda q: gx.dequantize(q), q_second)
    assert deq.chosen == "xla" and deq.reason == "the xla path: no committed benchmark measured MXFP8_E4M3 axis -2 " \
        "on sm_90", deq
    # FP8_TENSOR's one scale: axis -2 is ranked by the format's one key
    h100.measure("quantize", "FP8_TENSOR", "xla", 200.0, (4096, 4096), unit="GB/s")
    h100.measure("quantize", "FP8_TENSOR", "cuda", 900.0, (4096, 4096), unit="GB/s")
    tensor = _quantize_call(lambda v: gx.quantize(v, gx.FP8_TENSOR, axis=-2), x)
    assert tensor.chosen == "cuda" and "FP8_TENSOR (every axis)" in tensor.reason, tensor


def test_auto_ranks_quantize_both_axes_by_the_fused_pair(h100):
    """quantize_both_axes is ranked by the fused pair's key, whatever the single axes measured; a
    format whose fused pair was never measured takes the xla path."""
    h100.verify("formats.cuda")
    for pairing, xla, cuda in (("MXFP8_E4M3", 400.0, 150.0), ("MXFP8_E4M3 axis -2", 400.0, 150.0),
                               ("MXFP8_E4M3 both axes", 300.0, 1200.0), ("MXFP8_E5M2", 200.0, 900.0)):
        h100.measure("quantize", pairing, "xla", xla, (4096, 4096), unit="GB/s")
        h100.measure("quantize", pairing, "cuda", cuda, (4096, 4096), unit="GB/s")
    x = jnp.ones((64, 256), jnp.float32)
    both = _quantize_call(lambda v: gx.quantize_both_axes(v, gx.MXFP8_E4M3), x)
    assert both.chosen == "cuda" and "MXFP8_E4M3 both axes on sm_90" in both.reason, both
    assert _quantize_call(lambda v: gx.quantize(v, gx.MXFP8_E4M3), x).chosen == "xla"
    e5 = _quantize_call(lambda v: gx.quantize_both_axes(v, gx.MXFP8_E5M2), x)  # only its last axis measured
    assert e5.chosen == "xla" and e5.reason == "the xla path: no committed benchmark measured MXFP8_E5M2 both axes " \
        "on sm_90"
    assert "not measured against the xla path for MXFP8_E5M2 both axes" in dict(e5.rejected)["cuda"]
    assert _quantize_call(lambda v: gx.quantize(v, gx.MXFP8_E5M2), x).chosen == "cuda"


def test_rank_takes_the_nearest_measured_class_and_never_a_slower_backend(h100):
    pairing = "FP8_1x128 x FP8_128x128"
    ours = {"cublaslt"}
    p = type("P", (), {"bmnk": (1, 128, 128, 128), "lhs_format": gx.FP8_1x128, "rhs_format": gx.FP8_128x128})()
    r = verified.rank("block_scaled_dot", p, ["cublaslt", "xla", "reference"], ours)
    assert r.chosen == "xla" and "not measured against the xla path" in r.passed_over["cublaslt"]
    h100.measure("block_scaled_dot", pairing, "xla", 50.0, (8192, 8192, 8192))   # class 40
    h100.measure("block_scaled_dot", pairing, "cublaslt", 1200.0, (8192, 8192, 8192))
    h100.measure("block_scaled_dot", pairing, "xla", 30.0, (128, 4096, 4096))    # class 32
    h100.measure("block_scaled_dot", pairing, "cublaslt", 29.0, (128, 4096, 4096))
    r = verified.rank("block_scaled_dot", p, ["cublaslt", "xla", "reference"], ours)  # 2^22: nearest is 2^32
    assert r.chosen == "xla" and "slower than the xla path's 30 TFLOP/s" in r.passed_over["cublaslt"]
    assert "this call 2^22 FLOP, the nearest measured" in r.reason
    big = type("P", (), {"bmnk": (1, 8192, 8192, 4096), "lhs_format": gx.FP8_1x128, "rhs_format": gx.FP8_128x128})()
    r = verified.rank("block_scaled_dot", big, ["cublaslt", "xla", "reference"], ours)  # 2^39: nearest is 2^40
    assert r.chosen == "cublaslt" and "1,200 TFLOP/s" in r.reason and r.passed_over["reference"] == "lower preference"
    assert [s["backend"] for s in r.speeds] == ["cublaslt", "xla"] and r.speeds[0]["chosen"]
    # within the margin of the xla path: a tie goes to XLA's own code
    h100.measure("block_scaled_dot", pairing, "cublaslt", 31.0, (128, 4096, 4096))
    h100.record["speeds"] = [m for m in h100.record["speeds"] if m["value"] != 29.0]
    r = verified.rank("block_scaled_dot", p, ["cublaslt", "xla"], ours)
    assert r.chosen == "xla" and "within 1.05x of the xla path" in r.passed_over["cublaslt"]
    # a tie between two classes goes to the smaller (2^36 is 2^4 from both 2^32 and 2^40)
    mid = type("P", (), {"bmnk": (1, 1024, 1024, 32768), "lhs_format": gx.FP8_1x128, "rhs_format": gx.FP8_128x128})()
    assert "size class 2^32" in verified.rank("block_scaled_dot", mid, ["cublaslt", "xla"], ours).reason


# --------------------------------------------------------------------------- the committed H200 record
FIRST_RUN = ("2026-11-27-1226-nvidia-h200-part1.json", "2026-11-27-1230-nvidia-h200-part2.json")
SECOND_RUN_COMMIT = "3ff9b827b6c58dd32c1d53bd98ec641565e6311a"


def _simulated_h200(monkeypatch, record: dict, fingerprints: dict):
    sim = SimulatedH100(monkeypatch)
    monkeypatch.setattr(verified, "record", lambda: record)
    sim.fingerprints.update(fingerprints)

    class H200(_Device):
        device_kind = "NVIDIA H200"

    monkeypatch.setattr(gates, "cuda_devices", lambda: (H200(),))
    from jax_gpuext.dot import cublaslt as dot_cublaslt

    # the trace-time cuBLASLt heuristic query needs the GPU
    monkeypatch.setattr(dot_cublaslt, "_prepare_on_local_gpus", lambda p: gates.GateResult(True, p.describe()))
    gates.clear_cache()


@pytest.fixture
def h200(monkeypatch):
    """The simulated GPU as the first H200 run saw it: sm_90, its device name, the record its
    committed results give (benchmarks/results/2026-11-27-12*), and a build whose fingerprints are
    that record's (the eff6f45 sources). Later runs add to the committed record; these tests pin the
    ranking the first run's numbers give (issue 33's "done when")."""
    results = {k: v for k, v in update_verified.load_results(ROOT).items() if k.endswith(FIRST_RUN)}
    assert len(results) == 2, sorted(update_verified.load_results(ROOT))
    committed = verified.build_record(results, update_verified.read_translations(ROOT))
    from jax_gpuext.formats import FP4_PACKED

    _simulated_h200(monkeypatch, committed, {e["component"]: e["fingerprint"] for e in committed["entries"]
                                              if e["architecture"] == "sm_90"})
    FP4_PACKED["cuda"] = True  # the H200's float4 layout (measured there)
    yield committed
    del FP4_PACKED["cuda"]
    gates.clear_cache()


@pytest.fixture
def h200_now(monkeypatch):
    """The committed record as it stands, on a simulated H200 running a build of THIS tree's sources
    (scripts/update_verified.py's fingerprints): what `auto` does for a user installing this commit."""
    committed = json.loads((ROOT / "jax_gpuext" / "common" / "verified.json").read_text())
    from jax_gpuext.formats import FP4_PACKED

    _simulated_h200(monkeypatch, committed, update_verified.fingerprints(ROOT))
    FP4_PACKED["cuda"] = True
    yield committed
    del FP4_PACKED["cuda"]
    gates.clear_cache()


def test_this_tree_on_an_h200_runs_cublaslt_for_fp8_blockwise_and_xla_elsewhere(h200_now):
    """With the second run's results (3ff9b82), cuBLASLt's FP8 blockwise dot is verified at this
    tree's cuBLASLt sources and measured faster than the xla path (now a bf16 GEMM): auto takes it.
    MXFP8 / NVFP4 run the xla path, and quantize the xla path while our kernels are not verified."""
    call = _dot_call(gx.FP8_1x128, gx.FP8_128x128, 8192, 8192, 8192)
    assert call.chosen == "cublaslt", call
    chosen = next(s for s in call.speeds if s["backend"] == "cublaslt")
    xla = next(s for s in call.speeds if s["backend"] == "xla")
    assert chosen["chosen"] and chosen["value"] > 1.05 * xla["value"], call.speeds
    assert any(SECOND_RUN_COMMIT[:7] in e["commit"] for e in h200_now["entries"]
               if e["component"] == "block_scaled_dot.cublaslt" and e["verified"])
    for fmt in (gx.MXFP8_E4M3, gx.NVFP4):
        assert _dot_call(fmt, fmt, 8192, 8192, 8192).chosen == "xla"
    (q,) = gx.explain(lambda v: gx.quantize(v, gx.MXFP8_E4M3), jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16),
                      platform="cuda").calls
    assert q.chosen == "xla", q


def _abstract(fmt, shape):
    return jax.eval_shape(lambda: gx.quantize(jnp.zeros(shape, jnp.bfloat16), fmt))


def _dot_call(fl, fr, m, n, k):
    a, b = _abstract(fl, (m, k)), _abstract(fr, (n, k))
    (call,) = gx.explain(lambda x, y: gx.block_scaled_dot(x, y, preferred_element_type=jnp.bfloat16), a, b,
                         platform="cuda").calls
    return call


def test_h200_record_fp8_blockwise_runs_cublaslt_and_explain_shows_the_numbers(h200):
    a, b = _abstract(gx.FP8_1x128, (8192, 8192)), _abstract(gx.FP8_128x128, (8192, 8192))
    ex = gx.explain(lambda x, y: gx.block_scaled_dot(x, y, preferred_element_type=jnp.bfloat16), a, b,
                    platform="cuda")
    (call,) = ex.calls
    assert call.chosen == "cublaslt", str(ex)
    text = str(ex)
    for part in ("cublaslt  1,272 TFLOP/s (1.62x bf16) at 8192^3  <- chosen", "xla       50 TFLOP/s (0.06x bf16) at 8192^3",
                 "2026-11-27-1226-nvidia-h200-part1.json", "2026-11-27-1230-nvidia-h200-part2.json",
                 "sm_90 NVIDIA H200", "size class 2^40"):
        assert part in text, (part, text)
    assert "slower than cublaslt's 1,272 TFLOP/s" in dict(call.rejected)["xla"]
    # the failed command-buffer and training-step checks gate nothing, and are shown
    assert any("command_buffer failed" in n for n in call.notes) and any("training_step" in n for n in call.notes)
    assert call.speeds[0]["backend"] == "cublaslt" and call.speeds[0]["chosen"]
    # a per-tensor-batched failure leaves fp8_blockwise verified, and per_tensor: the H200 record itself
    assert verified.check("block_scaled_dot.cublaslt", "fp8_blockwise").supported
    assert verified.check("block_scaled_dot.cublaslt", "per_tensor").supported
    assert not verified.check("block_scaled_dot.cublaslt", "per_tensor_batched").supported


@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.NVFP4], ids=lambda f: f.name)
def test_h200_record_mx_and_nvfp4_run_the_xla_path_where_it_measured_faster(h200, fmt):
    call = _dot_call(fmt, fmt, 8192, 8192, 8192)
    assert call.chosen == "xla", call
    why = dict(call.rejected)["hopper_mx"]
    assert why.startswith(backends.PASSED_OVER) and "slower than the xla path's" in why
    assert verified.check("block_scaled_dot.hopper_mx", fmt.name.split("_")[0].lower()).supported
    assert {s["backend"] for s in call.speeds} == {"xla", "hopper_mx"}


def test_h200_record_decode_sized_mxfp8_runs_hopper_mx_where_it_measured_faster(h200):
    """M=128 (one decode step of 128 sequences): hopper_mx measured 68 vs the xla path's 57 TFLOP/s."""
    call = _dot_call(gx.MXFP8_E4M3, gx.MXFP8_E4M3, 128, 4096, 4096)
    assert call.chosen == "hopper_mx" and "68 TFLOP/s" in call.reason and "57 TFLOP/s" in call.reason
    assert _dot_call(gx.NVFP4, gx.NVFP4, 128, 4096, 4096).chosen == "xla"


def test_h200_record_per_tensor_is_not_measured_against_xla(h200):
    call = _dot_call(gx.FP8_TENSOR, gx.FP8_TENSOR, 256, 256, 256)
    assert call.chosen == "xla" and "not measured against the xla path" in dict(call.rejected)["cublaslt"]


@pytest.mark.parametrize("fmt,want", [(gx.MXFP8_E4M3, "xla"), (gx.MXFP8_E5M2, "xla"), (gx.FP8_1x128, "xla"),
                                      (gx.FP8_TENSOR, "xla"), (gx.MXFP4, "xla"), (gx.FP8_128x128, "xla"),
                                      (gx.NVFP4, "cuda")], ids=lambda v: getattr(v, "name", v))
def test_h200_record_quantize_runs_xla_while_it_measured_faster(h200, fmt, want):
    """At 4096x4096 bf16 (the committed bench_quantize --quick rows) the xla backend measured faster
    for every format but NVFP4 (ours 240 us, xla 277 us); FP8_128x128's CUDA tests failed (a test
    helper's IndexError), so it is passed over whatever its speed."""
    (call,) = gx.explain(lambda v: gx.quantize(v, fmt), jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16),
                         platform="cuda").calls
    assert call.chosen == want, call
    why = dict(call.rejected).get("cuda", "")
    if fmt is gx.FP8_128x128:
        assert "for FP8_128x128: 3 failed" in why
    elif want == "xla":
        assert "slower than the xla path's" in why and call.speeds
    else:
        assert "240 us" in call.reason and "277 us" in call.reason


def test_h200_record_with_changed_kernels_runs_xla_and_says_why(h200, monkeypatch):
    """This round changes kernels: a build at another fingerprint is not verified, whatever the
    speeds say, and update_verified.py names the files that changed."""
    monkeypatch.setattr(verified, "build_fingerprints", lambda: {c: "0" * 16 for c in verified.COMPONENTS})
    call = _dot_call(gx.FP8_1x128, gx.FP8_128x128, 8192, 8192, 8192)
    assert call.chosen == "xla" and "this build is 0000000000000000" in dict(call.rejected)["cublaslt"]


def test_allow_unverified_ignores_the_speeds_too(h200, monkeypatch):
    monkeypatch.setenv(verified.ALLOW_ENV, "1")
    assert _dot_call(gx.MXFP8_E4M3, gx.MXFP8_E4M3, 8192, 8192, 8192).chosen == "hopper_mx"


def test_defaults_tables_from_the_committed_record():
    """The tables from the first H200 run's record (pinned numbers), and the committed record's
    own rows for FP8 blockwise at 8192^3 (whatever the newest run measured)."""
    now = json.loads((ROOT / "jax_gpuext" / "common" / "verified.json").read_text())
    assert "| block_scaled_dot | FP8_1x128 x FP8_128x128 | 8192^3 (2^40) | `cublaslt` |" in verified.defaults_markdown(now)
    results = {k: v for k, v in update_verified.load_results(ROOT).items() if k.endswith(FIRST_RUN)}
    rec = verified.build_record(results, update_verified.read_translations(ROOT))
    full = verified.defaults_markdown(rec)
    assert "| block_scaled_dot | FP8_1x128 x FP8_128x128 | 8192^3 (2^40) | `cublaslt` | 1,272 TFLOP/s (1.62x bf16) |" \
        in full
    assert "| block_scaled_dot | MXFP8_E4M3 x MXFP8_E4M3 | 8192^3 (2^40) | `xla` |" in full
    compact = verified.defaults_markdown(rec, compact=True)
    assert "| block_scaled_dot | MXFP8_E4M3 x MXFP8_E4M3 | 2^32 - 2^35 | `hopper_mx` |" in compact
    assert "| block_scaled_dot | MXFP8_E4M3 x MXFP8_E4M3 | 2^36 - 2^40 | `xla` |" in compact
    assert "NVIDIA H200" in compact


# --------------------------------------------------------------------------- the committed files
def _independent_check(entry: dict, root: pathlib.Path) -> None:
    """What the CI test asserts of every entry, read straight from its results file."""
    result = json.loads((root / entry["results"]).read_text())
    assert "sm_" + result["device"]["compute_cap"].replace(".", "") == entry["architecture"]
    fps = result["versions"]["cuda_extension"]["source_fingerprints"]
    if fps.get(verified.SCHEME_KEY) == verified.FINGERPRINT_SCHEME:
        assert fps[entry["component"]] == entry["fingerprint"]
    else:  # translated from git (scheme 1): the table names the results' commit
        table = update_verified.read_translations(root)
        assert table[result["commit"]][entry["component"]] == entry["fingerprint"]
    cases = [c for c in result["gpu_tests"]["cases"] if entry["component"] in c.get("verifies", [])]
    for feature, t in entry["features"].items():
        if t["results"] != entry["results"]:
            continue
        outcomes = [c["outcome"] for c in cases if verified.case_feature(result, c, entry["component"]) == feature]
        assert t["passed"] == outcomes.count("passed") and t["failed"] == outcomes.count("failure") + \
            outcomes.count("error"), (entry["component"], feature)
        assert t["verified"] == (t["passed"] > 0 and t["failed"] == 0)


def test_committed_record_is_generated_from_the_committed_results():
    """CI: the record, docs/gates.md's tables and the README paragraph are what the results give,
    and every entry holds against its results file."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "update_verified.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = json.loads((ROOT / "jax_gpuext" / "common" / "verified.json").read_text())
    assert rec == verified.build_record(update_verified.load_results(ROOT), update_verified.read_translations(ROOT))
    assert verified.record() == rec, "the installed record differs from the tree's: reinstall"
    for entry in rec["entries"]:
        _independent_check(entry, ROOT)


EFF6F45 = "eff6f4546a03676ebf2d28f44736b1c21e0db694"


def _has_commit(commit) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_commit(EFF6F45), reason="no git history here (a source archive or a shallow checkout)")
def test_the_h200_runs_scheme_1_fingerprints_are_its_commits_and_translate():
    """The eff6f45 build's reported (scheme-1) fingerprints are that commit's files under its own
    spec, so its scheme-2 fingerprints are that commit's files under today's spec."""
    result = json.loads((ROOT / "benchmarks/results/2026-11-27-1226-nvidia-h200-part1.json").read_text())
    reported = result["versions"]["cuda_extension"]["source_fingerprints"]
    assert update_verified.commit_fingerprints(ROOT, EFF6F45) == reported
    assert update_verified.translate(ROOT, EFF6F45, reported) == update_verified.read_translations(ROOT)[EFF6F45]
    with pytest.raises(ValueError, match="not that commit's tree"):
        update_verified.translate(ROOT, EFF6F45, {**reported, "formats.cuda": "0" * 16})


@pytest.mark.skipif(not _has_commit(EFF6F45), reason="no git history here")
def test_update_script_says_what_became_unverified_and_why(tmp_path):
    """A kernel file changed since the run that verified it: the script names it."""
    rec = json.loads((ROOT / "jax_gpuext" / "common" / "verified.json").read_text())
    hm = next(e for e in rec["entries"] if e["component"] == "block_scaled_dot.hopper_mx")
    tree = update_verified.fingerprints(ROOT)
    lines = update_verified.unverified_here({"entries": [{**hm, "fingerprint": "0" * 16}]}, ROOT)
    assert len(lines) == 1 and "block_scaled_dot.hopper_mx (sm_90; verified: mxfp8, nvfp4) becomes unverified" in lines[0]
    changed = update_verified.changed_since(ROOT, "block_scaled_dot.hopper_mx", EFF6F45)
    assert (tree["block_scaled_dot.hopper_mx"] == hm["fingerprint"]) == (not changed)
    assert update_verified.unverified_here({"entries": [{**hm, "fingerprint": tree["block_scaled_dot.hopper_mx"]}]},
                                           ROOT) == []


def test_update_script_on_a_tree_with_results(tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    hm = "block_scaled_dot.hopper_mx"
    result = _result([("t::a", "passed", [hm], {hm: "mxfp8"})], FPS)
    result["benchmarks"] = [{"benchmark": "bench_dot", "rows": [{"M": 128, "N": 4096, "K": 4096, "bf16": 68.0,
                                                                 "hopper_mx_mxfp8": 68.0, "xla_mxfp8": 57.0}]}]
    (tmp_path / "benchmarks" / "results" / "2026-01-01-h100.json").write_text(json.dumps(result))
    for page in ("README.md", "docs/gates.md"):
        (tmp_path / page).write_text(f"# x\n{update_verified.BEGIN}\nold\n{update_verified.END}\ntail\n"
                                     + (f"{update_verified.DEFAULTS_BEGIN}\n{update_verified.DEFAULTS_END}\n"
                                        if page == "docs/gates.md" else ""))
    (tmp_path / "jax_gpuext" / "common").mkdir(parents=True)
    out = update_verified.generated(tmp_path)
    rec = json.loads(out[tmp_path / "jax_gpuext" / "common" / "verified.json"])
    assert [e["results"] for e in rec["entries"]] == ["benchmarks/results/2026-01-01-h100.json"]
    for entry in rec["entries"]:
        _independent_check(entry, tmp_path)
    gates_md = out[tmp_path / "docs" / "gates.md"]
    assert "| block_scaled_dot | `block_scaled_dot.hopper_mx` | sm_90 | `ffffffffffffffff` | mxfp8 | - |" in gates_md
    assert "| block_scaled_dot | MXFP8_E4M3 x MXFP8_E4M3 | 128x4096x4096 (2^32) | `hopper_mx` | 68 TFLOP/s" in gates_md
    assert "`block_scaled_dot.hopper_mx` (sm_90: mxfp8)" in out[tmp_path / "README.md"]
    assert out[tmp_path / "README.md"].endswith(f"{update_verified.END}\ntail\n")


def test_installed_fingerprints_are_this_trees():
    """CMake (cmake/source_fingerprints.cmake) and the script hash the same files the same way."""
    built = _ext.build_info("cpu")["source_fingerprints"]
    assert set(built) == set(verified.COMPONENTS) | {verified.SCHEME_KEY}, "built with another scheme: reinstall"
    assert built.pop(verified.SCHEME_KEY) == verified.FINGERPRINT_SCHEME
    assert built == update_verified.fingerprints(ROOT), "sources changed since the install: reinstall"


def test_cmake_computes_the_scripts_fingerprints(tmp_path):
    """cmake/source_fingerprints.cmake, configured on this tree without building anything, gives
    what update_verified.fingerprints gives (and the scheme), so a build carries the tree's."""
    import shutil

    if shutil.which("cmake") is None:
        pytest.skip("no cmake on PATH")
    src = tmp_path / "src"
    src.mkdir()
    for top in ("cmake", "csrc", "ffi", "jax_gpuext"):
        (src / top).symlink_to(ROOT / top)
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.24)\nproject(fp NONE)\n"
                                        "include(cmake/source_fingerprints.cmake)\n")
    r = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "build")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "source fingerprints" in ln)
    got = _ext.parse_fingerprints(line.split("source fingerprints ", 1)[1].strip())
    assert got.pop(verified.SCHEME_KEY) == verified.FINGERPRINT_SCHEME
    assert got == update_verified.fingerprints(ROOT)


def test_write_results_records_what_each_test_verifies(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    work.mkdir(), out.mkdir()
    info = json.loads(subprocess.run([sys.executable, "-P", "-m", "jax_gpuext", "info", "--json"],
                                     capture_output=True, text=True, check=True, cwd=tmp_path).stdout)
    info["extensions"]["cuda"] = {"source_fingerprints": {"scheme": "2", **FPS}}  # as a CUDA build reports them
    (work / "info.json").write_text(json.dumps(info))
    hm, cl = "block_scaled_dot.hopper_mx", "block_scaled_dot.cublaslt"
    (work / "gpu-tests-main.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        f'<properties><property name="verifies_collected" value="{cl},{hm},formats.cuda"/></properties>'
        f'<testcase classname="t" name="a" time="1"><properties><property name="verifies" value="{hm}"/>'
        '</properties></testcase>'
        '<testcase classname="t" name="b" time="1"><properties><property name="verifies" value="formats.cuda"/>'
        '<property name="verifies_feature" value="formats.cuda=NVFP4"/>'
        '</properties><skipped message="arch"/></testcase>'
        f'<testcase classname="t" name="c" time="1"><properties><property name="verifies" value="{cl}"/>'
        f'<property name="verifies_feature" value="{cl}=per_tensor_batched"/>'
        '</properties><failure message="CUBLAS_STATUS_NOT_SUPPORTED">E  boom</failure></testcase>'
        '</testsuite></testsuites>')
    (work / "test_exits.txt").write_text("main 1\n")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "write_results.py"), "--work", str(work),
                    "--out-dir", str(out), "--tests-status", "1"], check=True)
    (js,) = out.glob("*.json")
    result = json.loads(js.read_text())
    assert [c.get("verifies") for c in result["gpu_tests"]["cases"]] == [[hm], ["formats.cuda"], [cl]]
    assert [c.get("features") for c in result["gpu_tests"]["cases"]] == [{}, {"formats.cuda": "NVFP4"},
                                                                          {cl: "per_tensor_batched"}]
    assert result["gpu_tests"]["features_recorded"] is True
    result["device"]["compute_cap"] = "9.0"  # no nvidia-smi here
    rec = verified.build_record({"r.json": result})
    by = {e["component"]: e for e in rec["entries"]}
    assert by[hm]["verified"] and by[hm]["component_wide"]["passed"] == 1 and by[hm]["fingerprint"] == "f" * 16
    assert by[cl]["features"]["per_tensor_batched"]["failed"] == 1
    md = next(out.glob("*.md")).read_text()
    assert "### Per backend (verification record)" in md and "| block_scaled_dot.cublaslt | per_tensor_batched |" in md


# --------------------------------------------------------------------------- visible state
def test_info_json_carries_the_verification_state():
    p = subprocess.run([sys.executable, "-P", "-m", "jax_gpuext", "info", "--json"], capture_output=True, text=True)
    report = json.loads(p.stdout)["verified"]
    assert set(report["backends"]) == set(verified.COMPONENTS)
    b = report["backends"]["block_scaled_dot.hopper_mx"]
    assert b["here"]["verified"] is False and b["here"]["reason"] == "no CUDA device"
    newest = [e for e in verified.record()["entries"] if e["component"] == "block_scaled_dot.hopper_mx"
              and e["architecture"] == "sm_90"]
    assert b["architectures"]["sm_90"]["features"] in [{k: v["verified"] for k, v in e["features"].items()}
                                                       for e in newest]  # a committed H200 run's
    cpu_fps = dict(_ext.build_info("cpu")["source_fingerprints"])
    assert b["source_fingerprint"] == cpu_fps["block_scaled_dot.hopper_mx"]
    assert report["fingerprint_scheme"]["record"] == verified.FINGERPRINT_SCHEME
    text = subprocess.run([sys.executable, "-P", "-m", "jax_gpuext", "info"], capture_output=True, text=True).stdout
    assert "verified GPU backends" in text and "block_scaled_dot.hopper_mx" in text


def test_info_on_the_simulated_h100(h100):
    h100.verify("formats.cuda")
    report = gx.capabilities()["verified"]
    assert report["architecture"] == "sm_90"
    assert report["backends"]["formats.cuda"]["here"]["verified"] is True
    assert report["backends"]["formats.cuda"]["architectures"]["sm_90"]["results"] == "benchmarks/results/sim.json"
    assert report["backends"]["formats.cuda"]["here"]["features"]["NVFP4"].startswith("verified on sm_90")
    assert report["backends"]["block_scaled_dot.cudnn"]["here"]["reason"] == NOT_VERIFIED


def test_a_group_cut_short_blames_only_what_it_did_not_finish():
    """The H200 run of 3ff9b82 hit its step bound in the `main` group after every cuBLASLt test had
    run (and passed): with the group's selected-test counts the cut blames only components whose
    selected tests did not all finish; without them, every component the group could hold."""
    def run(counts=None, members=None, with_group=True):
        cases = [{"test": f"t::dot_{i}", "outcome": "passed", "verifies": ["block_scaled_dot.cublaslt"],
                  "features": {"block_scaled_dot.cublaslt": "fp8_blockwise"}} for i in range(3)]
        cases.append({"test": "t::fmt_0", "outcome": "passed", "verifies": ["formats.cuda"],
                      "features": {"formats.cuda": "NVFP4"}})
        if with_group:
            for c in cases:
                c["group"] = "main"
        tests = {"cases": cases, "features_recorded": True,
                 "cut_short": [{"group": "main", "verifies_collected": ["block_scaled_dot.cublaslt", "formats.cuda"]}]}
        if counts is not None:
            tests["collected_counts"] = {"main": counts}
        if members is not None:
            tests["collected_tests"] = {"main": members}
        return {"gpu_tests": tests, "device": {"compute_cap": "9.0"},
                "versions": {"cuda_extension": {"source_fingerprints": {"block_scaled_dot.cublaslt": "a",
                                                                          "formats.cuda": "b"}}}}

    counts = {"block_scaled_dot.cublaslt": {"fp8_blockwise": 3}, "formats.cuda": {"NVFP4": 1, "MXFP4": 5}}
    new = run(counts)
    assert verified.evidence(new, "block_scaled_dot.cublaslt")["cut_short"] == []
    assert verified.evidence(new, "formats.cuda")["cut_short"] == ["main"]  # 5 MXFP4 tests never ran
    old = run()  # no counts: the group could hold both, so both are blamed
    assert verified.evidence(old, "block_scaled_dot.cublaslt")["cut_short"] == ["main"]
    # a run that predates the per-case group: membership from the derived list of selected tests
    derived = run(counts, members=["t::dot_0", "t::dot_1", "t::dot_2", "t::fmt_0"], with_group=False)
    assert verified.evidence(derived, "block_scaled_dot.cublaslt")["cut_short"] == []
    short = run({"block_scaled_dot.cublaslt": {"fp8_blockwise": 4}})  # one selected test did not finish
    assert verified.evidence(short, "block_scaled_dot.cublaslt")["cut_short"] == ["main"]
