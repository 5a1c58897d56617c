"""ragged_dot / scaled_ragged_dot / quantize_grouped (issue 30), on CPU.

Every backend that runs here (``reference``, ``xla``) is checked against the float64 NumPy model of
tests/_ragged_numpy.py (independent of jax_gpuext) for every format pairing and both modes, with
an empty first group, a one-row group, an empty middle group, sizes that are not multiples of
any block, and rows past the last group. Grouped quantization is checked bit for bit.
"""

from __future__ import annotations

import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export  # a submodule jax 0.7 does not import by itself
from jax import lax

import _formats_numpy as npref
import _ragged_numpy as rnp
import jax_gpuext as gx
from jax_gpuext.ragged_dot import RAGGED_CONTRACT, RAGGED_M, common, dequantize_grouped, grouped_block_count

BACKENDS = ["reference", "xla"]
MX = [gx.MXFP8_E4M3, gx.MXFP8_E5M2, gx.MXFP4]
GROUPED_FORMATS = MX + [gx.NVFP4, gx.FP8_1x128]
# (lhs, rhs) pairings of ragged_m: DeepSeek-V3's, 1x128 both ways, every MX pairing, NVFP4.
PAIRS_M = [(gx.FP8_1x128, gx.FP8_128x128), (gx.FP8_1x128, gx.FP8_1x128), (gx.NVFP4, gx.NVFP4)] + \
    list(itertools.product(MX, MX))
PAIRS_CONTRACT = [(gx.FP8_1x128, gx.FP8_1x128), (gx.NVFP4, gx.NVFP4)] + list(itertools.product(MX, MX))
# The reference (the definition) takes every pairing; xla one of each path it has: FP8 blockwise in
# float32, NVFP4 in bf16 outright, MX in bf16 behind the run-time scale check (one operand
# checked, or both). Kept lean for CI's two cores.
XLA_PAIRS = [(gx.FP8_1x128, gx.FP8_128x128), (gx.FP8_1x128, gx.FP8_1x128), (gx.NVFP4, gx.NVFP4),
             (gx.MXFP8_E4M3, gx.MXFP4)]
CASES_M = [(p, "reference") for p in PAIRS_M] + [(p, "xla") for p in PAIRS_M if p in XLA_PAIRS]
CASES_CONTRACT = [(p, "reference") for p in PAIRS_CONTRACT] + [(p, "xla") for p in PAIRS_CONTRACT if p in XLA_PAIRS]
M, K, N = 260, 256, 160
# sum 224 < M; empty first and middle groups, a 1-row group, a group of two 128-blocks (the second
# partial), sizes that are no multiple of 16, 32 or 128
SIZES = np.array([0, 1, 150, 0, 70, 3], np.int32)
G = len(SIZES)


def case_id(case):
    (lf, rf), backend = case
    return f"{lf.name}-{rf.name}-{backend}"


def rand(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


@functools.cache
def ragged_fn(backend, dn=None, out=jnp.float32):
    return lambda a, b, s: gx.ragged_dot(a, b, s, dn, preferred_element_type=out, backend=backend)


# --------------------------------------------------------------------------- ragged_m vs float64
@pytest.mark.parametrize("case", CASES_M, ids=case_id)
def test_ragged_m_matches_float64(case):
    (lf, rf), backend = case
    x = rand(1, (M, K), 3.0)
    w = rand(2, (G, K, N), 0.5)
    qx = gx.quantize(x, lf)
    qw = gx.quantize(w, rf, axis=-1 if len(rf.block) == 2 else 1)
    y = ragged_fn(backend)(qx, qw, jnp.asarray(SIZES))
    want, mag = rnp.ragged_m(rnp.dequant(qx), rnp.dequant(qw), SIZES)
    gscale = np.float64(1)
    for q in (qx, qw):
        gscale = gscale * (1.0 if q.global_scale is None else np.float64(q.global_scale))
    assert y.dtype == jnp.float32
    rnp.assert_close(y, want * gscale, mag * gscale)
    assert not np.asarray(y[int(SIZES.sum()):]).any()  # rows past the last group


@pytest.mark.parametrize("rf,backend", [(gx.FP8_128x128, "reference"), (gx.MXFP4, "xla")])
def test_ragged_m_weights_stored_n_by_k(rf, backend):
    """rhs (G, N, K) (checkpoints store weights so: gpt-oss, DeepSeek-V3), contracting axis 2; the
    default dimension numbers contract the quantized axis."""
    lf = gx.FP8_1x128 if rf is gx.FP8_128x128 else gx.MXFP8_E4M3
    qx = gx.quantize(rand(3, (M, K)), lf)
    qw = gx.quantize(rand(4, (G, N, K)), rf)
    dn = lax.RaggedDotDimensionNumbers((([1], [2]), ([], [])), [0], [0])
    want, mag = rnp.ragged_m(rnp.dequant(qx), np.swapaxes(rnp.dequant(qw), 1, 2), SIZES)
    rnp.assert_close(ragged_fn(backend, dn)(qx, qw, jnp.asarray(SIZES)), want, mag)
    if rf is gx.MXFP4:  # quantized along axis 2: None contracts it
        rnp.assert_close(ragged_fn(backend)(qx, qw, jnp.asarray(SIZES)), want, mag)


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_sizes_out_of_range_are_clamped(backend):
    """A negative size counts as 0 and groups are cut at M, on every backend (data on the device
    cannot be checked at trace time; this is the definition)."""
    sizes = np.array([-3, 50, 200, 7], np.int32)
    qx = gx.quantize(rand(5, (M, K)), gx.FP8_1x128)
    qw = gx.quantize(rand(6, (4, K, N)), gx.FP8_128x128)
    want, mag = rnp.ragged_m(rnp.dequant(qx), rnp.dequant(qw), sizes)
    rnp.assert_close(ragged_fn(backend)(qx, qw, jnp.asarray(sizes)), want, mag)


@pytest.mark.parametrize("out", [jnp.bfloat16, jnp.float16], ids=lambda d: jnp.dtype(d).name)
def test_output_dtype_is_one_rounding_of_the_float32_result(out):
    qx = gx.quantize(rand(7, (M, K)), gx.MXFP8_E4M3)
    qw = gx.quantize(rand(8, (G, K, N)), gx.MXFP8_E4M3, axis=1)
    y32 = ragged_fn("reference")(qx, qw, jnp.asarray(SIZES))
    y = ragged_fn("reference", None, out)(qx, qw, jnp.asarray(SIZES))
    assert y.dtype == out and np.array_equal(np.asarray(y), np.asarray(y32.astype(out)))


def test_per_expert_nvfp4_global_scales():
    """Weights quantized per expert under vmap carry one global scale per group."""
    w = rand(9, (G, K, N)) * jnp.arange(1, G + 1, dtype=jnp.float32)[:, None, None]
    qw = jax.vmap(lambda v: gx.quantize(v, gx.NVFP4, axis=0))(w)
    assert qw.global_scale.shape == (G,)
    qx = gx.quantize(rand(10, (M, K)), gx.NVFP4)
    per_row = np.concatenate([np.float64(np.asarray(qw.global_scale))[np.repeat(np.arange(G), SIZES)],
                              np.zeros(M - SIZES.sum())])[:, None]
    want, mag = rnp.ragged_m(rnp.dequant(qx), rnp.dequant(qw), SIZES)
    want, mag = want * per_row * np.float64(qx.global_scale), mag * per_row * np.float64(qx.global_scale)
    for backend in BACKENDS:
        rnp.assert_close(ragged_fn(backend)(qx, qw, jnp.asarray(SIZES)), want, mag)


# --------------------------------------------------------------------------- grouped quantization
@pytest.mark.parametrize("fmt,axis", [(f, 0) for f in GROUPED_FORMATS] + [(gx.FP8_1x128, 1), (gx.MXFP4, 1)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_quantize_grouped_bit_exact(fmt, axis):
    x = np.array(rand(11, (M, 48) if axis == 0 else (48, M), 4.0))
    x[0 if axis == 0 else slice(None), 0 if axis == 1 else slice(None)] = 0.0  # an all-zero row
    q = jax.jit(lambda v, s: gx.quantize_grouped(v, fmt, s, axis=axis))(x, jnp.asarray(SIZES))
    values, scales, g = rnp.quantize_grouped(x, fmt, SIZES, axis)
    slots = grouped_block_count(M, G, fmt.block[0])
    assert q.scale.shape[axis] == slots == min(M, (M + (G + 1) * (fmt.block[0] - 1)) // fmt.block[0])
    np.testing.assert_array_equal(np.asarray(q.data.astype(jnp.float32), np.float64), values)
    used = scales.shape[axis]
    got = np.asarray(q.scale.astype(jnp.float32), np.float64)
    got_used = np.take(got, np.arange(used), axis)
    np.testing.assert_array_equal(got_used, np.exp2(scales) if fmt.is_mx else scales)
    # Unused slots: an all-zero block's scale (1.0; NVFP4's default "nearest" rounds it to 0, as jax.nn does).
    zero_block_scale = 0.0 if fmt.has_global_scale else 1.0
    assert (np.take(got, np.arange(used, slots), axis) == zero_block_scale).all()
    if g is not None:
        assert np.float32(q.global_scale) == g
    # and back: the formats' dequantize rule per grouped block
    d = dequantize_grouped(q, jnp.asarray(SIZES))
    per_row = rnp.expand_grouped(scales, SIZES, M, fmt.block[0], axis)
    want = npref.dequant(values, per_row, np.float32, g=g, power_of_two=fmt.is_mx)
    np.testing.assert_array_equal(np.asarray(d), want)


@pytest.mark.parametrize("fmt", GROUPED_FORMATS, ids=lambda f: f.name)
def test_wgrad_operand_quantize_is_quantize_grouped(fmt):
    """scaled_ragged_dot's weight gradient quantizes x and dy with grouped.quantize_tokens_for_wgrad
    (tokens first in, (X, M) or (M, X) out, the padded slot codes kept for the kernel): bit for bit
    quantize_grouped of x^T along axis 1 and of dy along axis 0, on bfloat16 input with zeros,
    subnormals, inf and NaN; slot_data is the codes in the slot layout (tokens last), zeros in the
    slots no token fills."""
    from jax_gpuext.ragged_dot import grouped

    x = np.array(rand(13, (M, 40), 4.0)).astype(jnp.bfloat16)
    x[3, :4] = [0.0, -0.0, float(jnp.finfo(jnp.bfloat16).smallest_subnormal), -1e-40]
    x[150, 7], x[151, 8], x[9, 9] = np.inf, -np.inf, np.nan
    sizes = jnp.asarray(SIZES)
    for tokens_last in (True, False):
        got = jax.jit(lambda v, s, t=tokens_last: grouped.quantize_tokens_for_wgrad(v, fmt, s, tokens_last=t))(
            x, sizes)
        want = gx.quantize_grouped(x.T if tokens_last else x, fmt, sizes, axis=1 if tokens_last else 0)
        assert (got.axis, got.groups, got.format) == (want.axis, want.groups, want.format)
        for part in ("data", "scale", "global_scale"):
            a, b = getattr(got, part), getattr(want, part)
            if b is None:
                assert a is None
                continue
            assert a.shape == b.shape and a.dtype == b.dtype, part
            bits = np.uint8 if a.dtype.itemsize == 1 else np.uint32
            np.testing.assert_array_equal(np.asarray(a).view(bits), np.asarray(b).view(bits), err_msg=part)
        # slot_data (X, S): token t of group g at slot 128 * block + position, as common.slot_rows lays it
        codes = np.asarray(got.slot_data.astype(jnp.float32))
        data = np.asarray(want.data.astype(jnp.float32))
        data = data if tokens_last else data.T  # (X, M)
        b = fmt.block[0]
        assert codes.shape == (40, b * grouped_block_count(M, G, b))
        want_slots, block = np.zeros_like(codes), 0
        for start, stop in rnp.segments(SIZES, M):
            for j in range(start, stop, b):
                n = min(b, stop - j)
                want_slots[:, block * b:block * b + n] = data[:, j:j + n]
                block += 1
        np.testing.assert_array_equal(codes, want_slots)
    # A rebuilt array (as transformations and scale_range.replaced rebuild it) carries no slot codes
    # unless handed them; the public quantize_grouped never sets them.
    assert want.slot_data is None and jax.tree_util.tree_map(lambda v: v, got).slot_data is not None
    assert common.GroupedBlockScaledArray.tree_unflatten(got.tree_flatten()[1], got.tree_flatten()[0][:3]).slot_data \
        is None


@pytest.mark.parametrize("m,groups,block", [(0, 2, 4), (1, 0, 4), (5, 1, 4), (9, 2, 4), (7, 3, 2), (12, 2, 5)])
def test_grouped_block_count_bounds_every_group_split(m, groups, block):
    assert grouped_block_count(m, groups, block) == rnp.max_blocks(m, groups, block)


def test_quantize_grouped_with_aligned_groups_is_ordinary_quantize():
    """Groups that are multiples of the block long: the compact layout is the ordinary one."""
    x = rand(12, (96, 64))
    sizes = jnp.array([32, 0, 64], jnp.int32)
    q = gx.quantize_grouped(x, gx.MXFP8_E4M3, sizes, axis=0)
    ordinary = gx.quantize(x, gx.MXFP8_E4M3, axis=0)
    assert np.array_equal(np.asarray(q.data), np.asarray(ordinary.data))
    assert np.array_equal(np.asarray(q.scale[:3]), np.asarray(ordinary.scale))


# --------------------------------------------------------------------------- ragged_contract vs float64
@pytest.mark.parametrize("case", CASES_CONTRACT, ids=case_id)
def test_ragged_contract_matches_float64(case):
    (lf, rf), backend = case
    sizes = jnp.asarray(SIZES)
    ql = gx.quantize_grouped(rand(13, (K, M), 2.0), lf, sizes, axis=1)  # x^T: tokens last
    qr = gx.quantize_grouped(rand(14, (M, N)), rf, sizes, axis=0)  # dy: tokens first
    y = ragged_fn(backend)(ql, qr, sizes)  # None: both grouped -> ragged_contract
    want, mag = rnp.ragged_contract(rnp.dequant_grouped(ql, SIZES), rnp.dequant_grouped(qr, SIZES), SIZES)
    gscale = np.float64(1)
    for q in (ql, qr):
        gscale = gscale * (1.0 if q.global_scale is None else np.float64(q.global_scale))
    assert y.shape == (G, K, N)
    rnp.assert_close(y, want * gscale, mag * gscale)
    assert not np.asarray(y[0]).any() and not np.asarray(y[3]).any()  # empty groups
    assert ql.scale.shape[1] == grouped_block_count(M, G, lf.block[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_contract_operand_layouts(backend):
    """lhs (M, K) contracting axis 0 and rhs (N, M) contracting axis 1 give the same (G, K, N)."""
    sizes = jnp.asarray(SIZES)
    x, dy = rand(15, (M, K)), rand(16, (M, N))
    ql = gx.quantize_grouped(x, gx.FP8_1x128, sizes, axis=0)
    qr = gx.quantize_grouped(dy.T, gx.FP8_1x128, sizes, axis=1)
    dn = lax.RaggedDotDimensionNumbers((([0], [1]), ([], [])), [0], [])
    want, mag = rnp.ragged_contract(rnp.dequant_grouped(ql, SIZES).T, rnp.dequant_grouped(qr, SIZES).T, SIZES)
    rnp.assert_close(ragged_fn(backend, dn)(ql, qr, sizes), want, mag)


# --------------------------------------------------------------------------- transformations, lowering
def test_vmap_over_a_leading_batch_matches_a_loop():
    """vmap over tokens and group sizes, weights shared (jax's batching rules batch the xla
    backend's tile table, gathers and dots)."""
    xs = rand(17, (3, M, K))
    sizes = jnp.asarray(np.stack([SIZES, np.roll(SIZES, 1), np.roll(SIZES, 2)]))
    qw = gx.quantize(rand(18, (G, K, N)), gx.FP8_128x128)
    for backend in BACKENDS:
        f = lambda x, s, b=backend: gx.ragged_dot(gx.quantize(x, gx.FP8_1x128), qw, s,  # noqa: E731
                                                  preferred_element_type=jnp.float32, backend=b)
        close(jax.jit(jax.vmap(f))(xs, sizes), jnp.stack([f(xs[i], sizes[i]) for i in range(3)]))
    # nested: an outer vmap over pairs of batches, sizes shared by each pair
    nested = jax.jit(jax.vmap(jax.vmap(f, in_axes=(0, None)), in_axes=(0, 0)))(xs[None, :2], sizes[None, 0])
    close(nested[0], jnp.stack([f(xs[i], sizes[0]) for i in range(2)]))
    # (vmap of scaled_ragged_dot's gradients: tests/ragged_dot/test_scaled_ragged_dot.py)


def close(a, b):
    """Equal up to the order of float32 accumulation (the batched dot may sum K in another order):
    a few ulps of the largest value."""
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * np.abs(b).max() * K ** 0.5)


def test_xla_lowering_for_cuda_is_xla_ops_without_host_work():
    """What auto runs on a GPU (until our kernels are verified) lowers to XLA's own ops, never to
    its ragged dot (which XLA expands to a dot over all groups, G times the work: issue 36): no
    custom call, no host callback; group sizes stay an operand of the device computation. (The
    dots it holds: tests/ragged_dot/test_ragged_dot_xla_tiles.py.)"""
    from jax_gpuext.common import backends

    qx = gx.quantize(rand(20, (M, K)), gx.FP8_1x128)
    qw = gx.quantize(rand(21, (G, K, N)), gx.FP8_128x128)
    f = jax.jit(lambda a, b, s: gx.ragged_dot(a, b, s, backend="xla"))
    with backends.platform("cuda"):
        exp = jax_export.export(f, platforms=["cuda"])(qx, qw, jnp.asarray(SIZES))
    text = exp.mlir_module()
    assert "chlo.ragged_dot" not in text and not re.findall(r"custom_call @([\w.]+)", text)
    for forbidden in ("callback", "infeed", "outfeed", "stablehlo.send", "stablehlo.recv"):
        assert forbidden not in text, forbidden
    cpu = f.lower(qx, qw, jnp.asarray(SIZES)).as_text()
    for forbidden in ("custom_call", "callback", "infeed", "outfeed"):
        assert forbidden not in cpu, forbidden


# --------------------------------------------------------------------------- validation
@functools.cache
def _operands():
    sizes = jnp.asarray(SIZES)
    qx = gx.quantize(rand(22, (M, K)), gx.FP8_1x128)
    qw = gx.quantize(rand(23, (G, K, N)), gx.FP8_128x128)
    return qx, qw, sizes


@pytest.mark.parametrize("case,err,match", [
    ("sizes_dtype", TypeError, "group_sizes must have an integer dtype"),
    ("sizes_rank", ValueError, r"group_sizes must have shape \(G,\)"),
    ("groups", ValueError, "rhs has 6 groups .* group_sizes has 5"),
    ("k", ValueError, "contracting sizes differ"),
    ("mixed", ValueError, "cannot be mixed"),
    ("lhs_128", ValueError, "straddle the groups"),
    ("tensor", ValueError, "one scale per tensor"),
    ("not_quantized", TypeError, "must be a BlockScaledArray"),
    ("grouped_in_m", TypeError, "in ragged_m, lhs must be a BlockScaledArray"),
    ("plain_in_contract", TypeError, "quantize_grouped"),
    ("batch_dims", ValueError, "batch dimensions are not supported"),
    ("out_dtype", TypeError, "preferred_element_type"),
])
def test_bad_input_raises_the_same_on_every_backend(case, err, match):
    qx, qw, sizes = _operands()
    args, kw = [qx, qw, sizes], {}
    if case == "sizes_dtype":
        args[2] = sizes.astype(jnp.float32)
    elif case == "sizes_rank":
        args[2] = sizes[None]
    elif case == "groups":
        args[2] = sizes[:5]
    elif case == "k":
        args[1] = gx.quantize(rand(24, (G, K + 128, N)), gx.FP8_128x128)
    elif case == "mixed":
        args[0] = gx.quantize(rand(22, (M, K)), gx.MXFP8_E4M3)
    elif case == "lhs_128":
        args[0] = gx.quantize(rand(22, (M, K)), gx.FP8_128x128)
    elif case == "tensor":
        args[0] = gx.quantize(rand(22, (M, K)), gx.FP8_TENSOR)
    elif case == "not_quantized":
        args[0] = rand(22, (M, K))
    elif case == "grouped_in_m":
        args[0] = gx.quantize_grouped(rand(22, (M, K)), gx.FP8_1x128, sizes, axis=1)
    elif case == "plain_in_contract":
        args = [gx.quantize(rand(22, (K, M)), gx.FP8_1x128), gx.quantize(rand(23, (M, N)), gx.FP8_1x128, axis=0),
                sizes, RAGGED_CONTRACT]
    elif case == "batch_dims":
        args.append(lax.RaggedDotDimensionNumbers((([2], [1]), ([0], [0])), [1], [0]))
    elif case == "out_dtype":
        kw["preferred_element_type"] = jnp.int32
    for backend in ("reference", "xla", "auto"):  # validation runs before a backend is chosen
        with pytest.raises(err, match=match):
            gx.ragged_dot(*args, backend=backend, **kw)


def test_scaled_ragged_dot_bad_input():
    x, w, sizes = rand(25, (M, K)), rand(26, (G, K, N)), jnp.asarray(SIZES)
    with pytest.raises(ValueError, match="group_offset"):
        gx.scaled_ragged_dot(x, w, sizes, group_offset=jnp.zeros((1,), jnp.int32))
    with pytest.raises(ValueError, match=r"lhs must be \(M, K\)"):
        gx.scaled_ragged_dot(x[None], w, sizes)
    with pytest.raises(TypeError, match="int32"):
        gx.scaled_ragged_dot(x, w, sizes.astype(jnp.float32))
    with pytest.raises(ValueError, match="one scale per tensor"):
        gx.scaled_ragged_dot(x, w, sizes, format=gx.FP8_TENSOR)
    with pytest.raises(ValueError, match="backend must be"):
        gx.scaled_ragged_dot(x, w, sizes, backend="cudnn")
    with pytest.raises(ValueError, match="groups"):
        gx.quantize_grouped(x, gx.MXFP8_E4M3, sizes, axis=0).check() or gx.ragged_dot(
            gx.quantize_grouped(x.T, gx.MXFP8_E4M3, sizes[:3], axis=1),
            gx.quantize_grouped(rand(27, (M, N)), gx.MXFP8_E4M3, sizes[:3], axis=0), sizes)
    with pytest.raises(ValueError, match="128x128 tiles"):
        gx.quantize_grouped(x, gx.FP8_128x128, sizes, axis=0)
