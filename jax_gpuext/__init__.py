"""jax-gpuext: block-scaled low-precision matmuls, NVSHMEM all-reduce and memory-space
placement for JAX, as XLA FFI custom calls with a CPU path for every op.

Importing this package never fails because a GPU, a GPU library or the CUDA extension is
missing: those are reported by :func:`capabilities` and the gates in :mod:`jax_gpuext.gates`.
"""

from jax_gpuext import distributed, gates
from jax_gpuext.backends import Backend, Selection
from jax_gpuext.capabilities import capabilities
from jax_gpuext.collectives import all_reduce
from jax_gpuext.dot import block_scaled_dot, scaled_dot_general
from jax_gpuext.errors import UnsupportedError
from jax_gpuext.explain import Explanation, explain
from jax_gpuext.formats import (
    FP8_1x128,
    FP8_128x128,
    FP8_TENSOR,
    MXFP8_E4M3,
    MXFP4,
    MXFP8_E5M2,
    NVFP4,
    BlockFormat,
    BlockScaledArray,
    dequantize,
    from_blackwell_scale_layout,
    quantize,
    to_blackwell_scale_layout,
)
from jax_gpuext.memory import MemorySpace, place
from jax_gpuext.ragged_dot import GroupedBlockScaledArray, quantize_grouped, ragged_dot, scaled_ragged_dot

__version__ = "0.1.0"

__all__ = [
    "all_reduce",
    "Backend",
    "block_scaled_dot",
    "BlockFormat",
    "BlockScaledArray",
    "capabilities",
    "dequantize",
    "distributed",
    "explain",
    "Explanation",
    "FP8_128x128",
    "FP8_TENSOR",
    "FP8_1x128",
    "GroupedBlockScaledArray",
    "from_blackwell_scale_layout",
    "gates",
    "MemorySpace",
    "MXFP8_E4M3",
    "MXFP4",
    "MXFP8_E5M2",
    "NVFP4",
    "place",
    "quantize",
    "quantize_grouped",
    "ragged_dot",
    "scaled_dot_general",
    "scaled_ragged_dot",
    "Selection",
    "to_blackwell_scale_layout",
    "UnsupportedError",
]
