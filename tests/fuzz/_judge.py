"""What the fuzz suite accepts: a clean refusal (a Python exception of a documented type with a
message) or a result that matches the float64 NumPy model; the same answer from every backend.
Anything else (a crash, an abort, a sanitizer report, a hang, an unclear exception, a backend
that accepts what another refuses, a result that differs from the model) fails the test."""

from __future__ import annotations

import numpy as np

from _budget import record

# ValueError / TypeError from validation at trace time; UnsupportedError (a RuntimeError) when a
# named backend cannot run; XlaRuntimeError (jax.errors.JaxRuntimeError) from a handler's
# returned ffi::Error, which is how a direct FFI caller is refused.
CLEAN = ("ValueError", "TypeError", "UnsupportedError", "XlaRuntimeError", "JaxRuntimeError")


def worker_outcome(area: str, outcome, case: str):
    """The case's value, after failing on a crash or a hang of the worker."""
    if outcome.status in ("crashed", "hung"):
        record(area, outcome.status)
        raise AssertionError(f"[{area}] {outcome.status} on {case}\n{outcome.message}")
    if outcome.status == "raised":
        return ("raised", outcome.exc_type, outcome.message)
    return outcome.value


def check_refusal(area: str, result, case: str, who: str = "") -> None:
    _, exc_type, message = result
    assert exc_type in CLEAN and message.strip(), (
        f"[{area}] {who} refused with an unclear error {exc_type}: {message!r} on {case}; expected one of "
        f"{CLEAN} with a message naming the bad part")


def per_backend(area: str, outcome, case: str) -> dict:
    """{backend: value} when every backend accepted the case; {} when all refused it cleanly and
    alike. Fails when they disagree (the meaning must not depend on the backend)."""
    results = worker_outcome(area, outcome, case)
    if isinstance(results, tuple):  # the case raised before any backend ran
        check_refusal(area, results, case)
        record(area, "refused")
        return {}
    for backend, r in results.items():
        if r[0] == "raised":
            check_refusal(area, r, case, f"backend {backend!r}")
    kinds = {b: (r[0], r[1] if r[0] == "raised" else None) for b, r in results.items()}
    assert len(set(kinds.values())) == 1, (
        f"[{area}] backends disagree on {case}: " +
        "; ".join(f"{b}: {r[0]} {r[1] if r[0] == 'raised' else ''} {r[2] if r[0] == 'raised' else ''}"
                  for b, r in results.items()))
    if next(iter(results.values()))[0] == "raised":
        record(area, "refused")
        return {}
    record(area, "ok")
    return {b: r[1] for b, r in results.items()}


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits(actual, expected_bits, what: str, case: str) -> None:
    a, e = bits(actual).ravel(), np.asarray(expected_bits).ravel()
    assert a.shape == e.shape, f"{what}: {a.size} values, model has {e.size} ({case})"
    bad = np.flatnonzero(a != e)
    assert bad.size == 0, (f"{what}: {bad.size} of {a.size} differ from the float64 model, first at {bad[:4]}: "
                           f"{a[bad[:4]]} vs {e[bad[:4]]} ({case})")


def assert_close(actual, expected, tol, what: str, case: str) -> None:
    """Same NaN positions, same infinities, finite values within ``tol`` (an array or scalar)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape}, model {e.shape} ({case})"
    assert (np.isnan(a) == np.isnan(e)).all(), f"{what}: NaN positions differ from the model ({case})"
    finite = np.isfinite(e) & np.isfinite(a)
    assert (np.isinf(a) == np.isinf(e)).all() and (a[np.isinf(e)] == e[np.isinf(e)]).all(), (
        f"{what}: infinities differ from the model ({case})")
    err = np.where(finite, np.abs(a - e) - tol, 0)
    assert (err <= 0).all(), f"{what}: max excess error {err.max():.3g} over the tolerance ({case})"
