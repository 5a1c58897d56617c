// CPU handler of gpuext_place (jax_gpuext.place). XLA's CPU runtime has no collective or
// temp memory spaces; the Python lowering never annotates CPU calls, so this is a plain
// identity copy that keeps place() usable (and testable) on every platform.
#include "csrc/memory/place.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/registry.h"

namespace gpuext {
namespace {

ffi::Error PlaceCpuImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  GPUEXT_FFI_CHECK(x.element_type() == out->element_type(),
                   std::string("operand is ") + DataTypeName(x.element_type()) + ", result is " +
                       DataTypeName(out->element_type()));
  GPUEXT_FFI_CHECK(x.size_bytes() == out->size_bytes(),
                   "operand has " + std::to_string(x.size_bytes()) + " bytes, result " +
                       std::to_string(out->size_bytes()));
  GPUEXT_FFI_RETURN_IF_ERROR(PlaceCopyHost(out->untyped_data(), x.untyped_data(), x.size_bytes()));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PlaceCpuFfi, PlaceCpuImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

GPUEXT_REGISTER_FFI_TARGET("gpuext_place", PlaceCpuFfi);

}  // namespace gpuext
