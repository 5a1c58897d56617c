"""jax.export of functions that use our ops (issue 27 item 3): ``export_disabled_checks()`` names
every target our ops may emit, and a program exported here runs in a fresh process after
nothing but ``import jax_gpuext`` (and fails there without it: the test can fail)."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import pkgutil
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext.common import extension as _ext

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _check_names(checks) -> set[str]:
    # DisabledSafetyCheck.custom_call(t) is the check "custom_call:<t>" (jax/_src/export/_export.py)
    return {c.is_custom_call() for c in checks}


def test_disabled_checks_name_every_target_the_sources_register():
    # Every module that may emit a target, imported (the package root imports each op's; this
    # also reaches backends of ops not yet public), has declared it.
    # Only Python modules: the native extensions register nothing themselves (Python declares each
    # target), and `_nvshmem` links the optional NVSHMEM library, absent without the [nvshmem] extra.
    for m in pkgutil.walk_packages(gx.__path__, "jax_gpuext."):
        spec = importlib.util.find_spec(m.name)
        if m.ispkg or (spec is not None and str(spec.origin).endswith(".py")):
            importlib.import_module(m.name)
    checks = gx.export_disabled_checks()
    assert all(isinstance(c, jax.export.DisabledSafetyCheck) for c in checks)
    names = _check_names(checks)
    in_sources = set()
    for path in (ROOT / "ffi").rglob("*.cc"):
        if path.name == "timer.cc":  # the benchmarks' event marks (benchmarks/_devtime.py): no op emits them
            continue
        in_sources |= set(re.findall(r'GPUEXT_REGISTER_FFI_(?:TARGET|STAGE)\("(\w+)"', path.read_text()))
    assert in_sources and names == in_sources
    assert set(_ext.module("cpu").registrations()) <= names
    assert set(_ext.TARGETS.values()) == {"quantize", "dequantize", "block_scaled_dot", "place",
                                         "all_reduce", "ragged_dot", "quantize_token_slots"}


def _program():
    """Every op with a CPU custom call, forward and backward: quantize, dequantize,
    block_scaled_dot, scaled_dot_general (its custom_vjp), place."""
    def f(x, w):
        qx, qw = gx.quantize(x, gx.MXFP8_E4M3), gx.quantize(w.T, gx.NVFP4)
        y = gx.block_scaled_dot(qx, gx.quantize(w.T, gx.MXFP8_E4M3), backend="reference")
        loss = lambda w: jnp.sum(gx.scaled_dot_general(x, w, (((1,), (0,)), ((), ()))) ** 2)  # noqa: E731
        return (y, gx.dequantize(qw, jnp.float32), jax.grad(loss)(w),
                gx.place(x, gx.MemorySpace.TEMP, backend="identity"))
    return f


def _run(code: str):
    # -P: the installed package, not a source tree in the working directory (no compiled modules)
    return subprocess.run([sys.executable, "-P", "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


def test_exported_program_runs_in_a_fresh_process_after_import(tmp_path):
    x = jax.random.normal(jax.random.key(0), (8, 64))
    w = jax.random.normal(jax.random.key(1), (64, 32))
    with pytest.raises(Exception, match="gpuext_"):  # jax's default safety check refuses our targets
        jax.export.export(jax.jit(_program()))(x, w)
    exp = jax.export.export(jax.jit(_program()), disabled_checks=gx.export_disabled_checks())(x, w)
    text = exp.mlir_module()
    for target in ("gpuext_quantize", "gpuext_dequantize", "gpuext_place"):
        assert target in text, target
    (tmp_path / "f.bin").write_bytes(exp.serialize())
    np.savez(tmp_path / "io.npz", x=x, w=w, *[np.asarray(r) for r in jax.jit(_program())(x, w)])
    run = f"""
        import numpy as np, jax
        import jax.export  # jax 0.7 does not import the submodule with jax
        exp = jax.export.deserialize(bytearray(open({str(tmp_path / 'f.bin')!r}, 'rb').read()))
        io = np.load({str(tmp_path / 'io.npz')!r})
        got = exp.call(io['x'], io['w'])
        for i, g in enumerate(got):
            np.testing.assert_array_equal(np.asarray(g), io[f'arr_{{i}}'])
        print('ran', len(got))
        """
    bare = _run(run)  # control: a fresh process without our import has no handlers
    assert bare.returncode != 0 and "gpuext_" in bare.stderr, bare.stderr[-2000:]
    # our import alone, and it initializes no jax backend (jax.distributed.initialize may follow it)
    ours = _run("import jax_gpuext\nfrom jax._src import xla_bridge\n"
                "assert not getattr(xla_bridge, '_backends', None), 'import initialized a backend'\n" + textwrap.dedent(run))
    assert ours.returncode == 0 and "ran 4" in ours.stdout, ours.stderr[-3000:]


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32) if a.dtype.itemsize == 4 else a


def test_quantized_arrays_in_an_exports_signature_serialize():
    """Functions returning BlockScaledArray (quantize_both_axes, NVFP4 with its global scale) or a
    GroupedBlockScaledArray, and taking one, serialize and give the same bits after
    deserialization: the classes are registered with jax.export (format by name, axis, groups)."""
    x = jax.random.normal(jax.random.key(3), (64, 160), jnp.bfloat16)
    sizes = jnp.array([10, 40, 0], jnp.int32)
    checks = gx.export_disabled_checks()
    cases = [(jax.jit(lambda v: gx.quantize_both_axes(v, gx.NVFP4)), (x,)),
             (jax.jit(lambda v, s: gx.quantize_grouped(v, gx.MXFP4, s, axis=0)), (x, sizes))]
    for f, args in cases:
        exp = jax.export.deserialize(jax.export.export(f, disabled_checks=checks)(*args).serialize())
        got, want = exp.call(*args), f(*args)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_array_equal(_bits(g), _bits(w))
    q = gx.quantize(x, gx.MXFP8_E5M2, axis=-2)
    deq = jax.jit(lambda q: gx.dequantize(q, jnp.float32))
    exp = jax.export.deserialize(jax.export.export(deq, disabled_checks=checks)(q).serialize())
    assert exp.in_tree == jax.tree_util.tree_structure(((q,), {}))
    np.testing.assert_array_equal(np.asarray(exp.call(q)), np.asarray(deq(q)))


def test_quantized_array_from_another_version_is_refused_clearly():
    """An export whose signature names an array layout this jax_gpuext cannot read (here: the
    version field of its serialized aux data changed) fails to deserialize with a clear error."""
    x = jax.random.normal(jax.random.key(4), (32, 64))
    f = jax.jit(lambda v: gx.quantize(v, gx.FP8_1x128))
    blob = bytes(jax.export.export(f, disabled_checks=gx.export_disabled_checks())(x).serialize())
    assert blob.count(b'"version": 1') == 1
    with pytest.raises(ValueError, match="another jax_gpuext version"):
        jax.export.deserialize(bytearray(blob.replace(b'"version": 1', b'"version": 9')))


def test_registration_failure_is_recorded_not_raised(monkeypatch):
    """import must never fail: XLA refusing a target turns the extension's gate off, with why."""
    from jax_gpuext.common import gates

    monkeypatch.setattr(_ext, "_registered", set())
    monkeypatch.setattr(_ext, "_registration_errors", {})

    def refuse(name, handler, platform):
        raise RuntimeError(f"no {name} here")
    monkeypatch.setattr(jax.ffi, "register_ffi_target", refuse)
    _ext.ensure_all_registered()
    assert "no gpuext_" in _ext.registration_error("cpu")
    gates.clear_cache()
    try:
        r = gates.check("cpu_extension")
        assert not r.supported and "registering its FFI targets failed: RuntimeError: no gpuext_" in r.reason
    finally:
        monkeypatch.undo()
        gates.clear_cache()
    assert gates.check("cpu_extension").supported


def test_exported_all_reduce_runs_in_a_fresh_process_after_import(tmp_path):
    """The CPU protocol handler (gpuext_all_reduce) under shard_map over 4 host devices (conftest
    gives this process 8, and the child inherits XLA_FLAGS)."""
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    f = jax.jit(jax.shard_map(lambda v: gx.all_reduce(v, "d", algorithm="one_shot"), mesh=mesh,
                              in_specs=P("d"), out_specs=P("d"), check_vma=False))
    x = jax.random.normal(jax.random.key(2), (4, 8))
    exp = jax.export.export(f, disabled_checks=gx.export_disabled_checks())(x)
    assert "gpuext_all_reduce" in exp.mlir_module()
    (tmp_path / "f.bin").write_bytes(exp.serialize())
    np.savez(tmp_path / "io.npz", x=x, y=f(x))
    ours = _run(f"""
        import jax_gpuext
        import jax, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        exp = jax.export.deserialize(bytearray(open({str(tmp_path / 'f.bin')!r}, 'rb').read()))
        io = np.load({str(tmp_path / 'io.npz')!r})
        mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
        got = jax.jit(exp.call)(jax.device_put(io['x'], NamedSharding(mesh, P("d"))))
        np.testing.assert_array_equal(np.asarray(got), io['y'])
        print('ran')
        """)
    assert ours.returncode == 0 and "ran" in ours.stdout, ours.stderr[-3000:]


SYMBOLIC_CASES = {  # a symbolic batch along the quantized axis, the amax passes, the gradient's re-quantization
    "mx-axis0": lambda x: gx.quantize(x, gx.MXFP8_E4M3, axis=0),
    "both-axes": lambda x: gx.quantize_both_axes(x, gx.MXFP4),
    "nvfp4-default-global-scale": lambda x: gx.quantize(x, gx.NVFP4),
    "per-tensor": lambda x: gx.quantize(x, gx.FP8_TENSOR),
    "128x128": lambda x: gx.dequantize(gx.quantize(x, gx.FP8_128x128)),
    "scaled-dot-general-grad": lambda x: jax.grad(lambda x: jnp.sum(gx.scaled_dot_general(
        x, jnp.linspace(-1, 1, 96 * 40).reshape(96, 40), (((1,), (0,)), ((), ())),
        format=(gx.FP8_1x128, gx.FP8_128x128)) ** 2))(x),
}


@pytest.mark.parametrize("case", list(SYMBOLIC_CASES))
def test_symbolic_batch_exports_and_gives_the_same_bits(case):
    """jax.export with a symbolic leading dimension (the batch / tokens): quantizing along it, the
    whole-tensor amax passes (NVFP4's default global scale, per-tensor FP8) and the backward's
    re-quantization along the free dims compared a symbolic length with the block (or a chunk) in
    Python and failed to trace; the exported program now gives quantize's bits for two batch sizes."""
    f = SYMBOLIC_CASES[case]
    b, = jax.export.symbolic_shape("b")
    exp = jax.export.export(jax.jit(f), disabled_checks=gx.export_disabled_checks())(
        jax.ShapeDtypeStruct((b, 96), jnp.float32))
    exp = jax.export.deserialize(exp.serialize())
    for rows in (37, 300):
        x = jax.random.normal(jax.random.key(rows), (rows, 96)) * 3
        for got, want in zip(jax.tree_util.tree_leaves(exp.call(x)), jax.tree_util.tree_leaves(jax.jit(f)(x))):
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(_bits(got), _bits(want))


def test_serialization_follows_a_reimported_package(tmp_path):
    """A package imported afresh (reload, autoreload) has new array classes: their arrays still
    serialize, and deserialize as the new class (jax keeps one registration per name)."""
    code = textwrap.dedent("""
        import sys, warnings
        # nothing of ours on a deprecated jax name (jax.core.is_constant_dim was, and is gone in jax 0.12)
        warnings.filterwarnings("error", category=DeprecationWarning, module="jax_gpuext")
        import jax, jax.numpy as jnp
        import jax_gpuext as first
        for m in [m for m in sys.modules if m.startswith("jax_gpuext") and m.count(".") and
                  m not in ("jax_gpuext._cpu", "jax_gpuext._cuda", "jax_gpuext._nvshmem")] + ["jax_gpuext"]:
            del sys.modules[m]
        import jax_gpuext as gx
        assert gx.BlockScaledArray is not first.BlockScaledArray
        x = jnp.ones((8, 64))
        exp = jax.export.export(jax.jit(lambda v: gx.quantize(v, gx.MXFP8_E4M3)),
                                disabled_checks=gx.export_disabled_checks())(x)
        q = jax.export.deserialize(exp.serialize()).call(x)
        assert type(q) is gx.BlockScaledArray, type(q)
        print("ok")
        """)
    r = _run(code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
