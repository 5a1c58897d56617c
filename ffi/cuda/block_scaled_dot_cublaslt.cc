// CUDA handler of gpuext_block_scaled_dot_cublaslt (jax_gpuext/dot_cublaslt.py).
//
// Operands: lhs (B, M, K | K/2 packed FP4), lhs scales, rhs (B, N, ...), rhs scales, and
// alpha_beta = {gs_l * gs_r, 0} (float32, device; read only for NVFP4, whose alpha is not 1).
// Results: out (B, M, N) and a workspace sized at trace time (plus 256 bytes of alignment
// slack). Attributes: k (logical), lhs/rhs_type (0 E4M3, 1 E5M2, 2 packed E2M1),
// lhs/rhs_scale_mode (cublasLtMatmulMatrixScale_t). libcublasLt comes from the path Python set
// (ffi/common/library_paths.h).
//
// kCmdBufferCompatible (REFERENCE section 2): the algorithm is chosen at trace time
// (_cuda.cublaslt_prepare) or, where no trace ran in this process (an executable compiled ahead of
// time), in the initialize stage, which XLA runs before it runs or records the call (also inside
// a command buffer: CommandBufferThunk::Initialize initializes its thunks first). It is cached
// for the process, so every call launches the same cuBLASLt kernels on the given stream; memory is only
// the buffers passed (workspace included); alpha/beta are read from device memory or are host
// constants; nothing synchronises or queries the stream. Per-call host work is descriptors only, at record time.
#include <cuda_runtime_api.h>

#include <string>

#include "csrc/dot/cublaslt_block_scaled.h"
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/library_paths.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"
#include "ffi/cuda/block_scaled_dot_binding.h"

namespace gpuext {
namespace {

constexpr size_t kWorkspaceSlack = 256;

bool Empty(const BlockScaledMatmul& p) { return p.batch == 0 || p.m == 0 || p.n == 0; }

// Validates the operands and attributes and fills `p`, pointers included: shared by the
// initialize and execute stages, so both see the same problem (and the same plan-cache key).
ffi::Error DescribeCall(ffi::AnyBuffer lhs, ffi::AnyBuffer lhs_scale, ffi::AnyBuffer rhs, ffi::AnyBuffer rhs_scale,
                        ffi::Buffer<ffi::F32> alpha_beta, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> workspace, int64_t k, int32_t lhs_type, int32_t rhs_type,
                        int32_t lhs_scale_mode, int32_t rhs_scale_mode, BlockScaledMatmul* out_problem) {
  auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  GPUEXT_FFI_CHECK(ld.size() == 3 && rd.size() == 3 && od.size() == 3,
                   "lhs, rhs and out must be (B, rows, K) / (B, M, N)");
  GPUEXT_FFI_CHECK(ld[0] == rd[0] && od[0] == ld[0] && od[1] == ld[1] && od[2] == rd[1],
                   "batch / M / N sizes of lhs, rhs and out disagree");
  GPUEXT_FFI_CHECK(alpha_beta.element_count() == 2, "alpha_beta must hold {alpha, 0}");
  cudaDataType_t lt, rt;
  GPUEXT_FFI_CHECK(ElementTypeOfCode(lhs_type, &lt), "lhs_type must be 0 (E4M3), 1 (E5M2) or 2 (E2M1), got " +
                                                   std::to_string(lhs_type));
  GPUEXT_FFI_CHECK(ElementTypeOfCode(rhs_type, &rt), "rhs_type must be 0 (E4M3), 1 (E5M2) or 2 (E2M1), got " +
                                                   std::to_string(rhs_type));
  GPUEXT_FFI_CHECK(k > 0 && (k % 2 == 0 || (lt != CUDA_R_4F_E2M1 && rt != CUDA_R_4F_E2M1)),
                   "k must be positive (and even for packed FP4), got " + std::to_string(k));
  const int64_t lhs_row = lt == CUDA_R_4F_E2M1 ? k / 2 : k, rhs_row = rt == CUDA_R_4F_E2M1 ? k / 2 : k;
  GPUEXT_FFI_CHECK(ld[2] == lhs_row && rd[2] == rhs_row,
                   "K of lhs/rhs does not match attribute k=" + std::to_string(k));
  if (ffi::Error e = CheckByteOperand(lhs, "lhs", lhs_row); e.failure()) return e;
  if (ffi::Error e = CheckByteOperand(rhs, "rhs", rhs_row); e.failure()) return e;

  BlockScaledMatmul& p = *out_problem;
  switch (out->element_type()) {
    case ffi::DataType::BF16: p.out_type = CUDA_R_16BF; break;
    case ffi::DataType::F16: p.out_type = CUDA_R_16F; break;
    case ffi::DataType::F32: p.out_type = CUDA_R_32F; break;
    default:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("out must be bfloat16, float16 or float32, got ") +
                            DataTypeName(out->element_type()));
  }
  p.batch = ld[0];
  p.m = ld[1];
  p.n = rd[1];
  p.k = k;
  p.lhs_type = lt;
  p.rhs_type = rt;
  p.lhs_scale_mode = lhs_scale_mode;
  p.rhs_scale_mode = rhs_scale_mode;
  p.lhs = lhs.untyped_data();
  p.rhs = rhs.untyped_data();
  p.lhs_scale = lhs_scale.untyped_data();
  p.rhs_scale = rhs_scale.untyped_data();
  if (Empty(p)) return ffi::Error::Success();  // no division by a zero batch below
  GPUEXT_FFI_RETURN_IF_ERROR(CheckBlockScaledMatmul(p));  // known scale modes, shape rules
  // cuBLASLt reads as many scale bytes as the mode and shape say, whatever the buffers hold:
  // each batch's slice must hold that (the shape checks above came first, so the sizes mean something).
  p.lhs_scale_bytes = ScaleBytesPerBatch(lhs_scale_mode, p.m, k);
  p.rhs_scale_bytes = ScaleBytesPerBatch(rhs_scale_mode, p.n, k);
  if (ffi::Error e = CheckHolds(lhs_scale, "lhs scales", p.batch * static_cast<int64_t>(p.lhs_scale_bytes));
      e.failure())
    return e;
  if (ffi::Error e = CheckHolds(rhs_scale, "rhs scales", p.batch * static_cast<int64_t>(p.rhs_scale_bytes));
      e.failure())
    return e;
  p.alpha_beta = alpha_beta.typed_data();
  p.out = out->untyped_data();
  // cuBLASLt wants a 256-byte aligned workspace; the buffer carries kWorkspaceSlack extra bytes
  // (dot_cublaslt.WORKSPACE_SLACK) so the aligned part always holds the size the plan assumed.
  // PackedByteSize after CheckSized, never size_bytes(): a direct caller may type the workspace
  // with a dtype whose size the headers do not know (ffi_util.h ElementBits).
  if (ffi::Error e = CheckSized(*workspace, "workspace"); e.failure()) return e;
  const int64_t workspace_bytes = PackedByteSize(*workspace);
  GPUEXT_FFI_CHECK(workspace_bytes > static_cast<int64_t>(kWorkspaceSlack),
                   "workspace must exceed " + std::to_string(kWorkspaceSlack) + " bytes, got " +
                       BufferString(*workspace));
  const auto base = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  p.workspace = reinterpret_cast<void*>((base + kWorkspaceSlack - 1) / kWorkspaceSlack * kWorkspaceSlack);
  p.workspace_bytes = static_cast<size_t>(workspace_bytes) - kWorkspaceSlack;
  return ffi::Error::Success();
}

// Both stages of the handler. Initialize makes the handle and the algorithm of this call before
// XLA runs or records it: trace time normally did (then it is one map lookup); it matters where
// the trace ran elsewhere (an executable compiled ahead of time, or traced with no GPU attached),
// so the handle creation and the heuristic never happen on the execute path, inside a graph
// capture. Execute runs it.
template <ffi::ExecutionStage kStage>
ffi::Error BlockScaledDotCublasLt(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer lhs_scale,
                                  ffi::AnyBuffer rhs, ffi::AnyBuffer rhs_scale, ffi::Buffer<ffi::F32> alpha_beta,
                                  ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace, int64_t k,
                                  int32_t lhs_type, int32_t rhs_type, int32_t lhs_scale_mode, int32_t rhs_scale_mode) {
  if constexpr (kStage == ffi::ExecutionStage::kExecute) GPUEXT_COUNT_EXECUTE("gpuext_block_scaled_dot_cublaslt", stream);
  BlockScaledMatmul p;
  const ffi::Error described =
      DescribeCall(lhs, lhs_scale, rhs, rhs_scale, alpha_beta, out, workspace, k, lhs_type, rhs_type,
                   lhs_scale_mode, rhs_scale_mode, &p);
  if (described.failure()) return described;
  if (Empty(p)) return ffi::Error::Success();
  const std::string library = LibraryPath("cublaslt");
  if constexpr (kStage == ffi::ExecutionStage::kInitialize) {
    GPUEXT_FFI_RETURN_IF_ERROR(PrepareBlockScaledMatmul(library, device, p));
  } else {
    NvtxRange range("gpuext_block_scaled_dot_cublaslt");
    GPUEXT_FFI_RETURN_IF_ERROR(RunBlockScaledMatmul(library, device, p, stream));
  }
  return ffi::Error::Success();
}

}  // namespace

// This handler's call frame (block_scaled_dot_binding.h plus its own attributes), for either stage.
template <ffi::ExecutionStage kStage>
auto BindCublasLtCall() {
  return BindBlockScaledDotOperands<kStage>()
      .template Attr<int32_t>("lhs_scale_mode")
      .template Attr<int32_t>("rhs_scale_mode");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(BlockScaledDotCublasLtInitializeFfi,
                              BlockScaledDotCublasLt<ffi::ExecutionStage::kInitialize>,
                              BindCublasLtCall<ffi::ExecutionStage::kInitialize>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(BlockScaledDotCublasLtFfi,
                              BlockScaledDotCublasLt<ffi::ExecutionStage::kExecute>,
                              BindCublasLtCall<ffi::ExecutionStage::kExecute>(),
                              {ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_STAGE("gpuext_block_scaled_dot_cublaslt", "initialize", BlockScaledDotCublasLtInitializeFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_block_scaled_dot_cublaslt", BlockScaledDotCublasLtFfi);

}  // namespace gpuext
