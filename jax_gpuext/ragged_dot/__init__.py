"""Grouped (ragged) block-scaled dot for mixture-of-experts layers (issue 30).

- ``ragged_dot`` (module ``ragged_dot.ragged_dot``): the op on quantized operands, with
  ``jax.lax.ragged_dot_general``'s meaning, and its backend table.
- ``scaled_ragged_dot`` (module ``ragged_dot.scaled_ragged_dot``): the differentiable drop-in for
  ``jax.lax.ragged_dot`` that quantizes inside (forward, dgrad and wgrad all grouped dots).
- ``quantize_grouped`` / ``dequantize_grouped`` (module ``ragged_dot.grouped``): quantization along
  a ragged axis with blocks restarting at each group, giving a ``GroupedBlockScaledArray``.
- ``ragged_dot_masked`` (module ``ragged_dot.masked``): the masked layout for decoding (experts x
  capacity, valid counts on the device), its own op with hopper / xla / reference backends.
- ``common``: what the op and its backends share (``RaggedProblem``, validation, the device-side
  group arithmetic, ``RAGGED_M`` / ``RAGGED_M_NK`` / ``RAGGED_CONTRACT`` dimension numbers).
- Backends: ``reference`` (the definition), ``xla`` (128-row tiles as batched XLA dots), and on CUDA
  ``cublaslt`` (cuBLASLt's grouped GEMM) and ``hopper`` (our sm_90a kernel), both reading the
  group sizes on the device, with what they share in ``fp8_cuda.py``.

May import: ``jax_gpuext.common``, ``formats`` and ``dot`` (the dense dot's format facts and
training recipe, its xla backend's bf16 exactness bounds, the dense cuBLASLt backend's scale
layouts, which are one group's, and hopper_mx's build check). Within the package the op owns its
table: ``ragged_dot.py`` imports the backends; a backend imports ``common`` (and ``fp8_cuda``),
never an op module.

Names: ``jax_gpuext.ragged_dot`` (the package's parent attribute) is the function, as
``jax_gpuext.dot.block_scaled_dot`` is; import the modules with ``from jax_gpuext.ragged_dot
import common`` (which the import system resolves through ``sys.modules``), not by attribute.
"""

from jax_gpuext.ragged_dot.common import (
    OP,
    RAGGED_CONTRACT,
    RAGGED_M,
    RAGGED_M_NK,
    GroupedBlockScaledArray,
    RaggedProblem,
    grouped_block_count,
)
from jax_gpuext.ragged_dot.grouped import dequantize_grouped, quantize_grouped
from jax_gpuext.ragged_dot.masked import ragged_dot_masked
from jax_gpuext.ragged_dot.ragged_dot import ragged_dot, register_impl
from jax_gpuext.ragged_dot.scaled_ragged_dot import scaled_ragged_dot

__all__ = [
    "OP",
    "RAGGED_CONTRACT",
    "RAGGED_M",
    "RAGGED_M_NK",
    "GroupedBlockScaledArray",
    "RaggedProblem",
    "dequantize_grouped",
    "grouped_block_count",
    "quantize_grouped",
    "ragged_dot",
    "ragged_dot_masked",
    "register_impl",
    "scaled_ragged_dot",
]
