"""all_reduce latency / bandwidth per algorithm and size (8 B .. 256 MiB) vs lax.psum.

    python benchmarks/bench_allreduce.py --nproc 4 --out results/allreduce.json

Runs NPROC ranks on ONE GPU under CUDA MPS (scripts/run_allreduce_mps.sh). All ranks share
one GPU's memory system and SMs, so the numbers measure the synchronisation overhead and the
protocol cost, not NVLink bandwidth: they do not predict an 8 x H100 node (docs/allreduce_model.md
does that). Refuses to run without a GPU. Rank 0 prints a markdown table and writes --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

SIZES = [8 << (2 * k) for k in range(14)] + [256 << 20]  # 8 B, 32 B, ... 128 MiB, 256 MiB
ALGORITHMS = ("one_shot", "two_shot", "nvshmem_library", "xla")
REPEAT = 20  # all_reduces per jitted call (fori_loop), to amortize dispatch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--quick", action="store_true", help="sizes up to 1 MiB only (--max-bytes 1048576)")
    args = ap.parse_args()
    if args.quick:
        args.max_bytes = min(args.max_bytes, 1 << 20)
    from jax_gpuext.common import gates

    r = gates.check_all(["cuda_extension", "cuda_device", "nvshmem", "nvshmem_allreduce_module"])
    if not r.supported:
        print(f"bench_allreduce needs a GPU with NVSHMEM: {r.reason}", file=sys.stderr)
        return 2
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "run_allreduce_mps.sh"
    out = os.path.abspath(args.out) if args.out else ""
    cmd = ["bash", str(script), str(args.nproc), "bench", "--out", out, "--max-bytes", str(args.max_bytes)]
    return subprocess.call(cmd, env={**os.environ, "PYTHON": sys.executable})


def run_rank(out: str | None, rest: list[str]) -> int:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_gpuext

    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    args = ap.parse_args(rest)
    n = jax.process_count()
    mesh = jax.make_mesh((n,), ("i",))
    rows = []
    for nbytes in [s for s in SIZES if s <= args.max_bytes]:
        count = max(1, nbytes // 4)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), jnp.ones((count,), jnp.float32))
        row = {"bytes": nbytes}
        for algorithm in ALGORITHMS:
            def body(v, algorithm=algorithm):
                return lax.fori_loop(0, REPEAT, lambda _, u: jax_gpuext.all_reduce(u, "i", algorithm=algorithm)
                                     * (1.0 / n), v)
            f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
            jax.block_until_ready(f(x))  # compile + warm up
            t0 = time.perf_counter()
            iters = 5
            for _ in range(iters):
                y = f(x)
            jax.block_until_ready(y)
            us = (time.perf_counter() - t0) / (iters * REPEAT) * 1e6
            row[algorithm] = {"us": us, "algbw_GBps": nbytes / us / 1e3}
        rows.append(row)
    if jax.process_index() == 0:
        print(markdown(rows, n))
        if out:
            meta = {"nproc": n, "device": jax.devices()[0].device_kind, "note":
                    "all ranks share ONE GPU under MPS: synchronisation overhead, not NVLink bandwidth"}
            pathlib.Path(out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print("RANK OK", jax.process_index(), flush=True)
    return 0


def markdown(rows, n) -> str:
    head = "| bytes | " + " | ".join(f"{a} (us)" for a in ALGORITHMS) + " |"
    lines = [f"all_reduce on {n} processes sharing one GPU (MPS): synchronisation overhead, not NVLink", "",
             head, "|" + "---|" * (len(ALGORITHMS) + 1)]
    for r in rows:
        lines.append(f"| {r['bytes']} | " + " | ".join(f"{r[a]['us']:.1f}" for a in ALGORITHMS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
