"""Published checkpoints' block-scaled weights (gpt-oss MXFP4, DeepSeek-V3 FP8, ModelOpt NVFP4) to
``BlockScaledArray`` and back, bit for bit, and the safetensors / .npz containers (``layouts``).

May import: ``jax_gpuext.common`` and ``jax_gpuext.formats``.

This package re-exports every public name of the old ``jax_gpuext/checkpoints.py``.
"""

from jax_gpuext.checkpoints.layouts import (
    DEEPSEEK_TILE,
    MXFP4_BYTES_PER_BLOCK,
    NVFP4_BLOCK,
    SAFETENSORS_DTYPES,
    CheckpointLayoutError,
    from_deepseek_fp8,
    from_gpt_oss_mxfp4,
    from_modelopt_nvfp4,
    load_deepseek_fp8,
    load_gpt_oss_mxfp4,
    load_modelopt_nvfp4,
    read_safetensors,
    read_tensors,
    to_deepseek_fp8,
    to_gpt_oss_mxfp4,
    to_modelopt_nvfp4,
    write_safetensors,
)
