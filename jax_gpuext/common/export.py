"""``export_disabled_checks()``: what ``jax.export.export`` needs to take functions that use our ops.

jax.export refuses custom calls outside jax's own allow-list, whose targets jax guarantees to keep
working in later versions; ours carry no such guarantee from jax, so each must be named in
``disabled_checks``. The other half, running a deserialized export, needs nothing but
``import jax_gpuext``: it registers every FFI target (docs/design.md, "jax.export").
"""

from __future__ import annotations

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
