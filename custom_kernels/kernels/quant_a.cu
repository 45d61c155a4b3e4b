// Scheme 2 helpers on the activation and weight side:
//   QuantA           per row m and K block g of A [M, K] (fp32/fp16/bf16):
//                      scale  = (max - min) / 255
//                      offset = max - scale * 127
//                      a zero-range block (scale == 0) gets scale = 1, offset = max
//                      q      = clamp(rint((x - offset) / scale), -128, 127)   (round half to even)
//                      sum_q  = sum of q over the block (int32)
//                    Every float operation is one IEEE-rounded op (__f*_rn: no FMA contraction),
//                    so the result matches cutlass_ops.formats.quantize_activation_reference
//                    bit for bit.
//   QUANT_A_SYMMETRIC=1 builds QuantA (both kernels, same names) for the block-scaled symmetric scheme
//                    (cutlass_ops/w8a8/block_scaled.py) instead:
//                      scale  = amax / 127     (amax = max |x| over the block, exact in float32)
//                      a block whose scale is 0 (all zero, or amax / 127 below the subnormals) gets 1
//                      q      = clamp(rint(x / scale), -127, 127)          (round half to even)
//                    and writes scale only (offset and sum_q are not written: pass null). Bit for
//                    bit quantize_activation_block_scaled_reference (one IEEE division each).
//   Precompute_SumBq sum_B_q[n, g] = sum of the int8 weight q over block g of row n.
//   precompute_bvec  the same sums and the fused kernel's per-column vector (sB, oB, sB sumB + bs oB, 0).
#include "common.cuh"

#ifndef QUANT_A_SYMMETRIC
#define QUANT_A_SYMMETRIC 0
#endif

namespace cuops {
namespace quant {

constexpr int kMaxWarps = 8;  // QuantA blocks have at most 256 threads

#if QUANT_A_SYMMETRIC
// Symmetric: scale = amax / 127 with amax = max(mx, -mn) = max |x| (exact), one IEEE division; a
// zero scale becomes 1 (q = rint(x) = 0 then, no 0 / 0). No offset.
__device__ __forceinline__ void block_params(float mn, float mx, float& sc, float& of) {
  sc = __fdiv_rn(fmaxf(mx, -mn), 127.0f);
  if (sc == 0.0f) sc = 1.0f;
  of = 0.0f;
}
#else
// The block's scale and offset from its min and max (zero range: scale 1, offset max, so q = 0
// reproduces max exactly). One IEEE-rounded op each, as in the reference.
__device__ __forceinline__ void block_params(float mn, float mx, float& sc, float& of) {
  sc = __fdiv_rn(__fsub_rn(mx, mn), 255.0f);
  of = __fsub_rn(mx, __fmul_rn(sc, 127.0f));
  if (sc == 0.0f) {
    sc = 1.0f;
    of = mx;
  }
}
#endif

// min and max of xr[k] for k = first, first + step, ... < n
template <typename T>
__device__ __forceinline__ void span_min_max(const T* __restrict__ xr, int first, int step, int n, float& mn,
                                             float& mx) {
  mn = __int_as_float(0x7f800000);  // +inf
  mx = -__int_as_float(0x7f800000);
  for (int k = first; k < n; k += step) {
    const float v = to_float<T>(xr[k]);
    mn = fminf(mn, v);
    mx = fmaxf(mx, v);
  }
}

// q = clamp(rint((x - offset) / scale)) for the same elements (symmetric: clamp(rint(x / scale), -127,
// 127)); returns their sum
template <typename T>
__device__ __forceinline__ int span_quantize(const T* __restrict__ xr, int8_t* __restrict__ qr, int first, int step,
                                             int n, float sc, float of) {
  int sum = 0;
  for (int k = first; k < n; k += step) {
    const float v = to_float<T>(xr[k]);
#if QUANT_A_SYMMETRIC
    const float q = fminf(fmaxf(rintf(__fdiv_rn(v, sc)), -127.0f), 127.0f);
    (void)of;
#else
    const float q = fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(v, of), sc)), -128.0f), 127.0f);
#endif
    const int qi = static_cast<int>(q);
    qr[k] = static_cast<int8_t>(qi);
    sum += qi;
  }
  return sum;
}

// The block's parameters at [m * ld_param + g * g_stride] (see quant_a for the layouts); symmetric:
// the scale alone.
__device__ __forceinline__ void store_params(float* __restrict__ scale, float* __restrict__ offset,
                                             int32_t* __restrict__ sum_q, long long p, float sc, float of, int sum) {
  scale[p] = sc;
#if QUANT_A_SYMMETRIC
  (void)offset, (void)sum_q, (void)of, (void)sum;
#else
  offset[p] = of;
  sum_q[p] = sum;
#endif
}

// One thread block per (m, g): grid = M * G blocks, blockIdx.x = m * G + g. A row of x starts
// at x + m * lda (lda in elements); A_q rows are ldq bytes apart; scale/offset/sum_q of (m, g)
// sit at [m * ld_param + g * g_stride] ([M, G] row-major: ld_param = G, g_stride = 1; the fused
// Hopper kernel's planes [G][3][Mp]: ld_param = 1, g_stride = 3 Mp). The per-block call of the
// orchestrator passes G = 1 with x, A_q and the parameter pointers already advanced to its block.
// Used for blocks longer than 1024 elements and by the orchestrator; quant_a_warp below for the rest.
template <typename T>
__device__ __forceinline__ void quant_a(const T* __restrict__ x, long long lda, int8_t* __restrict__ A_q,
                                        long long ldq, float* __restrict__ scale, float* __restrict__ offset,
                                        int32_t* __restrict__ sum_q, long long ld_param, long long g_stride, int G,
                                        int block_size) {
  __shared__ float s_min[kMaxWarps], s_max[kMaxWarps];
  __shared__ int s_sum[kMaxWarps];
  const int m = blockIdx.x / G, g = blockIdx.x - (blockIdx.x / G) * G;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarps = blockDim.x >> 5;
  const T* xr = x + m * lda + static_cast<long long>(g) * block_size;
  int8_t* qr = A_q + m * ldq + static_cast<long long>(g) * block_size;

  float mn, mx;
  span_min_max(xr, tid, blockDim.x, block_size, mn, mx);
  mn = warp_min(mn);
  mx = warp_max(mx);
  if (lane == 0) {
    s_min[warp] = mn;
    s_max[warp] = mx;
  }
  __syncthreads();
  mn = s_min[0];
  mx = s_max[0];
  for (int w = 1; w < nwarps; ++w) {
    mn = fminf(mn, s_min[w]);
    mx = fmaxf(mx, s_max[w]);
  }
  float sc, of;
  block_params(mn, mx, sc, of);

  int sum = warp_sum(span_quantize(xr, qr, tid, blockDim.x, block_size, sc, of));
  if (lane == 0) s_sum[warp] = sum;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < nwarps; ++w) sum += s_sum[w];
    store_params(scale, offset, sum_q, m * ld_param + g * g_stride, sc, of, sum);
  }
}

// The (row, block) item of this warp, item = blockIdx.x * warps per block + warp, for rows * G items;
// false past the last one (uniform per warp).
__device__ __forceinline__ bool warp_item(int rows, int G, int& r, int& g) {
  const long long item = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (item >= static_cast<long long>(rows) * G) return false;
  r = static_cast<int>(item / G);
  g = static_cast<int>(item - static_cast<long long>(r) * G);
  return true;
}

// One warp per (m, g) (warp_item over M * G items): the same values
// as quant_a with the reductions done by shuffles alone (no shared memory, no block barrier). The
// block-per-item launch spent most of its time in tiny blocks: 184 us for 4096 x 8192 fp16 at
// block 128 on an H100 (fourth session, see docs/design.md).
template <typename T>
__device__ __forceinline__ void quant_a_warp(const T* __restrict__ x, long long lda, int8_t* __restrict__ A_q,
                                             long long ldq, float* __restrict__ scale, float* __restrict__ offset,
                                             int32_t* __restrict__ sum_q, long long ld_param, long long g_stride,
                                             int G, int block_size, int M) {
  const int lane = threadIdx.x & 31;
  int m, g;
  if (!warp_item(M, G, m, g)) return;
  const T* xr = x + m * lda + static_cast<long long>(g) * block_size;
  int8_t* qr = A_q + m * ldq + static_cast<long long>(g) * block_size;
  float mn, mx, sc, of;
  span_min_max(xr, lane, 32, block_size, mn, mx);
  block_params(warp_min(mn), warp_max(mx), sc, of);
  const int sum = warp_sum(span_quantize(xr, qr, lane, 32, block_size, sc, of));
  if (lane == 0) store_params(scale, offset, sum_q, m * ld_param + g * g_stride, sc, of, sum);
}

// The sum of B_q[n, g*block_size : (g+1)*block_size] (one warp; every lane gets it).
__device__ __forceinline__ int block_sum(const int8_t* __restrict__ B_q, long long ldb, int n, int g, int block_size) {
  const int lane = threadIdx.x & 31;
  const int8_t* row = B_q + n * ldb + static_cast<long long>(g) * block_size;
  int acc = 0;
  if ((reinterpret_cast<unsigned long long>(row) & 3ull) == 0 && (block_size & 3) == 0) {
    const int* words = reinterpret_cast<const int*>(row);
    // dp4a against 0x01010101 adds the four signed bytes of a word in one instruction.
    for (int w = lane; w < block_size / 4; w += 32) acc = __dp4a(words[w], 0x01010101, acc);
  } else {
    for (int k = lane; k < block_size; k += 32) acc += row[k];
  }
  return warp_sum(acc);
}

// One warp per (n, g): sum_B_q[n * G + g] = block_sum(n, g).
__device__ __forceinline__ void sum_bq(const int8_t* __restrict__ B_q, long long ldb, int32_t* __restrict__ sum_B_q,
                                       int N, int G, int block_size) {
  int n, g;
  if (!warp_item(N, G, n, g)) return;
  const int acc = block_sum(B_q, ldb, n, g, block_size);
  if ((threadIdx.x & 31) == 0) sum_B_q[static_cast<long long>(n) * G + g] = acc;
}

// The fused kernel's per-column vector of block (n, g) (cutlass_ops.w8a8.fused): bvec[g, n] = (sB, oB,
// q, 0) with q = f32(f64(sB) * f64(sum_B_q) + f64(block_size) * f64(oB)), each float64 op one IEEE
// rounding (__d*_rn: no FMA), as the torch expression it replaces; plus sum_B_q as sum_bq writes it.
__device__ __forceinline__ void precompute_bvec(const int8_t* __restrict__ B_q, long long ldb,
                                                const float* __restrict__ scale, const float* __restrict__ offset,
                                                int32_t* __restrict__ sum_B_q, float4* __restrict__ bvec, int N, int G,
                                                int block_size) {
  int n, g;
  if (!warp_item(N, G, n, g)) return;
  const int sum = block_sum(B_q, ldb, n, g, block_size);
  if ((threadIdx.x & 31) != 0) return;
  const long long ng = static_cast<long long>(n) * G + g;
  sum_B_q[ng] = sum;
  const float sB = scale[ng], oB = offset[ng];
  const double q = __dadd_rn(__dmul_rn(static_cast<double>(sB), static_cast<double>(sum)),
                             __dmul_rn(static_cast<double>(block_size), static_cast<double>(oB)));
  bvec[static_cast<long long>(g) * N + n] = make_float4(sB, oB, __double2float_rn(q), 0.0f);
}

}  // namespace quant
}  // namespace cuops

#define CUOPS_DEFINE_QUANT_A(NAME, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                                    \
      NAME(const T* x, long long lda, int8_t* A_q, long long ldq, float* scale, float* offset, int32_t* sum_q, \
           long long ld_param, long long g_stride, int G, int block_size) {                            \
    cuops::quant::quant_a<T>(x, lda, A_q, ldq, scale, offset, sum_q, ld_param, g_stride, G, block_size); \
  }

CUOPS_DEFINE_QUANT_A(quant_a_f32, float)
CUOPS_DEFINE_QUANT_A(quant_a_f16, __half)
CUOPS_DEFINE_QUANT_A(quant_a_bf16, __nv_bfloat16)

#define CUOPS_DEFINE_QUANT_A_WARP(NAME, T)                                                              \
  extern "C" __global__ void __launch_bounds__(256)                                                    \
      NAME(const T* x, long long lda, int8_t* A_q, long long ldq, float* scale, float* offset, int32_t* sum_q, \
           long long ld_param, long long g_stride, int G, int block_size, int M) {                     \
    cuops::quant::quant_a_warp<T>(x, lda, A_q, ldq, scale, offset, sum_q, ld_param, g_stride, G, block_size, M); \
  }

CUOPS_DEFINE_QUANT_A_WARP(quant_a_warp_f32, float)
CUOPS_DEFINE_QUANT_A_WARP(quant_a_warp_f16, __half)
CUOPS_DEFINE_QUANT_A_WARP(quant_a_warp_bf16, __nv_bfloat16)

// scale, offset: float32 [N, G] contiguous; bvec: float4 [G, N] (see precompute_bvec).
extern "C" __global__ void __launch_bounds__(256)
    precompute_bvec(const int8_t* B_q, long long ldb, const float* scale, const float* offset, int32_t* sum_B_q,
                    float4* bvec, int N, int G, int block_size) {
  cuops::quant::precompute_bvec(B_q, ldb, scale, offset, sum_B_q, bvec, N, G, block_size);
}

extern "C" __global__ void __launch_bounds__(256)
    precompute_sum_bq(const int8_t* B_q, long long ldb, int32_t* sum_B_q, int N, int G, int block_size) {
  cuops::quant::sum_bq(B_q, ldb, sum_B_q, N, G, block_size);
}
