"""The smallest and largest MX scales (issue 34, finding 2; docs/design.md, "The smallest and
largest MX scales").

E8M0 block scales of 2^-127 (a float32 subnormal, flushed to zero by XLA:CPU), 2^-126, 2^-100 and
2^127 (448 x 2^127 overflows float32), mixed within one operand, and products of two extreme
scales, through ``block_scaled_dot``, ``scaled_dot_general`` (forward and gradients) on every CPU
backend, against float64 NumPy written here: element values times 2^(code - 127) by explicit
block indices, one einsum. The exact result is the float64 value rounded once to the output
type; a representable result must come out (a result below the output's smallest subnormal is
0), within float32 accumulation's error. The hopper_mx kernel's exact promotion is checked on a
CPU model of its instructions here and on the GPU against the same float64 values.
"""

from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import jax_gpuext as gx
from jax_gpuext.dot import scale_range

pytestmark = pytest.mark.isolated(only="gpu")  # GPU tests in child processes (tests/_isolation.py)

E8M0 = jnp.float8_e8m0fnu
TINY, TINY1, SMALL, HUGE = 0, 1, 27, 254  # E8M0 codes of 2^-127, 2^-126, 2^-100, 2^127
EXTREMES = np.array([TINY, TINY1, SMALL, HUGE])
CPU_BACKENDS = ["reference", "xla"]
OUT_INFO = {  # (relative ulp, smallest subnormal) of each output dtype
    jnp.dtype(jnp.float32): (2.0 ** -24, 2.0 ** -149),
    jnp.dtype(jnp.bfloat16): (2.0 ** -8, 2.0 ** -133),
    jnp.dtype(jnp.float16): (2.0 ** -11, 2.0 ** -24),
}


# --------------------------------------------------------------------------- operands and float64
def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _elements(rng, shape, dtype):
    """Element values spread over the whole range of ``dtype`` (log-uniform from its smallest
    subnormal to its largest value, random signs, 5% zeros)."""
    info = ml_dtypes.finfo(dtype)
    e = rng.uniform(np.log2(float(info.smallest_subnormal)), np.log2(float(info.max)), shape)
    x = np.where(rng.random(shape) < 0.05, 0.0, rng.choice([-1.0, 1.0], shape) * np.exp2(e))
    return np.clip(x, -float(info.max), float(info.max)).astype(dtype)


def _operand(rng, shape, fmt, axis, codes):
    """A BlockScaledArray of random elements with the given E8M0 codes (the scale's shape)."""
    data = jnp.asarray(_elements(rng, shape, fmt.elem_dtype))
    scale = lax.bitcast_convert_type(jnp.asarray(np.asarray(codes, np.uint8)), E8M0)
    return gx.BlockScaledArray(data, scale, None, fmt, axis)


def _f64(q) -> np.ndarray:
    """data x 2^(code - 127) per element in float64 (NaN for code 255), block k // 32 along the axis;
    float32 scales (FP8 blockwise, FP8_TENSOR): data x scale in float64, blocks by index (128x128
    over the last two axes)."""
    data = np.asarray(q.data).astype(np.float64)
    if q.scale.dtype == jnp.float32:
        scale = np.asarray(q.scale).astype(np.float64)  # NumPy keeps float32 subnormals
        if q.format.per_tensor:
            scale = scale.reshape(scale.shape + (1,) * (data.ndim - scale.ndim))
        elif len(q.format.block) == 2:
            r, c = (np.arange(data.shape[d]) // 128 for d in (-2, -1))
            scale = scale[..., r, :][..., c]
        else:
            ax = q.axis % data.ndim
            scale = np.take(scale, np.arange(data.shape[ax]) // q.format.block[0], axis=ax)
        with np.errstate(invalid="ignore", over="ignore"):
            return data * scale
    codes = np.asarray(lax.bitcast_convert_type(q.scale, jnp.uint8)).astype(np.int64)
    ax = q.axis % data.ndim
    codes = np.take(codes, np.arange(data.shape[ax]) // q.format.block[0], axis=ax)
    with np.errstate(invalid="ignore"):
        return np.where(codes == 255, np.nan, data * np.ldexp(1.0, codes - 127))


def _dot64(lhs, rhs, dn):
    """(dot_general in float64, the same with |values|): einsum letters from the dimension numbers."""
    (lc, rc), (lb, rb) = dn
    l, r = (_f64(q) if hasattr(q, "scale") else np.asarray(q, np.float64) for q in (lhs, rhs))
    letters = iter("abcdefghijklmnop")
    ls = [next(letters) for _ in range(l.ndim)]
    rs = [next(letters) for _ in range(r.ndim)]
    for a, b in zip(tuple(lc) + tuple(lb), tuple(rc) + tuple(rb)):
        rs[b] = ls[a]
    out = [ls[d] for d in lb] + [ls[d] for d in range(l.ndim) if d not in lc and d not in lb] + \
          [rs[d] for d in range(r.ndim) if d not in rc and d not in rb]
    spec = f"{''.join(ls)},{''.join(rs)}->{''.join(out)}"
    with np.errstate(invalid="ignore", over="ignore"):
        return np.einsum(spec, l, r), np.einsum(spec, np.abs(l), np.abs(r))


def assert_exact_within_f32_accumulation(y, want, mag, out_dtype, rtol=1e-5, what=""):
    """``y`` is float64's ``want`` rounded once to ``out_dtype``, up to float32 accumulation: within
    rtol * sum |terms| + an ulp of the result + the output's smallest subnormal. Where the rounded
    value overflows, ``y`` is the inf of its sign; NaN where float64 says NaN. Values within the
    tolerance of the overflow threshold may go either way and are not checked."""
    ulp, tiny = OUT_INFO[jnp.dtype(out_dtype)]
    y = np.asarray(jnp.asarray(y).astype(jnp.float32), np.float64)
    with np.errstate(invalid="ignore"):
        bound = (rtol * np.where(np.isfinite(mag), mag, 0) + 2 * ulp * np.abs(np.where(np.isfinite(want), want, 0))
                 + tiny)
    top = float(ml_dtypes.finfo(jnp.dtype(out_dtype)).max) * (1 + ulp)  # where rounding starts to give inf
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(y), nan, err_msg=f"{what}: NaN pattern")
    big = ~nan & (np.abs(want) - bound > top)
    np.testing.assert_array_equal(y[big], np.sign(want[big]) * np.inf, err_msg=f"{what}: overflow to inf")
    small = ~nan & (np.abs(want) + bound < top)
    with np.errstate(invalid="ignore"):
        err = np.abs(y - want)
    bad = small & ~(err <= bound)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} off; first at {np.argwhere(bad)[0]}: got "
                           f"{y[bad][0]!r}, want {want[bad][0]!r}, bound {bound[bad][0]!r}")
    assert big.any() or small.any()


# --------------------------------------------------------------------------- block_scaled_dot
def _case(name, fmts, m=6, n=5, k=256, seed=0):
    """(lhs, rhs) (M, K) x (N, K), quantized along K, with E8M0 codes by case:

    - "opposite": lhs codes 2^-127, 2^-126, 2^-100, 2^127 mixed along K in every row (one row all
      2^-127, one all 2^127); rhs codes the inverse of each K block's, within 2^+-3: products of
      two extreme scales that are ordinary numbers (2^-127 x 2^127), and some that underflow
      (row of 2^-127 x 2^-127) or overflow (row of 2^127 x 2^127);
    - "tiny": lhs codes 2^-127 / 2^-126 / 2^-100 mixed per block, some rows only 2^-127 and
      2^-126; rhs scales near 1: results ~2^-110, normal float32 numbers;
    - "subnormal": lhs 2^-127 / 2^-126, rhs scales putting most results in float32's subnormal
      range.
    """
    rng = _rng(name, fmts[0].name, fmts[1].name, m, n, k, seed)
    nb = k // 32
    if name == "opposite":
        pattern = np.resize(EXTREMES, nb)
        rng.shuffle(pattern)
        lc = np.broadcast_to(pattern, (m, nb)).copy()
        lc[0], lc[1] = TINY, HUGE
        lc[2:] = np.where(lc[2:] == TINY, rng.choice([TINY, TINY1], lc[2:].shape), lc[2:])
        rc = np.clip(254 - pattern[None, :] + rng.integers(-3, 4, (n, nb)), 0, 254)
    elif name == "tiny":
        lc = rng.choice([TINY, TINY1, SMALL], (m, nb))
        lc[: m // 2] = rng.choice([TINY, TINY1], (m // 2, nb))
        rc = rng.integers(124, 131, (n, nb))
    else:  # results near 2^-138: rhs scales 2^(-11 - high_l - high_r), elements up to 2^(high + 1)
        lc = rng.choice([TINY, TINY1], (m, nb))
        c0 = 127 - 11 - sum(scale_range.element_range(f.elem_dtype)[1] for f in fmts)
        rc = rng.integers(c0 - 5, c0 + 6, (n, nb))
    return _operand(rng, (m, k), fmts[0], -1, lc), _operand(rng, (n, k), fmts[1], -1, rc)


FORMAT_PAIRS = [(gx.MXFP8_E4M3, gx.MXFP8_E4M3), (gx.MXFP8_E5M2, gx.MXFP8_E5M2), (gx.MXFP4, gx.MXFP4),
                (gx.MXFP8_E5M2, gx.MXFP4)]
OUT_FOR = {"MXFP8_E4M3": jnp.float32, "MXFP8_E5M2": jnp.bfloat16, "MXFP4": jnp.float16}
DN = (((1,), (1,)), ((), ()))


@pytest.mark.parametrize("fmts", FORMAT_PAIRS, ids=lambda f: f"{f[0].name}-{f[1].name}")
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_block_scaled_dot_extreme_scales_match_float64(backend, fmts):
    for name in ("opposite", "tiny", "subnormal"):
        lhs, rhs = _case(name, fmts)
        # the opposite case in each output type (one per format pair); the others where their
        # results are representable: float32 (and bfloat16, same range) only
        out = OUT_FOR[fmts[0].name] if name == "opposite" else (jnp.float32 if name == "subnormal" else jnp.bfloat16)
        f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN, preferred_element_type=out, backend=backend))
        want, mag = _dot64(lhs, rhs, DN)
        if name != "opposite":  # the case is what it says: results representable, nearly all well above 0
            assert (np.abs(want) > 2.0 ** -143).mean() > 0.8 and np.all(np.abs(want) < 2.0 ** -60)
        if name == "subnormal":
            assert (np.abs(want) < 2.0 ** -126).mean() > 0.5
        assert_exact_within_f32_accumulation(f(lhs, rhs), want, mag, out, what=f"{backend} {name}")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_batched_layout_with_k_not_last(backend):
    """Batch dims and a contracting axis that is not the last (lhs (B, K, M) quantized along K)."""
    rng = _rng("batched", backend)
    b, m, n, k = 2, 7, 3, 160
    lc = rng.choice(EXTREMES, (b, k // 32, m))
    rc = np.clip(254 - lc[:, :, :1].transpose(0, 2, 1) + rng.integers(-2, 3, (b, n, k // 32)), 0, 254)
    lhs = _operand(rng, (b, k, m), gx.MXFP8_E4M3, 1, lc)
    rhs = _operand(rng, (b, n, k), gx.MXFP8_E5M2, -1, rc)
    dn = (((1,), (2,)), ((0,), (0,)))
    want, mag = _dot64(lhs, rhs, dn)
    got = jax.jit(lambda a, c: gx.block_scaled_dot(a, c, dn, backend=backend))(lhs, rhs)
    assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, what=backend)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_nan_scales_and_inf_elements_with_extreme_scales(backend):
    """NaN / Inf take the definition's pattern in the wide-range path too: an Inf element times a
    nonzero value of any scale is Inf (the classes' zeroed elements must not make it NaN), Inf x 0
    and NaN scales are NaN."""
    lhs, rhs = _case("opposite", (gx.MXFP8_E5M2, gx.MXFP8_E5M2), m=8, n=6, seed=1)
    data = np.asarray(lhs.data).copy()
    data[2, 5] = np.inf  # row 2: Inf in a block of some extreme scale
    data[3, 40] = -np.inf
    data[4, 100] = np.nan
    codes = np.asarray(lax.bitcast_convert_type(lhs.scale, jnp.uint8)).copy()
    codes[5, 3] = 255  # a NaN scale
    rdata = np.asarray(rhs.data).copy()
    rdata[0, 5] = 0  # Inf x 0 = NaN in column 0 of row 2
    lhs = gx.BlockScaledArray(jnp.asarray(data), lax.bitcast_convert_type(jnp.asarray(codes), E8M0), None,
                              lhs.format, lhs.axis)
    rhs = gx.BlockScaledArray(jnp.asarray(rdata), rhs.scale, None, rhs.format, rhs.axis)
    want, mag = _dot64(lhs, rhs, DN)
    assert np.isinf(want[2, 1:]).all() and np.isnan(want[2, 0]) and np.isinf(want[3]).all()
    got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN, backend=backend))(lhs, rhs)
    assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, what=backend)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_nvfp4_global_scales_whose_product_leaves_float32(backend):
    """NVFP4's two float32 global scales multiply the accumulator; their product (2^-160, 2^-140)
    may lie below float32 (or among its subnormals, flushed by XLA:CPU) while acc x the product is
    a representable (here subnormal) float32 number."""
    rng = _rng("nvfp4", backend)
    x = rng.standard_normal((6, 64)).astype(np.float32) * 30
    w = rng.standard_normal((5, 64)).astype(np.float32) * 30
    for gl, gr in ((2.0 ** -80, 2.0 ** -80), (2.0 ** -100, 2.0 ** -40), (2.0 ** 100, 2.0 ** -120)):
        ql, qr = gx.quantize(x, gx.NVFP4), gx.quantize(w, gx.NVFP4)
        ql = gx.BlockScaledArray(ql.data, ql.scale, jnp.float32(gl), gx.NVFP4, -1)
        qr = gx.BlockScaledArray(qr.data, qr.scale, jnp.float32(gr), gx.NVFP4, -1)
        vals = [np.asarray(q.data).astype(np.float64) * np.repeat(np.asarray(q.scale).astype(np.float64), 16, axis=-1)
                for q in (ql, qr)]
        want, mag = vals[0] @ vals[1].T * gl * gr, np.abs(vals[0]) @ np.abs(vals[1]).T * gl * gr
        got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN, backend=backend))(ql, qr)
        assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, what=f"{backend} {gl} {gr}")
        assert np.count_nonzero(np.asarray(got)) == want.size


def test_the_window_holds_for_ordinary_operands_and_not_at_the_extremes():
    """Quantized ordinary data takes the one-dot path (the wide one only where it must)."""
    x = jax.random.normal(jax.random.key(0), (64, 256)) * 1e3
    w = jax.random.normal(jax.random.key(1), (32, 256)) * 1e-6
    for fl, fr in FORMAT_PAIRS:
        assert bool(scale_range.in_window(gx.quantize(x, fl), gx.quantize(w, fr), 256))
    for name in ("opposite", "tiny", "subnormal"):
        lhs, rhs = _case(name, FORMAT_PAIRS[0])
        assert not bool(scale_range.in_window(lhs, rhs, 256))


@pytest.mark.parametrize("out", [jnp.float32, jnp.bfloat16, jnp.float16], ids=["f32", "bf16", "f16"])
def test_combine_rounds_the_sum_once_on_its_bits(out):
    """sum_p 2^(o_p) D_p rounded once to the output on its bits: subnormal results, overflow to
    inf, underflow to 0, cancellation, on XLA:CPU where float arithmetic flushes subnormals. The
    terms of a column (8-bit integers times powers of two within 2^10 of each other) add up
    exactly in float64 and in float32 partial sums, so one rounding of the exact sum is the
    answer, bit for bit."""
    rng = _rng("combine", jnp.dtype(out).name)
    n = 4000
    offsets = np.array([-192, -128, -64, 0, 64, 128, 192])
    lo, hi = (-35, 25) if out == jnp.float16 else (-165, 135)  # log2 of each column's sum
    c = rng.integers(lo, hi, n)
    e = c[None, :] - offsets[:, None] + rng.integers(-5, 6, (offsets.size, n)) - 8
    ints = rng.integers(-255, 256, (offsets.size, n)).astype(np.float64)
    d = np.where((e >= -120) & (e <= 110), np.ldexp(ints, e), 0.0)
    d32 = d.astype(np.float32)
    assert np.array_equal(d32.astype(np.float64), d)
    want = sum(np.ldexp(d[i], offsets[i]) for i in range(offsets.size))
    with np.errstate(over="ignore"):
        want_r = want.astype(jnp.dtype(out)).astype(np.float64)
    got = np.asarray(jax.jit(lambda d: scale_range.combine(offsets, d, out))(jnp.asarray(d32))).astype(np.float64)
    np.testing.assert_array_equal(got, want_r)
    smallest_normal = float(ml_dtypes.finfo(jnp.dtype(out)).smallest_normal)
    assert ((want_r != 0) & (np.abs(want_r) < smallest_normal)).sum() > 50  # subnormal results
    assert np.isinf(want_r).sum() > 50 and (want_r == 0).sum() > 50 and (np.abs(want_r) > smallest_normal).sum() > 50


# --------------------------------------------------------------------------- scaled_dot_general
def _magnitudes(rng, rows, cols, exps):
    """Standard normal values, each 32-long block of each row times 2^e for e drawn from ``exps``."""
    x = rng.standard_normal((rows, cols))
    e = rng.choice(exps, (rows, cols // 32))
    return (x * np.exp2(np.repeat(e, 32, axis=1))).astype(np.float32)


def _sdg_f64(x, w, g, rec):
    """scaled_dot_general's forward and VJP in float64: the operands quantized as it does
    (jax_gpuext.quantize, proven bit-exact in tests/formats), then float64 dots."""
    q = functools.partial(gx.quantize, axis=-1)
    nt = (((1,), (1,)), ((), ()))
    y = _dot64(q(x, rec.lhs), q(w.T, rec.rhs), nt)
    dx = _dot64(q(g, rec.grad), q(w, rec.rhs_bwd), nt)  # contract N; w is (K, N)
    dwt = _dot64(q(g.T, rec.grad), q(x.T, rec.lhs_bwd), nt)  # (N, K): contract M
    return y, dx, (dwt[0].T, dwt[1].T)


@pytest.mark.parametrize("tiny", ["lhs", "rhs"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_scaled_dot_general_forward_and_gradients(backend, tiny):
    """Inputs whose blocks quantize to scales 2^-127 / 2^-126 / 2^-100 (MXFP8 E4M3: 32-blocks of
    magnitude ~2^-121, ~2^-119 and ~2^-93), mixed along K and M, with the other operand ordinary:
    the forward dot and one of the two gradient dots meet them (tiny lhs: y and dw; tiny rhs: y
    and dx). Rows / columns made of the smallest blocks only have results near 2^-115: normal
    float32 numbers."""
    rng = _rng("sdg", backend, tiny)
    m, k, n = 24, 256, 40
    extreme = [-121, -119, -93]
    if tiny == "lhs":
        x = _magnitudes(rng, m, k, extreme)
        x[:8] = _magnitudes(rng, 8, k, [-121])  # rows of 2^-127-scaled blocks only
        w = rng.standard_normal((k, n)).astype(np.float32)
    else:
        x = rng.standard_normal((m, k)).astype(np.float32)
        wt = _magnitudes(rng, n, k, extreme)
        wt[:8] = _magnitudes(rng, 8, k, [-121])
        w = np.ascontiguousarray(wt.T)
    g = rng.standard_normal((m, n)).astype(np.float32)
    rec = gx.dot.recipe(gx.MXFP8_E4M3)
    f = jax.jit(lambda a, b: gx.scaled_dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32,
                                                   backend=backend))
    y, vjp = jax.vjp(f, jnp.asarray(x), jnp.asarray(w))
    dx, dw = vjp(jnp.asarray(g))
    (wy, my), (wdx, mdx), (wdw, mdw) = _sdg_f64(x, w, g, rec)
    assert (np.abs(wy) > 2.0 ** -126).mean() > 0.9  # forward results normal float32 numbers (nearly all)
    codes = np.asarray(lax.bitcast_convert_type(gx.quantize(x if tiny == "lhs" else w.T, rec.lhs).scale, jnp.uint8))
    assert {TINY, TINY1} <= set(np.unique(codes).tolist())  # the scales this is about do occur
    for got, want, mag, what in ((y, wy, my, "y"), (dx, wdx, mdx, "dx"), (dw, wdw, mdw, "dw")):
        assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, what=f"{backend} {what}")


def test_vmapped_dot_takes_each_examples_path():
    """Under vmap the scale checks are batched (``lax.cond`` becomes a select, the loop's skips too):
    an ordinary example and one with extreme scales, each the float64 result."""
    fmts = (gx.MXFP8_E4M3, gx.MXFP8_E5M2)
    ext = _case("opposite", fmts)
    x = jax.random.normal(jax.random.key(3), (6, 256))
    w = jax.random.normal(jax.random.key(4), (5, 256))
    plain = (gx.quantize(x, fmts[0]), gx.quantize(w, fmts[1]))
    stack = [jax.tree.map(lambda a, b: jnp.stack([a, b]), p, e) for p, e in zip(plain, ext)]
    for backend in CPU_BACKENDS:
        got = jax.jit(jax.vmap(lambda a, b: gx.block_scaled_dot(a, b, DN, backend=backend)))(*stack)
        for i, (a, b) in enumerate((plain, ext)):
            want, mag = _dot64(a, b, DN)
            assert_exact_within_f32_accumulation(got[i], want, mag, jnp.float32, what=f"{backend} {i}")


# --------------------------------------------------------------------------- FP8 blockwise and FP8_TENSOR
FP8_EXPONENTS = np.array([-140, -127, -100, 120])  # float32 block scales: a subnormal, 2^-127 .. 2^120


def _f32_scales(rng, exps):
    """Float32 scales m x 2^e, m in [1, 2) random (subnormal where e < -126: fewer bits)."""
    return np.ldexp(rng.uniform(1, 2, exps.shape), exps).astype(np.float32)


def _fp8_opposite(rng, rhs_format, m=6, n=256, k=512):
    """(M, K) FP8_1x128 x (N, K) ``rhs_format`` with ordinary elements and hand-built float32 scales
    of FP8_EXPONENTS mixed along K (one row all subnormal scales, one all 2^120), the rhs blocks
    scaled by about the inverse: products of two extreme scales that are ordinary numbers."""
    nb = k // 128
    pattern = np.resize(FP8_EXPONENTS, nb)
    rng.shuffle(pattern)
    le = np.broadcast_to(pattern, (m, nb)).copy()
    le[0], le[1] = FP8_EXPONENTS[0], FP8_EXPONENTS[-1]
    lhs = gx.quantize(jnp.asarray(rng.standard_normal((m, k)), jnp.float32), gx.FP8_1x128)
    lhs = gx.BlockScaledArray(lhs.data, jnp.asarray(_f32_scales(rng, le)), None, gx.FP8_1x128, -1)
    rhs = gx.quantize(jnp.asarray(rng.standard_normal((n, k)), jnp.float32), rhs_format)
    rows = rhs.scale.shape[0]
    re = np.clip(-pattern[None, :] + rng.integers(-3, 4, (rows, nb)), -149, 127)
    rhs = gx.BlockScaledArray(rhs.data, jnp.asarray(_f32_scales(rng, re)), None, rhs_format, -1)
    return lhs, rhs


def _fp8_tiny(rng, rhs_format, m=6, n=256, k=512):
    """What quantize makes of a block of N(0, 2^-125) values (scale clamped at 2^-126, elements
    below 1 whose element x scale is a float32 subnormal), mixed along K with ordinary blocks,
    against an rhs of N(0, 2^100): the repro of issue 34's note, results ~2^-20."""
    x = rng.standard_normal((m, k)) * np.repeat(np.where(rng.random((m, k // 128)) < 0.5, 2.0 ** -125, 2.0 ** -100),
                                                128, axis=1)
    x[0] = rng.standard_normal(k) * 2.0 ** -125  # row 0: tiny blocks only
    return (gx.quantize(jnp.asarray(x, jnp.float32), gx.FP8_1x128),
            gx.quantize(jnp.asarray(rng.standard_normal((n, k)) * 2.0 ** 100, jnp.float32), rhs_format))


FP8_RHS = [gx.FP8_1x128, gx.FP8_128x128]


@pytest.mark.parametrize("rhs_format", FP8_RHS, ids=lambda f: f.name)
def test_fp8_blockwise_reference_at_the_extremes_matches_float64(rhs_format):
    """The reference (the CPU's FP8 blockwise default) dequantizes element x float32 block scale;
    below 2^-126 XLA:CPU flushed it, and 448 x 2^120 x (2 - ..) is past float32 though the dot
    with an inverse scale is ordinary: exact now, through the exponent classes."""
    for name, case in (("tiny", _fp8_tiny), ("opposite", _fp8_opposite)):
        lhs, rhs = case(_rng("fp8", name, rhs_format.name), rhs_format)
        want, mag = _dot64(lhs, rhs, DN)
        if name == "tiny":
            assert (np.asarray(lhs.scale) == np.float32(2.0 ** -126)).any()  # quantize's clamp is what this meets
        got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN, backend="reference"))(lhs, rhs)
        assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, what=name)
        assert not bool(scale_range.in_window(lhs, rhs, lhs.shape[1]))


def test_the_window_holds_for_ordinary_fp8_blockwise_operands():
    """Quantized FP8 blockwise data keeps the one-dot path on CPU (zero blocks included: their
    scale is 1); blocks of amax below ~2^-108 (scale clamped at 2^-126) leave it."""
    x = np.asarray(jax.random.normal(jax.random.key(0), (64, 512))) * 1e3
    x[:, :128] = 0
    w = np.asarray(jax.random.normal(jax.random.key(1), (256, 512))) * 1e-6
    for rf in FP8_RHS:
        ql, qr = gx.quantize(jnp.asarray(x, jnp.float32), gx.FP8_1x128), gx.quantize(jnp.asarray(w, jnp.float32), rf)
        assert bool(scale_range.in_window(ql, qr, 512))
        lhs, rhs = _fp8_tiny(_rng("window", rf.name), rf)
        assert not bool(scale_range.in_window(lhs, rhs, 512))


@pytest.mark.parametrize("rhs_format", FP8_RHS, ids=lambda f: f.name)
def test_fp8_blockwise_xla_bound_at_the_extremes(rhs_format):
    """The xla backend's bf16 GEMM keeps its stated bound (docs/formats.md, "FP8 blockwise through
    bf16") at the extremes through its absolute term, 2^-125 (sum_k |l_k| + |r_k| + K): a flushed
    element below 2^-126 times r_k is within 2^-125 |r_k|. Only that term covers it: the relative
    part alone fails there (docs/design.md, "The smallest and largest MX scales", FP8 blockwise)."""
    lhs, rhs = _fp8_tiny(_rng("fp8 xla", rhs_format.name), rhs_format)
    want, mag = _dot64(lhs, rhs, DN)
    k = lhs.shape[1]
    l64, r64 = _f64(lhs), _f64(rhs)
    eps = 2.0 ** -8 + 2.0 ** -17 + 1.01 * (k + 2) * 2.0 ** -24
    bound = eps * mag + 2.0 ** -125 * (np.abs(l64).sum(1)[:, None] + np.abs(r64).sum(1)[None, :] + k)
    got = np.asarray(jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN, backend="xla"))(lhs, rhs), np.float64)
    err = np.abs(got - want)
    assert (err <= bound).all()
    assert (err > eps * mag).any()  # the relative part alone does not hold here


def test_fp8_tensor_scales_at_the_extremes_match_float64():
    """FP8_TENSOR: a tensor of N(0, 2^-125) values (scale clamped at 2^-126: element x scale a
    float32 subnormal, flushed by the reference's dequantization on XLA:CPU) against N(0, 2^100);
    and hand-built scales 2^-100 x 2^-60, whose float32 product (2^-160) is 0, with results among
    float32's subnormals. Both CPU backends: the scales factor out and multiply with an unbounded
    exponent."""
    rng = _rng("fp8_tensor")
    x = rng.standard_normal((6, 256)) * 2.0 ** -125
    w = rng.standard_normal((5, 256)) * 2.0 ** 100
    ql, qr = (gx.quantize(jnp.asarray(v, jnp.float32), gx.FP8_TENSOR) for v in (x, w))
    assert float(ql.scale) == 2.0 ** -126
    tiny = [gx.BlockScaledArray(q.data, jnp.float32(s), None, gx.FP8_TENSOR, -1)
            for q, s in ((gx.quantize(jnp.asarray(x * 2.0 ** 125, jnp.float32), gx.FP8_TENSOR), 2.0 ** -100),
                         (gx.quantize(jnp.asarray(w * 2.0 ** -100, jnp.float32), gx.FP8_TENSOR), 2.0 ** -60))]
    for backend in CPU_BACKENDS:
        for what, (a, b) in (("quantized", (ql, qr)), ("scale product", tiny)):
            want, mag = _dot64(a, b, DN)
            got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN, backend=backend))(a, b)
            assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, what=f"{backend} {what}")
            if what == "scale product":
                assert (np.abs(want) < 2.0 ** -126).all() and np.count_nonzero(np.asarray(got)) > 0.9 * want.size


# --------------------------------------------------------------------------- hopper_mx: CPU model
WINDOW = (33, 218)  # hopper_mx_kernel.cuh ScaleInWindow: fp32 exponent fields 33..218


def _in_window(s):
    e = (np.asarray(s, np.float32).view(np.uint32) >> 23) & 0xFF
    return (e >= WINDOW[0]) & (e <= WINDOW[1])


def _fma0(x, y):
    """fmaf(x, y, 0) for float32 x, y with one a power of two: the product is exact in float64,
    one cast rounds it (IEEE subnormals and overflow included)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(x, np.float32).astype(np.float64) * np.asarray(y, np.float32).astype(np.float64)
                ).astype(np.float32)


def _promote_exact(part, sa, sb):
    """hopper_mx_kernel.cuh PromoteExact with acc = 0, in NumPy float32 (IEEE subnormals)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        a = _fma0(np.float32(part) * np.float32(sa), sb)  # sa in the window: the fast step's order
        c = _fma0(np.float32(part) * np.float32(sb), sa)
        s = np.float32(sa) * np.float32(sb)
        es = (np.asarray(s, np.float32).view(np.uint32) >> 23) & 0xFF
        b = _fma0(part, s)
    return np.where(_in_window(sa), a, np.where(_in_window(sb), c, np.where((es != 0) & (es != 255), b, a)))


def test_hopper_mx_exact_promotion_model_for_every_pair_of_e8m0_scales():
    """PromoteExact adds part * sa * sb with one rounding for every pair of E8M0 codes (0..254)
    and every nonzero partial of 32 FP8 products (2^-32 <= |part| < 2^37); a zero partial stays
    zero and a NaN scale gives NaN. The fast step alone fails at opposite extremes (the reason
    for the slow path; tests/dot/test_hopper_mx.py bounds the fast step)."""
    if not np.float32(2.0 ** -127) * np.float32(0.5) == np.float32(2.0 ** -128):
        pytest.skip("fp32 subnormals are flushed in this process")
    rng = np.random.default_rng(34)
    lo, hi = 2.0 ** -32, 2.0 ** 37
    mant = 1 + rng.integers(0, 2 ** 23, 40) / 2 ** 23
    edges = [lo, (1 + 2.0 ** -23) * lo, np.nextafter(np.float32(hi), np.float32(0)), 1.0, 0.0]
    part = np.concatenate([edges, mant * 2.0 ** rng.integers(-32, 37, 40)])
    part = (part * rng.choice([-1.0, 1.0], part.size)).astype(np.float32)[:, None, None]
    codes = np.arange(255)
    sa = np.ldexp(np.float32(1), codes - 127).astype(np.float32)[None, :, None]
    sb = np.ldexp(np.float32(1), codes - 127).astype(np.float32)[None, None, :]
    with np.errstate(over="ignore"):
        scales = np.ldexp(1.0, codes[:, None] + codes[None, :] - 254)[None]
        want = (part.astype(np.float64) * scales).astype(np.float32)
    got = _promote_exact(part, sa, sb)
    np.testing.assert_array_equal(got, want)
    with np.errstate(over="ignore", under="ignore"):
        fast = _fma0(part * sa, sb)
    assert not np.array_equal(fast, want)  # e.g. sa = 2^127, sb = 2^-127
    nan = np.float32(np.nan)
    assert np.isnan(_promote_exact(part, nan, sb)).all() and np.isnan(_promote_exact(part, sa, nan)).all()


# --------------------------------------------------------------------------- GPU
def _gpu_operands(fmts, b=2, m=130, n=72, k=320, seed=0):
    """The opposite case on the canonical (B, M, K) x (B, N, K) layout, M and N past one tile."""
    rng = _rng("gpu", fmts[0].name, fmts[1].name, seed)
    nb = k // 32
    pattern = np.resize(EXTREMES, nb)
    rng.shuffle(pattern)
    lc = np.broadcast_to(pattern, (b, m, nb)).copy()
    lc[:, 0], lc[:, 1] = TINY, HUGE
    lc[:, 2:] = np.where(lc[:, 2:] == TINY, rng.choice([TINY, TINY1], lc[:, 2:].shape), lc[:, 2:])
    rc = np.clip(254 - pattern[None, None, :] + rng.integers(-3, 4, (b, n, nb)), 0, 254)
    return _operand(rng, (b, m, k), fmts[0], -1, lc), _operand(rng, (b, n, k), fmts[1], -1, rc)


def _gpu_nonfinite_operands(fmts=(gx.MXFP8_E5M2, gx.MXFP8_E5M2)):
    """The opposite case with inf / NaN elements and a NaN scale in it: Inf in a block of 2^-127
    (row 0), of 2^127 (row 1) and elsewhere, a NaN element, a NaN scale, and a zero rhs element
    against an Inf (Inf x 0): the hopper_mx kernel's rescan (promote.h) meets these too, since an
    inf / NaN result is what sends an element there."""
    lhs, rhs = _gpu_operands(fmts, seed=1)
    data = np.asarray(lhs.data).copy()
    data[0, 0, 5] = data[1, 1, 300] = np.inf
    data[0, 7, 40] = -np.inf
    data[1, 9, 100] = np.nan
    codes = np.asarray(lax.bitcast_convert_type(lhs.scale, jnp.uint8)).copy()
    codes[0, 11, 3] = 255
    rdata = np.asarray(rhs.data).copy()
    rdata[0, 4, 5] = 0  # Inf x 0 = NaN at [0, 0, 4]
    lhs = gx.BlockScaledArray(jnp.asarray(data), lax.bitcast_convert_type(jnp.asarray(codes), E8M0), None,
                              lhs.format, lhs.axis)
    rhs = gx.BlockScaledArray(jnp.asarray(rdata), rhs.scale, None, rhs.format, rhs.axis)
    return lhs, rhs


DN_BATCHED = (((2,), (2,)), ((0,), (0,)))
HOPPER_MX_GPU_CASES = {f"{a.name}-{b.name}": (a, b) for a, b in FORMAT_PAIRS[:2] + [(gx.MXFP8_E4M3, gx.MXFP4)]}


@pytest.mark.gpu
@pytest.mark.verifies("block_scaled_dot.hopper_mx", feature="mxfp8")
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("case", list(HOPPER_MX_GPU_CASES) + ["nonfinite"])
def test_gpu_hopper_mx_extreme_scales_match_float64(case):
    """The kernel's PromoteExact path (warps whose rows hold scales outside 2^-94 .. 2^91) and its
    rescan of elements whose float32 sum is not finite (rows of 2^127 against columns of 2^100 ..
    2^127: inf - inf made 144 NaN of +-inf on the H200 at 3ff9b82; tests/dot/test_hopper_mx.py
    runs the same arithmetic on the CPU), on the GPU; "nonfinite" adds inf / NaN elements and a
    NaN scale. Hopper's FP8 tensor cores add a partial's 32 products with a shortened mantissa: 1e-3
    of sum |terms| (as tests/dot/test_hopper_mx.py)."""
    lhs, rhs = _gpu_nonfinite_operands() if case == "nonfinite" else _gpu_operands(HOPPER_MX_GPU_CASES[case])
    want, mag = _dot64(lhs, rhs, DN_BATCHED)
    if case == "nonfinite":
        assert np.isnan(want[0, 0, 4]) and np.isinf(want[0, 7]).any() and np.isnan(want[1, 9]).all()
    for out in (jnp.float32, jnp.bfloat16):
        got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN_BATCHED, preferred_element_type=out,
                                                       backend="hopper_mx"))(lhs, rhs)
        assert_exact_within_f32_accumulation(got, want, mag, out, rtol=1e-3, what=f"hopper_mx {out}")


@pytest.mark.gpu
@pytest.mark.gates("cuda_device")
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gpu_xla_and_reference_extreme_scales_match_float64(backend):
    """The same values through XLA:GPU (subnormals kept there, but 448 x 2^127 overflows without
    the wide-range path), bfloat16 results straight out of the dot included."""
    lhs, rhs = _gpu_operands((gx.MXFP8_E4M3, gx.MXFP8_E5M2))
    want, mag = _dot64(lhs, rhs, DN_BATCHED)
    for out in (jnp.float32, jnp.bfloat16):
        got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN_BATCHED, preferred_element_type=out,
                                                       backend=backend))(lhs, rhs)
        assert_exact_within_f32_accumulation(got, want, mag, out, what=f"{backend} {out}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [
    pytest.param("cudnn", marks=pytest.mark.gates("blackwell", "cudnn_dot_built")),
    pytest.param("cublaslt", marks=pytest.mark.gates("blackwell", "cublaslt_dot_built"))])
def test_gpu_blackwell_libraries_extreme_scales_match_float64(backend):
    """cuDNN / cuBLASLt read the E8M0 scales in hardware (VEC32_UE8M0): whether 2^-127 and 2^127
    blocks come out right is theirs to get right, and this checks it. (No verification-record
    marker: a failure here is reported, not fixed, by this package.)"""
    lhs, rhs = _gpu_operands((gx.MXFP8_E4M3, gx.MXFP8_E4M3), b=1, m=128, n=128, k=256)
    want, mag = _dot64(lhs, rhs, DN_BATCHED)
    got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN_BATCHED, preferred_element_type=jnp.float32,
                                                   backend=backend))(lhs, rhs)
    assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, rtol=1e-3, what=backend)


@pytest.mark.gpu
@pytest.mark.gates("cuda_device")
@pytest.mark.parametrize("rhs_format", FP8_RHS, ids=lambda f: f.name)
def test_gpu_fp8_blockwise_reference_keeps_subnormal_products(rhs_format):
    """On CUDA the FP8 blockwise reference keeps its one float32 dot (the exponent classes are for
    XLA:CPU, which flushes an element x scale below 2^-126): XLA:GPU keeps float32 subnormals by
    default (xla_gpu_ftz off), so quantize's tiny blocks come out exact. A failure here means it
    does not, and the CPU path is needed on CUDA too (docs/design.md, "The smallest and largest MX
    scales", FP8 blockwise)."""
    lhs, rhs = _fp8_tiny(_rng("gpu fp8", rhs_format.name), rhs_format)
    want, mag = _dot64(lhs, rhs, DN)
    got = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, DN, backend="reference"))(lhs, rhs)
    assert_exact_within_f32_accumulation(got, want, mag, jnp.float32, what="reference on CUDA")
