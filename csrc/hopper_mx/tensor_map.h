// Tensor maps for TMA, encoded on the host: shared by our sm_90a kernels (hopper_mx and the
// grouped ragged_dot kernel). Host code; include from the .cu files of the 90a object library.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <string>

#include "csrc/common/cuda_check.h"
#include "csrc/common/status.h"

namespace gpuext::hopper_mx {

// cuTensorMapEncodeTiled is a driver API function; we link only the static runtime, so fetch
// it through the runtime's entry-point query (once: the pointer is process-wide).
inline Status TensorMapEncoder(PFN_cuTensorMapEncodeTiled_v12000* out) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  GPUEXT_CUDA_RETURN_IF_ERROR(err);
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    return Status::Error("the CUDA driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver)");
  *out = fn;
  return Status::Ok();
}

// 3-D map over a row-major [d2, d1, d0] array (d0 contiguous) with box [1, box1, box0].
inline Status Encode3d(CUtensorMap* map, CUtensorMapDataType type, int elem_bytes, const void* ptr, int64_t d0,
                       int64_t d1, int64_t d2, int box0, int box1, CUtensorMapSwizzle swizzle) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  GPUEXT_RETURN_IF_ERROR(TensorMapEncoder(&encode));
  const cuuint64_t dims[3] = {cuuint64_t(d0), cuuint64_t(d1), cuuint64_t(d2)};
  const cuuint64_t strides[2] = {cuuint64_t(d0 * elem_bytes), cuuint64_t(d0 * d1 * elem_bytes)};
  const cuuint32_t box[3] = {cuuint32_t(box0), cuuint32_t(box1), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  // OOB_FILL_NONE fills out-of-bounds elements with zeros (NAN_REQUEST_ZERO_FMA would give NaN).
  CUresult r = encode(map, type, 3, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Error("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) +
                         " (dims " + std::to_string(d0) + "x" + std::to_string(d1) + "x" +
                         std::to_string(d2) + ", box " + std::to_string(box0) + "x" +
                         std::to_string(box1) + ")");
  return Status::Ok();
}

}  // namespace gpuext::hopper_mx
