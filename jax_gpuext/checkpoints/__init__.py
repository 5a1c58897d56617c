"""Published checkpoints' block-scaled weights (gpt-oss MXFP4, DeepSeek-V3 FP8, ModelOpt NVFP4) to
``BlockScaledArray`` and back, bit for bit (``layouts``), and the files they come in: safetensors,
parsed and validated by the safetensors package, and .npz (``container``).

May import: ``jax_gpuext.common`` and ``jax_gpuext.formats``.

This package re-exports every public name of the old ``jax_gpuext/checkpoints.py``.
"""

from jax_gpuext.checkpoints.container import (
    PACKED_BITS,
    SAFETENSORS_DTYPES,
    CheckpointError,
    read_npz,
    read_safetensors,
    read_safetensors_metadata,
    read_tensors,
    write_safetensors,
)
from jax_gpuext.checkpoints.layouts import (
    DEEPSEEK_TILE,
    MXFP4_BYTES_PER_BLOCK,
    NVFP4_BLOCK,
    CheckpointLayoutError,
    from_deepseek_fp8,
    from_gpt_oss_mxfp4,
    from_modelopt_nvfp4,
    load_deepseek_fp8,
    load_gpt_oss_mxfp4,
    load_modelopt_nvfp4,
    to_deepseek_fp8,
    to_gpt_oss_mxfp4,
    to_modelopt_nvfp4,
)
