// Weight-only (scheme 1) CUDA-core GEMV for small M (strategy "gemv_simt"):
// D[M, N] = act(A[M, K] @ dequant(W)^T + bias).
//
// W is the QuantizedWeight format: int8 [N, K], or int4 u = q + 8 packed in the interleaved
// order, uint8 [N, K/2]. Every weight byte is read once, with 16-byte loads ("chunks" of 32 int4 or
// 16 int8 K elements of one row) that bypass L1, where the re-read activations live.
//
// Compile-time choice (NVRTC defines): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float (the
// activation / output type), WO_BITS 4 or 8.
//
// Entry points:
//   gemv_simt_m{1..8}  any element type and arch: one warp per output row, fp32 arithmetic with
//       the fp32 scale/offset applied per chunk: acc += s * sum(a q) + o * sum(a).
#include "common.cuh"
#include "converters.cuh"
#include "stream_loads.cuh"

#include "gemv_store.cuh"
#include "weight_only_types.cuh"

namespace cuops {
namespace gemv {

// Integer values of one 16-byte chunk as floats, K order (exact: the fp16 converters are exact).
template <int kBits>
__device__ __forceinline__ void chunk_to_floats(const uint4& v, float (&q)[128 / kBits]) {
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    if constexpr (kBits == 4) {
      uint32_t h[4];
      int4s_to_half2x4(word_of(v, x), h);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[p]));
        q[8 * x + 2 * p] = f.x;
        q[8 * x + 2 * p + 1] = f.y;
      }
    } else {
      uint32_t h[2];
      int8s_to_half2x2(word_of(v, x), h);
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[p]));
        q[4 * x + 2 * p] = f.x;
        q[4 * x + 2 * p + 1] = f.y;
      }
    }
  }
}

// n consecutive activations (n a multiple of 4 for float, of 8 for 16-bit types) as floats.
template <typename T, int kCount>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[kCount]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kCount / 4; ++i) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
      out[4 * i] = v.x; out[4 * i + 1] = v.y; out[4 * i + 2] = v.z; out[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCount / 8; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < 8; ++j) out[8 * i + j] = to_float(e[j]);
    }
  }
}

template <typename T, int kBits, int kM>
__device__ __forceinline__ void gemv_simt(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                          const float* __restrict__ scale, const float* __restrict__ offset,
                                          const T* __restrict__ bias, T* __restrict__ D, int N, int K, int G,
                                          int block_size, int act) {
  constexpr int kChunkElems = 128 / kBits;
  constexpr int kUnrollChunks = 4;  // 16-byte weight loads in flight per thread
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warp
  const int chunks = K / kChunkElems;
  const uint8_t* b_row = B + static_cast<int64_t>(n) * K * kBits / 8;

  float acc[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) acc[m] = 0.0f;

  for (int c0 = lane; c0 < chunks; c0 += 32 * kUnrollChunks) {
    uint4 wq[kUnrollChunks];
    float s[kUnrollChunks], o[kUnrollChunks];
#pragma unroll
    for (int u = 0; u < kUnrollChunks; ++u) {
      const int c = c0 + 32 * u;
      const bool valid = c < chunks;
      const int group = valid ? (c * kChunkElems) / block_size : 0;
      wq[u] = valid ? load_stream_16B(b_row + static_cast<int64_t>(c) * 16) : make_uint4(0, 0, 0, 0);
      s[u] = valid ? __ldg(scale + static_cast<int64_t>(n) * G + group) : 0.0f;
      o[u] = valid ? __ldg(offset + static_cast<int64_t>(n) * G + group) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnrollChunks; ++u) {
      const int c = c0 + 32 * u;
      if (c >= chunks) break;
      float q[kChunkElems];
      chunk_to_floats<kBits>(wq[u], q);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        float a[kChunkElems];
        load_floats<T, kChunkElems>(A + static_cast<int64_t>(m) * K + static_cast<int64_t>(c) * kChunkElems, a);
        float dot = 0.0f, sum_a = 0.0f;
#pragma unroll
        for (int e = 0; e < kChunkElems; ++e) {
          dot = fmaf(a[e], q[e], dot);
          sum_a += a[e];
        }
        // w = q * s + o over the chunk (one quantization group): sum a w = s sum(a q) + o sum(a).
        acc[m] = fmaf(s[u], dot, fmaf(o[u], sum_a, acc[m]));
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float v = acc[m];
#pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
    if (lane == 0) store_output(D, static_cast<int64_t>(m) * N + n, v, bias, n, act);
  }
}

}  // namespace gemv
}  // namespace cuops

using namespace cuops::gemv;

#define GEMV_SIMT_ENTRY(M_)                                                                                 \
  extern "C" __global__ void __launch_bounds__(128) gemv_simt_m##M_(                                        \
      const element_t* A, const uint8_t* B, const float* scale, const float* offset, const element_t* bias, \
      element_t* D, int N, int K, int G, int block_size, int act) {                                         \
    gemv_simt<element_t, WO_BITS, M_>(A, B, scale, offset, bias, D, N, K, G, block_size, act);              \
  }
GEMV_SIMT_ENTRY(1)
GEMV_SIMT_ENTRY(2)
GEMV_SIMT_ENTRY(3)
GEMV_SIMT_ENTRY(4)
GEMV_SIMT_ENTRY(5)
GEMV_SIMT_ENTRY(6)
GEMV_SIMT_ENTRY(7)
GEMV_SIMT_ENTRY(8)
