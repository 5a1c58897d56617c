// CUDA side of the identity copy behind jax_gpuext.place (see place.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "csrc/common/status.h"

namespace gpuext {

// Enqueues one device-to-device copy of `bytes` on `stream`; copies nothing when
// `dst == src` or `bytes == 0`. Never allocates or synchronises, so it may be captured
// into a CUDA graph: the same memcpy node for every call with the same sizes.
Status PlaceCopyDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace gpuext
