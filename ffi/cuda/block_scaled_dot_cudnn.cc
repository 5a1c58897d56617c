// CUDA handler of gpuext_block_scaled_dot_cudnn (jax_gpuext/dot_cudnn.py).
//
// Operands: lhs (B, M, K | K/2 packed FP4), lhs scales (B, round_up(M, 128), K/blk) in the
// F8_128x4 layout, rhs (B, N, ...), rhs scales, alpha (float32[1], device: gs_l * gs_r).
// Results: out (B, M, N) and the workspace (sized at trace time, dot_cudnn.WORKSPACE_BYTES).
// Attributes: k (logical), lhs/rhs_type (0 E4M3, 1 E5M2, 2 packed E2M1), fuse_alpha,
// graph_safe (drop cuBLASLt-dependent plans; cuDNN >= 9.15). libcudnn.so.9 comes from the path
// Python set (ffi/common/library_paths.h).
//
// Not kCmdBufferCompatible (yet): below cuDNN 9.15 a chosen plan may call cuBLASLt, which is
// not graph-safe, and the trait cannot depend on the run-time cuDNN version; above it, whether
// cuDNN's execute meets REFERENCE section 2 (no allocation, no stream query) is unverified
// until the GPU tests run. docs/design.md, "Block-scaled dot".
#include <cuda_runtime_api.h>

#include <string>

#include "csrc/dot/cudnn_block_scaled.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/library_paths.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"
#include "ffi/cuda/block_scaled_dot_binding.h"

namespace gpuext {
namespace {

bool ElementType(int32_t code, CudnnElement* out) {
  if (code < 0 || code > 2) return false;
  *out = static_cast<CudnnElement>(code);
  return true;
}

bool Empty(const CudnnBlockScaledMatmul& p) { return p.batch == 0 || p.m == 0 || p.n == 0; }

// Validates the operands and attributes and fills `p`, pointers included: shared by the
// initialize and execute stages, so both see the same problem (and the same graph-cache key).
ffi::Error DescribeCall(ffi::AnyBuffer lhs, ffi::AnyBuffer lhs_scale, ffi::AnyBuffer rhs, ffi::AnyBuffer rhs_scale,
                        ffi::Buffer<ffi::F32> alpha, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> workspace, int64_t k, int32_t lhs_type, int32_t rhs_type,
                        int32_t fuse_alpha, int32_t graph_safe, CudnnBlockScaledMatmul* out_problem) {
  auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  auto lsd = lhs_scale.dimensions(), rsd = rhs_scale.dimensions();
  GPUEXT_FFI_CHECK(ld.size() == 3 && rd.size() == 3 && od.size() == 3,
                   "lhs, rhs and out must be (B, rows, K) / (B, M, N)");
  GPUEXT_FFI_CHECK(ld[0] == rd[0] && od[0] == ld[0] && od[1] == ld[1] && od[2] == rd[1],
                   "batch / M / N sizes of lhs, rhs and out disagree");
  GPUEXT_FFI_CHECK(alpha.element_count() == 1, "alpha must hold one float32 (gs_lhs * gs_rhs)");
  CudnnElement lt, rt;
  GPUEXT_FFI_CHECK(ElementType(lhs_type, &lt),
                   "lhs_type must be 0 (E4M3), 1 (E5M2) or 2 (E2M1), got " + std::to_string(lhs_type));
  GPUEXT_FFI_CHECK(ElementType(rhs_type, &rt),
                   "rhs_type must be 0 (E4M3), 1 (E5M2) or 2 (E2M1), got " + std::to_string(rhs_type));
  GPUEXT_FFI_CHECK((lt == CudnnElement::kE2M1) == (rt == CudnnElement::kE2M1),
                   "lhs and rhs must both be NVFP4 or both MXFP8");
  GPUEXT_FFI_CHECK(k > 0 && k % 128 == 0, "k must be a positive multiple of 128, got " + std::to_string(k));
  const bool fp4 = lt == CudnnElement::kE2M1;
  GPUEXT_FFI_CHECK(ld[2] == (fp4 ? k / 2 : k) && rd[2] == (fp4 ? k / 2 : k),
                   "K of lhs/rhs does not match attribute k=" + std::to_string(k));
  if (ffi::Error e = CheckByteOperand(lhs, "lhs", fp4 ? k / 2 : k); e.failure()) return e;
  if (ffi::Error e = CheckByteOperand(rhs, "rhs", fp4 ? k / 2 : k); e.failure()) return e;
  const int64_t kblk = k / (fp4 ? 16 : 32);
  auto padded = [](int64_t x) { return (x + 127) / 128 * 128; };
  GPUEXT_FFI_CHECK(lsd.size() == 3 && lsd[0] == ld[0] && lsd[1] == padded(ld[1]) && lsd[2] == kblk,
                   "lhs scales must be (B, round_up(M, 128), K/" + std::to_string(fp4 ? 16 : 32) + ")");
  GPUEXT_FFI_CHECK(rsd.size() == 3 && rsd[0] == rd[0] && rsd[1] == padded(rd[1]) && rsd[2] == kblk,
                   "rhs scales must be (B, round_up(N, 128), K/" + std::to_string(fp4 ? 16 : 32) + ")");
  GPUEXT_FFI_CHECK(ElementBits(lhs_scale.element_type()) == 8 && ElementBits(rhs_scale.element_type()) == 8,
                   "scales must be one byte each (E8M0 / E4M3 bits), got " + BufferString(lhs_scale) + " and " +
                       BufferString(rhs_scale));

  CudnnBlockScaledMatmul& p = *out_problem;
  switch (out->element_type()) {
    case ffi::DataType::BF16: p.out_type = CudnnOut::kBF16; break;
    case ffi::DataType::F16: p.out_type = CudnnOut::kF16; break;
    case ffi::DataType::F32: p.out_type = CudnnOut::kF32; break;
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
  p.fuse_alpha = fuse_alpha != 0;
  p.drop_cublaslt_plans = graph_safe != 0;
  p.lhs = lhs.untyped_data();
  p.rhs = rhs.untyped_data();
  p.lhs_scale = lhs_scale.untyped_data();
  p.rhs_scale = rhs_scale.untyped_data();
  p.alpha = alpha.typed_data();
  p.out = out->untyped_data();
  // PackedByteSize after CheckSized, never size_bytes(): a direct caller may type the workspace
  // with a dtype whose size the headers do not know (ffi_util.h ElementBits).
  if (ffi::Error e = CheckSized(*workspace, "workspace"); e.failure()) return e;
  p.workspace = workspace->untyped_data();
  p.workspace_bytes = static_cast<size_t>(PackedByteSize(*workspace));
  return ffi::Error::Success();
}

// Both stages of the handler. Initialize builds this call's graph before XLA runs the call:
// trace time normally built it already (then this is one cache lookup); it matters where the
// trace ran elsewhere (an executable compiled ahead of time), so graph building (seconds, with
// cuDNN's own allocations) never happens on the execute path. Execute runs it.
template <ffi::ExecutionStage kStage>
ffi::Error BlockScaledDotCudnn(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer lhs_scale,
                               ffi::AnyBuffer rhs, ffi::AnyBuffer rhs_scale, ffi::Buffer<ffi::F32> alpha,
                               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace, int64_t k,
                               int32_t lhs_type, int32_t rhs_type, int32_t fuse_alpha, int32_t graph_safe) {
  CudnnBlockScaledMatmul p;
  const ffi::Error described =
      DescribeCall(lhs, lhs_scale, rhs, rhs_scale, alpha, out, workspace, k, lhs_type, rhs_type, fuse_alpha,
                   graph_safe, &p);
  if (described.failure()) return described;
  if (Empty(p)) return ffi::Error::Success();
  const std::string library = LibraryPath("cudnn");
  if constexpr (kStage == ffi::ExecutionStage::kInitialize) {
    int64_t plan_workspace = 0;
    GPUEXT_FFI_RETURN_IF_ERROR(PrepareCudnnBlockScaledMatmul(library, device, p, &plan_workspace));
  } else {
    NvtxRange range("gpuext_block_scaled_dot_cudnn");
    GPUEXT_FFI_RETURN_IF_ERROR(RunCudnnBlockScaledMatmul(library, device, p, stream));
  }
  return ffi::Error::Success();
}

}  // namespace

// This handler's call frame (block_scaled_dot_binding.h plus its own attributes), for either stage.
template <ffi::ExecutionStage kStage>
auto BindCudnnCall() {
  return BindBlockScaledDotOperands<kStage>()
      .template Attr<int32_t>("fuse_alpha")
      .template Attr<int32_t>("graph_safe");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(BlockScaledDotCudnnInitializeFfi,
                              BlockScaledDotCudnn<ffi::ExecutionStage::kInitialize>,
                              BindCudnnCall<ffi::ExecutionStage::kInitialize>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(BlockScaledDotCudnnFfi,
                              BlockScaledDotCudnn<ffi::ExecutionStage::kExecute>,
                              BindCudnnCall<ffi::ExecutionStage::kExecute>());

GPUEXT_REGISTER_FFI_STAGE("gpuext_block_scaled_dot_cudnn", "initialize", BlockScaledDotCudnnInitializeFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_block_scaled_dot_cudnn", BlockScaledDotCudnnFfi);

}  // namespace gpuext
