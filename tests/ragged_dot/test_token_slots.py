"""The weight gradient's operands in one pass (op ``quantize_token_slots``,
jax_gpuext/ragged_dot/token_slots.py; docs/design.md, "The weight gradient's operand passes").

CPU: the (first row, count) table the kernel reads, against a NumPy model of the padded slot
layout; that the table alone determines the slot codes (each block quantized from its rows, zeros
after: the kernel's contract); that the cuda branch's assembly of the compact arrays from the slot
codes is quantize_grouped's bits; the lowered custom call's operands; auto's choice off a GPU.
GPU (isolated: a new kernel may trap): the kernel against the composed path bit for bit, on every
input dtype, skewed / empty groups, rows past the groups, specials, several column tiles; a
hostile table; the training step's HLO; capture in a command buffer.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import _ragged_numpy as rnp
import jax_gpuext as gx
from jax_gpuext.common import backends
from jax_gpuext.ragged_dot import common, grouped, token_slots

SIZE_CASES = {  # (M tokens, sizes)
    "skewed_with_empty": (300, [0, 1, 150, 0, 70, 3]),
    "starts_not_multiple_of_16": (700, [1, 130, 3, 255, 2, 129, 77]),
    "sizes_past_m": (300, [250, 100, 50]),
    "out_of_range": (64, [-5, 40, 2**31 - 1, 7]),
    "one_group": (129, [129]),
}


def _model_table(sizes, m: int, nblocks: int) -> np.ndarray:
    """(nblocks, 2): each 128-row block of each segment (groups, then the rows past them), in order."""
    rows = []
    for start, stop in rnp.segments(sizes, m):
        rows += [(j, min(128, stop - j)) for j in range(start, stop, 128)]
    rows += [(0, 0)] * (nblocks - len(rows))
    return np.array(rows, np.int32).reshape(nblocks, 2)


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def _x(m: int, cols: int, dtype, seed: int = 0) -> np.ndarray:
    x = np.asarray(jax.random.normal(jax.random.key(seed), (m, cols), jnp.float32) * 3).astype(dtype)
    if m > 9 and cols > 9:
        x[3, :4] = [0.0, -0.0, float(jnp.finfo(dtype).smallest_subnormal), -float(jnp.finfo(dtype).smallest_subnormal)]
        x[min(150, m - 1), 7], x[min(151, m - 1), 8], x[9, 9] = np.inf, -np.inf, np.nan
        x[5, :] = 0  # an all-zero token
    return x


# --------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("case", SIZE_CASES)
def test_block_table_is_the_slot_layout(case):
    m, sizes = SIZE_CASES[case]
    nblocks = common.grouped_block_count(m, len(sizes), 128)
    table = np.asarray(jax.jit(token_slots.block_table, static_argnums=(1, 2))(jnp.array(sizes, jnp.int32), m,
                                                                                nblocks))
    np.testing.assert_array_equal(table, _model_table(sizes, m, nblocks))
    # slot_rows (what the composed path gathers by) is the same layout, slot by slot
    rows, valid = common.slot_rows(common.grouped_layout(jnp.array(sizes, jnp.int32), m, 128), nblocks)
    want_rows = np.concatenate([np.where(np.arange(128) < n, f + np.arange(128), 0) for f, n in table]) \
        if nblocks else np.zeros(0)
    np.testing.assert_array_equal(np.asarray(rows), want_rows)
    np.testing.assert_array_equal(np.asarray(valid), np.concatenate([np.arange(128) < n for _, n in table])
                                  if nblocks else np.zeros(0, bool))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bfloat16", "float32"])
def test_the_table_determines_the_slot_codes(dtype):
    """The kernel's contract, modelled: block j = quantize(rows first .. first + count - 1 of x, zeros
    after, FP8_1x128 along the tokens), codes transposed into slots 128 j .. 128 j + 127. That is
    the composed path's slot_data and scales, bit for bit."""
    m, sizes = SIZE_CASES["starts_not_multiple_of_16"]
    x = _x(m, 40, dtype)
    gs = jnp.array(sizes, jnp.int32)
    got = grouped.quantize_tokens_for_wgrad(jnp.asarray(x), gx.FP8_1x128, gs, tokens_last=True, backend="composed")
    nblocks = common.grouped_block_count(m, len(sizes), 128)
    codes, scales = [], []
    for first, count in _model_table(sizes, m, nblocks):
        block = np.zeros((128, 40), x.dtype)
        block[:count] = x[first:first + count]
        q = gx.quantize(jnp.asarray(block), gx.FP8_1x128, axis=0, backend="reference")
        codes.append(_bits(q.data).T)
        scales.append(_bits(q.scale))
    np.testing.assert_array_equal(_bits(got.slot_data), np.concatenate(codes, axis=1))
    np.testing.assert_array_equal(_bits(got.scale).T, np.concatenate(scales, axis=0))


@pytest.mark.parametrize("tokens_last", [True, False])
def test_cuda_branch_assembles_quantize_grouped(monkeypatch, tokens_last):
    """The cuda branch builds the compact arrays from the kernel's (slot codes, scales) alone. With
    the kernel replaced by its model (the composed path's slot codes), the array is quantize_grouped's
    bit for bit and carries the kernel's codes as slot_data."""
    m, sizes = SIZE_CASES["skewed_with_empty"]
    x = jnp.asarray(_x(m, 48, jnp.bfloat16))
    gs = jnp.array(sizes, jnp.int32)
    composed = grouped.quantize_tokens_for_wgrad(x, gx.FP8_1x128, gs, tokens_last=True, backend="composed")

    def model(xv, s, nblocks):
        assert xv.shape == x.shape and nblocks * 128 == composed.slot_data.shape[1]
        return composed.slot_data, composed.scale.T

    monkeypatch.setattr(token_slots, "cuda_slots", model)
    cuda = backends.Backend("cuda", ("cpu",), (), "the kernel's model")
    monkeypatch.setitem(backends._BACKENDS, token_slots.OP, [cuda])
    got = grouped.quantize_tokens_for_wgrad(x, gx.FP8_1x128, gs, tokens_last=tokens_last, backend="cuda")
    want = gx.quantize_grouped(x.T if tokens_last else x, gx.FP8_1x128, gs, axis=1 if tokens_last else 0)
    assert (got.axis, got.groups, got.global_scale) == (want.axis, want.groups, None)
    for part in ("data", "scale"):
        np.testing.assert_array_equal(_bits(getattr(got, part)), _bits(getattr(want, part)), err_msg=part)
    np.testing.assert_array_equal(_bits(got.slot_data), _bits(composed.slot_data))


def test_custom_call_operands():
    m, cols, sizes = 300, 264, SIZE_CASES["skewed_with_empty"][1]
    nblocks = common.grouped_block_count(m, len(sizes), 128)
    x = jnp.zeros((m, cols), jnp.bfloat16)
    text = jax.jit(lambda v, s: token_slots.cuda_slots(v, s, nblocks)).trace(
        x, jnp.array(sizes, jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    call = [line for line in text.splitlines() if token_slots.TARGET in line]
    assert len(call) == 1, text
    assert re.search(rf"\(tensor<{m}x{cols}xbf16>, tensor<{nblocks}x2xi32>\) -> "
                     rf"\(tensor<{cols}x{128 * nblocks}xf8E4M3FN>, tensor<{nblocks}x{cols}xf32>\)", call[0]), call[0]


def test_auto_off_a_gpu_is_composed_and_says_why():
    """Without a verified kernel (every CPU host): auto runs the composed path, and a named cuda
    backend that cannot run says why; what the kernel does not take is refused by its reason."""
    x = jnp.zeros((300, 264), jnp.bfloat16)
    p = token_slots.problem(gx.FP8_1x128, x, 6)
    with backends.recording() as log:
        grouped.quantize_tokens_for_wgrad(x, gx.FP8_1x128, jnp.array(SIZE_CASES["skewed_with_empty"][1], jnp.int32),
                                          tokens_last=True)
    chosen = [s for s in log if s.op == token_slots.OP]
    assert chosen and chosen[0].chosen == "composed", log
    assert token_slots._supports(p).supported
    for fmt, shape, dtype, word in ((gx.MXFP8_E4M3, (300, 264), jnp.bfloat16, "FP8_1x128"),
                                    (gx.FP8_1x128, (300, 260), jnp.bfloat16, "multiple of 8"),
                                    (gx.FP8_1x128, (300, 258), jnp.float32, "multiple of 4"),
                                    (gx.FP8_1x128, (0, 256), jnp.bfloat16, "no tokens")):
        why = token_slots._supports(token_slots.problem(fmt, jnp.zeros(shape, dtype), 6))
        assert not why.supported and word in why.reason, why.reason


# --------------------------------------------------------------------------- GPU
def gpu_test(f):
    """A GPU test of the kernel: isolated (a new kernel may trap), verifying feature token_slots."""
    for mark in (pytest.mark.gpu, pytest.mark.isolated(only="gpu"),
                 pytest.mark.verifies("formats.cuda", feature=token_slots.FEATURE)):
        f = mark(f)
    return f


def _both(x, sizes, tokens_last, backend):
    f = jax.jit(lambda v, s: grouped.quantize_tokens_for_wgrad(v, gx.FP8_1x128, s, tokens_last=tokens_last,
                                                               backend=backend))
    return f, f(x, jnp.array(sizes, jnp.int32))


# One shape (700 tokens, 7 groups) for every size vector: the sizes are run-time values, so each
# (dtype, orientation, backend) compiles once (the GPU step's time is mostly compiles).
GPU_M = 700
GPU_SIZES = {
    "skewed_with_empty": [0, 1, 150, 0, 70, 3, 0],
    "starts_not_multiple_of_16": [1, 130, 3, 255, 2, 129, 77],
    "sizes_past_m": [500, 100, 150, 0, 0, 0, 0],
    "out_of_range": [-5, 40, 2**31 - 1, 7, 0, 0, 0],
    "one_group": [GPU_M, 0, 0, 0, 0, 0, 0],
    "all_rows_past_the_groups": [0] * 7,
}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32], ids=["bfloat16", "float16", "float32"])
@gpu_test
def test_gpu_token_slots_match_composed(dtype):
    cols = 1000 if dtype != jnp.float32 else 260  # several column tiles, the last partial
    x = jax.device_put(_x(GPU_M, cols, dtype, seed=3), jax.devices("cuda")[0])
    gs0 = jnp.zeros(7, jnp.int32)
    for tokens_last in (True, False):
        run = {}
        for backend in ("cuda", "composed"):
            f = jax.jit(lambda v, s, b=backend: grouped.quantize_tokens_for_wgrad(
                v, gx.FP8_1x128, s, tokens_last=tokens_last, backend=b))
            run[backend] = f.lower(x, gs0).compile()
        assert token_slots.TARGET in run["cuda"].as_text()  # the kernel, not a fallback
        for case, sizes in GPU_SIZES.items():
            gs = jnp.array(sizes, jnp.int32)
            got, want = run["cuda"](x, gs), run["composed"](x, gs)
            for part in ("slot_data", "data", "scale"):
                np.testing.assert_array_equal(_bits(getattr(got, part)), _bits(getattr(want, part)),
                                              err_msg=f"{case} {part} tokens_last={tokens_last}")


@gpu_test
def test_gpu_token_slots_hostile_table():
    """Whatever the table says, the kernel reads only x's rows and writes only its outputs: a
    count above 128 is 128, a count past x's end stops there, a first row outside x or a count
    <= 0 is an empty block (zeros)."""
    m, cols = 200, 64
    x = jax.device_put(_x(m, cols, jnp.bfloat16, seed=4), jax.devices("cuda")[0])
    table = np.array([[0, 1000], [150, 128], [-1, 5], [200, 3], [2**31 - 1, 1], [10, -7], [7, 0], [199, 1]],
                     np.int32)
    nblocks = len(table)
    out = (jax.ShapeDtypeStruct((cols, 128 * nblocks), jnp.float8_e4m3fn),
           jax.ShapeDtypeStruct((nblocks, cols), jnp.float32))
    from jax_gpuext.common import ffi as _ffi

    codes, scale = jax.jit(lambda v, t: _ffi.ffi_call(token_slots.TARGET, out, v, t, vmap_method="sequential"))(
        x, jnp.asarray(table))
    xs = np.asarray(x)
    for j, (first, count) in enumerate(table.tolist()):
        n = min(count, 128, m - first) if 0 <= first < m and count > 0 else 0
        block = np.zeros((128, cols), xs.dtype)
        block[:n] = xs[first:first + n]
        q = gx.quantize(jnp.asarray(block), gx.FP8_1x128, axis=0, backend="reference")
        np.testing.assert_array_equal(_bits(codes)[:, 128 * j:128 * j + 128], _bits(q.data).T, err_msg=f"block {j}")
        np.testing.assert_array_equal(_bits(scale)[j], _bits(q.scale)[0], err_msg=f"block {j}")



@gpu_test
def test_gpu_training_step_runs_the_kernel():
    """auto under the allow-unverified switch (the kernel is unverified until this file passes):
    scaled_ragged_dot's weight gradient quantizes x and dy with the one-pass kernel, and the
    gradient equals the composed path's bit for bit."""
    from jax_gpuext.common import verified

    m, k, n, sizes = 700, 256, 264, SIZE_CASES["starts_not_multiple_of_16"][1]
    dev = jax.devices("cuda")[0]
    x = jax.device_put(jnp.asarray(_x(m, k, jnp.bfloat16, seed=5)), dev)
    x = jnp.where(jnp.isfinite(x), x, 0)
    w = jax.device_put(jax.random.normal(jax.random.key(6), (len(sizes), k, n), jnp.bfloat16), dev)
    gs = jnp.array(sizes, jnp.int32)

    def loss(x, w):
        return jnp.sum(gx.scaled_ragged_dot(x, w, gs, preferred_element_type=jnp.float32) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(verified.ALLOW_ENV, "1")  # both runs: the same backends for everything else
        with backends.recording() as log:
            compiled = grad.lower(x, w).compile()  # run as compiled: one compile
        got, text = compiled(x, w), compiled.as_text()
        assert [s.chosen for s in log if s.op == token_slots.OP] == ["cuda", "cuda"], log
        assert text.count(token_slots.TARGET) >= 2
        mp.setattr(grouped.token_slots, "cuda_slots", None)  # any use of the kernel would fail
        mp.setitem(backends._BACKENDS, token_slots.OP,
                   [b for b in backends._BACKENDS[token_slots.OP] if b.name == "composed"])
        jax.clear_caches()
        want = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(_bits(a), _bits(b))



@gpu_test
def test_gpu_token_slots_in_command_buffer():
    """gpuext_quantize_token_slots is recorded into a CUDA graph once and replayed without its
    handler, each replay bit-identical to the composed path."""
    import _command_buffer as cb

    x = jax.device_put(_x(GPU_M, 256, jnp.bfloat16, seed=9), jax.devices("cuda")[0])
    sizes = GPU_SIZES["starts_not_multiple_of_16"]
    gs = jnp.array(sizes, jnp.int32)
    _, want = _both(x, sizes, True, "composed")
    for command_buffer in ("", "CUSTOM_CALL"):
        f = jax.jit(lambda v, s: grouped.quantize_tokens_for_wgrad(v, gx.FP8_1x128, s, tokens_last=True,
                                                                   backend="cuda").slot_data,
                    compiler_options=cb.options(command_buffer))
        counts = cb.run_counted(f, (x, gs), token_slots.TARGET,
                                check=lambda got: np.testing.assert_array_equal(_bits(got), _bits(want.slot_data)))
        cb.assert_counts(counts, cb.RUNS, command_buffer)

