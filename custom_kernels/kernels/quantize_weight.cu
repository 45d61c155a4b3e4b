// The default ("minmax") quantization of a weight W [N, K] per block of block_size along K, in one
// launch: cutlass_ops.quantizers.minmax (with _blocks.round_to_grid) and formats' packing, bit for bit.
// Per row n and block g (G = K / block_size), in float64, qmax = 127 or 7, qmin = -128 or -8:
//   symmetric:   scale  = f32(absmax / qmax),                     offset = 0
//   asymmetric:  scale  = f32((max - min) / (2^bits - 1))
//                offset = f32(max - qmax * scale)                 (max -> qmax, min -> qmin)
//   a block whose scale is 0 (all zero, zero range, or a float32 underflow) gets scale = 1
//   (asymmetric: offset = f32(max)), so it round-trips exactly
//   q = clamp(rint((w - offset) / scale), qmin, qmax)             (rint: half to even, as torch.round)
// with the stored float32 scale and offset widened (exactly) to float64 for q. Every float64 operation
// is one IEEE-rounded op (__d*_rn: no FMA contraction), as torch's separate ops on the CPU; max, min and
// |w| are exact, so the order of the reductions does not change them. The one choice torch leaves open:
// a zero-range asymmetric block whose max is a zero of either sign gets the sign of its first zero (what
// torch's CPU reduction keeps for blocks under 16 elements; longer ones it reduces in a vector order).
//
// Output: bits 8, int8 q [N, K]; bits 4, uint8 [N, K_packed / 2]: u = q + 8, each 32-bit word holding 8
// consecutive K elements in formats.INT4_INTERLEAVE order (element e in nibble (e >> 1) | (e & 1) << 2),
// the row padded with u = 8 (q = 0) from K to K_packed (formats.packed_K); scale, offset float32 [N, G].
// flags int32 [N]: the OR over row n of kNonFinite (a NaN / Inf in w), kBeyondFloat32 (float64 w with
// |w| > the largest float32), kScaleNonFinite, kOffsetNonFinite. Written for every row, so the host
// allocates it without zeroing and raises formats' own errors after reading it once.
//
// Element (n, k) of the stored K order k = (kh * Kw + kw) * Ci + ci sits at
// w[n * s_n + ci * s_ci + kh * s_kh + kw * s_kw] (element strides): a conv weight [Co, Ci, Kh, Kw] is
// read in place as [Co, Kh, Kw, Ci]; a linear weight passes Ci = K, Kw = 1.
//
// Launch: grid = N (one thread block per row), blockDim = 32 * warps (1..8). Phase 1: warp w takes
// blocks g = w, w + warps, ... and writes their scale and offset; phase 2, after a block barrier: the
// block's threads quantize the row (an int8 element or a packed int4 word each), reading back the
// parameters of each element's block (an int4 word may span several blocks, e.g. Ci = 3 stems).
#include "common.cuh"

namespace cuops {
namespace quant_w {

constexpr int kMaxWarps = 8;
enum Flag : int { kNonFinite = 1, kBeyondFloat32 = 2, kScaleNonFinite = 4, kOffsetNonFinite = 8 };
constexpr double kFloat32Max = 0x1.fffffep+127;

template <typename T> __device__ __forceinline__ double to_double(T v);
template <> __device__ __forceinline__ double to_double<double>(double v) { return v; }
template <> __device__ __forceinline__ double to_double<float>(float v) { return static_cast<double>(v); }
template <> __device__ __forceinline__ double to_double<__half>(__half v) {
  return static_cast<double>(__half2float(v));
}
template <> __device__ __forceinline__ double to_double<__nv_bfloat16>(__nv_bfloat16 v) {
  return static_cast<double>(__bfloat162float(v));
}

// Element (n, k) of W in the stored K order (see the header), as float64 (exact for every input type).
template <typename T>
struct Rows {
  const T* w;
  long long s_n, s_ci, s_kh, s_kw;
  int Ci, Kw;

  __device__ __forceinline__ double at(int n, int k) const {
    const int p = k / Ci, ci = k - p * Ci;
    const int kh = p / Kw, kw = p - kh * Kw;
    return to_double<T>(w[n * s_n + ci * s_ci + kh * s_kh + kw * s_kw]);
  }
};

struct Params {
  float scale, offset;
  int flags;
};

// The (scale, offset) of the block of row n at k0 .. k0 + block_size - 1, and its flags; called by a
// whole warp (lanes stride over the block), every lane gets the result.
template <typename T, int kBits>
__device__ __forceinline__ Params block_params(const Rows<T>& rows, int n, int k0, int block_size, bool symmetric,
                                               int lane) {
  constexpr double qmax = kBits == 8 ? 127.0 : 7.0;
  constexpr double levels = kBits == 8 ? 255.0 : 15.0;  // 2^bits - 1
  double mx = -__longlong_as_double(0x7ff0000000000000ll), mn = -mx;  // -inf, +inf
  int flags = 0;
  for (int k = k0 + lane; k < k0 + block_size; k += 32) {
    const double v = rows.at(n, k);
    if (!isfinite(v)) flags |= kNonFinite;
    if constexpr (sizeof(T) == 8) {
      if (fabs(v) > kFloat32Max) flags |= kBeyondFloat32;
    }
    mx = fmax(mx, symmetric ? fabs(v) : v);  // symmetric: mx is absmax
    mn = fmin(mn, v);
  }
  mx = warp_max(mx);
  mn = warp_min(mn);
  flags = warp_or(flags);

  Params p;
  if (symmetric) {
    p.scale = __double2float_rn(__ddiv_rn(mx, qmax));
    if (p.scale == 0.0f) p.scale = 1.0f;
    p.offset = 0.0f;
  } else {
    p.scale = __double2float_rn(__ddiv_rn(__dsub_rn(mx, mn), levels));
    if (p.scale == 0.0f) {  // warp-uniform: every lane holds the same mx and mn
      p.scale = 1.0f;
      double top = mx;
      if (mx == 0.0) {  // +0 or -0: take the first zero of the block, as torch's CPU reduction keeps it
        int first = 0x7fffffff;
        for (int k = k0 + lane; k < k0 + block_size; k += 32) {
          if (rows.at(n, k) == 0.0) {
            first = k;
            break;
          }
        }
        top = rows.at(n, warp_min(first));
      }
      p.offset = __double2float_rn(top);
    } else {
      p.offset = __double2float_rn(__dsub_rn(mx, __dmul_rn(qmax, static_cast<double>(p.scale))));
    }
  }
  if (!isfinite(p.scale)) flags |= kScaleNonFinite;
  if (!isfinite(p.offset)) flags |= kOffsetNonFinite;
  p.flags = flags;
  return p;
}

// q = clamp(rint((v - offset) / scale), qmin, qmax) in float64, one rounding per operation.
template <int kBits>
__device__ __forceinline__ int quantize(double v, float scale, float offset) {
  constexpr double qmin = kBits == 8 ? -128.0 : -8.0, qmax = kBits == 8 ? 127.0 : 7.0;
  const double t = __ddiv_rn(__dsub_rn(v, static_cast<double>(offset)), static_cast<double>(scale));
  return static_cast<int>(fmin(fmax(rint(t), qmin), qmax));
}

template <typename T, int kBits>
__device__ __forceinline__ void quantize_weight(const Rows<T>& rows, int K, int K_packed, int block_size,
                                                bool symmetric, uint8_t* __restrict__ qweight, float* scale,
                                                float* offset, int32_t* __restrict__ flags) {
  __shared__ int s_flags[kMaxWarps];
  const int n = blockIdx.x, G = K / block_size;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  // Not __restrict__: phase 2 reads back what phase 1 wrote (plain, coherent loads).
  float* row_scale = scale + static_cast<long long>(n) * G;
  float* row_offset = offset + static_cast<long long>(n) * G;

  int row_flags = 0;
  for (int g = warp; g < G; g += warps) {
    const Params p = block_params<T, kBits>(rows, n, g * block_size, block_size, symmetric, lane);
    if (lane == 0) {
      row_scale[g] = p.scale;
      row_offset[g] = p.offset;
    }
    row_flags |= p.flags;
  }
  if (lane == 0) s_flags[warp] = row_flags;
  __syncthreads();  // the row's parameters (global) and the warps' flags (shared) are visible to the block
  if (tid == 0) {
    for (int w = 1; w < warps; ++w) row_flags |= s_flags[w];
    flags[n] = row_flags;
  }

  if constexpr (kBits == 8) {
    int8_t* q = reinterpret_cast<int8_t*>(qweight) + static_cast<long long>(n) * K;
    for (int k = tid; k < K; k += blockDim.x) {
      const int g = k / block_size;
      q[k] = static_cast<int8_t>(quantize<8>(rows.at(n, k), row_scale[g], row_offset[g]));
    }
  } else {
    const int words = K_packed / 8;  // the row is K_packed / 2 bytes, a multiple of 4: aligned words
    uint32_t* row = reinterpret_cast<uint32_t*>(qweight) + static_cast<long long>(n) * words;
    for (int i = tid; i < words; i += blockDim.x) {
      uint32_t word = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int k = 8 * i + e;
        int u = 8;  // the row padding: q = 0
        if (k < K) {
          const int g = k / block_size;
          u = quantize<4>(rows.at(n, k), row_scale[g], row_offset[g]) + 8;
        }
        word |= static_cast<uint32_t>(u) << (4 * ((e >> 1) | ((e & 1) << 2)));
      }
      row[i] = word;
    }
  }
}

}  // namespace quant_w
}  // namespace cuops

#define CUOPS_DEFINE_QUANTIZE_WEIGHT(NAME, T, BITS)                                                     \
  extern "C" __global__ void __launch_bounds__(256)                                                     \
      NAME(const T* w, long long s_n, long long s_ci, long long s_kh, long long s_kw, int Ci, int Kw, int K, \
           int K_packed, int block_size, int symmetric, uint8_t* qweight, float* scale, float* offset,       \
           int32_t* flags) {                                                                             \
    const cuops::quant_w::Rows<T> rows{w, s_n, s_ci, s_kh, s_kw, Ci, Kw};                                \
    cuops::quant_w::quantize_weight<T, BITS>(rows, K, K_packed, block_size, symmetric != 0, qweight, scale, \
                                             offset, flags);                                             \
  }

CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w8_f16, __half, 8)
CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w8_bf16, __nv_bfloat16, 8)
CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w8_f32, float, 8)
CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w8_f64, double, 8)
CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w4_f16, __half, 4)
CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w4_bf16, __nv_bfloat16, 4)
CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w4_f32, float, 4)
CUOPS_DEFINE_QUANTIZE_WEIGHT(quantize_weight_w4_f64, double, 4)
