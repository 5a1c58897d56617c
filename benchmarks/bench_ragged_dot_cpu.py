"""Grouped dot on XLA:CPU (issue 30): ``ragged_dot`` / ``scaled_ragged_dot`` against
``lax.ragged_dot`` in bfloat16, at DeepSeek-V3's MoE shapes scaled down, ratios from one run.

DeepSeek-V3: 256 experts, hidden 7168, expert dim 2048, top-8. Here: 16 experts, hidden 512,
expert dim 256, top-4, ``tokens`` tokens (so M = 4 * tokens rows in expert order), the
up-projection (M, 512) x (16, 512, 256). Group sizes:

- balanced: every expert M / 16 rows;
- skewed: a Zipf-like split (expert i gets ~1 / (i + 1)), the last 4 experts empty;
- one-hot: three experts take every row, the other 13 are empty.

Rows (median ms of alternating calls, ratio = baseline / ours, > 1 means ours is faster):

- baseline: ``lax.ragged_dot`` on bfloat16 operands, float32 accumulation (what an unquantized
  MoE layer runs);
- ``ragged_dot`` on operands quantized beforehand (FP8_1x128 x FP8_128x128, and MXFP8 x MXFP8),
  through each exact CPU path (``reference``, ``xla``) and ``auto``;
- one training step (forward + both gradients): ``scaled_ragged_dot`` (quantizing inside) via
  ``auto`` against ``lax.ragged_dot`` in bfloat16.

"fastest exact" names the faster of ``reference`` and ``xla`` in this run: it should be what ``auto``
picks (docs/design.md, "Grouped block-scaled dot (issue 30)").

    python benchmarks/bench_ragged_dot_cpu.py [--quick] [--out FILE.json] [--iters N]

Never fails on a timing. ``--quick`` (CI, from .ci/bench_cpu.sh) runs 256 tokens and fewer calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

EXPERTS, HIDDEN, FFN, TOP_K = 16, 512, 256, 4


def group_sizes(kind: str, m: int):
    import numpy as np

    if kind == "balanced":
        w = np.ones(EXPERTS)
    elif kind == "skewed":
        w = np.array([1.0 / (i + 1) if i < EXPERTS - 4 else 0.0 for i in range(EXPERTS)])
    else:  # one-hot
        w = np.zeros(EXPERTS)
        w[[0, 5, 9]] = [0.6, 0.3, 0.1]
    sizes = np.floor(w / w.sum() * m).astype(np.int32)
    sizes[int(np.argmax(w))] += m - sizes.sum()  # every row in some group
    return sizes


def dot_rows(tokens: int, iters: int, time_alternating):
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jax_gpuext as gx
    from jax_gpuext.common import backends
    from jax_gpuext.ragged_dot import common

    m = tokens * TOP_K
    kx, kw = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (m, HIDDEN), jnp.float32)
    w = jax.random.normal(kw, (EXPERTS, HIDDEN, FFN), jnp.float32) / HIDDEN ** 0.5
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    baseline = jax.jit(lambda a, b, s: lax.ragged_dot(a, b, s, preferred_element_type=jnp.float32))
    rows = []
    for kind in ("balanced", "skewed", "one-hot"):
        sizes = jnp.asarray(group_sizes(kind, m))
        for lf, rf in ((gx.FP8_1x128, gx.FP8_128x128), (gx.MXFP8_E4M3, gx.MXFP8_E4M3)):
            qx, qw = gx.quantize(x, lf), gx.quantize(w, rf, axis=-1 if len(rf.block) == 2 else 1)
            p = common.problem(qx, qw, sizes, None, jnp.dtype(jnp.float32))
            chosen = backends.select(common.OP, "auto", problem=p).chosen
            fns = {b: jax.jit(lambda a, c, s, b=b: gx.ragged_dot(a, c, s, preferred_element_type=jnp.float32,
                                                                 backend=b)) for b in ("reference", "xla")}
            t_base, t_ref, t_xla = time_alternating(
                [lambda: baseline(xb, wb, sizes), lambda: fns["reference"](qx, qw, sizes),
                 lambda: fns["xla"](qx, qw, sizes)], iters=iters)
            t = {"reference": t_ref, "xla": t_xla}
            rows.append({"groups": kind, "formats": f"{lf.name} x {rf.name}", "m": m, "auto_backend": chosen,
                         "fastest_exact": min(t, key=t.get), "baseline_ms": t_base * 1e3,
                         "reference_ms": t_ref * 1e3, "xla_ms": t_xla * 1e3, "auto_ms": t[chosen] * 1e3,
                         "auto_vs_baseline": t_base / t[chosen]})
    return rows


def training_rows(tokens: int, iters: int, time_alternating):
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jax_gpuext as gx

    m = tokens * TOP_K
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (m, HIDDEN), jnp.bfloat16)
    w = (jax.random.normal(kw, (EXPERTS, HIDDEN, FFN), jnp.float32) / HIDDEN ** 0.5).astype(jnp.bfloat16)

    def step(dot):
        def loss(x, w, s):
            return 0.5 * jnp.sum(jnp.square(dot(x, w, s).astype(jnp.float32)))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    base = step(lambda a, b, s: lax.ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16))
    ours = step(lambda a, b, s: gx.scaled_ragged_dot(a, b, s, preferred_element_type=jnp.bfloat16))
    rows = []
    for kind in ("balanced", "skewed"):
        sizes = jnp.asarray(group_sizes(kind, m))
        t_base, t_ours = time_alternating([lambda: base(x, w, sizes), lambda: ours(x, w, sizes)], iters=iters)
        rows.append({"groups": kind, "m": m, "formats": "FP8_1x128 x FP8_128x128 (grad FP8_1x128)",
                     "baseline_s": t_base, "ours_s": t_ours, "ours_vs_baseline": t_base / t_ours})
    return rows


def _time_alternating(fns, *, iters: int, warmup: int = 3) -> list[float]:
    """Median seconds per call of each thunk, called in turn (a drifting machine slows each round
    alike, so the ratios hold; bench_cpu.py explains the warm-up)."""
    import time

    import jax

    for _ in range(warmup):
        for fn in fns:
            jax.block_until_ready(fn())
    samples = [[] for _ in fns]
    for _ in range(iters):
        for fn, s in zip(fns, samples):
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            s.append(time.perf_counter() - t0)
    return [sorted(s)[len(s) // 2] for s in samples]


def _print(drows, trows, tokens):
    import jax

    print(f"\n### ragged_dot on XLA:CPU: (M, {HIDDEN}) x ({EXPERTS}, {HIDDEN}, {FFN}), M = {tokens} tokens x top-{TOP_K}, "
          f"jax {jax.__version__}, {os.cpu_count()} CPUs (ratio = lax.ragged_dot bf16 / auto)\n")
    print("| groups | formats | auto picks | fastest exact | lax.ragged_dot bf16 ms | reference ms | xla ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in drows:
        print(f"| {r['groups']} | {r['formats']} | {r['auto_backend']} | {r['fastest_exact']} | {r['baseline_ms']:.2f} | "
              f"{r['reference_ms']:.2f} | {r['xla_ms']:.2f} | {r['auto_vs_baseline']:.2f}x |")
    print("\n### training step (forward + dgrad + wgrad), scaled_ragged_dot via auto vs lax.ragged_dot in bf16\n")
    print("| groups | formats | lax.ragged_dot bf16 s | ours s | ratio |")
    print("|---|---|---|---|---|")
    for r in trows:
        print(f"| {r['groups']} | {r['formats']} | {r['baseline_s']:.4f} | {r['ours_s']:.4f} | "
              f"{r['ours_vs_baseline']:.2f}x |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="256 tokens, fewer calls (CI: seconds)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--iters", type=int, default=None, help="timed calls per measurement (median taken)")
    p.add_argument("--tokens", type=int, default=None, help="tokens (rows = tokens x top-4)")
    args = p.parse_args(argv)

    import jax

    jax.config.update("jax_platforms", "cpu")
    try:
        from jax_gpuext.common import gates
    except ImportError as e:
        print(f"bench_ragged_dot_cpu: needs jax_gpuext installed ({e}); refusing to run", file=sys.stderr)
        return 2
    ok = gates.check_all(["cpu_extension"])
    if not ok:
        print(f"bench_ragged_dot_cpu: needs the CPU extension ({ok.reason}); refusing to run", file=sys.stderr)
        return 2
    tokens = args.tokens or (256 if args.quick else 1024)
    iters = args.iters or (5 if args.quick else 15)
    drows = dot_rows(tokens, iters, _time_alternating)
    trows = training_rows(tokens, iters, _time_alternating)
    _print(drows, trows, tokens)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "bench_ragged_dot_cpu", "rows": drows + trows,
                       "notes": [f"jax {jax.__version__}", f"{os.cpu_count()} CPUs", f"iters {iters} (median)"]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
