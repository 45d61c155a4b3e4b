// llama.cpp-style MMVQ for int8 weights: the activations are quantized to int8 blocks of 32
// (q8_1: symmetric, d = amax / 127, plus the block's float sum), then each 32-block dot product
// runs as integer __dp4a (4 int8 products + int32 add per instruction) and is scaled once.
//
//   D[m, n] = act( sum_b  s_w * d_b * sum_{k in b} qa_k qw_k  +  o_w * sum_{k in b} x_k  + bias[n] )
//
// with (s_w, o_w) the weight's fp32 (scale, offset) of the group holding block b. The offset term
// uses the exact float sum of the activations, so only the scale term sees activation rounding.
// The result differs from the fp16/fp32 kernels by that rounding (|x - d qa| <= d / 2 per element):
// an approximation chosen explicitly (strategy "gemv_dp4a"), never by default.
//
// Compile-time choice: WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float (activations and output).
// Entry points: quantize_q8_1 (activations -> q8_1) and gemv_dp4a_m{1..8} (int8 weights,
// block_size a multiple of 32, K a multiple of 32).
#include "common.cuh"
#include "stream_loads.cuh"

#include "weight_only_types.cuh"

namespace cuops {
namespace dp4a {

constexpr int kQBlock = 32;  // activation quantization block (QK8_1)

// One warp per 32-block: lane i quantizes element i. Grid (ceil(K/32 / warps), M).
template <typename T>
__device__ __forceinline__ void quantize_q8_1(const T* __restrict__ x, int8_t* __restrict__ xq,
                                              float* __restrict__ d_out, float* __restrict__ sum_out, int K) {
  const int lane = threadIdx.x & 31;
  const int blocks = K / kQBlock;
  const int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (b >= blocks) return;
  const int m = blockIdx.y;
  const int64_t i = static_cast<int64_t>(m) * K + b * kQBlock + lane;
  const float v = to_float(x[i]);
  float amax = fabsf(v), sum = v;
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, mask));
    sum += __shfl_xor_sync(0xffffffffu, sum, mask);
  }
  const float d = amax / 127.0f;
  // |v / d| <= 127 (up to one rounding), so rintf (round half to even) stays within int8.
  xq[i] = static_cast<int8_t>(d == 0.0f ? 0 : static_cast<int>(rintf(v / d)));
  if (lane == 0) {
    d_out[static_cast<int64_t>(m) * blocks + b] = d;
    sum_out[static_cast<int64_t>(m) * blocks + b] = sum;
  }
}

// One warp per weight row n; lane handles 16-byte chunks c = lane + 32 i (half a q8 block each).
template <typename T, int kM>
__device__ __forceinline__ void gemv_dp4a(const int8_t* __restrict__ xq, const float* __restrict__ xd,
                                          const float* __restrict__ xsum, const int8_t* __restrict__ B,
                                          const float* __restrict__ scale, const float* __restrict__ offset,
                                          const T* __restrict__ bias, T* __restrict__ D, int N, int K, int G,
                                          int block_size, int act) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warp
  const int chunks = K / 16, blocks = K / kQBlock;
  const int8_t* b_row = B + static_cast<int64_t>(n) * K;

  float acc[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) acc[m] = 0.0f;

  for (int c = lane; c < chunks; c += 32) {
    const uint4 w = load_stream_16B(b_row + static_cast<int64_t>(c) * 16);
    const int64_t sg = static_cast<int64_t>(n) * G + (c * 16) / block_size;
    const float s = __ldg(scale + sg), o = __ldg(offset + sg);
    const int b = c >> 1;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(xq + static_cast<int64_t>(m) * K) + c);
      int dot = __dp4a(static_cast<int>(w.x), static_cast<int>(a.x), 0);
      dot = __dp4a(static_cast<int>(w.y), static_cast<int>(a.y), dot);
      dot = __dp4a(static_cast<int>(w.z), static_cast<int>(a.z), dot);
      dot = __dp4a(static_cast<int>(w.w), static_cast<int>(a.w), dot);
      const int64_t ib = static_cast<int64_t>(m) * blocks + b;
      acc[m] = fmaf(s * __ldg(xd + ib), static_cast<float>(dot), acc[m]);
      // The block's offset term once, from its even half.
      if ((c & 1) == 0) acc[m] = fmaf(o, __ldg(xsum + ib), acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float v = acc[m];
#pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
    if (lane == 0) {
      if (bias != nullptr) v += to_float(bias[n]);
      D[static_cast<int64_t>(m) * N + n] = from_float<T>(apply_activation(v, act));
    }
  }
}

}  // namespace dp4a
}  // namespace cuops

extern "C" __global__ void quantize_q8_1(const element_t* x, int8_t* xq, float* d, float* sum, int K) {
  cuops::dp4a::quantize_q8_1<element_t>(x, xq, d, sum, K);
}

#define GEMV_DP4A_ENTRY(M_)                                                                                      \
  extern "C" __global__ void __launch_bounds__(128) gemv_dp4a_m##M_(                                             \
      const int8_t* xq, const float* xd, const float* xsum, const int8_t* B, const float* scale,                  \
      const float* offset, const element_t* bias, element_t* D, int N, int K, int G, int block_size, int act) {   \
    cuops::dp4a::gemv_dp4a<element_t, M_>(xq, xd, xsum, B, scale, offset, bias, D, N, K, G, block_size, act);   \
  }
GEMV_DP4A_ENTRY(1)
GEMV_DP4A_ENTRY(2)
GEMV_DP4A_ENTRY(3)
GEMV_DP4A_ENTRY(4)
GEMV_DP4A_ENTRY(5)
GEMV_DP4A_ENTRY(6)
GEMV_DP4A_ENTRY(7)
GEMV_DP4A_ENTRY(8)
