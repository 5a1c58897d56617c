"""The example budget of each fuzz area and the tally behind the summary line.

CI default: a small, derandomized budget (a fixed seed: the same cases every run).
``JAX_GPUEXT_FUZZ=long`` runs a long campaign: 50x the examples, a fresh random seed (printed in
the summary; ``JAX_GPUEXT_FUZZ_SEED=S`` replays one) and shrinking to a minimal failing case.
``JAX_GPUEXT_FUZZ_EXAMPLES=N`` sets every area's example count, in either mode.
``JAX_GPUEXT_FUZZ_KEEP_GOING=FILE`` surveys instead of stopping at an area's first failure: each
failing case is appended to FILE and counted as "FAILED" in the summary.
"""

from __future__ import annotations

import collections
import contextlib
import random

import hypothesis
from hypothesis import HealthCheck, Phase

from jax_gpuext.common import env

LONG = env.get("JAX_GPUEXT_FUZZ") == "long"
FIXED_EXAMPLES = env.get("JAX_GPUEXT_FUZZ_EXAMPLES")
_SEED = env.get("JAX_GPUEXT_FUZZ_SEED")
SEED = (random.SystemRandom().randrange(1 << 32) if _SEED is None else _SEED) if LONG else 0
KEEP_GOING = env.get("JAX_GPUEXT_FUZZ_KEEP_GOING")
TALLY: collections.Counter = collections.Counter()  # (area, outcome) -> cases
AREAS: list[str] = []


def fuzz(area: str, ci_examples: int):
    """Decorates a hypothesis test of ``area`` with its budget: ``ci_examples`` cases in CI."""
    AREAS.append(area)
    n = FIXED_EXAMPLES if FIXED_EXAMPLES is not None else ci_examples * (50 if LONG else 1)
    # CI does not shrink: a crash restarts the worker (seconds) for every shrink step, and the
    # failing case is printed as drawn. A long campaign shrinks to a minimal reproduction.
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if LONG else ())
    config = hypothesis.settings(max_examples=n, deadline=None, derandomize=not LONG, database=None,
                                 phases=phases, suppress_health_check=list(HealthCheck))

    def decorate(test):
        test = config(test)
        return hypothesis.seed(SEED)(test) if LONG else test
    return decorate


def record(area: str, outcome: str) -> None:
    TALLY[area, outcome] += 1


@contextlib.contextmanager
def judged(area: str):
    """Around a test body: a failure fails the test, or is logged under JAX_GPUEXT_FUZZ_KEEP_GOING."""
    try:
        yield
    except AssertionError as e:
        if not KEEP_GOING:
            raise
        record(area, "FAILED")
        with open(KEEP_GOING, "a") as log:
            log.write(f"=== {area}\n{e}\n")


def summary() -> str | None:
    parts = []
    for area in AREAS:
        counts = {o: n for (a, o), n in sorted(TALLY.items()) if a == area}
        if counts:
            detail = ", ".join(f"{n} {o}" for o, n in counts.items())
            parts.append(f"{area} {sum(counts.values())} ({detail})")
    if not parts:
        return None
    mode = f"long campaign, seed {SEED}" if LONG else "CI budget, derandomized"
    return f"fuzz summary [{mode}]: " + "; ".join(parts)
