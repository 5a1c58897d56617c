"""Eager calls of an op: one compiled executable per problem, as ``jnp`` ops have.

Called outside ``jit``, a backend whose code stages control flow (``lax.fori_loop``, ``lax.map``,
``lax.cond``) compiled again on every call: an eager ``while`` / ``scan`` / ``cond`` is dispatched
as a primitive whose parameters hold jaxprs traced anew each time, and the dispatch cache keys
on those objects, so it never hits (issue 34, finding 4: +0.5-1 MB and 50-180 ms per call,
without bound). ``Cached`` runs such calls through one module-level ``jax.jit`` keyed by the op's
hashable statics (the validated problem, the chosen backend, the platform): a second eager call
of the same shapes reuses the first's executable.

Calls whose operands are tracers (inside ``jit``, ``make_jaxpr``, ``grad``, ``vmap``) run the
implementation directly, as before: the enclosing trace compiles it once, their jaxprs and HLO
keep their shape (no nested call named after the op), and ``explain`` sees every decision.

Backend selection stays outside the cache, on every call: an environment switch such as
``JAX_GPUEXT_FORCE_REFERENCE`` takes effect at the next eager call (the chosen backend is part
of the key). The remarks an implementation attaches to its ``Selection`` while it is traced
(``backends.note``) are replayed onto the selections of later calls that hit the cache.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable

import jax

from jax_gpuext.common import backends

_selection: contextvars.ContextVar[backends.Selection | None] = contextvars.ContextVar(
    "jax_gpuext_eager_selection", default=None)


def traced(*trees) -> bool:
    """Is any leaf of ``trees`` a tracer (the call is inside a JAX transformation)?"""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(trees))


class Cached:
    """``run(statics, selection, *operands)`` with one compilation per ``statics`` and operand
    shapes for eager calls. ``statics`` must be hashable and determine everything ``run`` decides
    at trace time besides the operands' shapes and dtypes (the platform is added here)."""

    def __init__(self, run: Callable[..., Any]):
        self._run = run
        self._notes: dict[Any, list[str]] = {}
        self._jit = jax.jit(self._trace, static_argnums=(0,))

    def _trace(self, key, *operands):
        statics, _platform = key
        sel = _selection.get()
        start = len(sel.notes)
        out = self._run(statics, sel, *operands)
        self._notes[key] = list(sel.notes[start:])
        return out

    def __call__(self, statics, selection: backends.Selection, *operands):
        if traced(operands):
            return self._run(statics, selection, *operands)
        key = (statics, backends.current_platform())
        start = len(selection.notes)
        token = _selection.set(selection)
        try:
            out = self._jit(key, *operands)
        finally:
            _selection.reset(token)
        if len(selection.notes) == start:  # a cache hit: nothing was traced
            selection.notes.extend(self._notes.get(key, ()))
        return out


def primitive_impl(primitive):
    """A ``def_impl`` for one of our primitives: an eager ``bind`` runs one compiled program per
    set of parameters and operand shapes (like a jnp op), not a new ``jax.jit`` of a new lambda per
    call, which compiled again every time (issue 34, finding 4's class). Unhashable parameters
    (none of ours today) fall back to an uncached compile."""

    def impl(*args, **params):
        try:
            key = tuple(sorted(params.items()))
            hash(key)
        except TypeError:
            return jax.jit(lambda *a: primitive.bind(*a, **params))(*args)
        return _bound(primitive, key)(*args)

    return impl


@functools.lru_cache(maxsize=512)
def _bound(primitive, key):
    params = dict(key)
    return jax.jit(lambda *a: primitive.bind(*a, **params))
