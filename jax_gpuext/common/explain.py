"""``explain(fn, *args, **kwargs)``: which backend each of our calls in ``fn`` runs, and why."""

from __future__ import annotations

import dataclasses
import json

from jax_gpuext.common import backends


@dataclasses.dataclass
class Explanation:
    platform: str
    calls: list[backends.Selection]

    def to_dict(self) -> dict:
        return {"platform": self.platform, "calls": [c.to_dict() for c in self.calls]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        if not self.calls:
            return f"explain ({self.platform}): the traced function makes no jax_gpuext calls"
        lines = [f"explain ({self.platform}): {len(self.calls)} jax_gpuext call(s)"]
        for i, c in enumerate(self.calls):
            tag = "  [FALLBACK]" if c.fallback else ""
            lines.append(f"[{i}] {c.op}: backend={c.chosen!r} (requested {c.requested!r}){tag}")
            lines.append(f"      why: {c.reason}")
            for name, why in c.rejected:
                lines.append(f"      not {name}: {why}")
            for n in c.notes:
                lines.append(f"      note: {n}")
        return "\n".join(lines)

    __repr__ = __str__


def explain(fn, *args, platform: str | None = None, **kwargs) -> Explanation:
    """Traces ``fn(*args, **kwargs)`` (nothing runs) and reports every backend decision.

    ``platform`` ("cpu" or "cuda") selects as if tracing for that platform; the default is
    JAX's default backend. JAX's trace caches are cleared first so that functions jitted
    and traced before still report their decisions.
    """
    import jax

    jax.clear_caches()
    with backends.recording() as log:
        if platform is None:
            jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args)
            used = backends.current_platform()
        else:
            with backends.platform(platform):
                jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args)
            used = platform
    return Explanation(used, list(log))
