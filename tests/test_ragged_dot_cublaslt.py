"""The cuBLASLt grouped backend of ragged_dot (issue 30): jax_gpuext/ragged_dot/cublaslt.py.

CPU tests check what is decided before any GPU: the workspace size the Python side allocates
against the handler's own computation, the per-group rhs scale layouts against the cuBLAS docs'
statement of how cuBLAS reads them (emulated here), the reasons ``supports`` gives, and the
custom call the backend lowers to. GPU tests (marked gpu) compare the handler with a float64
NumPy model of the grouped product written here: groups of rows, one weight matrix each, rows
past the groups zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from _hlo import custom_calls_in_command_buffers
from jax_gpuext import _ext
from jax_gpuext.ragged_dot import cublaslt
from jax_gpuext.ragged_dot.common import RaggedProblem

TARGET = cublaslt.TARGET


def rand(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


def problem(m=64, k=256, n=128, g=4, rhs_format=gx.FP8_128x128, out=jnp.bfloat16, rhs_contract=2,
            mode="ragged_m", lhs_format=gx.FP8_1x128):
    return RaggedProblem(mode, m, k, n, g, lhs_format, rhs_format, out, rhs_contract)


def operands(m, k, n, g, rhs_format, rhs_contract, seed=0):
    """lhs FP8_1x128 (M, K); rhs quantized with its blocks along K, stored (G, N, K) for
    rhs_contract 2 or (G, K, N) for 1."""
    lhs = gx.quantize(rand(seed, (m, k)), gx.FP8_1x128)
    w = rand(seed + 1, (g, n, k), 0.1)
    if rhs_contract == 1:
        w = jnp.swapaxes(w, 1, 2)
    axis = -1 if rhs_contract == 2 else 1
    rhs = gx.quantize(w, rhs_format) if rhs_format == gx.FP8_128x128 else gx.quantize(w, rhs_format, axis=axis)
    return lhs, rhs


# --------------------------------------------------------------------------- float64 NumPy model
def np_dequant_rows(q):
    """FP8_1x128 along the last axis, float64: data * the scale of element k's block k // 128."""
    data = np.asarray(q.data.astype(jnp.float32), np.float64)
    scale = np.asarray(q.scale, np.float64)
    return data * scale[..., np.arange(data.shape[-1]) // 128]


def np_weights_gnk(q, rhs_contract):
    """Dequantized weights as (G, N, K) float64, by explicit block indices."""
    data = np.asarray(q.data.astype(jnp.float32), np.float64)
    scale = np.asarray(q.scale, np.float64)
    if q.format == gx.FP8_128x128:
        r = np.arange(data.shape[1]) // 128
        c = np.arange(data.shape[2]) // 128
        w = data * scale[:, r][:, :, c]
    else:
        ax = q.axis % 3
        w = data * np.take(scale, np.arange(data.shape[ax]) // 128, axis=ax)
    return w if rhs_contract == 2 else np.swapaxes(w, 1, 2)


def np_ragged_dot(lhs, rhs, sizes, rhs_contract):
    """out[r] = lhs[r] . W[g(r)]^T for the rows of each group; rows past the groups are 0. Sizes
    are clamped as the handler documents: negative -> 0, nothing past row M."""
    a = np_dequant_rows(lhs)
    w = np_weights_gnk(rhs, rhs_contract)
    m = a.shape[0]
    out = np.zeros((m, w.shape[1]))
    mag = np.zeros_like(out)
    start = 0
    for g, s in enumerate(np.asarray(sizes, np.int64)):
        end = min(start + max(int(s), 0), m)
        out[start:end] = a[start:end] @ w[g].T
        mag[start:end] = np.abs(a[start:end]) @ np.abs(w[g]).T
        start = end
    return out, mag


# --------------------------------------------------------------------------- CPU: layouts, sizes, reasons
@pytest.mark.parametrize("m,n,k,g,row_align,itemsize", [
    (64, 128, 256, 4, 16, 2), (33, 136, 384, 3, 1, 4), (0, 8, 128, 5, 16, 2), (100, 8, 128, 0, 1, 2),
    (4096, 7168, 2048, 256, 16, 2)])
def test_workspace_size_is_the_handlers(m, n, k, g, row_align, itemsize):
    """Python allocates what csrc/ragged_dot/grouped_layout.cu carves (where _cuda was built)."""
    mod = _ext.module("cuda")
    if mod is None or not hasattr(mod, "cublaslt_grouped_workspace_bytes"):
        pytest.skip("the grouped cuBLASLt dot was not built here")
    assert cublaslt.workspace_bytes(m, n, k, g, row_align, itemsize) == \
        mod.cublaslt_grouped_workspace_bytes(m, n, k, g, row_align, itemsize)


@pytest.mark.parametrize("rhs_contract", [1, 2], ids=["GKN", "GNK"])
@pytest.mark.parametrize("fmt", [gx.FP8_128x128, gx.FP8_1x128], ids=["128x128", "1x128"])
def test_rhs_scales_are_laid_out_per_group_as_cublas_reads_them(fmt, rhs_contract):
    """Per group, cuBLAS's A with (cuBLAS docs, "Scaling factors layouts") BLK128x128_32F reads
    block (nb, kb) at nb * round_up(Kb, 4) + kb; VEC128_32F reads (n, kb) at kb * N + n. Odd
    block counts (Kb = 3, Nb = 3) catch a transposed or unpadded layout; data is (G, N, K)."""
    g, n, k = 2, 264, 384
    _, rhs = operands(16, k, n, g, fmt, rhs_contract, seed=3)
    p = problem(m=16, k=k, n=n, g=g, rhs_format=fmt, rhs_contract=rhs_contract)
    data, buf = (np.asarray(x) for x in cublaslt.rhs_operand(rhs, p))
    want_data = np.asarray(rhs.data if rhs_contract == 2 else jnp.swapaxes(rhs.data, 1, 2))
    np.testing.assert_array_equal(data.view(np.uint8), want_data.view(np.uint8))
    assert buf.shape[1] == (3 * 4 if fmt == gx.FP8_128x128 else 3 * n)
    scale = np.asarray(rhs.scale)
    kb_n = 3
    for gi in range(g):
        for nn in (0, 1, 127, 128, 200, n - 1):
            for kb in range(kb_n):
                if fmt == gx.FP8_128x128:
                    read = buf[gi, (nn // 128) * 4 + kb]
                    want = scale[gi, nn // 128, kb] if rhs_contract == 2 else scale[gi, kb, nn // 128]
                else:
                    read = buf[gi, kb * n + nn]
                    want = scale[gi, nn, kb] if rhs_contract == 2 else scale[gi, kb, nn]
                assert read == want, (gi, nn, kb)


def test_supports_says_why():
    why = lambda **kw: cublaslt.supports(problem(**kw)).reason  # noqa: E731
    assert "ragged-contracted" in why(mode="ragged_contract")
    assert "FP8_1x128 activations" in why(lhs_format=gx.MXFP8_E4M3, rhs_format=gx.MXFP8_E4M3)
    assert "bfloat16 or float32" in why(out=jnp.float16)
    assert "K=200" in why(k=200)
    assert "N=100" in why(n=100)
    ok = cublaslt.supports(problem())
    assert ok.supported, ok.reason  # without a GPU nothing is prepared: shapes alone decide


def test_lowers_to_the_grouped_custom_call():
    """What the backend hands XLA for cuda: our target, the weights as (G, N, K) (transposed from
    lax.ragged_dot's (G, K, N) by XLA), the group sizes as an int32 operand, attributes."""
    m, k, n, g = 48, 256, 128, 3
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, 1)
    sizes = jnp.array([20, 0, 19], jnp.int32)
    p = problem(m=m, k=k, n=n, g=g, rhs_contract=1)
    f = jax.jit(lambda a, b, s: cublaslt.impl(a, b, s, p))
    text = f.trace(lhs, rhs, sizes).lower(lowering_platforms=("cuda",)).as_text()
    assert TARGET in text
    assert "rhs_scale_mode = 5" in text and "row_align = 16" in text
    assert f"tensor<{g}x{n}x{k}xf8E4M3FN>" in text and f"tensor<{g}xi32>" in text
    ws = cublaslt.workspace_bytes(m, n, k, g, 16, 2) + cublaslt.WORKSPACE_ALIGNMENT
    assert f"tensor<{ws}xui8>" in text


def test_handler_registers_an_initialize_stage():
    mod = _ext.module("cuda")
    if mod is None or TARGET not in mod.registrations():
        pytest.skip(f"{TARGET} was not built here")
    assert set(mod.registrations()[TARGET]) == {"initialize", "execute"}


# --------------------------------------------------------------------------- GPU (Hopper, cuBLAS >= 13.4)
GPU_GATES = ("hopper", "ragged_dot_cublaslt_built", "cublaslt_grouped_fp8")

SIZES = {  # G = 6 groups over M = 200 rows (sum <= M)
    "balanced": [32, 32, 32, 32, 32, 32],
    "skewed": [150, 2, 0, 40, 1, 7],
    "empty_groups": [0, 0, 96, 0, 0, 104],
    "single_rows": [1, 1, 1, 1, 1, 1],
    "sum_below_m": [17, 33, 5, 0, 60, 3],
    "one_group_all": [200, 0, 0, 0, 0, 0],
}


def _run(lhs, rhs, sizes, p, row_align, **jit_kw):
    f = jax.jit(lambda a, b, s: cublaslt.impl(a, b, s, p, row_align=row_align), **jit_kw)
    return f, f(lhs, rhs, sizes)


def _check(y, lhs, rhs, sizes, rhs_contract, out_dtype):
    want, mag = np_ragged_dot(lhs, rhs, sizes, rhs_contract)
    y = np.asarray(y.astype(jnp.float32), np.float64)
    # fp32 accumulation of FP8 products (fewer product bits on Hopper: 1e-3 of sum |terms|), then
    # the output's rounding
    ulp = 2.0 ** -8 if out_dtype == jnp.bfloat16 else 2.0 ** -23
    bound = 1e-3 * mag + ulp * np.abs(want) + 1e-30
    bad = np.abs(y - want) > bound
    assert not bad.any(), f"{bad.sum()} of {bad.size} elements off, first at {np.argwhere(bad)[0]}"
    total = min(int(np.clip(np.asarray(sizes, np.int64), 0, None).sum()), y.shape[0])
    assert (y[total:] == 0).all(), "rows past the groups must be written as zeros"


@pytest.mark.verifies("ragged_dot.cublaslt")
@pytest.mark.gpu
@pytest.mark.gates(*GPU_GATES)
@pytest.mark.parametrize("row_align", cublaslt.ROW_ALIGNS)
@pytest.mark.parametrize("case", list(SIZES))
def test_gpu_matches_f64(case, row_align):
    m, k, n = 200, 384, 136  # K blocks odd (BLK128x128 padding), N not a multiple of 128
    lhs, rhs = operands(m, k, n, 6, gx.FP8_128x128, 2, seed=10)
    sizes = jnp.array(SIZES[case], jnp.int32)
    p = problem(m=m, k=k, n=n, g=6)
    f, y = _run(lhs, rhs, sizes, p, row_align)
    _check(y, lhs, rhs, sizes, 2, jnp.bfloat16)
    assert TARGET in f.lower(lhs, rhs, sizes).compile().as_text()



@pytest.mark.verifies("ragged_dot.cublaslt")
@pytest.mark.gpu
@pytest.mark.gates(*GPU_GATES)
@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("rhs_contract", [1, 2], ids=["GKN", "GNK"])
@pytest.mark.parametrize("fmt", [gx.FP8_128x128, gx.FP8_1x128], ids=["128x128", "1x128"])
def test_gpu_formats_layouts_outputs(fmt, rhs_contract, out_dtype):
    m, k, n, g = 160, 512, 264, 5
    lhs, rhs = operands(m, k, n, g, fmt, rhs_contract, seed=20)
    sizes = jnp.array([33, 0, 64, 1, 50], jnp.int32)
    p = problem(m=m, k=k, n=n, g=g, rhs_format=fmt, out=out_dtype, rhs_contract=rhs_contract)
    _, y = _run(lhs, rhs, sizes, p, cublaslt.ROW_ALIGN)
    assert y.dtype == out_dtype
    _check(y, lhs, rhs, sizes, rhs_contract, out_dtype)



@pytest.mark.verifies("ragged_dot.cublaslt")
@pytest.mark.gpu
@pytest.mark.gates(*GPU_GATES)
@pytest.mark.parametrize("row_align", cublaslt.ROW_ALIGNS)
def test_gpu_group_sizes_out_of_range_stay_in_bounds(row_align):
    """Whatever group_sizes holds on the device (negative, past M, int32 max), the kernels clamp:
    no fault, and the result is the clamped groups' product (sizes as np_ragged_dot clamps them)."""
    m, k, n = 64, 256, 128
    lhs, rhs = operands(m, k, n, 4, gx.FP8_128x128, 2, seed=30)
    p = problem(m=m, k=k, n=n, g=4)
    for sizes in ([-5, 40, 2**31 - 1, 7], [70, 70, 70, 70], [-1, -1, -1, -1]):
        sizes = jnp.array(sizes, jnp.int32)
        _, y = _run(lhs, rhs, sizes, p, row_align)
        _check(y, lhs, rhs, sizes, 2, jnp.bfloat16)



@pytest.mark.verifies("ragged_dot.cublaslt")
@pytest.mark.gpu
@pytest.mark.gates(*GPU_GATES)
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_command_buffer_reads_the_sizes_of_each_call(command_buffer):
    """Inside a CUDA graph the group sizes are read on the device at every replay: one compiled
    program, three different size vectors, three right answers; our call is in the command buffer
    exactly when CUSTOM_CALL capture is on (kCmdBufferCompatible). No plan is made while running."""
    m, k, n, g = 128, 256, 128, 4
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, 2, seed=40)
    p = problem(m=m, k=k, n=n, g=g)
    opts = {"xla_gpu_enable_command_buffer": command_buffer, "xla_gpu_graph_min_graph_size": 1}
    f = jax.jit(lambda a, b, s: cublaslt.impl(a, b, s, p), compiler_options=opts)
    for sizes in ([32, 32, 32, 32], [0, 100, 1, 20], [128, 0, 0, 0], [32, 32, 32, 32]):
        sizes = jnp.array(sizes, jnp.int32)
        _check(f(lhs, rhs, sizes), lhs, rhs, sizes, 2, jnp.bfloat16)
    captured = custom_calls_in_command_buffers(f.lower(lhs, rhs, jnp.zeros(g, jnp.int32)).compile().as_text())
    assert (TARGET in captured) == bool(command_buffer), captured
    plans, built_while_running = _ext.module("cuda").cublaslt_grouped_plan_stats()
    assert plans >= 1 and built_while_running == 0

