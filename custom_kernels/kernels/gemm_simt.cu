// Weight-only (scheme 1) CUDA-core GEMM (strategy "gemm_simt", the fallback):
// D[M, N] = act(A[M, K] @ dequant(W)^T + bias), any M.
//
// W is the QuantizedWeight format (int8 [N, K] or interleaved int4 uint8 [N, K/2]).
// Compile-time choice (NVRTC defines): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float; WO_BITS 4 or 8.
//
// Entry point:
//   gemm_simt  any element type, arch, shape and block_size: 64 x 64 tiles, dequantization to fp32
//       in shared memory, 4 x 4 outputs per thread, fp32 arithmetic with the fp32 scale/offset.
//       fp32 activations use this path: a tf32 tensor-core path would round A and W to 10-bit
//       mantissas, losing the precision a caller asks for by passing fp32.
#include "common.cuh"
#include "converters.cuh"

#include "weight_only_types.cuh"

#include "gemm_common.cuh"

namespace cuops {
namespace gemm {

constexpr int kSimtBM = 64, kSimtBN = 64, kSimtBK = 16, kSimtThreads = 256;

template <int kBits>
__device__ __forceinline__ int weight_value(const uint8_t* __restrict__ B, int64_t row_bytes, int n, int k) {
  if constexpr (kBits == 8) {
    return static_cast<int>(reinterpret_cast<const int8_t*>(B)[n * row_bytes + k]);
  } else {
    // Rows are K/2 bytes with K % 8 == 0, so the 32-bit word holding element k is aligned.
    const uint32_t word = __ldg(reinterpret_cast<const uint32_t*>(B + n * row_bytes) + (k >> 3));
    return int4_element(word, k & 7);
  }
}

template <typename T, int kBits>
__device__ __forceinline__ void gemm_simt(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                          const float* __restrict__ scale, const float* __restrict__ offset,
                                          const T* __restrict__ bias, T* __restrict__ D, int M, int N, int K,
                                          int G, int block_size, int block_shift, int act) {
  // Transposed tiles ([k][m], [k][n]) so each thread reads 4 consecutive floats; +4 keeps 16-byte rows.
  __shared__ __align__(16) float As[kSimtBK][kSimtBM + 4];
  __shared__ __align__(16) float Ws[kSimtBK][kSimtBN + 4];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.y * kSimtBM, n0 = blockIdx.x * kSimtBN;
  const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
  const int64_t row_bytes = static_cast<int64_t>(K) * kBits / 8;

  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += kSimtBK) {
#pragma unroll
    for (int i = 0; i < kSimtBM * kSimtBK / kSimtThreads; ++i) {
      const int id = tid + i * kSimtThreads, r = id / kSimtBK, kk = id % kSimtBK;
      const int m = m0 + r, k = k0 + kk;
      As[kk][r] = (m < M && k < K) ? to_float(A[static_cast<int64_t>(m) * K + k]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kSimtBN * kSimtBK / kSimtThreads; ++i) {
      const int id = tid + i * kSimtThreads, r = id / kSimtBK, kk = id % kSimtBK;
      const int n = n0 + r, k = k0 + kk;
      float w = 0.0f;
      if (n < N && k < K) {
        const int64_t sg = static_cast<int64_t>(n) * G + group_of(k, block_size, block_shift);
        w = fmaf(static_cast<float>(weight_value<kBits>(B, row_bytes, n, k)), scale[sg], offset[sg]);
      }
      Ws[kk][r] = w;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSimtBK; ++kk) {
      const float4 a = *reinterpret_cast<const float4*>(&As[kk][tm]);
      const float4 b = *reinterpret_cast<const float4*>(&Ws[kk][tn]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int m = m0 + tm + i, n = n0 + tn + j;
      if (m < M && n < N) D[static_cast<int64_t>(m) * N + n] = from_float<T>(epilogue_value(acc[i][j], bias, n, act));
    }
}

}  // namespace gemm
}  // namespace cuops

using namespace cuops::gemm;

extern "C" __global__ void __launch_bounds__(kSimtThreads) gemm_simt(
    const element_t* A, const uint8_t* B, const float* scale, const float* offset, const element_t* bias,
    element_t* D, int M, int N, int K, int G, int block_size, int block_shift, int act) {
  gemm_simt<element_t, WO_BITS>(A, B, scale, offset, bias, D, M, N, K, G, block_size, block_shift, act);
}
