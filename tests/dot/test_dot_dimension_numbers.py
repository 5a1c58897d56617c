"""Several contracting and batch dimensions, anywhere (issue 27 item 2).

``scaled_dot_general`` is checked, forward and both gradients, against a float64 NumPy model
written here: the operands canonicalised as jax.nn does (batch, free, contracting flattened with
lhs's contracting dims ascending and rhs's paired with them), quantized by the NumPy MX rule of
tests/_formats_numpy.py, dequantized, contracted in float64 and laid out as ``lax.dot_general``
lays out its result. ``block_scaled_dot`` is checked against the float64 dot of its dequantized
operands, and so is the canonical form its GPU backends receive (padded rows included), since
no CPU backend runs through it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import _formats_numpy as npref
import jax_gpuext as gx
from jax_gpuext.dot import common as dot_common
from test_block_scaled_dot import assert_close_to_f64, np_block_scaled_dot

# (lhs shape, rhs shape, dimension numbers): contracting dims whose inner extents are not
# multiples of 32 make blocks straddle them, so a wrong flattening order changes the result.
PATTERNS = {
    "attention_out": ((2, 3, 4, 24), (4, 24, 40), (((2, 3), (0, 1)), ((), ()))),  # (B, T, H, D) x (H, D, F)
    "dense_general": ((2, 5, 6, 10), (6, 10, 12), (((2, 3), (0, 1)), ((), ()))),
    "non_monotone_pairing": ((5, 6, 7), (7, 3, 6), (((1, 2), (2, 0)), ((), ()))),
    "pairs_listed_descending": ((5, 6, 7), (7, 3, 6), (((2, 1), (0, 2)), ((), ()))),
    "batch_anywhere": ((3, 5, 2, 40), (40, 2, 4, 3), (((3,), (0,)), ((0, 2), (3, 1)))),
    "batch_listed_descending": ((3, 5, 2, 40), (40, 2, 4, 3), (((3,), (0,)), ((2, 0), (1, 3)))),
    "everything": ((2, 3, 4, 5, 6), (6, 2, 7, 4, 8), (((2, 4), (3, 0)), ((0,), (1,)))),
    "no_contracting_dims": ((4, 3), (5,), (((), ()), ((), ()))),
    "all_contracted": ((4, 9), (9, 4), (((0, 1), (1, 0)), ((), ()))),
    "empty_free_dim": ((0, 3, 5), (3, 5, 2), (((1, 2), (0, 1)), ((), ()))),
}


def rand(seed, shape, scale=1.0):
    """NumPy's generator: jax.random compiles anew for every shape, seconds per case here."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32) * np.float32(scale))


# --------------------------------------------------------------------------- float64 model
def _canonical(x, batch, free, contract):
    """x transposed to batch + free + contract and collapsed to (B, X, K), in float64."""
    x = np.asarray(x, np.float64)
    size = lambda dims: int(np.prod([x.shape[d] for d in dims]))  # noqa: E731
    return np.transpose(x, batch + free + contract).reshape(size(batch), size(free), size(contract))


def _uncanonical(y, shape, batch, free, contract):
    """The inverse of _canonical: (B, X, K) back to an array of ``shape``."""
    perm = batch + free + contract
    return np.transpose(y.reshape([shape[d] for d in perm]), np.argsort(perm))


def _mx(x, elem):
    """MXFP8 along the last axis (scale rounded up, jax.nn's rule), dequantized in float64."""
    if x.size == 0:
        return x
    xb, k = npref.blocks_1d(x, 32, -1)
    data, e = npref.mx(xb, elem, "up")
    return npref.unblock_1d(data * np.ldexp(1.0, e.astype(np.int64)), k, -1)


def _dims(shape, contract, batch):
    free = tuple(d for d in range(len(shape)) if d not in contract and d not in batch)
    return tuple(batch), free, tuple(contract)


def np_scaled_dot_general(x, w, dn, g=None):
    """Forward (and, with cotangent ``g``, both gradients) of MXFP8 scaled_dot_general."""
    (lc, rc), (lb, rb) = dn
    order = np.argsort(lc, kind="stable")  # lhs's contracting dims ascending, rhs's paired
    lc, rc = tuple(int(lc[i]) for i in order), tuple(int(rc[i]) for i in order)
    lb_, lf, _ = _dims(x.shape, lc, lb)
    rb_, rf, _ = _dims(w.shape, rc, rb)
    a = _canonical(x, lb_, lf, lc)  # (B, M, K)
    b = _canonical(w, rb_, rf, rc)  # (B, N, K)
    y = np.einsum("bmk,bnk->bmn", _mx(a, npref.E4M3), _mx(b, npref.E4M3))
    out_shape = [x.shape[d] for d in lb_ + lf] + [w.shape[d] for d in rf]
    if g is None:
        return y.reshape(out_shape)
    gc = np.asarray(g, np.float64).reshape(y.shape)  # (B, M, N)
    # d lhs: contract N, g and b quantized along N; d rhs: contract M, a and g along M.
    da = np.einsum("bmn,bkn->bmk", _mx(gc, npref.E5M2), _mx(np.swapaxes(b, 1, 2), npref.E4M3))
    db = np.einsum("bkm,bnm->bkn", _mx(np.swapaxes(a, 1, 2), npref.E4M3), _mx(np.swapaxes(gc, 1, 2), npref.E5M2))
    return (y.reshape(out_shape), _uncanonical(da, x.shape, lb_, lf, lc),
            _uncanonical(np.swapaxes(db, 1, 2), w.shape, rb_, rf, rc))


def _close(got, want, mag, rtol=2e-6):
    assert np.shape(got) == np.shape(want), (np.shape(got), np.shape(want))
    assert_close_to_f64(got, want, mag, rtol)


# --------------------------------------------------------------------------- scaled_dot_general
@pytest.mark.parametrize("name", PATTERNS)
def test_scaled_dot_general_matches_float64_model_forward_and_gradients(name):
    ls, rs, dn = PATTERNS[name]
    x, w = rand(1, ls, 2.0), rand(2, rs, 0.5)
    want_shape = jax.eval_shape(lambda a, b: lax.dot_general(a, b, dn), x, w).shape
    g = rand(3, want_shape)
    f = functools.partial(gx.scaled_dot_general, dimension_numbers=dn, preferred_element_type=jnp.float32)
    y, dx, dw = jax.jit(lambda x, w, g: (lambda y, vjp: (y, *vjp(g)))(*jax.vjp(f, x, w)))(x, w, g)  # one compile
    want_y, want_dx, want_dw = np_scaled_dot_general(np.asarray(x), np.asarray(w), dn, np.asarray(g))
    mag = lambda v: np.abs(v).max(initial=0) * 64  # noqa: E731 - K <= 120 terms, each below max|.|
    assert y.shape == want_shape and dx.shape == x.shape and dw.shape == w.shape
    _close(y, want_y, mag(want_y))
    _close(dx, want_dx, mag(want_dx))
    _close(dw, want_dw, mag(want_dw))


def test_scaled_dot_general_pairs_contracting_dims_as_listed():
    """Listing the pairs in another order, or the operands' dims permuted with them, is the same
    dot: only the pairing counts (jax.nn sorts each operand's dims alone, which pairs (1, 2) with
    (2, 0) as (1, 2) with (0, 2): a different, wrong contraction when the sizes allow it)."""
    x, w = rand(4, (3, 8, 8)), rand(5, (8, 2, 8))
    dn = (((1, 2), (2, 0)), ((), ()))
    y = gx.scaled_dot_general(x, w, dn, preferred_element_type=jnp.float32)
    swapped = gx.scaled_dot_general(x, w, (((2, 1), (0, 2)), ((), ())), preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(swapped))
    exact = lax.dot_general(x, w, dn, precision=lax.Precision.HIGHEST)
    assert float(jnp.linalg.norm(y - exact) / jnp.linalg.norm(exact)) < 0.08


def test_scaled_dot_general_blocks_are_block_scaled_dots_along_the_last_contracting_dim():
    """Where the innermost contracting dim holds whole blocks, scaled_dot_general's flattened blocks
    are those of quantizing along it (docs/block_scaled_dot.md): the two ops agree."""
    x, w = rand(30, (2, 3, 4, 64)), rand(31, (4, 64, 8))
    dn = (((2, 3), (0, 1)), ((), ()))
    ours = gx.scaled_dot_general(x, w, dn, preferred_element_type=jnp.float32, backend="reference")
    by_hand = gx.block_scaled_dot(gx.quantize(x, gx.MXFP8_E4M3, axis=3), gx.quantize(w, gx.MXFP8_E4M3, axis=1), dn,
                                  backend="reference")
    np.testing.assert_allclose(np.asarray(ours), np.asarray(by_hand), rtol=1e-6, atol=1e-6)


# jax.nn quantizes only whole blocks (K, and M, N for the gradients, multiples of 32) and pairs
# contracting dims by sorting each operand's alone: these keep to both. Blocks straddle heads.
JAX_NN_PATTERNS = {
    "attention_out": ((2, 16, 4, 24), (4, 24, 32), (((2, 3), (0, 1)), ((), ()))),
    "dense_general": ((4, 8, 6, 16), (6, 16, 64), (((2, 3), (0, 1)), ((), ()))),
    "batched": ((2, 32, 4, 40), (2, 4, 40, 32), (((2, 3), (1, 2)), ((0,), (0,)))),
}


@pytest.mark.gates("jax_scaled_matmul_cpu")
@pytest.mark.parametrize("name", JAX_NN_PATTERNS)
def test_scaled_dot_general_matches_jax_nn_with_several_contracting_dims(name):
    """The same flattened quantization axis as jax.nn.scaled_dot_general, forward and gradients."""
    import dataclasses

    ls, rs, dn = JAX_NN_PATTERNS[name]
    x, w = rand(6, ls), rand(7, rs)
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    grad_cfg = dataclasses.replace(cfg, data_type=jnp.float8_e5m2)  # our default grad_format: MXFP8_E5M2
    theirs = functools.partial(jax.nn.scaled_dot_general, dimension_numbers=dn, preferred_element_type=jnp.float32,
                               configs=[cfg, cfg, grad_cfg])
    ours = functools.partial(gx.scaled_dot_general, dimension_numbers=dn, preferred_element_type=jnp.float32)
    g = rand(8, jax.eval_shape(theirs, x, w).shape)
    forward_and_vjp = lambda f: jax.jit(lambda x, w, g: (lambda y, vjp: (y, *vjp(g)))(*jax.vjp(f, x, w)))  # noqa: E731
    (yt, *grads_t), (yo, *grads_o) = forward_and_vjp(theirs)(x, w, g), forward_and_vjp(ours)(x, w, g)
    np.testing.assert_allclose(np.asarray(yo), np.asarray(yt), rtol=1e-6, atol=1e-6 * float(jnp.abs(yt).max()))
    for mine, ref in zip(grads_o, grads_t):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(ref), rtol=1e-5, atol=1e-5 * float(jnp.abs(ref).max()))


# --------------------------------------------------------------------------- block_scaled_dot
# (lhs shape, lhs quantized axis, rhs shape, rhs quantized axis, dimension numbers, formats)
BSA_PATTERNS = {
    "mx_inner_whole_blocks": ((2, 4, 3, 64), -1, (3, 64, 5), 1, (((2, 3), (0, 1)), ((), ())), gx.MXFP8_E4M3),
    "mx_rows_padded": ((4, 3, 40), -1, (3, 40, 6), 1, (((1, 2), (0, 1)), ((), ())), gx.MXFP8_E4M3),
    "mx_blocked_dim_not_last": ((3, 40, 4), 1, (6, 4, 40), 2, (((1, 2), (2, 1)), ((), ())), gx.MXFP4),
    "nvfp4_batch_between": ((2, 3, 5, 24), 3, (24, 5, 2, 3), 0, (((1, 3), (3, 0)), ((0,), (2,))), gx.NVFP4),
    "fp8_block_128x128_weight": ((4, 2, 200), -1, (2, 200, 136), -1, (((1, 2), (0, 1)), ((), ())),
                                 (gx.FP8_1x128, gx.FP8_128x128)),
    "fp8_tensor_anything": ((3, 5, 7), -1, (7, 2, 5), -1, (((1, 2), (2, 0)), ((), ())), gx.FP8_TENSOR),
    # The long fuzz campaign's case: XLA:CPU fails at run time on the bf16 dot of this layout (rhs
    # batch dim 1, lhs contracted on its middle dim) unless the xla backend canonicalises it first.
    "mx_rhs_batch_not_leading": ((2, 40, 3), 1, (40, 2, 40), 2, (((1,), (2,)), ((0,), (1,))), gx.MXFP8_E4M3),
    "mxfp4_rhs_batch_not_leading": ((2, 40, 3), 1, (40, 2, 40), 2, (((1,), (2,)), ((0,), (1,))), gx.MXFP4),
    "fp8_tensor_rhs_batch_not_leading": ((2, 40, 3), 1, (40, 2, 40), 2, (((1,), (2,)), ((0,), (1,))),
                                         gx.FP8_TENSOR),
}


def _bsa_case(name):
    ls, la, rs, ra, dn, fmt = BSA_PATTERNS[name]
    fl, fr = fmt if isinstance(fmt, tuple) else (fmt, fmt)
    return gx.quantize(rand(8, ls, 3.0), fl, axis=la), gx.quantize(rand(9, rs, 0.5), fr, axis=ra), dn


@pytest.mark.parametrize("name", BSA_PATTERNS)
def test_block_scaled_dot_several_contracting_dims_matches_float64(name):
    lhs, rhs, dn = _bsa_case(name)
    want, mag = np_block_scaled_dot(lhs, rhs, dn)
    k = dot_common._problem(lhs, rhs, dn, jnp.dtype(jnp.float32)).bmnk[3]
    for backend in ("reference", "xla"):
        y = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dn, backend=backend))(lhs, rhs)
        assert y.dtype == jnp.float32
        rtol = 2e-6 if backend == "reference" else 1e-5
        if backend == "xla" and name.startswith("fp8_block"):  # bf16-rounded operands (docs/formats.md, issue 33)
            rtol = 2.0 ** -8 + 2.0 ** -17 + 1.01 * (k + 2) * 2.0 ** -24
        _close(y, want, mag, rtol=rtol)


def _np_canonical_dequant(data, scale, info):
    """(B, X, K) data and its canonical scales, dequantized in float64 by explicit block indices."""
    d = np.asarray(jnp.asarray(data).astype(jnp.float32), np.float64)
    s = np.asarray(jnp.asarray(scale).astype(jnp.float32), np.float64)
    if info.per_tensor:
        return d * s
    k_idx = np.arange(d.shape[2]) // info.block
    if info.two_d:
        return d * s[:, np.arange(d.shape[1]) // 128][:, :, k_idx]
    return d * s[:, :, k_idx]


@pytest.mark.parametrize("name", BSA_PATTERNS)
def test_canonical_form_of_several_contracting_dims_is_the_same_dot(name):
    """What cuBLASLt / cuDNN / hopper_mx receive: (B, M, K) x (B, N, K) with K the contracting
    dims flattened (blocked one innermost, rows zero-padded to whole blocks), blocks = the
    operands' own. Its float64 dot equals the dot of the dequantized operands."""
    lhs, rhs, dn = _bsa_case(name)
    p = dot_common._problem(lhs, rhs, dn, jnp.dtype(jnp.float32))
    la, ls = dot_common.to_canonical(lhs, p.lhs_contract, p.lhs_batch)
    ra, rs = dot_common.to_canonical(rhs, p.rhs_contract, p.rhs_batch)
    b, m, n, k = p.bmnk
    assert la.shape == (b, m, k) and ra.shape == (b, n, k)
    if not p.lhs_format.per_tensor:
        assert k % p.lhs_format.block == 0 or len(p.lhs_contract) == 1
    acc = np.einsum("bmk,bnk->bmn", _np_canonical_dequant(la, ls, p.lhs_format),
                    _np_canonical_dequant(ra, rs, p.rhs_format))
    g = np.ones(())
    for q in (lhs, rhs):
        if q.global_scale is not None:
            g = g * np.float64(q.global_scale)
    want, mag = np_block_scaled_dot(lhs, rhs, dn)
    _close(dot_common.from_canonical(jnp.asarray(acc * g, jnp.float32), p), want, mag)


def test_rows_are_padded_only_where_blocks_would_straddle():
    lhs, rhs, dn = _bsa_case("mx_rows_padded")  # (4, 3, 40): 3 rows of 40 -> 3 x 64
    p = dot_common._problem(lhs, rhs, dn, jnp.dtype(jnp.float32))
    assert p.lhs_contract == (1, 2) and p.bmnk == (1, 4, 6, 192)
    la, _ = dot_common.to_canonical(lhs, p.lhs_contract, p.lhs_batch)
    padding = np.asarray(la.astype(jnp.float32)).reshape(4, 3, 64)[:, :, 40:]
    assert not padding.any()
    lhs, rhs, dn = _bsa_case("mx_inner_whole_blocks")
    assert dot_common._problem(lhs, rhs, dn, jnp.dtype(jnp.float32)).bmnk == (1, 8, 5, 192)
    single = gx.quantize(rand(10, (4, 40)), gx.MXFP8_E4M3)  # one contracting dim: K as it is
    assert dot_common._problem(single, single, None, jnp.dtype(jnp.float32)).bmnk == (1, 4, 4, 40)


def test_block_scaled_dot_refuses_what_cuts_blocks_naming_the_dims():
    x = gx.quantize(rand(11, (4, 3, 64)), gx.MXFP8_E4M3, axis=-1)
    w = gx.quantize(rand(12, (3, 64, 5)), gx.MXFP8_E4M3, axis=0)  # blocks along the 3-long axis
    with pytest.raises(ValueError, match=r"lhs's blocks run along its axis 2, which dimension_numbers contract "
                                         r"with rhs axis 1, but rhs's blocks run along its axis 0"):
        gx.block_scaled_dot(x, w, (((1, 2), (0, 1)), ((), ())))
    with pytest.raises(ValueError, match=r"lhs is quantized along axis 2 but dimension_numbers contract axes \(1,\)"):
        gx.block_scaled_dot(x, gx.quantize(rand(13, (3, 5)), gx.MXFP8_E4M3, axis=0), (((1,), (0,)), ((), ())))
    xb = gx.quantize(rand(14, (4, 256)), gx.FP8_1x128)
    w2 = gx.quantize(rand(15, (2, 256, 128)), gx.FP8_128x128)
    with pytest.raises(ValueError, match=r"rhs is FP8_128x128 .* must contract exactly one of them"):
        gx.block_scaled_dot(gx.quantize(rand(16, (4, 2, 256, 128)), gx.FP8_1x128), w2,
                            (((1, 2, 3), (0, 1, 2)), ((), ())))
    with pytest.raises(ValueError, match=r"every axis before its last two must be a batch or contracting "
                                         r"dimension .* axes \[0\]"):
        gx.block_scaled_dot(xb, w2, (((1,), (1,)), ((), ())))
