"""Block-scaled dot throughput on a GPU: every block_scaled_dot backend that runs vs bf16 jnp.dot,
per-tensor FP8 (XLA's own FP8 GEMM, and FP8_TENSOR through our cuBLASLt backend) and
jax.nn.scaled_matmul.

    python benchmarks/bench_dot.py [--quick | --smoke] [--out results.json] [--plot results.png]
                                   [--time-limit S]

Headline (issue 4): FP8_1x128 x FP8_128x128 through cuBLASLt at M=N=K=8192 should reach >= 1.4x
bf16 jnp.dot's TFLOP/s, and >= 0.9x of per-tensor FP8. Quantization is outside the timed region;
what a backend does to the quantized operands every call (cuBLASLt/cuDNN: FP4 packing and scale
re-layout, done in XLA) is inside it, since users pay it too. Our per-tensor column runs with
cuBLASLt's split accumulation (FAST_ACCUM off, as the blockwise modes require), so the 0.9x ratio
compares like with like; XLA's own FP8 GEMM (``xla_fp8_per_tensor``: the dequantize-then-dot
pattern XLA rewrites to a scaled FP8 cuBLASLt call) is the per-tensor speed users get from XLA.

Shapes: 8192^3, then LLM layers (Llama-3 8B and 70B MLPs at 8192 and 2048 tokens, one 128-token
decode batch). Every cell is timed on the device (benchmarks/_devtime.py: CUDA events around each
call where the build has them, else the dot k times in one program; ``timing`` says which).
Programs compile one after another: XLA autotunes GEMMs on the device while it compiles, and
autotuning two programs at once would time candidates against each other's kernels.
The quantized operands come from jitted quantizes, one compile per format and shape (the eager
op-by-op quantize of the old table compiled every primitive of the xla path again per shape: most
of the 141 s its full table spent before its bound). --time-limit stops before a shape or cell
that would not fit and names what it left out.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _devtime, also under `python -P`
import _devtime  # noqa: E402  (first: its clock is the process's)

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_gpuext as gx  # noqa: E402
from jax_gpuext.common import backends  # noqa: E402
from jax_gpuext.common import gates  # noqa: E402

HEADLINE = (8192, 8192, 8192)
# (M, N, K), most wanted first: 70B up-projection, 8B up / down at 8192 tokens, 70B down at 2048,
# an 8B up-projection at a 128-token decode batch (where FP8 gains least).
LLM_SHAPES = ((8192, 28672, 8192), (8192, 14336, 4096), (8192, 4096, 14336), (2048, 8192, 28672),
              (128, 14336, 4096))
SMOKE_SHAPES = ((128, 256, 256),)
FORMATS = {"fp8_blockwise": ("FP8_1x128", "FP8_128x128"), "mxfp8": ("MXFP8_E4M3", "MXFP8_E4M3"),
           "nvfp4": ("NVFP4", "NVFP4"), "mxfp4": ("MXFP4", "MXFP4")}
NOMINAL_FLOPS = 1e15  # only to choose how many dots one timed call runs


def _tflops(m, n, k, seconds):
    return 2.0 * m * n * k / seconds / 1e12


class Table:
    def __init__(self, timer, deadline, skip):
        self.timer, self.deadline, self.skip = timer, deadline, skip
        self.measurements: list[dict] = []
        self._quantize = {}

    def quantize(self, x, fmt):
        """A jitted quantize per format (jit caches per shape): one compile, not one per primitive.
        The xla backend: the same bits as every backend, and no kernel of ours that could fail
        (or trap and poison the process) before the dots it prepares."""
        f = self._quantize.get(fmt.name)
        if f is None:
            f = self._quantize[fmt.name] = jax.jit(lambda v, f=fmt: gx.quantize(v, f, backend="xla"))
        return f(x)

    def cell(self, row, column, op, args, *, backend, fmt, m, n, k):
        """Times one cell: sets row[column] (TFLOP/s) or row[column + '_error'], and appends the
        long-form measurement."""
        meta = {"op": "block_scaled_dot" if backend not in ("xla_bf16", "xla_fp8", "jax.nn.scaled_matmul")
                else "dot", "column": column, "backend": backend, "format": fmt, "M": m, "N": n, "K": k,
                "shape": [m, n, k], "out_dtype": "bfloat16"}
        if not self.deadline.allows(f"{column} at {m}x{n}x{k}"):
            return None
        started = time.monotonic()
        try:
            meas = self.timer.time(op, args, 2.0 * m * n * k / NOMINAL_FLOPS)
            tf = _tflops(m, n, k, meas.seconds) if meas.seconds > 0 else None
            row[column] = tf
            meta.update(meas.fields(), tflops=tf)
        except gx.UnsupportedError as e:
            row[f"{column}_error"] = meta["error"] = _devtime.error_text(e)
        except Exception as e:  # noqa: BLE001 - one cell's failure is that cell's result
            row[f"{column}_error"] = meta["error"] = _devtime.error_text(e)
        self.deadline.done(started)
        self.measurements.append(meta)
        return meta

    def shape(self, m, n, k):
        key_x, key_w = jax.random.split(jax.random.key(0))
        x = jax.jit(lambda kk: jax.random.normal(kk, (m, k), jnp.bfloat16))(key_x)
        w = jax.jit(lambda kk: (jax.random.normal(kk, (n, k), jnp.float32) * 0.05).astype(jnp.bfloat16))(key_w)
        row = {"M": m, "N": n, "K": k}
        self.cell(row, "bf16", lambda a, b: jnp.dot(a, b.T, preferred_element_type=jnp.bfloat16), (x, w),
                  backend="xla_bf16", fmt=None, m=m, n=n, k=k)

        # per-tensor FP8: XLA's own (scale, cast, dequantize-then-dot: rewritten to cuBLASLt FP8)
        # and FP8_TENSOR through our cuBLASLt backend
        def fp8(v):
            s = jnp.max(jnp.abs(v)).astype(jnp.float32) / 448.0
            return (v.astype(jnp.float32) / s).astype(jnp.float8_e4m3fn), s

        (a8, sa), (b8, sb) = jax.jit(fp8)(x), jax.jit(fp8)(w)
        meta = self.cell(row, "xla_fp8_per_tensor",
                         lambda a, b, p, q: jnp.dot(a.astype(jnp.bfloat16) * p.astype(jnp.bfloat16),
                                                    (b.astype(jnp.bfloat16) * q.astype(jnp.bfloat16)).T,
                                                    preferred_element_type=jnp.bfloat16),
                         (a8, b8, sa, sb), backend="xla_fp8", fmt="FP8_TENSOR", m=m, n=n, k=k)
        if meta is not None and "error" not in meta:
            # what users get from XLA depends on its rewrite: say whether the GEMM was FP8
            meta["fp8_gemm_in_hlo"] = "__cublas$lt$matmul$f8" in self.timer.last_compiled.as_text()
        del a8, b8
        try:
            qa, qb = self.quantize(x, gx.FP8_TENSOR), self.quantize(w, gx.FP8_TENSOR)
        except Exception as e:  # noqa: BLE001
            row["fp8_per_tensor_error"] = _devtime.error_text(e)
        else:
            self.cell(row, "fp8_per_tensor",
                      lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.bfloat16, backend="cublaslt"),
                      (qa, qb), backend="cublaslt", fmt="FP8_TENSORxFP8_TENSOR", m=m, n=n, k=k)
            del qa, qb
        for fname, (fl, fr) in FORMATS.items():
            try:
                ql, qr = self.quantize(x, gx.formats.FORMATS[fl]), self.quantize(w, gx.formats.FORMATS[fr])
            except Exception as e:  # noqa: BLE001
                row[f"quantize_{fname}_error"] = _devtime.error_text(e)
                continue
            if fname == "mxfp8" and hasattr(jax.nn, "scaled_matmul"):
                self.cell(row, "jax_scaled_matmul_mxfp8",
                          lambda a, b, p, q: jax.nn.scaled_matmul(a[None], b[None], p[None], q[None],
                                                                  preferred_element_type=jnp.bfloat16)[0],
                          (ql.data, qr.data, ql.scale, qr.scale), backend="jax.nn.scaled_matmul",
                          fmt=f"{fl}x{fr}", m=m, n=n, k=k)
            for b in backends.backends("block_scaled_dot"):
                if b.name == "reference" or b.name in self.skip:
                    continue
                # the gates first: a closed one (cuDNN's Blackwell gate on an H100) costs no compile
                why = gates.check_all(b.gates)
                if not why:
                    row[f"{b.name}_{fname}_error"] = why.reason[:200]
                    self.measurements.append({"op": "block_scaled_dot", "column": f"{b.name}_{fname}",
                                              "backend": b.name, "format": f"{fl}x{fr}", "M": m, "N": n, "K": k,
                                              "shape": [m, n, k], "out_dtype": "bfloat16", "error": why.reason[:200]})
                    continue
                self.cell(row, f"{b.name}_{fname}",
                          lambda p, q, name=b.name: gx.block_scaled_dot(p, q, preferred_element_type=jnp.bfloat16,
                                                                        backend=name),
                          (ql, qr), backend=b.name, fmt=f"{fl}x{fr}", m=m, n=n, k=k)
            del ql, qr
        return row


def markdown(rows):
    cols = sorted({c for r in rows for c in r if c not in ("M", "N", "K") and not c.endswith("error")})
    out = ["| M | N | K | " + " | ".join(f"{c} TFLOP/s (x bf16)" for c in cols) + " |",
           "|---" * (3 + len(cols)) + "|"]
    for r in rows:
        cells = [f"{r[c]:.0f} ({r[c] / r['bf16']:.2f}x)" if r.get(c) and r.get("bf16") else "-" for c in cols]
        out.append(f"| {r['M']} | {r['N']} | {r['K']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--plot", help="write a bar chart (needs matplotlib)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="only the 8192^3 headline")
    g.add_argument("--smoke", action="store_true", help="one tiny shape on any platform: shows the script runs")
    ap.add_argument("--time-limit", type=float, help="seconds since start: stop cleanly before this, saying what "
                                                     "was not run")
    ap.add_argument("--skip-backends", default="",
                    help="comma-separated block_scaled_dot backends not to time (gpu_run.sh skips hopper_mx "
                         "when its tests failed: a kernel that hangs would take the whole table with it)")
    args = ap.parse_args(argv)
    skip = tuple(b for b in args.skip_backends.split(",") if b)
    if not args.smoke and not gates.check("cuda_device"):
        print(f"bench_dot.py needs a GPU: {gates.check('cuda_device').reason} (--smoke runs anywhere)",
              file=sys.stderr)
        return 2
    timer = (_devtime.Timer(target_s=0.002, samples=1, max_k=2) if args.smoke
             else _devtime.Timer(target_s=0.02, samples=3, min_k=2, max_k=100))
    deadline = _devtime.Deadline(args.time_limit)
    table = Table(timer, deadline, skip)
    rows = []
    notes = [f"TFLOP/s = 2*M*N*K / time, timed on the device (benchmarks/_devtime.py, timing {timer.method}); "
             "quantization outside the timed region, bf16 output"] + ([f"not timed: {', '.join(skip)}"] if skip else [])
    notes += [timer.caveat] if timer.caveat else []
    if args.smoke:
        notes.append("--smoke: a tiny shape on " + jax.devices()[0].platform + "; the numbers mean nothing")

    def save():  # after every shape: a run cut short still leaves what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"benchmark": "bench_dot", "device": jax.devices()[0].device_kind, "timing": timer.method,
                           "rows": rows,
                           "measurements": table.measurements, "notes": notes + deadline.note()}, f, indent=2)

    shapes = SMOKE_SHAPES if args.smoke else (HEADLINE,) if args.quick else (HEADLINE,) + LLM_SHAPES
    for m, n, k in shapes:
        if rows and not deadline.allows(f"shape {m}x{n}x{k}", deadline.slowest_s * 4):
            continue  # a shape is many cells: start one only with room for several of the slowest
        started = time.monotonic()
        rows.append(table.shape(m, n, k))
        save()
        print(f"{m}x{n}x{k}: {time.monotonic() - started:.0f} s", flush=True)
    head = rows[0] if rows else {}
    blk = head.get("cublaslt_fp8_blockwise")
    if blk and head.get("bf16"):
        print(f"headline {head['M']}x{head['N']}x{head['K']}: cuBLASLt FP8 1x128/128x128 {blk:.0f} TFLOP/s = "
              f"{blk / head['bf16']:.2f}x bf16 (target >= 1.4x)"
              + (f", {blk / head['fp8_per_tensor']:.2f}x per-tensor FP8 (target >= 0.9x)"
                 if head.get("fp8_per_tensor") else ""))
    for meta in table.measurements:
        if meta.get("fp8_gemm_in_hlo") is False:
            notes.append(f"xla_fp8_per_tensor at {meta['M']}x{meta['N']}x{meta['K']}: XLA did not emit an FP8 "
                         "GEMM (it ran the pattern in bf16)")
    save()
    print(markdown(rows))
    for note in notes + deadline.note():
        print(f"- {note}")
    if args.plot and rows:
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot needs matplotlib", file=sys.stderr)
        else:
            cols = [c for c in rows[0] if c not in ("M", "N", "K") and not c.endswith("error")]
            fig, ax = plt.subplots(figsize=(12, 5))
            labels = [f"{r['M']}x{r['N']}x{r['K']}" for r in rows]
            for i, c in enumerate(cols):
                ax.bar([j + i / (len(cols) + 1) for j in range(len(rows))], [r.get(c) or 0 for r in rows],
                       width=1 / (len(cols) + 1), label=c)
            ax.set_xticks(range(len(rows)), labels, rotation=60, fontsize=7)
            ax.set_ylabel("TFLOP/s")
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
