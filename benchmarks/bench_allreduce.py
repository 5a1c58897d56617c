"""all_reduce latency / bandwidth per algorithm and size (8 B .. 256 MiB) against baselines that
run where the ranks are.

    python benchmarks/bench_allreduce.py --nproc 2 --out results/allreduce.json

With fewer GPUs than ranks (the one-GPU machine) every rank runs on GPU 0 under CUDA MPS
(scripts/run_allreduce_mps.sh). All ranks then share one GPU's memory system and SMs, so the numbers
measure synchronisation overhead and protocol cost, not NVLink bandwidth: they do not predict an
8 x H100 node (docs/allreduce_model.md does that). The baselines there:

- ``nvshmem_library``: NVSHMEM's own reduction (``nvshmemx_*_reduce_on_stream``, our backend of that
  name) on the same symmetric buffers: what a user of NVSHMEM gets without our kernels.
- ``copy``: one pass over the same bytes on every rank at once (read + write, fused with the same
  scaling the all-reduce rows apply): the memory traffic any all-reduce needs at least, measured.
- ``floor``: 2 * nproc * bytes at the best aggregate bandwidth ``copy`` reached in this run: each
  contribution read once and each result written once, with nothing else (no launch, no handshake).
- ``xla`` (``lax.psum``, NCCL) only with one GPU per rank: NCCL refuses several ranks on one GPU
  ("Duplicate GPU detected"), so on one GPU the XLA comparison cannot be made; it needs >= 2 GPUs.

Every (size, algorithm) is measured on its own: a failure is recorded in its row and the next one
runs. Rank 0 rewrites --out after every size. Refuses to run without a GPU.
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
OURS = ("one_shot", "two_shot")
REPEAT = 20  # all_reduces per jitted call (fori_loop), to amortize dispatch
ITERS = 5
BARRIER_MS = 120_000
NO_XLA_NOTE = ("xla (lax.psum over NCCL) not measured: the ranks share one GPU, and NCCL refuses several ranks "
               "on one GPU ('Duplicate GPU detected'); the XLA/NCCL comparison needs >= 2 GPUs, one rank each")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file for the results (rewritten after every size)")
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
    own_gpus = len(gates.cuda_devices()) >= args.nproc
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "run_allreduce_mps.sh"
    out = os.path.abspath(args.out) if args.out else ""
    cmd = ["bash", str(script), str(args.nproc), "bench", "--out", out, "--max-bytes", str(args.max_bytes)]
    # One GPU per rank where there are enough (then no MPS, and XLA's psum can be measured too).
    env = {**os.environ, "PYTHON": sys.executable, "GPU_PER_RANK": "1" if own_gpus else "0"}
    return subprocess.call(cmd, env=env)


def _measure(f, x) -> float:
    """Microseconds per all-reduce (or per copy) of the jitted loop ``f``."""
    import jax

    jax.block_until_ready(f(x))  # compile + warm up
    t0 = time.perf_counter()
    for _ in range(ITERS):
        y = f(x)
    jax.block_until_ready(y)
    return (time.perf_counter() - t0) / (ITERS * REPEAT) * 1e6


def _loop(step, mesh):
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec as P

    return jax.jit(jax.shard_map(lambda v: lax.fori_loop(0, REPEAT, lambda _, u: step(u), v), mesh=mesh,
                                 in_specs=P("i"), out_specs=P("i"), check_vma=False))


def baselines(own_gpus: bool) -> tuple[str, ...]:
    """What is measured besides our kernels: NVSHMEM's reduction and the copy always, XLA's psum
    only with one GPU per rank (NCCL refuses ranks that share one)."""
    return ("nvshmem_library", "copy") + (("xla",) if own_gpus else ())


def add_floor(rows: list[dict], n: int) -> None:
    """floor_us per row: 2 * n * bytes at the best aggregate copy bandwidth of the run."""
    bws = [2 * n * r["bytes"] / r["copy_us"] for r in rows if isinstance(r.get("copy_us"), float) and r["copy_us"] > 0]
    if not bws:
        return
    best = max(bws)  # bytes per microsecond
    for r in rows:
        r["floor_us"] = 2 * n * r["bytes"] / best


def run_rank(out: str | None, rest: list[str]) -> int:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_gpuext
    from jax_gpuext.collectives import distributed

    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    args = ap.parse_args(rest)
    n = jax.process_count()
    own_gpus = os.environ.get("GPU_PER_RANK", "0") == "1"
    mesh = jax.make_mesh((n,), ("i",))
    client = distributed._jax_distributed_client()
    columns = OURS + baselines(own_gpus)
    notes = [f"{n} ranks " + ("on one GPU each" if own_gpus else
                              "sharing ONE GPU under CUDA MPS: synchronisation and protocol cost, not NVLink bandwidth"),
             "copy: one read + write pass over the same bytes on every rank at once (the traffic any all-reduce "
             "needs); floor: 2 * ranks * bytes at the best aggregate copy bandwidth of this run",
             "nvshmem_library: NVSHMEM's own reduce_on_stream on the same buffers"]
    if not own_gpus:
        notes.append(NO_XLA_NOTE)
    rows: list[dict] = []
    for nbytes in [s for s in SIZES if s <= args.max_bytes]:
        count = max(1, nbytes // 4)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), jnp.ones((count,), jnp.float32))
        row: dict = {"bytes": nbytes}
        for column in columns:
            if column == "copy":
                step = lambda u: u * (1.0 / n)  # noqa: E731
            else:
                step = lambda u, a=column: jax_gpuext.all_reduce(u, "i", algorithm=a) * (1.0 / n)  # noqa: E731
            try:
                row[f"{column}_us"] = _measure(_loop(step, mesh), x)
            except Exception as e:  # noqa: BLE001 - recorded in the row; the next one runs
                row[f"{column}_error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"rank {jax.process_index()}: {nbytes} B {column} failed: {row[f'{column}_error']}",
                      file=sys.stderr, flush=True)
            # Every rank reaches the next measurement together, whatever happened in this one.
            client.wait_at_barrier(f"bench_allreduce/{nbytes}/{column}", BARRIER_MS)
        rows.append(row)
        add_floor(rows, n)
        if jax.process_index() == 0:
            print(_row_text(row, columns), flush=True)
            if out:
                pathlib.Path(out).write_text(json.dumps(
                    {"benchmark": "bench_allreduce", "rows": rows, "notes": notes,
                     "meta": {"nproc": n, "device": jax.devices()[0].device_kind, "own_gpus": own_gpus}}, indent=2))
    if jax.process_index() == 0:
        print(markdown(rows, columns, n, notes))
    print("RANK OK", jax.process_index(), flush=True)
    return 0


def _row_text(row: dict, columns) -> str:
    return f"{row['bytes']} B: " + ", ".join(
        f"{c} {row[c + '_us']:.1f} us" if c + "_us" in row else f"{c} FAILED" for c in columns)


def markdown(rows: list[dict], columns, n: int, notes: list[str]) -> str:
    cols = list(columns) + ["floor"]
    lines = [f"all_reduce on {n} processes, microseconds per call", "",
             "| bytes | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        lines.append(f"| {r['bytes']} | " + " | ".join(
            f"{r[c + '_us']:.1f}" if c + "_us" in r else "failed" for c in cols) + " |")
    return "\n".join(lines + [""] + [f"- {note}" for note in notes])


if __name__ == "__main__":
    sys.exit(main())
