"""Choosing among several implementations of one op, visibly.

Each op registers its backends in preference order. ``select`` runs at trace time and
returns the chosen backend plus, for every other one, why it was not taken. Nothing falls
back silently: when ``backend="auto"`` skips a backend that targets the current platform,
the fallback is logged once on logger ``jax_gpuext`` and every selection is recorded for
``jax_gpuext.explain``. Naming a backend that cannot run raises UnsupportedError.

``JAX_GPUEXT_FORCE_REFERENCE=op1,op2`` (or ``all``) forces the ``reference`` backend of the
named ops, for bisecting a wrong result down to one of our kernels.

Safe defaults (``jax_gpuext.common.verified``): on CUDA, ``auto`` passes over a GPU backend (one in
``verified.BACKENDS``) that is not verified for this problem's feature (``Backend.feature``) on this
GPU's architecture at this build's source fingerprint: a visible choice, logged once. Among the
backends that remain, for the ops ``verified.SPEED_OPS``, it runs the one the committed benchmarks
measured fastest for this format pairing and size class, never one measured slower than the xla
path (``verified.rank``; ``explain`` shows the numbers). Naming a backend runs it (one warning per
process); ``JAX_GPUEXT_ALLOW_UNVERIFIED=1`` turns the record off for ``auto``: the first backend that
runs, in preference order.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from typing import Any, Callable

from jax_gpuext.common import env, gates
from jax_gpuext.common.errors import UnsupportedError

logger = logging.getLogger("jax_gpuext")

FORCE_REFERENCE_ENV = "JAX_GPUEXT_FORCE_REFERENCE"
REFERENCE = "reference"
PASSED_OVER = "passed over"  # prefix of a rejection by a backend's `prefers`: a choice, not a fallback
PLATFORMS = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Backend:
    """One implementation of an op.

    ``supports(problem)`` checks what the gates cannot know: shapes, dtypes, formats of this
    call. It returns a GateResult; None means every problem is supported. ``takes`` says the
    same in words for the generated "which backend will I get" tables (docs/gates.md).
    ``prefers(problem)``, consulted by ``auto`` only, passes over a backend that *could* run the
    problem but should not (all_reduce's one_shot above its size crossover): a choice, not a
    fallback, so it is neither logged as one nor flagged by explain.
    Which backends run GPU code that must be verified is one table, ``verified.BACKENDS``.
    ``feature(problem)`` names what of the backend a problem runs (cuBLASLt: "fp8_blockwise",
    "per_tensor", "per_tensor_batched", ...), the name the GPU tests give in
    ``@pytest.mark.verifies(component, feature=...)``: ``auto`` needs that feature verified, so a
    failure in one feature leaves the others on; it returns None for a problem the backend does
    not take (``supports`` then says why). No ``feature``: the whole component must be verified.
    It must be cheap and never probe a GPU: it is asked before ``supports``.
    """

    name: str
    platforms: tuple[str, ...]
    gates: tuple[str, ...] = ()
    description: str = ""
    supports: Callable[[Any], gates.GateResult] | None = None
    takes: str = "every problem"
    prefers: Callable[[Any], gates.GateResult] | None = None
    feature: Callable[[Any], str] | None = None


@dataclasses.dataclass
class Selection:
    op: str
    requested: str
    platform: str
    chosen: str
    reason: str
    rejected: list[tuple[str, str]]
    fallback: bool
    notes: list[str] = dataclasses.field(default_factory=list)
    # what auto chose by where it ranked by measured speed (verified.rank): one dict per backend
    speeds: list[dict] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_BACKENDS: dict[str, list[Backend]] = {}
_log: contextvars.ContextVar[list | None] = contextvars.ContextVar("jax_gpuext_explain_log", default=None)
_platform_override: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jax_gpuext_platform", default=None)
_warned: set[tuple] = set()
# Selections made while tracing another platform's branch of an op (common/export.py, per_platform)
# are neither logged nor recorded for explain: this host runs its own choices.
_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("jax_gpuext_quiet", default=False)


def register(op: str, backend: Backend) -> None:
    """Adds ``backend`` to ``op``; earlier registrations are preferred by ``auto``."""
    existing = _BACKENDS.setdefault(op, [])
    if any(b.name == backend.name for b in existing):
        raise ValueError(f"backend {backend.name!r} already registered for op {op!r}")
    existing.append(backend)


def backends(op: str) -> list[Backend]:
    return list(_BACKENDS[op])


def ops() -> list[str]:
    return sorted(_BACKENDS)


def current_platform() -> str:
    """The platform being traced for: explain's override, else JAX's default backend."""
    override = _platform_override.get()
    if override is not None:
        return override
    import jax

    p = jax.default_backend()
    return "cuda" if p == "gpu" else p


def platform_pinned() -> bool:
    """Is the platform traced for set explicitly (``platform``, ``explain``'s override, an op's
    per-platform branch, ``export.lowering_for``)? Then ops trace for it alone."""
    return _platform_override.get() is not None


@contextlib.contextmanager
def quiet():
    """Selections inside the block are not logged or recorded (another platform's branch)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)


@contextlib.contextmanager
def platform(name: str):
    """Selects backends as if tracing for ``name`` ("cpu" or "cuda")."""
    if name not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, got {name!r}")
    token = _platform_override.set(name)
    try:
        yield
    finally:
        _platform_override.reset(token)


def forced_reference(op: str) -> bool:
    names = set(env.get(FORCE_REFERENCE_ENV))
    unknown = sorted(names - set(ops()) - {"all"})
    if unknown:  # a misspelt op would otherwise be forced silently not at all
        raise env.EnvironmentVariableError(FORCE_REFERENCE_ENV, env.raw(FORCE_REFERENCE_ENV),
                                           f"'all' or op names among {sorted(ops())}; unknown: {unknown}")
    return "all" in names or op in names


def _why_not_here(b: Backend, platform_name: str) -> str | None:
    """Platform and gates: what holds for every problem."""
    if platform_name not in b.platforms:
        return f"runs on {'/'.join(b.platforms)}, not {platform_name}"
    for g in b.gates:
        r = gates.check(g)
        if not r.supported:
            return f"gate {g}: {r.reason}"
    return None


def _why_not(b: Backend, platform_name: str, problem) -> str | None:
    why = _why_not_here(b, platform_name)
    if why is not None:
        return why
    if b.supports is not None:
        r = b.supports(problem)
        if not r.supported:
            return r.reason
    return None


def feature_of(b: Backend, problem) -> str | None:
    """The feature of ``problem`` that backend ``b`` runs (None: the backend names none)."""
    return None if b.feature is None or problem is None else b.feature(problem)


def unverified(op: str, b: Backend, platform_name: str, problem=None) -> str | None:
    """Why backend ``b`` of ``op`` is not verified here for ``problem``'s feature (None: verified,
    or XLA's own code).

    Only on a CUDA device: the record is per architecture. Lowering for cuda ahead of time on a
    host without one is left to the backends' own gates (most need ``cuda_device``)."""
    from jax_gpuext.common import verified

    if platform_name != "cuda" or verified.architecture() is None:
        return None
    components = verified.components(op, b.name)
    if not components:
        return None
    feature = feature_of(b, problem)
    if b.feature is not None and problem is not None and feature is None:
        return f"backend {b.name!r} names no feature for this problem: nothing verifies it"
    r = verified.check_all(components, feature)
    return None if r.supported else r.reason


def _not_its_problem(b: Backend, platform_name: str, problem) -> str | None:
    """For a backend whose ``feature`` names none for this problem (not one it takes): why not, from
    ``supports``, rather than "not verified"."""
    if b.feature is None or problem is None or b.feature(problem) is not None:
        return None
    return _why_not(b, platform_name, problem)


def _warn_once(key: tuple, message: str, *args) -> None:
    if _quiet.get():
        return
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def check_requested(op: str, requested, caller: str | None = None) -> None:
    """Raises ValueError unless ``requested`` is 'auto' or a backend name of ``op``; public ops
    that select later (after quantizing) call it first, so a bad name fails before any work."""
    if op not in _BACKENDS:
        raise KeyError(f"no backends registered for op {op!r}")
    names = [b.name for b in _BACKENDS[op]]
    if not isinstance(requested, str) or (requested != "auto" and requested not in names):
        raise ValueError(f"{caller or op}: backend must be 'auto' or one of {names}, got {requested!r}")


def select(op: str, requested: str = "auto", *, problem=None) -> Selection:
    """Picks the backend of ``op`` for this call and records the decision."""
    check_requested(op, requested)
    candidates = _BACKENDS[op]
    names = [b.name for b in candidates]
    platform_name = current_platform()

    if forced_reference(op):
        if REFERENCE not in names:
            raise ValueError(f"{FORCE_REFERENCE_ENV} names {op!r}, which has no reference backend")
        rejected = [(n, f"{FORCE_REFERENCE_ENV} forces the reference path") for n in names if n != REFERENCE]
        sel = Selection(op, requested, platform_name, REFERENCE, f"forced by {FORCE_REFERENCE_ENV}",
                        rejected, fallback=requested != REFERENCE)
        return _record(sel)

    if requested != "auto":
        b = candidates[names.index(requested)]
        why = _why_not(b, platform_name, problem)
        if why is not None:
            raise UnsupportedError(f"{op}: backend {requested!r} cannot run here", reason=why)
        rejected = [(n, "not requested") for n in names if n != requested]
        sel = Selection(op, requested, platform_name, requested, "requested by name", rejected, False)
        unv = unverified(op, b, platform_name, problem)
        if unv is not None:  # named: it runs, and says once that it has not passed on this GPU
            sel.notes.append(f"runs unverified (requested by name): {unv}")
            _warn_once(("named", op, requested), "%s: backend %r runs because it was named, but it is %s",
                       op, requested, unv)
        return _record(sel)

    from jax_gpuext.common import verified

    if platform_name == "cuda" and op in verified.SPEED_OPS and not verified.allow_unverified() \
            and verified.architecture() is not None:
        ranked = _select_ranked(op, requested, platform_name, candidates, problem)
        if ranked is not None:
            return _record(ranked)

    rejected, skipped_same_platform, unverified_names, allowed = [], False, [], {}
    for b in candidates:
        why = _why_not_here(b, platform_name)
        why = why if why is not None else _not_its_problem(b, platform_name, problem)
        unv = unverified(op, b, platform_name, problem) if why is None else None
        if unv is not None and not verified.allow_unverified():
            # Checked before `supports`: a backend auto will not take needs no trace-time probing.
            rejected.append((b.name, f"{PASSED_OVER}: {unv}"))
            unverified_names.append(b.name)
            _warn_once(("unverified", op, b.name, unv), "%s: auto passes over backend %r: %s (%s=1 lets auto "
                       "take it; naming the backend runs it)", op, b.name, unv, verified.ALLOW_ENV)
            continue
        if why is None:
            why = _why_not(b, platform_name, problem)
        if why is None and unv is not None:
            allowed[b.name] = f"runs unverified ({verified.ALLOW_ENV}=1): {unv}"
        if why is None and b.prefers is not None:
            pref = b.prefers(problem)
            if not pref.supported:  # it could run, but another backend is the better choice
                rejected.append((b.name, f"{PASSED_OVER}: {pref.reason}"))
                continue
        if why is None:
            reason = b.description or "first supported backend"
            sel = Selection(op, requested, platform_name, b.name, reason, rejected, skipped_same_platform,
                            [allowed[b.name]] if b.name in allowed else [])
            # backends after the chosen one were not needed; say so for explain's table
            sel.rejected += [(o.name, "lower preference") for o in candidates[names.index(b.name) + 1:]]
            return _record(sel)
        rejected.append((b.name, why))
        skipped_same_platform |= platform_name in b.platforms
    passed = [b for b in candidates if any(n == b.name and w.startswith(PASSED_OVER) for n, w in rejected)]
    for b in passed:  # nothing else runs: a backend that was only passed over is still better than none
        if b.name in unverified_names and _why_not(b, platform_name, problem) is not None:
            continue  # passed over before its `supports` was asked; it cannot run this problem either
        rest = [(n, w) for n, w in rejected if n != b.name]
        return _record(Selection(op, requested, platform_name, b.name, "the only backend that runs", rest,
                                 skipped_same_platform))
    detail = "; ".join(f"{n}: {w}" for n, w in rejected)
    raise UnsupportedError(f"{op}: no backend can run on {platform_name}", reason=detail)


def _select_ranked(op: str, requested: str, platform_name: str, candidates: list[Backend], problem):
    """``auto`` on a CUDA device for an op the record ranks by speed: every backend is asked (gates,
    verified feature, ``supports``, ``prefers``) and ``verified.rank`` picks among those that can
    run. None where it does not rank this problem (select then takes the first that runs)."""
    from jax_gpuext.common import verified

    rejected, runnable, skipped_before = [], [], {}
    for b in candidates:
        why = _why_not_here(b, platform_name)
        why = why if why is not None else _not_its_problem(b, platform_name, problem)
        unv = unverified(op, b, platform_name, problem) if why is None else None
        if unv is not None:  # checked before `supports`: no trace-time probing for what auto will not take
            rejected.append((b.name, f"{PASSED_OVER}: {unv}"))
            _warn_once(("unverified", op, b.name, unv), "%s: auto passes over backend %r: %s (%s=1 lets auto "
                       "take it; naming the backend runs it)", op, b.name, unv, verified.ALLOW_ENV)
            continue
        if why is None:
            why = _why_not(b, platform_name, problem)
        if why is None and b.prefers is not None:
            pref = b.prefers(problem)
            if not pref.supported:
                rejected.append((b.name, f"{PASSED_OVER}: {pref.reason}"))
                continue
        if why is None:
            runnable.append(b)
            continue
        rejected.append((b.name, why))
        skipped_before[b.name] = platform_name in b.platforms
    if not runnable:
        return None  # select's own loop says why, and runs what was only passed over
    ours = {b.name for b in runnable if verified.components(op, b.name)}
    ranking = verified.rank(op, problem, [b.name for b in runnable], ours)
    if ranking is None:  # not ranked: preference order among those that run
        first = runnable[0]
        ranking = verified.Ranking(first.name, first.description or "first supported backend",
                                   {b.name: "lower preference" for b in runnable[1:]})
    order = [b.name for b in candidates]
    chosen = ranking.chosen
    rejected += [(n, w if w == "lower preference" else f"{PASSED_OVER}: {w}") for n, w in ranking.passed_over.items()]
    rejected.sort(key=lambda r: order.index(r[0]))
    # a fallback, as in the unranked path: a backend before the chosen one on this platform was
    # refused for a reason other than a choice (a closed gate, a problem it does not take)
    fallback = any(skipped_before.get(n, False) for n in order[:order.index(chosen)])
    sel = Selection(op, requested, platform_name, chosen, ranking.reason, rejected, fallback,
                    speeds=ranking.speeds)
    for c in verified.components(op, chosen):
        sel.notes += verified.caveats(c)
    return sel


def _record(sel: Selection) -> Selection:
    if _quiet.get():
        return sel
    log = _log.get()
    if log is not None:
        log.append(sel)
    if sel.fallback:
        key = (sel.op, sel.chosen, tuple(sel.rejected))
        if key not in _warned:
            _warned.add(key)
            why = "; ".join(f"{n}: {w}" for n, w in sel.rejected
                            if w != "lower preference" and not w.startswith(PASSED_OVER))
            logger.warning("%s falls back to backend %r on %s (%s)", sel.op, sel.chosen, sel.platform, why)
    else:
        logger.debug("%s uses backend %r on %s", sel.op, sel.chosen, sel.platform)
    return sel


def note(selection: Selection, message: str) -> None:
    """Attaches a remark (e.g. "global scale applied by a separate multiply") to a decision."""
    selection.notes.append(message)
    if not _quiet.get():
        logger.info("%s: %s", selection.op, message)


@contextlib.contextmanager
def recording():
    """Collects every Selection made while tracing inside the block."""
    log: list[Selection] = []
    token = _log.set(log)
    try:
        yield log
    finally:
        _log.reset(token)
