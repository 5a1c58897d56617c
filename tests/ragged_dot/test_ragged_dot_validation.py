"""Bad input to the grouped dot and its quantizers (issue 34): every public entry point refuses it
at trace time, naming itself and the argument, the same for a list as for an array."""

from __future__ import annotations

import numpy as np
import pytest

import jax.numpy as jnp

import jax_gpuext as gx
from jax_gpuext.ragged_dot.grouped import dequantize_grouped, quantize_grouped
from jax_gpuext.ragged_dot.ragged_dot import ragged_dot
from jax_gpuext.ragged_dot.scaled_ragged_dot import scaled_ragged_dot

G, M, K, N = 2, 16, 32, 8


def _entry_points():
    x = np.ones((M, K), np.float32)
    w = np.ones((G, K, N), np.float32)
    q = gx.quantize(x, gx.MXFP8_E4M3)
    qw = gx.quantize(w, gx.MXFP8_E4M3, axis=1)
    qg = quantize_grouped(x, gx.MXFP8_E4M3, np.array([8, 8], np.int32), axis=0)
    return {
        "ragged_dot": lambda gs: ragged_dot(q, qw, gs),
        "scaled_ragged_dot": lambda gs: scaled_ragged_dot(x, w, gs),
        "quantize_grouped": lambda gs: quantize_grouped(x, gx.MXFP8_E4M3, gs, axis=0),
        "dequantize_grouped": lambda gs: dequantize_grouped(qg, gs),
    }


BAD_LISTS = [
    ([8.7, 7.2], TypeError, r"group_sizes\[0\] must be an int.*float"),
    ([True, True], TypeError, r"group_sizes\[0\] must be an int.*bool"),
    (["8", "8"], TypeError, r"group_sizes\[0\] must be an int.*str"),
    ([float("nan"), 8], TypeError, r"group_sizes\[0\] must be an int"),
    ([2**40, 8], ValueError, r"group_sizes\[0\] = 1099511627776 does not fit in int32"),
    ([[8], [8]], TypeError, r"group_sizes\[0\] must be an int.*list"),
]


@pytest.mark.parametrize("values,error,match", BAD_LISTS, ids=[repr(v[0]) for v in BAD_LISTS])
@pytest.mark.parametrize("entry", ["ragged_dot", "scaled_ragged_dot", "quantize_grouped", "dequantize_grouped"])
def test_a_list_of_group_sizes_is_read_exactly_or_refused(entry, values, error, match):
    call = _entry_points()[entry]
    with pytest.raises(error, match=match) as e:
        call(values)
    assert str(e.value).startswith(f"{entry}:"), str(e.value)


@pytest.mark.parametrize("entry", ["ragged_dot", "scaled_ragged_dot", "quantize_grouped", "dequantize_grouped"])
def test_a_list_of_ints_is_the_same_as_the_array(entry):
    call = _entry_points()[entry]
    got, want = call([8, 8]), call(np.array([8, 8], np.int32))
    for a, b in zip(np.atleast_1d(jnp.asarray(getattr(got, "data", got))),
                    np.atleast_1d(jnp.asarray(getattr(want, "data", want)))):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.mark.parametrize("entry", ["ragged_dot", "scaled_ragged_dot", "quantize_grouped", "dequantize_grouped"])
def test_integer_sizes_of_any_width_are_taken_as_lax_takes_them(entry):
    """np.array([8, 8]) (int64, NumPy's default) is what jax's own ragged_dot tests pass, and
    lax.ragged_dot takes int16, uint32, int64 (x64) alike: each is the same as int32 sizes,
    eagerly and under jit; bool and float sizes are refused."""
    import jax

    call = _entry_points()[entry]
    want = call(np.array([8, 8], np.int32))
    for sizes in (np.array([8, 8]), np.array([8, 8], np.int16), np.array([8, 8], np.uint32),
                  jnp.array([8, 8], jnp.uint8), jnp.array([8, 8], jnp.int16)):
        for r in (call(sizes), jax.jit(call)(sizes)):
            for a, b in zip(jax.tree_util.tree_leaves(r), jax.tree_util.tree_leaves(want)):
                np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    for bad in (np.array([8.0, 8.0], np.float32), np.array([True, True])):
        with pytest.raises(TypeError, match="an integer dtype"):
            call(bad)


def test_wide_unsigned_sizes_saturate_instead_of_wrapping():
    """A uint32 size past int32 (or an int64 one under x64) runs its group to the last row, as a
    size of 2^31 - 1 does: converted with saturation, never wrapped to a negative (empty) group."""
    from jax_gpuext.ragged_dot import common

    got = common.check_group_sizes(np.array([3, 2**32 - 1, 5], np.uint32), "t")
    assert got.dtype == jnp.int32 and np.asarray(got).tolist() == [3, 2**31 - 1, 5]


def test_the_grouped_names_errors_recommend_are_reachable():
    """The dimension numbers and grouped quantizers are public (jax_gpuext.RAGGED_M, ...,
    jax_gpuext.dequantize_grouped), and reachable as jax_gpuext.ragged_dot.X too, as the docs and
    the errors write them, although jax_gpuext.ragged_dot is the op (as jax.lax.ragged_dot is)."""
    import jax_gpuext.ragged_dot as package

    for name in ("RAGGED_M", "RAGGED_M_NK", "RAGGED_CONTRACT", "quantize_grouped", "dequantize_grouped",
                 "GroupedBlockScaledArray", "grouped_block_count"):
        assert getattr(gx.ragged_dot, name) is getattr(package, name), name
    for name in ("RAGGED_M", "RAGGED_M_NK", "RAGGED_CONTRACT", "quantize_grouped", "dequantize_grouped"):
        assert getattr(gx, name) is getattr(package, name) and name in gx.__all__, name
    import jax_gpuext.ragged_dot.grouped as grouped_module  # resolved through attributes of the op
    import sys
    assert grouped_module is sys.modules["jax_gpuext.ragged_dot.grouped"]
    x = np.ones((M, K), np.float32)
    q, qw = gx.quantize(x, gx.FP8_1x128), gx.quantize(np.ones((G, K, N), np.float32), gx.FP8_128x128)
    with pytest.raises(TypeError, match=r"jax_gpuext\.RAGGED_M ") as e:
        gx.ragged_dot(q, qw, np.array([8, 8], np.int32), "ragged_m")
    assert gx.RAGGED_M is not None, str(e.value)


# --------------------------------------------------------------------------- finding 7: errors name the function called
def _bad_inputs():
    """(entry point, case, call, exception, message pattern): one of each class of bad input each
    public grouped entry point takes, including those it hands on to quantize / dequantize /
    ragged_dot (which used to be reported under those names)."""
    import jax

    x = np.ones((M, K), np.float32)
    w = np.ones((G, K, N), np.float32)
    gs = np.array([8, 8], np.int32)
    q = gx.quantize(x, gx.MXFP8_E4M3)
    qw = gx.quantize(w, gx.MXFP8_E4M3, axis=1)
    qg = quantize_grouped(x, gx.MXFP8_E4M3, gs, axis=0)
    srd, qgr, dqg, rd = scaled_ragged_dot, quantize_grouped, dequantize_grouped, ragged_dot
    return [
        ("scaled_ragged_dot", "lhs-not-array", lambda: srd("x", w, gs), TypeError, "lhs must be an array"),
        ("scaled_ragged_dot", "lhs-int", lambda: srd(x.astype(np.int32), w, gs), TypeError, "lhs must be float"),
        ("scaled_ragged_dot", "rank", lambda: srd(x[None], w, gs), ValueError, r"lhs must be \(M, K\)"),
        ("scaled_ragged_dot", "contracting", lambda: srd(x[:, :16], w, gs), ValueError, "contracting sizes differ"),
        ("scaled_ragged_dot", "sizes-dtype", lambda: srd(x, w, gs.astype(np.float32)), TypeError, "an integer dtype"),
        ("scaled_ragged_dot", "sizes-count", lambda: srd(x, w, gs[:1]), ValueError, "2 groups"),
        ("scaled_ragged_dot", "format-unknown", lambda: srd(x, w, gs, format="MXFP6"), ValueError,
         "unknown format 'MXFP6'"),
        ("scaled_ragged_dot", "format-type", lambda: srd(x, w, gs, format=3), TypeError, "format must be"),
        ("scaled_ragged_dot", "format-triple", lambda: srd(x, w, gs, format=("NVFP4",) * 3), TypeError, "pair"),
        ("scaled_ragged_dot", "format-mixed", lambda: srd(x, w, gs, format=("MXFP8_E4M3", "NVFP4")), ValueError,
         "cannot be mixed"),
        ("scaled_ragged_dot", "format-128x128-lhs", lambda: srd(x, w, gs, format=gx.FP8_128x128), ValueError,
         "weight"),
        ("scaled_ragged_dot", "format-per-tensor", lambda: srd(x, w, gs, format="FP8_TENSOR"), ValueError,
         "one scale per tensor"),
        ("scaled_ragged_dot", "grad-unknown", lambda: srd(x, w, gs, grad_format="E5M2"), ValueError,
         "unknown grad_format"),
        ("scaled_ragged_dot", "grad-128x128", lambda: srd(x, w, gs, grad_format="FP8_128x128"), ValueError,
         "grad_format cannot be FP8_128x128"),
        ("scaled_ragged_dot", "out-dtype", lambda: srd(x, w, gs, preferred_element_type=np.int32), TypeError,
         "preferred_element_type"),
        ("scaled_ragged_dot", "backend-name", lambda: srd(x, w, gs, backend="fast"), ValueError, "backend must be"),
        ("scaled_ragged_dot", "backend-not-here", lambda: srd(x, w, gs, backend="hopper"), gx.UnsupportedError,
         "backend 'hopper' cannot run here"),
        ("scaled_ragged_dot", "group-offset", lambda: srd(x, w, gs, group_offset=np.zeros(1, np.int32)), ValueError,
         "group_offset"),
        ("scaled_ragged_dot", "grad-backend-not-here",
         lambda: jax.grad(lambda a: srd(a, w, gs, backend="cublaslt").sum())(x), gx.UnsupportedError,
         "backend 'cublaslt' cannot run here"),
        ("quantize_grouped", "x-not-array", lambda: qgr("x", gx.MXFP8_E4M3, gs, axis=0), TypeError, "x must be"),
        ("quantize_grouped", "x-int", lambda: qgr(x.astype(np.int8), gx.MXFP8_E4M3, gs, axis=0), TypeError,
         "x must be float32"),
        ("quantize_grouped", "axis", lambda: qgr(x, gx.MXFP8_E4M3, gs, axis=2), ValueError, "axis 2 is out of range"),
        ("quantize_grouped", "axis-type", lambda: qgr(x, gx.MXFP8_E4M3, gs, axis=0.0), TypeError, "axis must be"),
        ("quantize_grouped", "sizes-dtype", lambda: qgr(x, gx.MXFP8_E4M3, gs.astype(np.float16), axis=0), TypeError,
         "an integer dtype"),
        ("quantize_grouped", "format-unknown", lambda: qgr(x, "MXFP6", gs, axis=0), ValueError,
         "unknown format 'MXFP6'"),
        ("quantize_grouped", "format-type", lambda: qgr(x, 6, gs, axis=0), TypeError, "format must be"),
        ("quantize_grouped", "format-2d", lambda: qgr(x, gx.FP8_128x128, gs, axis=0), ValueError, "one block axis"),
        ("quantize_grouped", "scale-rounding", lambda: qgr(x, gx.MXFP8_E4M3, gs, axis=0, scale_rounding="down"),
         ValueError, "scale_rounding must be"),
        ("quantize_grouped", "rounding-format", lambda: qgr(x, gx.FP8_1x128, gs, axis=0, scale_rounding="ocp"),
         ValueError, "'ocp'"),
        ("quantize_grouped", "global-scale-mx", lambda: qgr(x, gx.MXFP8_E4M3, gs, axis=0, global_scale=np.float32(1)),
         ValueError, "has no global scale"),
        ("quantize_grouped", "global-scale-shape",
         lambda: qgr(x, gx.NVFP4, gs, axis=0, global_scale=np.ones(2, np.float32)), ValueError, "scalar"),
        ("quantize_grouped", "global-scale-type", lambda: qgr(x, gx.NVFP4, gs, axis=0, global_scale="1"), TypeError,
         "global_scale"),
        ("quantize_grouped", "backend-name", lambda: qgr(x, gx.MXFP8_E4M3, gs, axis=0, backend="fast"), ValueError,
         "backend must be"),
        ("quantize_grouped", "backend-not-here", lambda: qgr(x, gx.MXFP8_E4M3, gs, axis=0, backend="cuda"),
         gx.UnsupportedError, "backend 'cuda' cannot run here"),
        ("dequantize_grouped", "not-grouped", lambda: dqg(q, gs), TypeError, "GroupedBlockScaledArray"),
        ("dequantize_grouped", "sizes-dtype", lambda: dqg(qg, gs.astype(bool)), TypeError, "an integer dtype"),
        ("dequantize_grouped", "sizes-count", lambda: dqg(qg, gs[:1]), ValueError, "2 groups"),
        ("dequantize_grouped", "dtype", lambda: dqg(qg, gs, np.int32), TypeError, "dtype must be"),
        ("dequantize_grouped", "dtype-name", lambda: dqg(qg, gs, "float8"), TypeError, "dtype must be"),
        ("dequantize_grouped", "backend-name", lambda: dqg(qg, gs, backend="fast"), ValueError, "backend must be"),
        ("dequantize_grouped", "backend-not-here", lambda: dqg(qg, gs, backend="cuda"), gx.UnsupportedError,
         "backend 'cuda' cannot run here"),
        ("ragged_dot", "lhs-array", lambda: rd(x, qw, gs), TypeError, "lhs must be a BlockScaledArray"),
        ("ragged_dot", "sizes-dtype", lambda: rd(q, qw, gs.astype(np.float32)), TypeError, "an integer dtype"),
        ("ragged_dot", "out-dtype", lambda: rd(q, qw, gs, preferred_element_type=np.int32), TypeError,
         "preferred_element_type"),
        ("ragged_dot", "backend-not-here", lambda: rd(q, qw, gs, backend="hopper"), gx.UnsupportedError,
         "backend 'hopper' cannot run here"),
        ("ragged_dot", "dimension-numbers", lambda: rd(q, qw, gs, "rows"), TypeError, "RaggedDotDimensionNumbers"),
    ]


BAD_INPUT_IDS = [f"{c[0]}-{c[1]}" for c in _bad_inputs()]


@pytest.mark.parametrize("index", range(len(BAD_INPUT_IDS)), ids=BAD_INPUT_IDS)
def test_every_error_names_the_function_called(index):
    entry, _, call, error, match = _bad_inputs()[index]
    with pytest.raises(error, match=match) as e:
        call()
    message = str(e.value)
    assert message.startswith(f"{entry}:"), message
    others = {"quantize", "dequantize", "ragged_dot", "scaled_dot_general", "block_scaled_dot"} - {entry}
    assert not any(message.startswith(f"{entry}: {o}:") or f" {o}: " in message for o in others), message


# --------------------------------------------------------------------------- finding 8: formats by name
def test_scaled_ragged_dot_takes_format_names_alone_and_in_pairs():
    """As scaled_dot_general, quantize and quantize_grouped do: a name is its format, forward and
    gradients the same bits as with the BlockFormat objects."""
    import jax

    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((G, K, N)), jnp.float32)
    gs = jnp.array([7, 6], jnp.int32)
    cases = [(dict(format="MXFP8_E4M3"), dict(format=gx.MXFP8_E4M3)),
             (dict(format=("FP8_1x128", "FP8_128x128"), grad_format="FP8_1x128"),
              dict(format=(gx.FP8_1x128, gx.FP8_128x128), grad_format=gx.FP8_1x128)),
             (dict(format=["MXFP8_E4M3", gx.MXFP4], grad_format="MXFP8_E5M2"),
              dict(format=(gx.MXFP8_E4M3, gx.MXFP4), grad_format=gx.MXFP8_E5M2)),
             (dict(format="NVFP4", grad_format="MXFP8_E4M3"), dict(format=gx.NVFP4, grad_format=gx.MXFP8_E4M3))]
    for by_name, by_object in cases:
        def loss(a, b, kw):
            return jnp.sum(scaled_ragged_dot(a, b, gs, **kw) ** 2)
        for kw_a, kw_b in ((by_name, by_object),):
            np.testing.assert_array_equal(np.asarray(scaled_ragged_dot(x, w, gs, **kw_a)),
                                          np.asarray(scaled_ragged_dot(x, w, gs, **kw_b)))
            ga = jax.grad(loss, (0, 1))(x, w, kw_a)
            gb = jax.grad(loss, (0, 1))(x, w, kw_b)
            for a, b in zip(ga, gb):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_recipe_holds_formats_whatever_names_it_was_given():
    from jax_gpuext.dot.scaled_dot_general import recipe

    assert recipe("MXFP8_E4M3", "MXFP8_E5M2") == recipe(gx.MXFP8_E4M3, gx.MXFP8_E5M2)
    assert recipe(("FP8_1x128", "FP8_128x128")) == recipe((gx.FP8_1x128, gx.FP8_128x128))
    r = recipe(["NVFP4", "NVFP4"])
    assert all(isinstance(f, gx.BlockFormat) for f in (r.lhs, r.rhs, r.grad, r.lhs_bwd, r.rhs_bwd))
    y = gx.scaled_dot_general(np.ones((4, 64), np.float32), np.ones((64, 8), np.float32), (((1,), (0,)), ((), ())),
                              format="MXFP8_E4M3", grad_format="MXFP8_E5M2")
    assert y.shape == (4, 8)
