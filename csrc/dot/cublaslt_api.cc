#include "csrc/dot/cublaslt_api.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <map>
#include <mutex>

#include "csrc/common/cuda_check.h"
#include "csrc/common/open_library.h"

namespace gpuext {

namespace {

template <typename Fn>
Status Resolve(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) return Status::Error(std::string("cuBLASLt has no symbol ") + name);
  return Status::Ok();
}

Status LoadOnce(const std::string& path, CublasLtApi* api, std::string* opened) {
  void* lib = nullptr;
  Status s = OpenLibrary(path, {"libcublasLt.so.13", "libcublasLt.so.12"}, &lib, opened);
  if (!s.ok()) return Status::Error("cuBLASLt: " + s.message() + " (install nvidia-cublas)");
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtCreate", &api->Create));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtGetVersion", &api->GetVersion));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatmul", &api->Matmul));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatmulDescCreate", &api->MatmulDescCreate));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatmulDescDestroy", &api->MatmulDescDestroy));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatmulDescSetAttribute", &api->MatmulDescSetAttribute));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatrixLayoutCreate", &api->MatrixLayoutCreate));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatrixLayoutDestroy", &api->MatrixLayoutDestroy));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatmulPreferenceCreate", &api->MatmulPreferenceCreate));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatmulPreferenceDestroy", &api->MatmulPreferenceDestroy));
  GPUEXT_RETURN_IF_ERROR(
      Resolve(lib, "cublasLtMatmulPreferenceSetAttribute", &api->MatmulPreferenceSetAttribute));
  GPUEXT_RETURN_IF_ERROR(Resolve(lib, "cublasLtMatmulAlgoGetHeuristic", &api->MatmulAlgoGetHeuristic));
  // Optional (null where this cuBLASLt predates it): the grouped GEMM of cuBLAS >= 13.2.
  api->GroupedMatrixLayoutCreate =
      reinterpret_cast<CublasLtApi::GroupedMatrixLayoutCreateFn>(dlsym(lib, "cublasLtGroupedMatrixLayoutCreate"));
  return Status::Ok();
}

}  // namespace

Status LoadCublasLt(const std::string& path, const CublasLtApi** api) {
  static std::mutex mu;
  static CublasLtApi* loaded = nullptr;
  static std::string loaded_path;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded == nullptr) {
    auto* fresh = new CublasLtApi();
    Status s = LoadOnce(path, fresh, &loaded_path);
    if (!s.ok()) {
      delete fresh;
      return s;
    }
    loaded = fresh;
  } else if (!path.empty() && path != loaded_path) {
    return Status::Error("cuBLASLt already loaded from " + loaded_path + ", asked for " + path);
  }
  *api = loaded;
  return Status::Ok();
}

Status CublasLtHandleOf(const CublasLtApi* api, int device, cublasLtHandle_t* handle) {
  static std::mutex mu;
  static auto* handles = new std::map<int, cublasLtHandle_t>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles->find(device);
  if (it != handles->end()) {
    *handle = it->second;
    return Status::Ok();
  }
  GPUEXT_CUBLAS_RETURN_IF_ERROR(api->Create(handle));
  (*handles)[device] = *handle;
  return Status::Ok();
}

Status StandInDeviceBuffer(int device, char** buffer) {
  static std::mutex mu;
  static auto* buffers = new std::map<int, void*>();
  std::lock_guard<std::mutex> lock(mu);
  void*& b = (*buffers)[device];
  if (b == nullptr) GPUEXT_CUDA_RETURN_IF_ERROR(cudaMalloc(&b, 256));
  *buffer = static_cast<char*>(b);
  return Status::Ok();
}

std::string CublasStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cublasStatus_t " + std::to_string(static_cast<int>(s));
  }
}

}  // namespace gpuext
