// cuBLASLt, loaded at run time. _cuda must import on machines without cuBLAS (docs/design.md,
// "Build"), so nothing here links against libcublasLt: Python finds the library
// (jax_gpuext._libs.path("cublaslt")) and hands its path over; we dlopen it once per process and
// resolve the few entry points we call into a table. cublasLt.h is used for types and enums only.
//
// Entry points newer than the oldest cuBLASLt we load are optional: resolved where the library
// has them, null otherwise, so an older library still loads for everything else and the caller
// (and the Python gate in front of it) can say which version it would need.
#pragma once

#include <cublasLt.h>

#include <string>

#include "csrc/common/status.h"

namespace gpuext {

struct CublasLtApi {
  decltype(&cublasLtCreate) Create = nullptr;
  decltype(&cublasLtGetVersion) GetVersion = nullptr;
  decltype(&cublasLtMatmul) Matmul = nullptr;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;

  // Optional: the experimental grouped GEMM with device-side shapes (cuBLAS >= 13.2; declared
  // in cublasLt.h 13.2+, so the type is spelled out here: the build may see an older header).
  // csrc/ragged_dot/cublaslt_grouped.cc checks the signature against the header where it has one.
  using GroupedMatrixLayoutCreateFn = cublasStatus_t (*)(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                         int group_count, const void* rows_array,
                                                         const void* cols_array, const void* ld_array);
  GroupedMatrixLayoutCreateFn GroupedMatrixLayoutCreate = nullptr;
};

// Opens `path` (once per process; later calls with another path are an error) and resolves
// the table. The returned pointer lives until the process exits.
Status LoadCublasLt(const std::string& path, const CublasLtApi** api);

// "CUBLAS_STATUS_NOT_SUPPORTED (15)": cublasLtGetStatusString is not in every version.
std::string CublasStatusName(cublasStatus_t s);

// RAII for one matmul's descriptors: every early return releases what was created.
struct CublasLtDescriptors {
  const CublasLtApi* api;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  explicit CublasLtDescriptors(const CublasLtApi* api) : api(api) {}
  CublasLtDescriptors(const CublasLtDescriptors&) = delete;
  CublasLtDescriptors& operator=(const CublasLtDescriptors&) = delete;
  ~CublasLtDescriptors() {
    if (pref) api->MatmulPreferenceDestroy(pref);
    if (d) api->MatrixLayoutDestroy(d);
    if (b) api->MatrixLayoutDestroy(b);
    if (a) api->MatrixLayoutDestroy(a);
    if (op) api->MatmulDescDestroy(op);
  }
};

template <typename T>
cublasStatus_t SetMatmulDesc(const CublasLtApi* api, cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr,
                             const T& value) {
  return api->MatmulDescSetAttribute(op, attr, &value, sizeof(value));
}

// The process's cuBLASLt handle of `device` (created on first use, kept: REFERENCE section 1,
// process-global state instead of FFI State types), shared by every matmul we run there.
Status CublasLtHandleOf(const CublasLtApi* api, int device, cublasLtHandle_t* handle);

// A small device buffer of `device` (allocated once, kept) whose addresses stand in for device
// pointers when the heuristic is asked at trace time: it reads none of them, but the block-scale
// modes refuse a descriptor without scale pointers. At least 256 bytes, 256-byte aligned.
Status StandInDeviceBuffer(int device, char** buffer);

}  // namespace gpuext

// Turns a cublasStatus_t into a Status naming the call (csrc/ counterpart of AS_STATUS).
#define GPUEXT_CUBLAS_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                       \
    cublasStatus_t gpuext_cublas_st_ = (expr);                                               \
    if (gpuext_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                          \
      return ::gpuext::Status::Error(std::string(GPUEXT_WHERE ": " #expr " failed: ") +        \
                                     ::gpuext::CublasStatusName(gpuext_cublas_st_));         \
  } while (0)
