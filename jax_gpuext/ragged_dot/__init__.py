"""Grouped (ragged) block-scaled dot for mixture-of-experts layers (issue 30).

The op, its reference and XLA backends live in ``ragged_dot.py``; the CUDA backends are
``cublaslt.py`` (cuBLASLt's grouped GEMM) and ``hopper.py`` (our sm_90a kernel), both reading the
group sizes on the device, with what they share in ``fp8_cuda.py``; ``common.py`` holds what the
op and every backend share (``RaggedProblem``).

May import: ``jax_gpuext.common``, ``formats`` and ``dot`` (the dense cuBLASLt backend's scale
layouts, which are one group's, and hopper_mx's build check). Backends never import the op.
"""
