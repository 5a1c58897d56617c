"""The cuBLASLt grouped backend of ragged_dot (issue 30): jax_gpuext/ragged_dot/cublaslt.py.

CPU tests check what is decided before any GPU: the workspace size the Python side allocates
against the handler's own computation, the per-group rhs scale layouts against the cuBLAS docs'
statement of how cuBLAS reads them (emulated here), the reasons ``supports`` gives, and the
custom call the backend lowers to. GPU tests (marked gpu) compare the handler with the float64
NumPy model of tests/_ragged_model.py: groups of rows, one weight matrix each, rows past the
groups zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from _ragged_model import SIZES, check_command_buffer_replays, check_gpu_result, operands, problem
from jax_gpuext.common import extension as _ext
from jax_gpuext.ragged_dot import cublaslt

TARGET = cublaslt.TARGET


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
    assert "writes bfloat16, float32" in why(out=jnp.float16)
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


def _run(lhs, rhs, sizes, p, row_align, **jit_kw):
    f = jax.jit(lambda a, b, s: cublaslt.impl(a, b, s, p, row_align=row_align), **jit_kw)
    return f, f(lhs, rhs, sizes)

@pytest.mark.verifies("ragged_dot.cublaslt", feature="fp8_blockwise")
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
    check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)
    assert TARGET in f.lower(lhs, rhs, sizes).compile().as_text()



@pytest.mark.verifies("ragged_dot.cublaslt", feature="fp8_blockwise")
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
    check_gpu_result(y, lhs, rhs, sizes, rhs_contract, out_dtype)



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
        check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)



@pytest.mark.verifies("ragged_dot.cublaslt", feature="command_buffer")
@pytest.mark.gpu
@pytest.mark.gates(*GPU_GATES)
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_command_buffer_reads_the_sizes_of_each_call(command_buffer):
    """The sizes of every replay are read on the device (tests/_ragged_model.py); no plan is made
    while running (trace time or the initialize stage made it)."""
    check_command_buffer_replays(cublaslt.impl, TARGET, 128, command_buffer,
                                 ([32, 32, 32, 32], [0, 100, 1, 20], [128, 0, 0, 0], [32, 32, 32, 32]))
    plans, built_while_running = _ext.module("cuda").cublaslt_grouped_plan_stats()
    assert plans >= 1 and built_while_running == 0
