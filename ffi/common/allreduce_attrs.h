// What the CPU and CUDA all-reduce handlers share: XLA dtype -> our csrc dtype, and the
// checks on the attributes that jax_gpuext/collectives.py sends.
#pragma once

#include <optional>
#include <string>

#include "csrc/allreduce/reduce_ops.h"
#include "ffi/common/ffi_util.h"

namespace gpuext::allreduce {

inline std::optional<DType> ToDType(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::kF32;
    case ffi::DataType::F64: return DType::kF64;
    case ffi::DataType::F16: return DType::kF16;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::F8E4M3FN: return DType::kF8E4M3FN;
    case ffi::DataType::F8E5M2: return DType::kF8E5M2;
    case ffi::DataType::S8: return DType::kS8;
    case ffi::DataType::U8: return DType::kU8;
    case ffi::DataType::S32: return DType::kS32;
    case ffi::DataType::U32: return DType::kU32;
    case ffi::DataType::S64: return DType::kS64;
    case ffi::DataType::U64: return DType::kU64;
    case ffi::DataType::PRED: return DType::kPred;
    default: return std::nullopt;
  }
}

// Backstop for callers that reach the custom call directly; Python validated already.
// The timeouts a handler accepts, the range jax_gpuext/collectives.py checks at trace time
// (TIMEOUT_RANGE_S): an infinite or NaN one would let a missing peer hang the process instead of
// failing the call; one below a millisecond fails healthy calls whose peers are merely being
// scheduled (1e-46 s even reached the handler as 0 after rounding to float32).
inline constexpr float kMinTimeoutS = 1e-3f;
inline constexpr float kMaxTimeoutS = 1e6f;

inline ffi::Error CheckCommon(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer>& out, int32_t op, float timeout_s) {
  GPUEXT_FFI_CHECK(x.element_type() == out->element_type() && x.element_count() == out->element_count(),
                   "all_reduce result must have the operand's dtype and size: operand " + BufferString(x) +
                       ", result " + BufferString(*out));
  GPUEXT_FFI_CHECK(ToDType(x.element_type()).has_value(),
                   std::string("all_reduce does not support dtype ") + DataTypeName(x.element_type()));
  GPUEXT_FFI_CHECK(op >= 0 && op <= static_cast<int32_t>(ReduceOp::kOr), "op must be 0..5, got " + std::to_string(op));
  // The kernels move count * ByteWidth(dtype) bytes; every supported dtype is whole bytes, so this
  // holds by the checks above -- kept as the explicit backstop should a sub-byte dtype be added.
  const int64_t bytes = int64_t(x.element_count()) * ByteWidth(*ToDType(x.element_type()));
  if (ffi::Error e = CheckHolds(x, "operand", bytes); e.failure()) return e;
  if (ffi::Error e = CheckHolds(*out, "result", bytes); e.failure()) return e;
  GPUEXT_FFI_CHECK(timeout_s >= kMinTimeoutS && timeout_s <= kMaxTimeoutS,
                   "timeout_s must be in [" + std::to_string(kMinTimeoutS) + ", " + std::to_string(kMaxTimeoutS) +
                       "] seconds, got " + std::to_string(timeout_s));
  return ffi::Error::Success();
}

}  // namespace gpuext::allreduce
