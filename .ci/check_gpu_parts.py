"""CI: every GPU part was built into the installed jax_gpuext (run with the venv's python -P).

Used after the README install where nvcc exists (.ci/run) and on the wheel installed without nvcc
(.ci/wheel.sh): _cuda with the cuBLASLt and cuDNN dots, _nvshmem, and a build record that agrees.
"""
import glob
import os

import jax_gpuext
from jax_gpuext.common import extension as _ext
from jax_gpuext.common import gates

assert "site-packages" in jax_gpuext.__file__, f"not the installed package: {jax_gpuext.__file__}"
for gate, what in (("cuda_extension", "the CUDA extension"), ("cublaslt_dot_built", "the cuBLASLt block-scaled dot"),
                   ("cudnn_dot_built", "the cuDNN block-scaled dot")):
    r = gates.check(gate)
    assert r.supported, f"{what} was not built ({gate}): {r.reason}"
    print(f"{gate}: {r.reason}")
assert glob.glob(os.path.join(os.path.dirname(jax_gpuext.__file__), "_nvshmem*.so")), "_nvshmem was not built"
parts = _ext.build_parts()
missing = [p for p in ("cuda_extension", "cublaslt_dot", "cudnn_dot", "nvshmem_allreduce")
           if not parts.get(p, {}).get("built")]
assert not missing, f"build_parts.json says not built: {missing} ({parts})"
# the NVSHMEM _nvshmem was built against (checked against the host library before the import) and
# the commit the build came from (a GPU run's results name it): issue 25
assert parts["nvshmem_allreduce"].get("version"), parts["nvshmem_allreduce"]
assert len(_ext.build_source().get("commit", "")) == 40, _ext.build_source()
print("every GPU part built: _cuda with the cuBLASLt and cuDNN dots, _nvshmem")
