"""Exceptions raised by jax_gpuext."""

from __future__ import annotations


class UnsupportedError(RuntimeError):
    """An operation was asked for on a backend or platform whose gate is closed.

    ``gate`` names the entry of :data:`jax_gpuext.gates.GATES` that said no and ``reason``
    is its explanation, so callers can report or branch on it.
    """

    def __init__(self, message: str, *, gate: str | None = None, reason: str | None = None):
        super().__init__(message if reason is None else f"{message}: {reason}")
        self.gate = gate
        self.reason = reason


def require_bool(value, where: str, name: str) -> bool:
    """``value`` as a bool, or TypeError: a flag such as ``strict`` given "no" or 0.5 must not
    quietly count as True."""
    import numpy as np

    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: {name} must be a bool, got {value!r}")
    return bool(value)
