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
  // PackedByteSize, not size_bytes(): the 0.8.0 headers count a sub-byte element as a byte while
  // XLA packs them, and copying size_bytes() wrote past int4 / float4 results (issue 15).
  GPUEXT_FFI_CHECK(x.dimensions() == out->dimensions(),
                   "operand is " + BufferString(x) + ", result is " + BufferString(*out));
  // A type without a known layout (float6 from jaxlib 0.12) is refused: its size would be a guess,
  // and copying a guessed size returned uninitialised memory (issue 26).
  if (ffi::Error e = CheckSized(x, "operand"); e.failure()) return e;
  GPUEXT_FFI_RETURN_IF_ERROR(PlaceCopyHost(out->untyped_data(), x.untyped_data(), PackedByteSize(x)));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PlaceCpuFfi, PlaceCpuImpl,
                              ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>());

GPUEXT_REGISTER_FFI_TARGET("gpuext_place", PlaceCpuFfi);

}  // namespace gpuext
