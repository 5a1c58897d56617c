"""CPU speed (issue 18): quantize / dequantize and a scaled_dot_general training step on XLA:CPU,
as ratios against baselines measured in this process and run:

- an XLA elementwise pass ``x * 2`` over the same bf16 array (one read + one write: the floor a
  quantizer is compared with; target: ``quantize`` through ``auto``, the C++ handler here, >= 0.5x
  it for every format, on the x86-64-v4 and v3 clones alike: the clone that ran is printed),
- our ``xla`` backend (what ``auto`` runs on a GPU until our CUDA kernels are verified there;
  targets: at least as fast as jax.nn's quantizer for MXFP8 and NVFP4, FP8 blockwise within 1.5x
  of its own MXFP8 time), timed in turn with ``x * 2``, auto and jax.nn's quantizer where this
  jax has one, and our jnp reference (``backend="reference"``),
- ``block_scaled_dot`` through its two exact CPU paths (the f32 reference, XLA's bf16 dot),
- ``jax.nn.scaled_dot_general`` forward + backward with jax.nn's "mxfp8" configs (target: MXFP8
  through ``auto`` >= 1.0x it), and the same step unquantized (one bf16 dot: the floor).

    python benchmarks/bench_cpu.py [--quick] [--out FILE.json] [--iters N]

"fastest here" names the fastest of the exact CPU paths (cpu, xla, reference) in this run: it
should be what `auto` picks (the recorded decision in docs/design.md, "CPU speed (issue 18)"). Prints markdown tables;
never fails on a timing (the targets are read off the table). ``--quick``
(CI) uses 1024 x 1024 and fewer runs so it ends in well under a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


WARMUP_CALLS = 8  # see _time


def _time(fn, *args, iters: int) -> float:
    """Median seconds per call in steady state. The warm-up calls matter: the first few calls of
    any jitted function on XLA:CPU get fresh pages for their outputs from the kernel (page faults
    and zeroing: `x * 2` over 8 MB takes 2-4 ms cold and 0.3 ms warm on the dev machine), which
    would make every ratio against that baseline look several times better than a training loop
    sees."""
    return _time_alternating([fn], *args, iters=iters)[0]


def _time_alternating(fns, *args, iters: int) -> list[float]:
    """Median seconds per call of each of fns, called in turn (f0, f1, ..., f0, f1, ...): a
    machine whose speed drifts (another tenant's load comes and goes: the same `x * 2` took
    0.5 ms and 1.7 ms in two runs here) slows every function of one round alike, so the ratio of
    two medians holds where times taken one after the other do not."""
    import jax

    for _ in range(WARMUP_CALLS):
        for fn in fns:
            jax.block_until_ready(fn(*args))
    samples = [[] for _ in fns]
    for _ in range(iters):
        for fn, s in zip(fns, samples):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            s.append(time.perf_counter() - t0)
    return [sorted(s)[len(s) // 2] for s in samples]


def _jax_nn_quantizer(fmt_name: str):
    """jax.nn's own quantizer for a format, or None where this jax has none (it is private API:
    the function scaled_dot_general runs; jax.nn exposes only its config)."""
    import jax

    mode = {"MXFP8_E4M3": "mxfp8", "NVFP4": "nvfp4"}.get(fmt_name)
    if mode is None or not hasattr(jax.nn, "get_scaled_dot_general_config"):
        return None
    try:
        from jax._src.cudnn import scaled_matmul_stablehlo as sms
    except ImportError:
        return None
    import jax.numpy as jnp

    config = jax.nn.get_scaled_dot_general_config(mode, global_scale=jnp.float32(1.0)) if mode == "nvfp4" \
        else jax.nn.get_scaled_dot_general_config(mode)
    return lambda x: sms.quantize(x[None], config)


def _fmt_ms(t):
    return "-" if t is None else f"{t * 1e3:.2f}"


def _fmt_ratio(base, t):
    return "-" if t is None else f"{base / t:.2f}x"


def _cpu_clone() -> str:
    """The CPU kernel clone the C++ handlers run in this process (build_info's ``cpu_kernels``)."""
    from jax_gpuext.common import extension

    info = extension.build_info("cpu") or {}
    return info.get("cpu_kernels", "unknown")


def quantize_rows(x, iters: int):
    import jax
    import jax.numpy as jnp

    import jax_gpuext as gx
    from jax_gpuext.common import backends

    double = jax.jit(lambda v: v * 2)
    clone = _cpu_clone()
    rows = []
    for fmt in gx.formats.FORMATS.values():
        # The baseline again next to each format: its warm time moves with the process's
        # allocator state and the machine's load (0.5-1.7 ms within one run here).
        g = jnp.float32(1.0) if fmt.has_global_scale else None  # given: one pass over x, as jax.nn's
        kw = dict(global_scale=g)
        chosen = backends.select(gx.formats.QUANTIZE_OP, "auto", problem=(fmt, x.shape, x.dtype)).chosen
        q_of = {name: jax.jit(lambda v, f=fmt, b=name: gx.quantize(v, f, backend=b, **kw))
                for name in ("auto", "cpu", "xla")}
        nn = _jax_nn_quantizer(fmt.name)
        # x * 2, auto, cpu, xla (and jax.nn's quantizer) in turn: their ratios are those of one
        # moment of the machine.
        fns = [double, q_of["auto"], q_of["cpu"], q_of["xla"]] + ([jax.jit(nn)] if nn is not None else [])
        times = _time_alternating(fns, x, iters=iters)
        xla_pass, t_auto, t_cpu, t_xla = times[:4]
        t_nn = times[4] if nn is not None else None
        t = {"auto": t_auto, "cpu": t_cpu, "xla": t_xla,
             "reference": _time(jax.jit(lambda v, f=fmt: gx.quantize(v, f, backend="reference", **kw)), x, iters=iters)}
        q = gx.quantize(x, fmt, **kw)
        t_deq = {name: _time(jax.jit(lambda v, b=name: gx.dequantize(v, jnp.bfloat16, backend=b)), q, iters=iters)
                 for name in ("auto", "xla", "reference")}
        fastest = min(("cpu", "xla", "reference"), key=lambda b: t[b])
        rows.append({"format": fmt.name, "auto_backend": chosen, "cpu_clone": clone, "fastest_exact": fastest,
                     "xla_x2_ms": xla_pass * 1e3, "auto_ms": t["auto"] * 1e3, "cpu_ms": t["cpu"] * 1e3,
                     "xla_ms": t["xla"] * 1e3, "reference_ms": t["reference"] * 1e3,
                     "jax_nn_ms": None if t_nn is None else t_nn * 1e3,
                     "xla_vs_jax_nn": None if t_nn is None else t_nn / t["xla"],
                     "dequantize_auto_ms": t_deq["auto"] * 1e3, "dequantize_xla_ms": t_deq["xla"] * 1e3,
                     "dequantize_reference_ms": t_deq["reference"] * 1e3})
    # quantize through auto and xla against the `x * 2` timed in turn with them (the targets'
    # ratio); the reference and dequantize, timed apart, against the run's fastest `x * 2`.
    base = min(r["xla_x2_ms"] for r in rows)
    mx = next(r["xla_ms"] for r in rows if r["format"] == "MXFP8_E4M3")
    for r in rows:
        r.update(baseline_ms=base, auto_vs_xla_pass=r["xla_x2_ms"] / r["auto_ms"], auto_vs_fastest_xla_pass=base / r["auto_ms"],
                 xla_vs_xla_pass=r["xla_x2_ms"] / r["xla_ms"], xla_vs_xla_mxfp8=r["xla_ms"] / mx,
                 reference_vs_xla_pass=base / r["reference_ms"], dequantize_auto_vs_xla_pass=base / r["dequantize_auto_ms"])
    return rows


def dot_rows(n: int, iters: int):
    """block_scaled_dot on [n, n] x [n, n] per format pair, through each exact CPU path: the f32
    reference and XLA's own path (bf16 dot with f32 accumulation for MX / NVFP4)."""
    import jax
    import jax.numpy as jnp

    import jax_gpuext as gx
    from jax_gpuext.common import backends
    from jax_gpuext.dot import common as dot_mod

    kx, kw = jax.random.split(jax.random.key(2))
    x = jax.random.normal(kx, (n, n), jnp.float32)
    w = jax.random.normal(kw, (n, n), jnp.float32)
    rows = []
    for lf, rf in ((gx.MXFP8_E4M3, gx.MXFP8_E4M3), (gx.MXFP4, gx.MXFP4), (gx.NVFP4, gx.NVFP4),
                   (gx.FP8_TENSOR, gx.FP8_TENSOR), (gx.FP8_1x128, gx.FP8_128x128)):
        qx, qw = gx.quantize(x, lf), gx.quantize(w, rf)
        p = dot_mod._problem(qx, qw, None, jnp.dtype(jnp.float32))
        chosen = backends.select(dot_mod.OP, "auto", problem=p).chosen
        t = {b: _time(jax.jit(lambda a, c, b=b: gx.block_scaled_dot(a, c, preferred_element_type=jnp.float32,
                                                                     backend=b)), qx, qw, iters=iters)
             for b in ("reference", "xla")}
        rows.append({"format": f"{lf.name} x {rf.name}", "n": n, "auto_backend": chosen,
                     "fastest_exact": min(t, key=t.get), "reference_ms": t["reference"] * 1e3,
                     "xla_ms": t["xla"] * 1e3})
    return rows


def training_rows(n: int, iters: int):
    """MXFP8 scaled_dot_general forward + backward (value and grad of 0.5 * sum(out^2) w.r.t. both
    operands: the forward runs and the cotangent is data) against jax.nn.scaled_dot_general with
    jax.nn's own "mxfp8" config for both operands and the cotangent, on the same bf16 operands,
    all jit-compiled and timed in turn. (A loss of sum(out) would let XLA drop the forward dot
    and feed a constant cotangent.)

    jax.nn needs the configs spelled out: with ``configs=None`` it runs a plain
    ``lax.dot_general`` and quantizes nothing (jax 0.7 to 0.12), which this benchmark once took
    for an MXFP8 default. That unquantized step stays as a column: the same three dots with no
    quantization at all, the floor of any quantized step."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jax_gpuext as gx

    ka, kb = jax.random.split(jax.random.key(1))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    dn = (((1,), (0,)), ((), ()))

    def step(dot):
        def loss(a, b):
            return 0.5 * jnp.sum(jnp.square(dot(a, b).astype(jnp.float32)))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    fns = {"unquantized": step(lambda a, b: lax.dot_general(a, b, dn, preferred_element_type=jnp.bfloat16))}
    if hasattr(jax.nn, "scaled_dot_general") and hasattr(jax.nn, "get_scaled_dot_general_config"):
        configs = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3  # lhs, rhs, cotangent
        nn = step(lambda a, b: jax.nn.scaled_dot_general(a, b, dn, preferred_element_type=jnp.bfloat16,
                                                         configs=configs))
        # The baseline must quantize (an fp8 type in its program) and run on CPU (jax 0.7 has no CPU
        # lowering for it), or there is no jax.nn column.
        try:
            quantizes = "f8e4m3fn" in nn.lower(a, b).as_text().lower()
            why = "" if quantizes else "with the mxfp8 configs it quantized nothing"
        except NotImplementedError as e:
            why = f"it does not lower on CPU here ({str(e).splitlines()[0]})"
        if why:
            print(f"bench_cpu: no jax.nn column: jax.nn.scaled_dot_general {why}", file=sys.stderr)
        else:
            fns["jax.nn"] = nn
    ours = ("auto", "reference")  # our backends
    for backend in ours:
        fns[backend] = step(lambda a, b, be=backend: gx.scaled_dot_general(a, b, dn, preferred_element_type=jnp.bfloat16,
                                                                           backend=be))
    t = dict(zip(fns, _time_alternating(list(fns.values()), a, b, iters=iters)))
    nn_s = t.get("jax.nn")
    return [{"format": "MXFP8_E4M3", "backend": backend, "n": n, "ours_s": t[backend], "jax_nn_s": nn_s,
             "vs_jax_nn": None if nn_s is None else nn_s / t[backend], "unquantized_s": t["unquantized"],
             "vs_unquantized": t["unquantized"] / t[backend]} for backend in ours]


def _print_tables(n, qrows, drows, trows):
    import jax

    base = min(r["xla_x2_ms"] for r in qrows)
    print(f"\n### quantize, bf16 [{n}, {n}], jax {jax.__version__}, {os.cpu_count()} CPUs, C++ clone: "
          f"{qrows[0]['cpu_clone']} (ratio = `x * 2` / time, the two timed in turn: >= 0.5x is auto's target; "
          f"`vs fastest` = the run's fastest `x * 2`, {base:.2f} ms, / time)\n")
    print("| format | auto picks | C++ clone | fastest here | `x * 2` ms | auto ms | ratio | vs fastest `x * 2` | cpu ms "
          "| xla ms | ratio | xla / xla MXFP8_E4M3 | jax.nn ms | jax.nn / xla | reference ms | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in qrows:
        nn = "-" if r["jax_nn_ms"] is None else f"{r['jax_nn_ms']:.2f}"
        nn_ratio = "-" if r["xla_vs_jax_nn"] is None else f"{r['xla_vs_jax_nn']:.2f}x"
        print(f"| {r['format']} | {r['auto_backend']} | {r['cpu_clone']} | {r['fastest_exact']} | {r['xla_x2_ms']:.2f} | "
              f"{r['auto_ms']:.2f} | {r['auto_vs_xla_pass']:.2f}x | {r['auto_vs_fastest_xla_pass']:.2f}x | {r['cpu_ms']:.2f} | "
              f"{r['xla_ms']:.2f} | {r['xla_vs_xla_pass']:.2f}x | {r['xla_vs_xla_mxfp8']:.2f}x | {nn} | {nn_ratio} | "
              f"{r['reference_ms']:.2f} | {r['reference_vs_xla_pass']:.2f}x |")
    print("\n### dequantize to bf16 (ratio = the run's fastest `x * 2` / time)\n")
    print("| format | auto ms | ratio | xla ms | reference ms |")
    print("|---|---|---|---|---|")
    for r in qrows:
        print(f"| {r['format']} | {r['dequantize_auto_ms']:.2f} | {r['dequantize_auto_vs_xla_pass']:.2f}x | "
              f"{r['dequantize_xla_ms']:.2f} | {r['dequantize_reference_ms']:.2f} |")
    print("\n### block_scaled_dot, float32 output (the two exact CPU paths)\n")
    print("| formats | shape | auto picks | fastest here | reference ms | xla ms |")
    print("|---|---|---|---|---|---|")
    for r in drows:
        print(f"| {r['format']} | {r['n']}x{r['n']} @ {r['n']}x{r['n']} | {r['auto_backend']} | {r['fastest_exact']} | "
              f"{r['reference_ms']:.1f} | {r['xla_ms']:.1f} |")
    print("\n### scaled_dot_general forward + backward, timed in turn (ratio = jax.nn time / ours, jax.nn with "
          "its \"mxfp8\" config for lhs, rhs and cotangent: >= 1.0x is the target for auto; unquantized = the same "
          "step through one bf16 lax.dot_general, no quantization: the floor)\n")
    print("| format | backend | shape | ours s | jax.nn s | ratio | unquantized s | unquantized / ours |")
    print("|---|---|---|---|---|---|---|---|")
    for r in trows:
        nn = "-" if r["jax_nn_s"] is None else f"{r['jax_nn_s']:.3f}"
        ratio = "- (no jax.nn MXFP8 step here)" if r["vs_jax_nn"] is None else f"{r['vs_jax_nn']:.2f}x"
        print(f"| {r['format']} | {r['backend']} | {r['n']}x{r['n']} @ {r['n']}x{r['n']} | {r['ours_s']:.3f} | {nn} | "
              f"{ratio} | {r['unquantized_s']:.3f} | {r['vs_unquantized']:.2f}x |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1024 x 1024, fewer runs (CI: well under a minute)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--iters", type=int, default=None, help="timed runs per measurement (median taken)")
    args = p.parse_args(argv)

    import jax

    jax.config.update("jax_platforms", "cpu")  # a CPU benchmark, also on a machine with a GPU
    import jax.numpy as jnp

    try:
        from jax_gpuext.common import gates
    except ImportError as e:
        print(f"bench_cpu: needs jax_gpuext installed ({e}); refusing to run", file=sys.stderr)
        return 2
    ok = gates.check_all(["cpu_extension"])
    if not ok:
        print(f"bench_cpu: needs the CPU extension jax_gpuext._cpu ({ok.reason}); refusing to run", file=sys.stderr)
        return 2
    n = 1024 if args.quick else 2048
    iters = args.iters or (5 if args.quick else 15)
    x = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    qrows = quantize_rows(x, iters)
    drows = dot_rows(n // 2 if args.quick else n, iters)
    trows = training_rows(n // 2 if args.quick else n, iters)
    _print_tables(n, qrows, drows, trows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "bench_cpu", "rows": qrows + drows + trows,
                       "notes": [f"jax {jax.__version__}", f"{os.cpu_count()} CPUs", f"iters {iters} (median)"]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
