"""Block-scaled formats: the ``quantize`` / ``dequantize`` ops and ``BlockScaledArray`` (``quantize``),
their exact reference (``reference``, the definition the handlers match bit for bit), the ``xla``
backend (``xla``: the same bits as one pass of XLA's own ops), the float4 buffer layout probe
(``fp4_layout``) and exact re-encoding of MXFP4 weights (``reencode``).

May import: ``jax_gpuext.common`` and modules of this package. Never ``dot``, ``collectives``,
``memory`` or ``checkpoints`` (they build on formats). Modules of this package import each other
by module (``from jax_gpuext.formats.quantize import NVFP4``), not through this ``__init__``.

This package re-exports every public name of the old ``jax_gpuext/formats.py``, so
``from jax_gpuext.formats import quantize, NVFP4, FP4_PACKED, ...`` keeps working. Note that
``jax_gpuext.formats.quantize`` is the function (as before); the module is
``sys.modules["jax_gpuext.formats.quantize"]`` or ``from jax_gpuext.formats.quantize import ...``.
"""

from jax_gpuext.common import capabilities as _capabilities
from jax_gpuext.common.errors import UnsupportedError
from jax_gpuext.formats.quantize import (
    DEQUANTIZE_OP,
    DEQUANTIZE_TARGET,
    FORMATS,
    FP4_PACKED,
    FP8_1x128,
    FP8_128x128,
    FP8_TENSOR,
    INPUT_DTYPES,
    MXFP4,
    MXFP8_E4M3,
    MXFP8_E5M2,
    NVFP4,
    QUANTIZE_BOTH_TARGET,
    QUANTIZE_OP,
    QUANTIZE_TARGET,
    SCALE_ROUNDINGS,
    BlockFormat,
    BlockScaledArray,
    _format_from_fields,  # pickles of formats made before the move name jax_gpuext.formats._format_from_fields
    as_array,
    demo_steps,
    default_scale_rounding,
    dequantize,
    float_dtype,
    format_named,
    from_blackwell_scale_layout,
    quantize,
    quantize_both_axes,
    scale_shape,
    to_blackwell_scale_layout,
)


def _fp4_layouts() -> dict:
    """XLA's float4_e2m1fn buffer layout per platform, as measured (``fp4_layout``) or set by hand
    (``FP4_PACKED``): the report's "fp4_layout" section."""
    out = {}
    for platform in ("cpu", "cuda"):
        layout = FP4_PACKED.layout(platform)
        out[platform] = {"layout": layout.layout, "fp4_packed": layout.packed, "how": layout.how}
    return out


_capabilities.register_section("fp4_layout", _fp4_layouts)
