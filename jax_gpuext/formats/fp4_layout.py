"""How XLA lays out float4_e2m1fn buffers on a platform: asked of XLA once per process, never assumed.

An FFI handler sees a float4 buffer as bytes and cannot tell the layout (its ``size_bytes()`` is
one byte per element in the FFI headers we build against). XLA:CPU (jaxlib 0.10.2) packs two per
byte, element 2i in the low nibble, and current XLA does the same on GPU (its lower_tensors test
packs [1, 2, 3] as bytes [0x21, 0x03]); older XLA forks put element 0 in the HIGH nibble. So the
layout is measured on the device that will run our handlers:

- XLA converts known float32 values to float4_e2m1fn inside a jitted program (its own kernel writes
  the buffer, with the layout it uses for every float4 buffer it hands a custom call);
- our ``gpuext_dequantize`` handler reads that buffer as *packed, low nibble first* with unit
  scales. Reading n/2 bytes is in bounds whichever layout XLA uses;
- the values read back match exactly one candidate layout (compared as bits: -0.0 counts).

The result feeds ``jax_gpuext.formats.FP4_PACKED`` (the handlers' ``fp4_packed`` attribute), the
formats backends' ``supports()`` (a layout our handlers cannot read is a rejection with the bytes
as the reason, so ``auto`` moves to the reference visibly), ``explain`` notes and
``python -m jax_gpuext info``. The GPU dot backends do not depend on it: they pack FP4 themselves
from values (``dot.common.pack_fp4``).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger("jax_gpuext")

LOW_FIRST = "packed, low nibble first"
HIGH_FIRST = "packed, high nibble first"
ONE_PER_BYTE = "one per byte"
UNKNOWN = "unknown"
# Nothing of ours can run on the platform here (no device, or no extension for it): a state to
# report, not a problem to warn about.
NOT_APPLICABLE = "not applicable"
# The layouts our handlers read, as their fp4_packed attribute (csrc/formats/block_scaled_io.h).
PACKED_FLAG = {LOW_FIRST: True, ONE_PER_BYTE: False}

# The dequantize handler's contract as the probe calls it: the target and NVFP4's format code
# (csrc/formats/block_scaled_math.h). formats.quantize, which imports this module, names the same
# (DEQUANTIZE_TARGET, NVFP4.code); stated here rather than imported back, which would be an import
# circle (tests/common/test_layout.py checks that the two agree).
DEQUANTIZE_TARGET = "gpuext_dequantize"
NVFP4_CODE = 2
_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
_N = 64  # four NVFP4 blocks; every code appears in both nibble positions
_WRITTEN = _E2M1[np.arange(_N) * 5 % 16]


@dataclasses.dataclass(frozen=True)
class Layout:
    platform: str
    layout: str  # one of the names above
    how: str  # what was read where, or why nothing was

    @property
    def packed(self) -> bool | None:
        """The handlers' fp4_packed attribute, or None where they cannot read this layout."""
        return PACKED_FLAG.get(self.layout)

    def describe(self) -> str:
        return f"float4_e2m1fn buffers on {self.platform}: {self.layout} ({self.how})"


def candidates(written: np.ndarray) -> dict[str, np.ndarray]:
    """What a packed, low-nibble-first read of ``written`` returns under each layout XLA could use.
    One per byte: byte i holds element i alone, so element 2i reads code i and 2i+1 the zero
    high nibble."""
    half = written.size // 2
    return {
        LOW_FIRST: written,
        HIGH_FIRST: written.reshape(-1, 2)[:, ::-1].ravel(),
        ONE_PER_BYTE: np.stack([written[:half], np.zeros(half, np.float32)], -1).ravel(),
    }


def classify(read: np.ndarray, written: np.ndarray = _WRITTEN) -> str:
    """The one layout whose packed read of ``written`` gives ``read`` (bit for bit), or UNKNOWN."""
    read = np.asarray(read, np.float32).ravel()
    matches = [name for name, want in candidates(written).items()
               if read.shape == want.shape and (read.view(np.uint32) == want.view(np.uint32)).all()]
    return matches[0] if len(matches) == 1 else UNKNOWN


def _bytes_as_read(read: np.ndarray, count: int = 8) -> str:
    """The first ``count`` bytes the packed read saw, in hex (for reasons and reports)."""
    import ml_dtypes

    codes = np.asarray(read, np.float32).ravel().astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return " ".join(f"{b:02x}" for b in (codes[0:2 * count:2] | codes[1:2 * count:2] << 4))


def _read_packed_low_first(device) -> np.ndarray:
    """XLA writes _WRITTEN as float4 on ``device``; gpuext_dequantize reads it back as packed."""
    from jax_gpuext.common import ffi as _ffi

    def program(x):
        data = x.astype(jnp.float4_e2m1fn).reshape(1, _N)
        one = jnp.full((1, _N // 16), 1.0, jnp.float8_e4m3fn)  # unit block scales: values come back as is
        return _ffi.ffi_call(DEQUANTIZE_TARGET, jax.ShapeDtypeStruct((1, _N), jnp.float32), data, one,
                             jnp.ones((), jnp.float32), vmap_method="broadcast_all",
                             format=np.int32(NVFP4_CODE), axis=np.int64(-1), fp4_packed=np.int32(1))

    # Possibly called while a function is being traced (the first quantize): run it now, eagerly.
    with jax.ensure_compile_time_eval():
        return np.asarray(jax.jit(program)(jax.device_put(_WRITTEN, device)))


_PROBED: dict[str, Layout] = {}


def probe(platform: str) -> Layout:
    """The float4 layout of ``platform`` ("cpu" / "cuda"), measured once per process."""
    if platform not in _PROBED:
        layout = _PROBED[platform] = _measure(platform)
        # A warning only where our handlers would run and cannot read the layout.
        level = logging.DEBUG if layout.layout == NOT_APPLICABLE else (
            logging.INFO if layout.packed is not None else logging.WARNING)
        logger.log(level, "%s", layout.describe())
    return _PROBED[platform]


def _measure(platform: str) -> Layout:
    from jax_gpuext.common import gates

    r = gates.check(f"{platform}_extension")
    if not r.supported:
        return Layout(platform, NOT_APPLICABLE, f"no handler to read with: {r.reason}")
    try:
        device = jax.devices(platform)[0]
    except RuntimeError:  # jax's message names every platform present; the platform is enough
        return Layout(platform, NOT_APPLICABLE, f"no {platform} device")
    try:
        read = _read_packed_low_first(device)
    except Exception as e:  # noqa: BLE001 - an XLA or handler failure is an answer: unknown, with why
        return Layout(platform, UNKNOWN, f"the probe on {device} failed: {type(e).__name__}: {e}")
    import jaxlib

    layout = classify(read)
    return Layout(platform, layout, f"probed on {device}, jaxlib {jaxlib.__version__}; bytes as read "
                                    f"{_bytes_as_read(read)}")


def forget() -> None:
    """Drops the measured layouts (tests)."""
    _PROBED.clear()
