"""What the ``ragged_dot`` op and its backends share: the problem a backend is asked about.

Backends import this module, never the op (``ragged_dot.py``), so the op can import them.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jax_gpuext.formats import BlockFormat

OP = "ragged_dot"
MODES = ("ragged_m", "ragged_contract")


@dataclasses.dataclass(frozen=True)
class RaggedProblem:
    """One call of ``ragged_dot``, as backends see it.

    ``ragged_m``: lhs (M, K) rows grouped by ``group_sizes`` (G,), rhs one (K, N) matrix per
    group -> out (M, N). ``ragged_contract``: lhs (K, M) x rhs (M, N), the M axis grouped and
    contracted per group -> out (G, K, N) (the weight gradient). ``rhs_contract`` is the rhs axis
    that is contracted in ``ragged_m``: 1 for (G, K, N) as ``lax.ragged_dot`` takes it, 2 for
    weights stored (G, N, K).
    """

    mode: str
    M: int
    K: int
    N: int
    G: int
    lhs_format: BlockFormat
    rhs_format: BlockFormat
    out_dtype: jnp.dtype
    rhs_contract: int = 1

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "out_dtype", jnp.dtype(self.out_dtype))

    def describe(self) -> str:
        return (f"{self.mode} M={self.M} K={self.K} N={self.N} G={self.G} "
                f"{self.lhs_format.name} x {self.rhs_format.name} -> {self.out_dtype}")
