// The call frame shared by the cuBLASLt and cuDNN block-scaled dot handlers, for either execution
// stage, so each handler's initialize and execute stages decode the same operands (and so build
// the same plan-cache key) from one definition:
//   contexts: stream (XLA passes it to the initialize stage too), device ordinal;
//   lhs, lhs scales, rhs, rhs scales, alpha (float32, device) -> out, workspace;
//   attributes k (logical), lhs_type, rhs_type, then each handler's own.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ffi/common/ffi_util.h"

namespace gpuext {

template <ffi::ExecutionStage kStage>
auto BindBlockScaledDotOperands() {
  return ffi::Ffi::Bind<kStage>()
      .template Ctx<ffi::PlatformStream<cudaStream_t>>()
      .template Ctx<ffi::DeviceOrdinal>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::Buffer<ffi::F32>>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attr<int64_t>("k")
      .template Attr<int32_t>("lhs_type")
      .template Attr<int32_t>("rhs_type");
}

// lhs / rhs of both handlers are (B, rows, K bytes): FP8 codes, or FP4 packed two per uint8 by
// jax_gpuext.dot.pack_fp4. The libraries read B * rows * row_bytes bytes, where row_bytes comes
// from attribute k, so the buffer must be byte-wide (a float4_e2m1fn buffer is half as large as
// its dims say) and hold that many bytes.
inline ffi::Error CheckByteOperand(const ffi::AnyBuffer& b, const char* name, int64_t row_bytes) {
  if (ElementBits(b.element_type()) != 8)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(name) + " must be a byte-wide buffer (FP8, or FP4 packed into uint8), got " +
                          BufferString(b));
  const auto d = b.dimensions();
  return CheckHolds(b, name, d[0] * d[1] * row_bytes);
}

}  // namespace gpuext
