"""jax's own block-scaled tests as our peer suite: their inputs, shapes and tolerances, our ops.

Ported (in our words) from jax-ml/jax ``tests/scaled_matmul_stablehlo_test.py`` (``ScaledMatmulTest``,
``ScaledDotGeneralTest``) and ``tests/nn_test.py`` (``testScaledMatmul``, ``testScaledDotGeneral``),
jax 0.12. Each case builds the inputs jax's test builds (same PRNG keys, distributions, shapes and
global scales), runs OUR ``quantize`` / ``block_scaled_dot`` / ``scaled_dot_general`` on them and
checks what jax's test checks, at its tolerance. Where both define the bits (the quantized
elements and block scales of MXFP8 and NVFP4), ours must equal jax.nn's quantizer bit for bit;
jax.nn's quantizer is pure jnp and runs on every jax we support. Where jax.nn's own dot runs on
CPU (jax >= 0.11, gate ``jax_scaled_matmul_cpu``) our result is also held to jax.nn's at the test's
tolerance.

Not ported, with the reason: the sharded and collective tests (four GPUs, cuDNN's custom call in
the HLO), ``test_remat_checkpoint_dots*`` (they count jax.nn's primitive names in a jaxpr), and
``test_nvfp4_gradient_clip`` with ``enable_grad_clip=True`` (see its skip reason).
docs/coming_from.md lists the differences.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext.common import env

try:  # jax.nn's quantizer and its (B, M, K) canonicalisation: pure jnp, present since jax 0.6
    from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig, quantize as jax_nn_quantize
    from jax._src.cudnn.scaled_matmul_stablehlo import shape_normalization
except ImportError as e:  # pragma: no cover - every supported jax has them
    pytest.skip(f"jax {jax.__version__} has no jax.nn block-scaled quantizer ({e})", allow_module_level=True)

E4M3, E2M1, E8M0 = jnp.float8_e4m3fn, jnp.float4_e2m1fn, jnp.float8_e8m0fnu
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# jax's grids cross every shape with every dtype: 98 cases here, ~4 min of CPU (each compiles its
# own operands, quantizers and scaled_dot_general gradient; JAX_GPUEXT_PEER_SUITE=full runs them all,
# and did pass in full on jax 0.10.2 and 0.12). CI runs three legs with a budget, so by default a
# subset runs: each kept shape with one dtype, rotating (shape i with dtype i % 3), and a few shapes
# of each test chosen to cover every dtype, both training and inference, and the dimension-number
# layouts jax's cases add (several batch dims, a contracting dim in the middle): 21 cases, ~30 s.
FULL_GRID = env.get("JAX_GPUEXT_PEER_SUITE") == "full"
BUDGET_REASON = "CI budget: a subset of jax's grid runs by default; JAX_GPUEXT_PEER_SUITE=full runs the whole grid"


def rotated(shapes, ids=None, skip_reason=None, keep=None):
    """(shape, dtype name) parameters of every shape x dtype; outside the full grid, shape i keeps
    dtype i % 3 if i is in ``keep`` (default: every shape) and the others are skipped with the
    reason (all of them, with ``skip_reason``)."""
    out = []
    for i, shape in enumerate(shapes):
        for j, dtype in enumerate(DTYPES):
            kept = j == i % len(DTYPES) and (keep is None or i in keep)
            reason = skip_reason or (None if kept else BUDGET_REASON)
            marks = pytest.mark.skip(reason=reason) if reason and not FULL_GRID else ()
            out.append(pytest.param(shape, dtype, marks=marks, id=f"{ids[i] if ids else i}-{dtype}"))
    return out


def subset(values, keep, ids=None):
    """``values`` as parameters; outside the full grid only those at the indices ``keep`` run."""
    return [pytest.param(v, marks=() if i in keep or FULL_GRID else pytest.mark.skip(reason=BUDGET_REASON),
                         id=ids[i] if ids else str(i)) for i, v in enumerate(values)]


# jax 0.7.0's NVFP4 quantizer divided the elements by the block scale alone, not by the global
# scale first (0.7.1 onwards: ``x /= config.global_scale``, read in each release's source): its
# NVFP4 bits and its tests' references are another rule.
JAX_NN_NVFP4 = tuple(int(p) for p in jax.__version__.split(".")[:3]) >= (0, 7, 1)
needs_jax_nn_nvfp4 = pytest.mark.skipif(
    not JAX_NN_NVFP4, reason=f"jax {jax.__version__}'s NVFP4 quantizer divides elements by the block scale "
                             "without the global scale (fixed in jax 0.7.1): not jax.nn's rule of today")


# --------------------------------------------------------------------------- jax's inputs, our code
def mxfp8_config():
    return BlockScaleConfig(mode="mxfp8", block_size=32, data_type=E4M3, scale_type=E8M0, global_scale=None,
                            infer_only=False)


def nvfp4_config(g):
    return BlockScaleConfig(mode="nvfp4", block_size=16, data_type=E2M1, scale_type=E4M3, global_scale=g,
                            infer_only=False)


def jax_test_global_scale(tensor):
    """jax's test computes amax / (6 * 448) eagerly: a correctly rounded float32 division (XLA:CPU
    would multiply by a rounded reciprocal inside jit, so it is done in NumPy here)."""
    amax = np.max(np.abs(np.asarray(tensor, np.float32)))
    return jnp.asarray(np.float32(amax) / np.float32(6 * 448))


@functools.partial(jax.jit, static_argnames=("a_shape", "b_shape", "dtype", "seed", "representable", "dn"))
def jax_test_operands(*, a_shape, b_shape, dtype, seed, representable, dn=None):
    """jax's operands: uniform [-1, 1) from the two halves of key(seed); E4M3-representable ones
    (its ``cast_to_representable``: x / 1 clipped to +-448, to E4M3 and back) for MXFP8; with ``dn``
    also their (B, M, K) forms (``shape_normalization``)."""
    k1, k2 = jax.random.split(jax.random.key(seed), 2)
    a = jax.random.uniform(k1, a_shape, minval=-1.0, dtype=dtype)
    b = jax.random.uniform(k2, b_shape, minval=-1.0, dtype=dtype)
    if representable:
        a, b = (jnp.clip(v, -448, 448).astype(E4M3).astype(dtype) for v in (a, b))
    if dn is None:
        return a, b
    (ac, bc), (ab, bb) = dn
    return a, b, shape_normalization(a, (ac, ab)), shape_normalization(b, (bc, bb))


@functools.partial(jax.jit, static_argnames=("mode",))
def _jax_nn_quantize_jit(x, g, *, mode):
    return jax_nn_quantize(x, mxfp8_config() if mode == "mxfp8" else nvfp4_config(g))


def jax_nn_quantize_checked(q, x, g=None, *, what):
    """jax.nn's (elements, scales) of ``x`` (B, M, K), held equal to ours (``q``) bit for bit.

    jax.nn's quantizer runs jitted here (one compilation; op by op it costs ~15 per shape). Where
    the jitted one differs from ours, jax.nn's eager one decides: jaxlib 0.10's XLA:CPU rounds some
    E2M1 ties away from even inside a jitted quantizer (one element in 2 million of
    test_quantize_nvfp4's input; jax 0.12's does not), where its eager run and ours round to even."""
    mode = "mxfp8" if g is None else "nvfp4"
    theirs = _jax_nn_quantize_jit(x, g, mode=mode)
    if not (same_bits(q.data, theirs[0]) and same_bits(q.scale, theirs[1])):
        theirs = jax_nn_quantize(x, mxfp8_config() if g is None else nvfp4_config(g))
    assert_same_bits(q.data, theirs[0], f"{what} elements")
    assert_same_bits(q.scale, theirs[1], f"{what} scales")
    return theirs


@functools.partial(jax.jit, static_argnames=("dtype",))
def nvfp4_reference_dequantize(data, scale, dtype, g):
    """jax's test dequantizes in the output dtype: element x block scale x global scale."""
    v = data.astype(dtype).reshape(-1, 16) * scale.astype(dtype).reshape(-1, 1) * g.astype(dtype)
    return v.reshape(data.shape)


@jax.jit
def _ours_nvfp4_pair(a3, b3):
    return gx.quantize(a3, gx.NVFP4), gx.quantize(b3, gx.NVFP4)  # our default global scale


def nvfp4_test_tensors(a_shape, b_shape, dn, dtype):
    """jax's generate_nvfp4_quantized_tensors: raw uniform operands (key 0), their (B, M, K)
    forms, global scales amax / 2688 of those (held equal to our default), jax.nn's quantization
    (held equal to ours bit for bit) and the references it dequantizes from it in the output dtype."""
    dn = _normalized_dims(dn)
    a_raw, b_raw, a3, b3 = jax_test_operands(a_shape=a_shape, b_shape=b_shape, dtype=dtype, seed=0,
                                             representable=False, dn=dn)
    ga, gb = jax_test_global_scale(a3), jax_test_global_scale(b3)
    qa, qb = _ours_nvfp4_pair(a3, b3)
    assert_same_bits(qa.global_scale, ga, "lhs global scale (ours: the default)")
    assert_same_bits(qb.global_scale, gb, "rhs global scale (ours: the default)")
    ja = jax_nn_quantize_checked(qa, a3, ga, what="lhs")
    jb = jax_nn_quantize_checked(qb, b3, gb, what="rhs")
    deq = (nvfp4_reference_dequantize(*ja, dtype=dtype, g=ga), nvfp4_reference_dequantize(*jb, dtype=dtype, g=gb))
    return (a_raw, b_raw), (a3, b3), deq, (qa, qb), (ga, gb)


# --------------------------------------------------------------------------- checks
def bits(a):
    a = np.asarray(a)
    if a.dtype == np.dtype(E2M1):  # no 4-bit view: compare the exact values' fp32 bits
        return a.astype(np.float32).view(np.uint32)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def same_bits(ours, theirs) -> bool:
    o, t = bits(ours), bits(theirs)
    return o.shape == t.shape and bool((o == t).all())


def assert_same_bits(ours, theirs, what):
    o, t = bits(ours), bits(theirs)
    assert o.shape == t.shape, f"{what}: shape {o.shape} vs jax.nn {t.shape}"
    bad = np.flatnonzero(o.ravel() != t.ravel())
    assert bad.size == 0, f"{what}: {bad.size} of {o.size} differ from jax.nn's, first at {bad[:5]}"


def assert_allclose(ours, ref, rtol, atol, dtype=None):
    """jtu.assertArraysAllClose: same dtype (when given), then elementwise rtol / atol."""
    if dtype is not None:
        assert jnp.dtype(ours.dtype) == jnp.dtype(dtype), (ours.dtype, dtype)
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(ref, np.float32), rtol=rtol, atol=atol)


def _normalized_dims(dn):
    return tuple(tuple(tuple(x) for x in pair) for pair in dn)


# --------------------------------------------------------------------------- scaled_matmul
MATMUL_SHAPES = [(c, m) for c in (160, 96) for m in (240, 100)]  # (contract, lhs rows)
MATMUL_IDS = [f"K{c}-M{m}" for c, m in MATMUL_SHAPES]
BMK_DOT = (((2,), (2,)), ((0,), (0,)))  # (B, M, K) x (B, N, K) -> (B, M, N)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _ours_mxfp8_matmul(a, b, *, dtype):
    qa, qb = gx.quantize(a, gx.MXFP8_E4M3), gx.quantize(b, gx.MXFP8_E4M3)
    return qa, qb, gx.block_scaled_dot(qa, qb, BMK_DOT, preferred_element_type=dtype)


def _mxfp8_matmul_case(contract, lhs_rows, dtype, batch, rhs_rows):
    """ScaledMatmulTest.test_scaled_matmul / NNFunctionsTest.testScaledMatmul: E4M3-representable
    uniform operands (key 123), quantized along K, the dot against the float32 matmul of the inputs
    (rtol 1e-3, atol 1e-3)."""
    a, b = jax_test_operands(a_shape=(batch, lhs_rows, contract), b_shape=(batch, rhs_rows, contract), dtype=dtype,
                             seed=123, representable=True)
    qa, qb, out = _ours_mxfp8_matmul(a, b, dtype=dtype)
    jax_nn_quantize_checked(qa, a, what="lhs")
    jax_nn_quantize_checked(qb, b, what="rhs")
    ref = jnp.matmul(a.astype(jnp.float32), jnp.transpose(b, (0, 2, 1)).astype(jnp.float32))
    assert_allclose(out, ref.astype(dtype), rtol=1e-3, atol=1e-3, dtype=dtype)
    return qa, qb, out


@pytest.mark.parametrize("shape,dtype", rotated(MATMUL_SHAPES, ids=MATMUL_IDS, keep=(0, 1)))
def test_scaled_matmul_mxfp8(shape, dtype):
    _mxfp8_matmul_case(*shape, DTYPES[dtype], batch=2, rhs_rows=128)


@pytest.mark.parametrize("shape,dtype", rotated(MATMUL_SHAPES, ids=MATMUL_IDS,
                                                 skip_reason="test_scaled_matmul_mxfp8's code and tolerance on larger "
                                                             "operands: JAX_GPUEXT_PEER_SUITE=full runs it"))
def test_nn_scaled_matmul_mxfp8(shape, dtype):
    """nn_test.py's variant: batch 4, 256 rhs rows."""
    _mxfp8_matmul_case(*shape, DTYPES[dtype], batch=4, rhs_rows=256)


@functools.partial(jax.jit, static_argnames=("dtype",))
def _ours_dot(qa, qb, *, dtype):
    return gx.block_scaled_dot(qa, qb, BMK_DOT, preferred_element_type=dtype)


@needs_jax_nn_nvfp4
@pytest.mark.parametrize("shape,dtype", rotated(MATMUL_SHAPES, ids=MATMUL_IDS, keep=(0, 1, 2)))
def test_scaled_matmul_nvfp4(shape, dtype):
    """ScaledMatmulTest.test_scaled_matmul_nvfp4: raw uniform operands (key 0), global scales
    amax / 2688, the dot against the einsum of jax.nn's dequantized operands (rtol 1e-2,
    atol 5e-2). Our quantization equals jax.nn's bit for bit (nvfp4_test_tensors)."""
    (contract, lhs_rows), dtype = shape, DTYPES[dtype]
    _, _, (a_dq, b_dq), (qa, qb), _ = nvfp4_test_tensors((2, lhs_rows, contract), (2, 128, contract), BMK_DOT, dtype)
    out = _ours_dot(qa, qb, dtype=dtype)
    ref = jnp.einsum("BMK,BNK->BMN", a_dq, b_dq)
    assert_allclose(out, ref.astype(dtype), rtol=1e-2, atol=5e-2, dtype=dtype)


@pytest.mark.gates("jax_scaled_matmul_cpu")
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_scaled_matmul_equals_jax_nn_on_its_inputs(fmt):
    """Where jax.nn's scaled_matmul runs on CPU: the same quantized operands give the same dot as
    ours at the test's tolerance (both dequantize exactly and accumulate in float32)."""
    for (contract, lhs_rows), dtype in zip(MATMUL_SHAPES[::3], DTYPES.values()):
        if fmt == "mxfp8":
            qa, qb, out = _mxfp8_matmul_case(contract, lhs_rows, dtype, batch=2, rhs_rows=128)
            theirs = jax.nn.scaled_matmul(qa.data, qb.data, qa.scale, qb.scale, preferred_element_type=dtype)
            assert_allclose(out, theirs, rtol=1e-3, atol=1e-3, dtype=dtype)
        else:
            _, _, _, (qa, qb), (ga, gb) = nvfp4_test_tensors((2, lhs_rows, contract), (2, 128, contract), BMK_DOT,
                                                            dtype)
            theirs = jax.nn.scaled_matmul(qa.data, qb.data, qa.scale, qb.scale, preferred_element_type=jnp.float32)
            theirs = (theirs * (ga * gb)).astype(dtype)
            assert_allclose(_ours_dot(qa, qb, dtype=dtype), theirs, rtol=1e-2, atol=5e-2, dtype=dtype)


# --------------------------------------------------------------------------- scaled_dot_general
DOT_GENERAL_NVFP4 = [  # a_shape, b_shape, dimension_numbers, is_training
    ((1, 128, 128), (1, 128, 128), (([2], [2]), ([0], [0])), False),
    ((30, 64), (100, 64), (([1], [1]), ([], [])), False),
    ((192, 96), (160, 96), (([1], [1]), ([], [])), True),
    ((64, 128, 4), (128, 128), (([1], [0]), ([], [])), True),
    ((1, 128, 1024), (1, 1024, 128), (([2], [1]), ([0], [0])), True),
    ((1, 128, 128, 2), (128, 1, 2, 128), (([2], [0]), ([0, 3], [1, 2])), True),
]
DOT_GENERAL_MXFP8 = [((1, 32), (2, 32), (([1], [1]), ([], [])), False)] + DOT_GENERAL_NVFP4[1:]


@functools.partial(jax.jit, static_argnames=("fmt", "dn", "out_type", "training", "ours"))
def _dot_general_run(a, b, *, fmt, dn, out_type, training, ours):
    """The loss sum(dot) (and its gradients when training) of ours or of lax.dot_general."""
    def f(x, y):
        if ours:
            return gx.scaled_dot_general(x, y, dn, preferred_element_type=out_type, format=fmt)
        return jax.lax.dot_general(x, y, dn, preferred_element_type=out_type)
    if training:
        return jax.value_and_grad(lambda x, y: jnp.sum(f(x, y)), argnums=(0, 1))(a, b)
    return f(a, b)


def _check_mxfp8_dot_general(a, b, dn, out_type, training):
    """ScaledDotGeneralTest's checks of scaled_dot_general (MXFP8) against lax.dot_general of the
    same inputs: the loss sum(out) at rtol 1e-2 / atol 1e-2, gradients at rtol 1e-2 / atol 1e1."""
    run = functools.partial(_dot_general_run, fmt=gx.MXFP8_E4M3, dn=dn, out_type=out_type, training=training)
    ours, ref = run(a, b, ours=True), run(a, b, ours=False)
    if training:
        assert_allclose(ours[0], ref[0], rtol=1e-2, atol=1e-2)
        for g, g_ref in zip(ours[1], ref[1]):
            assert_allclose(g, g_ref, rtol=1e-2, atol=1e1)
    else:
        assert_allclose(jnp.sum(ours), jnp.sum(ref), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("case,out_type", rotated(range(len(DOT_GENERAL_MXFP8)), keep=(0, 4)))
def test_dot_general_mxfp8(case, out_type):
    """ScaledDotGeneralTest.test_dot_general: E4M3-representable uniform operands (key 0)."""
    a_shape, b_shape, dn, training = DOT_GENERAL_MXFP8[case]
    out_type, dn = DTYPES[out_type], _normalized_dims(dn)
    a, b = jax_test_operands(a_shape=a_shape, b_shape=b_shape, dtype=out_type, seed=0, representable=True)
    _check_mxfp8_dot_general(a, b, dn, out_type, training)


@pytest.mark.parametrize("is_training,out_type", rotated([True, False], ids=["training", "inference"], keep=(0,)))
def test_nn_scaled_dot_general_mxfp8(is_training, out_type):
    """NNFunctionsTest.testScaledDotGeneral: (2, 256, 96) x (2, 96, 160), batch 0, contracting
    2 with 1; tolerances as in ScaledDotGeneralTest."""
    out_type = DTYPES[out_type]
    dn = (((2,), (1,)), ((0,), (0,)))
    a, b = jax_test_operands(a_shape=(2, 256, 96), b_shape=(2, 96, 160), dtype=out_type, seed=0, representable=True)
    _check_mxfp8_dot_general(a, b, dn, out_type, is_training)


@needs_jax_nn_nvfp4
@pytest.mark.parametrize("case,out_type", rotated(range(len(DOT_GENERAL_NVFP4)), keep=(0, 3, 5)))
def test_dot_general_nvfp4(case, out_type):
    """ScaledDotGeneralTest.test_dot_general_nvfp4: raw uniform operands (key 0). scaled_dot_general
    quantizes them as jax.nn does (bit for bit on their (B, M, K) forms, checked with our own
    default global scale, which must be the test's amax / 2688). Inference: the output against the
    dot of jax.nn's dequantized operands (rtol 1e-2, atol 2e-1). Training: the loss against that
    dot's (rtol 1e-2, atol 1e-2), the gradients against lax.dot_general's of the raw operands
    with jax's clipping mask (rtol 1e-2, atol 1e1)."""
    a_shape, b_shape, dn, training = DOT_GENERAL_NVFP4[case]
    out_type, dn = DTYPES[out_type], _normalized_dims(dn)
    (a_raw, b_raw), _, (a_dq, b_dq), _, (ga, gb) = nvfp4_test_tensors(a_shape, b_shape, dn, out_type)
    run = functools.partial(_dot_general_run, fmt=gx.NVFP4, out_type=out_type, training=training)
    ours = run(a_raw, b_raw, dn=dn, ours=True)
    ref_dq = run(a_dq, b_dq, dn=BMK_DOT, ours=False)  # the dot of the dequantized (B, M, K) forms
    if training:
        assert_allclose(ours[0], ref_dq[0], rtol=1e-2, atol=1e-2)
        _, grads_ref = run(a_raw, b_raw, dn=dn, ours=False)
        limit = lambda g: g * jnp.finfo(E2M1).max.astype(out_type) * jnp.finfo(E4M3).max.astype(out_type)  # noqa: E731
        for grad, grad_ref, x, g in zip(ours[1], grads_ref, (a_raw, b_raw), (ga, gb)):
            grad_ref = jnp.where(jnp.abs(x) <= limit(g), grad_ref, 0)  # jax.nn's straight-through estimator
            assert_allclose(grad, grad_ref, rtol=1e-2, atol=1e1)
    else:
        assert_allclose(ours, jnp.reshape(ref_dq, ours.shape), rtol=1e-2, atol=2e-1)


@needs_jax_nn_nvfp4
@pytest.mark.parametrize("enable_grad_clip", [False, True])
@pytest.mark.parametrize("case", subset([0, 1], keep=(0,)))
def test_nvfp4_gradient_clip(enable_grad_clip, case):
    """ScaledDotGeneralTest.test_nvfp4_gradient_clip, float32: gradients are zero where
    |x| > g * 6 * 448 (here: never, g being amax / 2688) and, with clipping on, kept elsewhere."""
    if enable_grad_clip:
        pytest.skip("needs a caller-chosen global scale (jax's test passes 0.9 x amax / 2688 so that the top "
                    "10% of |x| saturate) and jax.nn's straight-through estimator, which zeroes their "
                    "gradients; scaled_dot_general takes no global scale (it computes amax / 2688, with which "
                    "nothing saturates at the global scale) and passes gradients through "
                    "(docs/coming_from.md)")
    a_shape, b_shape, dn, _ = DOT_GENERAL_NVFP4[case]
    a, b = jax_test_operands(a_shape=a_shape, b_shape=b_shape, dtype=jnp.float32, seed=0, representable=False)
    _, (da, db) = _dot_general_run(a, b, fmt=gx.NVFP4, dn=_normalized_dims(dn), out_type=jnp.float32,
                                   training=True, ours=True)
    for x, g in ((a, da), (b, db)):
        assert not np.asarray(jnp.where(jnp.abs(x) > 1e9, g, 0)).any()


VMAP_CASES = [((1, 128, 256), (1, 128, 256), (0, 0, 0)), ((2, 128, 128), (2, 128, 128), (0, 0, 0)),
              ((2, 128, 128), (128, 2, 128), (0, 1, 2))]


@functools.partial(jax.jit, static_argnames=("axes", "ours"))
def _vmapped_value_and_grads(a, b, *, axes, ours):
    dn = (((1,), (1,)), ((), ()))
    f = gx.scaled_dot_general if ours else jax.lax.dot_general
    g = jax.vmap(lambda x, y: f(x, y, dn), in_axes=axes[:2], out_axes=axes[2])
    return jax.value_and_grad(lambda x, y: jnp.sum(g(x, y)), argnums=(0, 1))(a, b)


@pytest.mark.parametrize("case", subset(range(len(VMAP_CASES)), keep=(2,)))
def test_dot_general_vmap(case):
    """ScaledDotGeneralTest.test_dot_general_vmap: scaled_dot_general under vmap (in_axes a, b;
    out_axes o), loss and gradients against vmapped lax.dot_general (rtol 1e-2; atol 1e2 / 1e1)."""
    a_shape, b_shape, axes = VMAP_CASES[case]
    a, b = jax_test_operands(a_shape=a_shape, b_shape=b_shape, dtype=jnp.float32, seed=0, representable=True)
    out, (da, db) = _vmapped_value_and_grads(a, b, axes=axes, ours=True)
    out_ref, (da_ref, db_ref) = _vmapped_value_and_grads(a, b, axes=axes, ours=False)
    assert_allclose(out, out_ref, rtol=1e-2, atol=1e2)
    assert_allclose(da, da_ref, rtol=1e-2, atol=1e1)
    assert_allclose(db, db_ref, rtol=1e-2, atol=1e1)


# --------------------------------------------------------------------------- quantize (NVFP4)
@needs_jax_nn_nvfp4
@pytest.mark.parametrize("shape", subset([(1, 128, 128), (64, 32), (1024, 2048)], keep=(1, 2),
                                          ids=["1x128x128", "64x32", "1024x2048"]))
def test_quantize_nvfp4(shape):
    """ScaledDotGeneralTest.test_quantize_nvfp4: uniform [1, 8) float32 (key 0), global scale
    amax / 2688: our elements and scales equal jax.nn's eager ones, and its jitted ones wherever
    those equal its eager ones (jax's test holds the two together; jaxlib 0.10's jitted quantizer
    rounds one E2M1 tie of the largest shape away from even); dequantized within rtol 0.2 /
    atol 0.5 of the input."""
    k1, _ = jax.random.split(jax.random.key(0), 2)
    a = jax.random.uniform(k1, shape, minval=1.0, maxval=8.0, dtype=jnp.float32)
    g = jax_test_global_scale(a)
    ours = jax.jit(lambda x, s: gx.quantize(x, gx.NVFP4, global_scale=s))(a, g)
    eager = jax_nn_quantize(a, nvfp4_config(g))
    assert_same_bits(ours.data, eager[0], "elements (eager jax.nn)")
    assert_same_bits(ours.scale, eager[1], "scales (eager jax.nn)")
    jitted = _jax_nn_quantize_jit(a, g, mode="nvfp4")
    agree = bits(jitted[0]) == bits(eager[0])
    assert (bits(ours.data)[agree] == bits(jitted[0])[agree]).all() and same_bits(ours.scale, jitted[1])
    assert_allclose(gx.dequantize(ours), a, rtol=0.2, atol=0.5)


@needs_jax_nn_nvfp4
@pytest.mark.parametrize("value", [1e6, 1 / 4096], ids=["1e6", "1_4096"])
def test_quantize_requires_global_scale(value):
    """ScaledDotGeneralTest.test_quantize_requires_global_scale: a block of one value far from 1
    round-trips exactly with the global scale amax / 2688 (without one it would clip at 2688 or
    flush to 0); our default global scale is that one."""
    a = jnp.array([value] * 16, jnp.float32)
    g = jax_test_global_scale(a)
    ours = gx.quantize(a, gx.NVFP4)
    assert_same_bits(ours.global_scale, g, "global scale")
    jax_nn_quantize_checked(ours, a, g, what="block")
    np.testing.assert_array_equal(np.asarray(gx.dequantize(ours)), np.asarray(a))
