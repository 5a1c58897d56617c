"""Block-scaled formats: bit-exact against an independent float64 NumPy statement of the rules
(tests/_formats_numpy.py), the CPU handler, the ``xla`` backend and the jnp reference alike, bit
for bit; special values, partial blocks, jit/vmap, lowering and errors. CUDA comparisons live in
test_formats_gpu.py; what only the ``xla`` backend needs (its division, its HLO) in
test_formats_xla.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import _formats_numpy as npref
import jax_gpuext as gx
from jax_gpuext import formats

# The block formats; FP8_TENSOR (one scale per tensor) has its own tests at the end.
from jax_gpuext.common import ffi as _ffi
FORMATS = [f for f in formats.FORMATS.values() if not f.per_tensor]
IDS = [f.name for f in FORMATS]
# Every block format with its default scale rounding (None), and NVFP4 with its other one ("up").
FORMAT_ROUNDINGS = [(f, None) for f in FORMATS] + [(gx.NVFP4, "up")]
FR_IDS = [f.name if r is None else f"{f.name}-{r}" for f, r in FORMAT_ROUNDINGS]


def rounding_of(fmt, rounding):
    """The rounding the model applies: None means the format's default (docs/formats.md "The
    rules"), stated here independently of jax_gpuext's own default_scale_rounding."""
    return rounding if rounding is not None else ("nearest" if fmt is gx.NVFP4 else "up")
DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
BACKENDS = ["reference", "xla", "cpu"]  # every backend that runs on CPU
MX_ELEM = {"MXFP8_E4M3": npref.E4M3, "MXFP8_E5M2": npref.E5M2, "MXFP4": npref.E2M1}


# --------------------------------------------------------------------------- inputs
def random_blocks(seed, nblocks, block_shape, dtype):
    """nblocks blocks of block_shape, each with its own binary exponent spanning the dtype's range
    (subnormal blocks included), elements spread over 2**-12 .. 2**0 of it, plus special blocks:
    all zero, largest finite, -largest finite, NaN, +Inf, -Inf, subnormals mixed with zeros (as
    many of those seven as there are blocks: a call for 2 large tiles gets the first two)."""
    rng = np.random.default_rng(seed)
    fi = ml_dtypes.finfo(dtype)
    lo, hi = int(np.log2(float(fi.smallest_subnormal))) - 2, int(np.log2(float(fi.max))) + 1
    n = int(np.prod(block_shape))
    exps = rng.integers(lo, hi, size=(nblocks, 1))
    v = rng.standard_normal((nblocks, n)) * np.ldexp(1.0, rng.integers(-12, 1, size=(nblocks, n)))
    x = np.clip(np.ldexp(v, exps), -float(fi.max), float(fi.max))
    specials = {0: 0.0, 1: float(fi.max), 2: -float(fi.max), 3: np.nan, 4: np.inf, 5: -np.inf}
    for i, val in specials.items():
        if i >= nblocks:
            break
        if i < 3:
            x[i] = val
        else:
            x[i, rng.integers(n)] = val
    if nblocks > 6:
        x[6] = np.where(rng.random(n) < 0.5, 0.0, rng.integers(-5, 6, n) * float(fi.smallest_subnormal))
    x = x.astype(dtype)
    return x.reshape((nblocks,) + tuple(block_shape))


def as_bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def elem_bits(values, fmt):
    return as_bits(np.asarray(values).astype(fmt.elem_dtype))


def scale_bits(scale, fmt):
    s = np.asarray(scale, np.float64)
    if fmt.is_mx:  # scale holds the exponent
        return np.where(np.isnan(s), 0xFF, np.nan_to_num(s) + 127).astype(np.uint8)
    if fmt.scale_dtype == np.float32:
        return np.where(np.isnan(s), np.uint32(0x7FC00000), s.astype(np.float32).view(np.uint32))
    return np.where(np.isnan(s), np.uint8(0x7F), np.nan_to_num(s).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


# --------------------------------------------------------------------------- numpy expectation
def expected_quantize(x, fmt, axis=-1, rounding=None, g=None):
    """-> (element values float64 [x.shape], scale per block, g) following docs/formats.md."""
    rounding = rounding_of(fmt, rounding)
    if fmt is gx.FP8_128x128:
        xb, mn = npref.blocks_2d(x)
        data, scale = npref.fp8_blockwise(xb, (-3, -1))
        return npref.unblock_2d(np.broadcast_to(data, xb.shape), mn), scale[..., :, 0, :, 0], None
    xb, k = npref.blocks_1d(x, fmt.block[0], axis)
    if fmt.is_mx:
        data, scale = npref.mx(xb, MX_ELEM[fmt.name], rounding)
    elif fmt is gx.NVFP4:
        g = npref.nvfp4_global_scale(x) if g is None else np.float32(g)
        data, scale = npref.nvfp4(xb, g, rounding)
    else:
        data, scale = npref.fp8_blockwise(xb, -1)
    data = np.broadcast_to(data, xb.shape)
    return npref.unblock_1d(data, k, axis), np.moveaxis(scale[..., 0], -1, axis), g


def expected_dequantize(values, scale, fmt, out_dtype, axis=-1, g=None):
    shape = values.shape
    if fmt is gx.FP8_128x128:
        s = np.repeat(np.repeat(scale, 128, -2), 128, -1)[..., : shape[-2], : shape[-1]]
    else:
        s = np.take(np.repeat(scale, fmt.block[0], axis), np.arange(shape[axis]), axis)
    return npref.dequant(values, s, out_dtype, g=g, power_of_two=fmt.is_mx)


def block_shape(fmt):
    return (5, 6) if fmt is gx.FP8_128x128 else (4 * fmt.block[0],)


@functools.cache
def quantizer(fmt, backend, axis=-1, rounding=None):
    return jax.jit(lambda x: gx.quantize(x, fmt, axis=axis, scale_rounding=rounding, backend=backend))


@functools.cache
def nvfp4_quantizer(backend, rounding, axis=-1):
    """NVFP4 with the global scale as an argument (one compilation for every g)."""
    return jax.jit(lambda x, g: gx.quantize(x, gx.NVFP4, axis=axis, global_scale=g, scale_rounding=rounding,
                                            backend=backend))


@functools.cache
def dequantizer(backend, dtype):
    return jax.jit(lambda q: gx.dequantize(q, dtype, backend=backend))


def assert_bits_equal(actual, expected, what):
    a, e = as_bits(actual), np.asarray(expected)
    bad = np.flatnonzero(a.ravel() != e.ravel())
    assert bad.size == 0, f"{what}: {bad.size} of {a.size} differ, first at {bad[:5]}: {a.ravel()[bad[:5]]} vs {e.ravel()[bad[:5]]}"


# --------------------------------------------------------------------------- bit exactness
NBLOCKS = 10_000


@pytest.fixture(scope="module")
def big_inputs():
    # 1-D formats: 10,000 rows of 4 blocks; FP8_128x128: 10,000 (partial) 5x6 blocks
    return {f.name: random_blocks(i, NBLOCKS, block_shape(f), np.float32) for i, f in enumerate(FORMATS)}


@pytest.mark.parametrize("fmt,rounding", FORMAT_ROUNDINGS, ids=FR_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_quantize_bit_exact_10k_blocks(fmt, rounding, backend, big_inputs):
    x = big_inputs[fmt.name]
    q = quantizer(fmt, backend, rounding=rounding)(x)
    values, scale, g = expected_quantize(x, fmt, rounding=rounding)
    assert_bits_equal(q.data, elem_bits(values, fmt), f"{fmt.name} data")
    assert_bits_equal(q.scale, scale_bits(scale, fmt), f"{fmt.name} scale")
    if g is not None:
        assert as_bits(q.global_scale) == as_bits(np.float32(g))
    y = dequantizer(backend, jnp.float32)(q)
    expected = expected_dequantize(np.asarray(q.data).astype(np.float64), scale, fmt, np.float32, g=g)
    assert_bits_equal(y, as_bits(expected), f"{fmt.name} dequantized")


@pytest.mark.parametrize("fmt,rounding", FORMAT_ROUNDINGS, ids=FR_IDS)
@pytest.mark.parametrize("dtype", DTYPES[1:], ids=["bfloat16", "float16"])
def test_half_inputs_and_outputs_bit_exact(fmt, rounding, dtype):
    x = random_blocks(7, 400, block_shape(fmt), dtype)
    values, scale, g = expected_quantize(x, fmt, rounding=rounding)
    for backend in BACKENDS:
        q = quantizer(fmt, backend, rounding=rounding)(x)
        assert_bits_equal(q.data, elem_bits(values, fmt), f"{fmt.name} {backend} data")
        assert_bits_equal(q.scale, scale_bits(scale, fmt), f"{fmt.name} {backend} scale")
        y = dequantizer(backend, dtype)(q)
        expected = expected_dequantize(np.asarray(q.data).astype(np.float64), scale, fmt, dtype, g=g)
        assert_bits_equal(y, as_bits(expected), f"{fmt.name} {backend} dequantized to {np.dtype(dtype).name}")


def every_bf16_up_to(top):
    """Every bf16 value with |v| <= top (zeros, subnormals, both signs), as float32."""
    bits = np.arange(0x8000, dtype=np.uint16)
    v = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    v = v[np.isfinite(v) & (v <= top)]
    return np.concatenate([v, -v])


def sweep_blocks(top, b):
    """every_bf16_up_to(top) in rows of b - 1, each row ending in `top` (which fixes its block's
    amax), zero-padded to one shape whatever `top` (every finite bf16 value, 2 * 0x7F80, fits): one
    compilation per quantizer for all tops (the xla backend's NVFP4 takes ~1 s to compile)."""
    v = every_bf16_up_to(top)
    v = np.concatenate([v, np.zeros(-(-2 * 0x7F80 // (b - 1)) * (b - 1) - len(v), np.float32)]).reshape(-1, b - 1)
    return np.concatenate([v, np.full((len(v), 1), top, np.float32)], axis=1).astype(ml_dtypes.bfloat16)


SWEPT = ["cpu", "xla"]  # the backends with paths of their own for bf16 / division (the reference has none)
SWEPT_FORMATS = [(gx.MXFP8_E4M3, None), (gx.MXFP8_E5M2, None), (gx.MXFP4, None), (gx.NVFP4, None),
                 (gx.NVFP4, "up"), (gx.FP8_1x128, None)]


@pytest.mark.parametrize("backend", SWEPT)
@pytest.mark.parametrize("fmt,rounding", SWEPT_FORMATS, ids=[f.name + ("-up" if r else "") for f, r in SWEPT_FORMATS])
@pytest.mark.parametrize("top", [1.0, 3.0 * 2.0 ** -100, 1.5 * 2.0 ** 100, 448.0], ids=["1", "3e-100", "1.5e100", "448"])
def test_every_bf16_value_in_a_block_bit_exact(fmt, rounding, top, backend):
    """The CPU handler's bf16 paths (16-bit lanes for MX, batched block scales for all) and the
    xla backend's (extended bits, division by remainder, NVFP4's two divisions) against the float64
    model on every bf16 value up to a block's amax: every tie, every subnormal code.
    Each block holds `top` once (fixing its scale) and block-1 swept values; along the last axis
    (whole blocks) and along rows (the strided path). FP8_1x128 divides by top / 448, exact only
    for top = 448 (divisor 1): the one top at which its quotients land on E4M3's ties."""
    x = sweep_blocks(top, fmt.block[0])
    for axis, arr in ((-1, x), (0, np.ascontiguousarray(x.T))):
        values, scale, g = expected_quantize(arr, fmt, axis=axis, rounding=rounding)
        q = quantizer(fmt, backend, axis=axis, rounding=rounding)(arr)
        assert_bits_equal(q.data, elem_bits(values, fmt), f"{fmt.name} axis={axis} data")
        assert_bits_equal(q.scale, scale_bits(scale, fmt), f"{fmt.name} axis={axis} scale")


@pytest.mark.parametrize("backend", SWEPT)
@pytest.mark.parametrize("cols", [128, 100], ids=["whole_tiles", "partial_tiles"])
@pytest.mark.parametrize("top", [1.0, 1.5 * 2.0**100, 448.0 * 2.0**-20], ids=["1", "1.5e100", "448e-20"])
def test_every_bf16_value_fp8_tiles_and_per_tensor(cols, top, backend):
    """bf16 x FP8_128x128 and FP8_TENSOR divide on 16-bit lanes widened to fp32
    (QuantizeBf16Div: 32-element steps, then a scalar tail). Every bf16 value up to `top`, in
    rows of `cols` (100: each row's run is 3 steps and a 4-element tail) that all hold `top`, so
    each tile's and the tensor's amax is `top`; at 448 x 2^-20 the divisor is 2^-20, exact, so
    quotients land on E4M3's ties (checked: rounding ties down instead of to even fails here)."""
    v = every_bf16_up_to(top)
    v = np.concatenate([v, np.zeros((-len(v)) % (cols - 1), np.float32)]).reshape(-1, cols - 1)
    x = np.concatenate([v, np.full((len(v), 1), top, np.float32)], axis=1).astype(ml_dtypes.bfloat16)
    values, scale, _ = expected_quantize(x, gx.FP8_128x128)
    q = quantizer(gx.FP8_128x128, backend)(x)
    assert_bits_equal(q.data, elem_bits(values, gx.FP8_128x128), f"FP8_128x128 cols={cols} data")
    assert_bits_equal(q.scale, scale_bits(scale, gx.FP8_128x128), f"FP8_128x128 cols={cols} scale")
    values, scale = expected_per_tensor(x[None])
    q = per_tensor_quantizer(backend)(x[None])
    assert_bits_equal(q.data, elem_bits(values, gx.FP8_TENSOR), f"FP8_TENSOR cols={cols} data")
    assert_bits_equal(q.scale, scale_bits(scale, gx.FP8_TENSOR), f"FP8_TENSOR cols={cols} scale")


@pytest.mark.parametrize("backend", SWEPT)
@pytest.mark.parametrize("rounding", ["nearest", "up"])
@pytest.mark.parametrize("g", [2.0**-126, 2.0**-125, 2.0**-124, 2.0**-123, 2.0**-110, 2.0**100, 2.0**119, 2.0**120,
                               2.0**122, 0.37, 3.1e-30 / 7, 1 / 2688], ids=lambda g: f"{g:.3g}")
def test_nvfp4_bf16_every_value_at_extreme_divisors(g, rounding, backend):
    """bf16 x NVFP4 rounds by comparing |x| with 7 per-block thresholds computed in double
    (Nvfp4Table, by the block's E4M3 scale code and the global scale). Given global scales put
    the block divisor (E4M3 scale x g) at the smallest the path accepts (2^-124), below it (the
    division loop) and near the largest a block can reach (~2^125.6, bf16's largest amax), and two
    that are not powers of two, among them RN(1 / 2688), a tensor's with amax 1: with the block scale
    1.5 there, RN(x / g) lands exactly on E2M1 ties x 1.5 where x / (1.5 g) does not, so the order
    of the two divisions decides 4 elements (checked: dividing by RN(s_b g) instead fails);
    every bf16 value up to the block's amax."""
    g = np.float32(g)
    # A block amax of up to ~450 x 6g (the E4M3 scale near its top), capped at bf16's largest.
    tops = [float(np.float32(min(f * 6 * float(g), 3.3e38))) for f in (0.01, 1.0, 1.5, 300.0)]
    for top in tops:
        x = sweep_blocks(float(np.float32(ml_dtypes.bfloat16(top))), 16)
        values, scale, _ = expected_quantize(x, gx.NVFP4, g=g, rounding=rounding)
        q = nvfp4_quantizer(backend, rounding)(x, g)
        assert_bits_equal(q.data, elem_bits(values, gx.NVFP4), f"g={g} top={top} data")
        assert_bits_equal(q.scale, scale_bits(scale, gx.NVFP4), f"g={g} top={top} scale")


@pytest.mark.parametrize("rounding", ["nearest", "up"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16", "float16"])
def test_nvfp4_bit_exact_around_the_global_scale(rounding, dtype):
    """One global scale serves blocks within 2^18 of 6 g; random_blocks spans the whole dtype, so
    most of its NVFP4 blocks sit at the extremes. Here every block's amax lies between 2^-14 and
    2^10 times 6 g, for g a power of two, a value that is not (0.37: the order of the divisions
    by g and by the block scale matters) and g near both ends of fp32: zero scales (nearest: x / 0
    saturates), E4M3 subnormal, normal and saturated scales, elements on every E2M1 tie."""
    rng = np.random.default_rng(31)
    n = 2000
    extremes = () if dtype is np.float16 else (2.0**-120 * 1.3, 2.0**100 * 1.7)  # beyond float16's range
    for g in (1.0, 0.37) + extremes:
        g = np.float32(g)
        amax = 6 * float(g) * np.ldexp(1.0, rng.integers(-14, 11, (n, 1))) * rng.uniform(1, 2, (n, 1))
        x = rng.uniform(-1, 1, (n, 16)) * amax
        x[:, 0] = amax[:, 0]
        x = np.clip(x, -float(ml_dtypes.finfo(dtype).max), float(ml_dtypes.finfo(dtype).max)).astype(dtype)
        # A quarter of the blocks: E2M1 midpoints t times the block's scale s times g, rounded to
        # dtype, so that RN(x / g) often lands exactly on t * s while x / (s g) does not.
        _, s_block, _ = expected_quantize(x[:, :1], gx.NVFP4, g=g, rounding=rounding)
        ties = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], (n // 4, 15)) * rng.choice([-1, 1], (n // 4, 15))
        x[: n // 4, 1:] = (ties * s_block[: n // 4] * float(g)).astype(dtype)
        x[5] = 0  # an all-zero block
        values, scale, _ = expected_quantize(x, gx.NVFP4, g=g, rounding=rounding)
        assert (scale == 0).any() == (rounding == "nearest") and (scale == 448).any()
        for backend in BACKENDS:
            q = nvfp4_quantizer(backend, rounding)(x, g)
            what = f"NVFP4 {rounding} g={g} {np.dtype(dtype).name} {backend}"
            assert_bits_equal(q.data, elem_bits(values, gx.NVFP4), f"{what} data")
            assert_bits_equal(q.scale, scale_bits(scale, gx.NVFP4), f"{what} scale")
            y = dequantizer(backend, jnp.float32)(q)
            expected = expected_dequantize(np.asarray(q.data).astype(np.float64), scale, gx.NVFP4, np.float32, g=g)
            assert_bits_equal(y, as_bits(expected), f"{what} dequantized")
        # The strided path (blocks down the columns: each lane compares with its own block's
        # thresholds) on the same blocks.
        q = nvfp4_quantizer("cpu", rounding, 0)(np.ascontiguousarray(x.T), g)
        assert_bits_equal(q.data, elem_bits(values, gx.NVFP4).T, f"NVFP4 {rounding} g={g} axis=0 data")
        assert_bits_equal(q.scale, scale_bits(scale, gx.NVFP4).T, f"NVFP4 {rounding} g={g} axis=0 scale")


@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.MXFP8_E5M2, gx.MXFP4], ids=["MXFP8_E4M3", "MXFP8_E5M2", "MXFP4"])
def test_ocp_rounding_bit_exact(fmt):
    x = random_blocks(3, 2000, block_shape(fmt), np.float32)
    values, scale, _ = expected_quantize(x, fmt, rounding="ocp")
    for backend in BACKENDS:
        q = quantizer(fmt, backend, rounding="ocp")(x)
        assert_bits_equal(q.data, elem_bits(values, fmt), f"{fmt.name} {backend} ocp data")
        assert_bits_equal(q.scale, scale_bits(scale, fmt), f"{fmt.name} {backend} ocp scale")


@pytest.mark.parametrize("backend", ["cpu", "xla"])
@pytest.mark.parametrize("nblocks", [1, 2, 7], ids=["1", "2", "7"])
def test_fp8_128x128_few_large_tiles_bit_exact(nblocks, backend):
    """A few large, ragged FP8_128x128 inputs, the shape of the GPU test's ragged-tile cases (the
    first GPU run's IndexError: the input helper assumed at least seven blocks)."""
    x = random_blocks(14, nblocks, (300, 260), ml_dtypes.bfloat16)
    assert x.shape == (nblocks, 300, 260)
    got = quantizer(gx.FP8_128x128, backend)(x)
    want = quantizer(gx.FP8_128x128, "reference")(x)
    assert_bits_equal(got.data, as_bits(np.asarray(want.data)), f"FP8_128x128 {backend} data")
    assert_bits_equal(got.scale, as_bits(np.asarray(want.scale)), f"FP8_128x128 {backend} scale")


@pytest.mark.parametrize("fmt,rounding", FORMAT_ROUNDINGS, ids=FR_IDS)
def test_partial_blocks_and_axes(fmt, rounding):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 150, 131)) * 10).astype(np.float32)
    axes = [-1] if fmt is gx.FP8_128x128 else [-1, 1]
    for axis in axes:
        values, scale, g = expected_quantize(x, fmt, axis=axis, rounding=rounding)
        for backend in BACKENDS:
            q = quantizer(fmt, backend, axis=axis, rounding=rounding)(x)
            assert q.data.shape == x.shape and q.scale.shape == formats.scale_shape(x.shape, fmt, axis)
            assert_bits_equal(q.data, elem_bits(values, fmt), f"{fmt.name} axis={axis} {backend}")
            assert_bits_equal(q.scale, scale_bits(scale, fmt), f"{fmt.name} axis={axis} {backend} scale")
            y = dequantizer(backend, jnp.float32)(q)
            expected = expected_dequantize(np.asarray(q.data).astype(np.float64), scale, fmt, np.float32, axis, g)
            assert_bits_equal(y, as_bits(expected), f"{fmt.name} axis={axis} {backend} dequantized")


# --------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_special_values(fmt):
    """A block holding NaN or Inf dequantizes to NaN; all-zero blocks to zeros; others stay finite."""
    b = 128 if fmt is gx.FP8_128x128 else fmt.block[0]
    x = np.ones((256, 256), np.float32)
    x[0, 1], x[1, 3] = np.nan, -np.inf
    x[128:, 128:] = 0.0
    special = np.zeros(x.shape, bool)
    if fmt is gx.FP8_128x128:
        special[:128, :128] = True
    else:
        special[:2, :b] = True
    for backend in BACKENDS:
        y = np.asarray(dequantizer(backend, jnp.float32)(quantizer(fmt, backend)(x)))
        assert np.isnan(y[special]).all() and not np.isnan(y[~special]).any()
        assert (y[128:, 128:] == 0).all() and (y[~special] != 0).sum() == (x[~special] != 0).sum()


def test_nvfp4_global_scale_given_and_invalid():
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    values, scale, _ = expected_quantize(x, gx.NVFP4, g=0.01)
    for backend in BACKENDS:
        f = jax.jit(functools.partial(lambda v, g, b: gx.quantize(v, gx.NVFP4, global_scale=g, backend=b), b=backend))
        q = f(x, np.float32(0.01))
        assert_bits_equal(q.data, elem_bits(values, gx.NVFP4), f"nvfp4 g=0.01 {backend}")
        assert_bits_equal(q.scale, scale_bits(scale, gx.NVFP4), f"nvfp4 g=0.01 {backend} scale")
        for bad in (0.0, -1.0, np.inf, 1e-40):
            y = dequantizer(backend, jnp.float32)(f(x, np.float32(bad)))
            assert np.isnan(np.asarray(y)).all(), (backend, bad)


@pytest.mark.parametrize("fmt,rounding", FORMAT_ROUNDINGS, ids=FR_IDS)
def test_round_trip_error_bound(fmt, rounding):
    """|x - deq(q(x))| <= 2**-(mbits+1) * block scale * 2**ceil(log2 amax/scale) (half an ulp at the
    block's top binade; docs/formats.md), checked as a relative bound against the block amax."""
    x = np.random.default_rng(5).standard_normal((64, 256)).astype(np.float32) * 4
    y = np.asarray(gx.dequantize(gx.quantize(x, fmt, scale_rounding=rounding)))
    mbits = {gx.NVFP4: 1, gx.MXFP4: 1, gx.MXFP8_E5M2: 2}.get(fmt, 3)
    if fmt is gx.FP8_128x128:
        amax = np.abs(x).reshape(1, 64, 2, 128).max(axis=(1, 3), keepdims=True)
        amax = np.broadcast_to(amax, (1, 64, 2, 128)).reshape(64, 256)
    else:
        b = fmt.block[0]
        amax = np.repeat(np.abs(x).reshape(64, -1, b).max(-1), b, -1)
    # elements of the top binade of a block are rounded with a step of 2**-mbits relative to it
    bound = amax * 2.0 ** -mbits * (0.5 if fmt is gx.NVFP4 else 1)
    assert (np.abs(y - x) <= bound).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_jit_vmap_and_pytree(backend):
    """vmap == a loop of single calls, bit for bit; NVFP4 gets one global scale per example."""
    x = np.random.default_rng(2).standard_normal((3, 4, 64)).astype(np.float32)
    x[1] *= 1000.0
    for fmt in FORMATS:
        qv = jax.jit(jax.vmap(lambda v: gx.quantize(v, fmt, backend=backend)))(x)
        per = [quantizer(fmt, backend)(x[i]) for i in range(3)]
        for name in ("data", "scale", "global_scale"):
            if getattr(per[0], name) is not None:
                want = np.stack([as_bits(getattr(p, name)) for p in per])
                assert_bits_equal(getattr(qv, name), want, f"{fmt.name} vmap {name} {backend}")
        want = np.stack([as_bits(dequantizer(backend, jnp.float32)(p)) for p in per])
        yv = jax.jit(jax.vmap(lambda q: gx.dequantize(q, backend=backend)))(qv)
        assert_bits_equal(yv, want, f"{fmt.name} vmap dequantize {backend}")
        assert_bits_equal(dequantizer(backend, jnp.float32)(qv), want, f"{fmt.name} batched dequantize {backend}")
        leaves, tree = jax.tree_util.tree_flatten(qv)
        assert len(leaves) == (3 if fmt.has_global_scale else 2)
        assert jax.tree_util.tree_unflatten(tree, leaves).format is fmt


def test_blackwell_scale_layout_round_trip():
    s = jnp.arange(3 * 130 * 7, dtype=jnp.int32).reshape(3, 130, 7)
    t = gx.to_blackwell_scale_layout(s)
    assert t.shape == (3, 256, 8)
    # tiles are stored one after another (512 entries each); (row r, col c) of a 128x4 tile sits
    # at 16*(r%32) + 4*(r//32) + c within it (cuBLAS "1D block scaling factors layout")
    tile = np.asarray(t[0]).reshape(-1)[:512]
    r, c = 37, 2
    assert tile[16 * (r % 32) + 4 * (r // 32) + c] == np.asarray(s)[0, r, c]
    np.testing.assert_array_equal(gx.from_blackwell_scale_layout(t, s.shape), s)


# --------------------------------------------------------------------------- lowering, dispatch, errors
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_lowered_hlo_names_our_custom_calls(fmt, monkeypatch):
    x = jnp.ones((4, 256), jnp.float32)
    f = lambda v: gx.quantize(v, fmt).dequantize(jnp.bfloat16)  # noqa: E731
    text = jax.jit(f).lower(x).as_text()
    assert "gpuext_quantize" in text and "gpuext_dequantize" in text
    monkeypatch.setenv("JAX_GPUEXT_FORCE_REFERENCE", "quantize,dequantize")
    jax.clear_caches()
    text = jax.jit(f).lower(x).as_text()
    assert "gpuext_quantize" not in text and "gpuext_dequantize" not in text


def test_explain_shows_the_choice():
    e = gx.explain(lambda v: gx.quantize(v, gx.MXFP8_E4M3).dequantize(), jnp.ones((2, 64)))
    assert [c.op for c in e.calls] == ["quantize", "dequantize"]
    assert e.calls[0].chosen == ("cuda" if e.platform == "cuda" else "cpu")
    assert "reference" in dict(e.calls[0].rejected)


def test_errors():
    x = jnp.ones((4, 64), jnp.float32)
    with pytest.raises(ValueError, match="axis 2 is out of range.*shape \\(4, 64\\)"):
        gx.quantize(x, gx.MXFP8_E4M3, axis=2)
    with pytest.raises(ValueError, match="axis must be -1"):
        gx.quantize(x, gx.FP8_128x128, axis=0)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16, got int32"):
        gx.quantize(jnp.ones((4, 64), jnp.int32), gx.MXFP8_E4M3)
    with pytest.raises(ValueError, match="global_scale must be a scalar.*\\(2,\\)"):
        gx.quantize(x, gx.NVFP4, global_scale=jnp.ones(2))
    with pytest.raises(ValueError, match="has no global scale"):
        gx.quantize(x, gx.MXFP8_E4M3, global_scale=1.0)
    with pytest.raises(ValueError, match="unknown block format 'MXFP6'"):
        gx.quantize(x, "MXFP6")
    with pytest.raises(TypeError, match="use jax_gpuext.NVFP4"):  # a name where a BlockFormat must be
        gx.BlockScaledArray(jnp.zeros((4, 64), jnp.float4_e2m1fn), jnp.ones((4, 4), jnp.float8_e4m3fn),
                            jnp.float32(1), "nvfp4", -1)
    with pytest.raises(TypeError, match="BlockFormat"):
        gx.quantize(x, 3)
    with pytest.raises(ValueError, match="'ocp'.*NVFP4"):
        gx.quantize(x, gx.NVFP4, scale_rounding="ocp")
    with pytest.raises(ValueError, match="'nearest'.*NVFP4 only; MXFP8_E4M3 takes 'up' or 'ocp'"):
        gx.quantize(x, gx.MXFP8_E4M3, scale_rounding="nearest")
    with pytest.raises(ValueError, match="'nearest'.*NVFP4 only; FP8_1x128 takes 'up'"):
        gx.quantize(x, gx.FP8_1x128, scale_rounding="nearest")
    with pytest.raises(ValueError, match="scale_rounding must be None .* or one of"):
        gx.quantize(x, gx.MXFP8_E4M3, scale_rounding="down")
    with pytest.raises(ValueError, match="rank >= 2"):
        gx.quantize(jnp.ones(128), gx.FP8_128x128)
    with pytest.raises(TypeError, match=r"dtype must be one of \['float32', 'bfloat16', 'float16'\], got int8"):
        gx.dequantize(gx.quantize(x, gx.MXFP8_E4M3), jnp.int8)
    assert gx.quantize(x, "NVFP4").format is gx.NVFP4


def test_handlers_reject_a_data_buffer_of_another_shape():
    """The handlers take every index from x (quantize) / the output (dequantize): a direct caller's
    data buffer of another shape must be an error, not an out-of-bounds access."""
    attrs = dict(format=np.int32(gx.MXFP8_E4M3.code), axis=np.int64(-1), fp4_packed=np.int32(0))
    e4m3, e8m0, g = jnp.float8_e4m3fn, jnp.float8_e8m0fnu, jnp.ones((), jnp.float32)
    out = (jax.ShapeDtypeStruct((4, 32), e4m3), jax.ShapeDtypeStruct((4, 2), e8m0))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"shape \[4, 32\] but x has shape \[4, 64\]"):
        _ffi.ffi_call(formats.QUANTIZE_TARGET, out, jnp.ones((4, 64)), g, scale_rounding=np.int32(0), **attrs)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"shape \[4, 64\] but output has shape \[4, 32\]"):
        _ffi.ffi_call(formats.DEQUANTIZE_TARGET, jax.ShapeDtypeStruct((4, 32), jnp.float32),
                      jnp.ones((4, 64), e4m3), jnp.ones((4, 2), e8m0), g, **attrs)


# --------------------------------------------------------------------------- FP8_TENSOR
def expected_per_tensor(x):
    """FP8_TENSOR of each x[i] (a tensor per leading index): (values, scales) by the FP8 blockwise
    rule of tests/_formats_numpy.py with the whole tensor as the block."""
    flat = np.asarray(x, np.float64).reshape(x.shape[0], -1)
    data, scale = npref.fp8_blockwise(flat, -1)
    return np.broadcast_to(data, flat.shape).reshape(x.shape), scale[:, 0]


@functools.cache
def per_tensor_quantizer(backend):
    """One FP8_TENSOR quantization per leading index, through vmap (the batched handler path)."""
    return jax.jit(jax.vmap(lambda v: gx.quantize(v, gx.FP8_TENSOR, backend=backend)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16", "float16"])
def test_per_tensor_bit_exact_10k_tensors(backend, dtype):
    """10,000 small tensors with their own binary exponents, specials included (a NaN or Inf
    anywhere makes that whole tensor NaN); data, scale and dequantized values bit for bit."""
    x = random_blocks(21, NBLOCKS, (3, 11), dtype)
    q = per_tensor_quantizer(backend)(x)
    values, scale = expected_per_tensor(x)
    assert q.scale.shape == (NBLOCKS,) and q.data.shape == x.shape
    assert_bits_equal(q.data, elem_bits(values, gx.FP8_TENSOR), f"FP8_TENSOR {backend} data")
    assert_bits_equal(q.scale, scale_bits(scale, gx.FP8_TENSOR), f"FP8_TENSOR {backend} scale")
    out = np.float32 if dtype is np.float32 else dtype
    y = jax.jit(jax.vmap(lambda v: gx.dequantize(v, out, backend=backend)))(q)
    expected = npref.dequant(np.asarray(q.data).astype(np.float64), scale[:, None, None], out)
    assert_bits_equal(y, as_bits(expected), f"FP8_TENSOR {backend} dequantized")


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_tensor_one_scale_for_any_shape_and_axis(backend):
    x = (np.random.default_rng(8).standard_normal((3, 150, 131)) * 10).astype(np.float32)
    values, scale = expected_per_tensor(x[None])
    for axis in (-1, 0, 1):
        q = jax.jit(lambda v: gx.quantize(v, gx.FP8_TENSOR, axis=axis, backend=backend))(x)
        assert q.scale.shape == () and q.axis == (axis - 3 if axis >= 0 else axis)
        assert_bits_equal(q.data, elem_bits(values[0], gx.FP8_TENSOR), f"FP8_TENSOR axis={axis} {backend}")
        assert_bits_equal(q.scale, scale_bits(scale[0], gx.FP8_TENSOR), f"FP8_TENSOR axis={axis} scale")
    y = np.asarray(gx.dequantize(q, backend=backend))
    amax = np.abs(x).max()
    assert (np.abs(y - x) <= amax * 2.0 ** -4).all()  # half an E4M3 ulp at the top binade (docs/formats.md)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_tensor_specials_and_empty(backend):
    x = np.ones((4, 8), np.float32)
    x[2, 5] = np.inf
    y = np.asarray(gx.dequantize(gx.quantize(x, gx.FP8_TENSOR, backend=backend), backend=backend))
    assert np.isnan(y).all()
    z = gx.quantize(np.zeros((4, 8), np.float32), gx.FP8_TENSOR, backend=backend)
    assert float(z.scale) == 1.0 and not np.asarray(z.data.astype(jnp.float32)).any()
    e = gx.quantize(np.zeros((0, 8), np.float32), gx.FP8_TENSOR, backend=backend)
    assert e.data.shape == (0, 8) and float(e.scale) == 1.0
    # a vmapped batch of empty tensors still gets one scale each
    ev = per_tensor_quantizer(backend)(np.zeros((3, 0, 8), np.float32))
    np.testing.assert_array_equal(np.asarray(ev.scale), np.ones(3, np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_tensor_vmapped_dequantizes_outside_vmap(backend):
    """Quantized under (nested) vmap, the scale holds the leading batch dims ((B,) or (B1, B2));
    dequantizing the whole batch at once must equal dequantizing each example on its own."""
    x = random_blocks(23, 12, (5, 8), np.float32)  # specials included: zero, +-max, NaN, Inf tensors
    one = dequantizer(backend, jnp.float32)
    for batch in ((12,), (3, 4)):
        f = lambda v: gx.quantize(v, gx.FP8_TENSOR, backend=backend)  # noqa: E731
        for _ in batch:
            f = jax.vmap(f)
        q = jax.jit(f)(x.reshape(batch + (5, 8)))
        assert q.scale.shape == batch
        flat = jax.tree_util.tree_map(lambda a: a.reshape((12,) + a.shape[len(batch):]), q)
        want = np.stack([as_bits(one(jax.tree_util.tree_map(lambda a: a[i], flat))) for i in range(12)])
        assert_bits_equal(one(q), want.reshape(batch + (5, 8)), f"FP8_TENSOR batch {batch} dequantize {backend}")


def test_per_tensor_lowers_to_our_custom_calls():
    text = jax.jit(lambda v: gx.quantize(v, gx.FP8_TENSOR).dequantize()).lower(jnp.ones((4, 64))).as_text()
    assert "gpuext_quantize" in text and "gpuext_dequantize" in text


# --------------------------------------------------------------------------- MXFP4 against jax.nn
def _jax_nn_mxfp4_quantizer():
    """jax.nn 0.12's own mxfp4 quantizer (the one scaled_dot_general uses), or a skip."""
    try:
        config = jax.nn.get_scaled_dot_general_config("mxfp4")
        from jax._src.cudnn.scaled_matmul_stablehlo import quantize as jax_nn_quantize
    except (ValueError, ImportError, AttributeError) as e:
        pytest.skip(f"jax {jax.__version__} has no mxfp4 quantizer ({e})")
    return jax.jit(lambda x: jax_nn_quantize(x, config))


def test_mxfp4_matches_jax_nn():
    """Scales and elements equal jax.nn 0.12's bit for bit on 10,000 blocks, except where
    docs/formats.md says they differ: all-zero blocks (jax.nn: E8M0 0x00, ours 0x7F = 1.0) and
    blocks whose amax lies where XLA's FTZ flushes jax.nn's float division (excluded here)."""
    theirs_q = _jax_nn_mxfp4_quantizer()
    rng = np.random.default_rng(19)
    n = NBLOCKS
    exps = rng.integers(-90, 90, size=(n, 1))
    x = np.ldexp(rng.standard_normal((n, 32)) * np.ldexp(1.0, rng.integers(-10, 1, (n, 32))), exps)
    x[0] = 0.0  # an all-zero block
    x[1, :] = 6.0 * 2.0 ** 5  # exactly elem_max * 2**e: the "up" boundary
    x[2] = 1.0
    x[2, 0] = np.nextafter(np.float32(6.0 * 2.0 ** 5), np.float32(np.inf))  # one ulp above it
    x[3] = rng.choice([0.25, 0.75, 2.5, 5.0, -0.25, -5.0], 32)  # E2M1 ties at scale 1
    x[3, 0] = 6.0
    x = x.astype(np.float32)
    data, scale = theirs_q(x.reshape(1, n, 32).reshape(1, n * 32))
    ours = quantizer(gx.MXFP4, "cpu")(x.reshape(1, n * 32))
    their_scale, our_scale = as_bits(scale).reshape(n), as_bits(ours.scale).reshape(n)
    their_data, our_data = as_bits(data).reshape(n, 32), as_bits(ours.data).reshape(n, 32)
    assert their_scale[0] == 0x00 and our_scale[0] == 0x7F  # the documented all-zero difference
    assert (their_data[0] == 0).all() and (our_data[0] == 0).all()
    assert_bits_equal(our_scale[1:], their_scale[1:], "MXFP4 scales vs jax.nn")
    assert_bits_equal(our_data[1:], their_data[1:], "MXFP4 elements vs jax.nn")
    assert our_scale[1] == 127 + 5 and our_scale[2] == 127 + 6


def test_format_names_match_case_insensitively():
    """"mxfp8_e4m3" / "nvfp4" (other libraries' spelling) name the same format as the constants."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 256)), jnp.bfloat16)
    for fmt in formats.FORMATS.values():
        for name in (fmt.name, fmt.name.lower(), fmt.name.upper()):
            assert formats.format_named(name) is fmt
        a, b = gx.quantize(x, fmt.name.lower()), gx.quantize(x, fmt)
        assert a.format is fmt
        np.testing.assert_array_equal(np.asarray(a.data).view(np.uint8), np.asarray(b.data).view(np.uint8))
    with pytest.raises(ValueError, match="scaled_dot_general: unknown format 'mxfp6'"):
        formats.format_named("mxfp6", "scaled_dot_general", "format")
