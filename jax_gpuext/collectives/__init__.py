"""Collectives: ``all_reduce`` across devices (``all_reduce``: NVSHMEM one-shot / two-shot kernels,
NVSHMEM's own reduction, XLA's, and the CPU protocol) and the NVSHMEM bootstrap over
``jax.distributed`` (``distributed``, public as ``jax_gpuext.distributed``).

May import: ``jax_gpuext.common``, ``jax_gpuext.memory`` (memory spaces of the custom call) and,
for the tensor-parallel demo only, ``jax_gpuext.dot`` / ``jax_gpuext.formats``.

This package re-exports every public name of the old ``jax_gpuext/collectives.py``. Note that
``jax_gpuext.collectives.all_reduce`` is the function (as before); import names from the module
(``from jax_gpuext.collectives.all_reduce import GRAPH_SAFE_ENV``).
"""

from jax_gpuext.collectives import distributed
from jax_gpuext.collectives.all_reduce import (
    ALGORITHM_CODES,
    ALGORITHMS,
    DEFAULT_CPU_WORKSPACE_BYTES,
    DEFAULT_TIMEOUT_S,
    GRAPH_SAFE_ENV,
    GRAPH_TARGET,
    ONE_SHOT_MAX_ENV,
    OP,
    OPS,
    SUPPORTED_DTYPES,
    TARGET,
    TIMEOUT_ENV,
    WORKSPACE_ENV,
    Problem,
    all_reduce,
    command_buffer_ordering,
    demo_steps,
    logger,
    one_shot_max_bytes,
    shard_mlp_params,
    tensor_parallel_mlp,
)
from jax_gpuext.common.errors import UnsupportedError
