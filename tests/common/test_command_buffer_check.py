"""The command-buffer capture check (tests/_command_buffer.py, ffi/common/execute_stats.h;
docs/design.md, "Checking command-buffer capture").

CPU: the C++ counters (a native harness, built here with g++ against the CUDA headers), the
helper's verdicts and module handling on a stand-in module, and that every CUDA handler declared
kCmdBufferCompatible counts its execute stage under the target it registers. GPU: the capture of
the compatible targets no other test records in a command buffer (quantize, dequantize,
hopper_mx), and the counters of the built _cuda module.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _command_buffer as cb
import jax_gpuext as gx

ROOT = pathlib.Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- C++ counters
def _cuda_home() -> pathlib.Path | None:
    nvcc = shutil.which("nvcc")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                 nvcc and pathlib.Path(nvcc).resolve().parents[1]):
        if home and (pathlib.Path(home) / "include" / "cuda_runtime_api.h").exists() and \
                (pathlib.Path(home) / "lib64" / "libcudart_static.a").exists():
            return pathlib.Path(home)
    return None


def _run_native(tmp_path) -> str:
    """Builds and runs tests/native/execute_stats_test.cc; its output."""
    home, cxx = _cuda_home(), shutil.which("g++")
    if home is None or cxx is None:
        pytest.skip(f"needs g++ ({cxx}) and the CUDA headers with libcudart_static.a ({home})")
    exe = tmp_path / "execute_stats_test"
    build = subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{ROOT}", f"-I{home / 'include'}",
                            str(ROOT / "tests/native/execute_stats_test.cc"), str(home / "lib64/libcudart_static.a"),
                            "-ldl", "-lpthread", "-lrt", "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "ALL OK" in run.stdout, run.stdout + run.stderr
    return run.stdout


def test_execute_counters_native(tmp_path):
    """tests/native/execute_stats_test.cc: counters listed from load time, off by default, exact
    from 8 threads, a call on no stream not captured; with a GPU, a real capture counted."""
    _run_native(tmp_path)


@pytest.mark.gpu
def test_gpu_execute_counters_see_a_real_capture(tmp_path):
    """The same harness where a GPU is: a hooked call inside cudaStreamBeginCapture (thread-local
    mode, as XLA traces custom calls) counts as captured, one outside does not, and the query
    neither invalidates the capture nor leaves a CUDA error."""
    assert "GPU capture part run" in _run_native(tmp_path)


# --------------------------------------------------------------------------- the helper, on a stand-in
class FakeModule:
    """A module as _cuda / _nvshmem present themselves: handlers counted while enabled."""

    __name__ = "jax_gpuext._fake"

    def __init__(self, targets=("gpuext_x",), counted=("gpuext_x",)):
        self.targets, self.enabled = set(targets), False
        self.stats = {t: {"calls": 0, "captured": 0} for t in counted}

    def registrations(self):
        return {t: object() for t in self.targets}

    def execute_stats(self):
        return {t: dict(v) for t, v in self.stats.items()}

    def reset_execute_stats(self):
        for v in self.stats.values():
            v.update(calls=0, captured=0)

    def set_execute_stats_enabled(self, on):
        was, self.enabled = self.enabled, on
        return was

    def handler(self, target, captured):
        """What a hooked handler does when XLA runs it."""
        if self.enabled:
            self.stats[target]["calls"] += 1
            self.stats[target]["captured"] += int(captured)


def test_counting_resets_enables_and_restores():
    mod = FakeModule()
    mod.handler("gpuext_x", False)  # off: not counted
    mod.enabled = True
    mod.handler("gpuext_x", True)   # before the block: reset away
    mod.enabled = False
    with cb.counting("gpuext_x", [mod]) as counts:
        assert mod.enabled
        mod.handler("gpuext_x", True)
        mod.handler("gpuext_x", False)
    assert not mod.enabled
    assert (counts.calls, counts.captured, counts.direct) == (2, 1, 1)
    assert "ran 2 times, 1 of them inside a stream capture" in str(counts)


def test_counting_names_what_is_missing():
    with pytest.raises(AssertionError, match="no loaded extension module registers gpuext_y"):
        cb.counting_module("gpuext_y", [FakeModule()])
    with pytest.raises(AssertionError, match="is not counted.*GPUEXT_COUNT_EXECUTE"):
        cb.counting_module("gpuext_z", [FakeModule(targets=("gpuext_x", "gpuext_z"))])

    class Old:  # a build from before the counters
        __name__ = "jax_gpuext._old"

        def registrations(self):
            return {"gpuext_x": object()}

    with pytest.raises(AssertionError, match="predates the capture counters"):
        cb.counting_module("gpuext_x", [Old()])
    mod, other = FakeModule(), FakeModule(targets=("gpuext_w",), counted=("gpuext_w",))
    assert cb.counting_module("gpuext_x", [other, mod]) is mod  # the module that has the target


@pytest.mark.parametrize("calls,captured,runs,sites,why", [
    (1, 1, 8, 1, None),              # recorded once, replayed 7 times
    (2, 1, 8, 1, None),              # and one warm-up run op by op
    (4, 4, 8, 1, None),              # re-recorded 3 times: still mostly replays
    (8, 0, 8, 1, "never inside a stream capture"),                 # op by op every time
    (0, 0, 8, 1, "never inside a stream capture"),                 # never ran (another backend ran)
    (8, 8, 8, 1, "recorded again in most runs"),                    # a buffer moved every run
    (3, 1, 8, 1, "2 runs outside a capture"),
    (6, 6, 8, 6, None),              # six calls of the target, one recording
    (5, 5, 8, 6, "fewer times than the program has calls of it"),
    (30, 30, 8, 6, "recorded again in most runs"),
])
def test_capture_verdicts(calls, captured, runs, sites, why):
    got = cb.capture_failure(cb.ExecuteCounts("gpuext_x", calls, captured), runs, sites)
    assert (got is None) if why is None else (why in got), got


@pytest.mark.parametrize("calls,captured,ok", [(8, 0, True), (1, 1, False), (7, 0, False), (9, 0, False)])
def test_direct_verdicts(calls, captured, ok):
    assert (cb.direct_failure(cb.ExecuteCounts("gpuext_x", calls, captured), 8) is None) == ok


def test_assert_counts_picks_the_verdict_from_the_option():
    replayed, direct = cb.ExecuteCounts("gpuext_x", 1, 1), cb.ExecuteCounts("gpuext_x", 8, 0)
    cb.assert_counts(replayed, 8, "CUSTOM_CALL")
    cb.assert_counts(direct, 8, "")
    with pytest.raises(AssertionError, match="never inside"):
        cb.assert_counts(direct, 8, "CUSTOM_CALL")
    with pytest.raises(AssertionError, match="expected 8 runs, none inside a capture"):
        cb.assert_counts(replayed, 8, "")
    assert cb.options("CUSTOM_CALL") == {"xla_gpu_enable_command_buffer": "CUSTOM_CALL",
                                         "xla_gpu_graph_min_graph_size": 1}


def test_run_counted_releases_each_result_before_the_next_run():
    """XLA records a graph again when a buffer of the call moved; a result still held while the
    next run allocates its output would move it every run."""
    mod = FakeModule()

    class Result:
        pass

    previous, seen = [], []

    def f(x):
        assert all(r() is None for r in previous), "the previous result is still alive"
        mod.handler("gpuext_x", captured=not previous)  # recorded on the first run, replayed after
        out = Result()
        previous.append(weakref.ref(out))
        return out

    counts = cb.run_counted(f, (1,), "gpuext_x", runs=5, check=lambda r: seen.append(type(r)), modules=[mod])
    assert seen == [Result] * 5
    assert (counts.calls, counts.captured) == (5, 1)


# --------------------------------------------------------------------------- every compatible handler counts
def _calls(text: str, macro: str) -> list[str]:
    """The argument text of every ``macro(...)`` in C++ source ``text`` (balanced parentheses)."""
    out = []
    for m in re.finditer(re.escape(macro) + r"\s*\(", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end():i - 1])
    return out


def compatible_targets(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(targets whose execute handler declares kCmdBufferCompatible, targets counted by
    GPUEXT_COUNT_EXECUTE) in one handler file."""
    text = re.sub(r"//[^\n]*", "", path.read_text())
    compatible_symbols = {args.split(",")[0].strip() for args in _calls(text, "XLA_FFI_DEFINE_HANDLER_SYMBOL")
                          if "kCmdBufferCompatible" in args}
    execute = {}
    for args in _calls(text, "GPUEXT_REGISTER_FFI_TARGET"):
        name, symbol = [a.strip() for a in args.split(",")]
        execute[symbol] = name.strip('"')
    for args in _calls(text, "GPUEXT_REGISTER_FFI_STAGE"):
        name, stage, symbol = [a.strip() for a in args.split(",")]
        if stage == '"execute"':
            execute[symbol] = name.strip('"')
    counted = {args.split(",")[0].strip().strip('"') for args in _calls(text, "GPUEXT_COUNT_EXECUTE")}
    return {execute[s] for s in compatible_symbols}, counted


HANDLER_FILES = sorted((ROOT / "ffi" / "cuda").glob("*.cc"))


@pytest.mark.parametrize("path", HANDLER_FILES, ids=lambda p: p.name)
def test_every_compatible_handler_counts_its_execute_stage(path):
    """A handler declared kCmdBufferCompatible counts its execute stage under the target it
    registers, so the GPU tests can show XLA captured it; a handler not declared so counts
    nothing (XLA never captures it: a count would only suggest otherwise)."""
    compatible, counted = compatible_targets(path)
    assert counted == compatible, (f"{path.name}: kCmdBufferCompatible targets {sorted(compatible)}, "
                                   f"GPUEXT_COUNT_EXECUTE targets {sorted(counted)}")


def test_the_scan_sees_the_compatible_handlers():
    """The source scan above finds what it looks for (a parser that found nothing would pass)."""
    found = set().union(*(compatible_targets(p)[0] for p in HANDLER_FILES))
    assert {"gpuext_place", "gpuext_quantize", "gpuext_dequantize", "gpuext_hopper_mx_dot",
            "gpuext_block_scaled_dot_cublaslt", "gpuext_ragged_dot_hopper", "gpuext_ragged_dot_cublaslt",
            "gpuext_all_reduce_graph"} <= found
    assert not found & {"gpuext_all_reduce", "gpuext_block_scaled_dot_cudnn"}  # they synchronize / may call cuBLASLt
    for module in ("cuda_module.cc", "nvshmem_module.cc"):  # the modules that link those handlers
        assert "AddExecuteStatsFunctions(m)" in (ROOT / "ffi" / module).read_text(), module


# --------------------------------------------------------------------------- the built module
@pytest.mark.gates("cuda_extension")
def test_cuda_module_counts_every_compatible_target_it_registers():
    """execute_stats() of the built _cuda lists, from import on, exactly the compatible targets it
    registers; counting is off unless turned on, and reset zeroes it."""
    from jax_gpuext.common import extension as _ext

    mod = _ext.module("cuda")
    compatible = set().union(*(compatible_targets(p)[0] for p in HANDLER_FILES))
    assert set(mod.execute_stats()) == compatible & set(mod.registrations())
    was = mod.set_execute_stats_enabled(True)
    try:
        assert mod.set_execute_stats_enabled(True) is True
        mod.reset_execute_stats()
        assert all(v == {"calls": 0, "captured": 0} for v in mod.execute_stats().values())
    finally:
        mod.set_execute_stats_enabled(was)


# --------------------------------------------------------------------------- GPU: targets with no other capture test
QUANTIZE_FORMATS = [gx.MXFP8_E4M3, gx.NVFP4, gx.FP8_TENSOR]  # FP8_TENSOR: three kernels and an atomic amax


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


@pytest.mark.verifies("formats.cuda")
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", QUANTIZE_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_quantize_and_dequantize_in_command_buffer(fmt, command_buffer):
    """gpuext_quantize / gpuext_dequantize are recorded into a CUDA graph once and replayed
    without their handlers (op by op every run with capture off), each replay bit-identical to
    the reference."""
    x = jax.random.normal(jax.random.key(3), (4, 96, 256), jnp.float32) * 5
    want = gx.quantize(x, fmt, backend="reference")
    quantize = jax.jit(lambda v: gx.quantize(v, fmt, backend="cuda"), compiler_options=cb.options(command_buffer))

    def same_as_reference(q):
        np.testing.assert_array_equal(_bits(q.data), _bits(want.data))
        np.testing.assert_array_equal(_bits(q.scale), _bits(want.scale))

    counts = cb.run_counted(quantize, (x,), "gpuext_quantize", check=same_as_reference)
    cb.assert_counts(counts, cb.RUNS, command_buffer)

    y_ref = np.asarray(gx.dequantize(want, jnp.float32, backend="reference"))
    dequantize = jax.jit(lambda q: gx.dequantize(q, jnp.float32, backend="cuda"),
                         compiler_options=cb.options(command_buffer))
    counts = cb.run_counted(dequantize, (want,), "gpuext_dequantize",
                            check=lambda y: np.testing.assert_array_equal(_bits(y), _bits(y_ref)))
    cb.assert_counts(counts, cb.RUNS, command_buffer)


@pytest.mark.verifies("block_scaled_dot.hopper_mx")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_hopper_mx_in_command_buffer(command_buffer):
    """gpuext_hopper_mx_dot is recorded once (its one-time kernel set-up ran in the initialize
    stage, outside the capture) and replayed without its handler, each replay equal to the first."""
    ka, kb = jax.random.split(jax.random.key(5))
    a = gx.quantize(jax.random.normal(ka, (2, 130, 256), jnp.float32), gx.MXFP8_E4M3, backend="reference")
    b = gx.quantize(jax.random.normal(kb, (2, 72, 256), jnp.float32), gx.MXFP8_E4M3, backend="reference")
    dn = (((2,), (2,)), ((0,), (0,)))
    f = jax.jit(lambda p, q: gx.block_scaled_dot(p, q, dn, preferred_element_type=jnp.float32, backend="hopper_mx"),
                compiler_options=cb.options(command_buffer))
    ref = np.asarray(gx.block_scaled_dot(a, b, dn, preferred_element_type=jnp.float32, backend="reference"))
    first = []

    def check(y):
        y = np.asarray(y)
        np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max()))
        first.append(y)
        np.testing.assert_array_equal(y, first[0])  # deterministic: every replay bit-identical

    counts = cb.run_counted(f, (a, b), "gpuext_hopper_mx_dot", check=check)
    cb.assert_counts(counts, cb.RUNS, command_buffer)
