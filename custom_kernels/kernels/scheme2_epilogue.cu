// Scheme 2 epilogue kernels, the documents' literal variant (one launch per K block i):
//   DequantAndAcc      out[m, n] += term1 + term2 (atomicAdd), with block i's parameters
//                        term1 = sA * (Cq * sB + sumA * oB)
//                        term2 = oA * (sumB * sB + bs * oB)
//                      i.e. sum over k in block i of (sA*a_q + oA) * (sB*b_q + oB).
//   BiasAndActivation  out = act(in + bias), in place or converting an fp32 workspace to the
//                      output dtype in the same pass.
#include "common.cuh"

namespace cuops {
namespace scheme2 {

// atomicAdd of a float partial into the accumulator type (fp16 needs sm_70; bf16 is native
// from sm_90, a CAS loop in cuda_bf16.hpp below).
__device__ __forceinline__ void atomic_accumulate(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_accumulate(__half* p, float v) { atomicAdd(p, __float2half_rn(v)); }
__device__ __forceinline__ void atomic_accumulate(__nv_bfloat16* p, float v) {
  atomicAdd(p, __float2bfloat16_rn(v));
}

// Thread (x, y) of a 32 x 8 block handles output (m = blockIdx.y * 8 + y, n = blockIdx.x * 32 + x).
// Cq int32 [M, ldc]. A parameters of row m at [m * ld_a] (pointers advanced to block i's
// column), B parameters of column n at [n * ld_b] (likewise).
template <typename TOut>
__device__ __forceinline__ void dequant_and_acc(const int32_t* __restrict__ Cq, long long ldc, TOut* __restrict__ out,
                                                long long ldo, const float* __restrict__ scale_A,
                                                const float* __restrict__ offset_A, const int32_t* __restrict__ sum_A,
                                                long long ld_a, const float* __restrict__ scale_B,
                                                const float* __restrict__ offset_B, const int32_t* __restrict__ sum_B,
                                                long long ld_b, int M, int N, int block_len) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y * blockDim.y + threadIdx.y;
  if (m >= M || n >= N) return;
  const float c = static_cast<float>(Cq[m * ldc + n]);
  const float sA = scale_A[m * ld_a], oA = offset_A[m * ld_a];
  const float sumA = static_cast<float>(sum_A[m * ld_a]);
  const float sB = scale_B[n * ld_b], oB = offset_B[n * ld_b];
  const float sumB = static_cast<float>(sum_B[n * ld_b]);
  const float term1 = sA * (c * sB + sumA * oB);
  const float term2 = oA * (sumB * sB + static_cast<float>(block_len) * oB);
  atomic_accumulate(out + m * ldo + n, term1 + term2);
}

// Grid-stride over M x N: dst[m, n] = act(src[m, n] + bias[n]); bias float32 [N] or null.
template <typename TSrc, typename TDst>
__device__ __forceinline__ void bias_and_activation(const TSrc* src, long long lds, TDst* dst, long long ldd,
                                                    const float* __restrict__ bias, int M, int N, int act) {
  const long long total = static_cast<long long>(M) * N;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long m = idx / N;
    const int n = static_cast<int>(idx - m * N);
    float v = to_float<TSrc>(src[m * lds + n]);
    if (bias != nullptr) v += bias[n];
    dst[m * ldd + n] = from_float<TDst>(apply_activation(v, act));
  }
}

}  // namespace scheme2
}  // namespace cuops

#define CUOPS_DEFINE_DEQUANT_ACC(NAME, TOut)                                                           \
  extern "C" __global__ void __launch_bounds__(256)                                                    \
      NAME(const int32_t* Cq, long long ldc, TOut* out, long long ldo, const float* scale_A, const float* offset_A, \
           const int32_t* sum_A, long long ld_a, const float* scale_B, const float* offset_B, const int32_t* sum_B, \
           long long ld_b, int M, int N, int block_len) {                                              \
    cuops::scheme2::dequant_and_acc<TOut>(Cq, ldc, out, ldo, scale_A, offset_A, sum_A, ld_a, scale_B, offset_B, \
                                          sum_B, ld_b, M, N, block_len);                               \
  }

CUOPS_DEFINE_DEQUANT_ACC(dequant_and_acc_f32, float)
CUOPS_DEFINE_DEQUANT_ACC(dequant_and_acc_f16, __half)
CUOPS_DEFINE_DEQUANT_ACC(dequant_and_acc_bf16, __nv_bfloat16)

#define CUOPS_DEFINE_BIAS_ACT(NAME, TSrc, TDst)                                                           \
  extern "C" __global__ void __launch_bounds__(256)                                                       \
      NAME(const TSrc* src, long long lds, TDst* dst, long long ldd, const float* bias, int M, int N, int act) { \
    cuops::scheme2::bias_and_activation<TSrc, TDst>(src, lds, dst, ldd, bias, M, N, act);                  \
  }

// In place (src == dst) for each dtype, and fp32 workspace -> fp16 / bf16 output.
CUOPS_DEFINE_BIAS_ACT(bias_act_f32_f32, float, float)
CUOPS_DEFINE_BIAS_ACT(bias_act_f16_f16, __half, __half)
CUOPS_DEFINE_BIAS_ACT(bias_act_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
CUOPS_DEFINE_BIAS_ACT(bias_act_f32_f16, float, __half)
CUOPS_DEFINE_BIAS_ACT(bias_act_f32_bf16, float, __nv_bfloat16)
