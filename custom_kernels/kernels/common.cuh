// Shared helpers for the raw kernels: fixed-width types under NVRTC and nvcc, UP_DIV,
// activation clamps. Every kernel source includes this first.
#pragma once

#ifdef __CUDACC_RTC__
// NVRTC ships no <cstdint>; these match the LP64 definitions nvcc's headers use.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#endif

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define UP_DIV(x, y) (((x) + (y) - 1) / (y))

namespace cuops {

// Activation codes shared with Python: 0 = none, 1 = relu, 2 = relu6.
enum Activation : int { kActNone = 0, kActRelu = 1, kActRelu6 = 2 };

__device__ __forceinline__ float apply_activation(float v, int act) {
  if (act == kActRelu) return fmaxf(v, 0.0f);
  if (act == kActRelu6) return fminf(fmaxf(v, 0.0f), 6.0f);
  return v;
}

// Whole-warp butterfly reductions (all 32 lanes take part): every lane ends with the result. Floating
// min / max are fminf / fmaxf (fmin / fmax in double): a NaN lane is dropped unless all lanes are NaN.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_min(float v) {
  return warp_reduce(v, [](float a, float b) { return fminf(a, b); });
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}
__device__ __forceinline__ double warp_min(double v) {
  return warp_reduce(v, [](double a, double b) { return fmin(a, b); });
}
__device__ __forceinline__ double warp_max(double v) {
  return warp_reduce(v, [](double a, double b) { return fmax(a, b); });
}
__device__ __forceinline__ int warp_min(int v) { return warp_reduce(v, [](int a, int b) { return min(a, b); }); }
__device__ __forceinline__ unsigned warp_max(unsigned v) {
  return warp_reduce(v, [](unsigned a, unsigned b) { return max(a, b); });
}
__device__ __forceinline__ int warp_sum(int v) { return warp_reduce(v, [](int a, int b) { return a + b; }); }
__device__ __forceinline__ int warp_or(int v) { return warp_reduce(v, [](int a, int b) { return a | b; }); }

// Element <-> float conversion for the three activation types.
template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

}  // namespace cuops
