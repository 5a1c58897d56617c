"""Whether XLA captured our custom calls into command buffers (CUDA graphs) and replayed them,
read from the handlers themselves (docs/design.md, "Checking command-buffer capture").

Every CUDA handler declared ``kCmdBufferCompatible`` counts its execute-stage runs, and how many
of them ran on a stream being captured (ffi/common/execute_stats.h); ``execute_stats()`` of the
module that holds the handler (``_cuda``, ``_nvshmem``) reads the counts. XLA records a captured
call by running its handler on a capturing stream once, then replays the graph without calling
it, while a call run op by op runs its handler every time. This holds whichever way a jaxlib forms
command buffers (in HLO up to jaxlib 0.10, on the thunk sequence from 0.11), so nothing here
reads XLA's text.

    with counting("gpuext_place") as counts:
        for _ in range(RUNS):
            check(f(x))            # let each result go before the next run (see run_counted)
    assert_captured(counts, RUNS)

A program with several calls of one target passes ``sites``: each recording runs each site once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

# Runs per check: enough that replays (no handler call) dominate even if XLA re-records a few
# times because an allocation moved (see assert_captured).
RUNS = 8
# XLA's CommandBufferThunk may run its sequence op by op once before recording ("warm up", when its
# commands need initialization) and does so whenever a profiler session is active.
WARMUP_RUNS = 1
MODULES = ("jax_gpuext._cuda", "jax_gpuext._nvshmem")


def options(kinds: str) -> dict:
    """jit compiler options that capture ``kinds`` (e.g. "CUSTOM_CALL"; "" turns command buffers
    off) however short the captured sequence is."""
    return {"xla_gpu_enable_command_buffer": kinds, "xla_gpu_graph_min_graph_size": 1}


@dataclasses.dataclass
class ExecuteCounts:
    target: str
    calls: int = 0      # execute-stage runs of the target's handler
    captured: int = 0   # ... of which inside a stream capture (recording a graph)

    @property
    def direct(self) -> int:
        """Runs outside any capture: op by op."""
        return self.calls - self.captured

    def __str__(self) -> str:
        return f"{self.target}: handler ran {self.calls} times, {self.captured} of them inside a stream capture"


def capture_failure(counts: ExecuteCounts, runs: int, sites: int = 1) -> str | None:
    """Why ``counts`` (after ``runs`` runs of a program with ``sites`` calls of the target) do not
    show a captured and replayed call; None when they do.

    Captured: the handler ran inside a capture at least once per site. Op by op at most in XLA's
    one warm-up run. Replayed: in all it ran at most half as often as the program ran (a recording
    runs each site once; replays run none), which leaves room for re-recordings when XLA finds a
    buffer of the call at a new address, without letting every run pass.
    """
    if counts.captured < sites:
        why = ("never inside a stream capture: XLA ran it op by op (command buffers off for this call, "
               "a sequence below xla_gpu_graph_min_graph_size, or a profiler session)" if counts.captured == 0
               else f"inside a capture fewer times than the program has calls of it ({sites})")
        return f"{counts} in {runs} runs: {why}"
    if counts.direct > WARMUP_RUNS * sites:
        return (f"{counts} in {runs} runs: {counts.direct} runs outside a capture, more than XLA's warm-up "
                f"({WARMUP_RUNS} per call)")
    if counts.calls > sites * runs // 2:
        return (f"{counts} in {runs} runs: the graph was recorded again in most runs instead of replayed "
                "(a buffer of the call at a new address every run?)")
    return None


def direct_failure(counts: ExecuteCounts, runs: int, sites: int = 1) -> str | None:
    """Why ``counts`` do not show a call run op by op in every run (command buffers off); None when they do."""
    if counts.captured or counts.calls != sites * runs:
        return f"{counts} in {runs} runs: expected {sites * runs} runs, none inside a capture"
    return None


def assert_captured(counts: ExecuteCounts, runs: int, sites: int = 1) -> None:
    why = capture_failure(counts, runs, sites)
    assert why is None, why


def assert_direct(counts: ExecuteCounts, runs: int, sites: int = 1) -> None:
    why = direct_failure(counts, runs, sites)
    assert why is None, why


def assert_counts(counts: ExecuteCounts, runs: int, command_buffer: str, sites: int = 1) -> None:
    """Captured and replayed when ``command_buffer`` (the jit's xla_gpu_enable_command_buffer)
    enables any capture, run op by op every time when it is ""."""
    (assert_captured if command_buffer else assert_direct)(counts, runs, sites)


def counting_module(target: str, modules=None):
    """The loaded extension module whose handler of ``target`` is counted. Raises AssertionError
    (a test failure, with the reason) when no module has the target, when the build predates the
    counters, or when the target's handler is not counted (no GPUEXT_COUNT_EXECUTE)."""
    if modules is None:
        modules = [sys.modules[name] for name in MODULES if name in sys.modules]
    for mod in modules:
        if target not in mod.registrations():
            continue
        assert hasattr(mod, "execute_stats"), (
            f"{mod.__name__} has {target} but no execute_stats(): the installed build predates the "
            "capture counters (ffi/common/execute_stats.h); rebuild the wheel")
        assert target in mod.execute_stats(), (
            f"{mod.__name__}'s handler of {target} is not counted: only a kCmdBufferCompatible handler with "
            f"GPUEXT_COUNT_EXECUTE is; counted here: {sorted(mod.execute_stats())}")
        return mod
    raise AssertionError(f"no loaded extension module registers {target} "
                         f"(loaded: {[m.__name__ for m in modules]})")


@contextlib.contextmanager
def counting(target: str, modules=None):
    """Counts ``target``'s handler runs inside the block; the yielded ExecuteCounts is filled when
    the block ends. Turns counting on for the block only, and resets the module's counts first."""
    mod = counting_module(target, modules)
    counts = ExecuteCounts(target)
    mod.reset_execute_stats()
    was_on = mod.set_execute_stats_enabled(True)
    try:
        yield counts
    finally:
        stats = mod.execute_stats()[target]
        mod.set_execute_stats_enabled(was_on)
        counts.calls, counts.captured = int(stats["calls"]), int(stats["captured"])


def run_counted(f, args, target: str, runs: int = RUNS, check=None, modules=None) -> ExecuteCounts:
    """Runs ``f(*args)`` ``runs`` times under ``counting(target)``; ``check(result)`` (optional)
    sees each result. Each result is released before the next run, so XLA can hand the next run
    the same output buffer and replay its graph rather than record it again."""
    import jax

    with counting(target, modules) as counts:
        for _ in range(runs):
            out = jax.block_until_ready(f(*args))
            if check is not None:
                check(out)
            del out
    return counts
