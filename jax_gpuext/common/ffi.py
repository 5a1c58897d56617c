"""Thin wrapper over ``jax.ffi.ffi_call`` that makes sure our targets are registered first."""

from __future__ import annotations

import jax

from jax_gpuext.common import extension as _ext


def ffi_call(target: str, result_shape_dtypes, *args, vmap_method: str = "sequential", **attributes):
    """Calls our FFI target ``target`` (registered for every platform we built).

    Registration is lazy (first trace) and idempotent. Attributes must be numpy scalars /
    Python scalars / strings as jax.ffi expects; the caller validates them first.
    """
    _ext.ensure_all_registered()
    return jax.ffi.ffi_call(target, result_shape_dtypes, vmap_method=vmap_method)(*args, **attributes)
