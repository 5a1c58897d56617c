"""Backend ``reference`` of ``block_scaled_dot``: dequantize to float32, then ``lax.dot_general``
(the semantic definition, on every platform; every other backend is tested against it).

The math itself is ``dot.common._reference``, shared with the ``xla`` backend (which runs it for FP8
blockwise); this module is the backend's entry in the op's table.
"""

from __future__ import annotations

from jax_gpuext.common import backends
from jax_gpuext.dot import common as _dot

BACKEND = backends.Backend(
    "reference", ("cpu", "cuda"), (), "dequantize to float32, then lax.dot_general (the semantic definition)",
    takes="every format pair of one family (MX: MXFP8 E4M3/E5M2 and MXFP4 in any pairing), any shape")


def impl(lhs, rhs, p: _dot.DotProblem, sel) -> object:
    del sel  # nothing to note: the reference always runs as asked
    return _dot._reference(lhs, rhs, p)
