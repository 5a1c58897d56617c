# Block-scaled dot (issue 4): the cuBLASLt backend's sources, added to _cuda when cublasLt.h is
# found. The grouped (ragged) dot of issue 30 comes with them: it needs no newer header (the
# grouped entry point of cuBLAS >= 13.2 is resolved at run time, and gated), so one part, one
# record in build_parts.json. cuBLASLt is never linked (csrc/dot/cublaslt_api.h dlopens it), so
# only the header is needed; without it _cuda still builds and the gates `cublaslt_dot_built` /
# `ragged_dot_cublaslt_built` say why the backends are missing. Search order:
# JAX_GPUEXT_CUBLASLT_INCLUDE_DIR, the CUDA toolkit, then the pip wheels nvidia-cublas (CUDA 13:
# nvidia/cu13/include) / nvidia-cublas-cu12 (nvidia/cublas/include).
set(JAX_GPUEXT_CUBLASLT_INCLUDE_DIR "" CACHE PATH "Directory holding cublasLt.h (empty: search)")

if(TARGET _cuda)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import sys, os; print(';'.join(os.path.join(p, 'nvidia', s, 'include') for p in sys.path if p for s in ('cu13', 'cublas')))"
    OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE _gpuext_wheel_includes ERROR_QUIET)
  gpuext_stable_find_path(GPUEXT_CUBLASLT_HEADER_DIR cublaslt_include cublasLt.h
    ${JAX_GPUEXT_CUBLASLT_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS} ${_gpuext_wheel_includes})
  if(GPUEXT_CUBLASLT_HEADER_DIR)
    message(STATUS "jax-gpuext: cuBLASLt block-scaled dot with cublasLt.h from ${GPUEXT_CUBLASLT_HEADER_DIR}")
    set(_gpuext_cublaslt_sources
      csrc/dot/cublaslt_api.cc
      csrc/dot/cublaslt_block_scaled.cc
      ffi/cuda/block_scaled_dot_cublaslt.cc
      ffi/cuda/cublaslt_prepare_binding.cc
      # ragged_dot (issue 30): cuBLASLt's grouped GEMM with device-side group sizes
      csrc/ragged_dot/cublaslt_grouped.cc
      ffi/cuda/ragged_dot_cublaslt.cc
      ffi/cuda/ragged_dot_cublaslt_prepare.cc)
    target_sources(_cuda PRIVATE ${_gpuext_cublaslt_sources})
    # Only these host files see the header's directory: a wheel's nvidia/cu13/include also holds
    # what other wheels of the build environment put there (a newer CCCL, nvrtc.h), which must not
    # shadow the toolkit's own headers in _cuda's nvcc-compiled kernels. (Source-level include
    # directories come after the target's, so the toolkit's keep precedence here too.)
    set_source_files_properties(${_gpuext_cublaslt_sources}
      PROPERTIES INCLUDE_DIRECTORIES "${GPUEXT_CUBLASLT_HEADER_DIR}")
    gpuext_part_built(cublaslt_dot "cublasLt.h from ${GPUEXT_CUBLASLT_HEADER_DIR} (block-scaled and grouped dots)")
  else()
    gpuext_part_missing(cublaslt_dot ""
      "no cublasLt.h in JAX_GPUEXT_CUBLASLT_INCLUDE_DIR, the CUDA toolkit or the build environment's nvidia-cublas wheel"
      "a plain pip install (build isolation on) adds nvidia-cublas to the build by itself when nvcc is found. "
      "With --no-build-isolation, pip install 'nvidia-cublas>=13.0,<14' (CUDA 12: 'nvidia-cublas-cu12>=12.9,<13') "
      "into the build environment first, or set JAX_GPUEXT_CUBLASLT_INCLUDE_DIR")
  endif()
endif()
