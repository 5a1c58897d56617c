"""Timing on the device for the GPU benchmarks (docs/design.md, "Benchmarks that measure the hardware",
"Timing round 2").

Timing one call from Python (``block_until_ready`` after each) counts the dispatch and the wait
with the kernel: on the first H200 run every 4096^2 quantize took 150-350 us whatever it did
(~15 us of memory traffic), and a 512 MiB copy read as 2.3 TB/s on a device that copies at 4.3.

Two methods, chosen by ``Timer`` (``timing`` in every row says which measured it):

- ``cuda_events`` (a CUDA build on a GPU): ``marked(op)`` compiles mark -> op -> mark, where each
  mark is our ``gpuext_timer_mark`` custom call: it hands its operands back aliased (no copy) and
  records a CUDA event on XLA's stream into a slot of a process-wide table. The op's operands are
  the first mark's results and the second mark's operands are the op's results, so XLA orders the
  op's kernels between the two events; the batch of calls is enqueued behind a hold kernel
  (``gpuext_timer_hold``), so no call waits for the host's launches inside its two events. The
  time of one op is the median of the per-call event intervals: the dispatch and XLA's gaps between
  calls fall between events, never inside.
- ``loop`` (the fallback: CPU, or a build without the marks): ``repeated(op, k)`` runs the op k
  times in one program's ``fori_loop``; (median call - one dispatch) / k. On the H200 it read a
  512 MiB copy at 1.6 TB/s (XLA's) and 0.65 TB/s (a cudaMemcpyAsync) where CUDA events read
  4.2 TB/s: its loop adds a per-iteration cost of its own, so its numbers are lower bounds.

The benchmarks are scripts (run as ``python benchmarks/bench_x.py``, also with ``-P``); they put
this folder on ``sys.path`` to import this module. Only the marks need jax_gpuext (its ``_cuda``
module: the targets and ``timer_elapsed_ms``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
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


# --------------------------------------------------------------------------- CUDA events
MARK_TARGET = "gpuext_timer_mark"  # ffi/cuda/timer.cc
HOLD_TARGET = "gpuext_timer_hold"
SLOT_BEFORE, SLOT_AFTER = 0, 1  # the table's slots the marks record into (csrc/timer/event_table.h)
# Calls in one timed batch: PjRt lets the host run at most 32 executions ahead of the device (then
# it blocks until one finishes), and the whole batch, the hold among them, must be enqueued while
# the hold keeps the GPU waiting.
EVENT_CALLS_MAX = 24
HOLD_MIN_S, HOLD_MAX_S = 0.0005, 0.1


def events_available() -> tuple[bool, str]:
    """(whether the marks can time here, why not): a CUDA device, our ``_cuda`` module with the
    timer, its targets registered with XLA."""
    try:
        import jax

        platform = jax.devices()[0].platform
        if platform != "gpu":
            return False, f"the device is {platform}, not a CUDA GPU"
        from jax_gpuext.common import extension as _ext

        mod, why = _ext.load("cuda")
        if mod is None:
            return False, why
        if not hasattr(mod, "timer_elapsed_ms") or MARK_TARGET not in mod.registrations():
            return False, "this build of jax_gpuext._cuda has no gpuext_timer_mark (built before it: reinstall)"
        _ext.ensure_all_registered()
        if _ext.registration_error("cuda"):
            return False, _ext.registration_error("cuda")
    except Exception as e:  # noqa: BLE001 - no jax_gpuext, no backend: the loop remains
        return False, error_text(e, 200)
    return True, ""


def _timer_module():
    """jax_gpuext._cuda: timer_reset / timer_elapsed_ms (a seam the CPU tests replace)."""
    from jax_gpuext.common import extension as _ext

    return _ext.module("cuda")


def _mark_call(arrays: list, slot: int) -> list:
    """One gpuext_timer_mark call over ``arrays``: result i is operand i's buffer (aliased: the
    mark copies nothing), and the call has a side effect (XLA neither merges two marks nor drops
    one). A seam: the CPU tests put an aliased call of a CPU target in its place."""
    import jax
    import numpy as np

    outs = jax.ffi.ffi_call(MARK_TARGET, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays],
                            input_output_aliases={i: i for i in range(len(arrays))},
                            has_side_effect=True)(*arrays, slot=np.int64(slot))
    return list(outs)


def mark(tree, slot: int, skip=()):
    """``tree`` with its array leaves passed through one mark recording into ``slot``; leaves that
    are (as traced values) in ``skip`` are passed around it: a result that is an operand of the op
    is already marked, and marking it twice would make XLA copy it."""
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    skip_ids = {id(v) for v in skip}
    idx = [i for i, v in enumerate(leaves) if hasattr(v, "shape") and hasattr(v, "dtype") and id(v) not in skip_ids]
    if not idx:
        return tree
    marked_leaves = _mark_call([leaves[i] for i in idx], slot)
    for i, v in zip(idx, marked_leaves):
        leaves[i] = v
    return jax.tree_util.tree_unflatten(treedef, leaves)


def marked(op):
    """``jax.jit`` of ``run(args) -> (args, op(*args))`` with a mark (slot SLOT_BEFORE) on the
    operands and one (SLOT_AFTER) on the result: one call of it records one event before the op's
    kernels and one after. ``args`` is donated and handed back (``args, out = f(args)``): the mark
    writes its operands' buffers in place as far as XLA knows, and an operand XLA may not overwrite
    (a parameter not donated) would be copied in first, on every call."""
    import jax

    def run(args):
        if not any(hasattr(v, "shape") for v in jax.tree_util.tree_leaves(args)):
            raise ValueError("marked: the op has no array operand to order the first mark by")
        args = mark(tuple(args), SLOT_BEFORE)
        out = op(*args)
        return args, mark(out, SLOT_AFTER, skip=jax.tree_util.tree_leaves(args))

    return jax.jit(run, donate_argnums=0)


def hold_call(us):
    """gpuext_timer_hold on an int32 scalar ``us`` (read on the device), handed back aliased: the
    stream stays busy for that many microseconds."""
    import jax
    import jax.numpy as jnp

    return jax.ffi.ffi_call(HOLD_TARGET, jax.ShapeDtypeStruct((), jnp.int32), input_output_aliases={0: 0},
                            has_side_effect=True)(us)


@functools.cache
def _hold_program():
    import jax

    return jax.jit(hold_call, donate_argnums=0)


def _hold(seconds: float) -> None:
    """Enqueues a kernel that keeps the GPU's stream busy for ``seconds`` (does not wait for it)."""
    import jax.numpy as jnp
    import numpy as np

    _hold_program()(jnp.asarray(np.int32(round(seconds * 1e6))))


# --------------------------------------------------------------------------- measurements
@dataclasses.dataclass
class Measurement:
    seconds: float  # one op: median of the per-call event intervals (cuda_events), or (median call - dispatch) / k
    k: int  # calls per timed batch (cuda_events), ops per call (loop)
    call_s: float  # wall time of one call: the batch's / calls (cuda_events; the hold included), median (loop)
    samples: int  # timed batches (cuda_events) or calls (loop)
    compile_s: float
    overhead_s: float  # what was taken off each call: the dispatch (loop); nothing (cuda_events)
    timing: str = "loop"
    min_s: float | None = None  # the fastest call (cuda_events)
    idle_s: float | None = None  # median gap between one call's end event and the next call's start
    launch_bound: int = 0  # batches the host could not enqueue within the hold (their calls not kept)

    def fields(self) -> dict:
        """The keys every benchmark's rows carry for a timed op."""
        out = {"time_us": self.seconds * 1e6, "k": self.k, "call_ms": self.call_s * 1e3, "samples": self.samples,
               "compile_s": round(self.compile_s, 3), "dispatch_overhead_us": self.overhead_s * 1e6,
               "timing": self.timing}
        if self.timing == "cuda_events":
            out.update(time_min_us=self.min_s * 1e6, idle_between_us=None if self.idle_s is None else self.idle_s * 1e6,
                       launch_bound_batches=self.launch_bound)
        return out


LOOP_CAVEAT = ("timing: the loop fallback ({why}): per-op times include the loop's own per-iteration cost "
               "(on an H200 it read a 512 MiB copy at 0.4x of what CUDA events read), so they are lower bounds on "
               "speed; docs/design.md, \"Timing round 2\"")


class Timer:
    """Compiles and times ops: with CUDA events (``marked``) where ``events_available()``, else with
    ``repeated`` (printing why, once).

    ``target_s``: how long the op's calls of one sample should last (k = target / the caller's
    estimate of one op, clamped to [min_k, max_k]; with events at most EVENT_CALLS_MAX calls a
    batch); ``samples``: calls (loop) or batches (events) timed after a warm-up call, the median
    kept (one only where it lasts more than 4 x target: a slow path measured once is measured well
    enough, and the budget is the run's). ``method``: "cuda_events" or "loop" to choose; None: the
    events where they can run.
    """

    def __init__(self, *, target_s: float = 0.01, samples: int = 5, min_k: int = 2, max_k: int = 200,
                 method: str | None = None):
        self.target_s, self.samples, self.min_k, self.max_k = target_s, samples, min_k, max_k
        self._overhead = None
        self.last_out = self.last_compiled = None
        if method not in (None, "cuda_events", "loop"):
            raise ValueError(f"method must be 'cuda_events', 'loop' or None, got {method!r}")
        self.why_not_events = "" if method == "cuda_events" else "chosen by the caller"
        if method is None:
            ok, self.why_not_events = events_available()
            method = "cuda_events" if ok else "loop"
            if not ok:  # said where it happens, not only in the results file
                print(LOOP_CAVEAT.format(why=self.why_not_events), flush=True)
        self.method = method

    @property
    def caveat(self) -> str | None:
        """The note a benchmark's results carry when the loop timed them."""
        return LOOP_CAVEAT.format(why=self.why_not_events) if self.method == "loop" else None

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
        """Ops per call (loop) or calls per batch (events) so that they last about target_s, given
        an estimate of one op."""
        if not est_s > 0:
            k = self.min_k
        else:
            k = max(self.min_k, min(self.max_k, math.ceil(self.target_s / est_s)))
        return min(k, EVENT_CALLS_MAX) if self.method == "cuda_events" else k

    def program(self, op, k: int):
        """The jitted program this timer times ``op`` with (k: the loop's trip count)."""
        return marked(op) if self.method == "cuda_events" else repeated(op, k)

    def compile(self, op, args, k: int):
        """(compiled program, seconds to lower and compile)."""
        t0 = time.perf_counter()
        compiled = self.program(op, k).lower(tuple(args)).compile()
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
                lowered.append((self.program(op, k).lower(tuple(args)), time.perf_counter() - t0))
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
        """Times a compiled program of this timer's ``program`` (a warm-up call first) on copies of
        ``args``."""
        if self.method == "cuda_events":
            return self._run_events(compiled, args, k, compile_s)
        return self._run_loop(compiled, args, k, compile_s)

    def _run_loop(self, compiled, args, k: int, compile_s: float) -> Measurement:
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

    def _run_events(self, compiled, args, calls: int, compile_s: float) -> Measurement:
        """Batches of ``calls`` calls, each batch enqueued behind a hold long enough for the host
        to enqueue all of it (the first guess from the dispatch cost, then twice the enqueue time
        seen), so every call's kernels were queued before the GPU reached its first mark.
        A batch whose enqueue outlasted its hold is launch bound: its calls may hold launch gaps
        and are kept only if no batch was covered."""
        import jax

        mod = _timer_module()
        calls = max(1, min(calls, EVENT_CALLS_MAX))
        args = fresh(tuple(args))
        args, out = jax.block_until_ready(compiled(args))  # warm-up (its events are reset below)
        hold_s = min(HOLD_MAX_S, max(HOLD_MIN_S, 2.0 * calls * self.overhead_s))
        covered, uncovered, gaps, walls = [], [], [], []
        for i in range(self.samples):
            mod.timer_reset(SLOT_BEFORE)
            mod.timer_reset(SLOT_AFTER)
            t0 = time.perf_counter()
            _hold(hold_s)
            for _ in range(calls):
                args, out = compiled(args)
            enqueue_s = time.perf_counter() - t0
            jax.block_until_ready((args, out))
            walls.append(time.perf_counter() - t0)
            per_call = mod.timer_elapsed_ms(SLOT_BEFORE, SLOT_AFTER, 0)
            if len(per_call) != calls:
                raise RuntimeError(f"the marks recorded {len(per_call)} intervals for {calls} calls (a mark "
                                   "that did not run on every call: captured into a CUDA graph, or dropped)")
            (covered if enqueue_s <= hold_s else uncovered).append([ms / 1e3 for ms in per_call])
            gaps += [ms / 1e3 for ms in mod.timer_elapsed_ms(SLOT_AFTER, SLOT_BEFORE, 1)]
            if enqueue_s > hold_s:
                hold_s = min(HOLD_MAX_S, 2.0 * enqueue_s)
            if i == 0 and walls[0] > 4 * self.target_s:
                break
        kept = [t for batch in (covered or uncovered) for t in batch]
        self.last_out = out  # the op's result (marks hand values through): a later row's input
        return Measurement(statistics.median(kept), calls, statistics.median(walls) / calls, len(walls), compile_s,
                           0.0, timing="cuda_events", min_s=min(kept),
                           idle_s=statistics.median(gaps) if gaps else None, launch_bound=len(uncovered))

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
