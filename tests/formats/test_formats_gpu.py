"""CUDA kernels == jnp reference, bit for bit (run under JAX_GPUEXT_REQUIRE_GPU=1 on a GPU
machine; skipped elsewhere), and the float4_e2m1fn device-buffer layout XLA uses."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext import formats
from test_formats import DTYPES, FORMATS, IDS, as_bits, assert_bits_equal, block_shape, random_blocks

pytestmark = [pytest.mark.gpu, pytest.mark.verifies("formats.cuda")]


def test_float4_buffer_layout():
    """XLA's CUDA float4_e2m1fn layout, measured by jax_gpuext.formats.fp4_layout (an XLA-written buffer
    read back through gpuext_dequantize as packed): one our handlers read, and what FP4_PACKED
    hands them. Packed high nibble first would need the packing in csrc/formats/block_scaled_io.h
    and the kernels to change; the backends refuse it meanwhile (test_fp4_layout.py)."""
    from jax_gpuext.formats import fp4_layout

    fp4_layout.forget()
    layout = fp4_layout.probe("cuda")
    assert layout.layout in (fp4_layout.LOW_FIRST, fp4_layout.ONE_PER_BYTE), layout.describe()
    assert formats.FP4_PACKED["cuda"] == layout.packed
    print(layout.describe())  # the results file keeps it


@pytest.mark.verifies("formats.cuda", feature="{fmt.name}")
@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16", "float16"])
def test_cuda_matches_reference_bit_for_bit(fmt, dtype):
    dev = jax.devices("cuda")[0]
    x = jax.device_put(random_blocks(11, 10_000, block_shape(fmt), dtype), dev)
    cases = [(x, -1)]
    if fmt is not gx.FP8_128x128:  # strided layout and partial blocks
        cases.append((jax.device_put(np.asarray(random_blocks(12, 300, (3 * fmt.block[0] + 8,), dtype)).T, dev), 0))
        cases.append((jax.device_put(np.asarray(random_blocks(13, 64, (fmt.block[0] + 8,), dtype)), dev), -1))
        # odd inner size and odd element count: packed FP4 pairs straddle rows, and the last
        # (bytes % 4) bytes come from QuantizeStridedFp4Tail instead of word atomics
        cases.append((jax.device_put(np.asarray(random_blocks(19, 301, (fmt.block[0] + 5,), dtype)).T, dev), 0))
    else:  # ragged tiles: N % 8 != 0 (one element per thread) and N % 8 == 0 (8 per thread)
        cases.append((jax.device_put(np.asarray(random_blocks(14, 8, (300, 260), dtype)), dev), -1))
        cases.append((jax.device_put(np.asarray(random_blocks(18, 8, (200, 264), dtype)), dev), -1))
    for xi, axis in cases:
        got = _quantize(fmt, "cuda", axis)(xi)
        want = _quantize(fmt, "reference", axis)(xi)
        assert_bits_equal(got.data, as_bits(np.asarray(want.data)), f"{fmt.name} cuda data axis={axis}")
        assert_bits_equal(got.scale, as_bits(np.asarray(want.scale)), f"{fmt.name} cuda scale axis={axis}")
        for out in (jnp.float32, jnp.bfloat16):
            y = _dequantize(out, "cuda")(want)
            y_ref = _dequantize(out, "reference")(want)
            assert_bits_equal(y, as_bits(np.asarray(y_ref)), f"{fmt.name} cuda dequantize axis={axis}")


def test_cuda_vmap_and_hlo():
    dev = jax.devices("cuda")[0]
    x = jax.device_put(np.random.default_rng(0).standard_normal((3, 8, 64)).astype(np.float32), dev)
    f = jax.jit(jax.vmap(lambda v: gx.quantize(v, gx.NVFP4, backend="cuda")))
    assert "gpuext_quantize" in f.lower(x).as_text()
    got, want = f(x), [gx.quantize(x[i], gx.NVFP4, backend="reference") for i in range(3)]
    for i in range(3):
        assert_bits_equal(got.scale[i], as_bits(np.asarray(want[i].scale)), "vmap NVFP4 scale")


@pytest.mark.verifies("formats.cuda", feature="FP8_TENSOR")
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16", "float16"])
def test_cuda_per_tensor_matches_reference(dtype):
    """FP8_TENSOR's three kernels (amax, quantize, finalize): vectorized (K % 8 == 0) and scalar
    paths, one big tensor (many CTAs meet in one atomicMax), 10,000 vmapped tensors, empty ones."""
    dev = jax.devices("cuda")[0]
    rng = np.random.default_rng(15)
    cases = [
        random_blocks(16, 10_000, (3, 16), dtype),  # vmapped, K = 48: vector path
        random_blocks(17, 2_000, (5, 7), dtype),  # vmapped, K = 35: scalar path
        (rng.standard_normal((1, 2048, 1536)) * 7).astype(dtype),  # one big tensor
        np.zeros((4, 0, 8), dtype),  # empty tensors: scale 1
    ]
    for x in cases:
        xd = jax.device_put(x, dev)
        got = jax.jit(jax.vmap(lambda v: gx.quantize(v, gx.FP8_TENSOR, backend="cuda")))(xd)
        want = jax.jit(jax.vmap(lambda v: gx.quantize(v, gx.FP8_TENSOR, backend="reference")))(xd)
        assert_bits_equal(got.data, as_bits(np.asarray(want.data)), f"FP8_TENSOR cuda data {x.shape}")
        assert_bits_equal(got.scale, as_bits(np.asarray(want.scale)), f"FP8_TENSOR cuda scale {x.shape}")
        y = jax.jit(jax.vmap(lambda q: gx.dequantize(q, jnp.bfloat16, backend="cuda")))(want)
        y_ref = jax.jit(jax.vmap(lambda q: gx.dequantize(q, jnp.bfloat16, backend="reference")))(want)
        assert_bits_equal(y, as_bits(np.asarray(y_ref)), f"FP8_TENSOR cuda dequantize {x.shape}")


# --------------------------------------------------------------------------- issue 35: the vector kernels
from test_formats import sweep_blocks  # noqa: E402

ALL_FORMATS = list(formats.FORMATS.values())
FORMAT_ROUNDINGS_GPU = [(f, None) for f in ALL_FORMATS] + [(gx.NVFP4, "up")]


# One jitted function per (format, backend, ...) for the whole module: jax then compiles once per
# shape, and the dequantize programs (whose operands are codes and scales, the same whatever the
# input dtype was) serve every input dtype and sweep. The GPU script's formats step has a time bound.
@functools.cache
def _quantize(fmt, backend, axis=-1, rounding=None):
    return jax.jit(lambda v: gx.quantize(v, fmt, axis=axis, scale_rounding=rounding, backend=backend))


@functools.cache
def _dequantize(out, backend):
    return jax.jit(lambda q: gx.dequantize(q, out, backend=backend))


@functools.cache
def _both_axes(fmt, rounding=None):
    return jax.jit(lambda v: gx.quantize_both_axes(v, fmt, scale_rounding=rounding, backend="cuda"))


def _same_quantized(got, want, what):
    assert_bits_equal(got.data, as_bits(np.asarray(want.data)), f"{what} data")
    assert_bits_equal(got.scale, as_bits(np.asarray(want.scale)), f"{what} scale")


@pytest.mark.run_first(2)
@pytest.mark.verifies("formats.cuda", feature="{fmt.name}")
@pytest.mark.parametrize("fmt,rounding", FORMAT_ROUNDINGS_GPU,
                         ids=[f.name + ("-up" if r else "") for f, r in FORMAT_ROUNDINGS_GPU])
@pytest.mark.parametrize("top", [1.0, 3.0 * 2.0 ** -100, 1.5 * 2.0 ** 100, 448.0], ids=["1", "3e-100", "1.5e100", "448"])
def test_cuda_every_bf16_value_bit_exact(fmt, rounding, top):
    """Every bf16 value up to a block's amax through the vector kernels (the hardware E4M3 / E5M2
    conversions, the exact division by the block reciprocal, E2M1 by one add, NVFP4's thresholds):
    along the last axis (row kernel), down the columns (column kernel, also through the fused both-axes
    kernel), and dequantized to bf16, f16 and f32 -- against the reference bit for bit."""
    dev = jax.devices("cuda")[0]
    b = 32 if fmt.per_tensor else (128 if len(fmt.block) == 2 else fmt.block[0])
    x = sweep_blocks(top, b)  # rows of b values, each holding `top`
    x = x[: (len(x) // 16) * 16]
    cases = [(x, -1), (np.ascontiguousarray(x.T), -2)]
    if len(fmt.block) == 2:
        cases = [(x, -1), (np.ascontiguousarray(x.reshape(-1, 256)), -1)]
    for arr, axis in cases:
        xd = jax.device_put(arr, dev)
        got = _quantize(fmt, "cuda", axis, rounding)(xd)
        want = _quantize(fmt, "reference", axis, rounding)(xd)
        _same_quantized(got, want, f"{fmt.name} top={top} axis={axis}")
        if len(fmt.block) != 2 and not fmt.per_tensor:
            pair = _both_axes(fmt, rounding)(xd)
            _same_quantized(pair[0], _quantize(fmt, "reference", -1, rounding)(xd), f"{fmt.name} both axes, -1")
            _same_quantized(pair[1], _quantize(fmt, "reference", -2, rounding)(xd), f"{fmt.name} both axes, -2")
        for out in (jnp.float32, jnp.bfloat16, jnp.float16):
            y = _dequantize(out, "cuda")(want)
            y_ref = _dequantize(out, "reference")(want)
            assert_bits_equal(y, as_bits(np.asarray(y_ref)), f"{fmt.name} top={top} axis={axis} dequantize {out}")


@pytest.mark.run_first(1)
@pytest.mark.verifies("formats.cuda", feature="{fmt.name}")
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=[f.name for f in ALL_FORMATS])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16", "float16"])
def test_cuda_vector_layouts_bit_exact(fmt, dtype):
    """Shapes that take each kernel: whole blocks, rows with a partial last block (K % 16 == 0, K % 32
    != 0: the row kernel's padded lane groups), columns with partial blocks and inner sizes that are
    not a multiple of 16, ragged tiles, a batch dim, and shapes the vector kernels refuse (the
    generic kernels); random_blocks' specials."""
    dev = jax.devices("cuda")[0]
    rng = np.random.default_rng(35)
    # round 3's column kernel takes inner % 8 == 0 (16-bit) / % 4 == 0 (f32): (3, 40, 56) is 8 mod 16
    # with a batch and a ragged K; (2, 36, 20) stores 2 bytes of packed FP4 a lane (f32), and its rows
    # (20) and 16-bit columns take the generic kernels
    # (2, 200, 264): K % 128 == 72, so the second CTA of the fused FP8_1x128 kernel's cluster holds
    # part of the last block-row (the others give it all or none of its rows)
    shapes = [(64, 256), (40, 48), (3, 33, 144), (3, 40, 320), (130, 208), (2, 36, 20), (2, 300, 272), (3, 40, 56),
              (2, 200, 264)]
    for shape in shapes:
        n = int(np.prod(shape))
        x = random_blocks(int(rng.integers(1 << 30)), n // 16, (16,), dtype).reshape(shape)
        xd = jax.device_put(x, dev)
        axes = [-1] if len(fmt.block) == 2 else [-1, -2]
        for axis in axes:
            got = _quantize(fmt, "cuda", axis)(xd)
            want = _quantize(fmt, "reference", axis)(xd)
            _same_quantized(got, want, f"{fmt.name} {shape} axis={axis}")
            # every output type (the dequantize programs take codes and scales: compiled for the first
            # input dtype, reused by the other two)
            for out in (jnp.float32, jnp.bfloat16, jnp.float16):
                y = _dequantize(out, "cuda")(want)
                y_ref = _dequantize(out, "reference")(want)
                assert_bits_equal(y, as_bits(np.asarray(y_ref)), f"{fmt.name} {shape} axis={axis} dequantize {out}")
        if len(fmt.block) != 2:
            f = _both_axes(fmt)
            if not fmt.per_tensor:
                assert "gpuext_quantize_both_axes" in f.lower(xd).as_text()
            q_last, q_second = f(xd)
            _same_quantized(q_last, _quantize(fmt, "reference", -1)(xd), f"{fmt.name} {shape} both, -1")
            _same_quantized(q_second, _quantize(fmt, "reference", -2)(xd), f"{fmt.name} {shape} both, -2")


@pytest.mark.verifies("formats.cuda", feature="NVFP4")
def test_cuda_quantize_both_axes_vmap_nvfp4_global_scales():
    """vmap gives each example its own NVFP4 global scale: the fused kernel reads example o's."""
    dev = jax.devices("cuda")[0]
    x = np.random.default_rng(36).standard_normal((3, 64, 128)).astype(np.float32)
    x[1] *= 1e4
    xd = jax.device_put(x, dev)
    got = jax.jit(jax.vmap(lambda v: gx.quantize_both_axes(v, gx.NVFP4, backend="cuda")))(xd)
    for i in range(3):
        for k, axis in ((0, -1), (1, -2)):
            want = gx.quantize(x[i], gx.NVFP4, axis=axis, backend="reference")
            assert_bits_equal(got[k].data[i], as_bits(np.asarray(want.data)), f"vmap NVFP4 {i} axis {axis} data")
            assert_bits_equal(got[k].scale[i], as_bits(np.asarray(want.scale)), f"vmap NVFP4 {i} axis {axis} scale")


# --------------------------------------------------------------------------- issue 35, round 2: kernels alone
# (format, axis, both axes): every format along the last axis, the layouts of the second axis once.
KERNEL_TIME_CASES = [(f, -1, False) for f in ALL_FORMATS] + [(gx.MXFP8_E4M3, -2, True), (gx.NVFP4, -2, True),
                                                             (gx.FP8_1x128, -2, True)]
KERNEL_TIME_SHAPE = (8192, 16384)  # 256 MiB of bf16: bench_quantize --quick's shape, far beyond L2


def _cluster_code_expected(dev) -> bool:
    """Whether the driver runs code compiled for sm_90 or later on `dev` (what the fused FP8_1x128
    kernel's cluster launch needs; block_scaled_cuda.cu ClusterCodeLoaded): a cubin of the device's
    own architecture >= 90 among the built ones, or PTX >= 90 it can JIT. The default build's other
    devices (CC 10.3, 12.x) JIT the compute_80 PTX and quantize the two axes apart."""
    import re

    from jax_gpuext.common import extension

    major, minor = (int(v) for v in str(dev.compute_capability).split("."))
    cc = 10 * major + minor
    for arch in str(extension.build_info("cuda")["architectures"]).replace(";", ",").split(","):
        m = re.fullmatch(r"(\d+)([af]?)(?:-(real|virtual))?", arch.strip())
        if m is None or int(m.group(1)) < 90:
            continue
        n, specific, kind = int(m.group(1)), bool(m.group(2)), m.group(3)
        if kind != "virtual" and n == cc:
            return True
        if kind != "real" and not specific and n <= cc:
            return True
    return False


def _packed_codes(data, fmt):
    codes = as_bits(np.asarray(data)).ravel()
    if not ("float4" in fmt.elem_dtype.name and bool(formats.FP4_PACKED["cuda"])):
        return codes.tobytes()
    codes = codes & 0xF
    if codes.size % 2:
        codes = np.append(codes, 0)
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()


@pytest.mark.run_first(0)
@pytest.mark.verifies("formats.cuda", feature="{fmt.name}")
@pytest.mark.parametrize("fmt,axis,both", KERNEL_TIME_CASES,
                         ids=[f"{f.name}-axis{-a}" + ("-both" if b else "") for f, a, b in KERNEL_TIME_CASES])
def test_cuda_kernels_alone_bit_exact_and_timed(fmt, axis, both, record_property):
    """The kernels alone at the bench's size (jax_gpuext._cuda.formats_kernel_times: CUDA events around
    back-to-back launches, no XLA program around them, beside a device-to-device copy of x in the same
    process; docs/design.md, issue 35 round 2): bench_quantize times each op k times inside an XLA loop,
    and that loop's own work (it ties the operands to the loop counter) is in its rows. Here every
    output -- quantize, dequantize back to bf16 and, with `both`, quantize_both_axes -- is checked bit
    for bit against the reference on a tensor large enough that every grid-stride loop runs many steps
    (the small shapes above take one), and the kernels' fractions of the copy are recorded in the junit
    file (record_property) for the results: bytes moved (x read, codes and scales written, or back) over
    the time, against the copy's 2 x |x|."""
    from jax_gpuext.common import extension
    from jax_gpuext.formats import default_scale_rounding

    cuda = extension.module("cuda")
    assert cuda is not None and hasattr(cuda, "formats_kernel_times"), "this _cuda has no formats_kernel_times"
    rows, cols = KERNEL_TIME_SHAPE
    x = jax.device_put(jax.random.normal(jax.random.key(35), (rows, cols), jnp.float32).astype(jnp.bfloat16),
                       jax.devices("cuda")[0])
    kw = {"global_scale": jnp.float32(1.0)} if fmt.has_global_scale else {}
    rounding = default_scale_rounding(fmt)
    packed = bool(formats.FP4_PACKED["cuda"]) if "float4" in fmt.elem_dtype.name else False
    got = cuda.formats_kernel_times(np.asarray(x).tobytes(), "bfloat16", rows, cols, fmt.code, axis,
                                    {"up": 0, "ocp": 1, "nearest": 2}[rounding], packed, 1.0, both, 10, 3)
    want = jax.jit(lambda v: gx.quantize(v, fmt, axis=axis, backend="reference", **kw))(x)
    assert got["data"] == _packed_codes(want.data, fmt), f"{fmt.name} axis {axis}: codes differ from the reference"
    assert got["scale"] == as_bits(np.asarray(want.scale)).tobytes(), f"{fmt.name} axis {axis}: scales differ"
    y = jax.jit(lambda q: gx.dequantize(q, jnp.bfloat16, backend="reference"))(want)
    assert got["y"] == as_bits(np.asarray(y)).tobytes(), f"{fmt.name} axis {axis}: dequantized values differ"
    if both:
        last = jax.jit(lambda v: gx.quantize(v, fmt, axis=-1, backend="reference", **kw))(x)
        assert got["both_data_last"] == _packed_codes(last.data, fmt), f"{fmt.name} both axes: axis -1 codes"
        assert got["both_scale_last"] == as_bits(np.asarray(last.scale)).tobytes(), f"{fmt.name} both: -1 scales"
        assert got["both_data_second"] == got["data"] and got["both_scale_second"] == got["scale"], \
            f"{fmt.name} both axes: axis -2 outputs"
        # code built for sm_90 or later runs every fused case in one kernel (FP8_1x128's as a cluster of
        # two CTAs); the timing below would otherwise be of the two axes apart
        if _cluster_code_expected(jax.devices("cuda")[0]) or fmt is not gx.FP8_1x128:
            assert got["both_fused"], f"{fmt.name}: quantize_both_axes did not run the fused kernel"
    x_bytes, q_bytes = x.size * 2, len(got["data"]) + len(got["scale"])
    copy_bw = 2 * x_bytes / got["copy_s"]
    reads = 2 if fmt.per_tensor else 1  # FP8_TENSOR's amax pass reads x once more, as the bench counts it
    times = {"quantize": (got["quantize_s"], reads * x_bytes + q_bytes),
             "dequantize": (got["dequantize_s"], q_bytes + x_bytes)}
    if both:
        last_bytes = len(got["both_data_last"]) + len(got["both_scale_last"])
        times["quantize_both_axes"] = (got["both_s"], x_bytes + q_bytes + last_bytes)
    row = {"format": fmt.name, "axis": axis, "shape": [rows, cols], "dtype": "bfloat16", "copy_GBps": copy_bw / 1e9}
    if both:
        row["both_fused"] = bool(got["both_fused"])
    for op, (seconds, moved) in times.items():
        row[f"{op}_us"] = seconds * 1e6
        row[f"{op}_fraction_of_copy"] = moved / seconds / copy_bw
    record_property("kernel_times", row)
    print(row)
