"""Input arrays for the fuzz cases, built by NumPy from a few drawn numbers (shape, dtype, seed,
how many specials), so hypothesis prints a short, replayable recipe instead of the array."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

FLOATS = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
_ML_FLOATS = {np.dtype(getattr(ml_dtypes, n)) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn",
                                                        "float6_e2m3fn", "float6_e3m2fn") if hasattr(ml_dtypes, n)}
_NO_NAN = ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")  # nor infinities, like float8_e4m3fn
DIMS = (0, 1, 2, 3, 5, 16, 17, 31, 32, 33, 64, 100, 128, 130)


def shapes(min_rank=0, max_rank=5, max_size=12_000, dims=DIMS):
    return st.integers(min_rank, max_rank).flatmap(
        lambda r: st.tuples(*[st.sampled_from(dims)] * r)).filter(lambda s: int(np.prod(s)) <= max_size)


def make(shape, dtype, seed: int, specials: float = 0.0, scale_exp: int | None = None) -> np.ndarray:
    """Random values of ``dtype``: per-row binary exponents over the type's range (subnormals
    included) unless ``scale_exp`` fixes them; a ``specials`` fraction of entries replaced by zeros,
    +-max, NaN, +-Inf and subnormals. Integer / bool / sub-byte types get random codes."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype.name == "float8_e8m0fnu":  # power-of-two scales, as codes around 2^0
        return rng.integers(100, 150, size=shape).astype(np.uint8).view(dtype)
    if not (dtype.kind == "f" or dtype in _ML_FLOATS):
        if dtype == np.bool_:
            return rng.random(shape) < 0.5
        if dtype.kind == "c":
            return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        info = ml_dtypes.iinfo(dtype) if dtype.name in ("int4", "uint4", "int2", "uint2") else np.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)
    fi = ml_dtypes.finfo(dtype)
    if scale_exp is None:
        lo, hi = int(np.log2(float(fi.smallest_subnormal))) - 1, int(np.log2(float(fi.max)))
        exps = rng.integers(lo, hi + 1, size=n)
    else:
        exps = np.full(n, scale_exp)
    v = np.clip(np.ldexp(rng.standard_normal(n), exps), -float(fi.max), float(fi.max))
    if specials and n:
        pool = np.array([0.0, float(fi.max), -float(fi.max), np.nan, np.inf, -np.inf,
                         float(fi.smallest_subnormal), -3 * float(fi.smallest_subnormal)])
        if dtype.name in ("float8_e4m3fn",) + _NO_NAN:  # no infinities (nor NaN in FP4 / FP6)
            pool = pool[~np.isinf(pool) & ~(np.isnan(pool) & (dtype.name in _NO_NAN))]
        pick = rng.random(n) < specials
        v[pick] = rng.choice(pool, size=int(pick.sum()))
    return v.astype(dtype).reshape(shape)


seeds = st.integers(0, 2**31 - 1)
special_fractions = st.sampled_from([0.0, 0.0, 0.02, 0.3])


def one_bad(data, params: dict, valid_share: int = 2) -> dict:
    """Draws every parameter valid except at most one (about 1 case in ``valid_share + 1`` all
    valid): most cases get far enough to compute something, the rest probe one check each.
    ``params``: name -> (valid strategy, bad strategy)."""
    bad = data.draw(st.sampled_from([None] * (valid_share * len(params)) + list(params)), label="bad")
    return {name: data.draw(good if name != bad else junk, label=name) for name, (good, junk) in params.items()}
