"""Handlers never read or write outside a buffer, whatever the attributes say (issue 15).

Each case that corrupted memory before the fix runs in its own Python process, so a
regression shows as a crash of that process (with its stderr in the failure), not of pytest:
- ``place`` on sub-byte dtypes copied ``size_bytes()`` (one byte per element in the FFI headers
  we build against) into a buffer XLA packs (findings 1);
- ``gpuext_quantize`` called directly with ``fp4_packed=0`` wrote one byte per FP4 element into
  a packed buffer (finding 2);
- ``gpuext_all_reduce`` called directly trusted rank, workspace and timeout attributes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SUB_BYTE = ("int4", "uint4", "int2", "uint2", "float4_e2m1fn")


def _run(code: str, devices: int = 1) -> str:
    """Runs `code` in a fresh interpreter; fails with its output unless it exits cleanly."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=os.path.dirname(sys.executable))  # the installed package
    assert p.returncode == 0, f"exit status {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}"
    return p.stdout


@pytest.mark.parametrize("space", ["COLLECTIVE", "TEMP"])
def test_place_sub_byte_dtypes_copy_exactly_the_packed_bytes(space):
    """Bit-exact round trip for every sub-byte dtype, odd counts (a half-filled last byte) and
    2^20 elements (the size that made glibc abort), with the rest of the heap left intact."""
    out = _run(f"""
        import ml_dtypes, numpy as np, jax, jax.numpy as jnp
        import jax_gpuext
        from jax_gpuext import MemorySpace
        rng = np.random.default_rng(0)
        f = jax.jit(lambda v: jax_gpuext.place(v, MemorySpace.{space}))
        for name in {SUB_BYTE!r}:
            dt = np.dtype(getattr(ml_dtypes, name))
            info = ml_dtypes.finfo(dt) if name.startswith("float") else ml_dtypes.iinfo(dt)
            for n in (1, 7, 1024, 1 << 20):
                if name.startswith("float"):
                    x = rng.choice(np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -6, -0.5], np.float32), n).astype(dt)
                else:
                    x = rng.integers(int(info.min), int(info.max) + 1, n).astype(dt)
                for shape in ((n,), (1, n)):
                    y = np.asarray(f(x.reshape(shape)))
                    assert y.dtype == dt and y.shape == shape, (name, n, y.dtype, y.shape)
                    np.testing.assert_array_equal(y.reshape(-1).astype(np.float32), x.astype(np.float32))
        # allocate and free a lot: heap corruption from an earlier copy would surface here
        for _ in range(20):
            np.asarray(jnp.ones((1 << 18,)) * 2).sum()
        print("OK")
    """)
    assert "OK" in out


_QUANTIZE = """
    import numpy as np, jax, jax.numpy as jnp
    from jax_gpuext import formats
    from jax_gpuext.common import extension as _ext
    _ext.ensure_all_registered()

    def call(fmt, x, **override):
        attrs = dict(format=np.int32(fmt.code), axis=np.int64(-1), scale_rounding=np.int32(0),
                     fp4_packed=np.int32(1))
        attrs.update(override)
        out = (jax.ShapeDtypeStruct(x.shape, fmt.elem_dtype),
               jax.ShapeDtypeStruct(formats.scale_shape(x.shape, fmt, -1), fmt.scale_dtype))
        return jax.ffi.ffi_call("gpuext_quantize", out)(x, jnp.ones((), jnp.float32), **attrs)

    def refused(match, fmt, x, **override):
        try:
            jax.block_until_ready(call(fmt, x, **override))
        except Exception as e:  # XlaRuntimeError / JaxRuntimeError carry the handler's message
            assert match in str(e), (match, str(e))
            return
        raise AssertionError(f"{override} was accepted")
"""


def test_quantize_refuses_an_unpacked_fp4_attribute():
    out = _run(_QUANTIZE + """
    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 1 << 14)), jnp.float32)
    for fmt in (formats.NVFP4, formats.MXFP4):
        refused("element buffer is float4_e2m1fn[64, 16384] (524288 bytes), the call would access 1048576",
                fmt, x, fp4_packed=np.int32(0))
        refused("fp4_packed must be 0 or 1", fmt, x, fp4_packed=np.int32(2))
        # the same call with the attribute XLA's layout needs is exact against the reference
        data, scale = call(fmt, x)
        g = jnp.float32(1) if fmt.has_global_scale else None  # the call above passes 1.0
        ref = formats.quantize(x, fmt, global_scale=g, scale_rounding="up", backend="reference")  # attribute 0
        np.testing.assert_array_equal(np.asarray(data).view(np.uint8), np.asarray(ref.data).view(np.uint8))
        np.testing.assert_array_equal(np.asarray(scale).view(np.uint8), np.asarray(ref.scale).view(np.uint8))
    print("OK")
    """)
    assert "OK" in out


def test_quantize_refuses_bad_attributes():
    out = _run(_QUANTIZE + """
    x = jnp.ones((4, 64), jnp.float32)
    refused("unknown format 99", formats.MXFP8_E4M3, x, format=np.int32(99))
    refused("unknown format -1", formats.MXFP8_E4M3, x, format=np.int32(-1))
    refused("axis 0 must be negative", formats.MXFP8_E4M3, x, axis=np.int64(0))
    refused("axis -3 must be negative", formats.MXFP8_E4M3, x, axis=np.int64(-3))
    refused("scale_rounding 7", formats.MXFP8_E4M3, x, scale_rounding=np.int32(7))
    refused("scale_rounding 1", formats.NVFP4, x, scale_rounding=np.int32(1))
    refused("scale_rounding 2", formats.MXFP8_E4M3, x, scale_rounding=np.int32(2))  # nearest: NVFP4 only
    refused("scale_rounding 2", formats.FP8_1x128, x, scale_rounding=np.int32(2))
    # an attribute naming another format than the buffers: its dtype / block count is refused
    refused("element buffer has dtype float8_e4m3fn, expected float4_e2m1fn", formats.MXFP8_E4M3, x,
            format=np.int32(formats.NVFP4.code))
    refused("scale buffer has dtype float8_e8m0fnu, expected float32", formats.MXFP8_E4M3, x,
            format=np.int32(formats.FP8_1x128.code))
    print("OK")
    """)
    assert "OK" in out


def test_all_reduce_handler_refuses_bad_attributes():
    """Called directly (group of one device): rank indexes the group's flag arrays, the workspace
    is allocated from the attribute, and the timeout bounds every wait."""
    out = _run("""
    import numpy as np, jax, jax.numpy as jnp
    from jax_gpuext.common import extension as _ext
    _ext.ensure_all_registered()
    x = jnp.arange(10, dtype=jnp.float32)

    def call(rank=0, **override):
        attrs = dict(op=np.int32(0), algorithm=np.int32(1), group_size=np.int64(1), site=np.int64(987654),
                     workspace_bytes=np.int64(1 << 12), timeout_s=np.float32(5))
        attrs.update(override)
        f = jax.ffi.ffi_call("gpuext_all_reduce", jax.ShapeDtypeStruct(x.shape, x.dtype))
        return jax.block_until_ready(f(x, jnp.int32(rank), jnp.int32(0), **attrs))

    def refused(match, **kw):
        try:
            call(**kw)
        except Exception as e:
            assert match in str(e), (match, str(e))
            return
        raise AssertionError(f"{kw} was accepted")

    np.testing.assert_array_equal(np.asarray(call()), np.asarray(x))  # a group of one: identity
    refused("rank 5 is outside the group of 1", rank=5)
    refused("rank -1 is outside the group of 1", rank=-1)
    refused("workspace_bytes 1099511627776", workspace_bytes=np.int64(1 << 40))
    refused("workspace_bytes -8", workspace_bytes=np.int64(-8))
    refused("timeout_s must be in", timeout_s=np.float32(np.inf))
    refused("timeout_s must be in", timeout_s=np.float32(np.nan))
    refused("op must be 0..5, got 9", op=np.int32(9))
    refused("algorithm 1 (one_shot) or 2 (two_shot), got 3", algorithm=np.int32(3))
    refused("group_size must be in [1, 4096], got 0", group_size=np.int64(0))
    print("OK")
    """)
    assert "OK" in out


# --------------------------------------------------------------------------- issue 26
def test_place_refuses_element_types_without_a_known_layout():
    """Finding 5: place(x, COLLECTIVE / TEMP) and a direct gpuext_place call returned uninitialised
    memory for float6_e2m3fn / float6_e3m2fn (jaxlib 0.12 passes them as codes our headers do not
    know, and the byte width the handler computed was garbage). Python refuses them at trace time on
    every backend; the handler refuses them as well (older jaxlibs refuse them before it)."""
    out = _run("""
    import ml_dtypes, numpy as np, jax, jax.numpy as jnp
    import jax_gpuext
    from jax_gpuext import MemorySpace
    from jax_gpuext.common import extension as _ext
    _ext.ensure_all_registered()
    for name in ("float6_e2m3fn", "float6_e3m2fn"):
        if not hasattr(ml_dtypes, name):
            continue
        x = np.arange(16, dtype=np.float32).astype(getattr(ml_dtypes, name))
        try:
            jax.make_jaxpr(lambda v: v)(x)  # tracing only (XLA < 0.12 cannot compile float6 at all)
        except TypeError:  # jax 0.7 takes no float6 argument at all: nothing reaches place or a handler
            continue
        for space in (MemorySpace.COLLECTIVE, MemorySpace.TEMP):
            for backend in ("auto", "identity", "xla"):
                try:
                    jax.jit(lambda v: jax_gpuext.place(v, space, backend=backend))(x)
                except TypeError as e:
                    assert f"dtype {name} cannot be placed in {space.name} memory" in str(e), str(e)
                else:
                    raise AssertionError(f"place accepted {name} on {backend}")
        # the handler itself, called directly: an error, never bytes it did not copy
        f = jax.jit(lambda v: jax.ffi.ffi_call("gpuext_place", jax.ShapeDtypeStruct(v.shape, v.dtype))(v))
        try:
            y = np.asarray(f(x))
        except Exception as e:
            msg = str(e)
            assert ("whose size in an XLA buffer our handlers do not know" in msg  # our handler
                    or "Invalid XLA PrimitiveType" in msg), msg                  # an XLA that predates float6
        else:
            raise AssertionError(f"gpuext_place returned {y.view(np.uint8)} for {x.view(np.uint8)}")
    print("OK")
    """)
    assert "OK" in out


def test_scale_and_global_scale_shapes_are_checked_dim_by_dim():
    """Finding 11: only the scale's element count was checked, so a permuted scale shape (as many
    entries, blocks in another order) was accepted by gpuext_quantize and gpuext_dequantize."""
    out = _run(_QUANTIZE + """
    def dequantize_call(fmt, data, scale, g, out_shape):
        attrs = dict(format=np.int32(fmt.code), axis=np.int64(-1), fp4_packed=np.int32(1))
        return jax.ffi.ffi_call("gpuext_dequantize", jax.ShapeDtypeStruct(out_shape, jnp.float32))(
            data, scale, g, **attrs)

    def refused_call(match, fn, *args):
        try:
            jax.block_until_ready(fn(*args))
        except Exception as e:
            assert match in str(e), (match, str(e))
            return
        raise AssertionError(f"accepted: {match}")

    x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)), jnp.float32)
    fmt = formats.MXFP8_E4M3  # scale (64, 2): (2, 64) has the same 128 entries
    out = (jax.ShapeDtypeStruct(x.shape, fmt.elem_dtype), jax.ShapeDtypeStruct((2, 64), fmt.scale_dtype))
    q = lambda: jax.ffi.ffi_call("gpuext_quantize", out)(x, jnp.ones((), jnp.float32), format=np.int32(fmt.code),
                                                       axis=np.int64(-1), scale_rounding=np.int32(0),
                                                       fp4_packed=np.int32(1))
    refused_call("scale buffer has shape [2, 64], expected [64, 2]", q)
    ref = formats.quantize(x, fmt, backend="reference")
    refused_call("scale buffer has shape [2, 64], expected [64, 2]", dequantize_call, fmt, ref.data,
                 ref.scale.reshape(2, 64), jnp.ones((), jnp.float32), x.shape)
    refused_call("scale buffer has shape [128], expected [64, 2]", dequantize_call, fmt, ref.data,
                 ref.scale.reshape(128), jnp.ones((), jnp.float32), x.shape)
    # 128x128 tiles: (1, 1) for (64, 64) data; a 3-D batch of 2 needs (2, 1, 1), not (1, 2, 1)
    fmt2 = formats.FP8_128x128
    x3 = jnp.ones((2, 64, 64), jnp.float32)
    q3 = formats.quantize(x3, fmt2, backend="reference")
    refused_call("scale buffer has shape [1, 2, 1], expected [2, 1, 1]", dequantize_call, fmt2, q3.data,
                 q3.scale.reshape(1, 2, 1), jnp.ones((), jnp.float32), x3.shape)
    # NVFP4's global scale: a scalar or the leading dims of the data, never a permutation of them
    nv = formats.NVFP4
    d = formats.quantize(jnp.ones((2, 3, 32), jnp.float32), nv, backend="reference")
    good = np.asarray(dequantize_call(nv, d.data, d.scale, jnp.ones((2,), jnp.float32), (2, 3, 32)))
    np.testing.assert_array_equal(good, np.asarray(formats.dequantize(
        formats.BlockScaledArray(d.data, d.scale, np.float32(1), nv, -1), backend="reference")))
    refused_call("global scale has shape [3]", dequantize_call, nv, d.data, d.scale, jnp.ones((3,), jnp.float32),
                 (2, 3, 32))
    refused_call("global scale has shape [2, 3, 1]", dequantize_call, nv, d.data, d.scale,
                 jnp.ones((2, 3, 1), jnp.float32), (2, 3, 32))
    print("OK")
    """)
    assert "OK" in out


def test_all_reduce_handler_timeout_bounds():
    """The handlers accept the range all_reduce accepts at trace time: [1e-3, 1e6] seconds
    (1e-46 passed the old trace-time check and reached the handler as 0)."""
    out = _run("""
    import numpy as np, jax, jax.numpy as jnp
    from jax_gpuext.common import extension as _ext
    _ext.ensure_all_registered()
    x = jnp.arange(4, dtype=jnp.float32)
    def call(t):
        attrs = dict(op=np.int32(0), algorithm=np.int32(1), group_size=np.int64(1), site=np.int64(987655),
                     workspace_bytes=np.int64(1 << 12), timeout_s=np.float32(t))
        f = jax.ffi.ffi_call("gpuext_all_reduce", jax.ShapeDtypeStruct(x.shape, x.dtype))
        return jax.block_until_ready(f(x, jnp.int32(0), jnp.int32(0), **attrs))
    for t in (1e-3, 1e6):
        np.testing.assert_array_equal(np.asarray(call(t)), np.asarray(x))
    for t in (1e-46, 1e-4, 2e6, 0.0):
        try:
            call(t)
        except Exception as e:
            assert "timeout_s must be in [0.001000, 1000000.000000] seconds" in str(e), str(e)
        else:
            raise AssertionError(f"timeout {t} accepted")
    print("OK")
    """)
    assert "OK" in out
