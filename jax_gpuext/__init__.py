"""jax-gpuext: block-scaled low-precision matmuls, NVSHMEM all-reduce and memory-space
placement for JAX, as XLA FFI custom calls with a CPU path for every op.

Importing this package never fails because a GPU, a GPU library or the CUDA extension is
missing: those are reported by :func:`capabilities` and the gates in :mod:`jax_gpuext.common.gates`.
It registers every FFI target with XLA, so exported programs that use our ops run after it
(:func:`export_disabled_checks` gives ``jax.export`` the checks to disable).

One subpackage per capability (``formats``, ``dot``, ``ragged_dot``, ``collectives``, ``memory``,
``checkpoints``)
and ``common`` for the plumbing they share (docs/design.md, "Where things are"). This module is
the composition root: it imports every capability, so each op's backends and each capability's
report section are registered before any submodule can be used. Modules are imported by their
real paths (``jax_gpuext.dot.xla``, ``jax_gpuext.common.extension``); the flat names of the layout
before issue 29 are gone (issue 34).
"""

from jax_gpuext.collectives import all_reduce, distributed
from jax_gpuext.common import gates
from jax_gpuext.common.backends import Backend, Selection
from jax_gpuext.common.capabilities import capabilities
from jax_gpuext.common.errors import UnsupportedError
from jax_gpuext.common import extension as _extension
from jax_gpuext.common.explain import Explanation, explain
from jax_gpuext.common.export import export_disabled_checks
from jax_gpuext.dot import block_scaled_dot, scaled_dot_general
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
    quantize_both_axes,
    to_blackwell_scale_layout,
)
from jax_gpuext.memory import MemorySpace, place
from jax_gpuext.ragged_dot import (RAGGED_CONTRACT, RAGGED_M, RAGGED_M_NK, GroupedBlockScaledArray, dequantize_grouped,
                                  quantize_grouped, ragged_dot, ragged_dot_masked, scaled_ragged_dot)

# `jax_gpuext.ragged_dot` is the op, as `jax.lax.ragged_dot` is, and so hides the subpackage of the
# same name from attribute access; the subpackage's public names (`RAGGED_M`, `quantize_grouped`,
# ...) stay reachable through it, as `jax_gpuext.ragged_dot.RAGGED_M` is written in docs and errors.
import sys as _sys  # noqa: E402

for _name in _sys.modules["jax_gpuext.ragged_dot"].__all__:  # the subpackage (the attribute is the op)
    if _name != "ragged_dot":
        setattr(ragged_dot, _name, getattr(_sys.modules["jax_gpuext.ragged_dot"], _name))
# and its submodules: `import jax_gpuext.ragged_dot.grouped as g` looks them up as attributes
for _name in [m for m in _sys.modules if m.startswith("jax_gpuext.ragged_dot.") and m.count(".") == 2]:
    setattr(ragged_dot, _name.rsplit(".", 1)[1], _sys.modules[_name])
del _name, _sys

__version__ = "0.1.0"

__all__ = [
    "all_reduce",
    "Backend",
    "block_scaled_dot",
    "BlockFormat",
    "BlockScaledArray",
    "capabilities",
    "dequantize",
    "dequantize_grouped",
    "distributed",
    "explain",
    "Explanation",
    "export_disabled_checks",
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
    "quantize_both_axes",
    "quantize_grouped",
    "ragged_dot",
    "ragged_dot_masked",
    "RAGGED_CONTRACT",
    "RAGGED_M",
    "RAGGED_M_NK",
    "scaled_dot_general",
    "scaled_ragged_dot",
    "Selection",
    "to_blackwell_scale_layout",
    "UnsupportedError",
]


# Every FFI target of _cpu and _cuda, registered now (not at the first trace): a program exported
# with our ops and deserialized in a fresh process finds its handlers after this import alone.
# Never raises (a refused target turns its extension's gate off); initializes no jax backend.
_extension.ensure_all_registered()
