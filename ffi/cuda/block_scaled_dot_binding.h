// The call frame shared by the cuBLASLt and cuDNN block-scaled dot handlers, appended to a
// binding of any execution stage, so each handler's initialize and execute stages decode the
// same operands (and so build the same plan-cache key) from one definition:
//   lhs, lhs scales, rhs, rhs scales, alpha (float32, device) -> out, workspace;
//   attributes k (logical), lhs_type, rhs_type, then each handler's own.
#pragma once

#include <utility>

#include "ffi/common/ffi_util.h"

namespace gpuext {

template <typename Binding>
auto BindBlockScaledDotOperands(Binding&& binding) {  // by reference: Binding cannot be moved
  return std::forward<Binding>(binding)
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
