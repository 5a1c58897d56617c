// CUDA handler of gpuext_ragged_dot_hopper (backend "hopper" of ragged_dot,
// jax_gpuext/ragged_dot/hopper.py): our grouped sm_90a FP8 blockwise kernel
// (csrc/ragged_dot/hopper_grouped.h), group sizes read on the device only.
//
//   lhs        (M, K)                 float8_e4m3fn   K % 128 == 0
//   lhs_scale  (K/128, round_up(M,4)) float32         FP8_1x128 scales, transposed by Python
//   rhs        (G, N, K)              float8_e4m3fn   N % 8 == 0
//   rhs_scale  (G, ceil(N/128), K/128) float32        FP8_128x128 scales
//   group_sizes (G,)                  int32
//   -> out (M, N) float32 | bfloat16 | float16, workspace uint8 (WorkspaceBytes + 256 slack).
//
// kCmdBufferCompatible (REFERENCE section 2): for fixed shapes every call launches the same three
// kernels with the same grids on the given stream (the group sizes are read by the tile-table
// kernel on the device; the matmul grid covers the most tiles any sizes can need); tensor maps
// are encoded on the host from the buffer addresses and passed by value; only the buffers passed
// are used (the tile table lives in the workspace result); nothing synchronises or queries the
// stream; the one-time kernel set-up runs in the initialize stage, before any recording.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "csrc/common/scoped_device.h"
#include "csrc/ragged_dot/grouped_layout.h"
#include "csrc/ragged_dot/hopper_grouped.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"

namespace gpuext {
namespace {

namespace hg = ::gpuext::hopper_grouped;
namespace hmx = ::gpuext::hopper_mx;

constexpr size_t kWorkspaceSlack = 256;

ffi::Error RaggedDotHopperImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::Buffer<ffi::F32> lhs_scale,
                               ffi::AnyBuffer rhs, ffi::Buffer<ffi::F32> rhs_scale, ffi::Buffer<ffi::S32> group_sizes,
                               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace) {
  NvtxRange range("gpuext_ragged_dot_hopper");
  const auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  const auto lsd = lhs_scale.dimensions(), rsd = rhs_scale.dimensions(), gd = group_sizes.dimensions();
  GPUEXT_FFI_CHECK(ld.size() == 2 && rd.size() == 3 && od.size() == 2 && lsd.size() == 2 && rsd.size() == 3 &&
                       gd.size() == 1,
                   "expected lhs (M, K), lhs scales (K/128, M4), rhs (G, N, K), rhs scales (G, N/128, K/128), "
                   "group_sizes (G,), out (M, N)");
  GPUEXT_FFI_CHECK(lhs.element_type() == ffi::DataType::F8E4M3FN && rhs.element_type() == ffi::DataType::F8E4M3FN,
                   "lhs and rhs must be float8_e4m3fn, got " + BufferString(lhs) + " and " + BufferString(rhs));
  hg::Problem p;
  switch (out->element_type()) {
    case ffi::DataType::F32: p.out_type = hmx::OutType::kF32; break;
    case ffi::DataType::BF16: p.out_type = hmx::OutType::kBF16; break;
    case ffi::DataType::F16: p.out_type = hmx::OutType::kF16; break;
    default:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("out must be float32, bfloat16 or float16, got ") +
                            DataTypeName(out->element_type()));
  }
  p.m = ld[0];
  p.k = ld[1];
  p.groups = rd[0];
  p.n = rd[1];
  GPUEXT_FFI_CHECK(p.k > 0 && p.k % 128 == 0, "K must be a positive multiple of 128, lhs is " + DimsString(ld));
  GPUEXT_FFI_CHECK(rd[2] == p.k && od[0] == p.m && od[1] == p.n && gd[0] == p.groups,
                   "shapes disagree: lhs " + DimsString(ld) + ", rhs " + DimsString(rd) + ", out " + DimsString(od) +
                       ", group_sizes " + DimsString(gd));
  GPUEXT_FFI_CHECK(lsd[0] == p.k / 128 && lsd[1] == (p.m + 3) / 4 * 4,
                   "lhs scales must be (K/128, round_up(M, 4)), got " + DimsString(lsd) + " for lhs " + DimsString(ld));
  GPUEXT_FFI_CHECK(rsd[0] == p.groups && rsd[1] == (p.n + 127) / 128 && rsd[2] == p.k / 128,
                   "rhs scales must be (G, ceil(N/128), K/128), got " + DimsString(rsd) + " for rhs " + DimsString(rd));
  const size_t need = hg::WorkspaceBytes(p.m, p.groups) + kWorkspaceSlack;
  // CheckHolds, never size_bytes(): it refuses a workspace typed with a dtype whose size the FFI
  // headers do not know, which size_bytes() would count as 0 or garbage bytes (issue 26).
  if (ffi::Error e = CheckHolds(*workspace, "workspace", static_cast<int64_t>(need)); e.failure()) return e;
  const auto base = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  p.workspace = reinterpret_cast<void*>((base + kWorkspaceSlack - 1) / kWorkspaceSlack * kWorkspaceSlack);
  p.group_sizes = group_sizes.typed_data();
  p.lhs = lhs.untyped_data();
  p.lhs_scale = lhs_scale.typed_data();
  p.rhs = rhs.untyped_data();
  p.rhs_scale = rhs_scale.typed_data();
  p.out = out->untyped_data();
  ScopedDevice scoped;  // the stream's device: the per-device kernel set-up keys on it
  int current = 0;
  GPUEXT_FFI_RETURN_IF_ERROR(scoped.Enter(device, &current));
  GPUEXT_FFI_RETURN_IF_ERROR(hg::Launch(p, stream));
  return ffi::Error::Success();
}

ffi::Error RaggedDotHopperInitialize(int32_t device, ffi::RemainingArgs, ffi::RemainingRets) {
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_FFI_RETURN_IF_ERROR(scoped.Enter(device, &current));
  GPUEXT_FFI_RETURN_IF_ERROR(hg::Prepare());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedDotHopperInitializeFfi, RaggedDotHopperInitialize,
                              ffi::Ffi::Bind<ffi::ExecutionStage::kInitialize>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedDotHopperFfi, RaggedDotHopperImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_STAGE("gpuext_ragged_dot_hopper", "initialize", RaggedDotHopperInitializeFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_ragged_dot_hopper", RaggedDotHopperFfi);

}  // namespace gpuext
