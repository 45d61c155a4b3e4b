// Programmatic dependent launch (sm_90+) for the small copy kernels around the int8 GEMMs (pad_rows,
// unpad_rows), and the loads they make of what the grid before them wrote.
#pragma once

#include "common.cuh"

namespace cuops {

// Wait for the grid this one depends on (a no-op unless launched as a programmatic dependent), then let the
// next grid launch: a trigger before the wait would let a chain of dependents hold SMs in waiting blocks
// (gemv_mma.cu measured that under CUDA graphs).
__device__ __forceinline__ void pdl_wait_then_release() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Loads of data the previous grid wrote: volatile asm, so they stay below the (volatile) wait, and coherent
// ld.global, since the non-coherent path returned a previous grid's data on an H100 (gemv_mma.cu).
__device__ __forceinline__ uint8_t load_u8_after_wait(const uint8_t* a) {
  unsigned short v;
  asm volatile("ld.global.u8 %0, [%1];" : "=h"(v) : "l"(a));
  return static_cast<uint8_t>(v);
}
__device__ __forceinline__ uint16_t load_u16_after_wait(const uint8_t* a) {
  uint16_t v;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(a));
  return v;
}
__device__ __forceinline__ uint32_t load_u32_after_wait(const uint8_t* a) {
  uint32_t v;
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(a));
  return v;
}
__device__ __forceinline__ uint2 load_v2_after_wait(const uint8_t* a) {
  uint2 v;
  asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(a));
  return v;
}
__device__ __forceinline__ uint4 load_v4_after_wait(const uint8_t* a) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(a));
  return v;
}

}  // namespace cuops
