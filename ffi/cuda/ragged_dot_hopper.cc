// CUDA handler of gpuext_ragged_dot_hopper (backend "hopper" of ragged_dot,
// jax_gpuext/ragged_dot/hopper.py): our grouped sm_90a FP8 blockwise kernel
// (csrc/ragged_dot/hopper_grouped.h), group sizes read on the device only.
//
//   lhs        (M, K)                       float8_e4m3fn   K % 16 == 0
//   lhs_scale  (ceil(K/128), round_up(M,4)) float32         FP8_1x128 scales, transposed by Python
//   rhs        (G, N, K)                    float8_e4m3fn   N % 8 == 0
//   rhs_scale  (G, ceil(N/128), ceil(K/128)) float32        FP8_128x128 scales
//   group_sizes (G,)                  int32
//   -> out (M, N) float32 | bfloat16 | float16, workspace uint8 (WorkspaceBytes + 256 slack).
//
// The masked layout (ragged_dot_masked) is told apart by rank: lhs (G, C, K) and out (G, C, N),
// group_sizes the experts' valid counts; M = G * C for the scales and the workspace, and the
// kernel runs its masked mode (capacity C). No attribute changes.
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
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"
#include "ffi/cuda/hopper_mx_out_type.h"

namespace gpuext {
namespace {

namespace hg = ::gpuext::hopper_grouped;
namespace hmx = ::gpuext::hopper_mx;

constexpr size_t kWorkspaceSlack = 256;

// The workspace result (the tile table), checked to hold WorkspaceBytes + slack and aligned up
// to the slack. CheckHolds, never size_bytes(): it refuses a workspace typed with a dtype whose
// size the FFI headers do not know, which size_bytes() would count as 0 or garbage bytes (issue 26).
ffi::Error AlignedWorkspace(const ffi::AnyBuffer& workspace, int64_t m, int64_t groups, void** aligned) {
  const size_t need = hg::WorkspaceBytes(m, groups) + kWorkspaceSlack;
  if (ffi::Error e = CheckHolds(workspace, "workspace", static_cast<int64_t>(need)); e.failure()) return e;
  const auto base = reinterpret_cast<uintptr_t>(workspace.untyped_data());
  *aligned = reinterpret_cast<void*>((base + kWorkspaceSlack - 1) / kWorkspaceSlack * kWorkspaceSlack);
  return ffi::Error::Success();
}

ffi::Error RaggedDotHopperImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::Buffer<ffi::F32> lhs_scale,
                               ffi::AnyBuffer rhs, ffi::Buffer<ffi::F32> rhs_scale, ffi::Buffer<ffi::S32> group_sizes,
                               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> workspace) {
  NvtxRange range("gpuext_ragged_dot_hopper");
  GPUEXT_COUNT_EXECUTE("gpuext_ragged_dot_hopper", stream);
  const auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  const auto lsd = lhs_scale.dimensions(), rsd = rhs_scale.dimensions(), gd = group_sizes.dimensions();
  const bool masked = ld.size() == 3;
  GPUEXT_FFI_CHECK((ld.size() == 2 || ld.size() == 3) && od.size() == ld.size() && rd.size() == 3 &&
                       lsd.size() == 2 && rsd.size() == 3 && gd.size() == 1,
                   "expected lhs (M, K) or (G, C, K), lhs scales (K/128, M4), rhs (G, N, K), rhs scales "
                   "(G, N/128, K/128), group_sizes (G,), out (M, N) or (G, C, N)");
  GPUEXT_FFI_CHECK(lhs.element_type() == ffi::DataType::F8E4M3FN && rhs.element_type() == ffi::DataType::F8E4M3FN,
                   "lhs and rhs must be float8_e4m3fn, got " + BufferString(lhs) + " and " + BufferString(rhs));
  hg::Problem p;
  if (ffi::Error e = HopperOutType(out->element_type(), &p.out_type); e.failure()) return e;
  p.groups = rd[0];
  p.n = rd[1];
  if (masked) {
    p.capacity = ld[1];
    p.m = ld[0] * ld[1];
    p.k = ld[2];
    GPUEXT_FFI_CHECK(ld[0] == p.groups && od[0] == p.groups && od[1] == p.capacity && od[2] == p.n,
                     "masked layout: lhs (G, C, K) and out (G, C, N) must match rhs's G and N: lhs " + DimsString(ld) +
                         ", rhs " + DimsString(rd) + ", out " + DimsString(od));
  } else {
    p.m = ld[0];
    p.k = ld[1];
    GPUEXT_FFI_CHECK(od[0] == p.m && od[1] == p.n,
                     "shapes disagree: lhs " + DimsString(ld) + ", rhs " + DimsString(rd) + ", out " + DimsString(od));
  }
  GPUEXT_FFI_CHECK(p.k > 0 && p.k % 16 == 0, "K must be a positive multiple of 16, lhs is " + DimsString(ld));
  const int64_t kb = (p.k + 127) / 128;
  GPUEXT_FFI_CHECK(rd[2] == p.k && gd[0] == p.groups,
                   "shapes disagree: lhs " + DimsString(ld) + ", rhs " + DimsString(rd) + ", group_sizes " +
                       DimsString(gd));
  GPUEXT_FFI_CHECK(lsd[0] == kb && lsd[1] == (p.m + 3) / 4 * 4,
                   "lhs scales must be (ceil(K/128), round_up(M, 4)), got " + DimsString(lsd) + " for lhs " +
                       DimsString(ld));
  GPUEXT_FFI_CHECK(rsd[0] == p.groups && rsd[1] == (p.n + 127) / 128 && rsd[2] == kb,
                   "rhs scales must be (G, ceil(N/128), ceil(K/128)), got " + DimsString(rsd) + " for rhs " +
                       DimsString(rd));
  if (ffi::Error e = AlignedWorkspace(*workspace, p.m, p.groups, &p.workspace); e.failure()) return e;
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

// gpuext_ragged_dot_hopper_wgrad (RAGGED_CONTRACT: the weight gradient), operands in the padded
// slot layout that jax_gpuext/ragged_dot/hopper.py gathers:
//   a        (K, S)                float8_e4m3fn   x^T, tokens contiguous, S = 128 * blocks
//   a_scale  (blocks, round_up(K,4)) float32       its 1x128 scales along the tokens, transposed
//   b        (N, S)                float8_e4m3fn   dy^T
//   b_scale  (blocks, round_up(N,4)) float32
//   group_sizes (G,) int32; attribute m: the tokens the sizes are clamped against
//   -> out (G, K, N) float32 | bfloat16 | float16, workspace uint8 (WorkspaceBytes(m, G) + 256).
// kCmdBufferCompatible as the forward: the same launches for fixed shapes (the tile-table kernel,
// then the wgrad kernel, or one memset when there are no tokens), sizes read on the device.
ffi::Error RaggedDotHopperWgradImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a,
                                    ffi::Buffer<ffi::F32> a_scale, ffi::AnyBuffer b, ffi::Buffer<ffi::F32> b_scale,
                                    ffi::Buffer<ffi::S32> group_sizes, ffi::Result<ffi::AnyBuffer> out,
                                    ffi::Result<ffi::AnyBuffer> workspace, int64_t m) {
  NvtxRange range("gpuext_ragged_dot_hopper_wgrad");
  GPUEXT_COUNT_EXECUTE("gpuext_ragged_dot_hopper_wgrad", stream);
  const auto ad = a.dimensions(), bd = b.dimensions(), od = out->dimensions();
  const auto asd = a_scale.dimensions(), bsd = b_scale.dimensions(), gd = group_sizes.dimensions();
  GPUEXT_FFI_CHECK(ad.size() == 2 && bd.size() == 2 && od.size() == 3 && asd.size() == 2 && bsd.size() == 2 &&
                       gd.size() == 1,
                   "expected a (K, S), a scales (blocks, K4), b (N, S), b scales (blocks, N4), group_sizes (G,), "
                   "out (G, K, N)");
  GPUEXT_FFI_CHECK(a.element_type() == ffi::DataType::F8E4M3FN && b.element_type() == ffi::DataType::F8E4M3FN,
                   "a and b must be float8_e4m3fn, got " + BufferString(a) + " and " + BufferString(b));
  hg::WgradProblem p;
  if (ffi::Error e = HopperOutType(out->element_type(), &p.out_type); e.failure()) return e;
  p.m = m;
  p.k = ad[0];
  p.n = bd[0];
  p.groups = gd[0];
  p.blocks = asd[0];
  GPUEXT_FFI_CHECK(ad[1] == p.blocks * 128 && bd[1] == ad[1],
                   "a and b must hold 128 * blocks tokens: a " + DimsString(ad) + ", b " + DimsString(bd) +
                       ", a scales " + DimsString(asd));
  GPUEXT_FFI_CHECK(asd[1] == (p.k + 3) / 4 * 4 && bsd[0] == p.blocks && bsd[1] == (p.n + 3) / 4 * 4,
                   "scales must be (blocks, round_up(K, 4)) and (blocks, round_up(N, 4)), got " + DimsString(asd) +
                       " and " + DimsString(bsd));
  GPUEXT_FFI_CHECK(od[0] == p.groups && od[1] == p.k && od[2] == p.n,
                   "out must be (G, K, N), got " + DimsString(od) + " for G = " + std::to_string(p.groups));
  if (ffi::Error e = AlignedWorkspace(*workspace, p.m, p.groups, &p.workspace); e.failure()) return e;
  p.group_sizes = group_sizes.typed_data();
  p.a = a.untyped_data();
  p.a_scale = a_scale.typed_data();
  p.b = b.untyped_data();
  p.b_scale = b_scale.typed_data();
  p.out = out->untyped_data();
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_FFI_RETURN_IF_ERROR(scoped.Enter(device, &current));
  GPUEXT_FFI_RETURN_IF_ERROR(hg::LaunchWgrad(p, stream));
  return ffi::Error::Success();
}

ffi::Error RaggedDotHopperInitialize(int32_t device, ffi::RemainingArgs, ffi::RemainingRets) {
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_FFI_RETURN_IF_ERROR(scoped.Enter(device, &current));
  GPUEXT_FFI_RETURN_IF_ERROR(hg::Prepare());
  return ffi::Error::Success();
}

// Every stage of a target decodes the call's attributes: the weight gradient's initialize stage
// must take its `m` (unused here) or XLA refuses the call ("Wrong number of attributes: expected 0
// but got 1 with name(s): m", the H200 run of 3ff9b82).
ffi::Error RaggedDotHopperWgradInitialize(int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                                          int64_t /*m*/) {
  return RaggedDotHopperInitialize(device, args, rets);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedDotHopperWgradInitializeFfi, RaggedDotHopperWgradInitialize,
                              ffi::Ffi::Bind<ffi::ExecutionStage::kInitialize>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("m"));

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

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedDotHopperWgradFfi, RaggedDotHopperWgradImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("m"),
                              {ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_STAGE("gpuext_ragged_dot_hopper", "initialize", RaggedDotHopperInitializeFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_ragged_dot_hopper", RaggedDotHopperFfi);
// The weight gradient's kernels are set up by the same preparation (hg::Prepare sets up both), through
// a binding that takes its attribute.
GPUEXT_REGISTER_FFI_STAGE("gpuext_ragged_dot_hopper_wgrad", "initialize", RaggedDotHopperWgradInitializeFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_ragged_dot_hopper_wgrad", RaggedDotHopperWgradFfi);

}  // namespace gpuext
