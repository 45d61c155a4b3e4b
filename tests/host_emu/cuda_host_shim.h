// Just enough of the CUDA execution model to run a kernel's source on the CPU (tests only): one std::thread
// per CUDA thread of a block, blocks one after another, __syncthreads as a std::barrier. Compiled by a host
// C++ compiler (g++), where CUDA's headers define __device__ / __shared__ to nothing; built with
// -fsanitize=address, every global and shared-memory access out of its buffer is reported.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <vector_functions.h>

#include <barrier>
#include <cmath>
#include <cstdlib>

#define __launch_bounds__(...)

namespace emu {
inline std::barrier<>* block_barrier = nullptr;  // the running block's
}  // namespace emu

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
// Warp shuffles need the lanes of a warp in lockstep, which one std::thread per lane does not give:
// common.cuh's warp reductions compile, and abort if a kernel run here ever calls them.
template <typename T>
T __shfl_xor_sync(unsigned, T, int) {
  std::abort();
}
