// CUDA handler of gpuext_place (jax_gpuext.place): copies the operand into the result
// buffer, which XLA allocated in the memory space named by results_memory_spaces.
//
// kCmdBufferCompatible (REFERENCE section 2): the handler issues one cudaMemcpyAsync whose
// size depends only on the (static) shape, on the given stream, touches only its two
// buffers, never allocates, synchronises or queries the stream, and keeps no host state.
// The operand is not aliased to the result (docs/design.md), so dst != src on every call
// and the recorded graph always holds the same memcpy node.
#include <cuda_runtime_api.h>

#include "csrc/memory/place_cuda.h"
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"

namespace gpuext {
namespace {

ffi::Error PlaceCudaImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  NvtxRange range("gpuext_place");
  GPUEXT_COUNT_EXECUTE("gpuext_place", stream);
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
  GPUEXT_FFI_RETURN_IF_ERROR(
      PlaceCopyDevice(out->untyped_data(), x.untyped_data(), PackedByteSize(x), stream));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PlaceCudaFfi, PlaceCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_TARGET("gpuext_place", PlaceCudaFfi);

}  // namespace gpuext
