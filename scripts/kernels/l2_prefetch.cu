// Benchmark-only kernels (scripts/probe_l2_prefetch.py): bring a later kernel's weights into L2 while
// kernels that leave the memory idle run (a decode step's norms, rope and attention), so that a GEMV
// behind them reads part of its bytes from L2.
//
// Both forms are fire-and-forget: nothing waits for the data, so the kernel ends as soon as every
// request is issued and the memory system keeps filling L2 after it.
#include "common.cuh"  // fixed-width integer types under NVRTC

// One bulk prefetch (the TMA unit walks `chunk` bytes) per thread and chunk; sm_90+.
extern "C" __global__ void prefetch_bulk(const char* __restrict__ src, unsigned long long bytes, uint32_t chunk) {
#if __CUDA_ARCH__ >= 900
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x * chunk;
  for (unsigned long long i = (static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x) * chunk;
       i < bytes; i += stride) {
    const uint32_t n = static_cast<uint32_t>(bytes - i < chunk ? bytes - i : chunk);  // a multiple of 16
    // why asm: the bulk L2 prefetch has no CUDA C++ intrinsic.
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src + i), "r"(n) : "memory");
  }
#endif
}

// One 128-byte line per prefetch instruction, kept with the evict_last priority.
extern "C" __global__ void prefetch_lines(const char* __restrict__ src, unsigned long long bytes) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x * 128ull;
  for (unsigned long long i = (static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x) * 128ull;
       i < bytes; i += stride) {
    // why asm: the L2 prefetch with an eviction priority has no intrinsic.
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(src + i));
  }
}
