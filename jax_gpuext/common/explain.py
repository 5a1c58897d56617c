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
            lines += _speed_lines(c.speeds)
        return "\n".join(lines)

    __repr__ = __str__

    def table(self) -> str:
        """One compact table: a row per distinct (op, backend, reason), with how many calls it
        covers. For progress output (the demo prints one per step); ``str()`` is the full form."""
        if not self.calls:
            return f"({self.platform}: no jax_gpuext calls)"
        rows: dict[tuple, int] = {}
        for c in self.calls:
            key = (c.op, c.chosen, _short_reason(c))
            rows[key] = rows.get(key, 0) + 1
        head = ("op", "backend", "calls", f"why ({self.platform})")
        body = [(op, chosen, str(n), why) for (op, chosen, why), n in rows.items()]
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(3)]
        return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in [head, *body])


def _short_reason(c: backends.Selection, limit: int = 60) -> str:
    """A few words on why ``c.chosen`` runs: the speed it was chosen by, a fallback's cause, or the
    first clause of the backend's description."""
    if c.fallback:
        causes = [w for n, w in c.rejected if w != "lower preference" and not w.startswith(backends.PASSED_OVER)]
        why = "FALLBACK: " + (causes[0] if causes else c.reason)
    elif c.requested != "auto":
        why = "requested by name"
    else:
        chosen = [s for s in getattr(c, "speeds", None) or [] if s.get("chosen")]
        if chosen:
            s = chosen[0]
            why = f"fastest measured: {s['value']:,.0f} {s['unit']}" + (
                f" ({s['vs_bf16']:.2f}x bf16)" if s.get("vs_bf16") else "")
        else:
            why = c.reason.split(";")[0].split(". ")[0]
    if c.notes and not c.fallback:
        why += f" [+{len(c.notes)} note{'s' if len(c.notes) > 1 else ''}]"
    return why if len(why) <= limit else why[:limit - 3].rstrip() + "..."


def _speed_lines(speeds: list[dict]) -> list[str]:
    """The numbers auto chose by (``Selection.speeds``, from the committed GPU results)."""
    if not speeds:
        return []
    width = max(len(s["backend"]) for s in speeds)
    lines = [f"      measured (size class 2^{speeds[0]['size_class']}):"]
    for s in speeds:
        value = f"{s['value']:,.0f} {s['unit']}"
        if s.get("time_us"):
            value = f"{s['time_us']:,.0f} us ({value})"
        ratio = f" ({s['vs_bf16']:.2f}x bf16)" if s.get("vs_bf16") else ""
        shapes = ", ".join(_shape(x) for x in s["shapes"])
        lines.append(f"        {s['backend']:<{width}}  {value}{ratio} at {shapes}" + ("  <- chosen" if s["chosen"] else ""))
    lines.append(f"        from {', '.join(sorted({r for s in speeds for r in s['results']}))}")
    return lines


def _shape(shape) -> str:
    shape = [x for x in shape if x is not None]
    return f"{shape[0]}^3" if len(shape) == 3 and len(set(shape)) == 1 else "x".join(map(str, shape))


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
