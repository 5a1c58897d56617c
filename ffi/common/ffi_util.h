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

// The dtype in error messages. A code our headers do not name is printed as its number, so a
// refusal still says what arrived.
inline std::string DataTypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S1: return "int1";
    case ffi::DataType::S2: return "int2";
    case ffi::DataType::S4: return "int4";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U1: return "uint1";
    case ffi::DataType::U2: return "uint2";
    case ffi::DataType::U4: return "uint4";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::C64: return "complex64";
    case ffi::DataType::C128: return "complex128";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F8E5M2: return "float8_e5m2";
    case ffi::DataType::F8E4M3: return "float8_e4m3";
    case ffi::DataType::F8E4M3FN: return "float8_e4m3fn";
    case ffi::DataType::F8E4M3B11FNUZ: return "float8_e4m3b11fnuz";
    case ffi::DataType::F8E5M2FNUZ: return "float8_e5m2fnuz";
    case ffi::DataType::F8E4M3FNUZ: return "float8_e4m3fnuz";
    case ffi::DataType::F8E3M4: return "float8_e3m4";
    case ffi::DataType::F4E2M1FN: return "float4_e2m1fn";
    case ffi::DataType::F8E8M0FNU: return "float8_e8m0fnu";
    case ffi::DataType::TOKEN: return "token";
    // What XLA passes for a type its FFI cannot name (jaxlib 0.12 does so for float6_e2m3fn).
    case ffi::DataType::INVALID: return "an element type the XLA FFI does not name (code 0, e.g. float6)";
    default: return "dtype code " + std::to_string(static_cast<int>(t));
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

// Bits one element of `t` occupies in an XLA buffer, for the element types whose layout we know;
// 0 for every other one. An explicit list, never ffi::ByteWidth: in the 0.8.0 headers we build
// against ByteWidth counts one byte per sub-byte element while XLA packs them (4- and 2-bit types
// two and four per byte; checked on CPU with jaxlib 0.10.2, docs/design.md "Reliability"), and it
// says 0 bytes for a type the FFI cannot name (float6_e2m3fn / float6_e3m2fn arrive from jaxlib
// 0.12 as INVALID): gpuext_place then copied nothing and returned uninitialised memory (issue 26),
// and it has no case at all for codes newer than its enum. 1-bit types are left out: nothing tells
// us how XLA lays them out.
inline int64_t ElementBits(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::S2: case ffi::DataType::U2: return 2;
    case ffi::DataType::S4: case ffi::DataType::U4: case ffi::DataType::F4E2M1FN: return 4;
    case ffi::DataType::PRED: case ffi::DataType::S8: case ffi::DataType::U8:
    case ffi::DataType::F8E5M2: case ffi::DataType::F8E4M3: case ffi::DataType::F8E4M3FN:
    case ffi::DataType::F8E4M3B11FNUZ: case ffi::DataType::F8E5M2FNUZ: case ffi::DataType::F8E4M3FNUZ:
    case ffi::DataType::F8E3M4: case ffi::DataType::F8E8M0FNU:
      return 8;
    case ffi::DataType::S16: case ffi::DataType::U16: case ffi::DataType::F16: case ffi::DataType::BF16: return 16;
    case ffi::DataType::S32: case ffi::DataType::U32: case ffi::DataType::F32: return 32;
    case ffi::DataType::S64: case ffi::DataType::U64: case ffi::DataType::F64: case ffi::DataType::C64: return 64;
    case ffi::DataType::C128: return 128;
    default: return 0;  // unknown layout: CheckSized refuses the buffer
  }
}

// Every handler calls this on each buffer it reads or writes before sizing any access, so a
// buffer of a type without a known layout is refused instead of copied with a made-up size.
inline ffi::Error CheckSized(const ffi::AnyBuffer& b, const char* name) {
  if (ElementBits(b.element_type()) > 0) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    std::string(name) + " has element type " + DataTypeName(b.element_type()) + DimsString(b.dimensions()) +
                        ", whose size in an XLA buffer our handlers do not know; refused rather than read or "
                        "written with a guessed size (supported: every 8/16/32/64/128-bit type and the packed "
                        "2- and 4-bit types int2, uint2, int4, uint4, float4_e2m1fn)");
}

// The bytes `count` elements of `t` occupy: ceil(count * bits / 8); 0 for a type CheckSized
// refuses. Never more than the buffer XLA allocated, whichever layout the running XLA uses (an XLA
// that stored one sub-byte value per byte would allocate more), so every read or write bounded by
// it stays inside the buffer. Every handler sizes copies and checks with this, never with
// size_bytes().
inline int64_t PackedByteSize(ffi::DataType t, int64_t count) { return (count * ElementBits(t) + 7) / 8; }

inline int64_t PackedByteSize(const ffi::AnyBuffer& b) {
  return PackedByteSize(b.element_type(), ElementCount(b.dimensions()));
}

// "float4_e2m1fn[2, 32] (32 bytes)": a buffer in error messages.
inline std::string BufferString(const ffi::AnyBuffer& b) {
  return DataTypeName(b.element_type()) + DimsString(b.dimensions()) + " (" +
         std::to_string(PackedByteSize(b)) + " bytes)";
}

// A buffer must hold the `need` bytes that sizes derived from attributes say will be accessed:
// the backstop that keeps any attribute value from reading or writing past a buffer.
inline ffi::Error CheckHolds(const ffi::AnyBuffer& b, const char* name, int64_t need) {
  if (ffi::Error e = CheckSized(b, name); e.failure()) return e;
  if (need >= 0 && need <= PackedByteSize(b)) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string(name) + " is " + BufferString(b) +
                                                          ", the call would access " + std::to_string(need) +
                                                          " bytes");
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
