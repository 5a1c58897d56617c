#include "csrc/memory/place_cuda.h"

#include "csrc/common/cuda_check.h"

namespace gpuext {

Status PlaceCopyDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (dst == src || bytes == 0) return Status::Ok();
  // cudaMemcpyDefault: the source may be collective (ncclMemAlloc / cuMem VMM) memory,
  // which is ordinary device memory to the copy engine; Default lets the driver infer it.
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  return Status::Ok();
}

}  // namespace gpuext
