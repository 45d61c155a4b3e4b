// Direct convolution (the conv strategy "direct"): one thread per output element, fp32
// accumulation; NCHW or NHWC, fp32/fp16/bf16, any Ci and block size, any arch. The correctness
// baseline. Weight layout and argument order: conv_common.cuh.
// Each NVRTC build takes one (dtype, bits) slice of the file (CUOPS_CONV_T / CUOPS_CONV_BITS).
#include "conv_common.cuh"

namespace cuops {
namespace conv {

// ---------------------------------------------------------------------------------------------
// Direct convolution: one thread per output element.
// ---------------------------------------------------------------------------------------------
template <typename T, int BITS, bool NCHW>
__device__ __forceinline__ void conv_direct(const T* __restrict__ x, const uint8_t* __restrict__ qweight,
                                            const float* __restrict__ scale, const float* __restrict__ offset,
                                            const T* __restrict__ bias, T* __restrict__ out, const ConvDims d) {
  const int K = d.Kh * d.Kw * d.Ci;
  const int G = K / d.block_size;
  const size_t row_bytes = static_cast<size_t>(K) * BITS / 8;
  const long long total = static_cast<long long>(d.batch) * d.Co * d.Oh * d.Ow;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    // idx enumerates the output in its own memory order, so out[idx] is the store address.
    long long t = idx;
    int ox, oy, co, b;
    if (NCHW) {
      ox = static_cast<int>(t % d.Ow); t /= d.Ow;
      oy = static_cast<int>(t % d.Oh); t /= d.Oh;
      co = static_cast<int>(t % d.Co); b = static_cast<int>(t / d.Co);
    } else {
      co = static_cast<int>(t % d.Co); t /= d.Co;
      ox = static_cast<int>(t % d.Ow); t /= d.Ow;
      oy = static_cast<int>(t % d.Oh); b = static_cast<int>(t / d.Oh);
    }
    const uint8_t* qrow = qweight + co * row_bytes;
    const float* srow = scale + static_cast<size_t>(co) * G;
    const float* orow = offset + static_cast<size_t>(co) * G;
    float acc = 0.0f;
    for (int kh = 0; kh < d.Kh; ++kh) {
      const int iy = oy * d.sh - d.ph + kh * d.dh;
      if (iy < 0 || iy >= d.H) continue;
      for (int kw = 0; kw < d.Kw; ++kw) {
        const int ix = ox * d.sw - d.pw + kw * d.dw;
        if (ix < 0 || ix >= d.W) continue;
        const int kbase = (kh * d.Kw + kw) * d.Ci;
        for (int ci0 = 0; ci0 < d.Ci; ci0 += d.block_size) {
          const int g = (kbase + ci0) / d.block_size;
          const float s = srow[g], o = orow[g];
          for (int ci = ci0; ci < ci0 + d.block_size; ++ci) {
            const size_t xi = NCHW ? ((static_cast<size_t>(b) * d.Ci + ci) * d.H + iy) * d.W + ix
                                   : ((static_cast<size_t>(b) * d.H + iy) * d.W + ix) * d.Ci + ci;
            const float w = fmaf(static_cast<float>(load_q<BITS>(qrow, kbase + ci)), s, o);
            acc = fmaf(to_float<T>(x[xi]), w, acc);
          }
        }
      }
    }
    if (bias != nullptr) acc += to_float<T>(bias[co]);
    out[idx] = from_float<T>(apply_activation(acc, d.act));
  }
}

}  // namespace conv
}  // namespace cuops

#define CUOPS_DEFINE_CONV_DIRECT(NAME, T, BITS, NCHW)                                                       \
  extern "C" __global__ void __launch_bounds__(256)                                                         \
      NAME(const T* x, const uint8_t* qweight, const float* scale, const float* offset, const T* bias, T* out, \
           CUOPS_CONV_INT_ARGS) {                                                                           \
    cuops::conv::conv_direct<T, BITS, NCHW>(x, qweight, scale, offset, bias, out, CUOPS_CONV_DIMS);         \
  }

#if CUOPS_CONV_WANT(1, 4)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f32_w4_nchw, float, 4, true)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f32_w4_nhwc, float, 4, false)
#endif
#if CUOPS_CONV_WANT(1, 8)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f32_w8_nchw, float, 8, true)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f32_w8_nhwc, float, 8, false)
#endif
#if CUOPS_CONV_WANT(2, 4)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f16_w4_nchw, __half, 4, true)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f16_w4_nhwc, __half, 4, false)
#endif
#if CUOPS_CONV_WANT(2, 8)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f16_w8_nchw, __half, 8, true)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_f16_w8_nhwc, __half, 8, false)
#endif
#if CUOPS_CONV_WANT(3, 4)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_bf16_w4_nchw, __nv_bfloat16, 4, true)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_bf16_w4_nhwc, __nv_bfloat16, 4, false)
#endif
#if CUOPS_CONV_WANT(3, 8)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_bf16_w8_nchw, __nv_bfloat16, 8, true)
CUOPS_DEFINE_CONV_DIRECT(conv_direct_bf16_w8_nhwc, __nv_bfloat16, 8, false)
#endif
