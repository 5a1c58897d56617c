// Block-scaled (and per-tensor) FP8/FP4 matmul through cuBLASLt: raw pointers, sizes, a stream.
//
//   out[b, m, n] = alpha * sum_k lhs[b, m, k] * s_lhs(...) * rhs[b, n, k] * s_rhs(...)
//
// lhs (B, M, K) and rhs (B, N, K) row-major and K-contiguous; out (B, M, N) row-major. The scale
// tensors are already in the layout cuBLASLt documents for the scale mode (the Python side
// rearranges them). Packed FP4 holds two elements per byte, element 2i in the low nibble.
#pragma once

#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "csrc/common/status.h"

namespace gpuext {

struct BlockScaledMatmul {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  cudaDataType_t lhs_type = CUDA_R_8F_E4M3, rhs_type = CUDA_R_8F_E4M3, out_type = CUDA_R_16BF;
  int lhs_scale_mode = 0, rhs_scale_mode = 0;  // cublasLtMatmulMatrixScale_t values
  const void* lhs = nullptr;
  const void* rhs = nullptr;
  const void* lhs_scale = nullptr;  // batch * lhs_scale_bytes
  const void* rhs_scale = nullptr;
  size_t lhs_scale_bytes = 0, rhs_scale_bytes = 0;  // per batch
  const float* alpha_beta = nullptr;  // device: {alpha, 0.0f}; read only for NVFP4 (else alpha = 1)
  void* out = nullptr;
  void* workspace = nullptr;  // 256-byte aligned (cuBLASLt's requirement)
  size_t workspace_bytes = 0;
};

// Element codes shared with jax_gpuext/dot_cublaslt.py (_element_code): 0 E4M3, 1 E5M2, 2 packed
// E2M1; output codes (_OUT_CODES): 0 bf16, 1 f16, 2 f32. False for an unknown code.
inline bool ElementTypeOfCode(int32_t code, cudaDataType_t* out) {
  switch (code) {
    case 0: *out = CUDA_R_8F_E4M3; return true;
    case 1: *out = CUDA_R_8F_E5M2; return true;
    case 2: *out = CUDA_R_4F_E2M1; return true;
    default: return false;
  }
}
inline bool OutTypeOfCode(int32_t code, cudaDataType_t* out) {
  switch (code) {
    case 0: *out = CUDA_R_16BF; return true;
    case 1: *out = CUDA_R_16F; return true;
    case 2: *out = CUDA_R_32F; return true;
    default: return false;
  }
}

// Rows of the lhs (cuBLAS's B) when its scales are VEC128_32F: Python pads M to this multiple
// (jax_gpuext/dot_cublaslt.py FP8_BLOCK_ROW_MULTIPLE). TransformerEngine requires % 8 of a 1-D
// quantized B and NVIDIA tests only % 16.
constexpr int64_t kVec128RowMultiple = 16;
// cuBLAS's m (our N) in every block-scaling mode (TransformerEngine's cublaslt_gemm.cu).
constexpr int64_t kBlockScaledNMultiple = 8;
// Bytes of one batch entry's SCALAR_32F (per-tensor) scale: the float32 value, then padding, so
// batch i's scale pointer (base + i * 16) is as aligned as every other pointer we hand cuBLASLt
// (kOperandAlignment). Packed at 4 bytes a batched per-tensor FP8 matmul failed with
// CUBLAS_STATUS_NOT_SUPPORTED on an H200 (issue 33). jax_gpuext/dot/cublaslt.py SCALAR_SCALE_SLOT.
constexpr size_t kScalarScaleSlotBytes = 16;

// The problem's shape invariants for its scale modes (mode values known, M and N multiples as
// above): checked by Prepare and Run both, so a call that skipped the Python checks (another
// caller, a hand-written HLO) gets an error naming the rule rather than "no algorithm" or a
// wrong result.
Status CheckBlockScaledMatmul(const BlockScaledMatmul& p);

// Bytes of one batch entry's scales of an operand with `rows` rows and `k` logical columns in
// cuBLASLt scale mode `mode` (cuBLAS docs, "Scaling factors layouts"; the layouts
// jax_gpuext/dot_cublaslt.py writes), or 0 for an unknown mode. The handler checks the scale
// buffers against it so cuBLASLt never reads past them.
size_t ScaleBytesPerBatch(int mode, int64_t rows, int64_t k);

// Runs the matmul on `stream` with the algorithm PrepareBlockScaledMatmul cached for the
// (device, shape, types, modes, workspace) key (asking the heuristic here only if nothing
// prepared it), so every call, and every replay of a CUDA graph recorded from one, launches the
// same kernels.
// `device_ordinal` is the stream's CUDA device (XLA's device ordinal); it keys the caches and is
// made current for the call.
Status RunBlockScaledMatmul(const std::string& library_path, int device_ordinal, const BlockScaledMatmul& p,
                            cudaStream_t stream);

// Creates the handle of `device` (< 0: the current device) and asks the heuristic for `p`'s
// algorithm now, caching both where RunBlockScaledMatmul finds them; pointers in `p` are not
// read (the heuristic sees stand-in scale pointers). Called at trace time
// (jax_gpuext/dot_cublaslt.py) and again by the handler's initialize stage (a cache hit unless the
// trace ran in another process), so no call creates a handle or asks the heuristic while running
// or being captured into a CUDA graph, and "no algorithm" is a trace-time answer.
Status PrepareBlockScaledMatmul(const std::string& library_path, int device, const BlockScaledMatmul& p);

// Plans cached in this process, and how many of them the execute path had to make itself
// (neither trace time nor the initialize stage had prepared the call): tests assert 0 there.
struct CublasLtPlanStats {
  int64_t plans = 0;
  int64_t built_while_running = 0;
};
CublasLtPlanStats GetCublasLtPlanStats();

}  // namespace gpuext
