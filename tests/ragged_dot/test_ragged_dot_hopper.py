"""Our grouped sm_90a kernel, the ``hopper`` backend of ragged_dot (issue 30):
jax_gpuext/ragged_dot/hopper.py, csrc/ragged_dot/hopper_grouped*.

CPU tests: the workspace size against the handler's, the reasons ``supports`` gives, the custom
call the backend lowers to. GPU tests (marked gpu, Hopper) compare the kernel with the float64
model of tests/_ragged_model.py, on shapes that reach each part of it: several row tiles per group
and groups that end inside a tile, more K tiles than pipeline stages (the barrier phases wrap),
partial column tiles, empty groups and out-of-range sizes, and replays under command buffers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jax_gpuext as gx
from _ragged_model import SIZES, check_command_buffer_replays, check_gpu_result, operands, problem
from jax_gpuext.common import extension as _ext
from jax_gpuext.ragged_dot import hopper

TARGET = hopper.TARGET


@pytest.mark.parametrize("m,g", [(64, 4), (0, 5), (100, 0), (32768, 256), (129, 1)])
def test_workspace_size_is_the_handlers(m, g):
    mod = _ext.module("cuda")
    if mod is None or not hasattr(mod, "ragged_dot_hopper_workspace_bytes"):
        pytest.skip("the CUDA extension was not built here")
    assert hopper.workspace_bytes(m, g) == mod.ragged_dot_hopper_workspace_bytes(m, g)


def test_supports_says_why():
    why = lambda **kw: hopper.supports(problem(**kw)).reason  # noqa: E731
    assert "ragged-contracted" in why(mode="ragged_contract")
    assert "FP8_128x128 weights" in why(rhs_format=gx.FP8_1x128)
    assert "K=200" in why(k=200)
    assert "N=100" in why(n=100)
    r = hopper.supports(problem())
    if _ext.module("cuda") is None:  # shapes pass; the build decides
        assert not r.supported and "no CUDA extension" in r.reason


def test_lowers_to_the_kernel_with_transposed_lhs_scales():
    """The lhs scales go in as (K/128, round_up(M, 4)) (TMA boxes along M), the weights (G, N, K)
    with (G, N/128, K/128) scales, the sizes int32, and a workspace of the computed size."""
    m, k, n, g = 50, 384, 264, 3
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, 1)
    sizes = jnp.array([20, 0, 19], jnp.int32)
    p = problem(m=m, k=k, n=n, g=g, rhs_contract=1)
    text = jax.jit(lambda a, b, s: hopper.impl(a, b, s, p)).trace(lhs, rhs, sizes).lower(
        lowering_platforms=("cuda",)).as_text()
    assert TARGET in text
    for t in ("tensor<3x52xf32>", f"tensor<{g}x{n}x{k}xf8E4M3FN>", f"tensor<{g}x3x3xf32>", f"tensor<{g}xi32>",
              f"tensor<{hopper.workspace_bytes(m, g) + hopper.WORKSPACE_SLACK}xui8>"):
        assert t in text, t


def test_handler_registers_an_initialize_stage():
    mod = _ext.module("cuda")
    if mod is None or TARGET not in mod.registrations():
        pytest.skip(f"{TARGET} was not built here")
    assert set(mod.registrations()[TARGET]) == {"initialize", "execute"}


# --------------------------------------------------------------------------- GPU (Hopper)
def _run(lhs, rhs, sizes, p, **jit_kw):
    f = jax.jit(lambda a, b, s: hopper.impl(a, b, s, p), **jit_kw)
    return f, f(lhs, rhs, sizes)


@pytest.mark.verifies("ragged_dot.hopper")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("case", list(SIZES))
def test_gpu_matches_f64(case):
    m, k, n = 200, 384, 136  # a partial column tile; 3 K tiles
    lhs, rhs = operands(m, k, n, 6, gx.FP8_128x128, 2, seed=10)
    sizes = jnp.array(SIZES[case], jnp.int32)
    f, y = _run(lhs, rhs, sizes, problem(m=m, k=k, n=n, g=6))
    check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)
    assert TARGET in f.lower(lhs, rhs, sizes).compile().as_text()


@pytest.mark.verifies("ragged_dot.hopper")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32, jnp.float16], ids=["bf16", "f32", "f16"])
@pytest.mark.parametrize("rhs_contract", [1, 2], ids=["GKN", "GNK"])
def test_gpu_many_tiles_and_stages(rhs_contract, out_dtype):
    """M = 1000 over 3 groups (one of 700 rows: 6 row tiles, ending mid-tile), N = 392 (4 column
    tiles, the last partial), K = 1024 (8 K tiles through 6 stages: every barrier phase wraps)."""
    m, k, n, g = 1000, 1024, 392, 3
    lhs, rhs = operands(m, k, n, g, gx.FP8_128x128, rhs_contract, seed=20)
    sizes = jnp.array([700, 1, 250], jnp.int32)  # 951 rows: the last 49 must come out zero
    _, y = _run(lhs, rhs, sizes, problem(m=m, k=k, n=n, g=g, out=out_dtype, rhs_contract=rhs_contract))
    assert y.dtype == out_dtype
    check_gpu_result(y, lhs, rhs, sizes, rhs_contract, out_dtype)


@pytest.mark.verifies("ragged_dot.hopper")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
def test_gpu_group_sizes_out_of_range_stay_in_bounds():
    m, k, n = 64, 256, 128
    lhs, rhs = operands(m, k, n, 4, gx.FP8_128x128, 2, seed=30)
    p = problem(m=m, k=k, n=n, g=4)
    for sizes in ([-5, 40, 2**31 - 1, 7], [70, 70, 70, 70], [-1, -1, -1, -1]):
        sizes = jnp.array(sizes, jnp.int32)
        _, y = _run(lhs, rhs, sizes, p)
        check_gpu_result(y, lhs, rhs, sizes, 2, jnp.bfloat16)


@pytest.mark.verifies("ragged_dot.hopper")
@pytest.mark.gpu
@pytest.mark.gates("hopper")
@pytest.mark.parametrize("command_buffer", ["", "CUSTOM_CALL"])
def test_gpu_command_buffer_reads_the_sizes_of_each_call(command_buffer):
    check_command_buffer_replays(hopper.impl, TARGET, 300, command_buffer,
                                 ([75, 75, 75, 75], [0, 290, 1, 9], [300, 0, 0, 0], [75, 75, 75, 75]))
