"""The float4_e2m1fn layout probe (jax_gpuext.formats.fp4_layout, issue 14 item 7): measured on the
device, never assumed; what it finds reaches FP4_PACKED, the formats backends, explain and info."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gpuext as gx
from jax_gpuext import formats
from jax_gpuext.formats import fp4_layout
from jax_gpuext.common.capabilities import capabilities, format_table

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


@pytest.fixture(autouse=True)
def fresh_probe():
    fp4_layout.forget()
    yield
    fp4_layout.forget()


def packed_read(codes: np.ndarray, layout: str) -> np.ndarray:
    """Independently: the bytes `layout` stores for `codes`, then read two per byte, low nibble first."""
    if layout == fp4_layout.LOW_FIRST:
        stored = codes[0::2] | codes[1::2] << 4
    elif layout == fp4_layout.HIGH_FIRST:
        stored = codes[0::2] << 4 | codes[1::2]
    else:  # one per byte: only the first half of the bytes is read
        stored = codes[: codes.size // 2]
    nibbles = np.stack([stored & 0xF, stored >> 4], -1).ravel()
    return E2M1[nibbles]


@pytest.mark.parametrize("layout", [fp4_layout.LOW_FIRST, fp4_layout.HIGH_FIRST, fp4_layout.ONE_PER_BYTE])
def test_classify_tells_every_layout_apart(layout):
    codes = np.arange(64) * 5 % 16
    written = E2M1[codes]
    assert fp4_layout.classify(packed_read(codes, layout), written) == layout
    garbled = packed_read(codes, layout).copy()
    garbled[3] = 6.0 if garbled[3] != 6.0 else 4.0
    assert fp4_layout.classify(garbled, written) == fp4_layout.UNKNOWN
    negz = packed_read(codes, layout).copy()  # -0.0 vs 0.0 counts: compared as bits
    negz[negz == 0] = -0.0
    assert fp4_layout.classify(negz, written) == fp4_layout.UNKNOWN


def test_probe_measures_xla_cpu_and_feeds_fp4_packed(caplog):
    with caplog.at_level(logging.INFO, logger="jax_gpuext"):
        layout = fp4_layout.probe("cpu")
    assert layout.layout == fp4_layout.LOW_FIRST, layout.describe()  # XLA:CPU packs 2i low (design.md)
    assert "probed on" in layout.how and "bytes as read" in layout.how
    assert layout.describe() in caplog.text
    assert formats.FP4_PACKED["cpu"] is True
    assert fp4_layout.probe("cpu") is layout  # once per process


def test_probe_runs_inside_a_trace():
    """The first NVFP4 quantize of a process may be inside jit: the probe still runs, eagerly."""
    x = jax.random.normal(jax.random.key(0), (4, 64))
    q = jax.jit(lambda v: gx.quantize(v, gx.NVFP4, backend="cpu"))(x)
    assert fp4_layout.probe("cpu").layout == fp4_layout.LOW_FIRST
    ref = gx.quantize(x, gx.NVFP4, backend="reference")
    np.testing.assert_array_equal(np.asarray(q.data.astype(jnp.float32)), np.asarray(ref.data.astype(jnp.float32)))


def test_unreadable_layout_is_refused_with_the_reason(monkeypatch):
    bad = fp4_layout.Layout("cpu", fp4_layout.HIGH_FIRST, "probed on TFRT_CPU_0; bytes as read 12 34")
    monkeypatch.setitem(fp4_layout._PROBED, "cpu", bad)
    x = jnp.ones((4, 64))
    with pytest.raises(gx.UnsupportedError, match="high nibble first"):
        gx.quantize(x, gx.NVFP4, backend="cpu")
    with pytest.raises(gx.UnsupportedError, match="high nibble first"):
        formats.FP4_PACKED["cpu"]
    e = gx.explain(lambda v: gx.quantize(v, gx.NVFP4), x, platform="cpu")
    call = e.calls[0]
    # the next backend: xla, which writes float4 arrays through XLA itself, whatever their layout
    assert call.chosen == "xla" and call.fallback
    assert any("high nibble first" in why for name, why in call.rejected if name == "cpu")
    # formats without float4 elements do not depend on it
    assert gx.explain(lambda v: gx.quantize(v, gx.MXFP8_E4M3), x, platform="cpu").calls[0].chosen == "cpu"


def test_layout_appears_in_explain_and_info():
    x = jnp.ones((4, 64))
    e = gx.explain(lambda v: gx.quantize(v, gx.NVFP4).dequantize(), x, platform="cpu")
    assert [c.chosen for c in e.calls] == ["cpu", "cpu"]
    assert all(any("float4_e2m1fn buffers on cpu: packed, low nibble first" in n for n in c.notes) for c in e.calls)
    report = capabilities()
    assert report["fp4_layout"]["cpu"]["layout"] == fp4_layout.LOW_FIRST
    assert report["fp4_layout"]["cpu"]["fp4_packed"] is True
    assert "float4 layout cpu" in format_table(report)


def test_a_hand_set_layout_is_said_so():
    try:
        formats.FP4_PACKED["cpu"] = False
        assert formats.FP4_PACKED["cpu"] is False
        assert "set by hand" in formats.FP4_PACKED.layout("cpu").how
    finally:
        del formats.FP4_PACKED["cpu"]
    assert formats.FP4_PACKED["cpu"] is True
    with pytest.raises(TypeError, match=r"FP4_PACKED\['cpu'\] must be a bool"):
        formats.FP4_PACKED["cpu"] = "no"  # truthy: must not quietly mean packed
    assert "set by hand" not in formats.FP4_PACKED.layout("cpu").how
