// The output dtype of our Hopper FP8 kernels: hopper_mx and the grouped kernels (forward, dgrad,
// wgrad) share one epilogue (csrc/hopper_mx/hopper_mx.h, OutType), so they accept the same three.
#pragma once

#include <string>

#include "csrc/hopper_mx/hopper_mx.h"
#include "ffi/common/ffi_util.h"

namespace gpuext {

inline ffi::Error HopperOutType(ffi::DataType type, hopper_mx::OutType* out) {
  switch (type) {
    case ffi::DataType::F32: *out = hopper_mx::OutType::kF32; return ffi::Error::Success();
    case ffi::DataType::BF16: *out = hopper_mx::OutType::kBF16; return ffi::Error::Success();
    case ffi::DataType::F16: *out = hopper_mx::OutType::kF16; return ffi::Error::Success();
    default:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("out must be float32, bfloat16 or float16, got ") + DataTypeName(type));
  }
}

}  // namespace gpuext
