"""The ``xla`` backend of quantize / dequantize (jax_gpuext/formats/xla.py): the parts only it has.

Its bits against the float64 model and the other backends are checked with them in
test_formats.py (every test there runs it, the every-bf16-value sweeps included). Here: the
loop-free division it rests on, for estimates as bad as the ones XLA:GPU's ``div.full.f32`` and
XLA's reciprocal rewrite give; its per-element rounding; NVFP4's thresholds against the rule in
exact arithmetic; and the compiled program: no while loop, x read at most twice, on CPU and as lowered
for CUDA."""

from __future__ import annotations

import fractions
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext import formats
from jax_gpuext.formats import reference as ref
from jax_gpuext.formats import xla as formats_xla
from test_formats import as_bits, assert_bits_equal, elem_bits, random_blocks, scale_bits

RNG = np.random.default_rng(28)


def significands(n, rng=RNG):
    """24-bit significands: random, the extremes, and ones with small odd parts (ties)."""
    m = rng.integers(2**23, 2**24, n, dtype=np.int64)
    m[: n // 8] = rng.integers(1, 64, n // 8) * 2**18 | 2**23  # few significant bits: exact quotients, ties
    m[:4] = [2**23, 2**24 - 1, 0xC00000, 0xE00000]  # 1, the largest, 1.5 (6), 1.75 (448)
    return m


# --------------------------------------------------------------------------- the division
@pytest.mark.parametrize("offset", [-30, -7, -1, 0, 1, 2, 31])
@pytest.mark.parametrize("rcp_error", [-2.0**-11, 0.0, 2.0**-11])
def test_floor_quotient_is_exact_for_any_estimate_within_its_bounds(offset, rcp_error):
    """q = floor(a * 2**s / b) and its remainder, exactly, from estimates off by `offset` units
    (|offset| * b < 2**31) and reciprocals off by a relative 2**-11: far worse than div.full.f32's
    2 ulp or a rounded reciprocal. Divisors up to 2**27 (NVFP4's nearest rule divides by 3 g)."""
    n = 20_000
    a = significands(n)
    b = RNG.integers(2**23, 2**27, n, dtype=np.int64)
    b[: n // 2] = significands(n // 2, np.random.default_rng(1))
    shift = RNG.integers(23, 27, n)
    exact = (a << shift) // b
    estimate = (exact + offset).astype(np.float32)  # off by `offset`, and by float32's rounding
    off = np.abs(np.trunc(estimate.astype(np.float64)).astype(np.int64) - exact) + 1
    keep = (exact < 2**31) & (off * b < 2**31)  # the precondition, for the estimate as it is
    assert keep.mean() > 0.5
    a, b, shift, exact, estimate = a[keep], b[keep], shift[keep], exact[keep], estimate[keep]
    rcp = (1.0 / b * (1 + rcp_error)).astype(np.float32)
    f = jax.jit(lambda *v: ref.floor_quotient(*v))
    q, r = f(a.astype(np.uint32), shift.astype(np.int32), b.astype(np.uint32), estimate, rcp)
    np.testing.assert_array_equal(np.asarray(q).astype(np.int64), exact)
    np.testing.assert_array_equal(np.asarray(r).astype(np.int64), (a << shift) - exact * b)


def rn24(num, den):
    """RN_fp32 of num / den (positive Python ints), unbounded exponent, as (k, m)."""
    q = fractions.Fraction(num, den)
    k = q.numerator.bit_length() - q.denominator.bit_length()
    k -= q < fractions.Fraction(2) ** k  # now 2**k <= q < 2**(k + 1)
    t = q / fractions.Fraction(2) ** (k - 23)
    m = round(t)  # Python rounds half to even
    if m == 2**24:
        m, k = 2**23, k + 1
    return k, m


def test_divide_and_reciprocal_are_correctly_rounded():
    """ref.divide (the per-block divisions) and formats_xla's reciprocal and per-element division
    against exact rational arithmetic, ties included (significands with few bits)."""
    n = 4000
    ma, mb = significands(n), significands(n, np.random.default_rng(2))
    k, m = jax.jit(lambda a, b: ref.divide(0, a, 0, b))(ma.astype(np.int32), mb.astype(np.int32))
    want = [rn24(int(x), int(y)) for x, y in zip(ma, mb)]
    np.testing.assert_array_equal(np.asarray(k), [w[0] for w in want])
    np.testing.assert_array_equal(np.asarray(m), [w[1] for w in want])
    rcp = jax.jit(formats_xla.reciprocal)(mb.astype(np.int32))
    want = [rn24(2**23, int(y)) for y in mb]
    np.testing.assert_array_equal(np.asarray(rcp), [np.float32(w[1] * 2.0 ** (w[0] - 23)) for w in want])
    # per element: |x| as extended bits (exponent 3), divisor (kd = -2, mb); 16-bit significands
    # (bfloat16 / float16 inputs) take the short path
    for short in (False, True):
        ma_s = ma & ~0xFFFF if short else ma
        mag = ((3 + 127) << 23) | (ma_s & 0x7FFFFF)
        k, q = jax.jit(lambda *v: formats_xla.divided_quotient(*v, short=short))(
            mag.astype(np.int32), np.int32(-2), mb.astype(np.int32), rcp)
        k, q = np.asarray(k).astype(np.int64), np.asarray(q).astype(np.int64)
        carried = q == 2**24  # rounded up into the next binade, left unnormalised
        k, q = np.where(carried, k + 1, k), np.where(carried, 2**23, q)
        want = [rn24(int(x), int(y)) for x, y in zip(ma_s, mb)]
        np.testing.assert_array_equal(k, [w[0] + 5 for w in want])
        np.testing.assert_array_equal(q, [w[1] for w in want])


@pytest.mark.parametrize("elem", ["e4m3", "e5m2", "e2m1"])
def test_element_roundings_match_the_reference_rounding(elem):
    """The element roundings (round_magnitude on extended bits, round_quotient_to on a division's
    (k, q)): bit rounding in the format's normal range, an exact float32 addition in its
    subnormal range, against ref.round_to: every exponent from far below the subnormals to past
    the largest value, significands at and around every tie."""
    f = ref.ELEMENTS[elem][0]
    k = np.arange(-160, f.emax + 4)
    low = np.array([0, 1, 2**18, 2**19 - 1, 2**19, 2**19 + 1, 2**20, 2**21, 2**22, 2**22 + 1, 0x7FFFFF])
    low = np.concatenate([low, RNG.integers(0, 2**23, 64)])
    kk, mm = np.meshgrid(k, low | 2**23, indexing="ij")
    kk, mm = kk.ravel().astype(np.int32), mm.ravel().astype(np.int32)
    got = jax.jit(lambda t: formats_xla.round_magnitude(t, f))(((kk + 127) << 23) | (mm & 0x7FFFFF))
    want = jax.jit(lambda k, m: ref.round_to(jnp.zeros_like(k), k, m, f, saturate=True))(kk, mm)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # the division's output form: q in [2**23, 2**24], 2**24 standing for the next binade's 2**23
    got = jax.jit(lambda k, m: formats_xla.round_quotient_to(k, m, f))(kk, mm)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    got = jax.jit(lambda k, m: formats_xla.round_quotient_to(k - 1, m * 0 + 2**24, f))(kk, mm)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(
        lambda k: ref.round_to(jnp.zeros_like(k), k, jnp.full_like(k, 2**23), f, saturate=True))(kk)))


def exact_threshold(n, w, kd, md):
    """The largest float32 bit pattern below d = N * 2**w * md * 2**(kd - 23), by exact arithmetic
    (d is never a float32 value); +Inf's pattern where d is past float32's range."""
    d = fractions.Fraction(n * md) * fractions.Fraction(2) ** (w + kd - 23)
    e = d.numerator.bit_length() - d.denominator.bit_length()
    e -= fractions.Fraction(2) ** e > d  # 2**e <= d < 2**(e + 1)
    if e >= 128:
        return 0x7F800000
    quantum = fractions.Fraction(2) ** (max(e, -126) - 23)  # the float32 grid at d
    units = int(d // quantum)
    return int(np.float32(units * float(quantum)).view(np.uint32))


def test_truncated_product_is_exact():
    """The truncation of n * md * 2**(w + kd - 23) onto the float32 grid against exact rational
    arithmetic, for products that are normal, subnormal (down to 0) and past float32's range."""
    k = 400
    n = RNG.integers(2**23, 2**24, k) * 2 + 1
    n[:4] = [2**24 + 1, 2**25 - 1, 3 * 2**23 - 1, 7 * 2**22 - 1]
    md = significands(k)
    w = RNG.integers(-30, 5, k)
    kd = RNG.integers(-140, 150, k)
    kd[:6] = [-160, -151, -148, -127, 126, 134]
    got = jax.jit(formats_xla.truncated_product)(*(v.astype(np.int32) for v in (n, w, kd, md)))
    want = [exact_threshold(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(n, w, kd, md)]
    np.testing.assert_array_equal(np.asarray(got).astype(np.int64), want)


def nvfp4_code(x_bits, s_b, g):
    """RN_E2M1(RN24(RN24(|x| / g) / s_b)) of a float32 bit pattern, exponents unbounded, by exact
    rational arithmetic (rn24 above): the rule as docs/formats.md states it; 7 if s_b is 0."""
    x = fractions.Fraction(float(np.uint32(x_bits).view(np.float32)))
    if x == 0:
        return 0
    if s_b == 0:
        return 7
    k, m = rn24(x.numerator * g.denominator, x.denominator * g.numerator)
    w = fractions.Fraction(m) * fractions.Fraction(2) ** (k - 23)
    k, m = rn24(w.numerator * s_b.denominator, w.denominator * s_b.numerator)
    z = fractions.Fraction(m) * fractions.Fraction(2) ** (k - 23)
    grid = [fractions.Fraction(v) for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]
    best = min(range(8), key=lambda i: (abs(z - grid[i]), i % 2))  # nearest, ties to the even code
    return best


def test_nvfp4_thresholds_match_the_rule():
    """NVFP4's per-block thresholds (two roundings folded into 7 comparisons on |x|'s bits) against
    the rule itself in exact arithmetic: X_i is the largest float32 pattern whose code is <= i, found
    by bisection over the patterns (the code is monotone in |x|). E4M3 block scales from the
    smallest subnormal to 448, and 0; global scales from the smallest normal float32 up, powers of
    two and not (RN(1 / 2688): x / g lands on E2M1 ties times s_b)."""
    rng = np.random.default_rng(3)
    scales = np.concatenate([[0x00, 0x01, 0x07, 0x08, 0x38, 0x3C, 0x7E], rng.integers(1, 0x7F, 9)]).astype(np.uint32)
    gs = np.array([2.0**-126, 1 / 2688, 0.37, 1.0, 3.1e-30 / 7, 2.0**100, 2.0**120, 1.7e38], np.float32)
    sc, gg = np.meshgrid(scales, gs.view(np.uint32), indexing="ij")
    sc, gg = sc.ravel(), gg.ravel()

    def thresholds(code, g_bits):
        _, ks, ms = ref.decode(code, ref.E4M3)
        _, kg, mg = ref.decode(g_bits, ref.F32)
        return formats_xla.nvfp4_thresholds(ks, ms, kg, mg)
    got = np.asarray(jax.jit(thresholds)(sc, gg)).astype(np.int64)
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    for row, code, g_bits in zip(got, sc, gg):
        s_b = fractions.Fraction(float(e4m3[code]))
        g = fractions.Fraction(float(np.uint32(g_bits).view(np.float32)))
        for i, x_i in enumerate(row):
            lo, hi = -1, 0x7F800000  # code(lo) <= i (lo = -1: none), code(+Inf's pattern) taken as > i
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if nvfp4_code(mid, s_b, g) <= i else (lo, mid)
            # past the largest finite value the implementation may give +Inf's pattern: the same test
            assert x_i == lo or (lo == 0x7F7FFFFF and x_i == 0x7F800000), (hex(code), float(g), i, hex(x_i), hex(lo))


# --------------------------------------------------------------------------- the compiled program
def _reads_of_input(hlo: str) -> int:
    """How many instructions of the entry computation read its first parameter (x)."""
    entry = hlo[hlo.index("\nENTRY"):]
    param = re.search(r"%?([\w.-]+) = \S+ parameter\(0\)", entry).group(1)
    return sum(1 for line in entry.splitlines()[1:]
               if "parameter(0)" not in line and re.search(rf"[(,]\s*%?{re.escape(param)}[,)]", line))


@pytest.mark.parametrize("fmt", list(formats.FORMATS.values()), ids=lambda f: f.name)
def test_compiled_program_has_no_loop_and_reads_x_at_most_twice(fmt):
    """No while loop on XLA:CPU (the reference's long division had 2-3), and x is read by the
    amax reduction and the element loop only (NVFP4's default global scale: one read more)."""
    x = jnp.ones((64, 256), jnp.bfloat16)
    for g in ((None, np.float32(0.5)) if fmt.has_global_scale else (None,)):
        f = jax.jit(lambda v, g=g: gx.quantize(v, fmt, global_scale=g, backend="xla"))
        hlo = f.lower(x).compile().as_text()
        assert "while" not in hlo
        assert _reads_of_input(hlo) <= (3 if fmt.has_global_scale and g is None else 2), hlo
        q = f(x)
        hlo = jax.jit(lambda q: gx.dequantize(q, jnp.bfloat16, backend="xla")).lower(q).compile().as_text()
        assert "while" not in hlo


@pytest.mark.parametrize("fmt", list(formats.FORMATS.values()), ids=lambda f: f.name)
def test_lowered_for_cuda_has_no_loop_and_no_custom_call(fmt):
    """Lowered for CUDA on this CPU machine: what XLA:GPU receives has no while loop and no custom
    call (no GPU is needed to lower)."""
    x = jnp.ones((64, 256), jnp.bfloat16)

    def step(v):
        q = gx.quantize(v, fmt, backend="xla")
        return gx.dequantize(q, jnp.bfloat16, backend="xla")
    text = jax.jit(step).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.while" not in text and "custom_call" not in text


def test_a_constant_input_folded_by_xla_gives_the_same_bits():
    """Quantizing a compile-time constant lets XLA fold the block scales into constants, and XLA
    rewrites a division by a constant into a product with a rounded reciprocal: the estimates
    change, the bits must not."""
    x = random_blocks(5, 64, (128,), np.float32)
    for fmt in (gx.FP8_1x128, gx.FP8_TENSOR, gx.NVFP4):
        folded = jax.jit(lambda: gx.quantize(jnp.asarray(x), fmt, backend="xla"))()
        live = jax.jit(lambda v: gx.quantize(v, fmt, backend="reference"))(x)
        assert_bits_equal(folded.data, as_bits(live.data), f"{fmt.name} data")
        assert_bits_equal(folded.scale, as_bits(live.scale), f"{fmt.name} scale")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16], ids=["f32", "bf16", "f16"])
def test_tensor_amax_in_chunks(dtype):
    """The whole-tensor amax in chunks (reference.tensor_amax_bits: NVFP4's default global scale,
    FP8_TENSOR's scale) against NumPy on the fp32 bits: NaN / Inf ignored or winning, subnormals
    exact, any length (padding), empty tensors, per example under vmap."""
    def want(v, finite_only):
        a = np.abs(np.asarray(v, np.float32)).ravel()
        a = a[np.isfinite(a)] if finite_only else a
        if a.size == 0:
            return np.uint32(0)
        if not finite_only and np.isnan(a).any():
            return np.uint32(0x7FC00000)
        return a.max().view(np.uint32)
    x = random_blocks(9, 300, (37,), dtype)  # 11,100 elements, past one chunk and not a multiple
    for v in (x, x[:7, :5], x[3], x[6:7], np.zeros((0, 4), dtype), np.full((5, 3), np.inf, dtype)):
        for finite_only in (True, False):
            got = int(jax.jit(lambda v: ref.tensor_amax_bits(v, finite_only))(v))
            w = int(want(v, finite_only))
            assert got == w or (w == 0x7FC00000 and got > 0x7F800000), (v.shape, finite_only, hex(got), hex(w))
    got = jax.jit(jax.vmap(ref.global_amax_bits))(x.reshape(10, 30, 37))
    assert_bits_equal(got, np.stack([want(v, True) for v in x.reshape(10, -1)]), "vmapped amax")
