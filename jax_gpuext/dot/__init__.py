"""Block-scaled dot: the op ``block_scaled_dot`` on quantized operands with its backend table
(``block_scaled_dot``), ``scaled_dot_general``, a differentiable drop-in for ``jax.lax.dot_general``
that quantizes inside (``scaled_dot_general``), what the op and its backends share (``common``:
the validated problem, canonical form, reference math, handler codes) and one module per backend:
``reference``, ``xla``, ``cublaslt``, ``cudnn``, ``hopper_mx``.

May import: ``jax_gpuext.common`` and ``jax_gpuext.formats``. Within the package the op owns its
table: ``block_scaled_dot`` imports the backends; a backend imports ``dot.common`` only, never an op
module (tests/common/test_layout.py checks it).

This package re-exports every public name of the old ``jax_gpuext/dot.py``. Note that
``jax_gpuext.dot.block_scaled_dot`` and ``jax_gpuext.dot.scaled_dot_general`` are the functions (as
before); import names from the modules (``from jax_gpuext.dot.block_scaled_dot import ...``).
"""

from jax_gpuext.dot.common import (
    OP,
    OUT_CODES,
    DotProblem,
    FormatInfo,
    element_code,
    fold_scale_signs,
    format_info,
    from_canonical,
    global_alpha,
    mx_fp4_operand,
    pack_fp4,
    per_batch,
    to_canonical,
)
from jax_gpuext.dot.block_scaled_dot import block_scaled_dot, register_impl
from jax_gpuext.dot.scaled_dot_general import demo_steps, recipe, scaled_dot_general
