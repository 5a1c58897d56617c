# NVSHMEM all-reduce (issue 6): builds jax_gpuext._nvshmem when the CUDA extension is built
# and NVSHMEM's headers and libnvshmem_device.a are found.
#   JAX_GPUEXT_NVSHMEM   AUTO | ON | OFF   AUTO: build if found; ON: not found is an error
#   JAX_GPUEXT_NVSHMEM_HOME                 NVSHMEM root (include/, lib/); empty = pip package
set(JAX_GPUEXT_NVSHMEM "AUTO" CACHE STRING "Build the NVSHMEM all-reduce module: AUTO, ON or OFF")
set(JAX_GPUEXT_NVSHMEM_HOME "" CACHE PATH "NVSHMEM root; empty: the nvidia-nvshmem-cu13/-cu12 pip package")
string(TOUPPER "${JAX_GPUEXT_NVSHMEM}" _want_nvshmem)
if(NOT _want_nvshmem MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "jax-gpuext: JAX_GPUEXT_NVSHMEM must be AUTO, ON or OFF, not '${JAX_GPUEXT_NVSHMEM}'")
endif()
if(_want_nvshmem STREQUAL "OFF")
  gpuext_part_missing(nvshmem_allreduce OFF "built with JAX_GPUEXT_NVSHMEM=OFF" "reinstall without JAX_GPUEXT_NVSHMEM=OFF")
  return()
endif()
if(NOT GPUEXT_BUILD_CUDA)
  if(_want_nvshmem STREQUAL "ON")
    message(FATAL_ERROR "jax-gpuext: JAX_GPUEXT_NVSHMEM=ON needs the CUDA extension (JAX_GPUEXT_CUDA and nvcc)")
  endif()
  return()
endif()

# Where NVSHMEM is: an explicit root, else the pip package of the build environment.
set(_nvshmem_root "${JAX_GPUEXT_NVSHMEM_HOME}")
if(NOT _nvshmem_root)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import nvidia.nvshmem as m; print(list(m.__path__)[0])"
    OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE _nvshmem_root RESULT_VARIABLE _nvshmem_rc ERROR_QUIET)
  if(NOT _nvshmem_rc EQUAL 0)
    set(_nvshmem_root "")
  endif()
endif()
if(_nvshmem_root)
  gpuext_stable_dir(_nvshmem_root "${_nvshmem_root}" nvshmem)  # headers and libnvshmem_device.a
endif()
set(_nvshmem_inc "${_nvshmem_root}/include")
set(_nvshmem_dev "${_nvshmem_root}/lib/libnvshmem_device.a")
set(_nvshmem_host "${_nvshmem_root}/lib/libnvshmem_host.so.3")
if(NOT _nvshmem_root OR NOT EXISTS "${_nvshmem_inc}/nvshmem.h" OR NOT EXISTS "${_nvshmem_dev}" OR NOT EXISTS "${_nvshmem_host}")
  set(_why "NVSHMEM not found (looked in '${_nvshmem_root}': need include/nvshmem.h, lib/libnvshmem_device.a, lib/libnvshmem_host.so.3)")
  gpuext_part_missing(nvshmem_allreduce "${_want_nvshmem}" "${_why}"
    "a plain pip install (build isolation on) adds nvidia-nvshmem-cu13==3.4.5 (CUDA 12: -cu12) to the build "
    "by itself when nvcc is found. With --no-build-isolation, pip install it into the build environment "
    "first, or set JAX_GPUEXT_NVSHMEM_HOME")
  return()
endif()
file(STRINGS "${_nvshmem_inc}/non_abi/nvshmem_version.h" _nv_ver REGEX "define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION")
string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*MINOR_VERSION ([0-9]+).*PATCH_VERSION ([0-9]+).*" "\\1.\\2.\\3"
       _nvshmem_version "${_nv_ver}")
message(STATUS "jax-gpuext: NVSHMEM ${_nvshmem_version} from ${_nvshmem_root}")

# NVSHMEM's device API needs relocatable device code and a device link against
# libnvshmem_device.a. Kept in its own static library so no other kernel pays for -rdc.
add_library(gpuext_nvshmem_rdc STATIC
  csrc/allreduce/nvshmem_allreduce.cu
  csrc/allreduce/nvshmem_bootstrap.cu)
set_target_properties(gpuext_nvshmem_rdc PROPERTIES
  CUDA_SEPARABLE_COMPILATION ON
  CUDA_RESOLVE_DEVICE_SYMBOLS ON
  POSITION_INDEPENDENT_CODE ON
  CUDA_RUNTIME_LIBRARY Static)
target_include_directories(gpuext_nvshmem_rdc PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}" "${_nvshmem_inc}")
target_link_libraries(gpuext_nvshmem_rdc PRIVATE "${_nvshmem_dev}" CUDA::cudart_static)

nanobind_add_module(_nvshmem NB_STATIC NOMINSIZE
  ffi/common/registry.cc
  ffi/nvshmem_module.cc
  ffi/cuda/allreduce.cc)
target_include_directories(_nvshmem PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}" "${JAX_GPUEXT_FFI_INCLUDE_DIR}")
# The host half of libnvshmem_device.a (nvshmemi_init_thread) calls into libnvshmem_host.so.3:
# only this module links it. Python loads it first from the pip wheel (RTLD_GLOBAL), and the
# rpath covers a plain import next to the wheel's site-packages.
target_link_libraries(_nvshmem PRIVATE gpuext_nvshmem_rdc "${_nvshmem_dev}" "${_nvshmem_host}"
                      CUDA::cudart_static CUDA::nvtx3 ${CMAKE_DL_LIBS})
set_target_properties(_nvshmem PROPERTIES INSTALL_RPATH "$ORIGIN/../nvidia/nvshmem/lib")
target_compile_definitions(_nvshmem PRIVATE GPUEXT_NVSHMEM_VERSION_STRING="${_nvshmem_version}")
target_link_options(_nvshmem PRIVATE "-Wl,--version-script=${JAX_GPUEXT_EXPORTS}")
install(TARGETS _nvshmem LIBRARY DESTINATION jax_gpuext)
gpuext_part_built(nvshmem_allreduce "_nvshmem against NVSHMEM ${_nvshmem_version} from ${_nvshmem_root}"
                  VERSION "${_nvshmem_version}")
