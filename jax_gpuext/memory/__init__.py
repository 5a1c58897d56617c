"""Memory spaces: ``place(x, space)`` and ``MemorySpace``, and ``ffi_call`` with per-operand /
per-result memory spaces, the one way our custom calls ask XLA for a memory space (``spaces``).

May import: ``jax_gpuext.common`` only.

This package re-exports every public name of the old ``jax_gpuext/memory.py``.
"""

from jax_gpuext.common.errors import UnsupportedError
from jax_gpuext.memory.spaces import (
    CUSTOM_CALL_SPACES,
    DSF_WORKAROUND_OPTIONS,
    GATE,
    OPERANDS_ATTR,
    PLACE_TARGET,
    RESULTS_ATTR,
    SHIELD_ENV,
    VMAP_METHODS,
    MemorySpace,
    demo_steps,
    ffi_call,
    format_spaces,
    logger,
    place,
)
