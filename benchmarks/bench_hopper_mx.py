"""Benchmark of backend ``hopper_mx`` (our sm_90a kernel) against jax.nn.scaled_matmul.

On Hopper, jax.nn.scaled_matmul dequantizes to bf16 and runs an ordinary dot; hopper_mx keeps the
FP8 operands on the tensor cores. Both get the same quantized inputs. Rows:

- MXFP8 E4M3, M=N=K=8192 (4096 with --quick), bf16 out: hopper_mx end to end (scale conversion in
  XLA + kernel), the kernel alone on prepared operands, jax.nn.scaled_matmul.
- NVFP4, same size: the same three (scaled_matmul's result times the global scales).
- Each tile config of the kernel alone on the MXFP8 problem (skipped with --quick).

Targets (issue 5): MXFP8 >= 1.4x scaled_matmul and >= 900 TFLOP/s; NVFP4 >= 1.2x.
benchmarks/notes/hopper_mx.md explains why the notes predict these are out of reach.

    python benchmarks/bench_hopper_mx.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from jax_gpuext import dot as bsd
from jax_gpuext import formats
from jax_gpuext.common import gates
from jax_gpuext.dot import hopper_mx

FP8_DENSE_TFLOPS = 1979.0  # H100 SXM spec, dense
HBM_TBPS = 3.35


def _time(fn, args, iters: int, repeats: int) -> float:
    out = fn(*args)
    jax.block_until_ready(out)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def _inputs(fmt, size: int):
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (1, size, size), jnp.float32)
    b = jax.random.normal(kb, (1, size, size), jnp.float32)
    qa, qb = formats.quantize(a, fmt), formats.quantize(b, fmt)
    jax.block_until_ready((qa, qb))
    return qa, qb


def _row(name, fmt, size, seconds, baseline=None):
    flops = 2.0 * size**3
    row = {"case": name, "format": fmt.name, "M": size, "N": size, "K": size, "out": "bfloat16",
           "ms": seconds * 1e3, "tflops": flops / seconds / 1e12,
           "pct_fp8_peak": 100.0 * flops / seconds / 1e12 / FP8_DENSE_TFLOPS}
    if baseline is not None:
        row["speedup_vs_scaled_matmul"] = baseline / seconds
    return row


def _bench_format(fmt, size, iters, repeats):
    qa, qb = _inputs(fmt, size)
    dn = (((2,), (2,)), ((0,), (0,)))
    ours = jax.jit(lambda x, y: bsd.block_scaled_dot(x, y, dn, preferred_element_type=jnp.bfloat16,
                                                     backend="hopper_mx"))
    gs = 1.0 if qa.global_scale is None else qa.global_scale * qb.global_scale

    def theirs(x, y, sx, sy, g):
        return (jax.nn.scaled_matmul(x, y, sx, sy, preferred_element_type=jnp.float32) * g).astype(jnp.bfloat16)

    theirs = jax.jit(theirs)
    if fmt is formats.NVFP4:
        a, sa = hopper_mx.prepare_nvfp4(qa.data, qa.scale, qa.global_scale)
        b, sb = hopper_mx.prepare_nvfp4(qb.data, qb.scale, qb.global_scale)
    else:
        a, sa = hopper_mx.prepare_mx(qa.data, qa.scale)
        b, sb = hopper_mx.prepare_mx(qb.data, qb.scale)
    config = hopper_mx.choose_config(1, size, size, a.shape[-1], a.dtype, b.dtype, jnp.bfloat16)[0]
    kernel = jax.jit(lambda *xs: hopper_mx.kernel_call(*xs, jnp.dtype(jnp.bfloat16), config))
    t_base = _time(theirs, (qa.data, qb.data, qa.scale, qb.scale, gs), iters, repeats)
    t_ours = _time(ours, (qa, qb), iters, repeats)
    t_kernel = _time(kernel, (a, b, sa, sb), iters, repeats)
    rows = [_row("jax.nn.scaled_matmul (dequant + bf16 dot)", fmt, size, t_base),
            _row("hopper_mx (end to end)", fmt, size, t_ours, t_base),
            _row(f"hopper_mx kernel only ({config})", fmt, size, t_kernel, t_base)]
    # agreement check, so a fast wrong kernel cannot pass as a result
    diff = jnp.max(jnp.abs(ours(qa, qb).astype(jnp.float32) - theirs(qa.data, qb.data, qa.scale, qb.scale, gs)
                           .astype(jnp.float32)))
    scale = jnp.max(jnp.abs(theirs(qa.data, qb.data, qa.scale, qb.scale, gs).astype(jnp.float32)))
    rows[1]["max_abs_diff_over_max_abs"] = float(diff / scale)
    return rows, (a, b, sa, sb)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4096^3, fewer iterations, no per-config rows")
    ap.add_argument("--out", help="write {'benchmark', 'rows', 'notes'} JSON here")
    args = ap.parse_args(argv)

    r = gates.check_all(["cuda_extension", "cuda_device", "hopper"])
    if not r.supported:
        print(f"bench_hopper_mx: needs a Hopper (sm_90) GPU and the CUDA extension: {r.reason}", file=sys.stderr)
        return 2
    b = hopper_mx.built_for_sm90a()
    if not b.supported:
        print(f"bench_hopper_mx: {b.reason}", file=sys.stderr)
        return 2

    size = 4096 if args.quick else 8192
    iters, repeats = (5, 3) if args.quick else (20, 5)
    device = jax.devices("cuda")[0].device_kind
    rows, notes = [], [f"device: {device}", f"jax {jax.__version__}",
                       f"roofline: FP8 dense {FP8_DENSE_TFLOPS:.0f} TFLOP/s (spec), HBM {HBM_TBPS} TB/s (spec)",
                       "targets: MXFP8 >= 1.4x scaled_matmul and >= 900 TFLOP/s; NVFP4 >= 1.2x"]
    mx_rows, mx_ops = _bench_format(formats.MXFP8_E4M3, size, iters, repeats)
    rows += mx_rows
    rows += _bench_format(formats.NVFP4, size, iters, repeats)[0]
    if not args.quick:
        a, bb, sa, sb = mx_ops
        for name in sorted(hopper_mx.TILE_CONFIGS):
            f = jax.jit(lambda *xs, name=name: hopper_mx.kernel_call(*xs, jnp.dtype(jnp.bfloat16), name))
            rows.append(_row(f"hopper_mx kernel only ({name})", formats.MXFP8_E4M3, size,
                             _time(f, (a, bb, sa, sb), iters, repeats)))

    print(f"## hopper_mx on {device}, M=N=K={size}, bf16 out\n")
    print("| case | format | ms | TFLOP/s | % FP8 peak | vs scaled_matmul |")
    print("|---|---|---:|---:|---:|---:|")
    for row in rows:
        sp = row.get("speedup_vs_scaled_matmul")
        print(f"| {row['case']} | {row['format']} | {row['ms']:.3f} | {row['tflops']:.0f} | "
              f"{row['pct_fp8_peak']:.1f} | {'' if sp is None else f'{sp:.2f}x'} |")
    print()
    for n in notes:
        print(f"- {n}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "hopper_mx", "rows": rows, "notes": notes}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
