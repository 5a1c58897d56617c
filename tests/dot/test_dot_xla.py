"""Backend ``xla`` of block_scaled_dot (issue 16): equals the reference up to f32 accumulation
order (FP8 blockwise: within the bound of docs/formats.md, "FP8 blockwise through bf16", issue
33), holds no custom call, and the bf16-exactness bound of docs/formats.md holds at its edges
(checked exhaustively over every element and scale code with ml_dtypes)."""

from __future__ import annotations

import re

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


def _fp8_block_tolerance(qx, qw):
    """docs/formats.md, "FP8 blockwise through bf16": |out - exact| <= eps_K * sum_k |l_k r_k|
    + 2^-125 * (sum_k (|l_k| + |r_k|) + K), eps_K = 2^-8 + 2^-17 + 1.01 (K + 2) 2^-24, before
    the rounding to the output dtype (float32 here). Finite entries only."""
    k = qx.data.shape[-1]
    lx, lw = np.abs(_f64(qx)), np.abs(_f64(qw))
    lx, lw = np.where(np.isfinite(lx), lx, 0), np.where(np.isfinite(lw), lw, 0)
    mag = np.einsum("...mk,...nk->...mn", lx, lw)
    rows = lx.sum(-1)[..., :, None] + lw.sum(-1)[..., None, :] + k
    eps = 2.0 ** -8 + 2.0 ** -17 + 1.01 * (k + 2) * 2.0 ** -24
    return eps * mag + 2.0 ** -125 * rows


def _is_fp8_block(q):
    return q.format in (gx.FP8_1x128, gx.FP8_128x128)


def _tolerance(qx, qw):
    """f32 accumulation of K products: |error| <= K * 2^-24 * sum |products| (plus rounding once).
    FP8 blockwise: its bf16 bound (issue 33)."""
    if _is_fp8_block(qx):
        return _fp8_block_tolerance(qx, qw)
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
    # the forward and two gradient dots, each checking its E8M0 scales (scale_range.in_window); the
    # wide-range path (issue 34), a function of its own, reorders its class-stacked results
    text = _without_function(text, "mx_wide_scales")[0]
    assert "stablehlo.transpose" not in text
    assert text.count('"stablehlo.case"') == 3
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


# --------------------------------------------------------------------------- FP8 blockwise through bf16 (issue 33)
_DOT_OPERANDS = re.compile(r"stablehlo\.dot_general .*: \(tensor<([^>]*)>, tensor<([^>]*)>\) -> tensor<([^>]*)>")


def _without_function(text: str, name: str) -> tuple[str, str]:
    """(the module without the private functions named ``name`` or ``name_<n>``, their text)."""
    lines, kept, taken, inside = text.splitlines(), [], [], False
    pattern = re.compile(rf"\s*func\.func private @{name}(_\d+)?\(")
    for line in lines:
        inside = inside or bool(pattern.match(line))
        (taken if inside else kept).append(line)
        inside = inside and line != "  }"
    return "\n".join(kept), "\n".join(taken)


def _dots(text: str) -> list[tuple[str, str, str]]:
    """(lhs, rhs, result) element types of every dot in a lowered module."""
    found = [m.groups() for m in map(_DOT_OPERANDS.search, text.splitlines()) if m]
    assert len(found) == text.count("stablehlo.dot_general"), "a dot_general line did not parse"
    return [tuple(t.rsplit("x", 1)[-1] for t in g) for g in found]


NARROW = {"bf16", "f8E4M3FN", "f8E5M2"}
FP8_BLOCK_LAYOUTS = [  # (lhs shape, rhs format, rhs shape, dimension numbers)
    ((48, 256), gx.FP8_128x128, (40, 256), (((1,), (1,)), ((), ()))),
    ((48, 256), gx.FP8_128x128, (256, 40), (((1,), (0,)), ((), ()))),  # weights (K, N)
    ((2, 48, 256), gx.FP8_128x128, (2, 40, 256), (((2,), (2,)), ((0,), (0,)))),
    ((48, 384), gx.FP8_1x128, (40, 384), (((1,), (1,)), ((), ()))),
]


@pytest.mark.parametrize("layout", range(len(FP8_BLOCK_LAYOUTS)))
@pytest.mark.parametrize("out", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_cuda_fp8_blockwise_dot_is_a_bf16_gemm(layout, out):
    """Issue 33: FP8 blockwise through `xla` was the float32 reference, an f32 x f32 GEMM (50
    TFLOP/s on an H200, 0.06x bf16). Lowered for CUDA now, every dot multiplies bf16 (or FP8)
    operands, no conditional, no custom call, and a bf16 result comes straight out of the dot."""
    ls, fr, rs, dn = FP8_BLOCK_LAYOUTS[layout]
    (lc, rc), _ = dn
    qx = gx.quantize(jax.random.normal(jax.random.key(5), ls), gx.FP8_1x128, axis=lc[0])
    qw = gx.quantize(jax.random.normal(jax.random.key(6), rs), fr, axis=-1 if fr.block == (128, 128) else rc[0])
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dn, preferred_element_type=out, backend="xla"))
    with gx.common.backends.platform("cuda"):
        text = f.trace(qx, qw).lower(lowering_platforms=("cuda",)).as_text()
    dots = _dots(text)
    assert dots and all(a in NARROW and b in NARROW for a, b, _ in dots), dots
    assert all(r == jnp.dtype(out).name.replace("bfloat16", "bf16").replace("float32", "f32") for _, _, r in dots)
    assert "stablehlo.case" not in text and "stablehlo.if" not in text and "custom_call" not in text


@pytest.mark.parametrize("fmt", [gx.NVFP4, gx.MXFP4, gx.MXFP8_E4M3], ids=lambda f: f.name)
def test_cuda_mx_and_nvfp4_keep_their_bf16_structure(fmt):
    """Issue 33, item 4: the MX / NVFP4 paths keep what made them fast (0.95x / 0.85x bf16 on the
    H200): NVFP4 (exact in bf16 whatever the scales) one bf16 x bf16 dot and no conditional; MX
    the same one dot behind lax.cond on the scales (issue 34: scale_range.in_window), the other
    branch a call of the wide-range path (scale_range: one bf16 dot over the 16 pairs of exponent
    classes and one of the elements, float32 results), no f32 x f32 dot anywhere."""
    qx = gx.quantize(jax.random.normal(jax.random.key(7), (48, 256)), fmt)
    qw = gx.quantize(jax.random.normal(jax.random.key(8), (40, 256)), fmt)
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.bfloat16, backend="xla"))
    with gx.common.backends.platform("cuda"):
        text = f.trace(qx, qw).lower(lowering_platforms=("cuda",)).as_text()
    if fmt.is_mx:
        main, wide = _without_function(text, "mx_wide_scales")
        assert _dots(main) == [("bf16", "bf16", "bf16")] and '"stablehlo.case"' in main
        assert "call @mx_wide_scales" in main
        assert _dots(wide) == [("bf16", "bf16", "f32")] * 2  # the 16 class pairs in one, and the elements'
        return
    dots = _dots(text)
    narrow = [d for d in dots if d[0] == d[1] == "bf16"]
    assert len(narrow) == 1, dots
    if dot_xla.exact_statically(dot.format_info(fmt)):
        assert len(dots) == 1 and '"stablehlo.case"' not in text
    else:
        assert sorted(dots) == sorted(narrow + [("f32", "f32", "f32")]) and '"stablehlo.case"' in text


def _fp8_block_operand(data, scale, fmt):
    return gx.BlockScaledArray(jnp.asarray(data, jnp.float8_e4m3fn), jnp.asarray(scale, jnp.float32), None, fmt, -1)


def _fp8_block_special_cases():
    """(name, lhs, rhs): 1x128 x 128x128 operands with K = 384 (3 K blocks), built directly so the
    scales can be anything a float32 holds."""
    rng = np.random.default_rng(33)
    m, n, k = 24, 136, 384
    codes = rng.integers(0, 256, (m, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3F  # no NaN codes (0x7F / 0xFF) here
    lhs_data = codes.view(ml_dtypes.float8_e4m3fn)
    rhs_data = (rng.standard_normal((n, k)) * 100).astype(ml_dtypes.float8_e4m3fn)
    lhs_scale = np.exp2(rng.uniform(-6, 6, (m, 3))).astype(np.float32) * rng.uniform(1, 2, (m, 3)).astype(np.float32)
    rhs_scale = (rng.uniform(0.5, 2, (2, 3)) * 1e-3).astype(np.float32)
    cases = [("random", lhs_data, lhs_scale, rhs_data, rhs_scale)]
    zl, zs = lhs_data.copy(), lhs_scale.copy()
    zl[0] = 0  # a zero row
    zl[1, 128:256] = 0  # a zero block
    zs[2, 1] = 0  # a zero scale
    zr = rhs_data.copy()
    zr[:, :128] = 0  # a zero K block of the weights
    cases.append(("zeros", zl, zs, zr, rhs_scale))
    # subnormals: E4M3 subnormal elements (codes 1..7) and scales putting products in float32's and
    # bfloat16's subnormal range (below 2^-126; bf16's smallest subnormal is 2^-133), one a float32
    # subnormal itself
    sl = lhs_data.copy()
    sl[:, :64] = np.arange(1, 8, dtype=np.uint8)[rng.integers(0, 7, (m, 64))].view(ml_dtypes.float8_e4m3fn)
    ss = lhs_scale.copy()
    ss[:8, 0] = np.float32(2.0 ** -120) * np.float32(1.37)
    ss[8:16, 0] = np.float32(3e-39)  # a float32 subnormal scale
    ss[16:, 1] = np.float32(2.0 ** -128)
    rs = rhs_scale.copy()
    rs[0, 0] = np.float32(2.0 ** -100)
    cases.append(("subnormals", sl, ss, rhs_data, rs))
    return cases


@pytest.mark.parametrize("case", range(3), ids=["random", "zeros", "subnormals"])
def test_fp8_blockwise_within_its_bound_of_float64(case):
    """The stated bound (docs/formats.md, "FP8 blockwise through bf16") against float64, on random
    operands with spread-out float32 scales, zero rows / blocks / scales, and subnormals; and it
    is not the reference's arithmetic any more (the bf16 rounding shows)."""
    name, ld, ls, rd, rs = _fp8_block_special_cases()[case]
    qx, qw = _fp8_block_operand(ld, ls, gx.FP8_1x128), _fp8_block_operand(rd, rs, gx.FP8_128x128)
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32, backend="xla"))
    got = np.asarray(f(qx, qw), np.float64)
    want, tol = _expected(qx, qw), _fp8_block_tolerance(qx, qw)
    assert np.isfinite(got).all()
    assert np.all(np.abs(got - want) <= tol), (name, np.max((np.abs(got - want) - tol) / tol))
    if name == "random":  # the float32 reference is ~2^-24-tight; this path is not
        ref = np.asarray(gx.block_scaled_dot(qx, qw, preferred_element_type=jnp.float32, backend="reference"))
        mag = np.einsum("mk,nk->mn", np.abs(_f64(qx)), np.abs(_f64(qw)))
        assert np.max(np.abs(got - ref) / mag) > 2.0 ** -14


def test_fp8_blockwise_inf_and_nan_like_the_reference():
    """NaN elements, inf and NaN scales (a float32 scale can be either) give NaN / inf where the
    reference does; the finite entries stay within the bound."""
    _, ld, ls, rd, rs = _fp8_block_special_cases()[0]
    ld, ls, rd, rs = ld.copy(), ls.copy(), rd.copy(), rs.copy()
    ld[0, 5] = np.uint8(0x7F).view(ml_dtypes.float8_e4m3fn)  # NaN element
    ld[1, 256:] = 1.0  # row 1's last block: +inf * 1 ...
    ls[1, 2] = np.inf
    rd[0, 256:], rd[1, 256:] = 2.0, -3.0  # ... times only positive (negative) weights: +inf (-inf)
    ls[2, 0] = -np.inf  # -inf times mixed signs and zeros: NaN
    ls[3, 1] = np.nan
    rs[1, 2] = np.inf  # a whole 128x128 weight block
    qx, qw = _fp8_block_operand(ld, ls, gx.FP8_1x128), _fp8_block_operand(rd, rs, gx.FP8_128x128)
    got = np.asarray(gx.block_scaled_dot(qx, qw, preferred_element_type=jnp.float32, backend="xla"), np.float64)
    ref = np.asarray(gx.block_scaled_dot(qx, qw, preferred_element_type=jnp.float32, backend="reference"))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    assert np.isnan(got).any() and np.isinf(got).any() and np.isfinite(got).any()
    fin = np.isfinite(ref)
    want, tol = _expected(qx, qw), _fp8_block_tolerance(qx, qw)
    assert np.all(np.abs(got[fin] - want[fin]) <= tol[fin])


@pytest.mark.gpu
@pytest.mark.gates("cuda_device")
def test_gpu_fp8_blockwise_xla_runs_a_bf16_gemm_within_its_bound():
    """On the GPU: XLA's GEMM gets bf16 operands (no float32 tensor of an operand's size among
    the entry computation's results, i.e. in memory: the dequantize writes bf16; inside a fusion
    a float32 product in registers is fine) and the result is within the stated bound of float64
    (cuBLAS's bf16 GEMM accumulates in float32, in its own order)."""
    m, n, k = 384, 640, 1024
    x = jax.random.normal(jax.random.key(9), (m, k)) * 3
    w = jax.random.normal(jax.random.key(10), (n, k))
    qx, qw = gx.quantize(x, gx.FP8_1x128), gx.quantize(w, gx.FP8_128x128)
    f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, preferred_element_type=jnp.float32, backend="xla"))
    got = np.asarray(f(qx, qw), np.float64)
    want, tol = _expected(qx, qw), _fp8_block_tolerance(qx, qw)
    assert np.all(np.abs(got - want) <= tol), np.max((np.abs(got - want) - tol) / tol)
    hlo = f.lower(qx, qw).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    for shape in ((m, k), (n, k), (k, m), (k, n)):
        assert f"f32[{shape[0]},{shape[1]}]" not in entry, (shape, entry)
