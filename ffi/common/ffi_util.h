// Helpers shared by every handler: error conversion, argument checks, dtype names.
// Nothing here throws; every failure is an ffi::Error with "file:line: <call> failed: <message>".
#pragma once

#include <cstdint>
#include <string>

#include "csrc/common/status.h"
#include "xla/ffi/api/ffi.h"

namespace gpuext {

namespace ffi = ::xla::ffi;

inline ffi::Error ToFfiError(const Status& s) {
  return s.ok() ? ffi::Error::Success() : ffi::Error(ffi::ErrorCode::kInternal, s.message());
}

inline const char* DataTypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F8E5M2: return "float8_e5m2";
    case ffi::DataType::F8E4M3FN: return "float8_e4m3fn";
    case ffi::DataType::F4E2M1FN: return "float4_e2m1fn";
    case ffi::DataType::F8E8M0FNU: return "float8_e8m0fnu";
    default: return "unsupported dtype";
  }
}

// "[2, 3, 4]": shapes in error messages.
inline std::string DimsString(ffi::Span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

inline int64_t ElementCount(ffi::Span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

}  // namespace gpuext

// Runs a csrc/ call returning Status; on failure returns an ffi::Error naming the call.
#define GPUEXT_FFI_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                     \
    ::gpuext::Status gpuext_status_ = (expr);                                              \
    if (!gpuext_status_.ok())                                                              \
      return ::xla::ffi::Error(::xla::ffi::ErrorCode::kInternal,                           \
                               std::string(GPUEXT_WHERE ": " #expr " failed: ") +          \
                                   gpuext_status_.message());                             \
  } while (0)

// Validates a handler precondition (the Python layer checks first; this is the backstop
// for callers that reach the custom call directly). `msg` is any std::string expression.
#define GPUEXT_FFI_CHECK(cond, msg)                                                        \
  do {                                                                                     \
    if (!(cond))                                                                           \
      return ::xla::ffi::Error(::xla::ffi::ErrorCode::kInvalidArgument,                    \
                               std::string(GPUEXT_WHERE ": check " #cond " failed: ") + (msg)); \
  } while (0)

// ffi.h (0.8.0) has ErrorOr but no assign-or-return macro. In a handler (returns ffi::Error):
#define GPUEXT_FFI_ASSIGN_OR_RETURN(lhs, expr)                          \
  do {                                                                  \
    auto gpuext_or_ = (expr);                                           \
    if (gpuext_or_.has_error()) return std::move(gpuext_or_).error();   \
    lhs = std::move(gpuext_or_).value();                                \
  } while (0)

// The same inside a helper that itself returns ffi::ErrorOr<T>.
#define GPUEXT_FFI_ASSIGN_OR_FORWARD(lhs, expr)                                                  \
  do {                                                                                           \
    auto gpuext_or_ = (expr);                                                                    \
    if (gpuext_or_.has_error()) return ::xla::ffi::Unexpected<::xla::ffi::Error>(std::move(gpuext_or_).error()); \
    lhs = std::move(gpuext_or_).value();                                                         \
  } while (0)
