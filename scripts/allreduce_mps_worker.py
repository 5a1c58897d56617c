"""One rank of the GPU all_reduce check (started by scripts/run_allreduce_mps.sh).

Modes: plain (every dtype x op x algorithm x size vs NumPy, one compiled program per dtype x op),
command_buffer (the same under XLA command buffers with the graph-safe target), timeout (rank 1
skips a call: the others must fail within the timeout naming exactly PE 1), bench
(benchmarks/bench_allreduce.py's measurement). Prints "RANK OK" on success.
"""

from __future__ import annotations

import argparse
import os
import sys

DTYPES = ("float32", "bfloat16", "float16", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64",
          "bool", "float8_e4m3fn", "float8_e5m2")
SIZES = (0, 1, 37, 1000, (3 << 20) // 4)  # the last is larger than the 1 MiB workspace
KERNELS = ("one_shot", "two_shot")
TIMEOUT_TEST_S = 5.0
ENV_EXIT = 3  # run_allreduce_mps.sh's "this machine cannot run it" status


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
        # Custom calls captured whatever XLA's default list of command types is in this jaxlib.
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_graph_min_graph_size=1"
                                   " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL")
    import jax

    # Every rank drives the one GPU: no auto-detected cluster environment may assign another.
    jax.distributed.initialize(f"localhost:{args.port}", args.nproc, args.rank, local_device_ids=[0])
    from jax_gpuext.collectives import distributed

    try:
        info = distributed.initialize(workspace_bytes=1 << 20)
        print(f"rank {args.rank}: NVSHMEM PE {info.my_pe} of {info.n_pes}, {info.status}", flush=True)
        shared_gpu = os.environ.get("GPU_PER_RANK", "0") != "1"  # run_allreduce_mps.sh: all ranks on GPU 0
        if shared_gpu and info.init_status != distributed.FULL_MPG:  # the machine, not our code
            os.environ["JAX_GPUEXT_NVSHMEM_FINALIZE"] = "0"
            print(f"ENVIRONMENT: NVSHMEM is {info.status!r}, not full MPG: several PEs on one GPU need CUDA MPS "
                  "with full multi-process-per-GPU support", file=sys.stderr, flush=True)
            return ENV_EXIT
        if args.mode == "bench":
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
            import bench_allreduce

            return bench_allreduce.run_rank(args.out, rest)
        run = {"plain": check_all, "command_buffer": check_all, "timeout": check_timeout}[args.mode]
        run(args.rank, args.nproc)
    except BaseException:
        # The collective teardown at exit would wait for peers that may be gone or stuck.
        os.environ["JAX_GPUEXT_NVSHMEM_FINALIZE"] = "0"
        raise
    print("RANK OK", args.rank, flush=True)
    return 0


def _shard_jit(body, mesh, n_in: int, n_out: int):
    import jax
    from jax.sharding import PartitionSpec as P

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"),) * n_in, out_specs=(P("i"),) * n_out,
                                 check_vma=False))


def _compile_and_meet(f, args, barrier: str):
    """Compiles, then waits for every rank: the kernels' deadlines then time the peers' calls,
    not how much longer their compilation took."""
    from jax_gpuext.collectives import distributed

    compiled = f.lower(*args).compile()
    distributed._jax_distributed_client().wait_at_barrier(barrier, 300_000)
    return compiled


def _global(x_local, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    return jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), x_local)


def _check_captured(mesh, x, n: int) -> None:
    """Command-buffer mode: XLA records each algorithm's graph-safe all-reduce into a CUDA graph once
    and replays it without calling the handler, every replay reducing again (the epochs and the
    status word live in device memory). tests/_command_buffer.py counts this rank's handler runs."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    import _command_buffer as cb
    import numpy as np

    import jax_gpuext
    from jax_gpuext.collectives.all_reduce import GRAPH_TARGET

    for algorithm in KERNELS + ("nvshmem_library",):
        f = _shard_jit(lambda v, a=algorithm: (jax_gpuext.all_reduce(v, "i", algorithm=a),), mesh, 1, 1)
        compiled = _compile_and_meet(f, [x], f"gpuext_all_reduce/captured/{algorithm}")

        def check(out, algorithm=algorithm):  # x is ones on every rank
            got = np.asarray(out[0].addressable_shards[0].data)
            np.testing.assert_array_equal(got, np.full(got.shape, n, got.dtype), err_msg=algorithm)

        counts = cb.run_counted(compiled, (x,), GRAPH_TARGET, check=check)
        print(f"{algorithm}: {counts}", flush=True)
        why = cb.capture_failure(counts, cb.RUNS)
        assert why is None, f"{algorithm}: {why}"


def ops_for(dtype: str) -> tuple[str, ...]:
    return ("and", "or", "max", "min") if dtype == "bool" else ("sum", "max", "min", "prod")


def library_refusal(dtype: str, op: str) -> str | None:
    """nvshmem_library's own predicate (jax_gpuext.collectives.all_reduce.library_refusal): the refusals this
    check expects are the library's, never a second list kept here by hand."""
    from jax_gpuext.collectives.all_reduce import library_refusal as predicate

    return predicate(dtype, op)


def expected_cases() -> int:
    """Every (dtype, op, size) on both kernels, and on nvshmem_library where it takes the pair."""
    return sum(len(SIZES) * (len(KERNELS) + (library_refusal(dtype, op) is None))
               for dtype in DTYPES for op in ops_for(dtype))


def _library_takes(dtype: str, op: str, mesh, x) -> bool:
    """Whether nvshmem_library runs (dtype, op): exactly when its predicate says so. A refusal it
    does not predict (or an acceptance it does not) is a failure, with both answers."""
    import jax

    import jax_gpuext

    why = library_refusal(dtype, op)
    try:  # the backend is chosen at trace time
        jax.eval_shape(_shard_jit(lambda v: (jax_gpuext.all_reduce(v, "i", op=op, algorithm="nvshmem_library"),),
                                  mesh, 1, 1), x)
    except jax_gpuext.UnsupportedError as e:
        if why is not None and why in str(e):
            return False
        raise AssertionError(f"nvshmem_library refused {dtype} {op} ({e}); its predicate says: "
                             f"{why or 'takes it'}") from e
    assert why is None, f"nvshmem_library took {dtype} {op}, but its predicate refuses it: {why}"
    return True


def plain_program(mesh, op: str, algorithms, count: int):
    """The plain check's program for one (dtype, op): every algorithm on each of ``count`` operands
    (one per size in SIZES, the empty one included) in ONE jit, as a user would mix them.
    tests/collectives/test_allreduce_zero_size.py lowers exactly this program for CUDA on a CPU
    machine (issue 33: jaxlib 0.11.2 segfaulted compiling it while an empty operand reached it)."""
    import jax_gpuext

    def body(*locals_):
        return tuple(jax_gpuext.all_reduce(x, "i", op=op, algorithm=a) for x in locals_ for a in algorithms)

    return _shard_jit(body, mesh, count, count * len(algorithms))


def check_all(rank: int, n: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_gpuext
    from jax_gpuext.common import env

    jax.config.update("jax_enable_x64", True)  # else float64/int64/uint64 arrays are silently 32-bit
    mesh = jax.make_mesh((n,), ("i",))
    if env.get("JAX_GPUEXT_ALLREDUCE_GRAPH_SAFE"):
        _check_captured(mesh, _global(np.ones(1000, np.float32), mesh), n)
    ran = 0
    for dtype in DTYPES:
        for op in ops_for(dtype):
            data = [[_data(dtype, op, size, r) for r in range(n)] for size in SIZES]  # all ranks': the reference
            xs = [_global(d[rank], mesh) for d in data]
            assert all(x.dtype == jnp.dtype(dtype) for x in xs), f"{dtype} became {xs[0].dtype}"
            algorithms = KERNELS + (("nvshmem_library",) if _library_takes(dtype, op, mesh, xs[0]) else ())
            f = plain_program(mesh, op, algorithms, len(xs))
            if rank == 0:  # a crash inside XLA's compiler leaves no Python error: say which program it was
                print(f"compiling {dtype} {op}: sizes {SIZES} x {algorithms}", flush=True)
            outs = _compile_and_meet(f, xs, f"gpuext_all_reduce/{dtype}/{op}")(*xs)
            for k, size in enumerate(SIZES):
                want = _numpy_reduce(data[k], op, dtype)
                for j, algorithm in enumerate(algorithms):
                    got = np.asarray(outs[k * len(algorithms) + j].addressable_shards[0].data)
                    np.testing.assert_array_equal(got.astype(np.float64) if dtype != "bool" else got,
                                                  want.astype(np.float64) if dtype != "bool" else want,
                                                  err_msg=f"{algorithm} {dtype} {op} {size}")
                    ran += 1
    assert ran == expected_cases(), f"{ran} cases ran, expected {expected_cases()}"
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
    import re
    import time

    import jax
    import numpy as np
    from jax import lax

    import jax_gpuext

    mesh = jax.make_mesh((n,), ("i",))
    f = _shard_jit(lambda v: (lax.cond(lax.axis_index("i") == 1, lambda u: u,
                                       lambda u: jax_gpuext.all_reduce(u, "i", algorithm="one_shot",
                                                                       timeout_s=TIMEOUT_TEST_S), v),),
                   mesh, 1, 1)
    x = _global(np.ones(16, np.float32), mesh)
    compiled = _compile_and_meet(f, [x], "gpuext_all_reduce/timeout")
    t0 = time.perf_counter()
    try:
        jax.block_until_ready(compiled(x))
        failed = None
    except Exception as e:  # noqa: BLE001
        failed = str(e)
    elapsed = time.perf_counter() - t0
    if rank == 1:
        assert failed is None, f"rank 1 skipped the call, yet: {failed}"
        return
    m = re.search(r"PEs \[([0-9, ]*)\] of \d+ did not arrive", failed or "")
    named = {int(p) for p in m.group(1).split(",") if p.strip()} if m else None
    assert named == {1}, f"rank {rank}: expected a timeout naming exactly PE 1, got {failed!r}"
    assert elapsed < TIMEOUT_TEST_S + 25, f"rank {rank}: the timeout took {elapsed:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
