"""Timing on the device for the GPU benchmarks (docs/design.md, "Benchmarks that measure the hardware").

Timing one call from Python (``block_until_ready`` after each) counts the dispatch and the wait
with the kernel: on the first H200 run every 4096^2 quantize took 150-350 us whatever it did
(~15 us of memory traffic), and a 512 MiB copy read as 2.3 TB/s on a device that copies at 4.3.
So here one compiled program runs the op ``k`` times (``repeated``): one dispatch covers ``k``
kernels, what a dispatch costs is measured once per process and taken off, and ``k`` is chosen
so that a call lasts about ``target_s``.

The benchmarks are scripts (run as ``python benchmarks/bench_x.py``, also with ``-P``); they put
this folder on ``sys.path`` to import this module. Nothing here knows jax_gpuext.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import statistics
import time

# When the benchmark process started, as near as a module can tell: each bench imports this module
# before JAX, so ``--time-limit`` counts JAX's import and the GPU's start too.
PROCESS_T0 = time.monotonic()


def _tie(args, i):
    """``args`` with element 0 of every float array leaf rewritten as itself times
    ``1 + 0 * i``: the same values, but as far as XLA can tell they depend on the loop counter.

    What this replaces did not work: an ``optimization_barrier`` over (args, i) is expanded away
    before loop-invariant code motion, and XLA then hoisted the op out of the loop (seen in the
    compiled HLO on CPU; tests/common/test_benchmarks.py). Float ``0 * i`` is never folded (it
    is NaN for an infinite i), so each iteration's operands differ to XLA. The rewrite is an
    in-place dynamic-update-slice of one element per leaf, a tiny kernel next to the op.
    float4 leaves are left alone (sub-byte element updates); integer leaves too (XLA folds
    ``0 * i`` there): an op always reads some other float leaf (scales, data).
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    one = 1.0 + 0.0 * i.astype(jnp.float32)
    tied = [False]

    def tie(leaf):
        dt = jnp.dtype(getattr(leaf, "dtype", jnp.float32))
        if not hasattr(leaf, "shape") or leaf.size == 0 or not jnp.issubdtype(dt, jnp.floating) \
                or "float4" in dt.name:
            return leaf
        tied[0] = True
        start = (0,) * leaf.ndim
        v = lax.dynamic_slice(leaf, start, (1,) * leaf.ndim)
        return lax.dynamic_update_slice(leaf, (v.astype(jnp.float32) * one).astype(dt), start)

    out = jax.tree_util.tree_map(tie, args)
    if not tied[0]:
        raise ValueError("repeated: the operands have no float array (other than float4) to tie to the loop")
    return out


def repeated(op, k: int):
    """``jax.jit`` of ``run(args) -> (args, op(*args))``, ``args`` a tuple, that runs ``op`` ``k``
    times in one program; ``args`` is donated and handed back (``args, out = f(args)``).

    The first run is outside the loop (it gives the carry its structure); the other k - 1 run in
    a ``fori_loop`` whose body first ties the operands to the loop counter (``_tie``), so XLA can
    neither hoist the op out of the loop nor merge iterations, even if it unrolls it. The result
    is only written, never read: each iteration does the op's own memory traffic. The operands
    are carried through the loop, returned and donated: their buffers are the loop's, with no
    entry copy of them in the timed call (they come first in the result: jax gives a donated
    buffer to the first result of its shape and dtype, and an op's result may have theirs).
    """
    import jax
    from jax import lax

    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")

    def run(args):
        out = op(*args)
        if k == 1:
            return args, out

        def body(i, carry):
            a = _tie(carry[0], i)
            return a, op(*a)

        args, out = lax.fori_loop(1, k, body, (tuple(args), out))
        return args, out

    return jax.jit(run, donate_argnums=0)


def fresh(args):
    """Copies of ``args`` for ``repeated``, which consumes (donates) what it is given."""
    import jax
    import jax.numpy as jnp

    return jax.block_until_ready(jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True) if hasattr(a, "shape") else a,
                                                        args))


@dataclasses.dataclass
class Measurement:
    seconds: float  # one op: (median call - dispatch overhead) / k
    k: int  # ops per call
    call_s: float  # median wall time of one call (k ops and one dispatch)
    samples: int
    compile_s: float
    overhead_s: float

    def fields(self) -> dict:
        """The keys every benchmark's rows carry for a timed op."""
        return {"time_us": self.seconds * 1e6, "k": self.k, "call_ms": self.call_s * 1e3, "samples": self.samples,
                "compile_s": round(self.compile_s, 3), "dispatch_overhead_us": self.overhead_s * 1e6}


class Timer:
    """Compiles and times ops with ``repeated``.

    ``target_s``: how long one call should last (k = target / the caller's estimate of one op,
    clamped to [min_k, max_k]); ``samples``: calls timed after a warm-up call, the median kept (one
    only where a call lasts more than 4 x target: a slow path measured once is measured well
    enough, and the budget is the run's).
    """

    def __init__(self, *, target_s: float = 0.01, samples: int = 5, min_k: int = 2, max_k: int = 200):
        self.target_s, self.samples, self.min_k, self.max_k = target_s, samples, min_k, max_k
        self._overhead = None
        self.last_out = self.last_compiled = None

    @property
    def overhead_s(self) -> float:
        """What one call costs beyond its kernels: the median of a one-element add, dispatched and
        waited for (Python, PjRt, the launch and the host wake-up)."""
        if self._overhead is None:
            import jax
            import jax.numpy as jnp

            f = jax.jit(lambda v: v + 1)
            x = jnp.zeros((1,), jnp.float32)
            jax.block_until_ready(f(x))
            times = []
            for _ in range(31):
                t0 = time.perf_counter()
                jax.block_until_ready(f(x))
                times.append(time.perf_counter() - t0)
            self._overhead = statistics.median(times)
        return self._overhead

    def k_for(self, est_s: float) -> int:
        """Ops per call so that a call lasts about target_s, given an estimate of one op."""
        if not est_s > 0:
            return self.min_k
        return max(self.min_k, min(self.max_k, math.ceil(self.target_s / est_s)))

    def compile(self, op, args, k: int):
        """(compiled program, seconds to lower and compile)."""
        t0 = time.perf_counter()
        compiled = repeated(op, k).lower(tuple(args)).compile()
        return compiled, time.perf_counter() - t0

    def compile_many(self, jobs, threads: int = 1):
        """jobs: [(op, args, k)] -> [(compiled, seconds) or the exception], in order. Tracing and
        lowering run here, one after another (our ops consult process-wide state while tracing);
        XLA's compile, which releases the GIL, runs in ``threads`` threads. Only for programs whose
        compile does not time kernels on the device (no GEMM autotuning): concurrent autotuning
        would time candidates against each other's kernels and could pick a slower one."""
        lowered = []
        for op, args, k in jobs:
            t0 = time.perf_counter()
            try:
                lowered.append((repeated(op, k).lower(tuple(args)), time.perf_counter() - t0))
            except Exception as e:  # noqa: BLE001 - the caller records it per row
                lowered.append((e, 0.0))

        def finish(item):
            low, t_lower = item
            if isinstance(low, Exception):
                return low
            t0 = time.perf_counter()
            try:
                return low.compile(), t_lower + time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001
                return e

        if threads <= 1:
            return [finish(item) for item in lowered]
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            return list(pool.map(finish, lowered))

    def run(self, compiled, args, k: int, compile_s: float = 0.0) -> Measurement:
        """Times a compiled ``repeated`` program (a warm-up call first) on copies of ``args``."""
        import jax

        overhead = self.overhead_s
        args = fresh(tuple(args))
        args, out = jax.block_until_ready(compiled(args))
        times = []
        for i in range(self.samples):
            t0 = time.perf_counter()
            args, out = jax.block_until_ready(compiled(args))
            times.append(time.perf_counter() - t0)
            if i == 0 and times[0] > 4 * self.target_s:
                break
        call = statistics.median(times)
        self.last_out = out  # the op's result (of the last call): a later row's input
        return Measurement(max(call - overhead, 0.0) / k, k, call, len(times), compile_s, overhead)

    def time(self, op, args, est_s: float) -> Measurement:
        k = self.k_for(est_s)
        compiled, compile_s = self.compile(op, args, k)
        self.last_compiled = compiled  # its optimized HLO (as_text()) says what XLA made of the op
        return self.run(compiled, args, k, compile_s)


class Deadline:
    """``--time-limit``: seconds since the process started that the benchmark may use. Work is
    started only while the slowest unit seen so far still fits, so the benchmark stops on its own,
    writes what it measured and names what it did not run, before gpu_run.sh's bound kills it."""

    def __init__(self, limit_s: float | None):
        self.limit_s = limit_s
        self.slowest_s = 0.0
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - PROCESS_T0

    def allows(self, what: str, need_s: float | None = None) -> bool:
        """True if ``what`` (needing need_s, default the slowest unit so far) fits; else records it."""
        if self.limit_s is None:
            return True
        need = self.slowest_s if need_s is None else need_s
        if self.elapsed() + need <= self.limit_s:
            return True
        self.skipped.append(what)
        return False

    def done(self, started: float) -> None:
        """A unit that began at ``started`` (time.monotonic()) has ended."""
        self.slowest_s = max(self.slowest_s, time.monotonic() - started)

    def note(self) -> list[str]:
        if not self.skipped:
            return []
        return [f"stopped at --time-limit {self.limit_s:.0f} s (after {self.elapsed():.0f} s); not run: "
                + ", ".join(self.skipped)]


def device_memory_bytes() -> int | None:
    """What JAX's allocator may hand out on the first device (None where it does not say: CPU)."""
    import jax

    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - some platforms raise instead of returning None
        return None
    return stats.get("bytes_limit")


def error_text(e: BaseException, limit: int = 300) -> str:
    """An exception as one line for a results row: its type and the start of its message."""
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:limit]
