#include "csrc/ragged_dot/cublaslt_grouped.h"

#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "csrc/common/scoped_device.h"
#include "csrc/dot/cublaslt_api.h"

namespace gpuext {

namespace {

// The Python side passes these numbers (jax_gpuext/ragged_dot/cublaslt.py).
static_assert(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F == 4, "scale mode numbering changed");
static_assert(CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F == 5, "scale mode numbering changed");

// The grouped API's preference attributes, by value: cublasLt.h < 13.2 (CUDA 12 builds) lacks
// them, and the call is refused at run time there anyway (no cublasLtGroupedMatrixLayoutCreate).
constexpr int kPrefGroupedAverageReductionDim = 13;
constexpr int kPrefGroupedAverageRowsOfD = 14;
constexpr int kPrefGroupedAverageColsOfD = 15;
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 130200
static_assert(CUBLASLT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM == kPrefGroupedAverageReductionDim, "");
static_assert(CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_ROWS == kPrefGroupedAverageRowsOfD, "");
static_assert(CUBLASLT_MATMUL_PREF_GROUPED_DESC_D_AVERAGE_COLS == kPrefGroupedAverageColsOfD, "");
static_assert(std::is_same_v<decltype(&cublasLtGroupedMatrixLayoutCreate), CublasLtApi::GroupedMatrixLayoutCreateFn>,
              "cublasLtGroupedMatrixLayoutCreate changed its signature");
#endif

constexpr int kLhsScaleMode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Average rows per group (cuBLAS's n), the heuristic's hint: the group sizes themselves are on
// the device. Padded groups are row_align multiples, so the hint is too.
int64_t AverageGroupRows(const RaggedGemm& g) {
  const int64_t avg = g.groups > 0 ? (g.m + g.groups - 1) / g.groups : 0;
  return (avg + g.row_align - 1) / g.row_align * g.row_align;
}

// The operation and the three grouped layouts over `arrays` (device arrays: cuBLASLt reads them
// when the matmul runs, never on the host). cuBLAS is column-major: per group
// D (N x n_g) = op_T(A = rhs_g, stored K x N) * op_N(B = lhs rows, stored K x n_g): TN, as FP8 needs.
Status Describe(const CublasLtApi* api, const GroupedMatmul& p, const GroupedArrays& arrays,
                CublasLtDescriptors& ds) {
  if (api->GroupedMatrixLayoutCreate == nullptr) {
    return Status::Error("this cuBLASLt has no cublasLtGroupedMatrixLayoutCreate: the grouped GEMM needs cuBLAS "
                         ">= 13.2, and >= 13.4 for FP8 block scaling on Hopper (pip install -U nvidia-cublas)");
  }
  GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_TRANSA, t));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_TRANSB, n));
  // alpha = 1, beta = 0 from host constants (the default pointer mode): one alpha for every group,
  // which is all Hopper's grouped GEMM takes, as NVIDIA's LtBlk128x128Fp8gemmGroupedSimple sample runs it.
  const int32_t a_mode = p.rhs_scale_mode, b_mode = kLhsScaleMode;
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode));
  // In grouped mode the scale "pointers" are device arrays of per-group scale pointers.
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, arrays.a_scale));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(SetMatmulDesc(api, ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, arrays.b_scale));
  const int groups = static_cast<int>(p.gemm.groups);
  GPUEXT_CUBLAS_RETURN_IF_ERROR(
      api->GroupedMatrixLayoutCreate(&ds.a, CUDA_R_8F_E4M3, groups, arrays.a_rows, arrays.a_cols, arrays.lda));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(
      api->GroupedMatrixLayoutCreate(&ds.b, CUDA_R_8F_E4M3, groups, arrays.b_rows, arrays.b_cols, arrays.ldb));
  GPUEXT_CUBLAS_RETURN_IF_ERROR(
      api->GroupedMatrixLayoutCreate(&ds.d, p.out_type, groups, arrays.d_rows, arrays.d_cols, arrays.ldd));
  return Status::Ok();
}

// The heuristic's hints. cublasLt.h documents them as uint32_t, while NVIDIA's grouped samples and
// TransformerEngine pass int64_t: take whichever width this cuBLASLt accepts.
Status SetAverage(const CublasLtApi* api, cublasLtMatmulPreference_t pref, int attr, int64_t value) {
  const auto a = static_cast<cublasLtMatmulPreferenceAttributes_t>(attr);
  if (api->MatmulPreferenceSetAttribute(pref, a, &value, sizeof(value)) == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  const uint32_t narrow = static_cast<uint32_t>(value);
  GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatmulPreferenceSetAttribute(pref, a, &narrow, sizeof(narrow)));
  return Status::Ok();
}

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int32_t, int, int>;

std::mutex g_mu;
std::map<Key, cublasLtMatmulAlgo_t>& Plans() {
  static auto* p = new std::map<Key, cublasLtMatmulAlgo_t>();
  return *p;
}
int64_t g_built_while_running = 0;  // guarded by g_mu

// The handle of `device` and the algorithm of p's key, created on first use and cached for the
// process (REFERENCE section 1: process-global state, not FFI State). `ds` describes p.
Status PlanFor(const CublasLtApi* api, int device, const GroupedMatmul& p, CublasLtDescriptors& ds, bool running,
               cublasLtHandle_t* handle, cublasLtMatmulAlgo_t* algo) {
  GPUEXT_RETURN_IF_ERROR(CublasLtHandleOf(api, device, handle));
  std::lock_guard<std::mutex> lock(g_mu);
  const RaggedGemm& g = p.gemm;
  const Key key{device, g.n, g.k, g.groups, AverageGroupRows(g), g.row_align, p.rhs_scale_mode,
                static_cast<int>(p.out_type)};
  auto pit = Plans().find(key);
  if (pit == Plans().end()) {
    GPUEXT_CUBLAS_RETURN_IF_ERROR(api->MatmulPreferenceCreate(&ds.pref));
    const uint64_t ws = kGroupedCublasWorkspaceBytes;
    GPUEXT_CUBLAS_RETURN_IF_ERROR(
        api->MatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    GPUEXT_RETURN_IF_ERROR(SetAverage(api, ds.pref, kPrefGroupedAverageRowsOfD, g.n));
    GPUEXT_RETURN_IF_ERROR(SetAverage(api, ds.pref, kPrefGroupedAverageColsOfD, AverageGroupRows(g)));
    GPUEXT_RETURN_IF_ERROR(SetAverage(api, ds.pref, kPrefGroupedAverageReductionDim, g.k));
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    GPUEXT_CUBLAS_RETURN_IF_ERROR(
        api->MatmulAlgoGetHeuristic(*handle, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &result, &found));
    if (found > 0 && result.state != CUBLAS_STATUS_SUCCESS) {
      return Status::Error("cuBLASLt heuristic returned a grouped algorithm in state " +
                           CublasStatusName(result.state));
    }
    if (found == 0) {
      return Status::Error("cuBLASLt has no grouped FP8 blockwise algorithm for N=" + std::to_string(g.n) +
                           " K=" + std::to_string(g.k) + " G=" + std::to_string(g.groups));
    }
    pit = Plans().emplace(key, result.algo).first;
    if (running) ++g_built_while_running;
  }
  *algo = pit->second;
  return Status::Ok();
}

// The per-group arrays at trace time: stand-in device addresses (the heuristic reads none of them).
Status StandInArrays(int device, GroupedArrays* out) {
  char* buffer = nullptr;
  GPUEXT_RETURN_IF_ERROR(StandInDeviceBuffer(device, &buffer));
  auto* ptrs = reinterpret_cast<const void**>(buffer);
  auto* ints = reinterpret_cast<int32_t*>(buffer);
  out->a = out->b = out->a_scale = out->b_scale = ptrs;
  out->d = reinterpret_cast<void**>(buffer);
  out->a_rows = out->a_cols = out->lda = out->b_rows = out->b_cols = out->ldb = out->d_rows = out->d_cols =
      out->ldd = ints;
  return Status::Ok();
}

}  // namespace

int64_t GroupedRhsScaleFloats(int mode, int64_t n, int64_t k) {
  const int64_t kb = KBlocks(k);
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:  // N blocks x round_up(K blocks, 4), K fastest
      return (n + 127) / 128 * ((kb + 3) / 4 * 4);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:  // K blocks x round_up(N, 4), N fastest
      return kb * ((n + 3) / 4 * 4);
    default:
      return 0;
  }
}

Status CheckGroupedMatmul(const GroupedMatmul& p) {
  const RaggedGemm& g = p.gemm;
  if (GroupedRhsScaleFloats(p.rhs_scale_mode, g.n, g.k) == 0) {
    return Status::Error("rhs_scale_mode must be 4 (VEC128_32F) or 5 (BLK128x128_32F), got " +
                         std::to_string(p.rhs_scale_mode));
  }
  if (p.out_type != CUDA_R_16BF && p.out_type != CUDA_R_32F) {
    return Status::Error("the grouped FP8 blockwise output must be bfloat16 or float32");
  }
  if (g.row_align != 1 && g.row_align != kGroupedPaddedRowAlign) {
    return Status::Error("row_align must be 1 or " + std::to_string(kGroupedPaddedRowAlign) + ", got " +
                         std::to_string(g.row_align));
  }
  if (g.k <= 0 || g.k % 128) return Status::Error("K=" + std::to_string(g.k) + " must be a positive multiple of 128");
  // cuBLAS's m in every block-scaling mode, and 16-byte output rows for the copies
  if (g.n < 0 || g.n % 8) return Status::Error("N=" + std::to_string(g.n) + " must be a multiple of 8");
  if (g.m < 0 || g.groups < 0) return Status::Error("M and G must not be negative");
  // cuBLAS's grouped shapes are int32 (CUBLASLT_INTEGER_WIDTH_32, the default we keep).
  if (g.k > kInt32Max || g.n > kInt32Max || PaddedRowCapacity(g.m, g.groups, g.row_align) > kInt32Max ||
      g.groups > kInt32Max) {
    return Status::Error("M, N, K and G (with padding) must fit cuBLAS's int32 grouped shapes");
  }
  return Status::Ok();
}

Status PrepareGroupedMatmul(const std::string& library_path, int device, const GroupedMatmul& p) {
  GPUEXT_RETURN_IF_ERROR(CheckGroupedMatmul(p));
  if (p.gemm.groups == 0) return Status::Ok();  // nothing for cuBLASLt to do
  const CublasLtApi* api = nullptr;
  GPUEXT_RETURN_IF_ERROR(LoadCublasLt(library_path, &api));
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(device, &current));
  GroupedArrays stand_in;
  GPUEXT_RETURN_IF_ERROR(StandInArrays(current, &stand_in));
  CublasLtDescriptors ds(api);
  GPUEXT_RETURN_IF_ERROR(Describe(api, p, stand_in, ds));
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulAlgo_t algo;
  return PlanFor(api, current, p, ds, /*running=*/false, &handle, &algo);
}

Status RunGroupedMatmul(const std::string& library_path, int device_ordinal, const GroupedMatmul& p,
                        void* workspace, cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(CheckGroupedMatmul(p));
  const RaggedGemm& g = p.gemm;
  if (g.m == 0 || g.n == 0) return Status::Ok();  // an empty output
  ScopedDevice scoped;  // the stream's device, whichever device this thread had current
  int device = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(device_ordinal, &device));
  const GroupedWorkspace ws = CarveGroupedWorkspace(workspace, g);
  // Library, descriptors and plan first (host work only): a missing library fails before any launch.
  const CublasLtApi* api = nullptr;
  CublasLtDescriptors ds(nullptr);
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulAlgo_t algo;
  if (g.groups > 0) {
    GPUEXT_RETURN_IF_ERROR(LoadCublasLt(library_path, &api));
    ds.api = api;
    GPUEXT_RETURN_IF_ERROR(Describe(api, p, ws.arrays, ds));
    GPUEXT_RETURN_IF_ERROR(PlanFor(api, device, p, ds, /*running=*/true, &handle, &algo));  // normally cached
  }
  GPUEXT_RETURN_IF_ERROR(LaunchGroupedPrepare(g, ws, stream));
  if (g.groups > 0) {
    static const float kAlpha = 1.0f, kBeta = 0.0f;
    // A, B, C, D are the device pointer arrays; C = D with beta = 0 (never read).
    GPUEXT_CUBLAS_RETURN_IF_ERROR(api->Matmul(handle, ds.op, &kAlpha, ws.arrays.a, ds.a, ws.arrays.b, ds.b, &kBeta,
                                              ws.arrays.d, ds.d, ws.arrays.d, ds.d, &algo, ws.cublas,
                                              kGroupedCublasWorkspaceBytes, stream));
  }
  return LaunchGroupedFinish(g, ws, stream);
}

GroupedPlanStats GetGroupedPlanStats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return {static_cast<int64_t>(Plans().size()), g_built_while_running};
}

}  // namespace gpuext
