// Direct convolution (the conv strategy "direct"): one thread per output element, fp32
// accumulation; NCHW or NHWC, fp32/fp16/bf16, any Ci, groups and block size, any arch. The
// correctness baseline, and the depthwise kernel (groups = Ci: Kh*Kw taps per output, read
// coalesced along W for NCHW and along the channels for NHWC).
// Weight layout and argument order: conv_common.cuh.
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
  const int Cg = d.Ci / d.groups;  // input channels per group = the weight's Ci
  const int Cog = d.Co / d.groups;
  const int K = d.Kh * d.Kw * Cg;
  const int G = K / d.block_size;
  const size_t w_row_bytes = row_bytes<BITS>(K);
  const long long total = static_cast<long long>(d.batch) * d.Co * d.Oh * d.Ow;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    // idx enumerates the output in its own memory order, so out[idx] is the store address. The host
    // refuses outputs of 2^31 elements or more, so the decode divides in 32 bits (a 64-bit division
    // is a software routine of many instructions, which a depthwise 3x3 tap loop would not hide).
    int t = static_cast<int>(idx);
    int ox, oy, co, b;
    if (NCHW) {
      ox = t % d.Ow; t /= d.Ow;
      oy = t % d.Oh; t /= d.Oh;
      co = t % d.Co; b = t / d.Co;
    } else {
      co = t % d.Co; t /= d.Co;
      ox = t % d.Ow; t /= d.Ow;
      oy = t % d.Oh; b = t / d.Oh;
    }
    const int c0 = (co / Cog) * Cg;  // first input channel of co's group
    const uint8_t* qrow = qweight + co * w_row_bytes;
    const float* srow = scale + static_cast<size_t>(co) * G;
    const float* orow = offset + static_cast<size_t>(co) * G;
    // Channel c0 of image b; x has fewer than 2^31 elements (host check), so int offsets suffice
    // (64-bit ones cost registers, and the loop below spilled with them).
    const int HW = d.H * d.W;
    const T* xg = x + (NCHW ? (b * d.Ci + c0) * HW : b * HW * d.Ci + c0);
    const int c_stride = NCHW ? HW : 1;
    float acc = 0.0f;
    for (int kh = 0; kh < d.Kh; ++kh) {
      const int iy = oy * d.sh - d.ph + kh * d.dh;
      if (iy < 0 || iy >= d.H) continue;
      for (int kw = 0; kw < d.Kw; ++kw) {
        const int ix = ox * d.sw - d.pw + kw * d.dw;
        if (ix < 0 || ix >= d.W) continue;
        const T* xp = xg + (NCHW ? iy * d.W + ix : (iy * d.W + ix) * d.Ci);  // tap (iy, ix), channel c0
        const int kbase = (kh * d.Kw + kw) * Cg;
        // This tap's Cg weights, one quantization block at a time: a block may lie inside the tap
        // (block_size | Cg) or span several taps (Cg | block_size, e.g. depthwise), so each run
        // ends at the next block boundary or the tap's end.
        for (int ci = 0; ci < Cg;) {
          const int g = (kbase + ci) / d.block_size;
          const int end = min(Cg, (g + 1) * d.block_size - kbase);
          const float s = srow[g], o = orow[g];
          for (; ci < end; ++ci) {
            const float w = fmaf(static_cast<float>(load_q<BITS>(qrow, kbase + ci)), s, o);
            acc = fmaf(to_float<T>(xp[ci * c_stride]), w, acc);
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
