"""block_scaled_dot / scaled_dot_general (issue 4).

The reference backend is checked against a float64 NumPy statement of the block-scaled math
written here, independently of jax_gpuext.dot: sum_k l[m,k] s_l[m,k//b] r[n,k] s_r[n,k//b],
times the global scales. GPU backends are checked against the reference (marked gpu).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_gpuext as gx
import _command_buffer as cb
from jax_gpuext import UnsupportedError, dot as dot_mod
from jax_gpuext.common import backends
from jax_gpuext.dot import common as dot_common

FORMATS_1D = [gx.MXFP8_E4M3, gx.MXFP8_E5M2, gx.MXFP4, gx.NVFP4, gx.FP8_1x128, gx.FP8_TENSOR]
MX_FORMATS = [gx.MXFP8_E4M3, gx.MXFP8_E5M2, gx.MXFP4]


# --------------------------------------------------------------------------- float64 NumPy math
def np_dequant(q) -> np.ndarray:
    """data * per-element block scale in float64, by explicit block indices (no jnp.repeat)."""
    data = np.asarray(q.data.astype(jnp.float32), np.float64)
    scale = np.asarray(q.scale.astype(jnp.float32), np.float64)
    nd = data.ndim
    blocks = q.format.block
    if not blocks:  # FP8_TENSOR: one scale, or one per leading (batch) index if quantized under vmap
        s = scale.reshape(scale.shape + (1,) * (nd - scale.ndim))
    elif len(blocks) == 2:
        r = np.arange(data.shape[-2]) // blocks[0]
        c = np.arange(data.shape[-1]) // blocks[1]
        s = scale[..., r, :][..., c]
    else:
        ax = q.axis % nd
        idx = np.arange(data.shape[ax]) // blocks[0]
        s = np.take(scale, idx, axis=ax)
    return data * s


def np_block_scaled_dot(lhs, rhs, dn) -> np.ndarray:
    (lc, rc), (lb, rb) = dn
    out = lax.dot_general(jnp.zeros(lhs.data.shape, jnp.float32), jnp.zeros(rhs.data.shape, jnp.float32), dn)
    l, r = np_dequant(lhs), np_dequant(rhs)
    # generic dot_general in float64 via einsum letters
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    ls = [next(letters) for _ in range(l.ndim)]
    rs = [next(letters) for _ in range(r.ndim)]
    for a, b in zip(lc + lb, rc + rb):
        rs[b] = ls[a]
    outs = [ls[d] for d in lb] + [ls[d] for d in range(l.ndim) if d not in lc and d not in lb] + \
           [rs[d] for d in range(r.ndim) if d not in rc and d not in rb]
    res = np.einsum(f"{''.join(ls)},{''.join(rs)}->{''.join(outs)}", l, r)
    g = np.ones(())
    for q in (lhs, rhs):
        if q.global_scale is not None:  # leading dims (vmap) are the first batch dims = output's first dims
            gq = np.asarray(q.global_scale, np.float64)
            g = g * gq.reshape(gq.shape + (1,) * (res.ndim - gq.ndim))
    assert res.shape == out.shape
    return res * g, np.einsum(f"{''.join(ls)},{''.join(rs)}->{''.join(outs)}", np.abs(l), np.abs(r)) * np.abs(g)


def assert_close_to_f64(y, want, mag, rtol=2e-6):
    """fp32 accumulation: |error| <= rtol * sum_k |terms| (+ an ulp of the result)."""
    y = np.asarray(y, np.float64)
    bound = rtol * mag + 1e-6 * np.abs(want) + 1e-30
    bad = np.abs(y - want) > bound
    assert not bad.any(), f"max excess {np.max(np.abs(y - want) - bound)} at {np.argwhere(bad)[:3]}"


def rand(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


# --------------------------------------------------------------------------- reference vs float64
CASES = [  # (lhs shape, rhs shape, dimension numbers)
    ((3, 5, 96), (3, 7, 96), (((2,), (2,)), ((0,), (0,)))),  # odd batch
    ((1, 64), (9, 64), (((1,), (1,)), ((), ()))),  # M = 1
    ((4, 2048), (6, 2048), (((1,), (1,)), ((), ()))),  # large K
    ((2, 100), (100, 3), (((1,), (0,)), ((), ()))),  # partial block, rhs contracts axis 0
    ((5, 3, 48), (5, 48, 4), (((2,), (1,)), ((0,), (0,)))),  # batch, rhs K in the middle
]


@pytest.mark.parametrize("fmt", FORMATS_1D, ids=lambda f: f.name)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_reference_matches_float64(fmt, case):
    ls, rs, dn = CASES[case]
    (lc, rc), _ = dn
    lhs = gx.quantize(rand(1, ls, 3.0), fmt, axis=lc[0])
    rhs = gx.quantize(rand(2, rs, 0.5), fmt, axis=rc[0])
    y = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dn, preferred_element_type=jnp.float32,
                                                 backend="reference"))(lhs, rhs)
    want, mag = np_block_scaled_dot(lhs, rhs, dn)
    assert y.shape == want.shape and y.dtype == jnp.float32
    assert_close_to_f64(y, want, mag)


@pytest.mark.parametrize("rhs_shape,dn", [
    ((256, 130), (((1,), (0,)), ((), ()))),  # weights (K, N), 2 x 2 blocks, partial N block
    ((130, 256), (((1,), (1,)), ((), ()))),  # weights (N, K)
])
def test_fp8_blockwise_1x128_x_128x128(rhs_shape, dn):
    lhs = gx.quantize(rand(3, (33, 256), 2.0), gx.FP8_1x128)
    rhs = gx.quantize(rand(4, rhs_shape, 0.1), gx.FP8_128x128)
    # the reference: float64-tight; GPU backends are compared with it in the gpu tests
    y = gx.block_scaled_dot(lhs, rhs, dn, preferred_element_type=jnp.float32, backend="reference")
    want, mag = np_block_scaled_dot(lhs, rhs, dn)
    assert_close_to_f64(y, want, mag)


@pytest.mark.parametrize("lf", MX_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("rf", MX_FORMATS, ids=lambda f: f.name)
def test_mixed_mx_pairs_match_float64(lf, rf):
    """Any MXFP8 (E4M3/E5M2) x MXFP4 pairing (issue 19): MXFP4 weights x MXFP8 activations is the
    gpt-oss serving recipe. K = 160 has a partial last block."""
    dn = (((2,), (2,)), ((0,), (0,)))
    lhs = gx.quantize(rand(11, (2, 9, 160), 3.0), lf)
    rhs = gx.quantize(rand(12, (2, 13, 160), 0.02), rf)
    want, mag = np_block_scaled_dot(lhs, rhs, dn)
    for backend in ("reference", "auto"):
        y = jax.jit(lambda a, b, be=backend: gx.block_scaled_dot(a, b, dn, preferred_element_type=jnp.float32,
                                                                 backend=be))(lhs, rhs)
        assert_close_to_f64(y, want, mag)


def cpu_mx_dot():
    """What auto runs for MX operands on this CPU (issue 18): XLA's bf16 dot where the CPU has
    bf16 dot instructions, else the f32 reference (tests/dot/test_dot_xla.py checks both choices)."""
    from jax_gpuext.common import cpu_features

    return "xla" if cpu_features.has_bf16_dot_instructions() else "reference"


def test_mixed_mx_explain_and_library_gates():
    """cuBLASLt and cuDNN refuse MXFP4 operands with their reason; hopper_mx takes them."""
    from jax_gpuext.dot import cublaslt as dot_cublaslt
    from jax_gpuext.dot import cudnn as dot_cudnn
    from jax_gpuext.dot import hopper_mx

    lhs = gx.quantize(rand(13, (64, 256)), gx.MXFP8_E4M3)
    rhs = gx.quantize(rand(14, (128, 256)), gx.MXFP4)
    p = dot_common._problem(lhs, rhs, None, jnp.dtype(jnp.bfloat16))
    assert "MXFP4" in p.describe()
    for backend, words in ((dot_cublaslt, "VEC32_UE8M0"), (dot_cudnn, "E8M0 per 32")):
        r = backend.supports(p)
        assert not r.supported and words in r.reason, r.reason
    r = hopper_mx.supports(p)
    assert r.supported or "sm_90a" in r.reason or "no CUDA extension" in r.reason, r.reason
    a, sa = hopper_mx.prepare_mx(*dot_mod.to_canonical(rhs, 1, ()))
    assert a.dtype == jnp.float8_e4m3fn  # E2M1 widened exactly
    np.testing.assert_array_equal(np.asarray(a[0, :, :256].astype(jnp.float32)),
                                  np.asarray(rhs.data.astype(jnp.float32)))
    e = gx.explain(lambda x, w: gx.block_scaled_dot(x, w), lhs, rhs)
    # on CPU auto takes XLA's bf16 dot for MX where the CPU has bf16 dot instructions (issue 18)
    assert e.calls[0].chosen == cpu_mx_dot() and "hopper_mx" in dict(e.calls[0].rejected), str(e)


def test_scaled_dot_general_mxfp4_weights_with_mxfp8_activations():
    x, w = rand(15, (8, 96)), rand(16, (96, 24), 0.1)
    dn = (((1,), (0,)), ((), ()))
    fmt = (gx.MXFP8_E4M3, gx.MXFP4)
    f = jax.jit(lambda a, b: gx.scaled_dot_general(a, b, dn, preferred_element_type=jnp.float32, format=fmt))
    y = f(x, w)
    qx, qw = gx.quantize(x, gx.MXFP8_E4M3), gx.quantize(w, gx.MXFP4, axis=0)
    want, mag = np_block_scaled_dot(qx, qw, dn)
    assert_close_to_f64(y, want, mag)
    g = jax.grad(lambda b: jnp.sum(gx.scaled_dot_general(x, b, dn, preferred_element_type=jnp.float32,
                                                         format=fmt)))(w)
    assert g.shape == w.shape and np.isfinite(np.asarray(g)).all()
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(np.asarray(x).sum(0)[:, None], w.shape),
                               rtol=0.15, atol=0.15)


def test_default_dimension_numbers_and_output_dtypes():
    lhs = gx.quantize(rand(5, (8, 64)), gx.MXFP8_E4M3)
    rhs = gx.quantize(rand(6, (16, 64)), gx.MXFP8_E4M3)
    y32 = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32)
    for dt in (jnp.bfloat16, jnp.float16):
        y = gx.block_scaled_dot(lhs, rhs, preferred_element_type=dt)
        assert y.dtype == dt and y.shape == (8, 16)
        # the fp32 accumulator is cast once
        np.testing.assert_array_equal(np.asarray(y), np.asarray(y32.astype(dt)))


def test_nvfp4_global_scales_applied():
    x, w = rand(7, (4, 64), 100.0), rand(8, (5, 64), 1e-3)
    lhs = gx.quantize(x, gx.NVFP4, global_scale=jnp.float32(0.25))
    rhs = gx.quantize(w, gx.NVFP4)
    y = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32)
    want, mag = np_block_scaled_dot(lhs, rhs, (((1,), (1,)), ((), ())))
    assert_close_to_f64(y, want, mag)
    # Against the unquantized product, within docs/formats.md's error bound (|x - deq(q(x))| <= amax/4
    # of x's 16-element block, both roundings): a wrong or missing global scale is far outside it.
    xs, ws = (np.asarray(v, np.float64) for v in (x, w))
    ex, ew = (np.repeat(np.abs(v).reshape(len(v), -1, 16).max(-1), 16, -1) / 4 for v in (xs, ws))
    bound = ex @ np.abs(ws).T + np.abs(xs) @ ew.T + ex @ ew.T
    assert (np.abs(np.asarray(y, np.float64) - xs @ ws.T) <= bound * 1.001).all()
    assert np.abs(np.asarray(y, np.float64) - xs @ ws.T).max() < 0.2 * np.abs(xs @ ws.T).max()


@pytest.mark.parametrize("fmt", [gx.FP8_TENSOR, gx.NVFP4], ids=lambda f: f.name)
def test_per_example_scales_from_vmap_used_outside_it(fmt):
    """MoE-style: per-expert weights quantized under vmap carry one per-tensor value per expert
    (FP8_TENSOR scale, NVFP4 global scale); a batched dot over the expert axis applies each
    expert's own, equal to the dot taken under vmap and to the float64 math."""
    scales = jnp.array([1e-3, 1.0, 300.0])[:, None, None]  # very different per-expert ranges
    x = rand(40, (3, 6, 64)) * scales
    w = rand(41, (3, 5, 64)) / scales
    qx = jax.vmap(lambda v: gx.quantize(v, fmt))(x)
    qw = jax.vmap(lambda v: gx.quantize(v, fmt))(w)
    per = qx.scale if fmt.per_tensor else qx.global_scale
    assert per.shape == (3,) and len(set(np.asarray(per).tolist())) == 3
    dn = (((2,), (2,)), ((0,), (0,)))
    y = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dn, preferred_element_type=jnp.float32))(qx, qw)
    want, mag = np_block_scaled_dot(qx, qw, dn)
    assert_close_to_f64(y, want, mag)
    under_vmap = jax.vmap(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32))(qx, qw)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(under_vmap))
    # a second batch axis after the per-expert one: each expert's value covers its whole slice
    x2 = jnp.stack([x, -x], axis=1)  # (3, 2, 6, 64)
    qx2 = jax.vmap(lambda v: gx.quantize(v, fmt))(x2)
    qw2 = jax.tree_util.tree_map(lambda a: jnp.stack([a, a], axis=1) if a.ndim > 1 else a, qw)
    dn2 = (((3,), (3,)), ((0, 1), (0, 1)))
    want2, mag2 = np_block_scaled_dot(qx2, qw2, dn2)
    assert_close_to_f64(gx.block_scaled_dot(qx2, qw2, dn2, preferred_element_type=jnp.float32), want2, mag2)


def test_per_example_scales_must_lead_the_batch_dims():
    qx = jax.vmap(lambda v: gx.quantize(v, gx.FP8_TENSOR))(rand(42, (3, 6, 64)))
    qw = gx.quantize(rand(43, (5, 64)), gx.FP8_TENSOR)
    with pytest.raises(ValueError, match=r"lhs's scale has one value per entry of axes \[0\]"):
        gx.block_scaled_dot(qx, qw, (((2,), (1,)), ((), ())))  # expert axis is a free dim here
    qw3 = gx.quantize(rand(44, (3, 5, 64)), gx.FP8_TENSOR)
    dn = (((2,), (2,)), ((0,), (0,)))
    assert gx.block_scaled_dot(qx, qw3, dn, preferred_element_type=jnp.float32).shape == (3, 6, 5)
    with pytest.raises(ValueError, match=r"must have shape \[3\], got float32\[2\]"):
        gx.BlockScaledArray(qx.data, qx.scale[:2], None, gx.FP8_TENSOR, qx.axis)
    bad = jax.tree.map(lambda a: a, qx)
    bad.scale = qx.scale[:2]  # parts replaced after construction are checked by the op
    with pytest.raises(ValueError, match=r"block_scaled_dot: lhs: scale .* got float32\[2\]"):
        gx.block_scaled_dot(bad, qw3, dn)
    # GPU backends that take one alpha per call say why they pass on per-expert NVFP4 global scales
    from jax_gpuext.dot import cublaslt as dot_cublaslt
    from jax_gpuext.dot import cudnn as dot_cudnn

    nx = jax.vmap(lambda v: gx.quantize(v, gx.NVFP4))(rand(45, (3, 6, 128)))
    nw = jax.vmap(lambda v: gx.quantize(v, gx.NVFP4))(rand(46, (3, 8, 128)))
    p = dot_common._problem(nx, nw, dn, jnp.dtype(jnp.float32))
    assert p.batched_global_scale
    for backend in (dot_cublaslt, dot_cudnn):
        r = backend.supports(p)
        assert not r.supported and "per batch entry" in r.reason, r.reason


@pytest.mark.gates("jax_scaled_matmul_cpu")
@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.NVFP4], ids=lambda f: f.name)
def test_matches_jax_nn_scaled_matmul(fmt):
    lhs = gx.quantize(rand(9, (2, 16, 128)), fmt)
    rhs = gx.quantize(rand(10, (2, 24, 128)), fmt)
    dn = (((2,), (2,)), ((0,), (0,)))
    ours = gx.block_scaled_dot(lhs, rhs, dn, preferred_element_type=jnp.float32)
    theirs = jax.nn.scaled_matmul(lhs.data, rhs.data, lhs.scale, rhs.scale, preferred_element_type=jnp.float32)
    if fmt.has_global_scale:
        theirs = theirs * lhs.global_scale * rhs.global_scale
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- scaled_dot_general
DN_DENSE = (((1,), (0,)), ((), ()))


def _np_grads(x, w, g, rec):
    """The VJP stated independently: quantize the cotangent and the residuals along the
    backward contracting axes, then float64 dots."""
    q = functools.partial(gx.quantize, axis=-1)
    # dx[m,k] = sum_n g[m,n] w[k,n]  (w is (K, N): contract N)
    gq_n = q(g, rec.grad)
    wq_n = q(w, rec.rhs_bwd) if not rec.rhs_bwd.name == "FP8_128x128" else gx.quantize(w, rec.rhs_bwd)
    dx, _ = np_block_scaled_dot(gq_n, wq_n, (((1,), (1,)), ((), ())))
    # dw[k,n] = sum_m x[m,k] g[m,n]  (contract M): quantize x^T and g^T along M
    gq_m = q(g.T, rec.grad)
    xq_m = q(x.T, rec.lhs_bwd)
    dwt, _ = np_block_scaled_dot(gq_m, xq_m, (((1,), (1,)), ((), ())))  # (N, K)
    return dx, dwt.T


@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.NVFP4, (gx.FP8_1x128, gx.FP8_128x128), gx.FP8_TENSOR],
                         ids=["mxfp8", "nvfp4", "fp8_blockwise", "fp8_per_tensor"])
def test_grads_match_reference_vjp(fmt):
    x, w = rand(11, (24, 256)), rand(12, (256, 40), 0.05)
    g = rand(13, (24, 40))
    f = lambda x, w: gx.scaled_dot_general(x, w, DN_DENSE, preferred_element_type=jnp.float32, format=fmt)
    y, vjp = jax.vjp(jax.jit(f), x, w)
    dx, dw = vjp(g)
    rec = dot_mod.recipe(fmt)
    want_dx, want_dw = _np_grads(x, w, g, rec)
    np.testing.assert_allclose(np.asarray(dx), want_dx, rtol=1e-4, atol=1e-4 * np.abs(want_dx).max())
    np.testing.assert_allclose(np.asarray(dw), want_dw, rtol=1e-4, atol=1e-4 * np.abs(want_dw).max())
    # and all of it approximates the high-precision dot and its VJP
    for got, exact in ((y, x @ w), (dx, g @ w.T), (dw, x.T @ g)):
        rel = float(jnp.linalg.norm(got - exact) / jnp.linalg.norm(exact))
        assert rel < (0.2 if fmt is gx.NVFP4 else 0.08), rel


def test_recipe_defaults():
    r = dot_mod.recipe(gx.MXFP8_E4M3)
    assert (r.grad, r.lhs_bwd, r.rhs_bwd) == (gx.MXFP8_E5M2, gx.MXFP8_E4M3, gx.MXFP8_E4M3)
    r = dot_mod.recipe(gx.NVFP4)  # NVFP4 forward, MXFP8 backward (documented)
    assert (r.grad, r.lhs_bwd, r.rhs_bwd) == (gx.MXFP8_E5M2, gx.MXFP8_E4M3, gx.MXFP8_E4M3)
    r = dot_mod.recipe((gx.FP8_1x128, gx.FP8_128x128))
    assert (r.grad, r.lhs_bwd, r.rhs_bwd) == (gx.FP8_1x128, gx.FP8_1x128, gx.FP8_128x128)
    r = dot_mod.recipe(gx.FP8_TENSOR)  # E4M3 both ways (design.md)
    assert (r.grad, r.lhs_bwd, r.rhs_bwd) == (gx.FP8_TENSOR, gx.FP8_TENSOR, gx.FP8_TENSOR)


def test_per_tensor_contracts_any_axis_and_cublaslt_alignment():
    """One FP8_TENSOR scale covers every axis, so any axis may be contracted; cuBLASLt's FP8
    alignment (K, N multiples of 16) is checked in supports(), before any GPU is involved."""
    from jax_gpuext.dot import cublaslt as dot_cublaslt

    x, w = gx.quantize(rand(40, (6, 48), 2.0), gx.FP8_TENSOR), gx.quantize(rand(41, (48, 32)), gx.FP8_TENSOR)
    dn = (((1,), (0,)), ((), ()))  # w was "quantized along" axis -1, contracted along 0
    y = gx.block_scaled_dot(x, w, dn, preferred_element_type=jnp.float32, backend="reference")
    want, mag = np_block_scaled_dot(x, w, dn)
    assert_close_to_f64(y, want, mag)
    assert dot_cublaslt.supports(dot_common._problem(x, w, dn, jnp.dtype(jnp.bfloat16))).supported
    w40 = gx.quantize(rand(42, (40, 32)), gx.FP8_TENSOR)
    x40 = gx.quantize(rand(43, (6, 40)), gx.FP8_TENSOR)
    r = dot_cublaslt.supports(dot_common._problem(x40, w40, dn, jnp.dtype(jnp.bfloat16)))
    assert not r.supported and "K=40" in r.reason


def test_cublaslt_fp8_blockwise_scale_layouts_match_the_cublas_docs():
    """The scale buffers as cuBLAS reads them (cuBLAS docs, "Scaling factors layouts"), emulated
    independently: VEC128_32F is rows-major (element (r, kb) at kb * rows + r, rows % 4 == 0);
    BLK128x128_32F is K-major with the column stride L4 = round_up(Kb, 4) (element (j, kb) at
    j * L4 + kb). Odd block counts catch a transposed or unpadded layout."""
    from jax_gpuext.dot import cublaslt as dot_cublaslt

    rng = np.random.default_rng(7)
    for nb, kb in [(2, 1), (1, 2), (3, 5), (4, 8)]:
        s = rng.random((2, nb, kb)).astype(np.float32)
        buf = np.asarray(dot_cublaslt._operand(jnp.zeros((2, nb * 128, kb * 128), jnp.float8_e4m3fn), s,
                                               dot_mod.format_info(gx.FP8_128x128))[1])
        l4 = -(-kb // 4) * 4
        assert buf.shape == (2, nb * l4)
        for b in range(2):
            read = np.array([[buf[b, j * l4 + i] for i in range(kb)] for j in range(nb)])
            np.testing.assert_array_equal(read, s[b])
    for rows, kb in [(4, 3), (36, 2)]:
        s = rng.random((2, rows, kb)).astype(np.float32)
        buf = np.asarray(dot_cublaslt._operand(jnp.zeros((2, rows, kb * 128), jnp.float8_e4m3fn), s,
                                               dot_mod.format_info(gx.FP8_1x128))[1])
        for b in range(2):
            read = np.array([[buf[b, i * rows + r] for i in range(kb)] for r in range(rows)])
            np.testing.assert_array_equal(read, s[b])


def test_cublaslt_pads_activation_rows_and_checks_output_row_alignment():
    """The 1x128 lhs (cuBLAS's B, VEC128_32F) is padded to 16 rows (TransformerEngine needs % 8,
    NVIDIA tests % 16), N (cuBLAS's m) must be % 8 in every block-scaling mode, and float16
    output is refused for FP8 blockwise (not in NVIDIA's tests): all decided before any GPU."""
    from jax_gpuext.dot import cublaslt as dot_cublaslt

    assert dot_cublaslt.FP8_BLOCK_ROW_MULTIPLE == 16 and dot_cublaslt.BLOCK_SCALED_N_MULTIPLE == 8
    data, scale = jnp.ones((1, 33, 256), jnp.float8_e4m3fn), jnp.full((1, 33, 2), 2.0, jnp.float32)
    d, s = dot_cublaslt._pad_rows(data, scale)
    assert d.shape == (1, 48, 256) and s.shape == (1, 48, 2)
    assert not np.asarray(d[:, 33:].astype(jnp.float32)).any() and (np.asarray(s[:, 33:]) == 1).all()
    d, s = dot_cublaslt._pad_rows(data[:, :32], scale[:, :32])
    assert d.shape == (1, 32, 256)  # already a multiple: no copy
    x = gx.quantize(rand(44, (8, 64), 2.0), gx.FP8_TENSOR)
    for n, out, ok in [(32, jnp.bfloat16, True), (36, jnp.float32, False), (40, jnp.float32, False)]:
        w = gx.quantize(rand(45, (n, 64)), gx.FP8_TENSOR)
        r = dot_cublaslt.supports(dot_common._problem(x, w, (((1,), (1,)), ((), ())), jnp.dtype(out)))
        assert r.supported == ok, r.reason
    xb = gx.quantize(rand(47, (8, 128)), gx.FP8_1x128)
    for fmt_r, n, out, why in [(gx.FP8_1x128, 36, jnp.float32, "N=36"), (gx.FP8_128x128, 260, jnp.float32, "N=260"),
                               (gx.FP8_128x128, 256, jnp.float16, "float16"), (gx.FP8_1x128, 8, jnp.float16, "float16")]:
        w = gx.quantize(rand(46, (n, 128)), fmt_r)
        r = dot_cublaslt.supports(dot_common._problem(xb, w, (((1,), (1,)), ((), ())), jnp.dtype(out)))
        assert not r.supported and why in r.reason, r.reason
    for fmt in (gx.MXFP8_E4M3, gx.NVFP4):  # N % 8 in the Blackwell modes too, before any hardware gate
        r = dot_cublaslt.supports(dot_common._problem(gx.quantize(rand(48, (8, 64)), fmt), gx.quantize(rand(49, (12, 64)), fmt),
                                                   (((1,), (1,)), ((), ())), jnp.dtype(jnp.bfloat16)))
        assert not r.supported and "N=12" in r.reason, r.reason


def test_cublaslt_reads_padded_1x128_scales_with_the_padded_leading_dimension():
    """impl's padding + layout, read back the way cuBLAS reads VEC128_32F for its B operand
    (element (r, kb) at kb * ld + r, ld = the padded M): real rows get their scales, padding rows
    scale 1 over zero data, so the sliced-off output rows are the only ones they touch."""
    from jax_gpuext.dot import cublaslt as dot_cublaslt

    rng = np.random.default_rng(8)
    for m, kb in [(33, 3), (16, 2), (1, 1)]:
        s = rng.random((2, m, kb)).astype(np.float32) + 0.5
        d, sp = dot_cublaslt._pad_rows(jnp.zeros((2, m, kb * 128), jnp.float8_e4m3fn), jnp.asarray(s))
        ld = -(-m // 16) * 16
        buf = np.asarray(dot_cublaslt._operand(d, sp, dot_mod.format_info(gx.FP8_1x128))[1])
        assert d.shape[1] == ld and buf.shape == (2, kb * ld)
        for b in range(2):
            read = np.array([[buf[b, i * ld + r] for i in range(kb)] for r in range(ld)])
            np.testing.assert_array_equal(read[:m], s[b])
            assert (read[m:] == 1).all()


@pytest.fixture
def cuda_cublaslt(monkeypatch):
    """Backend selection as on a Hopper GPU with the cuBLASLt dot built, on this CPU: the gates
    cuBLASLt needs read open and the trace-time heuristic query (which needs the GPU) is skipped,
    so what is left is supports()'s own decision and the module lowered for CUDA."""
    from jax_gpuext.common import gates
    from jax_gpuext.common.gates import GateResult
    from jax_gpuext.dot import cublaslt as dot_cublaslt

    opened = set(dot_cublaslt._GATES_NEEDED) | {"hopper", "cublaslt_blockwise_fp8"}
    real = gates.check
    monkeypatch.setattr(gates, "check", lambda name: GateResult(True, "opened by the test") if name in opened
                        else real(name))
    monkeypatch.setattr(dot_cublaslt, "_prepare_on_local_gpus", lambda p: GateResult(True, p.describe()))
    return dot_cublaslt


def _lowered_for_cuda(f, *args) -> str:
    """f traced with backends selected for CUDA (operands made before, on this CPU's own paths)."""
    with backends.platform("cuda"):
        return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


PER_TENSOR_CASES = ("batched-shared-scale", "vmapped", "batched-per-batch-scales")


def _per_tensor_cases(backend="auto"):
    """The three layouts of test_gpu_per_tensor_batched_and_vmapped (the H200 run's
    CUBLAS_STATUS_NOT_SUPPORTED): (name, function, operands, batch entries per call)."""
    dn = (((2,), (2,)), ((0,), (0,)))
    a = gx.quantize(rand(34, (3, 64, 256)), gx.FP8_TENSOR)
    b = gx.quantize(rand(35, (3, 128, 256), 0.1), gx.FP8_TENSOR)
    qs = jax.vmap(lambda v: gx.quantize(v, gx.FP8_TENSOR))(rand(36, (4, 32, 128)))
    ws = jax.vmap(lambda v: gx.quantize(v, gx.FP8_TENSOR))(rand(38, (4, 64, 128)))
    w = gx.quantize(rand(37, (64, 128)), gx.FP8_TENSOR)
    batched = lambda p, q: gx.block_scaled_dot(p, q, dn, preferred_element_type=jnp.float32,  # noqa: E731
                                               backend=backend)
    vmapped = jax.vmap(lambda q: gx.block_scaled_dot(q, w, preferred_element_type=jnp.float32, backend=backend))
    return list(zip(PER_TENSOR_CASES, (batched, vmapped, batched), ((a, b), (qs,), (qs, ws)), (3, 1, 4)))


def test_cublaslt_per_tensor_scales_sit_in_16_byte_slots(cuda_cublaslt):
    """Issue 33: a batched per-tensor FP8 dot failed on the H200 with CUBLAS_STATUS_NOT_SUPPORTED.
    Its scales were packed one float32 per batch entry, so the handler gave cuBLASLt scale
    pointers at base + 4 * i, the only pointers of any scale mode not 16-byte aligned (every
    block-scale layout's per-batch size is a multiple of 16 bytes). Now each batch entry's scale
    has a 16-byte slot, value first, and batched / vmapped per-tensor dots stay on cuBLASLt."""
    info = dot_mod.format_info(gx.FP8_TENSOR)
    s = jnp.array([1.5, -2.0, 3.25], jnp.float32).reshape(3, 1, 1)
    _, buf = cuda_cublaslt._operand(jnp.zeros((3, 16, 32), jnp.float8_e4m3fn), s, info)
    assert cuda_cublaslt.SCALAR_SCALE_SLOT * 4 == 16
    assert buf.shape == (3, cuda_cublaslt.SCALAR_SCALE_SLOT) and buf.dtype == jnp.float32
    raw = np.asarray(buf).tobytes()
    for i, v in enumerate((1.5, -2.0, 3.25)):  # as the handler reads it: 4 bytes at offset 16 * i
        assert np.frombuffer(raw[16 * i:16 * i + 4], np.float32)[0] == v
    assert not np.asarray(buf)[:, 1:].any()
    for name, f, args, per_call in _per_tensor_cases():
        with backends.recording() as calls:
            text = _lowered_for_cuda(f, *args)
        (sel,) = [c for c in calls if c.op == "block_scaled_dot"]
        assert sel.chosen == "cublaslt", (name, sel)
        assert "gpuext_block_scaled_dot_cublaslt" in text, name
        assert f"tensor<{per_call}x{cuda_cublaslt.SCALAR_SCALE_SLOT}xf32>" in text, name


def test_cuda_training_step_lowers_its_three_dots_to_cublaslt(cuda_cublaslt):
    """Issue 33: the H200 run counted 2 of "3" dots of test_gpu_training_step_uses_cublaslt in
    our call. That step differentiated the weight only: the input gradient (dgrad) is never used,
    so JAX drops its dot with the rest of the dead code. All three dots (forward, dgrad, wgrad)
    choose cuBLASLt: the wgrad's operands, quantized along M (the token axis it contracts), are
    FP8_1x128 x FP8_1x128, which cuBLASLt takes. A step that needs dgrad (argnums=(0, 1), as for
    any layer but the first) lowers all three."""
    x, w = rand(32, (256, 512)), rand(33, (512, 256), 0.05)
    fmt = (gx.FP8_1x128, gx.FP8_128x128)

    def loss(x, w):
        return jnp.sum(gx.scaled_dot_general(x, w, DN_DENSE, format=fmt) ** 2)
    target = "gpuext_block_scaled_dot_cublaslt"
    with backends.recording() as calls:
        both = _lowered_for_cuda(jax.grad(loss, argnums=(0, 1)), x, w)
    dots = [c for c in calls if c.op == "block_scaled_dot"]
    assert [c.chosen for c in dots] == ["cublaslt"] * 3, dots
    assert both.count(f"custom_call @{target}(") == 3
    only_w = _lowered_for_cuda(jax.grad(loss, argnums=1), x, w)
    assert only_w.count(f"custom_call @{target}(") == 2


def test_scaled_dot_general_batch_dims_vmap_and_jit():
    x, w = rand(14, (3, 5, 64)), rand(15, (3, 64, 6))
    dn = (((2,), (1,)), ((0,), (0,)))
    y = jax.jit(lambda a, b: gx.scaled_dot_general(a, b, dn))(x, w)
    assert y.shape == (3, 5, 6) and y.dtype == jnp.float32
    yv = jax.vmap(lambda a, b: gx.scaled_dot_general(a, b, DN_DENSE))(x, w)
    np.testing.assert_allclose(np.asarray(yv), np.asarray(y), rtol=1e-6, atol=1e-6)
    gv = jax.vmap(jax.grad(lambda a, b: gx.scaled_dot_general(a, b, DN_DENSE).sum()))(x, w)
    assert gv.shape == x.shape and bool(jnp.all(jnp.isfinite(gv)))


def test_scaled_dot_general_bf16_and_multi_free_dims():
    x = rand(16, (2, 3, 64)).astype(jnp.bfloat16)  # two free dims on lhs, as in flax Dense on (B, T, D)
    w = rand(17, (64, 8)).astype(jnp.bfloat16)
    y = gx.scaled_dot_general(x, w, (((2,), (0,)), ((), ())))
    assert y.shape == (2, 3, 8) and y.dtype == jnp.bfloat16
    exact = jnp.einsum("btd,dn->btn", x.astype(jnp.float32), w.astype(jnp.float32))
    assert float(jnp.linalg.norm(y.astype(jnp.float32) - exact) / jnp.linalg.norm(exact)) < 0.08


def test_shard_map():
    from jax.sharding import Mesh, PartitionSpec as P

    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))
    x, w = rand(18, (8, 64)), rand(19, (64, 4))
    f = shard_map(lambda a, b: gx.scaled_dot_general(a, b, DN_DENSE), mesh=mesh,
                  in_specs=(P("d", None), P(None, None)), out_specs=P("d", None))
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x, w)), np.asarray(gx.scaled_dot_general(x, w, DN_DENSE)),
                               rtol=1e-6, atol=1e-6)


def test_signature_matches_lax_dot_general():
    """Every parameter of this jax's lax.dot_general is accepted under the same name (Flax passes
    them by keyword), and out_sharding is honoured."""
    import inspect

    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    ours = inspect.signature(gx.scaled_dot_general).parameters
    for name in inspect.signature(lax.dot_general).parameters:
        assert name in ours, f"scaled_dot_general lacks lax.dot_general's parameter {name!r}"
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("d",)), P("d", None))
    x, w = rand(44, (8, 64)), rand(45, (64, 4))
    y = jax.jit(lambda a, b: gx.scaled_dot_general(a, b, DN_DENSE, out_sharding=sharding))(x, w)
    assert y.sharding.is_equivalent_to(sharding, 2)
    np.testing.assert_allclose(np.asarray(y), np.asarray(gx.scaled_dot_general(x, w, DN_DENSE)), rtol=1e-6)


def test_flax_nnx_linear_drop_in():
    nnx = pytest.importorskip("flax.nnx")
    dg = functools.partial(gx.scaled_dot_general, format=gx.MXFP8_E4M3)
    layer = nnx.Linear(64, 16, dot_general=dg, rngs=nnx.Rngs(0))
    x = rand(20, (4, 64))
    y = layer(x)
    exact = x @ layer.kernel[...] + layer.bias[...]
    assert float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact)) < 0.08
    grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
    assert grads.kernel[...].shape == (64, 16) and bool(jnp.all(jnp.isfinite(grads.kernel[...])))
    # the layer really runs our quantize custom call (forward and backward)
    text = jax.jit(lambda v: layer(v)).lower(x).as_text()
    assert "gpuext_quantize" in text


def test_flax_linen_dense_drop_in():
    nn = pytest.importorskip("flax.linen")
    dg = functools.partial(gx.scaled_dot_general, format=(gx.FP8_1x128, gx.FP8_128x128))
    layer = nn.Dense(16, dot_general=dg)
    x = rand(21, (4, 256))
    params = layer.init(jax.random.key(0), x)
    y = layer.apply(params, x)
    k, b = params["params"]["kernel"], params["params"]["bias"]
    exact = x @ k + b
    assert float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact)) < 0.08
    g = jax.jit(jax.grad(lambda p: jnp.sum(layer.apply(p, x) ** 2)))(params)
    assert g["params"]["kernel"].shape == (256, 16) and bool(jnp.all(jnp.isfinite(g["params"]["kernel"])))
    assert "gpuext_quantize" in jax.jit(lambda v: layer.apply(params, v)).lower(x).as_text()


# --------------------------------------------------------------------------- errors
def test_errors_name_arguments_shapes_and_dtypes():
    a = gx.quantize(rand(21, (4, 64)), gx.MXFP8_E4M3)
    b = gx.quantize(rand(22, (8, 64)), gx.MXFP8_E4M3)
    with pytest.raises(TypeError, match="lhs must be a jax_gpuext.BlockScaledArray"):
        gx.block_scaled_dot(rand(0, (4, 64)), b)
    with pytest.raises(ValueError, match=r"NVFP4 \(rhs\) cannot be mixed"):
        gx.block_scaled_dot(a, gx.quantize(rand(23, (8, 64)), gx.NVFP4))
    with pytest.raises(ValueError, match="contracting sizes differ"):
        gx.block_scaled_dot(a, gx.quantize(rand(24, (8, 96)), gx.MXFP8_E4M3))
    with pytest.raises(ValueError, match="quantized along axis"):
        gx.block_scaled_dot(a, gx.quantize(rand(25, (64, 8)), gx.MXFP8_E4M3, axis=-1), (((1,), (0,)), ((), ())))
    with pytest.raises(TypeError, match="preferred_element_type"):
        gx.block_scaled_dot(a, b, preferred_element_type=jnp.int32)
    with pytest.raises(ValueError, match=r"contracting sizes differ: lhs \(4, 2, 8\) axis 2 vs rhs \(2, 6, 3\) axis 1"):
        gx.scaled_dot_general(rand(0, (4, 2, 8)), rand(1, (2, 6, 3)), (((1, 2), (0, 1)), ((), ())))
    with pytest.raises(TypeError, match="lhs must be float"):
        gx.scaled_dot_general(jnp.ones((4, 64), jnp.int32), rand(1, (64, 3)), DN_DENSE)
    with pytest.raises(ValueError, match="contracting sizes differ"):
        gx.scaled_dot_general(rand(0, (4, 64)), rand(1, (32, 3)), DN_DENSE)
    with pytest.raises(ValueError, match="FP8_128x128 is a weight"):
        gx.scaled_dot_general(rand(0, (4, 64)), rand(1, (64, 3)), DN_DENSE, format=gx.FP8_128x128)
    with pytest.raises(UnsupportedError, match="cublaslt"):
        with jax_gpuext_platform("cuda"):
            gx.block_scaled_dot(a, b, backend="cublaslt")


def jax_gpuext_platform(name):
    from jax_gpuext.common import backends

    return backends.platform(name)


def test_explain_shows_the_backend():
    a = gx.quantize(rand(26, (4, 64)), gx.MXFP8_E4M3)
    b = gx.quantize(rand(27, (8, 64)), gx.MXFP8_E4M3)
    ex = gx.explain(lambda p, q: gx.block_scaled_dot(p, q), a, b)
    calls = [c for c in ex.calls if c.op == "block_scaled_dot"]
    assert len(calls) == 1 and calls[0].chosen == cpu_mx_dot()
    qt = gx.quantize(rand(26, (4, 64)), gx.FP8_TENSOR)
    (call,) = gx.explain(lambda p: gx.block_scaled_dot(p, p), qt).calls
    assert call.chosen == "reference" and dict(call.rejected)["xla"].startswith("passed over: on CPU")
    ex = gx.explain(lambda p, q: gx.block_scaled_dot(p, q), a, b, platform="cuda")
    (call,) = [c for c in ex.calls if c.op == "block_scaled_dot"]
    assert call.chosen == "xla"  # XLA's own path on CUDA (issue 16); the reference is lower preference
    assert [n for n, _ in call.rejected] == ["cudnn", "cublaslt", "hopper_mx", "reference"]
    assert "block_scaled_dot" in str(ex)


def test_backend_order():
    from jax_gpuext.common import backends

    names = [b.name for b in backends.backends("block_scaled_dot")]
    assert names == ["cudnn", "cublaslt", "hopper_mx", "xla", "reference"]


def test_demo_steps_run(capsys):
    for _, step in dot_mod.demo_steps():
        step()
    assert "block_scaled_dot" in capsys.readouterr().out


# --------------------------------------------------------------------------- GPU (run on an H100 / B200)
def _gpu_case(fmt_l, fmt_r, m=256, n=512, k=1024):
    lhs = gx.quantize(rand(30, (m, k)), fmt_l)
    rhs = gx.quantize(rand(31, (n, k), 0.1), fmt_r)
    return lhs, rhs


GPU_FORMATS = [
    pytest.param(gx.FP8_TENSOR, gx.FP8_TENSOR, "cublaslt",
                 marks=pytest.mark.gates("fp8_tensor_cores", "cublaslt_dot_built"), id="cublaslt-fp8-per-tensor"),
    pytest.param(gx.FP8_1x128, gx.FP8_128x128, "cublaslt", marks=pytest.mark.gates("hopper", "cublaslt_dot_built"),
                 id="cublaslt-fp8-1x128x128x128"),
    pytest.param(gx.FP8_1x128, gx.FP8_1x128, "cublaslt", marks=pytest.mark.gates("hopper", "cublaslt_dot_built"),
                 id="cublaslt-fp8-1x128x1x128"),
    pytest.param(gx.MXFP8_E4M3, gx.MXFP8_E4M3, "cublaslt",
                 marks=pytest.mark.gates("blackwell", "cublaslt_dot_built"), id="cublaslt-mxfp8"),
    pytest.param(gx.NVFP4, gx.NVFP4, "cublaslt", marks=pytest.mark.gates("blackwell", "cublaslt_dot_built"),
                 id="cublaslt-nvfp4"),
    pytest.param(gx.MXFP8_E4M3, gx.MXFP8_E4M3, "cudnn", marks=pytest.mark.gates("blackwell", "cudnn_dot_built"),
                 id="cudnn-mxfp8"),
    pytest.param(gx.NVFP4, gx.NVFP4, "cudnn", marks=pytest.mark.gates("blackwell", "cudnn_dot_built"),
                 id="cudnn-nvfp4"),
]


@pytest.mark.verifies("block_scaled_dot.{backend}", feature="per_tensor", fmt_l=gx.FP8_TENSOR)
@pytest.mark.verifies("block_scaled_dot.{backend}", feature="fp8_blockwise", fmt_l=gx.FP8_1x128)
@pytest.mark.verifies("block_scaled_dot.{backend}", feature="mxfp8", fmt_l=gx.MXFP8_E4M3)
@pytest.mark.verifies("block_scaled_dot.{backend}", feature="nvfp4", fmt_l=gx.NVFP4)
@pytest.mark.gpu
@pytest.mark.parametrize("fmt_l,fmt_r,backend", GPU_FORMATS)
def test_gpu_backend_matches_reference(fmt_l, fmt_r, backend):
    lhs, rhs = _gpu_case(fmt_l, fmt_r)
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32, backend=backend))
    ref = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="reference")
    np.testing.assert_allclose(np.asarray(f(lhs, rhs)), np.asarray(ref), rtol=1e-3,
                               atol=1e-3 * float(jnp.abs(ref).max()))
    hlo = f.lower(lhs, rhs).compile().as_text()
    assert f"gpuext_block_scaled_dot_{backend}" in hlo
    # the library path reaches the handler through _cuda.set_library_path, not the program
    from jax_gpuext.common import extension as _ext
    from jax_gpuext.common import libs as _libs

    lib = "cudnn" if backend == "cudnn" else "cublaslt"
    assert _ext.module("cuda").library_path(lib) == _libs.path(lib)
    assert _libs.path(lib) not in hlo


@pytest.mark.verifies("block_scaled_dot.cublaslt", feature="fp8_blockwise")
@pytest.mark.gpu
@pytest.mark.gates("hopper", "cublaslt_dot_built")
@pytest.mark.parametrize("fmt_r", [gx.FP8_128x128, gx.FP8_1x128], ids=["128x128", "1x128"])
def test_gpu_cublaslt_fp8_blockwise_ragged_and_batched(fmt_r):
    """Odd M (padded to 16 rows), a partial last N block, an odd K-block count (BLK128x128's
    padded column stride) and 3 batches (per-batch pointer offsets): where scale layouts break."""
    lhs = gx.quantize(rand(32, (3, 33, 384)), gx.FP8_1x128)
    rhs = gx.quantize(rand(33, (3, 136, 384), 0.1), fmt_r)
    dn = (((2,), (2,)), ((0,), (0,)))
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dn, preferred_element_type=jnp.float32, backend="cublaslt"))
    want, mag = np_block_scaled_dot(lhs, rhs, dn)
    assert_close_to_f64(f(lhs, rhs), want, mag, rtol=1e-3)  # FP8 tensor cores keep fewer product bits
    assert "gpuext_block_scaled_dot_cublaslt" in f.lower(lhs, rhs).compile().as_text()


@pytest.mark.verifies("block_scaled_dot.{backend}", feature="command_buffer")
@pytest.mark.gpu
@pytest.mark.parametrize("fmt_l,fmt_r,backend", GPU_FORMATS[:2] + GPU_FORMATS[3:4])
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_command_buffer(fmt_l, fmt_r, backend, command_buffer):
    """With CUSTOM_CALL capture our (kCmdBufferCompatible) call is recorded into a CUDA graph and
    replayed without its handler, each replay giving the reference's answer; with capture off its
    handler runs every time (tests/_command_buffer.py counts the handler's runs)."""
    lhs, rhs = _gpu_case(fmt_l, fmt_r)
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32, backend=backend),
                compiler_options=cb.options(command_buffer))
    ref = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="reference")

    def check(y):  # every run, recorded or replayed, gives the reference's answer
        np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-3, atol=1e-3 * float(jnp.abs(ref).max()))

    counts = cb.run_counted(f, (lhs, rhs), f"gpuext_block_scaled_dot_{backend}", check=check)
    cb.assert_counts(counts, cb.RUNS, command_buffer)


@pytest.mark.parametrize("target", ["gpuext_block_scaled_dot_cublaslt", "gpuext_block_scaled_dot_cudnn",
                                    "gpuext_hopper_mx_dot"])
def test_gpu_handlers_register_an_initialize_stage(target):
    """Each GPU dot handler does its one-time work (cuBLASLt handle + heuristic, cuDNN graph,
    kernel set-up) in XLA's initialize stage, outside any command-buffer capture; the stage dict
    is what reaches jax.ffi.register_ffi_target. Runs wherever the CUDA extension was built."""
    from jax_gpuext.common import extension as _ext

    mod = _ext.module("cuda")
    if mod is None or target not in mod.registrations():
        pytest.skip(f"{target} was not built here")
    stages = mod.registrations()[target]
    assert isinstance(stages, dict) and set(stages) == {"initialize", "execute"}


_AOT_CHILD = """
import sys, numpy as np, jax, ml_dtypes
from jax.experimental.serialize_executable import deserialize_and_load
from jax_gpuext.common import extension as _ext
_ext.ensure_all_registered()  # the targets only: nothing is traced, so nothing is prepared
dtypes = [getattr(ml_dtypes, t, np.dtype(t)) for t in sys.argv[1].split(",")]  # float8 names live in ml_dtypes
sys.path.insert(0, sys.argv[2])  # tests/, for _command_buffer
import _command_buffer as cb
# on the device once: a numpy argument would be copied to a new buffer every run, and XLA records
# the graph again whenever a buffer of the call moves
leaves = [jax.device_put(np.load(f"leaf{i}.npy").view(t)) for i, t in enumerate(dtypes)]
run = deserialize_and_load(open("exe.bin", "rb").read(),
                           jax.tree_util.tree_structure((tuple(range(len(leaves))), {})),
                           jax.tree_util.tree_structure(0))
outs = []
counts = cb.run_counted(run, leaves, "gpuext_block_scaled_dot_cublaslt", check=lambda y: outs.append(np.asarray(y)))
print(counts)
cb.assert_captured(counts, cb.RUNS)  # recorded (after the initialize stage made the plan), then replayed
assert all(np.array_equal(o, outs[0]) for o in outs), "replays differ"
np.save("out.npy", outs[0])
print("plan stats", _ext.module("cuda").cublaslt_plan_stats())
assert _ext.module("cuda").cublaslt_plan_stats() == (1, 0), "the execute path had to make the plan"
"""


@pytest.mark.verifies("block_scaled_dot.cublaslt", feature="command_buffer")
@pytest.mark.gpu
@pytest.mark.gates("hopper", "cublaslt_dot_built")
def test_gpu_cublaslt_executable_compiled_elsewhere_prepares_in_initialize(tmp_path):
    """An executable compiled in one process and run in another (no trace there, so no
    trace-time prepare): the handler's initialize stage must make the plan before XLA records
    the command buffer, and the execute path must find it cached (cublaslt_plan_stats)."""
    import pathlib
    import subprocess
    import sys

    from jax.experimental.serialize_executable import serialize

    lhs, rhs = _gpu_case(gx.FP8_1x128, gx.FP8_128x128)
    leaves_l, tree_l = jax.tree_util.tree_flatten(lhs)
    leaves_r, tree_r = jax.tree_util.tree_flatten(rhs)
    n_l = len(leaves_l)

    def dot(*leaves):
        a = jax.tree_util.tree_unflatten(tree_l, leaves[:n_l])
        b = jax.tree_util.tree_unflatten(tree_r, leaves[n_l:])
        return gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32, backend="cublaslt")

    compiled = jax.jit(dot, compiler_options=cb.options("CUSTOM_CALL")).lower(*leaves_l, *leaves_r).compile()
    payload, _, _ = serialize(compiled)
    (tmp_path / "exe.bin").write_bytes(payload)
    leaves = [np.asarray(x) for x in leaves_l + leaves_r]
    for i, x in enumerate(leaves):  # raw bytes: np.save cannot name the float8 dtypes
        np.save(tmp_path / f"leaf{i}.npy", x.view(np.uint8))
    dtypes = ",".join(x.dtype.name for x in leaves)
    tests_dir = str(pathlib.Path(__file__).resolve().parents[1])
    child = subprocess.run([sys.executable, "-c", _AOT_CHILD, dtypes, tests_dir], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stdout + child.stderr
    ref = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="reference")
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), np.asarray(ref), rtol=1e-3,
                               atol=1e-3 * float(jnp.abs(ref).max()))


@pytest.mark.verifies("block_scaled_dot.cublaslt", feature="per_tensor_batched", case=PER_TENSOR_CASES.index("batched-shared-scale"))
@pytest.mark.verifies("block_scaled_dot.cublaslt", feature="per_tensor", case=PER_TENSOR_CASES.index("vmapped"))  # sequential vmap: B=1 calls
@pytest.mark.verifies("block_scaled_dot.cublaslt", feature="per_tensor_batched", case=PER_TENSOR_CASES.index("batched-per-batch-scales"))
@pytest.mark.gpu
@pytest.mark.gates("fp8_tensor_cores", "cublaslt_dot_built")
@pytest.mark.parametrize("case", range(len(PER_TENSOR_CASES)), ids=PER_TENSOR_CASES)
def test_gpu_per_tensor_batched_and_vmapped(case):
    """A batched dot shares the one per-tensor scale; under vmap each example has its own, and
    so does a batched dot of operands quantized under vmap (per-batch scale pointers, in 16-byte
    slots since issue 33: the H200 run's CUBLAS_STATUS_NOT_SUPPORTED). One case per test, so a
    failure names its layout."""
    name, f, args, _ = _per_tensor_cases("cublaslt")[case]
    _, ref, _, _ = _per_tensor_cases("reference")[case]
    got, want = jax.jit(f)(*args), ref(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-3, atol=1e-3 * float(jnp.abs(want).max()))
    assert "gpuext_block_scaled_dot_cublaslt" in jax.jit(f).lower(*args).compile().as_text(), name


@pytest.mark.verifies("block_scaled_dot.cublaslt", feature="training_step")
@pytest.mark.gpu
@pytest.mark.gates("hopper", "cublaslt_dot_built")
def test_gpu_training_step_uses_cublaslt():
    """All three dots of the DeepSeek-V3 recipe's step (forward, dgrad, wgrad) run in our call.
    Differentiated w.r.t. the input too: a weight-only gradient never uses dgrad, and JAX drops
    that dot (the H200 run counted 2; test_cuda_training_step_lowers_its_three_dots_to_cublaslt)."""
    x, w = rand(32, (256, 512)), rand(33, (512, 256), 0.05)
    fmt = (gx.FP8_1x128, gx.FP8_128x128)

    def loss(x, w, backend="auto"):
        return jnp.sum(gx.scaled_dot_general(x, w, DN_DENSE, format=fmt, backend=backend) ** 2)
    f = jax.jit(jax.grad(loss, argnums=(0, 1)))
    ref = jax.grad(lambda x, w: loss(x, w, "reference"), argnums=(0, 1))(x, w)
    for got, want in zip(f(x, w), ref):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2,
                                   atol=2e-2 * float(jnp.abs(want).max()))
    assert f.lower(x, w).compile().as_text().count("custom_call_target=\"gpuext_block_scaled_dot_cublaslt\"") == 3
