# Block-scaled dot (issue 4): the cuDNN backend (csrc/dot/cudnn_block_scaled.cc + its handler).
#   JAX_GPUEXT_CUDNN               AUTO | ON | OFF   AUTO: build if the headers are found; ON: error if not
#   JAX_GPUEXT_CUDNN_INCLUDE_DIRS  directories searched first for cudnn_frontend.h, cudnn.h, nvrtc.h
# cuDNN is never linked: the frontend is compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING and
# resolves cuDNN through the handle we dlopen (REFERENCE section 4). Only headers are needed:
# pip nvidia-cudnn-frontend (--no-deps; site-packages/include), nvidia-cudnn-cu13/-cu12
# (nvidia/cudnn/include) and nvidia-cuda-nvrtc (nvidia/cu13/include; the frontend includes nvrtc.h,
# which the toolkit on the dev machine lacks). Without them gate `cudnn_dot_built` says why.
set(JAX_GPUEXT_CUDNN "AUTO" CACHE STRING "Build the cuDNN block-scaled dot: AUTO, ON or OFF")
set(JAX_GPUEXT_CUDNN_INCLUDE_DIRS "" CACHE STRING
    "Directories (;-separated) holding cudnn_frontend.h, cudnn.h and nvrtc.h; empty: toolkit + pip wheels")
string(TOUPPER "${JAX_GPUEXT_CUDNN}" _want_cudnn)
if(NOT _want_cudnn MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "jax-gpuext: JAX_GPUEXT_CUDNN must be AUTO, ON or OFF, not '${JAX_GPUEXT_CUDNN}'")
endif()
if(_want_cudnn STREQUAL "OFF")
  gpuext_part_missing(cudnn_dot OFF "built with JAX_GPUEXT_CUDNN=OFF" "reinstall without JAX_GPUEXT_CUDNN=OFF")
  return()
endif()
if(NOT TARGET _cuda)
  if(_want_cudnn STREQUAL "ON")
    message(FATAL_ERROR "jax-gpuext: JAX_GPUEXT_CUDNN=ON needs the CUDA extension (JAX_GPUEXT_CUDA and nvcc)")
  endif()
  return()
endif()

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import sys, os; print(';'.join(os.path.join(p, *s) for p in sys.path if p for s in (('include',), ('nvidia', 'cudnn', 'include'), ('nvidia', 'cu13', 'include'), ('nvidia', 'cuda_nvrtc', 'include'))))"
  OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE _gpuext_cudnn_wheel_includes ERROR_QUIET)
# Explicit dirs first, then the toolkit and pip wheels, then where system packages (apt
# libcudnn9-dev, NGC images, CUDNN_PATH/CUDNN_HOME installs) put cudnn.h.
set(_gpuext_cudnn_hints ${JAX_GPUEXT_CUDNN_INCLUDE_DIRS} ${CUDAToolkit_INCLUDE_DIRS} ${_gpuext_cudnn_wheel_includes}
    "$ENV{CUDNN_PATH}/include" "$ENV{CUDNN_HOME}/include" /usr/include /usr/local/cuda/include)
gpuext_stable_find_path(GPUEXT_CUDNN_FRONTEND_DIR cudnn_frontend_include cudnn_frontend.h ${_gpuext_cudnn_hints})
gpuext_stable_find_path(GPUEXT_CUDNN_HEADER_DIR cudnn_include cudnn.h ${_gpuext_cudnn_hints})
gpuext_stable_find_path(GPUEXT_NVRTC_HEADER_DIR nvrtc_include nvrtc.h ${_gpuext_cudnn_hints})
set(_why "")
if(NOT (GPUEXT_CUDNN_FRONTEND_DIR AND GPUEXT_CUDNN_HEADER_DIR AND GPUEXT_NVRTC_HEADER_DIR))
  set(_why "cudnn_frontend.h: '${GPUEXT_CUDNN_FRONTEND_DIR}', cudnn.h: '${GPUEXT_CUDNN_HEADER_DIR}', nvrtc.h: '${GPUEXT_NVRTC_HEADER_DIR}'")
  gpuext_part_missing(cudnn_dot "${_want_cudnn}" "cuDNN headers missing (${_why})"
    "a plain pip install (build isolation on) adds these headers' wheels to the build by itself when nvcc is found. "
    "With --no-build-isolation, pip install 'nvidia-cudnn-frontend>=1.13,<1.29' nvidia-cudnn-cu13 nvidia-cuda-nvrtc "
    "(CUDA 12: nvidia-cudnn-cu12 nvidia-cuda-nvrtc-cu12) into the build environment first, "
    "or set JAX_GPUEXT_CUDNN_INCLUDE_DIRS")
  return()
endif()
# The per-axis block size vector (set_block_size({1, block}) / ({block, 1}), as NVIDIA's samples
# pass it) first appears in cudnn-frontend 1.13: older headers count as missing.
file(STRINGS "${GPUEXT_CUDNN_FRONTEND_DIR}/cudnn_frontend_version.h" _gpuext_fe_version
     REGEX "#define CUDNN_FRONTEND_(MAJOR|MINOR)_VERSION [0-9]+")
string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*" "\\1" _gpuext_fe_major "${_gpuext_fe_version}")
string(REGEX REPLACE ".*MINOR_VERSION ([0-9]+).*" "\\1" _gpuext_fe_minor "${_gpuext_fe_version}")
if(NOT _gpuext_fe_major MATCHES "^[0-9]+$" OR NOT _gpuext_fe_minor MATCHES "^[0-9]+$"
   OR "${_gpuext_fe_major}.${_gpuext_fe_minor}" VERSION_LESS 1.13)
  gpuext_part_missing(cudnn_dot "${_want_cudnn}"
    "cudnn-frontend ${_gpuext_fe_major}.${_gpuext_fe_minor} in ${GPUEXT_CUDNN_FRONTEND_DIR} is older than 1.13"
    "pip install --no-deps 'nvidia-cudnn-frontend>=1.13,<1.29' in the build environment")
  return()
endif()
message(STATUS "jax-gpuext: cuDNN block-scaled dot with cudnn-frontend ${_gpuext_fe_major}.${_gpuext_fe_minor} from ${GPUEXT_CUDNN_FRONTEND_DIR}")
gpuext_part_built(cudnn_dot "cudnn-frontend ${_gpuext_fe_major}.${_gpuext_fe_minor} from ${GPUEXT_CUDNN_FRONTEND_DIR}, cudnn.h from ${GPUEXT_CUDNN_HEADER_DIR}")

# Its own object library: the frontend headers, their include order and the dynamic-loading
# define stay out of every other _cuda translation unit. Host C++ (g++), never nvcc.
add_library(gpuext_cudnn_dot OBJECT csrc/dot/cudnn_block_scaled.cc)
set_target_properties(gpuext_cudnn_dot PROPERTIES POSITION_INDEPENDENT_CODE ON CXX_STANDARD 17
                      CXX_STANDARD_REQUIRED ON CXX_VISIBILITY_PRESET hidden)
target_compile_definitions(gpuext_cudnn_dot PRIVATE NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
target_include_directories(gpuext_cudnn_dot PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}" ${CUDAToolkit_INCLUDE_DIRS}
                           "${GPUEXT_CUDNN_FRONTEND_DIR}" "${GPUEXT_CUDNN_HEADER_DIR}")
# AFTER: the toolkit's own headers keep precedence over a wheel's copies (nvidia/cu13/include).
target_include_directories(gpuext_cudnn_dot AFTER PRIVATE "${GPUEXT_NVRTC_HEADER_DIR}")
target_sources(_cuda PRIVATE ffi/cuda/block_scaled_dot_cudnn.cc ffi/cuda/cudnn_prepare_binding.cc)
target_link_libraries(_cuda PRIVATE gpuext_cudnn_dot)
