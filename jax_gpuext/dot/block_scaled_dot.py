"""The op ``block_scaled_dot``: a dot of two ``BlockScaledArray`` operands, and its backend table.

Math (the ``reference`` backend is its definition; every other backend is tested against it):

    out[..., m, n] = cast(gs_l * gs_r * sum_k lhs[m, k] * s_l[m, k // b] * rhs[n, k] * s_r[n, k // b])

accumulated in float32, with the 2-D block index (m // 128, k // 128) for FP8_128x128 operands.

Backends of op ``block_scaled_dot``, in preference order (``jax_gpuext.explain`` shows which ran):

- ``cudnn``: Blackwell MXFP8 / NVFP4 through a cuDNN graph (``dot/cudnn.py``).
- ``cublaslt``: Hopper FP8 1x128 x 128x128 (and 1x128 x 1x128), per-tensor FP8 (FP8_TENSOR) on
  any FP8 GPU, and Blackwell MXFP8 / NVFP4 (``dot/cublaslt.py``).
- ``hopper_mx``: our own sm_90a kernel, MXFP8 / MXFP4 (any pairing) and NVFP4 on Hopper's FP8 tensor cores
  (``dot/hopper_mx.py``, ``csrc/hopper_mx/``).
- ``xla``: XLA only, no custom call (``dot/xla.py``): MX / NVFP4 dequantized to bf16 + an XLA dot
  accumulating in f32, FP8_TENSOR through XLA's FP8 dot. What ``auto`` runs on a GPU where none of
  the above is verified (``common/verified.py``); on CPU it is passed over for the exact reference.
- ``reference``: dequantize + ``lax.dot_general`` in float32; every platform (``dot/reference.py``).

The op owns its table: it imports the backend modules and registers them here, in that order;
the backends import ``dot.common`` (the problem, canonical form, codes), never this module.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jax_gpuext.common import backends, eager, export
from jax_gpuext.dot import cublaslt, cudnn, hopper_mx, reference, xla
from jax_gpuext.dot.common import OP, _check_out_dtype, _problem


# --------------------------------------------------------------------------- backends
_IMPLS: dict[str, Any] = {}


def register_impl(name: str, backend: backends.Backend, impl) -> None:
    """Registers a backend of ``block_scaled_dot`` and the function that runs it.

    ``impl(lhs, rhs, problem, selection)`` returns the result in dot_general layout.
    """
    backends.register(OP, backend)
    _IMPLS[name] = impl


def _register_backends() -> None:
    # auto's preference order: cuDNN and cuBLASLt, our sm_90a MXFP8/NVFP4 kernel (issue 5), XLA's
    # own path (issue 16: what auto runs where none of ours is verified), the reference last.
    for module in (cudnn, cublaslt, hopper_mx, xla, reference):
        register_impl(module.BACKEND.name, module.BACKEND, module.impl)


_register_backends()


def _run(statics, sel, lhs, rhs):
    p, chosen = statics
    return _IMPLS[chosen](lhs, rhs, p, sel)


# Eager calls compile once per problem (common/eager.py; issue 34, finding 4: the xla backend's
# run-time lax.cond compiled again on every eager call).
_cached = eager.Cached(_run)


# --------------------------------------------------------------------------- public: block_scaled_dot
def block_scaled_dot(lhs, rhs, dimension_numbers=None, *, preferred_element_type=jnp.float32,
                     backend: str = "auto") -> jax.Array:
    """Dot of two ``BlockScaledArray`` operands; a float32 result by default, as ``jax.nn.scaled_matmul``.

    ``dimension_numbers`` is ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))`` as for
    ``jax.lax.dot_general``: batch dims anywhere, several contracting dims, provided the two
    quantized axes are contracted with each other (for FP8_128x128: exactly one of its last two
    axes, every axis before them batch or contracting; FP8_TENSOR: any). The contracting dims
    flatten into one K with the quantized pair innermost (docs/block_scaled_dot.md, "Several
    contracting dimensions"). ``None`` contracts ``lhs.axis`` with ``rhs.axis`` without batch
    dimensions. Accumulation is float32; global scales (NVFP4) multiply the accumulator; the result
    is cast to ``preferred_element_type`` (float32, as ``jax.nn.scaled_matmul``; or bfloat16 / float16).
    """
    out_dtype = _check_out_dtype(preferred_element_type, "block_scaled_dot")
    p = _problem(lhs, rhs, dimension_numbers, out_dtype)
    sel = backends.select(OP, backend, problem=p)

    def on(sel):
        out = _cached((p, sel.chosen), sel, lhs, rhs)
        return export.mark_choice(out, sel, p)

    # traced: each platform's own trace (its choice; the implementations read the platform too),
    # lowering for a platform keeps its own (common/export.py)
    return export.per_platform(sel, p, on, (lhs, rhs), specializes=True)
