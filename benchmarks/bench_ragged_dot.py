"""Grouped (MoE) FP8 blockwise dot on a GPU: our ragged_dot backends (``xla``, our grouped Hopper
kernel, cuBLASLt's grouped GEMM where the image has it) and a per-expert loop of our dense FP8
dot, against bf16 ``jax.lax.ragged_dot`` and tokamax's ``ragged_dot`` (where its wheels came
along), in one run: the forward, and a whole training step (forward, dgrad, wgrad).

    python benchmarks/bench_ragged_dot.py [--quick | --smoke] [--out results.json] [--time-limit S]
                                          [--skip-backends hopper,cublaslt] [--extra-site DIR]

Shapes (FP8_1x128 activations x FP8_128x128 expert weights stored (G, N, K), bf16 output):

- issue30: G=32 experts, M=4096 rows (128 per expert), K=7168, N=4096 (--quick: this one only);
- deepseek_v3: 256 experts, top-8, K=7168 (hidden), N=2048 (expert dim), 512 tokens (M=4096): the
  most tokens at which XLA's lowering of bf16 ``lax.ragged_dot`` fits (below), and 4096 tokens
  (M=32768) for the kernels that do not expand the problem;
- gpt_oss: 32 experts, top-4, K=2880, N=5760 (gate and up fused), 2048 tokens (M=8192). K=2880 is
  not a multiple of 128: our CUDA backends refuse it (whole 128-wide scale blocks), the xla
  backend takes the partial block.

Group sizes: balanced, and skewed: Zipf weights 1/rank^1.2 (shuffled) with a quarter of the experts
empty; both sum to M. TFLOP/s counts the useful work, 2 * M * K * N (a training step 3x that).

XLA (jax 0.11, no cuDNN ragged-dot fusion) lowers ``lax.ragged_dot`` to ONE dense GEMM over the lhs
copied G times and masked (docs/design.md, REFERENCE 11): G times the FLOPs, and an M x G x K
buffer; our xla backend does the same in float32. A cell whose estimated buffers exceed
MEMORY_FRACTION of the device's memory is not run, with the estimate as its reason.

Quantization is outside the timed forward; what a backend does to quantized operands on every call
(scale re-layout, the group bookkeeping kernels, row padding copies) is inside it. The training
step (``scaled_ragged_dot``) quantizes inside, as training does. The per-expert loop knows the
group sizes on the host (one cuBLASLt call per non-empty expert): an advantage a traced ragged_dot
does not have, so it bounds what launching per expert costs. Goal (issue 30): ours >= 1.5x bf16
``lax.ragged_dot`` on an H100. Every cell is timed on the device (benchmarks/_devtime.py).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _devtime, also under `python -P`
import _devtime  # noqa: E402  (first: its clock is the process's)

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jax_gpuext as gx  # noqa: E402
from jax_gpuext import formats  # noqa: E402
from jax_gpuext.common import gates  # noqa: E402
from jax_gpuext.ragged_dot import common as ragged_common  # noqa: E402
from jax_gpuext.ragged_dot import cublaslt, hopper  # noqa: E402
from jax_gpuext.ragged_dot.common import RaggedProblem  # noqa: E402

# (model, layer, G, tokens, top_k, K, N)
ISSUE30 = ("issue30", "up", 32, 512, 8, 7168, 4096)  # 512 tokens x 8 of 256 experts, 32 of them: 128 rows each
DEEPSEEK = ("deepseek_v3", "up", 256, 512, 8, 7168, 2048)
DEEPSEEK_PREFILL = ("deepseek_v3", "up", 256, 4096, 8, 7168, 2048)
GPT_OSS = ("gpt_oss", "gate_up", 32, 2048, 4, 2880, 5760)
SMOKE = ("smoke", "up", 4, 64, 2, 256, 128)
MEMORY_FRACTION = 0.6
# Rates only to choose how many calls one timed program runs (k): the dense expansion runs at a
# bf16 GEMM's rate over G times the work, the xla backend's float32 one far slower.
RATE = {"bf16": 700e12, "xla": 50e12, "ours": 600e12}


def group_sizes(kind: str, g: int, m: int, seed: int = 0) -> np.ndarray:
    """Sizes summing to m. balanced: equal; skewed: Zipf-like weights 1/(rank+1)^1.2, shuffled,
    with a quarter of the experts empty; empty: a quarter empty, the rest equal."""
    rng = np.random.default_rng(seed)
    if kind == "balanced":
        w = np.ones(g)
    elif kind in ("skewed", "empty"):
        w = 1.0 / np.arange(1, g + 1) ** 1.2 if kind == "skewed" else np.ones(g)
        rng.shuffle(w)
        w[rng.choice(g, g // 4, replace=False)] = 0
    else:
        raise ValueError(kind)
    sizes = np.floor(w / w.sum() * m).astype(np.int64)
    sizes[np.argmax(w)] += m - sizes.sum()
    return sizes.astype(np.int32)


def _slice_rows(q, start, stop):
    return formats.BlockScaledArray(q.data[start:stop], q.scale[start:stop], None, q.format, q.axis)


class Bench:
    def __init__(self, args, timer, deadline, skip):
        self.args, self.timer, self.deadline, self.skip = args, timer, deadline, skip
        self.measurements: list[dict] = []
        self.memory = _devtime.device_memory_bytes()
        self.tokamax, self.tokamax_why = self._import_tokamax(args.extra_site)
        # its Pallas Mosaic GPU kernel on an NVIDIA GPU ("mosaic" resolves to mosaic_gpu there); XLA's
        # lowering elsewhere (the --smoke run on CPU), which is lax.ragged_dot's
        self.tokamax_impl = "mosaic" if jax.devices()[0].platform == "gpu" else "xla"

    @staticmethod
    def _import_tokamax(site):
        """tokamax, from ``site`` (gpu_run.sh installs the wheels scripts/gpu_wheel.sh fetched into
        .whl/deps/tokamax there; first on the path, so the versions that were checked load) or
        from the environment. (module or None, why not)."""
        if site:
            if not os.path.isdir(site):
                return None, f"not installed ({site} does not exist)"
            sys.path.insert(0, site)
        try:
            import tokamax
        except Exception as e:  # noqa: BLE001 - missing, or a dependency the image lacks
            return None, f"not installed ({_devtime.error_text(e, 200)})"
        return tokamax, f"tokamax {getattr(tokamax, '__version__', '?')}"

    def fits(self, nbytes: float) -> str | None:
        """Why a cell needing ``nbytes`` of buffers is not run (None: it fits, or the device does not say)."""
        if self.memory and nbytes > MEMORY_FRACTION * self.memory:
            return (f"not run: needs ~{nbytes / 2**30:.0f} GiB (XLA's dense lowering copies the lhs G times), over "
                    f"{MEMORY_FRACTION:.0%} of the device's {self.memory / 2**30:.0f} GiB")
        return None

    def cell(self, row, column, op, args, *, est_s, backend, need_bytes=0.0, flops):
        """Times one cell: row[column] = TFLOP/s, or row[column + '_error'] = why not."""
        meta = {"op": "ragged_dot", "mode": row["mode"], "column": column, "backend": backend,
                "format": "FP8_1x128xFP8_128x128" if backend not in ("bf16", "tokamax") else "bfloat16",
                "model": row["model"], "G": row["G"], "M": row["M"], "K": row["K"], "N": row["N"],
                "shape": [row["M"], row["K"], row["N"], row["G"]], "sizes": row["sizes"], "flops": flops}
        why = self.fits(need_bytes)
        if why is None and not self.deadline.allows(f"{row['mode']} {column} {row['model']} G={row['G']} "
                                                    f"M={row['M']} {row['sizes']}"):
            why = "not run: --time-limit"
        if why is not None:
            row[f"{column}_error"] = meta["error"] = why
            self.measurements.append(meta)
            return None
        started = time.monotonic()
        try:
            m = self.timer.time(op, args, est_s)
            tf = flops / m.seconds / 1e12 if m.seconds > 0 else None
            row[column] = tf
            meta.update(m.fields(), tflops=tf)
        except Exception as e:  # noqa: BLE001 - one cell's failure (Unsupported, OOM) is that cell's result
            row[f"{column}_error"] = meta["error"] = _devtime.error_text(e)
        self.deadline.done(started)
        self.measurements.append(meta)
        return meta

    def _operands(self, case, kind):
        model, layer, g, tokens, top_k, k, n = case
        m = tokens * top_k
        sizes = group_sizes(kind, g, m)
        kx, kw = jax.random.split(jax.random.key(0))
        x = jax.jit(lambda kk: jax.random.normal(kk, (m, k), jnp.bfloat16))(kx)
        w = jax.jit(lambda kk: jax.random.normal(kk, (g, n, k), jnp.bfloat16) * 0.05)(kw)  # 7.5 GB at DeepSeek's
        row = {"model": model, "layer": layer, "G": g, "M": m, "K": k, "N": n, "sizes": kind, "tokens": tokens,
               "top_k": top_k, "empty_experts": int((sizes == 0).sum()), "largest_group": int(sizes.max())}
        return row, sizes, x, w

    def forward(self, case, kind):
        row, sizes, x, w = self._operands(case, kind)
        row["mode"] = "forward"
        m, k, n, g = row["M"], row["K"], row["N"], row["G"]
        flops = 2.0 * float(sizes.sum()) * k * n
        dense = 2.0 * m * g * k * n  # what XLA's lowering computes
        gs = jnp.asarray(sizes)
        w_kn = jnp.swapaxes(w, 1, 2)  # lax.ragged_dot's (G, K, N)
        self.cell(row, "bf16_ragged_dot",
                  lambda a, b, s: lax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16), (x, w_kn, gs),
                  est_s=dense / RATE["bf16"], backend="bf16", need_bytes=2.0 * m * g * k, flops=flops)
        if self.tokamax is None:
            row["tokamax_error"] = self.tokamax_why
        else:
            self.cell(row, "tokamax",
                      lambda a, b, s: self.tokamax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16,
                                                              implementation=self.tokamax_impl),
                      (x, w_kn, gs), est_s=flops / RATE["ours"], backend="tokamax", flops=flops)
        del w_kn
        # the xla backend: the same bits as every backend, and no kernel of ours before the timed ones
        lhs = jax.jit(lambda v: gx.quantize(v, gx.FP8_1x128, backend="xla"))(x)
        rhs = jax.jit(lambda v: gx.quantize(v, gx.FP8_128x128, backend="xla"))(w)
        del x, w
        nk = ragged_common.RAGGED_M_NK  # weights (G, N, K), contracting K (axis 2)
        self.cell(row, "xla",
                  lambda a, b, s: gx.ragged_dot(a, b, s, nk, preferred_element_type=jnp.bfloat16, backend="xla"),
                  (lhs, rhs, gs), est_s=dense / RATE["xla"], backend="xla", need_bytes=4.0 * m * g * k, flops=flops)
        p = RaggedProblem("ragged_m", m, k, n, g, gx.FP8_1x128, gx.FP8_128x128, jnp.bfloat16, rhs_contract=2)
        for name, module in (("hopper", hopper), ("cublaslt", cublaslt)):
            # the gates first: they name a missing library version before supports() asks cuBLASLt
            why = ("not timed (--skip-backends)" if name in self.skip else
                   next((r.reason for r in (gates.check_all(module.GATES), module.supports(p)) if not r.supported),
                        None))
            if why is not None:
                row[f"{name}_error"] = why[:300]
                self.measurements.append({"op": "ragged_dot", "mode": "forward", "column": name, "backend": name,
                                          "model": row["model"], "G": g, "M": m, "K": k, "N": n,
                                          "shape": [m, k, n, g], "sizes": kind, "error": why[:300]})
                continue
            variants = ({"hopper": functools.partial(hopper.impl, p=p)} if name == "hopper" else
                        {f"cublaslt_row_align{a}": functools.partial(cublaslt.impl, p=p, row_align=a)
                         for a in cublaslt.ROW_ALIGNS})
            for column, fn in variants.items():
                self.cell(row, column, fn, (lhs, rhs, gs), est_s=flops / RATE["ours"], backend=name, flops=flops)

        starts = np.concatenate([[0], np.cumsum(sizes)])

        def loop(a, b):  # host-known sizes: one dense cuBLASLt FP8 blockwise call per non-empty expert
            outs = [gx.block_scaled_dot(_slice_rows(a, int(starts[e]), int(starts[e + 1])),
                                        formats.BlockScaledArray(b.data[e], b.scale[e], None, b.format, b.axis),
                                        backend="cublaslt", preferred_element_type=jnp.bfloat16)
                    for e in range(g) if sizes[e]]
            return jnp.concatenate(outs)

        if not gates.check_all(cublaslt.GATES[:2]):  # no CUDA extension or device: the loop cannot run
            row["dense_fp8_loop_error"] = gates.check_all(cublaslt.GATES[:2]).reason[:300]
        else:
            self.cell(row, "dense_fp8_loop", loop, (lhs, rhs), est_s=flops / RATE["ours"], backend="cublaslt_dense",
                      flops=flops)
        return row

    def train(self, case, kind):
        """One training step: y = x @ w per group, then dx and dw from a fixed cotangent."""
        row, sizes, x, w = self._operands(case, kind)
        row["mode"] = "train"
        m, k, n, g = row["M"], row["K"], row["N"], row["G"]
        flops = 3 * 2.0 * float(sizes.sum()) * k * n  # forward, dgrad, wgrad
        dense = 3 * 2.0 * m * g * k * n
        gs = jnp.asarray(sizes)
        w_kn = jnp.swapaxes(w, 1, 2)  # (G, K, N): lax.ragged_dot's and scaled_ragged_dot's
        del w
        ct = jax.jit(lambda kk: jax.random.normal(kk, (m, n), jnp.bfloat16))(jax.random.key(2))

        def step(f):
            def run(a, b, s, c):
                _, vjp = jax.vjp(lambda p, q: f(p, q, s), a, b)
                return vjp(c)
            return run

        bf16 = step(lambda a, b, s: lax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16))
        # XLA's lowering: forward M x G x K, dgrad M x G x N, wgrad about G x K x M, in the operands' dtype
        expanded = float(m) * g * (2 * k + n)
        self.cell(row, "train_bf16", bf16, (x, w_kn, gs, ct), est_s=dense / RATE["bf16"], backend="bf16",
                  need_bytes=2 * expanded, flops=flops)
        if self.tokamax is None:
            row["train_tokamax_error"] = self.tokamax_why
        else:
            tk = step(lambda a, b, s: self.tokamax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16,
                                                              implementation=self.tokamax_impl))
            self.cell(row, "train_tokamax", tk, (x, w_kn, gs, ct), est_s=flops / RATE["ours"], backend="tokamax",
                      flops=flops)
        ours = {"xla": "xla"}
        if "hopper" not in self.skip:
            # auto takes each grouped dot's fastest verified-or-allowed backend (gpu_run.sh allows
            # unverified ones): the hopper kernel for forward and dgrad, xla for the wgrad it refuses
            ours["auto"] = "auto"
        else:
            row["train_auto_error"] = "not timed (--skip-backends hopper: auto would pick the hopper kernel)"
        for column, backend in ours.items():
            fn = step(lambda a, b, s, be=backend: gx.scaled_ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16,
                                                                      backend=be))
            if backend == "auto":
                try:
                    calls = gx.explain(fn, x, w_kn, gs, ct).calls
                    row["train_auto_backends"] = ", ".join(c.chosen for c in calls if c.op == "ragged_dot")
                except Exception as e:  # noqa: BLE001
                    row["train_auto_backends"] = _devtime.error_text(e, 100)
            self.cell(row, f"train_{column}", fn, (x, w_kn, gs, ct),
                      est_s=dense / RATE["xla"] if backend == "xla" else flops / RATE["ours"], backend=backend,
                      need_bytes=4 * expanded if backend == "xla" else 0.0, flops=flops)
        return row


def markdown(rows):
    cols = [c for c in ("xla", "hopper", "cublaslt_row_align16", "cublaslt_row_align1", "dense_fp8_loop", "tokamax",
                        "train_xla", "train_auto", "train_tokamax") if any(c in r for r in rows)]
    head = ["mode", "model", "G", "M", "K", "N", "sizes", "bf16 TFLOP/s"] + [f"{c} TFLOP/s (x bf16)" for c in cols]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        base = r.get("bf16_ragged_dot") if r["mode"] == "forward" else r.get("train_bf16")
        cells = [r["mode"], r["model"], r["G"], r["M"], r["K"], r["N"], r["sizes"],
                 "-" if base is None else f"{base:.0f}"]
        cells += [(f"{r[c]:.0f} ({r[c] / base:.2f}x)" if base else f"{r[c]:.0f}") if r.get(c) else "-" for c in cols]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="issue 30's shape only: forward balanced and skewed, one "
                                                        "training step")
    g.add_argument("--smoke", action="store_true", help="tiny shapes on any platform: shows the script runs")
    ap.add_argument("--time-limit", type=float, help="seconds since start: stop cleanly before this, saying what "
                                                     "was not run")
    ap.add_argument("--skip-backends", default="",
                    help="comma-separated ragged_dot backends (hopper, cublaslt) not to time: gpu_run.sh skips hopper "
                         "when its tests failed (a kernel that hangs would take the table with it)")
    ap.add_argument("--extra-site", help="a folder with tokamax and its dependencies (gpu_run.sh installs "
                                         ".whl/deps/tokamax there), put first on sys.path")
    args = ap.parse_args(argv)
    skip = tuple(b for b in args.skip_backends.split(",") if b)
    if not args.smoke and not gates.check("cuda_device"):
        print(f"bench_ragged_dot.py needs a GPU: {gates.check('cuda_device').reason} (--smoke runs anywhere)",
              file=sys.stderr)
        return 2
    timer = (_devtime.Timer(target_s=0.002, samples=1, min_k=1, max_k=2) if args.smoke
             else _devtime.Timer(target_s=0.02, samples=3, min_k=1, max_k=50))
    deadline = _devtime.Deadline(args.time_limit)
    bench = Bench(args, timer, deadline, skip)
    notes = ["TFLOP/s = 2 * sum(group_sizes) * K * N / time (a training step: 3x), timed on the device "
             "(benchmarks/_devtime.py); forward: quantization outside the timed region; training step: "
             "scaled_ragged_dot quantizes inside",
             "weights stored (G, N, K) for our backends, (G, K, N) for lax.ragged_dot and tokamax; bf16 output",
             "dense_fp8_loop slices the groups with host-known sizes (one cuBLASLt call per expert)",
             f"tokamax: {bench.tokamax_why}" + (f" (implementation={bench.tokamax_impl!r})" if bench.tokamax else "")]
    notes += [f"not timed: {', '.join(skip)}"] if skip else []
    if args.smoke:
        notes.append("--smoke: tiny shapes on " + jax.devices()[0].platform + "; the numbers mean nothing")
    rows = []

    def save():  # after every case: a run cut short still leaves what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"benchmark": "bench_ragged_dot", "device": jax.devices()[0].device_kind, "rows": rows,
                           "measurements": bench.measurements, "notes": notes + deadline.note()}, f, indent=2)

    if args.smoke:
        plan = [("forward", SMOKE, "balanced"), ("forward", SMOKE, "skewed"), ("train", SMOKE, "skewed")]
    elif args.quick:
        plan = [("forward", ISSUE30, "balanced"), ("forward", ISSUE30, "skewed"), ("train", ISSUE30, "balanced")]
    else:  # most wanted first (--time-limit cuts the tail): issue 30's shape forward and one training
        # step, the models' forwards, their training steps, then the prefill size bf16 cannot run
        plan = ([("forward", ISSUE30, "balanced"), ("forward", ISSUE30, "skewed"), ("train", ISSUE30, "balanced")]
                + [("forward", c, kind) for c in (DEEPSEEK, GPT_OSS) for kind in ("balanced", "skewed")]
                + [("train", DEEPSEEK, "balanced"), ("train", GPT_OSS, "balanced"), ("train", ISSUE30, "skewed"),
                   ("train", DEEPSEEK, "skewed"), ("train", GPT_OSS, "skewed"),
                   ("forward", DEEPSEEK_PREFILL, "balanced")])
    for mode, case, kind in plan:
        # a case is several cells: start one only with room for two of the slowest cell so far
        what = f"{mode} {case[0]} G={case[2]} tokens={case[3]} {kind}"
        if rows and not deadline.allows(what, 2 * deadline.slowest_s):
            continue
        started = time.monotonic()
        row = bench.forward(case, kind) if mode == "forward" else bench.train(case, kind)
        rows.append(row)
        save()
        base = row.get("bf16_ragged_dot" if mode == "forward" else "train_bf16")
        line = (f"{mode} {row['model']} G={row['G']} M={row['M']} {kind}, TFLOP/s: bf16 "
                + (f"{base:.0f}" if base else "-"))
        for name in ("xla", "hopper", "cublaslt_row_align16", "dense_fp8_loop", "tokamax", "train_xla", "train_auto",
                     "train_tokamax"):
            if row.get(name):
                line += f", {name} {row[name]:.0f}" + (f" ({row[name] / base:.2f}x)" if base else "")
        print(line + f" [{time.monotonic() - started:.0f} s]", flush=True)
    save()
    print(markdown(rows))
    for n in notes + deadline.note():
        print(f"- {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
