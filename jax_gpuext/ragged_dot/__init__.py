"""Grouped (ragged) block-scaled dot for mixture-of-experts layers (issue 30).

The op, its reference and XLA backends live in ``ragged_dot.py``; ``cublaslt.py`` is the CUDA
backend (cuBLASLt's grouped GEMM with the group sizes on the device); ``common.py`` holds what
the op and its backends share (``RaggedProblem``).
"""
