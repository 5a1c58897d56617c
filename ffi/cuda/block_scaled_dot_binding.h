// The call frame shared by the cuBLASLt and cuDNN block-scaled dot handlers, for either execution
// stage, so each handler's initialize and execute stages decode the same operands (and so build
// the same plan-cache key) from one definition:
//   contexts: stream (XLA passes it to the initialize stage too), device ordinal;
//   lhs, lhs scales, rhs, rhs scales, alpha (float32, device) -> out, workspace;
//   attributes k (logical), lhs_type, rhs_type, then each handler's own.
#pragma once

#include <cuda_runtime_api.h>

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

}  // namespace gpuext
