"""Backend ``xla`` of block_scaled_dot (issue 16): equals the reference up to f32 accumulation
order, holds no custom call, and the bf16-exactness bound of docs/formats.md holds at its edges
(checked exhaustively over every element and scale code with ml_dtypes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext import dot
from jax_gpuext.common import cpu_features
from jax_gpuext.dot import xla as dot_xla

E8M0 = jnp.dtype(jnp.float8_e8m0fnu)


def _f64(q):
    """The operand's exact values in float64 (independent of the package: numpy + ml_dtypes)."""
    data = np.asarray(q.data).astype(np.float64)
    scale = np.asarray(q.scale).astype(np.float64)
    fmt = q.format
    if fmt.per_tensor:
        return data * scale.reshape(scale.shape + (1,) * (data.ndim - scale.ndim))
    if len(fmt.block) == 2:
        s = np.repeat(np.repeat(scale, 128, -2), 128, -1)[..., : data.shape[-2], : data.shape[-1]]
    else:
        s = np.repeat(scale, fmt.block[0], q.axis)
        s = np.take(s, np.arange(data.shape[q.axis]), axis=q.axis)
    return data * s


def _expected(qx, qw):
    out = np.einsum("...mk,...nk->...mn", _f64(qx), _f64(qw))
    for q in (qx, qw):
        if q.global_scale is not None:
            out = out * np.float64(np.asarray(q.global_scale))
    return out


def _tolerance(qx, qw):
    """f32 accumulation of K products: |error| <= K * 2^-24 * sum |products| (plus rounding once)."""
    k = qx.data.shape[-1]
    mag = np.einsum("...mk,...nk->...mn", np.abs(_f64(qx)), np.abs(_f64(qw)))
    for q in (qx, qw):
        if q.global_scale is not None:
            mag = mag * abs(np.float64(np.asarray(q.global_scale)))
    return (k + 2) * 2.0 ** -24 * mag + 1e-30


CASES = [(gx.MXFP8_E4M3, gx.MXFP8_E4M3), (gx.MXFP8_E5M2, gx.MXFP8_E4M3), (gx.NVFP4, gx.NVFP4),
         (gx.FP8_TENSOR, gx.FP8_TENSOR), (gx.FP8_1x128, gx.FP8_128x128), (gx.FP8_1x128, gx.FP8_1x128)]


def _inputs(seed, m, n, k, special):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = np.array(jax.random.normal(kx, (m, k), jnp.float32)) * 3
    w = np.array(jax.random.normal(kw, (n, k), jnp.float32))
    if special:  # a zero block, tiny (subnormal once scaled) and huge values
        x[0, :32] = 0
        x[1, :32] = np.float32(1e-38) * np.linspace(0.1, 1, 32)
        w[0, 32:64] = 3e4
    return x, w


@pytest.mark.parametrize("fmts", CASES, ids=lambda f: f"{f[0].name}-{f[1].name}")
@pytest.mark.parametrize("special", [False, True], ids=["random", "zeros-tiny-huge"])
def test_equals_the_reference_within_f32_accumulation(fmts, special):
    x, w = _inputs(0, 48, 40, 256, special)
    qx, qw = gx.quantize(x, fmts[0]), gx.quantize(w, fmts[1])
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32, backend="xla"))
    got = np.asarray(f(qx, qw), np.float64)
    ref = np.asarray(gx.block_scaled_dot(qx, qw, preferred_element_type=jnp.float32, backend="reference"),
                     np.float64)
    want = _expected(qx, qw)
    tol = _tolerance(qx, qw)
    assert np.all(np.abs(got - want) <= tol), np.max(np.abs(got - want) / tol)
    assert np.all(np.abs(got - ref) <= 2 * tol)


def test_nan_and_inf_propagate_like_the_reference():
    x, w = _inputs(1, 8, 8, 64, False)
    qx, qw = gx.quantize(x, gx.MXFP8_E5M2), gx.quantize(w, gx.MXFP8_E5M2)
    data = np.asarray(qx.data).copy()
    data[0, 0], data[1, 0] = np.inf, np.nan
    qx = gx.BlockScaledArray(jnp.asarray(data), qx.scale, None, qx.format, qx.axis)
    got = np.asarray(gx.block_scaled_dot(qx, qw, preferred_element_type=jnp.float32, backend="xla"))
    ref = np.asarray(gx.block_scaled_dot(qx, qw, preferred_element_type=jnp.float32, backend="reference"))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))


def test_batched_vmapped_per_tensor_and_nvfp4_global_scales():
    x = jax.random.normal(jax.random.key(2), (3, 16, 64), jnp.float32) * jnp.arange(1, 4)[:, None, None]
    w = jax.random.normal(jax.random.key(3), (3, 24, 64), jnp.float32)
    dn = (((2,), (2,)), ((0,), (0,)))
    for fmt in (gx.FP8_TENSOR, gx.NVFP4):
        qx, qw = jax.vmap(lambda a: gx.quantize(a, fmt))(x), jax.vmap(lambda a: gx.quantize(a, fmt))(w)
        got = gx.block_scaled_dot(qx, qw, dn, preferred_element_type=jnp.float32, backend="xla")
        ref = gx.block_scaled_dot(qx, qw, dn, preferred_element_type=jnp.float32, backend="reference")
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("fmts", CASES, ids=lambda f: f"{f[0].name}-{f[1].name}")
@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_hlo_holds_no_custom_call(fmts, platform):
    x, w = _inputs(0, 16, 16, 128, False)
    qx, qw = gx.quantize(x, fmts[0]), gx.quantize(w, fmts[1])
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, backend="xla"))
    text = f.trace(qx, qw).lower(lowering_platforms=(platform,)).as_text()
    assert "custom_call" not in text
    if fmts[0] is gx.FP8_TENSOR:  # XLA's own FP8 dot: float8 operands, f32 result
        assert any("dot_general" in line and "f8E4M3FN" in line and "-> tensor<16x16xf32>" in line
                   for line in text.splitlines())
    if fmts[0].is_mx:  # the bf16 dot, and the f32 one behind the run-time check on the scales
        assert any("dot_general" in line and "bf16" in line for line in text.splitlines())
        assert "stablehlo.case" in text or "stablehlo.if" in text


def test_explain_notes_the_path(monkeypatch):
    qx, qw = gx.quantize(jnp.ones((4, 64)), gx.NVFP4), gx.quantize(jnp.ones((4, 64)), gx.NVFP4)
    (sel,) = gx.explain(lambda a, b: gx.block_scaled_dot(a, b, backend="xla"), qx, qw).calls
    assert sel.chosen == "xla" and any("exact in bf16 for these formats" in n for n in sel.notes)
    # auto on CPU: the bf16 dot for NVFP4 and MX where the CPU has bf16 dot instructions (issue 18)
    for flags, chosen in (("fpu avx2 avx512_bf16", "xla"), ("fpu avx2 fma", "reference"), ("fp asimd bf16", "xla")):
        monkeypatch.setattr(cpu_features, "cpu_flags", lambda flags=flags: frozenset(flags.split()))
        (sel,) = gx.explain(lambda a, b: gx.block_scaled_dot(a, b), qx, qw).calls
        assert sel.chosen == chosen, flags
        if chosen == "reference":
            assert "without bf16 dot instructions" in dict(sel.rejected)["xla"]
    for fmt in (gx.FP8_TENSOR, gx.FP8_1x128):  # measured no faster than the f32 reference on CPU
        q = gx.quantize(jnp.ones((4, 128)), fmt)
        (sel,) = gx.explain(lambda a, b: gx.block_scaled_dot(a, b), q, q).calls
        assert sel.chosen == "reference" and dict(sel.rejected)["xla"].startswith("passed over: on CPU")


@pytest.mark.parametrize("text, expected", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t: fpu\n", True),
    ("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n", False),
    ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),
    ("", False),
])
def test_cpu_flags_read_from_cpuinfo(tmp_path, monkeypatch, text, expected):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    monkeypatch.setattr(cpu_features, "_CPUINFO", str(path))
    cpu_features.cpu_flags.cache_clear()
    try:
        assert cpu_features.has_bf16_dot_instructions() is expected
        monkeypatch.setattr(cpu_features, "_CPUINFO", str(tmp_path / "missing"))
        cpu_features.cpu_flags.cache_clear()
        assert cpu_features.cpu_flags() == frozenset()
    finally:
        cpu_features.cpu_flags.cache_clear()


# --------------------------------------------------------------------------- the bound (docs/formats.md)
def _values(dtype):
    """Every finite value of an 8- or 4-bit float type, from its bit patterns."""
    if dtype == ml_dtypes.float4_e2m1fn:
        v = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float64)
        return np.concatenate([v, -v])
    v = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    return v[np.isfinite(v)]


def _bf16_exact(v):
    v = np.asarray(v, np.float64)
    return np.asarray(v.astype(ml_dtypes.bfloat16), np.float64) == v


@pytest.mark.parametrize("elem, bound", [(ml_dtypes.float8_e4m3fn, -124), (ml_dtypes.float8_e5m2, -117),
                                         (ml_dtypes.float4_e2m1fn, -132)])
def test_mx_bound_is_exact_and_tight(elem, bound):
    info = dot.FormatInfo("t", "mx", jnp.dtype(elem), E8M0, 32, False)
    assert dot_xla.min_exact_scale_exponent(info) == bound
    vals = _values(elem)
    for e in range(max(bound, -127), 128):  # every E8M0 scale at or above the bound
        prod = vals * 2.0 ** e
        finite = np.abs(prod) < 2.0 ** 128  # above, f32 and bf16 both overflow: no difference
        assert _bf16_exact(prod[finite]).all(), e
    if bound > -127:  # tight: one step below, some element x scale is not a bf16 value
        assert not _bf16_exact(vals * 2.0 ** (bound - 1)).all()
    assert dot_xla.exact_statically(info) == (bound <= -127)


def test_nvfp4_element_times_any_e4m3_scale_is_exact():
    info = dot.format_info(gx.NVFP4)
    assert dot_xla.exact_statically(info)
    prods = np.outer(_values(ml_dtypes.float4_e2m1fn), _values(ml_dtypes.float8_e4m3fn))
    assert _bf16_exact(prods).all()
    assert not dot_xla.exact_statically(dot.format_info(gx.MXFP8_E4M3))
    assert not dot_xla.exact_statically(dot.format_info(gx.FP8_1x128))


@pytest.mark.parametrize("elem, bound", [(jnp.float8_e4m3fn, -124), (jnp.float8_e5m2, -117)])
def test_run_time_check_at_the_edges(elem, bound):
    """The smallest scale on each side of the bound picks the bf16 / the f32 dot, and either way the
    result is the reference's. (Values this small are float32 subnormals, which XLA:CPU flushes to
    zero in the reference and here alike; the representability itself is checked above.)"""
    fmt = gx.MXFP8_E4M3 if elem == jnp.float8_e4m3fn else gx.MXFP8_E5M2
    info = dot.format_info(fmt)
    tiny = float(jnp.finfo(elem).smallest_subnormal)
    rhs = gx.BlockScaledArray(jnp.ones((2, 64), elem), jnp.full((2, 2), 2.0 ** 100, jnp.float32).astype(E8M0),
                              None, fmt, -1)
    for e, exact in ((bound, True), (bound - 1, False), (-127, False), (127, True)):
        data = jnp.full((2, 64), 3 * tiny, elem)
        scale = jnp.full((2, 2), 2.0 ** 20, jnp.float32).at[1, 1].set(2.0 ** e).astype(E8M0)
        lhs = gx.BlockScaledArray(data, scale, None, fmt, -1)
        assert bool(dot_xla.scales_exact(lhs, info)) == exact, e
        assert bool(dot_xla.scales_exact(rhs, info))
        assert _bf16_exact(3 * tiny * 2.0 ** e) == exact
        got = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="xla")
        ref = gx.block_scaled_dot(lhs, rhs, preferred_element_type=jnp.float32, backend="reference")
        np.testing.assert_array_equal(got, ref)
    nan_scale = gx.BlockScaledArray(data, jnp.full((2, 2), jnp.nan, jnp.float32).astype(E8M0), None, fmt, -1)
    assert bool(dot_xla.scales_exact(nan_scale, info))  # NaN stays NaN in bf16


# --------------------------------------------------------------------------- what XLA:GPU receives
def _bf16_branch(text: str) -> str:
    """The part of a lowered module the bf16 path runs: the second region of a stablehlo.case
    (lax.cond's true branch) where there is one, else all of it."""
    if '"stablehlo.case"' not in text:
        return text
    start = text.index('"stablehlo.case"')
    return text[text.index("}, {", start):text.index("}) :", start)]


def _operand_sized_f32(text: str, *shapes) -> list[str]:
    return [line for line in text.splitlines() for s in shapes if f"tensor<{s[0]}x{s[1]}xf32>" in line]


@pytest.mark.parametrize("fmt", [gx.MXFP8_E4M3, gx.NVFP4, gx.MXFP4], ids=lambda f: f.name)
def test_cuda_lowering_dequantizes_to_bf16_and_returns_bf16(fmt):
    """Lowered for CUDA (docs/design.md "The dot's default on GPU"): each operand goes from its
    8/4-bit data to bfloat16 in one convert-and-multiply, with no float32 tensor of an operand's
    size on the bf16 path, and a bfloat16 result comes straight out of the dot (MX: no global
    scale to apply to a float32 accumulator first)."""
    m, n, k = 48, 80, 256
    x, w = _inputs(4, m, n, k, False)
    qx, qw = gx.quantize(x, fmt), gx.quantize(w.T, fmt, axis=0)  # w.T: (K, N), quantized along K
    dn = (((1,), (0,)), ((), ()))
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dn, preferred_element_type=jnp.bfloat16, backend="xla"))
    with gx.common.backends.platform("cuda"):
        text = f.trace(qx, qw).lower(lowering_platforms=("cuda",)).as_text()
    path = _bf16_branch(text)
    assert not _operand_sized_f32(path, (m, k), (k, n))
    assert any("stablehlo.multiply" in line and f"tensor<{m}x{k}xbf16>" in line for line in path.splitlines())
    out = "bf16" if fmt.is_mx else "f32"  # NVFP4's global scales multiply the float32 accumulator
    assert any("dot_general" in line and f"-> tensor<{m}x{n}x{out}>" in line for line in path.splitlines())


def test_cuda_training_step_has_no_transposed_copy():
    """The MXFP8 training step through scaled_dot_general, lowered for CUDA: no transpose at all
    (the backward quantizes the saved lhs along its rows in place instead of a transposed bf16
    copy), and every bf16-path dot returns the operands' bfloat16 (no float32 gradient converted
    afterwards). On CPU the transposed copy stays (XLA:CPU's dot is 3x slower without it)."""
    a = jax.random.normal(jax.random.key(0), (64, 256), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (256, 96), jnp.bfloat16)
    dn = (((1,), (0,)), ((), ()))

    def loss(a, b):
        return jnp.sum(jnp.square(gx.scaled_dot_general(a, b, dn).astype(jnp.float32)))
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    with gx.common.backends.platform("cuda"):
        text = step.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert "stablehlo.transpose" not in text
    assert text.count('"stablehlo.case"') == 3  # the forward and two gradient dots, each checking its E8M0 scales
    for shape in ((64, 96), (64, 256), (256, 96)):
        assert f"-> tensor<{shape[0]}x{shape[1]}xbf16>" in text
    assert "stablehlo.transpose" in jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).trace(a, b).lower().as_text()


def test_cuda_training_step_computes_the_cpu_steps_gradients():
    """The CUDA form of the backward (lhs quantized along its rows in place, bf16 results straight
    from the dots), traced for CUDA and run here, gives the CPU form's values (the same blocks;
    the dot results differ at most by the order of the float32 accumulation)."""
    a = jax.random.normal(jax.random.key(2), (64, 256), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(3), (256, 96), jnp.bfloat16)
    dn = (((1,), (0,)), ((), ()))

    def grads(a, b):
        return jax.grad(lambda a, b: jnp.sum(jnp.square(
            gx.scaled_dot_general(a, b, dn, backend="xla").astype(jnp.float32))), argnums=(0, 1))(a, b)
    want = jax.jit(grads)(a, b)
    with gx.common.backends.platform("cuda"):
        got = jax.jit(grads)(a, b)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=1e-2, atol=1e-2)
