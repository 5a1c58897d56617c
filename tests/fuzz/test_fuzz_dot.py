"""Fuzz: scaled_dot_general's dimension numbers (valid, negative, out of range, repeated, float,
malformed) and formats. What lax.dot_general refuses must be refused (a clean error at trace
time); what it accepts must be computed or refused cleanly; a result must be within the format's
error bound of the float64 dot of the unquantized inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import _values
from _budget import fuzz, judged
from _judge import assert_close, per_backend
from jax_gpuext import formats

# Relative error of one quantized element (half an ulp of the element format, plus the scale's
# rounding up to a power of two for MX): the bound per product is |a||b| * (2 e + e^2).
# FP4 (E2M1: 0.5 is its smallest step) flushes elements below a block's amax / 24 (some up to
# amax / 12) to zero, a relative error of 1, which 2 e + e^2 with e = 1/2 covers.
ELEMENT_ERROR = {"MXFP8_E4M3": 2.0**-3, "MXFP8_E5M2": 2.0**-2, "NVFP4": 2.0**-1, "MXFP4": 2.0**-1, "FP8_1x128": 2.0**-3,
                 "FP8_128x128": 2.0**-3, "FP8_TENSOR": 2.0**-3}
# Half the cases draw from the valid forms for lhs [m, k] x rhs [k, n], so most of the budget
# computes and checks a result; the other half from forms that are refused, or valid only for
# some shapes (k == n, m == k, ...), each of which must be refused cleanly where lax refuses it.
VALID_DIMENSION_NUMBERS = [(((1,), (0,)), ((), ())), ((1, 0), ((), ()))]  # lax takes a bare int too
OTHER_DIMENSION_NUMBERS = [
    (((1,), (1,)), ((), ())), (((0,), (0,)), ((), ())), (((-1,), (-2,)), ((), ())), (((-1,), (0,)), ((), ())),
    (((2,), (1,)), ((), ())), (((1.5,), (0,)), ((), ())), (((1.0,), (0,)), ((), ())), (((1, 1), (0, 0)), ((), ())),
    (((1,), (0,)), ((0,), (0,))), (((5,), (0,)), ((), ())), "((1,), (0,))", None,
]
DIMENSION_NUMBERS = st.one_of(st.sampled_from(VALID_DIMENSION_NUMBERS), st.sampled_from(OTHER_DIMENSION_NUMBERS))
# One format for both operands, or the (lhs, rhs) pair of the FP8 blockwise recipe, each equally
# likely; FP8_128x128 alone is among them: a weight format, refused for the lhs.
FORMATS = st.sampled_from(sorted(formats.FORMATS) + [("FP8_1x128", "FP8_128x128")])


@fuzz("scaled_dot_general", 20)
@given(m=st.sampled_from([1, 3, 32]), k=st.sampled_from([1, 32, 33, 64]), n=st.sampled_from([1, 2, 16]),
       dn=DIMENSION_NUMBERS, fmt=FORMATS, seed=_values.seeds,
       out_dtype=st.sampled_from(_values.FLOATS))
def test_scaled_dot_general(worker, m, k, n, dn, fmt, seed, out_dtype):
    lhs = _values.make((m, k), np.float32, seed, 0.0, scale_exp=0)
    rhs = _values.make((k, n), np.float32, seed + 1, 0.0, scale_exp=0)
    case = f"scaled_dot_general(lhs f32[{m}, {k}], rhs f32[{k}, {n}], {dn!r}, format={fmt}, preferred={out_dtype.name})"
    with judged("scaled_dot_general"):
        results = per_backend("scaled_dot_general", worker.run("scaled_dot_general", dict(
            lhs=lhs, rhs=rhs, dimension_numbers=dn, fmt=("pair" if isinstance(fmt, tuple) else "const", fmt),
            out_dtype=out_dtype,
            backends=("auto", "reference"))), case)
        lax_accepts = _lax_accepts(dn, lhs, rhs)
        assert lax_accepts or not results, f"accepted dimension numbers that lax.dot_general refuses: {case}"
        if not results:
            return
        (lc, rc), _ = dn  # lax.dot_general also takes a bare int for one contracting dim
        lc, rc = (list(np.atleast_1d(lc)), list(np.atleast_1d(rc)))
        want = np.tensordot(lhs.astype(np.float64), rhs.astype(np.float64), (lc, rc))
        bound = np.tensordot(np.abs(lhs).astype(np.float64), np.abs(rhs).astype(np.float64), (list(lc), list(rc)))
        e = max(ELEMENT_ERROR[f] for f in np.atleast_1d(fmt))
        tol = bound * (2 * e + e * e) + np.abs(want) * 2.0**-7 + 1e-6
        for backend, r in results.items():
            assert_close(r, want, tol, f"scaled_dot_general on {backend}", case)


def _lax_accepts(dn, lhs, rhs) -> bool:
    """Whether lax.dot_general takes ``dn`` for these operands (negative indices included: lax
    refuses them, so we must too)."""
    import jax
    try:
        jax.eval_shape(lambda a, b: jax.lax.dot_general(a, b, dn), lhs, rhs)
        return True
    except Exception:  # noqa: BLE001 - any refusal by lax counts
        return False
