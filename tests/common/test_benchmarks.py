"""The GPU benchmarks on CPU: their device-side timing (benchmarks/_devtime.py) keeps the timed
op inside the loop and leaves values alone, and each benchmark runs end to end (``--smoke``) and
writes the fields write_results.py and the verification record read. The numbers themselves are
the GPU run's (scripts/gpu_run.sh); docs/design.md, "Benchmarks that measure the hardware"."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_gpuext as gx

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _devtime  # noqa: E402


def _computations(hlo: str) -> dict[str, str]:
    """name -> text of every computation in an HLO module's text."""
    out, name, lines = {}, None, []
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$", line)
        if m:
            name, lines = m.group(1), [line]
        elif name is not None:
            lines.append(line)
            if line == "}":
                out[name] = "\n".join(lines)
                name = None
    return out


def _while_body(hlo: str) -> str:
    """The text of the (one) while loop's body and of every computation it calls, transitively."""
    comps = _computations(hlo)
    (body,) = re.findall(r"while\(.*body=%?([\w.\-]+)", hlo)
    seen, todo = set(), [body]
    while todo:
        c = todo.pop()
        if c in seen or c not in comps:
            continue
        seen.add(c)
        todo += re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", comps[c])
    return "\n".join(comps[c] for c in seen)


def _op(v):
    return jnp.sin(v) * 3.0  # `sine` marks the op in the optimized HLO


def test_repeated_keeps_the_op_inside_the_loop():
    """The timed op runs in every iteration: the compiled loop body holds it. Tied only with an
    optimization_barrier (the first version), XLA hoisted it out and the loop copied a result
    k - 1 times: a time per op k times too small."""
    x = jnp.ones((64, 128), jnp.float32)
    hlo = _devtime.repeated(_op, 5).lower((x,)).compile().as_text()
    assert "sine(" in _while_body(hlo), hlo

    def barrier_only(v):  # what repeated did before _tie
        out = _op(v)
        return lax.fori_loop(1, 5, lambda i, _: _op(lax.optimization_barrier((v, i))[0]), out)

    naive = jax.jit(barrier_only).lower(x).compile().as_text()
    assert "sine(" not in _while_body(naive), "XLA no longer hoists the op past a barrier: _tie may be simpler now"


def test_repeated_donates_its_operands_and_copies_none_in():
    """The operands are the loop's own buffers (donated, handed back): the timed call holds no
    entry copy of them, even where the op's result has their shape and dtype."""
    x = jnp.ones((64, 128), jnp.float32)
    hlo = _devtime.repeated(_op, 5).lower((x,)).compile().as_text()
    entry = _computations(hlo)[next(n for n in _computations(hlo) if hlo.count(f"ENTRY %{n} "))]
    assert " copy(" not in entry.replace("s32[] copy(", ""), entry  # the loop counter's copy aside


def test_repeated_leaves_values_alone():
    """The tie multiplies element 0 of each float operand by 1 + 0 * i: results and the returned
    operands are bit for bit those of one plain call, fp8 and e8m0 leaves included."""
    x = jax.random.normal(jax.random.key(0), (64, 256), jnp.bfloat16)
    q = gx.quantize(x, gx.MXFP8_E4M3, backend="xla")
    f = _devtime.repeated(lambda a: gx.dequantize(a, jnp.float32, backend="xla"), 4)
    (back,), out = f(_devtime.fresh((q,)))
    want = gx.dequantize(q, jnp.float32, backend="xla")
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    for got, orig in ((back.data, q.data), (back.scale, q.scale)):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(orig).view(np.uint8))


def test_repeated_refuses_operands_it_cannot_tie():
    with pytest.raises(ValueError, match="no float array"):
        _devtime.repeated(lambda a: a + 1, 3).lower((jnp.ones((4,), jnp.int32),))


def test_deadline_stops_work_that_no_longer_fits(monkeypatch):
    d = _devtime.Deadline(10.0)
    monkeypatch.setattr(_devtime.time, "monotonic", lambda: _devtime.PROCESS_T0 + 8.0)
    assert d.allows("a", 1.0) and not d.allows("b", 3.0)
    d.slowest_s = 2.5
    assert not d.allows("c")
    assert d.skipped == ["b", "c"] and "not run: b, c" in d.note()[0]
    assert _devtime.Deadline(None).allows("x", 1e9)


def _smoke(tmp_path, script, *extra):
    out = tmp_path / f"{script}.json"
    r = subprocess.run([sys.executable, "-P", str(BENCHMARKS / f"{script}.py"), "--smoke", "--out", str(out), *extra],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600,
                       env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text()), r.stdout


@pytest.mark.slow
def test_bench_quantize_smoke(tmp_path):
    result, stdout = _smoke(tmp_path, "bench_quantize")
    assert result["benchmark"] == "quantize" and result["copy"]["bandwidth_GBps"] > 0
    ms = result["measurements"]
    timed = [m for m in ms if "time_us" in m]
    assert {m["op"] for m in timed} >= {"copy", "quantize", "dequantize"}
    assert {m["axis"] for m in timed if m["op"] == "quantize"} == {-1, -2}
    assert any(m["backend"] == "jax.nn" for m in timed) == hasattr(jax.nn, "get_scaled_dot_general_config")
    for m in timed:  # the fields the record and the next engineer read
        for key in ("op", "backend", "format", "dtype", "shape", "elements", "bytes_moved", "time_us", "gbps",
                    "fraction_of_copy", "k"):
            assert key in m, (key, m)
    amax = next(m for m in timed if m.get("variant") == "NVFP4+amax" and m["backend"] == "xla")
    assert amax["passes_over_x"] == 2
    fp4 = 256 * 512 // 2 if gx.formats.FP4_PACKED["cpu"] else 256 * 512  # as XLA lays float4 out here
    # x read twice (amax, then quantize); float4 data, one E4M3 scale per 16, the f32 global scale written
    assert amax["bytes_moved"] == 2 * 256 * 512 * 2 + fp4 + 256 * 512 // 16 + 4
    # the keys earlier results files have (scripts/update_verified.py reads them)
    for key in ("format", "shape", "dtype", "time_us", "dequantize_time_us", "fraction_of_copy"):
        assert key in result["xla_rows"][0]
    assert "quantize_both_axes" in stdout  # present or absent, the run says which


@pytest.mark.slow
def test_bench_dot_smoke(tmp_path):
    result, _ = _smoke(tmp_path, "bench_dot")
    (row,) = result["rows"]
    assert (row["M"], row["N"], row["K"]) == (128, 256, 256) and row["bf16"] > 0 and row["xla_fp8_blockwise"] > 0
    timed = [m for m in result["measurements"] if "tflops" in m]
    assert {"xla_bf16", "xla_fp8", "xla"} <= {m["backend"] for m in timed}
    for m in timed:
        assert m["shape"] == [128, 256, 256] and m["time_us"] > 0 and m["format"] != "" and "k" in m


@pytest.mark.slow
def test_bench_ragged_dot_smoke(tmp_path):
    result, _ = _smoke(tmp_path, "bench_ragged_dot")
    modes = [(r["mode"], r["sizes"]) for r in result["rows"]]
    assert modes == [("forward", "balanced"), ("forward", "skewed"), ("train", "skewed")]
    fwd, _, train = result["rows"]
    assert fwd["bf16_ragged_dot"] > 0 and fwd["xla"] > 0 and "hopper_error" in fwd
    assert train["train_bf16"] > 0 and train["train_xla"] > 0 and "tokamax" in " ".join(result["notes"])
    assert train["empty_experts"] == 1  # a quarter of 4 experts
