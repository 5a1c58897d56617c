# hopper_mx: our sm_90a block-scaled FP8 matmul (docs/design.md, "hopper_mx"), and ragged_dot's
# grouped FP8 blockwise kernel built on it (csrc/ragged_dot/hopper_grouped*, issue 30).
#
# The handler and the host-side validation are part of _cuda in every CUDA build. The kernel
# (csrc/hopper_mx/hopper_mx.cu: wgmma, TMA) exists only for sm_90a, so it lives in its own object
# library compiled for 90a-real alone, and only when the architecture list asks for Hopper's
# arch-specific target; the sm_80 / sm_100a / compute_80 passes of _cuda never see it. Without it
# the handler returns an error naming the missing architecture, and Python's supports() rejects
# the backend before that (build_info()["architectures"] lacks 90a). Raw PTX: no CUTLASS needed.
if(NOT GPUEXT_BUILD_CUDA)
  return()
endif()

target_sources(_cuda PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/hopper_mx/hopper_mx_host.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/ffi/cuda/hopper_mx.cc
  # ragged_dot's grouped kernel (issue 30): the same machinery, built and gated the same way
  ${CMAKE_CURRENT_SOURCE_DIR}/csrc/ragged_dot/hopper_grouped_host.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/ffi/cuda/ragged_dot_hopper.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/ffi/cuda/ragged_dot_hopper_binding.cc)

set(_gpuext_hmx_sm90a OFF)
foreach(_arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
  if(_arch MATCHES "^90a")
    set(_gpuext_hmx_sm90a ON)
  endif()
endforeach()

if(_gpuext_hmx_sm90a)
  add_library(gpuext_hopper_mx OBJECT ${CMAKE_CURRENT_SOURCE_DIR}/csrc/hopper_mx/hopper_mx.cu
                                      ${CMAKE_CURRENT_SOURCE_DIR}/csrc/ragged_dot/hopper_grouped.cu)
  set_target_properties(gpuext_hopper_mx PROPERTIES
    CUDA_ARCHITECTURES 90a-real
    POSITION_INDEPENDENT_CODE ON
    CUDA_RUNTIME_LIBRARY Static)
  target_include_directories(gpuext_hopper_mx PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(gpuext_hopper_mx PRIVATE CUDA::cudart_static)
  target_sources(_cuda PRIVATE $<TARGET_OBJECTS:gpuext_hopper_mx>)
  target_compile_definitions(_cuda PRIVATE GPUEXT_HAVE_HOPPER_MX=1)
  message(STATUS "jax-gpuext: hopper_mx kernel built for sm_90a")
else()
  message(STATUS "jax-gpuext: hopper_mx kernel skipped (no 90a in ${CMAKE_CUDA_ARCHITECTURES})")
endif()
