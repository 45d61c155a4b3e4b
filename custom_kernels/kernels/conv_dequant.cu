// Dequantization of a conv weight to the dense weight cuDNN takes (the conv strategy "dequant_cudnn":
// dequantize, then one cuDNN convolution, like "dequant_cublas" for linears at large M). At batch the
// conv is bound by its tensor-core math, not by the weight bytes, so the weight's size no longer sets
// the time and cuDNN's NHWC kernels win; the weight is a few MB at most.
//
//   W[co, k] = q[co, k] * scale[co, k / block_size] + offset[co, k / block_size]   (fp32, one fma, one rounding)
//
// k runs over the stored order (kh, kw, c) of K = Kh*Kw*Cg (weight layout: conv_common.cuh). Output:
//   nhwc: W [Co, Kh, Kw, Cg] contiguous = the channels_last [Co, Cg, Kh, Kw] cuDNN's NHWC kernels read;
//   nchw: W [Co, Cg, Kh, Kw] contiguous, for an NCHW input (a channels_last weight would make torch run
//         the conv in channels_last and return a channels_last output).
// The first version (one thread per element, a 64-bit division of the flat index) was instruction-bound:
// 11.7 us for 2.4 M elements on an H200. Two entry points per (dtype, bits, layout):
//   conv_dequant8_*: one thread per 8 consecutive k, flat over the weight (K % 8 == 0, block_size % 8 == 0,
//     qweight 4-byte aligned): one or two 32-bit weight loads, the lop3 / prmt converters (exact
//     integers), one (scale, offset) pair, and for nhwc one 16-byte store per 8 fp16 / bf16 outputs (two
//     for fp32); 1D grid-stride;
//   conv_dequant_*: one thread per element (byte loads), any K and block size (stems: K = 147); grid
//     (x over the row, y over the output channels), so no thread divides a flat index.
// Each NVRTC build takes one (dtype, bits) slice of the file (CUOPS_CONV_T / CUOPS_CONV_BITS).
#include "conv_common.cuh"
#include "converters.cuh"

namespace cuops {
namespace conv {

// Destination of element (co, k) of a row: nhwc keeps the stored order, nchw puts k = tap * Cg + c at c * taps + tap.
template <bool NCHW>
__device__ __forceinline__ int dst_of(int k, int Cg, int taps) {
  if (!NCHW) return k;
  const int tap = k / Cg;
  return (k - tap * Cg) * taps + tap;
}

template <typename T, int BITS, bool NCHW>
__device__ __forceinline__ void conv_dequant(const uint8_t* __restrict__ qweight, const float* __restrict__ scale,
                                             const float* __restrict__ offset, T* __restrict__ W, int Co, int K,
                                             int Cg, int taps, int block_size) {
  const int G = K / block_size;
  const size_t w_row_bytes = row_bytes<BITS>(K);
  for (int co = blockIdx.y; co < Co; co += gridDim.y) {
    const uint8_t* row = qweight + co * w_row_bytes;
    T* out = W + static_cast<size_t>(co) * K;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < K; k += gridDim.x * blockDim.x) {
      const int g = k / block_size;
      const float w = fmaf(static_cast<float>(load_q<BITS>(row, k)), scale[static_cast<size_t>(co) * G + g],
                           offset[static_cast<size_t>(co) * G + g]);
      out[dst_of<NCHW>(k, Cg, taps)] = from_float<T>(w);
    }
  }
}

template <typename T, int BITS, bool NCHW>
__device__ __forceinline__ void conv_dequant8(const uint8_t* __restrict__ qweight, const float* __restrict__ scale,
                                              const float* __restrict__ offset, T* __restrict__ W, int Co, int K,
                                              int Cg, int taps, int block_size) {
  // Flat over the Co * K / 8 chunks (one 32-bit division per 8 elements), so that short rows (a 1x1 conv of
  // 512 channels has 64 chunks per row) still fill whole blocks. The host keeps Co * K < 2^31.
  const int G = K / block_size, chunks = K / 8, total = Co * chunks;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(qweight);
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
    const int co = t / chunks, c = t - co * chunks;
    const int k0 = 8 * c;
    T* out = W + static_cast<size_t>(co) * K;
    const int g = k0 / block_size;  // block_size % 8 == 0: one block per chunk
    const float s = scale[static_cast<size_t>(co) * G + g], o = offset[static_cast<size_t>(co) * G + g];
    float q[8];  // rows hold K * BITS / 32 words: chunk t is word t (int4) or words 2t, 2t + 1 (int8)
    if constexpr (BITS == 4) {
      word_to_floats<4>(words[t], q);
    } else {
      float lo[4], hi[4];
      word_to_floats<8>(words[2 * static_cast<size_t>(t)], lo);
      word_to_floats<8>(words[2 * static_cast<size_t>(t) + 1], hi);
#pragma unroll
      for (int j = 0; j < 4; ++j) q[j] = lo[j], q[j + 4] = hi[j];
    }
    if constexpr (!NCHW && sizeof(T) == 2) {
      uint32_t packed[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        T pair[2] = {from_float<T>(fmaf(q[2 * p], s, o)), from_float<T>(fmaf(q[2 * p + 1], s, o))};
        packed[p] = *reinterpret_cast<const uint32_t*>(pair);
      }
      *reinterpret_cast<uint4*>(out + k0) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    } else if constexpr (!NCHW) {
      float4* dst = reinterpret_cast<float4*>(out + k0);
      dst[0] = make_float4(fmaf(q[0], s, o), fmaf(q[1], s, o), fmaf(q[2], s, o), fmaf(q[3], s, o));
      dst[1] = make_float4(fmaf(q[4], s, o), fmaf(q[5], s, o), fmaf(q[6], s, o), fmaf(q[7], s, o));
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) out[dst_of<true>(k0 + j, Cg, taps)] = from_float<T>(fmaf(q[j], s, o));
    }
  }
}

// The conv's epilogue after cuDNN, in place on an NHWC output viewed as [M = batch*Oh*Ow, Co]:
// y = act(y + bias[co]), 8 consecutive channels per thread (one 16-byte load and store for fp16 / bf16,
// two for fp32; Co % 8 == 0, y 16-byte aligned), flat over M * Co / 8 (the host keeps it < 2^31). Rounds
// like torch's add then relu: the sum in fp32, one rounding (relu / relu6 commute with it). Torch's own
// broadcast add of a [1, Co, 1, 1] bias on a channels_last output runs its generic strided kernel:
// 17 us per ResNet-50 layer at batch 32 on an H200, 0.9 ms of a 2.4 ms forward pass.
template <typename T>
__device__ __forceinline__ void conv_bias_act_nhwc(T* __restrict__ y, const T* __restrict__ bias, int M, int Co,
                                                   int act) {
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte vector
  const int chunks = Co / 8, total = M * chunks;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
    const int c0 = 8 * (t - (t / chunks) * chunks);
    uint4* v = reinterpret_cast<uint4*>(y + static_cast<size_t>(t) * 8);
#pragma unroll
    for (int h = 0; h < 8 / kVec; ++h) {
      uint4 word = v[h];
      T* e = reinterpret_cast<T*>(&word);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float f = to_float<T>(e[j]);
        if (bias != nullptr) f += to_float<T>(bias[c0 + h * kVec + j]);
        e[j] = from_float<T>(apply_activation(f, act));
      }
      v[h] = word;
    }
  }
}

}  // namespace conv
}  // namespace cuops

// conv_bias_act_<dtype>_nhwc(y, bias (nullable), M, Co, act); 256 threads per block.
#define CUOPS_DEFINE_CONV_BIAS_ACT(NAME, T)                                                        \
  extern "C" __global__ void __launch_bounds__(256) NAME(T* y, const T* bias, int M, int Co, int act) { \
    cuops::conv::conv_bias_act_nhwc<T>(y, bias, M, Co, act);                                       \
  }

// Entry points conv_dequant{,8}_<dtype>_w<bits>_<nchw|nhwc>(qweight, scale, offset, W, Co, K, Cg, taps,
// block_size): K = taps * Cg, taps = Kh * Kw; 256 threads per block.
#define CUOPS_DEFINE_CONV_DEQUANT_ONE(NAME, FN, T, BITS, NCHW)                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                         \
      NAME(const uint8_t* qweight, const float* scale, const float* offset, T* W, int Co, int K, int Cg,     \
           int taps, int block_size) {                                                                      \
    cuops::conv::FN<T, BITS, NCHW>(qweight, scale, offset, W, Co, K, Cg, taps, block_size);                \
  }
#define CUOPS_DEFINE_CONV_DEQUANT(NAME, T, BITS, NCHW)                            \
  CUOPS_DEFINE_CONV_DEQUANT_ONE(conv_dequant_##NAME, conv_dequant, T, BITS, NCHW) \
  CUOPS_DEFINE_CONV_DEQUANT_ONE(conv_dequant8_##NAME, conv_dequant8, T, BITS, NCHW)

#if CUOPS_CONV_WANT(1, 4) || CUOPS_CONV_WANT(1, 8)
CUOPS_DEFINE_CONV_BIAS_ACT(conv_bias_act_f32_nhwc, float)
#endif
#if CUOPS_CONV_WANT(2, 4) || CUOPS_CONV_WANT(2, 8)
CUOPS_DEFINE_CONV_BIAS_ACT(conv_bias_act_f16_nhwc, __half)
#endif
#if CUOPS_CONV_WANT(3, 4) || CUOPS_CONV_WANT(3, 8)
CUOPS_DEFINE_CONV_BIAS_ACT(conv_bias_act_bf16_nhwc, __nv_bfloat16)
#endif
#if CUOPS_CONV_WANT(1, 4)
CUOPS_DEFINE_CONV_DEQUANT(f32_w4_nchw, float, 4, true)
CUOPS_DEFINE_CONV_DEQUANT(f32_w4_nhwc, float, 4, false)
#endif
#if CUOPS_CONV_WANT(1, 8)
CUOPS_DEFINE_CONV_DEQUANT(f32_w8_nchw, float, 8, true)
CUOPS_DEFINE_CONV_DEQUANT(f32_w8_nhwc, float, 8, false)
#endif
#if CUOPS_CONV_WANT(2, 4)
CUOPS_DEFINE_CONV_DEQUANT(f16_w4_nchw, __half, 4, true)
CUOPS_DEFINE_CONV_DEQUANT(f16_w4_nhwc, __half, 4, false)
#endif
#if CUOPS_CONV_WANT(2, 8)
CUOPS_DEFINE_CONV_DEQUANT(f16_w8_nchw, __half, 8, true)
CUOPS_DEFINE_CONV_DEQUANT(f16_w8_nhwc, __half, 8, false)
#endif
#if CUOPS_CONV_WANT(3, 4)
CUOPS_DEFINE_CONV_DEQUANT(bf16_w4_nchw, __nv_bfloat16, 4, true)
CUOPS_DEFINE_CONV_DEQUANT(bf16_w4_nhwc, __nv_bfloat16, 4, false)
#endif
#if CUOPS_CONV_WANT(3, 8)
CUOPS_DEFINE_CONV_DEQUANT(bf16_w8_nchw, __nv_bfloat16, 8, true)
CUOPS_DEFINE_CONV_DEQUANT(bf16_w8_nhwc, __nv_bfloat16, 8, false)
#endif
