// Shared-memory staging helpers of the tensor-core weight-only kernels (gemm_mma.cu, gemm_small_m.cu, gemm_wgmma.cu):
// cp.async copies global -> shared (sm_80+) and vector loads from shared memory by 32-bit address.
#pragma once

#include "common.cuh"
#include "mma_sync.cuh"  // WO_HAS_SM80

namespace cuops {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared, L2 only (.cg: the data is reused from shared memory, not L1);
// src_bytes = 0 writes 16 zero bytes without reading (tails past M, N or K).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
#if WO_HAS_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#endif
}

// 4-byte async copy (.ca: .cg takes 16 bytes only).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
#if WO_HAS_SM80
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
#endif
}

// The same with zero fill: src_bytes = 0 writes 4 zero bytes without reading.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
#if WO_HAS_SM80
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if WO_HAS_SM80
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if WO_HAS_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

}  // namespace cuops
