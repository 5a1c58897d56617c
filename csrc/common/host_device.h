// GPUEXT_HD marks small functions shared by host C++ (g++) and CUDA kernels (nvcc), so CPU
// handlers and GPU kernels run literally the same arithmetic.
#pragma once

#if defined(__CUDACC__)
#define GPUEXT_HD __host__ __device__ __forceinline__
#else
#define GPUEXT_HD inline
#endif
