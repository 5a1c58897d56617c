"""Grouped (MoE) FP8 blockwise dot on a GPU: our ragged_dot backends (``xla``, our grouped Hopper
kernel, cuBLASLt's grouped GEMM where the image has it) and a per-expert loop of our dense FP8
dot, against bf16 ``jax.lax.ragged_dot`` and tokamax's ``ragged_dot`` (where its wheels came
along), in one run: the forward, and a whole training step (forward, dgrad, wgrad).

    python benchmarks/bench_ragged_dot.py [--quick | --smoke] [--out results.json] [--time-limit S]
                                          [--skip-backends hopper,cublaslt] [--extra-site DIR]
                                          [--hopper-tests JUNIT]

Shapes (FP8_1x128 activations x FP8_128x128 expert weights stored (G, N, K), bf16 output):

- issue30: G=32 experts, M=4096 rows (128 per expert), K=7168, N=4096 (--quick: this one only);
- deepseek_v3: 256 experts, top-8, K=7168 (hidden), N=2048 (expert dim), 512 tokens (M=4096): the
  most tokens at which XLA's lowering of bf16 ``lax.ragged_dot`` fits (below), and 4096 tokens
  (M=32768) for the kernels that do not expand the problem;
- gpt_oss: 32 experts, top-4, K=2880, N=5760 (gate and up fused), 2048 tokens (M=8192). K=2880 is
  not a multiple of 128: cuBLASLt's grouped GEMM refuses it (whole 128-wide scale blocks), the
  hopper kernel (K % 16 == 0) and the xla backend take the partial block.

Group sizes: balanced, and skewed: Zipf weights 1/rank^1.2 (shuffled) with a quarter of the experts
empty; both sum to M. TFLOP/s counts the useful work, 2 * M * K * N (a training step 3x that).

XLA (jax 0.11, no cuDNN ragged-dot fusion) lowers ``lax.ragged_dot`` to ONE dense GEMM over the lhs
copied G times and masked (docs/design.md, REFERENCE 11): G times the FLOPs, and an M x G x K
buffer. Our xla backend does not (issue 36): 128-row tiles of one group each, at most
M + 128 G rows computed (FP8 blockwise in float32), C tiles at a time within
``xla.CHUNK_BYTES``. A cell whose estimated buffers exceed MEMORY_FRACTION of the device's memory
is not run, with the estimate and where it comes from as its reason.

Quantization is outside the timed forward; what a backend does to quantized operands on every call
(scale re-layout, the group bookkeeping kernels, row padding copies) is inside it. The training
step (``scaled_ragged_dot``) quantizes inside, as training does. The per-expert loop knows the
group sizes on the host (one cuBLASLt call per non-empty expert): an advantage a traced ragged_dot
does not have, so it bounds what launching per expert costs. Goal (issue 30): ours >= 1.5x bf16
``lax.ragged_dot`` on an H100. Every cell is timed on the device (benchmarks/_devtime.py; ``timing``
says how: CUDA events, or the loop where the build has no marks).

Order and compile time: compiling is most of a run (the xla backend's forward alone took ~13 s on
the H200), so a column's executable is compiled once and reused by every row of the same shapes
(the group sizes are run-time values; only the per-expert loop bakes them in), and the cells run
most wanted first: the first shape's forward (hopper, bf16, tokamax, the per-expert loop) balanced
and skewed, one training step on our kernels against bf16 and tokamax, then the xla backend's cells
of those rows (and ``auto``'s training step), then the models' shapes. ``--time-limit`` cuts the
tail.

The hopper kernel's cells follow its GPU tests per feature (``--hopper-tests``: gpu_run.sh's junit
file of tests/ragged_dot/test_ragged_dot_hopper.py and test_token_slots.py; ``hopper_features``):
the forward is timed when the forward's tests (feature fp8_blockwise, the dgrad's included) passed,
the training step when the weight gradient's (wgrad) and the one-pass operand kernel's
(formats.cuda token_slots) passed too; a failed test of the whole component, or a test of theirs
the step's bound cut off (it may hang), keeps them out.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _devtime, also under `python -P`
import _devtime  # noqa: E402  (first: its clock is the process's)

import argparse  # noqa: E402
import collections  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jax_gpuext as gx  # noqa: E402
from jax_gpuext import formats  # noqa: E402
from jax_gpuext.common import gates  # noqa: E402
from jax_gpuext.ragged_dot import common as ragged_common  # noqa: E402
from jax_gpuext.ragged_dot import cublaslt, hopper, xla  # noqa: E402
from jax_gpuext.ragged_dot.common import RaggedProblem  # noqa: E402

# (model, layer, G, tokens, top_k, K, N)
ISSUE30 = ("issue30", "up", 32, 512, 8, 7168, 4096)  # 512 tokens x 8 of 256 experts, 32 of them: 128 rows each
DEEPSEEK = ("deepseek_v3", "up", 256, 512, 8, 7168, 2048)
DEEPSEEK_PREFILL = ("deepseek_v3", "up", 256, 4096, 8, 7168, 2048)
GPT_OSS = ("gpt_oss", "gate_up", 32, 2048, 4, 2880, 5760)
SMOKE = ("smoke", "up", 4, 64, 2, 256, 128)
MEMORY_FRACTION = 0.6
# Rates only to choose how many calls one timed program runs (k): the dense expansion runs at a
# bf16 GEMM's rate over G times the work; the xla backend at a float32 GEMM's over the useful rows
# plus one tile per group (FP8 blockwise measured ~18 TFLOP/s on the H200, eff6f45).
RATE = {"bf16": 700e12, "xla": 20e12, "ours": 600e12}
EXPANDS = "XLA's dense lowering copies the lhs G times"
XLA_TILES = "the xla backend's tile chunks, float32 operands and outputs"


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


HOPPER_COMPONENT = "ragged_dot.hopper"
# What each of the kernel's cells runs, as (component, feature) of its GPU tests (the verifies
# markers of tests/ragged_dot/test_ragged_dot_hopper.py and test_token_slots.py, both in gpu_run.sh's
# tests_ragged_hopper step): the forward; the training step's forward, dgrad (tested as
# fp8_blockwise), weight gradient, and the one-pass kernel that quantizes its operands.
HOPPER_CELL_FEATURES = {
    "forward": ((HOPPER_COMPONENT, "fp8_blockwise"),),
    "train": ((HOPPER_COMPONENT, "fp8_blockwise"), (HOPPER_COMPONENT, "wgrad"), ("formats.cuda", "token_slots")),
}


def hopper_features(junit: str) -> dict[str, str | None]:
    """{"forward": None or why not, "train": ...}: whether the tests that a cell needs passed, from
    the junit file of gpu_run.sh's tests_ragged_hopper step.

    A (component, feature) is fine when its tests passed and none failed, and so did the component's
    tests of that step with no feature (a failure there is every feature's). Every test of theirs the
    group selected must have finished (the suite's ``verifies_collected_counts``, tests/conftest.py:
    a test the step's bound cut off may hang), as ``verified._blames`` reads a cut group. A junit
    file without the counts: a cut-off test (pytest's nameless record) is of unknown feature, so
    it keeps every cell out."""
    root = ET.parse(junit).getroot()
    components = {c for feats in HOPPER_CELL_FEATURES.values() for c, _ in feats}
    passed, failed, finished = collections.Counter(), collections.Counter(), collections.Counter()
    counts, interrupted = None, False
    for prop in root.iter("property"):
        if prop.get("name") == "verifies_collected_counts":
            recorded = json.loads(prop.get("value") or "{}")
            counts = {(c, f): n for c in components for f, n in recorded.get(c, {}).items()}
    for tc in root.iter("testcase"):
        if not tc.get("name"):  # pytest's record of the test the step's bound interrupted
            interrupted = True
            continue
        props = [(p.get("name"), p.get("value") or "") for p in tc.iter("property")]
        for component in components:
            if ("verifies", component) not in props:
                continue  # another component's test
            key = (component, next((v.split("=", 1)[1] for k, v in props
                                    if k == "verifies_feature" and v.startswith(component + "=")), ""))
            finished[key] += 1
            if tc.find("failure") is not None or tc.find("error") is not None:
                failed[key] += 1
            elif tc.find("skipped") is None:
                passed[key] += 1

    def why(need):
        component, feature = need
        whole = (component, "")
        name = feature if component == HOPPER_COMPONENT else f"{component} {feature}"
        if failed[whole]:
            return f"{failed[whole]} test(s) of the whole {component} failed"
        if failed[need]:
            return f"{failed[need]} of its {name} tests failed"
        if counts is not None:
            for key in (whole, need):
                if finished[key] < counts.get(key, 0):
                    return (f"{counts[key] - finished[key]} of its {key[1] or 'whole-component'} tests did not "
                            "finish (the tests step's bound: one may hang)")
        elif interrupted:
            return "a test of the kernel was cut off at the tests step's bound, which one is unknown (it may hang)"
        if not passed[need]:
            return f"none of its {name} tests passed"
        return None

    return {cell: next((w for w in map(why, feats) if w), None) for cell, feats in HOPPER_CELL_FEATURES.items()}


def _avals(args):
    """The pytree structure, shapes and dtypes of args: what an executable is compiled for."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)


# Operand set-up, jitted once for the process (a new lambda per row compiled again every row).
_normal = jax.jit(lambda key, shape, scale: jax.random.normal(key, shape, jnp.bfloat16) * jnp.bfloat16(scale),
                  static_argnums=(1, 2))
# the same bits as every backend, and no kernel of ours before the timed ones
_QUANTIZE_LHS = jax.jit(lambda v: gx.quantize(v, gx.FP8_1x128, backend="xla"))
_QUANTIZE_RHS = jax.jit(lambda v: gx.quantize(v, gx.FP8_128x128, backend="xla"))


def _slice_rows(q, start, stop):
    return formats.BlockScaledArray(q.data[start:stop], q.scale[start:stop], None, q.format, q.axis)


class Bench:
    def __init__(self, args, timer, deadline, skip, hopper_why=None):
        self.args, self.timer, self.deadline, self.skip = args, timer, deadline, skip
        # why the kernel's forward / training-step cells are not timed (None: they are)
        self.hopper_why = hopper_why or {"forward": None, "train": None}
        if "hopper" in skip:
            self.hopper_why = {cell: "not timed (--skip-backends)" for cell in HOPPER_CELL_FEATURES}
        self.executables: dict = {}  # (column, mode, shapes, k) -> compiled program, shared by rows
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

    def fits(self, nbytes: float, source: str) -> str | None:
        """Why a cell needing ``nbytes`` of buffers (for ``source``'s reason) is not run (None: it
        fits, or the device does not say)."""
        if self.memory and nbytes > MEMORY_FRACTION * self.memory:
            return (f"not run: needs ~{nbytes / 2**30:.0f} GiB ({source}), over "
                    f"{MEMORY_FRACTION:.0%} of the device's {self.memory / 2**30:.0f} GiB")
        return None

    def cell(self, row, column, op, args, *, est_s, backend, need_bytes=0.0, flops, reuse=True, source=EXPANDS):
        """Times one cell: row[column] = TFLOP/s, or row[column + '_error'] = why not. With ``reuse``
        the column's program compiled for these shapes by an earlier row runs again (``op`` must
        then depend on the shapes only, not on the row's group sizes)."""
        meta = {"op": "ragged_dot", "mode": row["mode"], "column": column, "backend": backend,
                "format": "FP8_1x128xFP8_128x128" if backend not in ("bf16", "tokamax") else "bfloat16",
                "model": row["model"], "G": row["G"], "M": row["M"], "K": row["K"], "N": row["N"],
                "shape": [row["M"], row["K"], row["N"], row["G"]], "sizes": row["sizes"], "flops": flops}
        why = self.fits(need_bytes, source)
        if why is None and not self.deadline.allows(f"{row['mode']} {column} {row['model']} G={row['G']} "
                                                    f"M={row['M']} {row['sizes']}"):
            why = "not run: --time-limit"
        if why is not None:
            row[f"{column}_error"] = meta["error"] = why
            self.measurements.append(meta)
            return None
        started = time.monotonic()
        try:
            k = self.timer.k_for(est_s)
            key = (column, row["mode"], _avals(tuple(args)), k) if reuse else None
            compiled = self.executables.get(key) if key else None
            meta["reused_executable"] = compiled is not None
            if compiled is None:
                compiled, compile_s = self.timer.compile(op, args, k)
                if key:
                    self.executables[key] = compiled
            else:
                compile_s = 0.0
            self.timer.last_compiled = compiled  # its optimized HLO (as_text()) says what XLA made of the op
            m = self.timer.run(compiled, args, k, compile_s)
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
        x = _normal(kx, (m, k), 1.0)
        w = _normal(kw, (g, n, k), 0.05)  # 7.5 GB at DeepSeek's
        row = {"model": model, "layer": layer, "G": g, "M": m, "K": k, "N": n, "sizes": kind, "tokens": tokens,
               "top_k": top_k, "empty_experts": int((sizes == 0).sum()), "largest_group": int(sizes.max())}
        return row, sizes, x, w

    def forward(self, case, kind, row=None, later=False):
        """The forward cells of one row: hopper, bf16, tokamax, cuBLASLt, the per-expert loop; with
        ``later``, into ``row``, the xla backend's (second: its compile is the slowest)."""
        row_new, sizes, x, w = self._operands(case, kind)
        row = row_new if row is None else row
        row["mode"] = "forward"
        m, k, n, g = row["M"], row["K"], row["N"], row["G"]
        flops = 2.0 * float(sizes.sum()) * k * n
        dense = 2.0 * m * g * k * n  # what XLA's lowering computes
        tiled = 2.0 * (m + xla.TILE * g) * k * n  # what our xla backend computes, at most
        gs = jnp.asarray(sizes)
        lhs, rhs = _QUANTIZE_LHS(x), _QUANTIZE_RHS(w)
        nk = ragged_common.RAGGED_M_NK  # weights (G, N, K), contracting K (axis 2)
        if later:
            del x, w
            self.cell(row, "xla",
                      lambda a, b, s: gx.ragged_dot(a, b, s, nk, preferred_element_type=jnp.bfloat16, backend="xla"),
                      (lhs, rhs, gs), est_s=tiled / RATE["xla"], backend="xla",
                      need_bytes=2.0 * xla.CHUNK_BYTES + 4.0 * (m + xla.TILE * g) * (k + n), flops=flops,
                      source=XLA_TILES)
            return row
        p = RaggedProblem("ragged_m", m, k, n, g, gx.FP8_1x128, gx.FP8_128x128, jnp.bfloat16, rhs_contract=2)
        for name, module in (("hopper", hopper), ("cublaslt", cublaslt)):
            # the gates first: they name a missing library version before supports() asks cuBLASLt
            why = (self.hopper_why["forward"] if name == "hopper" else
                   "not timed (--skip-backends)" if name in self.skip else None)
            why = why or next((r.reason for r in (gates.check_all(module.GATES), module.supports(p))
                               if not r.supported), None)
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
        w_kn = jnp.swapaxes(w, 1, 2)  # lax.ragged_dot's (G, K, N)
        del w
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
        del w_kn, x

        starts = np.concatenate([[0], np.cumsum(sizes)])

        def loop(a, b):  # host-known sizes: one dense cuBLASLt FP8 blockwise call per non-empty expert
            outs = [gx.block_scaled_dot(_slice_rows(a, int(starts[e]), int(starts[e + 1])),
                                        formats.BlockScaledArray(b.data[e], b.scale[e], None, b.format, b.axis),
                                        backend="cublaslt", preferred_element_type=jnp.bfloat16)
                    for e in range(g) if sizes[e]]
            return jnp.concatenate(outs)

        if not gates.check_all(cublaslt.GATES[:2]):  # no CUDA extension or device: the loop cannot run
            row["dense_fp8_loop_error"] = gates.check_all(cublaslt.GATES[:2]).reason[:300]
        else:  # its program holds this row's sizes: never reused
            self.cell(row, "dense_fp8_loop", loop, (lhs, rhs), est_s=flops / RATE["ours"], backend="cublaslt_dense",
                      flops=flops, reuse=False)
        return row

    def train(self, case, kind, row=None, later=False):
        """One training step: y = x @ w per group, then dx and dw from a fixed cotangent. First our
        kernels (backend "hopper"), bf16 and tokamax; with ``later``, into ``row``, the xla
        backend's and auto's (slow to compile; auto takes the kernels where gpu_run.sh allows
        unverified backends, so it repeats "hopper" there)."""
        row_new, sizes, x, w = self._operands(case, kind)
        row = row_new if row is None else row
        row["mode"] = "train"
        m, k, n, g = row["M"], row["K"], row["N"], row["G"]
        flops = 3 * 2.0 * float(sizes.sum()) * k * n  # forward, dgrad, wgrad
        dense = 3 * 2.0 * m * g * k * n
        tiled = 3 * 2.0 * (m + xla.TILE * g) * k * n  # our xla backend's three grouped dots, at most
        gs = jnp.asarray(sizes)
        w_kn = jnp.swapaxes(w, 1, 2)  # (G, K, N): lax.ragged_dot's and scaled_ragged_dot's
        del w
        ct = _normal(jax.random.key(2), (m, n), 1.0)
        # XLA's lowering: forward M x G x K, dgrad M x G x N, wgrad about G x K x M, in the operands' dtype
        expanded = float(m) * g * (2 * k + n)

        def step(f):
            def run(a, b, s, c):
                _, vjp = jax.vjp(lambda p, q: f(p, q, s), a, b)
                return vjp(c)
            return run

        def ours(column, backend):
            fn = step(lambda a, b, s, be=backend: gx.scaled_ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16,
                                                                      backend=be))
            if backend == "auto":
                try:
                    calls = gx.explain(fn, x, w_kn, gs, ct).calls
                    row["train_auto_backends"] = ", ".join(c.chosen for c in calls if c.op == "ragged_dot")
                except Exception as e:  # noqa: BLE001
                    row["train_auto_backends"] = _devtime.error_text(e, 100)
            self.cell(row, column, fn, (x, w_kn, gs, ct),
                      est_s=tiled / RATE["xla"] if backend == "xla" else flops / RATE["ours"], backend=backend,
                      need_bytes=(6.0 * xla.CHUNK_BYTES + 3 * 4.0 * (m + xla.TILE * g) * (k + n)
                                  + 4.0 * g * k * n) if backend == "xla" else 0.0,
                      flops=flops, source=XLA_TILES)

        if later:
            ours("train_xla", "xla")
            if self.hopper_why["train"] is None:
                ours("train_auto", "auto")
            else:
                row["train_auto_error"] = f"not timed (auto would pick the hopper kernel: {self.hopper_why['train']})"
            return row
        gate = next((r.reason for r in (gates.check_all(hopper.GATES),) if not r.supported), None)
        why = self.hopper_why["train"] or gate
        if why is None:
            ours("train_hopper", "hopper")
        else:
            row["train_hopper_error"] = why[:300]
        bf16 = step(lambda a, b, s: lax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16))
        self.cell(row, "train_bf16", bf16, (x, w_kn, gs, ct), est_s=dense / RATE["bf16"], backend="bf16",
                  need_bytes=2 * expanded, flops=flops)
        self._train_loop(row, sizes, step, (x, w_kn, gs, ct), flops)
        if self.tokamax is None:
            row["train_tokamax_error"] = self.tokamax_why
        else:
            tk = step(lambda a, b, s: self.tokamax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16,
                                                              implementation=self.tokamax_impl))
            self.cell(row, "train_tokamax", tk, (x, w_kn, gs, ct), est_s=flops / RATE["ours"], backend="tokamax",
                      flops=flops)
        return row


    def _train_loop(self, row, sizes, step, args, flops):
        """The training step's per-expert loop: scaled_dot_general (the same DeepSeek-V3 recipe, its
        forward, dgrad and wgrad on dense cuBLASLt FP8 blockwise calls) per non-empty expert, rows
        sliced with the host-known sizes. Its program holds this row's sizes: never reused."""
        starts = np.concatenate([[0], np.cumsum(sizes)])
        contract = (((1,), (0,)), ((), ()))  # x (rows, K) @ w[e] (K, N)

        def loop(a, b, s):
            del s  # the sizes are in the program (host-known), as a per-expert loop has them
            outs = [gx.scaled_dot_general(a[int(starts[e]):int(starts[e + 1])], b[e], contract,
                                          preferred_element_type=jnp.bfloat16, format=(gx.FP8_1x128, gx.FP8_128x128),
                                          backend="cublaslt")
                    for e in range(row["G"]) if sizes[e]]
            return jnp.concatenate(outs)

        if not gates.check_all(cublaslt.GATES[:2]):  # no CUDA extension or device: the loop cannot run
            row["train_dense_fp8_loop_error"] = gates.check_all(cublaslt.GATES[:2]).reason[:300]
        else:
            self.cell(row, "train_dense_fp8_loop", step(loop), args, est_s=flops / RATE["ours"],
                      backend="cublaslt_dense", flops=flops, reuse=False)


def markdown(rows):
    cols = [c for c in ("hopper", "cublaslt_row_align16", "cublaslt_row_align1", "dense_fp8_loop", "tokamax", "xla",
                        "train_hopper", "train_dense_fp8_loop", "train_tokamax", "train_xla", "train_auto") if any(c in r for r in rows)]
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
    ap.add_argument("--hopper-tests", help="the junit file of the hopper kernel's GPU tests (gpu_run.sh's "
                                           "tests_ragged_hopper): its cells are timed per feature that passed")
    args = ap.parse_args(argv)
    skip = tuple(b for b in args.skip_backends.split(",") if b)
    hopper_why = None
    if args.hopper_tests:
        try:
            hopper_why = {cell: why and f"not timed: {why}"
                          for cell, why in hopper_features(args.hopper_tests).items()}
        except (OSError, ET.ParseError, ValueError) as e:  # no readable record of the tests: as if they had failed
            hopper_why = {cell: f"not timed: no readable test record ({_devtime.error_text(e, 150)})"
                          for cell in HOPPER_CELL_FEATURES}
    if not args.smoke and not gates.check("cuda_device"):
        print(f"bench_ragged_dot.py needs a GPU: {gates.check('cuda_device').reason} (--smoke runs anywhere)",
              file=sys.stderr)
        return 2
    timer = (_devtime.Timer(target_s=0.002, samples=1, min_k=1, max_k=2) if args.smoke
             else _devtime.Timer(target_s=0.02, samples=3, min_k=1, max_k=50))
    deadline = _devtime.Deadline(args.time_limit)
    bench = Bench(args, timer, deadline, skip, hopper_why)
    notes = ["TFLOP/s = 2 * sum(group_sizes) * K * N / time (a training step: 3x), timed on the device "
             "(benchmarks/_devtime.py); forward: quantization outside the timed region; training step: "
             "scaled_ragged_dot quantizes inside",
             "weights stored (G, N, K) for our backends, (G, K, N) for lax.ragged_dot and tokamax; bf16 output",
             "dense_fp8_loop slices the groups with host-known sizes (one cuBLASLt call per expert); "
             "train_dense_fp8_loop: scaled_dot_general per expert (forward, dgrad, wgrad on dense cuBLASLt)",
             f"tokamax: {bench.tokamax_why}" + (f" (implementation={bench.tokamax_impl!r})" if bench.tokamax else "")]
    notes += [f"not timed: {', '.join(skip)}"] if skip else []
    notes += [f"hopper kernel, {cell}: {why}" for cell, why in bench.hopper_why.items() if why and "hopper" not in skip]
    notes += [timer.caveat] if timer.caveat else []
    if args.smoke:
        notes.append("--smoke: tiny shapes on " + jax.devices()[0].platform + "; the numbers mean nothing")
    rows = []

    def save():  # after every case: a run cut short still leaves what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"benchmark": "bench_ragged_dot", "device": jax.devices()[0].device_kind,
                           "timing": timer.method, "rows": rows,
                           "measurements": bench.measurements, "notes": notes + deadline.note()}, f, indent=2)

    # (mode, case, sizes, later): most wanted first (--time-limit cuts the tail). A later entry adds
    # the slow-to-compile cells (the xla backend, auto) to the row its first entry made.
    if args.smoke:
        first = [("forward", SMOKE, "balanced"), ("forward", SMOKE, "skewed"), ("train", SMOKE, "skewed")]
        plan = [(*e, False) for e in first] + [(*e, True) for e in first]
    else:
        # issue 30's shape: the forward and one training step (all of --quick), then the models'
        # forwards, their training steps, then the prefill size bf16 cannot run
        quick = [("forward", ISSUE30, "balanced"), ("forward", ISSUE30, "skewed"), ("train", ISSUE30, "balanced")]
        plan = [(*e, False) for e in quick] + [(*e, True) for e in quick]
        if not args.quick:
            fwd = [("forward", c, kind) for c in (DEEPSEEK, GPT_OSS) for kind in ("balanced", "skewed")]
            train = [("train", DEEPSEEK, "balanced"), ("train", GPT_OSS, "balanced"), ("train", ISSUE30, "skewed"),
                     ("train", DEEPSEEK, "skewed"), ("train", GPT_OSS, "skewed")]
            prefill = [("forward", DEEPSEEK_PREFILL, "balanced")]
            for group in (fwd, train, prefill):
                plan += [(*e, False) for e in group] + [(*e, True) for e in group]
    made = {}  # (mode, case, sizes) -> its row
    for mode, case, kind, later in plan:
        what = f"{mode} {case[0]} G={case[2]} tokens={case[3]} {kind}" + (" (xla, auto)" if later else "")
        if later and (mode, case, kind) not in made:
            continue  # its row was not run
        # a row is several cells: start one only with room for the slowest cell so far (each cell
        # checks the deadline again)
        if rows and not deadline.allows(what):
            continue
        started = time.monotonic()
        row = made.get((mode, case, kind)) if later else None
        row = (bench.forward if mode == "forward" else bench.train)(case, kind, row=row, later=later)
        if not later:
            made[(mode, case, kind)] = row
            rows.append(row)
        save()
        base = row.get("bf16_ragged_dot" if mode == "forward" else "train_bf16")
        line = (f"{mode} {row['model']} G={row['G']} M={row['M']} {kind}{' (xla, auto)' if later else ''}, TFLOP/s: "
                f"bf16 " + (f"{base:.0f}" if base else "-"))
        for name in ("hopper", "cublaslt_row_align16", "dense_fp8_loop", "tokamax", "xla", "train_hopper",
                     "train_dense_fp8_loop", "train_tokamax", "train_xla", "train_auto"):
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
