// Block-scaled (MXFP8 / NVFP4) matmul as a cuDNN graph: raw pointers, sizes, a stream, a Status.
//
//   out[b, m, n] = alpha * sum_k dq(lhs)[b, m, k] * dq(rhs)[b, n, k]     (fp32 accumulation)
//
// dq = block_scale_dequantize. lhs (B, M, K) and rhs (B, N, K) are row-major and K-contiguous
// (packed FP4: two elements per byte, element 2i in the low nibble); out (B, M, N) row-major.
// Scales are in the F8_128x4 tiled layout (jax_gpuext.formats.to_blackwell_scale_layout):
// per batch a (round_up(rows, 128), K / block) array, K / block a multiple of 4.
//
// This header names no cuDNN type, so the FFI handler compiles without the cudnn-frontend
// headers; only cudnn_block_scaled.cc (one g++ translation unit) includes them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "csrc/common/status.h"

namespace gpuext {

// Codes shared with jax_gpuext/dot_cudnn.py (_element_code); keep them in step.
enum class CudnnElement : int32_t { kE4M3 = 0, kE5M2 = 1, kE2M1 = 2 };
enum class CudnnOut : int32_t { kBF16 = 0, kF16 = 1, kF32 = 2 };

struct CudnnBlockScaledMatmul {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  CudnnElement lhs_type = CudnnElement::kE4M3, rhs_type = CudnnElement::kE4M3;
  CudnnOut out_type = CudnnOut::kBF16;
  // Multiply the fp32 accumulator by *alpha inside the graph (NVFP4 global scales; cuDNN >= 9.13
  // only: older versions accept the multiply and ignore it, REFERENCE section 3).
  bool fuse_alpha = false;
  // Drop plans carrying CUDNN_BEHAVIOR_NOTE_CUBLASLT_DEPENDENCY (the note exists from cuDNN 9.15).
  bool drop_cublaslt_plans = false;
  const void* lhs = nullptr;
  const void* rhs = nullptr;
  const void* lhs_scale = nullptr;
  const void* rhs_scale = nullptr;
  const float* alpha = nullptr;  // device scalar; read only when fuse_alpha
  void* out = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // plans needing more are not considered
};

// Runs the matmul on `stream`. `library_path` is the libcudnn.so.9 that Python found
// (jax_gpuext._libs.path("cudnn"); empty: the loader's search); it is dlopened once per process
// and a later, different path is an error. The graph for a (device, shapes, types, alpha mode,
// plan filter, workspace) key is built by PrepareCudnnBlockScaledMatmul at trace time or in the
// handler's initialize stage (here only if neither ran) and cached for the process, so every call
// launches the same plan. Nothing is allocated here: cuDNN's workspace is `workspace`.
// `device_ordinal` is the stream's CUDA device (XLA's device ordinal): it keys the caches and is
// made current for the call.
Status RunCudnnBlockScaledMatmul(const std::string& library_path, int device_ordinal, const CudnnBlockScaledMatmul& p,
                                 cudaStream_t stream);

// Builds (does not run) the graph of `p` on `device` (< 0: the current device) and caches it
// where RunCudnnBlockScaledMatmul finds it: validate, operation graph, heuristics, check_support,
// build_plans. Ok with the plan's workspace size, or the first stage that failed with cuDNN's
// message. Called at trace time (jax_gpuext/dot_cudnn.py) and again by the handler's initialize
// stage (a cache hit unless the trace ran in another process), so graphs are built before any call
// runs or is captured into a CUDA graph, and a graph cuDNN cannot build is a trace-time answer;
// benchmarks/probe_cudnn.py uses it to record what cuDNN supports where our gates say no (an
// H100). Pointers in `p` are not read.
Status PrepareCudnnBlockScaledMatmul(const std::string& library_path, int device, const CudnnBlockScaledMatmul& p,
                                     int64_t* workspace_bytes);

}  // namespace gpuext
