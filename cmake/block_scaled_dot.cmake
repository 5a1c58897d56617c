# Block-scaled dot (issue 4): the cuBLASLt backend's sources, added to _cuda when cublasLt.h is
# found. cuBLASLt is never linked (csrc/dot/cublaslt_api.h dlopens it), so only the header is
# needed; without it _cuda still builds and the gate `cublaslt_dot_built` says why the backend
# is missing. Search order: JAX_GPUEXT_CUBLASLT_INCLUDE_DIR, the CUDA toolkit, then the pip
# wheels nvidia-cublas (CUDA 13: nvidia/cu13/include) / nvidia-cublas-cu12 (nvidia/cublas/include).
set(JAX_GPUEXT_CUBLASLT_INCLUDE_DIR "" CACHE PATH "Directory holding cublasLt.h (empty: search)")

if(TARGET _cuda)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import sys, os; print(';'.join(os.path.join(p, 'nvidia', s, 'include') for p in sys.path if p for s in ('cu13', 'cublas')))"
    OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE _gpuext_wheel_includes ERROR_QUIET)
  find_path(GPUEXT_CUBLASLT_HEADER_DIR cublasLt.h
    HINTS ${JAX_GPUEXT_CUBLASLT_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS} ${_gpuext_wheel_includes}
    NO_DEFAULT_PATH)
  if(GPUEXT_CUBLASLT_HEADER_DIR)
    message(STATUS "jax-gpuext: cuBLASLt block-scaled dot with cublasLt.h from ${GPUEXT_CUBLASLT_HEADER_DIR}")
    target_sources(_cuda PRIVATE
      csrc/dot/cublaslt_api.cc
      csrc/dot/cublaslt_block_scaled.cc
      ffi/cuda/block_scaled_dot_cublaslt.cc
      ffi/cuda/cublaslt_prepare_binding.cc)
    # AFTER: the toolkit's own headers (cuda_fp16.h, library_types.h) keep precedence over a wheel's.
    target_include_directories(_cuda AFTER PRIVATE "${GPUEXT_CUBLASLT_HEADER_DIR}")
  else()
    message(STATUS "jax-gpuext: no cublasLt.h found; building _cuda without the cuBLASLt block-scaled dot "
                   "(pip install nvidia-cublas in the build environment, or set JAX_GPUEXT_CUBLASLT_INCLUDE_DIR)")
  endif()
endif()
