// Streaming global loads of weights that are read exactly once (GEMV, dequantization), and the
// word accessor of a 16-byte load.
#pragma once

#include "common.cuh"

namespace cuops {

// L2 eviction policy (sm_80+): evict the streamed weights first, so that what is re-read (the
// activations, or a freshly written W) stays in L2. Create it once per thread.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// 16-byte load: read-only path, no L1 allocation (each byte is used once), L2 policy above on sm_80+.
__device__ __forceinline__ uint4 load_stream_16B_hint(const void* p, uint64_t policy) {
  uint4 v;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
#endif
  return v;
}

// 16-byte weight load: read-only path, no L1 allocation (each byte is used exactly once).
// volatile keeps a trip's loads ahead of its (volatile) mma in the PTX; ptxas may still interleave.
__device__ __forceinline__ uint4 load_stream_16B(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// 32-bit word i (0..3) of a 16-byte load.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

}  // namespace cuops
