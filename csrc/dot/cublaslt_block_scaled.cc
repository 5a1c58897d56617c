#include "csrc/dot/cublaslt_block_scaled.h"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "csrc/common/scoped_device.h"
#include "csrc/dot/cublaslt_api.h"

namespace gpuext {

namespace {

// The Python side passes these numbers (jax_gpuext/dot_cublaslt.py); keep them in step.
static_assert(CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F == 0, "scale mode numbering changed");
static_assert(CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 == 1, "scale mode numbering changed");
static_assert(CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 == 2, "scale mode numbering changed");
static_assert(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F == 4, "scale mode numbering changed");
static_assert(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F == 5, "scale mode numbering changed");

// The alignment every operand, scale and output pointer is guaranteed (see PlanFor; per-tensor
// scales through their 16-byte slots, kScalarScaleSlotBytes).
constexpr uint32_t kOperandAlignment = 16;
static_assert(kScalarScaleSlotBytes % kOperandAlignment == 0, "per-batch scalar scales must stay aligned");

using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, int, int, size_t>;

struct Plan {
  cublasLtMatmulAlgo_t algo;
};

// One algorithm per problem key, for the whole process (REFERENCE section 1: process-global
// state instead of FFI State types); the handles are cublaslt_api's, one per device.
std::mutex g_mu;
std::map<Key, Plan>& Plans() {
  static auto* p = new std::map<Key, Plan>();
  return *p;
}
int64_t g_built_while_running = 0;  // guarded by g_mu

bool DeviceAlpha(const BlockScaledMatmul& p) {
  return p.lhs_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 ||
         p.rhs_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
}

// cuBLAS's A is our rhs, its B our lhs.
Status SetScalePointers(const CublasLtApi* api, cublasLtMatmulDesc_t op, const void* rhs_scale,
                        const void* lhs_scale) {
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, rhs_scale));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lhs_scale));
  return Status::Ok();
}

// cuBLAS is column-major: out^T (N x M) = op_T(A = rhs, stored K x N) * op_N(B = lhs, stored K x M).
// Both operands are K-contiguous: the "TN" layout FP8 requires.
Status Describe(const CublasLtApi* api, const BlockScaledMatmul& p, CublasLtDescriptors& ds) {
  GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_TRANSA, t));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_TRANSB, n));
  // NVFP4's alpha (the product of the global scales) is a device value: device pointer mode, no
  // host sync, graph-safe. Every other format has alpha = 1, passed from host constants (the
  // default host mode, which is what NVIDIA's own FP8 block-scaling users run with).
  const cublasLtPointerMode_t mode = DeviceAlpha(p) ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, mode));
  // SCALAR_32F is the default mode, and cuBLAS < 12.8 does not know the scale-mode attributes
  // (CUBLAS_STATUS_INVALID_VALUE): set them only for block scaling (which needs >= 12.8 anyway).
  const int32_t a_mode = p.rhs_scale_mode, b_mode = p.lhs_scale_mode;
  if (a_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F || b_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
    GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode));
    GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode));
  }
  GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatrixLayoutCreate(&ds.a, p.rhs_type, p.k, p.n, p.k));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatrixLayoutCreate(&ds.b, p.lhs_type, p.k, p.m, p.k));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatrixLayoutCreate(&ds.d, p.out_type, p.n, p.m, p.n));
  return Status::Ok();
}

size_t ElementBits(cudaDataType_t t) { return t == CUDA_R_4F_E2M1 ? 4 : 8; }

// The handle of `device` and the algorithm of `p`'s key, both created on first use and cached
// for the process. `ds` must describe `p` (Describe). `running`: asked from the execute path,
// where a miss means neither trace time nor the initialize stage prepared the call (counted).
Status PlanFor(const CublasLtApi* api, int device, const BlockScaledMatmul& p, CublasLtDescriptors& ds, bool running,
               cublasLtHandle_t* handle, Plan* plan) {
  GPUEXT_RETURN_IF_ERROR(CublasLtHandleOf(api, device, handle));
  std::lock_guard<std::mutex> lock(g_mu);
  Key key{device, p.m, p.n, p.k, static_cast<int>(p.lhs_type), static_cast<int>(p.rhs_type),
          static_cast<int>(p.out_type), p.lhs_scale_mode, p.rhs_scale_mode, p.workspace_bytes};
  auto pit = Plans().find(key);
  if (pit == Plans().end()) {
    GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatmulPreferenceCreate(&ds.pref));
    const uint64_t ws = p.workspace_bytes;
    GPUEXT_CUBLAS_RETURN_IF_ERROR(
        api->MatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // Batches after the first start at offsets that are only 16-byte aligned (K % 16, N rows of
    // 16 bytes), and XLA promises no more for sub-buffers: never pick an algorithm assuming the
    // default 256.
    const uint32_t align = kOperandAlignment;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatmulPreferenceSetAttribute(ds.pref, attr, &align, sizeof(align)));
    }
    // `ds.op` carries scale pointers (the caller's, or Prepare's stand-ins): the block-scale
    // modes make the heuristic reject a descriptor without them (CUBLAS_STATUS_INVALID_VALUE).
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    GPUEXT_CUBLAS_RETURN_IF_ERROR(
        api->MatmulAlgoGetHeuristic(*handle, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &result, &found));
    if (found > 0 && result.state != CUBLAS_STATUS_SUCCESS) {
      return Status::Error("cuBLASLt heuristic returned an algorithm in state " + CublasStatusName(result.state));
    }
    if (found == 0) {
      return Status::Error("cuBLASLt has no algorithm for this block-scaled matmul (M=" + std::to_string(p.m) +
                           " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) + ")");
    }
    pit = Plans().emplace(key, Plan{result.algo}).first;
    if (running) ++g_built_while_running;
  }
  *plan = pit->second;
  return Status::Ok();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

bool KnownMode(int mode) {
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F:
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3:
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0:
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
      return true;
    default:
      return false;
  }
}

}  // namespace

size_t ScaleBytesPerBatch(int mode, int64_t rows, int64_t k) {
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F:  // the value, padded to a 16-byte slot
      return kScalarScaleSlotBytes;
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:  // K-blocks x rows, rows fastest
      return static_cast<size_t>(CeilDiv(k, 128) * rows) * 4;
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:  // row blocks x round_up(K-blocks, 4)
      return static_cast<size_t>(CeilDiv(rows, 128) * RoundUp(CeilDiv(k, 128), 4)) * 4;
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0:  // 128x4 tiles of one-byte scales
      return static_cast<size_t>(RoundUp(rows, 128) * RoundUp(CeilDiv(k, 32), 4));
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3:
      return static_cast<size_t>(RoundUp(rows, 128) * RoundUp(CeilDiv(k, 16), 4));
    default:
      return 0;
  }
}

Status CheckBlockScaledMatmul(const BlockScaledMatmul& p) {
  if (!KnownMode(p.lhs_scale_mode) || !KnownMode(p.rhs_scale_mode)) {
    return Status::Error("unknown cuBLASLt scale mode (lhs " + std::to_string(p.lhs_scale_mode) + ", rhs " +
                         std::to_string(p.rhs_scale_mode) + ")");
  }
  const bool block_scaled = p.lhs_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F ||
                            p.rhs_scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  if (block_scaled && p.n % kBlockScaledNMultiple) {
    return Status::Error("N=" + std::to_string(p.n) + " must be a multiple of " +
                         std::to_string(kBlockScaledNMultiple) + " with block scaling (cuBLAS's m)");
  }
  if (p.lhs_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F && p.m % kVec128RowMultiple) {
    return Status::Error("M=" + std::to_string(p.m) + " of a VEC128_32F-scaled lhs must be padded to a multiple of " +
                         std::to_string(kVec128RowMultiple) + " (jax_gpuext pads it; cuBLAS's B operand)");
  }
  return Status::Ok();
}

Status PrepareBlockScaledMatmul(const std::string& library_path, int device, const BlockScaledMatmul& p) {
  GPUEXT_RETURN_IF_ERROR(CheckBlockScaledMatmul(p));
  const CublasLtApi* api = nullptr;
  GPUEXT_RETURN_IF_ERROR(LoadCublasLt(library_path, &api));
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(device, &current));
  CublasLtDescriptors ds(api);
  GPUEXT_RETURN_IF_ERROR(Describe(api, p, ds));
  // No operands exist at trace time: stand-in scale pointers, 16-byte but not 256-byte aligned
  // like the worst real (per-batch) pointers, so the algorithm chosen fits every call.
  char* stand_in = nullptr;
  GPUEXT_RETURN_IF_ERROR(StandInDeviceBuffer(current, &stand_in));
  GPUEXT_RETURN_IF_ERROR(SetScalePointers(api, ds.op, stand_in + kOperandAlignment, stand_in + kOperandAlignment));
  cublasLtHandle_t handle = nullptr;
  Plan plan;
  return PlanFor(api, current, p, ds, /*running=*/false, &handle, &plan);
}

CublasLtPlanStats GetCublasLtPlanStats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return {static_cast<int64_t>(Plans().size()), g_built_while_running};
}

Status RunBlockScaledMatmul(const std::string& library_path, int device_ordinal, const BlockScaledMatmul& p,
                            cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(CheckBlockScaledMatmul(p));
  const CublasLtApi* api = nullptr;
  GPUEXT_RETURN_IF_ERROR(LoadCublasLt(library_path, &api));
  ScopedDevice scoped;  // the stream's device, whichever device this thread had current
  int device = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(device_ordinal, &device));

  CublasLtDescriptors ds(api);
  GPUEXT_RETURN_IF_ERROR(Describe(api, p, ds));
  GPUEXT_RETURN_IF_ERROR(SetScalePointers(api, ds.op, p.rhs_scale, p.lhs_scale));  // batch 0's
  cublasLtHandle_t handle = nullptr;
  Plan plan;
  GPUEXT_RETURN_IF_ERROR(PlanFor(api, device, p, ds, /*running=*/true, &handle, &plan));  // normally a cache hit
  static const float kHostAlphaBeta[2] = {1.0f, 0.0f};
  const float* alpha_beta = DeviceAlpha(p) ? p.alpha_beta : kHostAlphaBeta;

  const size_t a_bytes = static_cast<size_t>(p.n) * p.k * ElementBits(p.rhs_type) / 8;
  const size_t b_bytes = static_cast<size_t>(p.m) * p.k * ElementBits(p.lhs_type) / 8;
  const size_t d_bytes = static_cast<size_t>(p.m) * p.n * (p.out_type == CUDA_R_32F ? 4 : 2);
  // cuBLASLt has no batch stride for scale tensors, so batches run one matmul each.
  for (int64_t i = 0; i < p.batch; ++i) {
    GPUEXT_RETURN_IF_ERROR(SetScalePointers(api, ds.op, static_cast<const char*>(p.rhs_scale) + i * p.rhs_scale_bytes,
                                            static_cast<const char*>(p.lhs_scale) + i * p.lhs_scale_bytes));
    const void* a = static_cast<const char*>(p.rhs) + i * a_bytes;
    const void* b = static_cast<const char*>(p.lhs) + i * b_bytes;
    void* d = static_cast<char*>(p.out) + i * d_bytes;
    GPUEXT_CUBLAS_RETURN_IF_ERROR(api->Matmul(handle, ds.op, alpha_beta, a, ds.a, b, ds.b, alpha_beta + 1, d, ds.d,
                                              d, ds.d, &plan.algo, p.workspace, p.workspace_bytes, stream));
  }
  return Status::Ok();
}

}  // namespace gpuext
