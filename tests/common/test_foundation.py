"""The foundation: import, extensions, gates, backends, explain, capabilities, CLI."""

from __future__ import annotations

import json
import logging
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import jax_gpuext
from jax_gpuext import UnsupportedError
from jax_gpuext.common import backends
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import gates


# --------------------------------------------------------------------------- import / build
def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env={**os.environ, **env}, timeout=120)


def test_import_survives_a_missing_cuda_extension():
    # A poisoned module entry makes `import jax_gpuext._cuda` raise ImportError, as on a
    # build without nvcc or with a broken driver stack.
    code = ("import sys; sys.modules['jax_gpuext._cuda'] = None\n"
            "import jax_gpuext\n"
            "from jax_gpuext.common import gates\n"
            "r = gates.check('cuda_extension'); assert not r.supported, r\n"
            "print(r.reason)\n"
            "jax_gpuext.capabilities()\n")
    p = _run_python(code)
    assert p.returncode == 0, p.stderr
    assert "failed to import" in p.stdout


def test_cpu_extension_is_built_against_ffi_api_0_1():
    info = _ext.build_info("cpu")
    assert (info["ffi_api_major"], info["ffi_api_minor"]) == (0, 1), info


def test_cpu_extension_names_the_kernel_clone_this_cpu_runs():
    """build_info's cpu_kernels (CpuKernelClone) against /proc/cpuinfo: a clone the CPU could not
    run, or a baseline where the build has clones and the CPU takes one, is a wrong report (and CI's
    sanitizer leg picks its build from it)."""
    import platform

    from jax_gpuext.common import cpu_features

    kernels = _ext.build_info("cpu")["cpu_kernels"]
    flags = cpu_features.cpu_flags()
    if platform.machine() not in ("x86_64", "AMD64"):
        assert kernels.startswith("portable"), kernels
    elif kernels.startswith("x86-64-v4"):
        assert {"avx512f", "avx512bw", "avx512vl"} <= flags, kernels
    elif kernels.startswith("x86-64-v3"):  # also on AVX-512, in a build without the v4 clone
        assert {"avx2", "fma", "bmi2"} <= flags, kernels
    else:
        assert kernels.startswith("baseline x86-64"), kernels
        if "no clones" not in kernels:  # the resolver passed v3 over: the CPU must lack AVX2
            assert "avx2" not in flags, kernels


def test_cuda_extension_build_info_when_built():
    info = _ext.build_info("cuda")
    if info is None:
        pytest.skip(_ext.load("cuda")[1])
    assert info["platform"] == "cuda"
    assert info["architectures"]
    assert (info["ffi_api_major"], info["ffi_api_minor"]) == (0, 1)


def test_extensions_export_only_module_init():
    import pathlib

    for kind in ("cpu", "cuda"):
        mod = _ext.module(kind)
        if mod is None:
            continue
        out = subprocess.run(["nm", "-D", "--defined-only", mod.__file__], capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip("nm not available")
        symbols = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
        exported = [s for s in symbols if not s.startswith("_") or s.startswith("_Z")]
        assert exported == [f"PyInit__{kind}"], (pathlib.Path(mod.__file__).name, exported)


def test_registration_is_idempotent():
    _ext.ensure_all_registered()
    _ext.ensure_all_registered()


# --------------------------------------------------------------------------- gates
def test_every_gate_answers_with_a_reason():
    for name, g in gates.GATES.items():
        r = gates.check(name)
        assert isinstance(r, gates.GateResult)
        assert isinstance(r.supported, bool)
        assert r.reason.strip(), name
        assert g.why.strip() and g.requires.strip(), name


def test_unknown_gate_names_the_known_ones():
    with pytest.raises(KeyError, match="known gates"):
        gates.check("no_such_gate")


def test_require_raises_unsupported_error_with_gate_and_reason():
    closed = next((n for n in gates.GATES if not gates.check(n).supported), None)
    if closed is None:
        pytest.skip("every gate is open on this machine")
    with pytest.raises(UnsupportedError) as e:
        gates.require(closed, "the test op")
    assert e.value.gate == closed
    assert e.value.reason == gates.check(closed).reason
    assert gates.check(closed).reason in str(e.value)


def test_check_all_reports_the_first_closed_gate():
    r = gates.check_all(["cpu_extension", "jaxlib_supported"])
    assert r.supported
    closed = next((n for n in gates.GATES if not gates.check(n).supported), None)
    if closed is not None:
        r = gates.check_all(["cpu_extension", closed])
        assert not r.supported and r.reason.startswith(closed + ":")


def test_jaxlib_is_in_the_supported_range():
    assert gates.check("jaxlib_supported").supported, gates.check("jaxlib_supported").reason


def test_ffi_api_table_is_monotonic():
    firsts = [v for v, _ in gates.FFI_API_MINOR_BY_JAXLIB]
    minors = [m for _, m in gates.FFI_API_MINOR_BY_JAXLIB]
    assert firsts == sorted(firsts) and minors == sorted(minors)


# --------------------------------------------------------------------------- backends
@pytest.fixture
def toy_op(monkeypatch):
    """An op with a fast CPU backend behind a controllable gate, and a reference."""
    op = "toy_scale"
    monkeypatch.setitem(backends._BACKENDS, op, [])
    state = {"open": True}

    def supports(problem):
        ok = problem is None or problem.get("n", 0) % 2 == 0
        return gates.GateResult(ok, "n is even" if ok else "the fast kernel needs an even n")

    fast = backends.Backend("fast", ("cpu",), (), "the fast kernel", supports)
    backends.register(op, fast)
    backends.register(op, backends.Backend("reference", ("cpu", "cuda"), (), "pure jnp"))

    def toy(x, backend="auto"):
        sel = backends.select(op, backend, problem={"n": x.shape[0]})
        return x * (2.0 if sel.chosen == "fast" else 2.0)

    backends._warned.clear()
    return op, toy, state


def test_auto_picks_the_first_supported_backend(toy_op):
    op, toy, _ = toy_op
    with backends.platform("cpu"):
        sel = backends.select(op, problem={"n": 4})
    assert sel.chosen == "fast" and not sel.fallback
    assert ("reference", "lower preference") in sel.rejected


def test_fallback_is_logged_and_flagged(toy_op, caplog):
    op, _, _ = toy_op
    with backends.platform("cpu"), caplog.at_level(logging.WARNING, logger="jax_gpuext"):
        sel = backends.select(op, problem={"n": 3})
    assert sel.chosen == "reference" and sel.fallback
    assert ("fast", "the fast kernel needs an even n") in sel.rejected
    assert any("falls back" in r.message and "even n" in r.message for r in caplog.records)


def test_platform_mismatch_is_not_a_fallback(toy_op):
    op, _, _ = toy_op
    with backends.platform("cuda"):
        sel = backends.select(op, problem={"n": 4})
    assert sel.chosen == "reference" and not sel.fallback
    assert sel.rejected[0] == ("fast", "runs on cpu, not cuda")


def test_named_backend_that_cannot_run_raises(toy_op):
    op, _, _ = toy_op
    with backends.platform("cpu"), pytest.raises(UnsupportedError, match="even n"):
        backends.select(op, "fast", problem={"n": 3})


def test_unknown_backend_name_is_a_value_error(toy_op):
    op, _, _ = toy_op
    with pytest.raises(ValueError, match="one of \\['fast', 'reference'\\]"):
        backends.select(op, "fastest")


def test_force_reference_env(toy_op, monkeypatch):
    op, _, _ = toy_op
    monkeypatch.setenv(backends.FORCE_REFERENCE_ENV, f"quantize, {op}")
    with backends.platform("cpu"):
        sel = backends.select(op, problem={"n": 4})
    assert sel.chosen == "reference" and "JAX_GPUEXT_FORCE_REFERENCE" in sel.reason
    monkeypatch.setenv(backends.FORCE_REFERENCE_ENV, "all")
    with backends.platform("cpu"):
        assert backends.select(op, problem={"n": 4}).chosen == "reference"
    # A misspelt op would be forced not at all, silently: refused, naming the variable (issue 26).
    monkeypatch.setenv(backends.FORCE_REFERENCE_ENV, f"{op},quantise")
    with backends.platform("cpu"), pytest.raises(ValueError, match="JAX_GPUEXT_FORCE_REFERENCE.*quantise"):
        backends.select(op, problem={"n": 4})


def test_explain_reports_calls_inside_jit_even_after_caching(toy_op):
    op, toy, _ = toy_op
    inner = jax.jit(lambda x: toy(x))
    x = jnp.ones((4,))
    inner(x)  # traced and cached once already
    report = jax_gpuext.explain(lambda x: (inner(x), toy(x[:3])), x, platform="cpu")
    assert [c.chosen for c in report.calls] == ["fast", "reference"]
    assert report.calls[1].fallback
    text = str(report)
    assert "[FALLBACK]" in text and "not fast: the fast kernel needs an even n" in text
    assert json.loads(report.to_json())["calls"][0]["op"] == op


def test_explain_table_is_one_compact_row_per_decision(toy_op):
    """The demo's per-step table (issue 34): one row per (op, backend, reason) with its call count,
    a fallback flagged in a few words; the full form stays in str()."""
    op, toy, _ = toy_op
    x = jnp.ones((4,))
    report = jax_gpuext.explain(lambda x: (toy(x), toy(x * 2), toy(x[:3])), x, platform="cpu")
    lines = report.table().splitlines()
    assert lines[0].split()[:3] == ["op", "backend", "calls"] and "(cpu)" in lines[0]
    assert len(lines) == 3  # the two even-sized calls share a row
    assert lines[1].split()[:3] == [op, "fast", "2"]
    assert lines[2].split()[:3] == [op, "reference", "1"] and "FALLBACK: the fast kernel needs an even n" in lines[2]
    assert all(len(l) <= 120 for l in lines)
    assert "no jax_gpuext calls" in jax_gpuext.explain(lambda x: x + 1, x).table()


def test_explain_with_no_calls():
    assert "no jax_gpuext calls" in str(jax_gpuext.explain(lambda x: x + 1, jnp.ones(2)))


def test_platform_override_rejects_unknown_platforms():
    with pytest.raises(ValueError, match="platform must be one of"):
        with backends.platform("tpu"):
            pass


# --------------------------------------------------------------------------- report / CLI
def test_capabilities_report_structure():
    report = jax_gpuext.capabilities()
    for key in ("python", "jax", "jaxlib", "jaxlib_ffi_api", "extensions", "devices", "cuda_driver",
                "libraries", "gates"):
        assert key in report, key
    assert set(report["gates"]) == set(gates.GATES)
    assert report["extensions"]["cpu"]["platform"] == "cpu"
    assert {"cudnn", "cublaslt", "nvshmem"} == set(report["libraries"])
    json.dumps(report)  # serialisable


def test_cli_info_table_and_json():
    p = _run_python("from jax_gpuext.__main__ import main; main(['info'])")
    assert p.returncode == 0, p.stderr
    for gate in gates.GATES:
        assert gate in p.stdout
    p = _run_python("from jax_gpuext.__main__ import main; main(['info', '--json'])")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["gates"]["cpu_extension"]["supported"] is True


@pytest.mark.skipif(gates.check("cuda_device").supported, reason="what a CPU-only machine prints")
def test_cpu_only_capabilities_and_info_print_no_warning():
    """Nothing of ours can run on CUDA here: the report says "not applicable", nobody is warned."""
    p = _run_python("import logging, warnings; warnings.simplefilter('always'); "
                    "logging.basicConfig(level=logging.WARNING); import jax_gpuext; jax_gpuext.capabilities()")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    p = subprocess.run([sys.executable, "-P", "-m", "jax_gpuext", "info"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    row = next(line for line in p.stdout.splitlines() if line.startswith("float4 layout cuda"))
    assert "not applicable" in row, row


def test_gates_markdown_lists_every_gate():
    from jax_gpuext.common.capabilities import gates_markdown

    text = gates_markdown()
    for name in gates.GATES:
        assert f"`{name}`" in text


def test_docs_gates_table_is_up_to_date():
    from jax_gpuext.common.capabilities import gates_markdown

    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "gates.md"
    if not page.exists():
        pytest.skip("docs/ not present next to the tests")
    assert gates_markdown() in page.read_text(), "regenerate with: python -m jax_gpuext gates --markdown"


def test_docs_backend_tables_are_current():
    """docs/gates.md's "which backend will I get" is the generated text, for every op."""
    from jax_gpuext.common import backends
    from jax_gpuext.common.capabilities import backends_markdown

    text = backends_markdown()
    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "gates.md"
    if not page.exists():
        pytest.skip("docs/ not present next to the tests")
    assert text in page.read_text(), "regenerate with: python -m jax_gpuext gates --backends"
    for op in backends.ops():
        assert f"### `{op}`" in text
        for b in backends.backends(op):
            assert f"| `{b.name}` |" in text


def test_prefers_passes_over_without_a_fallback(caplog):
    """A backend whose `prefers` says no is a choice (all_reduce's size crossover), not a fallback;
    if nothing else runs, it is still taken."""
    op = "test_prefers_op"
    big = lambda n: gates.GateResult(n <= 10, "too big for the small path")  # noqa: E731
    backends.register(op, backends.Backend("small", ("cpu", "cuda"), prefers=big))
    backends.register(op, backends.Backend("large", ("cpu", "cuda"),
                                            supports=lambda n: gates.GateResult(n < 1000, "too big")))
    with caplog.at_level(logging.WARNING, logger="jax_gpuext"):
        sel = backends.select(op, "auto", problem=5)
        assert sel.chosen == "small" and not sel.fallback
        sel = backends.select(op, "auto", problem=50)
        assert sel.chosen == "large" and not sel.fallback
        assert ("small", "passed over: too big for the small path") in sel.rejected
    assert not [r for r in caplog.records if "falls back" in r.getMessage()]
    sel = backends.select(op, "auto", problem=5000)  # large cannot run: small is the only one
    assert sel.chosen == "small" and sel.fallback
    assert backends.select(op, "small", problem=50).chosen == "small"  # by name: prefers not asked


def test_a_library_found_by_soname_is_handed_to_cpp_by_its_real_path():
    """C++ dlopens the path Python found; a library the system loader found by soname must
    still have one (dladdr), or the cuDNN/cuBLASLt handlers would refuse to load it."""
    import ctypes
    import os

    from jax_gpuext.common import libs as _libs

    libc = ctypes.CDLL("libc.so.6")
    path = _libs._file_of(libc, "getpid")
    assert path is not None and os.path.isabs(path) and os.path.basename(path).startswith("libc")
    assert _libs._file_of(libc, "no_such_symbol_anywhere") is None
