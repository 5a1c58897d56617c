// CUDA handler of gpuext_ragged_dot_cublaslt (jax_gpuext/ragged_dot/cublaslt.py): the grouped
// FP8 blockwise matmul out (M, N) = lhs (M, K) x rhs[g] (N, K)^T per group of rows, with the
// group sizes read on the device only (csrc/ragged_dot/cublaslt_grouped.h).
//
// Operands: lhs E4M3 (M, K); lhs scales float32 (M, K/128); rhs E4M3 (G, N, K); rhs scales
// float32 (G, floats per group in cuBLAS's layout for rhs_scale_mode); group_sizes int32 (G,).
// Results: out bfloat16 / float32 (M, N); workspace uint8 (GroupedWorkspaceBytes + 256 bytes of
// alignment slack: jax_gpuext/ragged_dot/cublaslt.py workspace_bytes). Attributes: rhs_scale_mode
// (4 VEC128_32F, 5 BLK128x128_32F), row_align (1: groups in place, 16: padded copies).
//
// kCmdBufferCompatible (REFERENCE section 2), each condition:
//  - the same device work every call: the algorithm is chosen at trace time or in the initialize
//    stage (XLA runs it before it runs or records the call) and cached; our kernels' grids come
//    from the static shapes; group sizes are read by kernels on the stream, never by the host;
//  - only the buffers passed: cuBLASLt's workspace and every per-group array are carved from the
//    workspace result;
//  - no synchronisation or stream query: none here, and cuBLASLt's grouped GEMM with device-side
//    shapes is host-synchronisation free and supports CUDA graphs (NVIDIA's CUDA 13.2
//    announcement; TransformerEngine declares its cuBLASLt grouped GEMM handler kCmdBufferCompatible);
//  - launches only on the given stream; per-call host work is descriptors only, at record time.
// Unverified until the GPU run (tests/test_ragged_dot_cublaslt.py, test_gpu_command_buffer_*).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "csrc/ragged_dot/cublaslt_grouped.h"
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/library_paths.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"

namespace gpuext {
namespace {

constexpr size_t kWorkspaceSlack = kGroupedWorkspaceAlignment;

ffi::Error CheckAligned(const void* p, const char* name) {
  if (reinterpret_cast<uintptr_t>(p) % 16 == 0) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    std::string(name) + " is not 16-byte aligned (cuBLASLt's FP8 operands and our 16-byte copies)");
}

// Validates operands and attributes and fills `p`: shared by both stages, so both see the same
// problem (and plan-cache key). Every size the kernels and cuBLASLt use is checked against the
// buffers here; the group sizes cannot move anything past them (the kernels clamp).
ffi::Error DescribeCall(ffi::AnyBuffer lhs, ffi::Buffer<ffi::F32> lhs_scale, ffi::AnyBuffer rhs,
                        ffi::Buffer<ffi::F32> rhs_scale, ffi::Buffer<ffi::S32> group_sizes,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace, int32_t rhs_scale_mode,
                        int32_t row_align, GroupedMatmul* problem, void** workspace_base) {
  const auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  const auto lsd = lhs_scale.dimensions(), rsd = rhs_scale.dimensions(), gd = group_sizes.dimensions();
  GPUEXT_FFI_CHECK(ld.size() == 2 && rd.size() == 3 && od.size() == 2 && lsd.size() == 2 && rsd.size() == 2 &&
                       gd.size() == 1,
                   "expected lhs (M, K), lhs scales (M, K/128), rhs (G, N, K), rhs scales (G, S), group_sizes (G,), "
                   "out (M, N)");
  GPUEXT_FFI_CHECK(lhs.element_type() == ffi::DataType::F8E4M3FN && rhs.element_type() == ffi::DataType::F8E4M3FN,
                   "lhs and rhs must be float8_e4m3fn, got " + BufferString(lhs) + " and " + BufferString(rhs));
  RaggedGemm& g = problem->gemm;
  g.m = ld[0];
  g.k = ld[1];
  g.groups = rd[0];
  g.n = rd[1];
  GPUEXT_FFI_CHECK(rd[2] == g.k && od[0] == g.m && od[1] == g.n && gd[0] == g.groups && rsd[0] == g.groups,
                   "shapes disagree: lhs " + DimsString(ld) + ", rhs " + DimsString(rd) + ", out " + DimsString(od) +
                       ", group_sizes " + DimsString(gd) + ", rhs scales " + DimsString(rsd));
  GPUEXT_FFI_CHECK(lsd[0] == g.m && lsd[1] == KBlocks(g.k),
                   "lhs scales must be (M, ceil(K/128)) = (" + std::to_string(g.m) + ", " +
                       std::to_string(KBlocks(g.k)) + "), got " + DimsString(lsd));
  switch (out->element_type()) {
    case ffi::DataType::BF16: problem->out_type = CUDA_R_16BF; g.out_elem_bytes = 2; break;
    case ffi::DataType::F32: problem->out_type = CUDA_R_32F; g.out_elem_bytes = 4; break;
    default:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("out must be bfloat16 or float32, got ") + DataTypeName(out->element_type()));
  }
  problem->rhs_scale_mode = rhs_scale_mode;
  g.row_align = row_align;
  GPUEXT_FFI_RETURN_IF_ERROR(CheckGroupedMatmul(*problem));  // mode, K % 128, N % 8, row_align, int32 sizes
  g.rhs_scale_floats = GroupedRhsScaleFloats(rhs_scale_mode, g.n, g.k);
  GPUEXT_FFI_CHECK(rsd[1] == g.rhs_scale_floats,
                   "rhs scales must hold " + std::to_string(g.rhs_scale_floats) +
                       " floats per group for scale mode " + std::to_string(rhs_scale_mode) + ", got " +
                       DimsString(rsd));
  g.group_sizes = group_sizes.typed_data();
  g.lhs = static_cast<const uint8_t*>(lhs.untyped_data());
  g.lhs_scale = lhs_scale.typed_data();
  g.rhs = static_cast<const uint8_t*>(rhs.untyped_data());
  g.rhs_scale = rhs_scale.typed_data();
  g.out = out->untyped_data();
  for (auto [ptr, name] : {std::pair<const void*, const char*>{g.lhs, "lhs"}, {g.rhs, "rhs"}, {g.out, "out"},
                           {g.lhs_scale, "lhs scales"}, {g.rhs_scale, "rhs scales"}}) {
    if (ffi::Error e = CheckAligned(ptr, name); e.failure()) return e;
  }
  const size_t need = GroupedWorkspaceBytes(g) + kWorkspaceSlack;
  // CheckHolds, never size_bytes(): it refuses a workspace typed with a dtype whose size the FFI
  // headers do not know, which size_bytes() would count as 0 or garbage bytes (issue 26).
  if (ffi::Error e = CheckHolds(*workspace, "workspace", static_cast<int64_t>(need)); e.failure()) return e;
  const auto base = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  *workspace_base = reinterpret_cast<void*>((base + kWorkspaceSlack - 1) / kWorkspaceSlack * kWorkspaceSlack);
  return ffi::Error::Success();
}

// Initialize makes the handle and the algorithm before XLA runs or records the call (normally a
// cache hit: trace time did it; it matters for executables compiled in another process). Execute runs.
template <ffi::ExecutionStage kStage>
ffi::Error RaggedDotCublasLt(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::Buffer<ffi::F32> lhs_scale,
                             ffi::AnyBuffer rhs, ffi::Buffer<ffi::F32> rhs_scale, ffi::Buffer<ffi::S32> group_sizes,
                             ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace,
                             int32_t rhs_scale_mode, int32_t row_align) {
  if constexpr (kStage == ffi::ExecutionStage::kExecute) GPUEXT_COUNT_EXECUTE("gpuext_ragged_dot_cublaslt", stream);
  GroupedMatmul p;
  void* workspace_base = nullptr;
  const ffi::Error described = DescribeCall(lhs, lhs_scale, rhs, rhs_scale, group_sizes, out, workspace,
                                            rhs_scale_mode, row_align, &p, &workspace_base);
  if (described.failure()) return described;
  const std::string library = LibraryPath("cublaslt");
  if constexpr (kStage == ffi::ExecutionStage::kInitialize) {
    GPUEXT_FFI_RETURN_IF_ERROR(PrepareGroupedMatmul(library, device, p));
  } else {
    NvtxRange range("gpuext_ragged_dot_cublaslt");
    GPUEXT_FFI_RETURN_IF_ERROR(RunGroupedMatmul(library, device, p, workspace_base, stream));
  }
  return ffi::Error::Success();
}

template <ffi::ExecutionStage kStage>
auto BindRaggedDotCublasLt() {
  return ffi::Ffi::Bind<kStage>()
      .template Ctx<ffi::PlatformStream<cudaStream_t>>()
      .template Ctx<ffi::DeviceOrdinal>()
      .template Arg<ffi::AnyBuffer>()          // lhs
      .template Arg<ffi::Buffer<ffi::F32>>()   // lhs scales
      .template Arg<ffi::AnyBuffer>()          // rhs
      .template Arg<ffi::Buffer<ffi::F32>>()   // rhs scales
      .template Arg<ffi::Buffer<ffi::S32>>()   // group_sizes
      .template Ret<ffi::AnyBuffer>()          // out
      .template Ret<ffi::AnyBuffer>()          // workspace
      .template Attr<int32_t>("rhs_scale_mode")
      .template Attr<int32_t>("row_align");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedDotCublasLtInitializeFfi, RaggedDotCublasLt<ffi::ExecutionStage::kInitialize>,
                              BindRaggedDotCublasLt<ffi::ExecutionStage::kInitialize>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedDotCublasLtFfi, RaggedDotCublasLt<ffi::ExecutionStage::kExecute>,
                              BindRaggedDotCublasLt<ffi::ExecutionStage::kExecute>(),
                              {ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_STAGE("gpuext_ragged_dot_cublaslt", "initialize", RaggedDotCublasLtInitializeFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_ragged_dot_cublaslt", RaggedDotCublasLtFfi);

}  // namespace gpuext
