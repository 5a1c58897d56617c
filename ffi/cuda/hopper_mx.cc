// CUDA handler of gpuext_hopper_mx_dot (backend "hopper_mx" of jax_gpuext.block_scaled_dot):
// decodes and validates the canonical operands prepared by jax_gpuext/hopper_mx.py and launches
// csrc/hopper_mx.
//
//   a       [B, M, K]        float8_e4m3fn | float8_e5m2   (K % 32 == 0)
//   b       [B, N, K]        float8_e4m3fn | float8_e5m2
//   a_scale [B, K/32, Mp]    float32, Mp = round_up(M, 4) (one scale per 32-long K block,
//   b_scale [B, K/32, Np]    float32   transposed so TMA boxes are 16-byte multiples)
//   out     [B, M, N]        float32 | bfloat16 | float16
//   attr config: csrc/hopper_mx TileConfig id, chosen in Python (autotune cache or default).
//
// kCmdBufferCompatible (REFERENCE section 2): for fixed shapes/attributes every call launches
// the same single kernel with the same grid on the given stream; tensor maps are rebuilt on the
// host from the buffer addresses (host-only, nothing allocated, no stream query or sync), and
// passed by value as kernel parameters, so a recorded graph holds everything it needs. The
// tile config is an attribute, never read from the autotune cache here, so a replay cannot
// differ from the recording.
//
// Initialize stage: the first launch of a kernel on a device has one-time work (the dynamic
// shared memory opt-in, the lazy load of the sm_90a kernel, the driver entry-point lookup).
// If that first launch happened while XLA captures a command buffer, the work would run inside
// the capture, which not every driver may allow. XLA runs a handler's initialize stage before
// it records or runs the call (CustomCallThunk::Initialize; CommandBufferThunk::Initialize
// initializes its commands before recording), so we do the work there; each later run costs
// only a lookup. The execute stage still does it on first use should the stage not run.
#include <cuda_runtime_api.h>

#include <string>

#include "csrc/common/scoped_device.h"
#include "csrc/hopper_mx/hopper_mx.h"
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"
#include "ffi/cuda/hopper_mx_out_type.h"

namespace gpuext {
namespace {

namespace hmx = ::gpuext::hopper_mx;

bool Fp8Type(ffi::DataType t, hmx::ElemType* out) {
  if (t == ffi::DataType::F8E4M3FN) *out = hmx::ElemType::kE4M3;
  else if (t == ffi::DataType::F8E5M2) *out = hmx::ElemType::kE5M2;
  else return false;
  return true;
}

ffi::Error HopperMxDotImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                           ffi::AnyBuffer a_scale, ffi::AnyBuffer b_scale,
                           ffi::Result<ffi::AnyBuffer> out, int32_t config) {
  NvtxRange range("gpuext_hopper_mx_dot");
  GPUEXT_COUNT_EXECUTE("gpuext_hopper_mx_dot", stream);
  hmx::Problem p;
  GPUEXT_FFI_CHECK(Fp8Type(a.element_type(), &p.a_type),
                   std::string("a must be float8_e4m3fn or float8_e5m2, got ") + DataTypeName(a.element_type()));
  GPUEXT_FFI_CHECK(Fp8Type(b.element_type(), &p.b_type),
                   std::string("b must be float8_e4m3fn or float8_e5m2, got ") + DataTypeName(b.element_type()));
  GPUEXT_FFI_CHECK(a_scale.element_type() == ffi::DataType::F32 && b_scale.element_type() == ffi::DataType::F32,
                   "scales must be float32");
  if (ffi::Error e = HopperOutType(out->element_type(), &p.out_type); e.failure()) return e;
  const auto ad = a.dimensions(), bd = b.dimensions(), sad = a_scale.dimensions(),
             sbd = b_scale.dimensions(), od = out->dimensions();
  GPUEXT_FFI_CHECK(ad.size() == 3 && bd.size() == 3 && sad.size() == 3 && sbd.size() == 3 && od.size() == 3,
                   "every operand must have rank 3: a " + DimsString(ad) + ", b " + DimsString(bd));
  p.batch = ad[0];
  p.m = ad[1];
  p.n = bd[1];
  p.k = ad[2];
  GPUEXT_FFI_CHECK(bd[0] == p.batch && bd[2] == p.k, "a " + DimsString(ad) + " and b " + DimsString(bd) + " disagree");
  GPUEXT_FFI_CHECK(p.k % hmx::kScaleBlock == 0, "K must be a multiple of 32, a is " + DimsString(ad));
  const int64_t kb = p.k / hmx::kScaleBlock;
  GPUEXT_FFI_CHECK(sad[0] == p.batch && sad[1] == kb && sad[2] == hmx::PaddedScaleDim(p.m),
                   "a_scale must be [B, K/32, round_up(M, 4)], got " + DimsString(sad) + " for a " + DimsString(ad));
  GPUEXT_FFI_CHECK(sbd[0] == p.batch && sbd[1] == kb && sbd[2] == hmx::PaddedScaleDim(p.n),
                   "b_scale must be [B, K/32, round_up(N, 4)], got " + DimsString(sbd) + " for b " + DimsString(bd));
  GPUEXT_FFI_CHECK(od[0] == p.batch && od[1] == p.m && od[2] == p.n,
                   "out must be [B, M, N] = [" + std::to_string(p.batch) + ", " + std::to_string(p.m) +
                       ", " + std::to_string(p.n) + "], got " + DimsString(od));
  GPUEXT_FFI_CHECK(config >= 0 && config < hmx::kNumTileConfigs, "unknown tile config " + std::to_string(config));
  p.a = a.untyped_data();
  p.b = b.untyped_data();
  p.a_scale = static_cast<const float*>(a_scale.untyped_data());
  p.b_scale = static_cast<const float*>(b_scale.untyped_data());
  p.out = out->untyped_data();
  ScopedDevice scoped;  // the stream's device: the per-device kernel set-up keys on it
  int current = 0;
  GPUEXT_FFI_RETURN_IF_ERROR(scoped.Enter(device, &current));
  GPUEXT_FFI_RETURN_IF_ERROR(hmx::Launch(p, static_cast<hmx::TileConfig>(config), stream));
  return ffi::Error::Success();
}

ffi::Error HopperMxDotInitialize(int32_t device, ffi::RemainingArgs, ffi::RemainingRets, int32_t config) {
  GPUEXT_FFI_CHECK(config >= 0 && config < hmx::kNumTileConfigs, "unknown tile config " + std::to_string(config));
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_FFI_RETURN_IF_ERROR(scoped.Enter(device, &current));
  GPUEXT_FFI_RETURN_IF_ERROR(hmx::Prepare(static_cast<hmx::TileConfig>(config)));
  return ffi::Error::Success();
}

}  // namespace

// Operands are not needed here, so they are taken as Remaining* (any count and type).
XLA_FFI_DEFINE_HANDLER_SYMBOL(HopperMxDotInitializeFfi, HopperMxDotInitialize,
                              ffi::Ffi::Bind<ffi::ExecutionStage::kInitialize>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int32_t>("config"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HopperMxDotFfi, HopperMxDotImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("config"),
                              {ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_STAGE("gpuext_hopper_mx_dot", "initialize", HopperMxDotInitializeFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_hopper_mx_dot", HopperMxDotFfi);

}  // namespace gpuext
