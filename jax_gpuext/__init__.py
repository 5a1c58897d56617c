"""jax-gpuext: block-scaled low-precision matmuls, NVSHMEM all-reduce and memory-space
placement for JAX, as XLA FFI custom calls with a CPU path for every op.

Importing this package never fails because a GPU, a GPU library or the CUDA extension is
missing: those are reported by :func:`capabilities` and the gates in :mod:`jax_gpuext.gates`.
"""

from jax_gpuext import gates
from jax_gpuext.backends import Backend, Selection
from jax_gpuext.capabilities import capabilities
from jax_gpuext.errors import UnsupportedError
from jax_gpuext.explain import Explanation, explain

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "Explanation",
    "Selection",
    "UnsupportedError",
    "capabilities",
    "explain",
    "gates",
]
