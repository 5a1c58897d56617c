// A status for csrc/ functions: kernels and library wrappers report failures with this,
// never with exceptions or aborts. ffi/common/ffi_util.h turns it into an ffi::Error.
#pragma once

#include <string>
#include <utility>

namespace gpuext {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

}  // namespace gpuext

#define GPUEXT_STRINGIFY_IMPL(x) #x
#define GPUEXT_STRINGIFY(x) GPUEXT_STRINGIFY_IMPL(x)
#define GPUEXT_WHERE __FILE__ ":" GPUEXT_STRINGIFY(__LINE__)

// Returns early from a function returning Status when `expr` (a Status) failed,
// prefixing "file:line: <expr> failed: ".
#define GPUEXT_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                \
    ::gpuext::Status gpuext_status_ = (expr);                                         \
    if (!gpuext_status_.ok())                                                         \
      return ::gpuext::Status::Error(std::string(GPUEXT_WHERE ": " #expr " failed: ") + \
                                     gpuext_status_.message());                      \
  } while (0)
