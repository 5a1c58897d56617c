"""``export_disabled_checks()``: what ``jax.export.export`` needs to take functions that use our ops.

jax.export refuses custom calls outside jax's own allow-list, whose targets jax guarantees to keep
working in later versions; ours carry no such guarantee from jax, so each must be named in
``disabled_checks``. The other half, running a deserialized export, needs nothing but
``import jax_gpuext``: it registers every FFI target (docs/design.md, "jax.export").
"""

from __future__ import annotations

import contextlib
import json
import contextvars
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


# --------------------------------------------------------------------------- our arrays in an export's signature
def register_array_serialization(cls, name: str, formats: dict) -> None:
    """Lets ``Exported.serialize`` keep ``cls`` (a quantized-array pytree class whose aux data is
    (format, int, ...)) in an export's signature: a function taking or returning quantized arrays
    then serializes, and deserializes in any process that imports jax_gpuext. The format goes by
    name (its ``FORMATS`` entry: formats are values, a rebuilt one must equal it); an unknown name or
    version is a clear error rather than a wrong array."""
    def serialize(aux) -> bytes:
        fmt, *ints = aux
        if formats.get(getattr(fmt, "name", None)) != fmt:
            raise ValueError(f"{name}: cannot serialize an array of format {fmt!r}: not one of jax_gpuext's formats "
                             f"({sorted(formats)})")
        return json.dumps({"version": 1, "format": fmt.name, "ints": [int(v) for v in ints]}).encode()

    def deserialize(data: bytes):
        aux = json.loads(bytes(data).decode())
        if aux.get("version") != 1 or aux.get("format") not in formats:
            raise ValueError(f"{name}: cannot read {aux!r}: written by another jax_gpuext version (version "
                             f"{aux.get('version')!r}, format {aux.get('format')!r}; known formats {sorted(formats)})")
        return (formats[aux["format"]], *aux["ints"])

    def register():
        _export.register_pytree_node_serialization(cls, serialized_name=name, serialize_auxdata=serialize,
                                                   deserialize_auxdata=deserialize)

    try:
        register()
    except ValueError as e:
        # The module ran again (importlib.reload, an autoreloading notebook, a test that imports
        # each module afresh): jax refuses a second registration of the name and would keep the
        # old class, so the new class's arrays could not be serialized. The old class's entries are
        # taken out of jax's two registries (not public: where they are not found, the old
        # registration stays) and the new class registered. Another class taking our name is a
        # real conflict.
        if f"{cls.__module__}.{cls.__qualname__}" not in str(e):
            raise
        try:
            from jax._src.export import _export as registries
            by_type, by_name = registries.serialization_registry, registries.deserialization_registry
        except (ImportError, AttributeError):
            return
        old = by_name.pop(name, (None,))[0]
        by_type.pop(old, None)
        register()


# --------------------------------------------------------------------------- lowering for another platform
# Backends are chosen while tracing. jax.export traces once and lowers for the platforms it is
# given, and ``jit(f).trace(x).lower(lowering_platforms=...)`` lowers for any platform; a CPU host
# choosing for itself put the CPU's choices (the reference dot, the CPU handlers' attributes) into
# a CUDA module (issue 34). So an op whose choice differs between platforms traces each platform's
# choice as a branch of ``lax.platform_dependent`` (``per_platform``): lowering keeps only the
# branch of the platform it lowers for, and a multi-platform export keeps one per platform, picked
# at run time. Every result is also marked with the choice it was traced with (``mark_choice``);
# lowering checks the mark against each platform its branch serves, so a platform whose choice
# could not be traced (it cannot run the op) refuses with the reason instead of running another
# platform's code. docs/design.md, "Exporting for another platform".
_serving: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "jax_gpuext_serving_platforms", default=None)


class _Choice:
    """A selection as a primitive parameter: hashable, and printed short in jaxprs."""

    def __init__(self, sel, problem, serves=None):
        self.op, self.requested, self.chosen, self.platform = sel.op, sel.requested, sel.chosen, sel.platform
        self.problem = problem
        self.serves = serves  # the platforms this branch of a per_platform op is lowered for; None: all

    def _key(self):
        return (self.op, self.requested, self.chosen, self.platform, self.problem, self.serves)

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


def _selection_for(op: str, requested: str, problem, platform: str):
    """(the Selection ``op`` would make for ``platform``, None), or (None, why it cannot run there);
    quiet: not logged, not recorded for explain (this host does not run it)."""
    from jax_gpuext.common import backends
    from jax_gpuext.common.errors import UnsupportedError

    try:
        with backends.platform(platform), backends.quiet():
            return backends.select(op, requested, problem=problem), None
    except (UnsupportedError, ValueError) as e:
        return None, str(e)


def _check_lowering(choice: _Choice, platforms) -> None:
    for name in platforms:
        platform = _lowered_platform(name)
        if platform == choice.platform or platform not in _platforms():
            continue  # traced for it; or a platform none of our backends targets (no choice to compare)
        if choice.serves is not None and platform not in choice.serves:
            continue  # another branch of the op serves this platform (per_platform)
        sel, why = _selection_for(choice.op, choice.requested, choice.problem, platform)
        other = sel.chosen if sel is not None else None
        if other == choice.chosen:
            continue  # the same backend: what was traced is what this platform runs
        there = f"runs backend {other!r}" if other is not None else f"cannot run ({why})"
        raise ValueError(
            f"{choice.op}: backend {choice.chosen!r} was chosen while tracing for {choice.platform}, but this "
            f"lowering is for {platform}, where {choice.op} {there}. Where the named backend runs on one "
            f"platform only, export for that one (`platforms=({choice.platform!r},)`); to trace for "
            f"{platform} alone: `with jax_gpuext.common.export.lowering_for({platform!r}): "
            f"jax.export.export(jax.jit(f), platforms=({platform!r},), "
            f"disabled_checks=jax_gpuext.export_disabled_checks())(...)`")


@contextlib.contextmanager
def lowering_for(platform: str):
    """Traces for ``platform`` ("cpu" or "cuda") alone inside the block: no other platform's
    branch (``per_platform``) is traced, so the module holds that platform's choices only. Not
    needed to export for another platform (``jax.export.export(jax.jit(f), platforms=("cuda",))``
    on a CPU host lowers CUDA's choices); useful to see the choices and errors of one platform::

        with jax_gpuext.common.export.lowering_for("cuda"):
            exp = jax.export.export(jax.jit(f), platforms=("cuda",),
                                    disabled_checks=jax_gpuext.export_disabled_checks())(x)

    JAX's trace caches are cleared on entry and on exit: a function traced before with both
    platforms' branches would otherwise be reused, and one traced inside would be reused afterwards
    with ``platform``'s choices only."""
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
    (hashable), so that lowering it for a platform whose own choice differs refuses (above).
    Free at run time: it lowers to nothing. An eager result (nothing will lower it) is returned as it is."""
    from jax_gpuext.common import eager

    if not eager.traced(out):
        return out
    return _primitive().bind(out, choice=_Choice(selection, problem, _serving.get()))


def per_platform(selection, problem, run, operands, *, specializes: bool = False):
    """``run(selection)``: the op traced with the backend ``selection`` chose for this host and,
    where another platform's trace would differ, that platform's ``run`` as well, joined by
    ``lax.platform_dependent`` so that lowering for a platform keeps its own branch only.

    ``run(sel)`` builds the op's (marked) result with ``sel``'s backend; ``operands`` are the op's
    array inputs. Another platform's trace differs where it chooses another backend, or, with
    ``specializes``, whenever it can run the op (the op's implementations read the platform they
    trace for: XLA:CPU's subnormal workarounds, operand layouts). One trace, as before: for eager
    calls (the operands are concrete), for a pinned platform (``backends.platform``,
    ``lowering_for``, inside a branch), and where no trace would differ. The other platforms'
    selections and traces are quiet (not logged, not in ``explain``: this host runs its own). A
    platform that cannot run the op gets no branch: lowering for it refuses (``mark_choice``)."""
    from jax_gpuext.common import backends, eager
    from jax_gpuext.common.errors import UnsupportedError

    if backends.platform_pinned() or not eager.traced(operands):
        return run(selection)
    others = {}
    for name in backends.PLATFORMS:
        if name == selection.platform:
            continue
        other, _ = _selection_for(selection.op, selection.requested, problem, name)
        # None: it cannot run this op, no branch; the mark refuses lowering for it with the reason
        if other is not None and (specializes or other.chosen != selection.chosen):
            others[name] = other
    if not others:
        return run(selection)
    runs = {name: functools.partial(run, sel) for name, sel in others.items()}
    runs[selection.platform] = functools.partial(run, selection)
    try:
        return by_platform(runs, operands)
    except UnsupportedError:
        # Another platform's branch could not be traced (a nested op it cannot run): this host's
        # choice alone, marked, so that lowering for that platform refuses with the reason.
        return run(selection)


def by_platform(runs: dict, operands):
    """``runs[p]()`` traced for each platform ``p`` (pinned to it: ops inside trace for ``p``
    alone), joined by ``lax.platform_dependent``; this host's run is the default branch (its own
    platform, and those without backends of ours; a host platform without a run of its own takes
    the "cpu" one). Eager or pinned: this platform's run alone. ``operands``: the array inputs
    the runs close over (their shard_map axes type the results)."""
    from jax import lax

    from jax_gpuext.common import backends, eager

    host = backends.current_platform()
    if host not in runs:
        return runs["cpu"]()
    if backends.platform_pinned() or not eager.traced(operands) or set(runs) == {host}:
        return runs[host]()
    axes = _varying_axes(operands)

    def branch(name, serves):
        def trace():
            token = _serving.set(serves)
            try:
                with backends.platform(name), (backends.quiet() if name != host else contextlib.nullcontext()):
                    return _varying_over(runs[name](), axes)
            finally:
                _serving.reset(token)
        return trace

    others = [p for p in runs if p != host]
    host_serves = tuple(p for p in backends.PLATFORMS if p not in others)
    return lax.platform_dependent(**{p: branch(p, (p,)) for p in others}, default=branch(host, host_serves))


def _varying_axes(operands) -> frozenset:
    """The shard_map axes any operand varies over (its ``vma`` type; none outside shard_map)."""
    import jax

    return frozenset().union(*(_vma(a) for a in jax.tree_util.tree_leaves(operands)))


def _vma(x) -> frozenset:
    """The axes ``x`` varies over: ``aval.vma`` (jax 0.7-0.9), ``aval.manual_axis_type.varying`` (0.10+)."""
    import jax

    t = jax.typeof(x)
    v = getattr(t, "vma", None)
    if v is None:
        v = getattr(getattr(t, "manual_axis_type", None), "varying", None)
    return frozenset(v or ())


def _varying_over(tree, axes: frozenset):
    """``tree``'s leaves typed as varying over ``axes`` at least. The branches of a cond must agree
    on their results' types inside shard_map, and an FFI call's result is typed invariant where
    XLA's ops on the same operands are varying: both branches get the operands' axes."""
    import jax
    from jax import lax

    if not axes:
        return tree

    def cast(leaf):
        missing = tuple(sorted(axes - _vma(leaf)))
        if not missing:
            return leaf
        if hasattr(lax, "pcast"):  # jax >= 0.8
            return lax.pcast(leaf, missing, to="varying")
        return lax.pvary(leaf, missing)

    return jax.tree_util.tree_map(cast, tree)
