"""One rank of the GPU all_reduce check (started by scripts/run_allreduce_mps.sh).

Modes: plain (every dtype x op x algorithm x size vs NumPy), command_buffer (the same under
XLA command buffers with the graph-safe target), timeout (rank 1 skips a call: the others must
fail within the timeout naming PE 1), bench (benchmarks/bench_allreduce.py's measurement).
Prints "RANK OK" on success.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--out", default=None)
    args, rest = ap.parse_known_args()
    if args.mode == "command_buffer":
        os.environ["JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE"] = "1"
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_gpu_graph_min_graph_size=1"
    import jax

    jax.distributed.initialize(f"localhost:{args.port}", args.nproc, args.rank)
    import jax_gpuext

    jax_gpuext.distributed.initialize(workspace_bytes=1 << 20)
    if args.mode == "bench":
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
        import bench_allreduce

        return bench_allreduce.run_rank(args.out, rest)
    run = {"plain": check_all, "command_buffer": check_all, "timeout": check_timeout}[args.mode]
    run(args.rank, args.nproc)
    print("RANK OK", args.rank, flush=True)
    return 0


def _check_captured(f, x, algorithm: str) -> None:
    """Command-buffer mode: the graph-safe all-reduce must sit inside an XLA command buffer."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from _hlo import custom_calls_in_command_buffers

    captured = custom_calls_in_command_buffers(f.lower(x).compile().as_text())
    assert "gpuext_all_reduce_graph" in captured, f"{algorithm}: not in a command buffer ({captured})"


def _global(x_local, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), x_local)


def check_all(rank: int, n: int) -> None:
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import jax_gpuext

    mesh = jax.make_mesh((n,), ("i",))
    graph_safe = os.environ.get("JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE", "0") not in ("", "0")
    dtypes = ["float32", "bfloat16", "float16", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64",
              "bool", "float8_e4m3fn", "float8_e5m2"]
    sizes = [0, 1, 37, 1000, (3 << 20) // 4]  # the last is larger than the 1 MiB workspace
    for dtype in dtypes:
        ops = ("and", "or", "max", "min") if dtype == "bool" else ("sum", "max", "min", "prod")
        for op in ops:
            for algorithm in ("one_shot", "two_shot", "nvshmem_library"):
                for size in sizes:
                    data = [_data(dtype, op, size, r) for r in range(n)]  # every rank builds all: the NumPy reference
                    f = jax.jit(jax.shard_map(lambda v: jax_gpuext.all_reduce(v, "i", op=op, algorithm=algorithm),
                                              mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
                    try:
                        out = f(_global(data[rank], mesh))
                    except jax_gpuext.UnsupportedError:
                        continue  # nvshmem_library lacks float8/bool
                    if graph_safe and (dtype, op, size) == ("float32", "sum", 1000):
                        _check_captured(f, _global(data[rank], mesh), algorithm)
                    got = np.asarray(out.addressable_shards[0].data)
                    want = _numpy_reduce(data, op, dtype)
                    np.testing.assert_array_equal(got.astype(np.float64) if dtype != "bool" else got,
                                                  want.astype(np.float64) if dtype != "bool" else want,
                                                  err_msg=f"{algorithm} {dtype} {op} {size}")
    jax_gpuext.distributed.check_status()


def _data(dtype, op, size, seed):
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(size) < 0.6
    lo, hi = {"sum": (-3, 4), "prod": (-2, 3), "max": (-50, 51), "min": (-50, 51)}[op]
    if dtype.startswith("uint"):
        lo = 0 if op != "prod" else 1
    v = rng.integers(lo, hi, size)
    return v.astype(np.float32).astype(jnp.dtype(dtype)) if "float" in dtype else v.astype(dtype)


def _numpy_reduce(data, op, dtype):
    import jax.numpy as jnp
    import numpy as np

    if dtype == "bool":
        return np.logical_and.reduce(data) if op in ("and", "min") else np.logical_or.reduce(data)
    acc_dtype = np.float32 if "float" in dtype and dtype != "float64" else None
    stack = np.stack([d.astype(acc_dtype) if acc_dtype else d for d in data])
    fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    return fn(stack, axis=0, **({"dtype": stack.dtype} if op in ("sum", "prod") else {})).astype(jnp.dtype(dtype))


def check_timeout(rank: int, n: int) -> None:
    import time

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import jax_gpuext

    mesh = jax.make_mesh((n,), ("i",))
    f = jax.jit(jax.shard_map(
        lambda v: lax.cond(lax.axis_index("i") == 1, lambda u: u,
                           lambda u: jax_gpuext.all_reduce(u, "i", algorithm="one_shot", timeout_s=1.0), v),
        mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    t0 = time.perf_counter()
    try:
        jax.block_until_ready(f(_global(jnp.ones((16,)), mesh)))
        failed = None
    except Exception as e:  # noqa: BLE001
        failed = str(e)
    if rank == 1:
        return  # the one that skipped: fine
    assert failed is not None and "PEs [1]" in failed, f"rank {rank}: expected a timeout naming PE 1, got {failed!r}"
    assert time.perf_counter() - t0 < 30


if __name__ == "__main__":
    sys.exit(main())
