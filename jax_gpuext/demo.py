"""The main job, ``python -m jax_gpuext demo``: capabilities, then every op we have, with
explain's verdict for each, on whatever devices are present."""

from __future__ import annotations

import time


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)))


def run() -> int:
    from jax_gpuext.common.capabilities import capabilities, format_table

    _section("capabilities")
    print(format_table(capabilities()))
    failures = 0
    for title, step in _steps():
        _section(title)
        t0 = time.perf_counter()
        try:
            step()
            print(f"ok ({time.perf_counter() - t0:.2f} s)")
        except Exception as e:  # noqa: BLE001 - report every step, then fail at the end
            failures += 1
            print(f"FAILED: {type(e).__name__}: {e}")
    _section("summary")
    print("all demo steps passed" if not failures else f"{failures} demo step(s) failed")
    return 1 if failures else 0


def _steps():
    """(title, callable) for each op family; families add theirs in demo_steps()."""
    steps = []
    for module in _FAMILY_MODULES:
        try:
            mod = __import__(module, fromlist=["demo_steps"])
        except ImportError:
            continue
        steps += mod.demo_steps()
    return steps


# Op families that contribute demo steps (each module defines demo_steps()).
_FAMILY_MODULES = [
    "jax_gpuext.formats",
    "jax_gpuext.memory",
    "jax_gpuext.dot",
    "jax_gpuext.collectives",
]
