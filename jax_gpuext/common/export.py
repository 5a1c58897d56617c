"""``export_disabled_checks()``: what ``jax.export.export`` needs to take functions that use our ops.

jax.export refuses custom calls outside jax's own allow-list, whose targets jax guarantees to keep
working in later versions; ours carry no such guarantee from jax, so each must be named in
``disabled_checks``. The other half, running a deserialized export, needs nothing but
``import jax_gpuext``: it registers every FFI target (docs/design.md, "jax.export").
"""

from __future__ import annotations

import contextlib
import functools

from jax import export as _export

from jax_gpuext.common import extension as _ext


def export_disabled_checks() -> list:
    """The ``disabled_checks`` that let ``jax.export.export`` take our custom calls.

    One ``jax.export.DisabledSafetyCheck.custom_call(target)`` for every FFI target any of our ops
    may emit, on any platform (the table the op modules declare)::

        exp = jax.export.export(jax.jit(f), disabled_checks=jax_gpuext.export_disabled_checks())(x)

    Disabling the check is our promise in jax's place: a serialized export runs in any process
    that imports the same jax-gpuext version (import registers the handlers); across jax-gpuext
    versions the handlers' operands and attributes may change, so re-export after upgrading.
    """
    return [_export.DisabledSafetyCheck.custom_call(t) for t in sorted(_ext.TARGETS)]


# --------------------------------------------------------------------------- lowering for another platform
# Backends are chosen while tracing, for the platform being traced for (backends.current_platform:
# JAX's default backend, or the backends.platform override). jax.export traces once and lowers for
# the platforms it is given, so exporting for ("cuda",) from a CPU host used to embed the CPU's
# choices (the reference dot, the CPU handlers' attributes) in a CUDA module (issue 34). An op
# marks its result with the choice it made (``mark_choice``); lowering checks it against each
# platform lowered for: where that platform's own choice would be the same backend the result
# lowers as traced, else the lowering refuses with what to do.


class _Choice:
    """A selection as a primitive parameter: hashable, and printed short in jaxprs."""

    def __init__(self, sel, problem):
        self.op, self.requested, self.chosen, self.platform = sel.op, sel.requested, sel.chosen, sel.platform
        self.problem = problem

    def _key(self):
        return (self.op, self.requested, self.chosen, self.platform, self.problem)

    def __eq__(self, other):
        return isinstance(other, _Choice) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"{self.platform}:{self.chosen}"


def _lowered_platform(name: str) -> str:
    return "cuda" if name in ("cuda", "gpu") else name


def _platforms() -> tuple[str, ...]:
    from jax_gpuext.common import backends

    return backends.PLATFORMS


def _choice_for(choice: _Choice, platform: str):
    """(backend, None) that ``choice``'s op would run for ``platform``, or (None, why not)."""
    from jax_gpuext.common import backends
    from jax_gpuext.common.errors import UnsupportedError

    try:
        with backends.platform(platform), backends.recording():
            return backends.select(choice.op, choice.requested, problem=choice.problem).chosen, None
    except (UnsupportedError, ValueError) as e:
        return None, str(e)


def _check_lowering(choice: _Choice, platforms) -> None:
    for name in platforms:
        platform = _lowered_platform(name)
        if platform == choice.platform or platform not in _platforms():
            continue  # traced for it; or a platform none of our backends targets (no choice to compare)
        other, why = _choice_for(choice, platform)
        if other == choice.chosen:
            continue  # the same backend: what was traced is what this platform runs
        there = f"runs backend {other!r}" if other is not None else f"cannot run ({why})"
        raise ValueError(
            f"{choice.op}: backend {choice.chosen!r} was chosen while tracing for {choice.platform}, but this "
            f"lowering is for {platform}, where {choice.op} {there}. jax.export traces once for every platform "
            f"it lowers for and jax_gpuext chooses backends while tracing: export for one platform at a time, "
            f"traced for it: `with jax_gpuext.common.export.lowering_for({platform!r}): "
            f"jax.export.export(jax.jit(f), platforms=({platform!r},), "
            f"disabled_checks=jax_gpuext.export_disabled_checks())(...)`")


@contextlib.contextmanager
def lowering_for(platform: str):
    """Traces for ``platform`` ("cpu" or "cuda") inside the block: what to export for another
    platform than this host's, e.g. for CUDA from a CPU machine::

        with jax_gpuext.common.export.lowering_for("cuda"):
            exp = jax.export.export(jax.jit(f), platforms=("cuda",),
                                    disabled_checks=jax_gpuext.export_disabled_checks())(x)

    JAX's trace caches are cleared on entry and on exit: a function traced before for this host
    would otherwise be reused with this host's choices (which the lowering then refuses), and
    one traced inside would be reused afterwards with ``platform``'s."""
    import jax

    from jax_gpuext.common import backends

    jax.clear_caches()
    try:
        with backends.platform(platform):
            yield
    finally:
        jax.clear_caches()


@functools.cache
def _primitive():
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    # No "gpuext_" in the name: jaxprs of the XLA-only paths are checked to hold no custom call of ours.
    p = Primitive("backend_choice")
    p.def_impl(lambda x, *, choice: x)
    p.def_abstract_eval(lambda x, *, choice: x)

    def lower(ctx, x, *, choice):
        # ctx.platforms narrows module_context.platforms inside a multi-platform lowering.
        _check_lowering(choice, getattr(ctx, "platforms", None) or ctx.module_context.platforms)
        return [x]

    mlir.register_lowering(p, lower)
    batching.primitive_batchers[p] = lambda args, dims, *, choice: (p.bind(args[0], choice=choice), dims[0])
    ad.primitive_jvps[p] = lambda primals, tangents, *, choice: (p.bind(primals[0], choice=choice), tangents[0])
    return p


def mark_choice(out, selection, problem):
    """``out`` (an op's result array), marked with the backend ``selection`` chose for ``problem``
    (hashable), so that lowering it for another platform than the one traced for runs that
    platform's choice or refuses (above). Free at run time: it lowers to nothing."""
    return _primitive().bind(out, choice=_Choice(selection, problem))
