"""Grouped (MoE) FP8 blockwise dot on a GPU: ragged_dot's CUDA backends (cuBLASLt's grouped GEMM,
our grouped Hopper kernel) vs bf16 ``jax.lax.ragged_dot`` and vs a per-expert loop of our dense
FP8 blockwise dot, in one run.

    python benchmarks/bench_ragged_dot.py [--out results.json] [--quick]

Shapes are DeepSeek-V3's expert layers (hidden 7168, expert dim 2048 with gate and up fused to
N = 4096, down projection K = 2048 -> N = 7168, 256 experts, top-8) with fewer experts so the
weights fit next to their bf16 copy: G experts of (N, K), M = tokens * 8 * G / 256 rows. Group
sizes: balanced, skewed (Zipf-like, a few experts take most rows) and with a quarter of the
experts empty; they sum to M. Goal (issue 30): ours >= 1.5x bf16 lax.ragged_dot on an H100.

Quantization is outside the timed region; what a backend does to quantized operands on every
call (scale re-layout, the group bookkeeping kernels, row padding copies) is inside it. The
per-expert loop knows the group sizes on the host (static slices, one cuBLASLt call per expert):
an advantage a traced ragged_dot does not have, so it bounds what launching per expert costs.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_gpuext as gx
from jax_gpuext import formats
from jax_gpuext.common import gates
from jax_gpuext.ragged_dot import cublaslt, hopper
from jax_gpuext.ragged_dot.common import RaggedProblem

LAYERS = {"up": (7168, 4096), "down": (2048, 7168)}  # (K, N) per expert
EXPERTS = 32
ROWS_PER_EXPERT = (128, 512)  # DeepSeek-V3 prefill of 4096 / 16384 tokens: T * 8 / 256


def _time(f, *args, iters=10):
    """Seconds per call after a warm-up (benchmarks run as scripts, `python -P`: no shared module)."""
    jax.block_until_ready(f(*args))
    t0 = time.perf_counter()
    for _ in range(iters):
        out = f(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters


def group_sizes(kind: str, g: int, m: int, seed: int = 0) -> np.ndarray:
    """Sizes summing to m. balanced: equal; skewed: Zipf-like weights 1/(rank+1)^1.2, shuffled;
    empty: a quarter of the experts get nothing, the rest share m equally."""
    if kind == "balanced":
        w = np.ones(g)
    elif kind == "skewed":
        w = 1.0 / np.arange(1, g + 1) ** 1.2
        np.random.default_rng(seed).shuffle(w)
    elif kind == "empty":
        w = np.ones(g)
        w[np.random.default_rng(seed).choice(g, g // 4, replace=False)] = 0
    else:
        raise ValueError(kind)
    sizes = np.floor(w / w.sum() * m).astype(np.int64)
    sizes[np.argmax(w)] += m - sizes.sum()
    return sizes.astype(np.int32)


def _slice_rows(q, start, stop):
    return formats.BlockScaledArray(q.data[start:stop], q.scale[start:stop], None, q.format, q.axis)


def bench_case(layer, rows_per_expert, kind, g=EXPERTS, skip=()):
    k, n = LAYERS[layer]
    m = rows_per_expert * g
    sizes = group_sizes(kind, g, m)
    flops = 2.0 * float(sizes.sum()) * k * n
    row = {"layer": layer, "G": g, "M": m, "K": k, "N": n, "sizes": kind}
    x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (g, n, k), jnp.bfloat16) * 0.05  # stored (G, N, K)
    gs = jnp.asarray(sizes)

    w_kn = jnp.swapaxes(w, 1, 2)  # lax.ragged_dot's (G, K, N)
    f = jax.jit(lambda a, b, s: jax.lax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16))
    row["bf16_ragged_dot"] = flops / _time(f, x, w_kn, gs, iters=10) / 1e12
    del w_kn

    lhs = gx.quantize(x, gx.FP8_1x128)
    rhs = gx.quantize(w, gx.FP8_128x128)
    p = RaggedProblem("ragged_m", m, k, n, g, gx.FP8_1x128, gx.FP8_128x128, jnp.bfloat16, rhs_contract=2)
    variants = {"cublaslt": {f"cublaslt_row_align{a}": functools.partial(cublaslt.impl, p=p, row_align=a)
                             for a in cublaslt.ROW_ALIGNS},
                "hopper": {"hopper": functools.partial(hopper.impl, p=p)}}
    for name, module in (("cublaslt", cublaslt), ("hopper", hopper)):
        # the gates first: they name a missing library version before supports() asks cuBLASLt
        why = ("not timed (--skip-backends)" if name in skip else
               next((r.reason for r in (gates.check_all(module.GATES), module.supports(p)) if not r.supported), None))
        if why is not None:
            row[f"{name}_error"] = why[:300]
            continue
        for column, fn in variants[name].items():
            row[column] = flops / _time(jax.jit(fn), lhs, rhs, gs, iters=10) / 1e12

    starts = np.concatenate([[0], np.cumsum(sizes)])

    def loop(a, b):  # host-known sizes: one dense cuBLASLt FP8 blockwise call per non-empty expert
        outs = [gx.block_scaled_dot(_slice_rows(a, int(starts[e]), int(starts[e + 1])),
                                    formats.BlockScaledArray(b.data[e], b.scale[e], None, b.format, b.axis),
                                    backend="cublaslt", preferred_element_type=jnp.bfloat16)
                for e in range(g) if sizes[e]]
        return jnp.concatenate(outs)

    try:
        row["dense_fp8_loop"] = flops / _time(jax.jit(loop), lhs, rhs, iters=10) / 1e12
    except gx.UnsupportedError as e:
        row["dense_fp8_loop_error"] = str(e)[:300]
    return row


def markdown(rows):
    cols = [c for c in ("hopper", "cublaslt_row_align16", "cublaslt_row_align1", "dense_fp8_loop")
            if any(c in r for r in rows)]
    head = ["layer", "G", "M", "K", "N", "sizes", "bf16 ragged_dot TFLOP/s"] + [f"{c} TFLOP/s (x bf16)" for c in cols]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        cells = [r["layer"], r["G"], r["M"], r["K"], r["N"], r["sizes"], f"{r['bf16_ragged_dot']:.0f}"]
        cells += [f"{r[c]:.0f} ({r[c] / r['bf16_ragged_dot']:.2f}x)" if c in r else "-" for c in cols]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="the up projection, 128 rows per expert, balanced and skewed")
    ap.add_argument("--skip-backends", default="",
                    help="comma-separated ragged_dot backends (hopper, cublaslt) not to time: gpu_run.sh skips hopper "
                         "when its tests failed (a kernel that hangs would take the table with it)")
    args = ap.parse_args(argv)
    skip = tuple(b for b in args.skip_backends.split(",") if b)
    if not gates.check("cuda_device"):
        print(f"bench_ragged_dot.py needs a GPU: {gates.check('cuda_device').reason}", file=sys.stderr)
        return 2
    notes = ["TFLOP/s = 2 * sum(group_sizes) * K * N / time; quantization outside the timed region",
             f"DeepSeek-V3 expert shapes with {EXPERTS} experts (the model has 256); weights stored (G, N, K)",
             "dense_fp8_loop slices the groups with host-known sizes (one cuBLASLt call per expert)",
             "tokamax ragged_dot not measured: its wheel does not travel to the GPU machine"]
    notes += [f"not timed: {', '.join(skip)}"] if skip else []

    rows = []

    def save():  # after every case: a run cut short still leaves what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"benchmark": "bench_ragged_dot", "device": jax.devices()[0].device_kind, "rows": rows,
                           "notes": notes}, f, indent=2)

    cases = ([("up", 128, "balanced"), ("up", 128, "skewed")] if args.quick else
             [(layer, rpe, kind) for layer in LAYERS for rpe in ROWS_PER_EXPERT
              for kind in ("balanced", "skewed", "empty")])
    for case in cases:
        rows.append(bench_case(*case, skip=skip))
        save()
        r = rows[-1]
        line = f"{case}: bf16 {r['bf16_ragged_dot']:.0f} TFLOP/s"
        for name in ("hopper", "cublaslt_row_align16", "cublaslt_row_align1"):
            if name in r:
                line += f", {name} {r[name]:.0f} ({r[name] / r['bf16_ragged_dot']:.2f}x, goal >= 1.5x)"
        for name in ("hopper", "cublaslt"):
            if f"{name}_error" in r:
                line += f", {name}: {r[f'{name}_error']}"
        print(line, flush=True)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
