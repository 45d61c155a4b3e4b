// Weight-only (scheme 1) streaming CUDA-core GEMV for small M (strategy "gemv_stream"):
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
//   gemv_stream_m{1..8}  half / bf16, any arch: CUDA cores, built for memory-level parallelism (every
//       lane keeps two trips of 16-byte weight loads in flight), activations staged in shared memory,
//       dot products in T pairs per 16-byte chunk, fp32 across chunks; split-K through the same
//       workspace as gemv_mma. See the section below.
//   (splitk_reduce.cu sums that workspace.)
#include "common.cuh"
#include "converters.cuh"
#include "stream_loads.cuh"

#include "gemv_store.cuh"
#include "weight_only_types.cuh"

namespace cuops {
namespace gemv {

// ---------------------------------------------------------------------------------------------
// Streaming CUDA-core GEMV (memory-level parallelism first), half / bf16
// ---------------------------------------------------------------------------------------------
//
// Work split: a warp owns kStreamRows consecutive weight rows (a "row group") of one K range (a
// "split", gridDim.y of them); lane l takes the 16-byte chunks c_begin + l, + 32, + 64, ... of those
// rows, so each warp load instruction reads 512 contiguous bytes of one row. A trip is one chunk of
// each of the lane's rows (kStreamRows x 16 bytes, plus their (scale, offset) words); the loads of
// trip i + 1 are issued before the math of trip i (two register sets, 128 bytes per lane in flight),
// and the first trip's before the activations are staged. Warps walk the row groups persistently
// (the host launches about one wave of blocks).
//
// Activations: the block's K range of all kM rows is staged once in shared memory, with the per-chunk
// sums sum(x) (fp32) that the offset term needs. Each 16-byte activation vector read from shared
// memory feeds kStreamRows weight rows.
//
// Arithmetic: per chunk (32 int4 / 16 int8 K elements, one quantization group) the dot product
// sum(x q) runs in T pairs (hfma2: q exact from the lop3/prmt converters, x exact), then is widened
// to fp32: acc += s * dot + o * sum(x), with s, o the (scale, offset) pair rounded to T.
// In half, a lane's partial sum of kChunkElems/2 products |x q| <= 8 |x| (int4) or 128 |x| (int8)
// could overflow 65504, so an activation row whose largest |x| exceeds half_safe_abs_x() is scaled
// by 2^-e in shared memory (exact: a power of two), and its results are multiplied back by 2^e.
#ifndef GEMV_STREAM_ROWS
#define GEMV_STREAM_ROWS 4
#endif
#ifndef GEMV_STREAM_WARPS
#define GEMV_STREAM_WARPS 8
#endif
#ifndef GEMV_STREAM_MIN_BLOCKS
#define GEMV_STREAM_MIN_BLOCKS 2
#endif
constexpr int kStreamRows = GEMV_STREAM_ROWS;    // weight rows per warp (activation reuse factor)
constexpr int kStreamWarps = GEMV_STREAM_WARPS;  // warps per block
constexpr int kStreamThreads = 32 * kStreamWarps;

// Blocks per SM the register budget aims at (<= 128 registers; the host mirrors it as
// weight_only.variants._STREAM_MIN_BLOCKS): 16 warps x 32 lanes x 2 trips x 64 bytes = 64 KiB of weight loads
// in flight per SM.
constexpr int kStreamMinBlocks = GEMV_STREAM_MIN_BLOCKS;

template <typename T> struct IsHalf { static constexpr bool value = false; };
template <> struct IsHalf<__half> { static constexpr bool value = true; };

// A T pair (raw 32 bits) as two floats.
template <typename T> __device__ __forceinline__ float2 pair_to_float2(uint32_t p);
template <> __device__ __forceinline__ float2 pair_to_float2<__half>(uint32_t p) {
  return __half22float2(*reinterpret_cast<const __half2*>(&p));
}
template <> __device__ __forceinline__ float2 pair_to_float2<__nv_bfloat16>(uint32_t p) {
  // bf16 is the top half of an fp32.
  return make_float2(__uint_as_float(p << 16), __uint_as_float(p & 0xffff0000u));
}

// Both halves of a pair multiplied by a power of two 2^-e (exact but for subnormal results).
__device__ __forceinline__ uint32_t scale_half2(uint32_t p, uint32_t factor2) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(p), "r"(factor2));
  return r;
}

// Largest |x| of an activation row for which a chunk's half partial sums cannot overflow:
// (kChunkElems / 2 products per lane) * max|q| * |x| <= 2^15 (well under 65504 with its roundings).
template <int kBits>
__device__ __forceinline__ constexpr float half_safe_abs_x() {
  return kBits == 4 ? 32768.0f / (16 * 8) : 32768.0f / (8 * 128);  // 256 (int4), 32 (int8)
}

// The exponent e >= 0 with amax * 2^-e <= safe (0 for a non-finite amax: inf / NaN propagate as they are).
__device__ __forceinline__ int half_row_exponent(float amax, float safe) {
  if (!(amax > safe) || !(amax <= 65504.0f)) return 0;
  const uint32_t r = __float_as_uint(amax / safe);  // > 1, < 2^11: a normal float
  int e = static_cast<int>(r >> 23) - 127;          // floor(log2(r))
  return (r & 0x7fffffu) ? e + 1 : e;               // ceil(log2(r))
}

__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(static_cast<uint32_t>(127 + e) << 23); }

// Shared-memory slot of vector j (0 .. kVecs-1) of local chunk c of an activation row: the XOR puts
// the 8 lanes of each quarter-warp (consecutive c, same j) on 8 different 16-byte bank slots.
template <int kVecs>
__device__ __forceinline__ int x_slot(int c, int j) {
  constexpr int kShift = kVecs == 4 ? 1 : 2;  // 4 vectors per chunk: c bit 0 picks the half of the
                                              // 128-byte row, bits 1-2 the XOR; 2 vectors: bits 0-1 / 2
  return c * kVecs + (j ^ ((c >> kShift) & (kVecs - 1)));
}

extern __shared__ uint4 gemv_stream_smem[];

template <typename T, int kBits, int kM>
__device__ __forceinline__ void gemv_stream(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                            const uint32_t* __restrict__ scale_offset, const T* __restrict__ bias,
                                            T* __restrict__ D, float* __restrict__ workspace, int N, int K, int G,
                                            int group_shift, int chunks_per_group, int chunks_per_split, int act) {
  constexpr int kChunkElems = 128 / kBits;       // K elements per 16-byte weight chunk: 32 or 16
  constexpr int kVecs = kChunkElems / 8;         // 16-byte activation vectors per chunk: 4 or 2
  constexpr int kWordsPerVec = 4 / kVecs;        // weight words per activation vector: 1 or 2
  constexpr int kPairs = WeightWord<T, kBits>::kPairs;
  constexpr bool kHalf = IsHalf<T>::value;  // overflow guard needed (bf16 has fp32's range)
  constexpr int kR = kStreamRows;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int chunks = K / kChunkElems;
  const int c_begin = blockIdx.y * chunks_per_split;
  const int c_end = min(chunks, c_begin + chunks_per_split);
  const int kc = c_end - c_begin;  // chunks of this split (>= 1)
  const int row_groups = UP_DIV(N, kR);
  const int64_t row_bytes = static_cast<int64_t>(K) * kBits / 8;
  const uint64_t policy = evict_first_policy();  // the weights go first, the activations stay in L2

  // Shared memory: x [kM][chunks_per_split * kVecs] vectors, then sum(x) [kM][chunks_per_split] floats.
  uint4* xs = gemv_stream_smem;
  float* xsum = reinterpret_cast<float*>(xs + kM * chunks_per_split * kVecs);
  __shared__ uint32_t amax_bits[kM];  // max |x| per activation row (bits of a non-negative float: ordered as uints)

  // ---- first trip's weight loads, ahead of the staging ----
  // Two register sets: the loads of trip i + 1 are issued before the math of trip i.
  uint4 wq_a[kR], wq_b[kR];
  uint32_t so_a[kR], so_b[kR];
  auto issue = [&](uint4 (&wq)[kR], uint32_t (&so)[kR], int rg, int c) {
    if (c < c_end) {
      const int g = group_shift >= 0 ? (c >> group_shift) : c / chunks_per_group;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int n = min(rg * kR + r, N - 1);  // rows past N: valid memory, results dropped
        wq[r] = load_stream_16B_hint(B + n * row_bytes + static_cast<int64_t>(c) * 16, policy);
        so[r] = __ldg(scale_offset + static_cast<int64_t>(n) * G + g);
      }
    }
  };
  int rg = blockIdx.x * kStreamWarps + warp;
  const int rg_stride = gridDim.x * kStreamWarps;
  int c0 = c_begin;  // lane 0's chunk of the current trip
  if (rg < row_groups) issue(wq_a, so_a, rg, c0 + lane);

  // ---- stage the activations of this split ----
  if (kHalf && threadIdx.x < kM) amax_bits[threadIdx.x] = 0u;
  if (kHalf) __syncthreads();
  float amax[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) amax[m] = 0.0f;
  for (int item = threadIdx.x; item < kM * kc; item += blockDim.x) {
    const int m = item / kc, c = item - m * kc;
    const uint4* src = reinterpret_cast<const uint4*>(A + static_cast<int64_t>(m) * K +
                                                      static_cast<int64_t>(c_begin + c) * kChunkElems);
    float sum = 0.0f, mx = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const uint4 v = __ldg(src + j);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const float2 f = pair_to_float2<T>(word_of(v, p));
        sum += f.x + f.y;
        mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
      xs[m * chunks_per_split * kVecs + x_slot<kVecs>(c, j)] = v;
    }
    xsum[m * chunks_per_split + c] = sum;
#pragma unroll
    for (int mm = 0; mm < kM; ++mm)
      if (mm == m) amax[mm] = fmaxf(amax[mm], mx);
  }
  if (kHalf) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float v = amax[m];
#pragma unroll
      for (int mask = 16; mask > 0; mask >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, mask));
      if (lane == 0) atomicMax(&amax_bits[m], __float_as_uint(v));
    }
  }
  __syncthreads();
  if (kHalf) {
    // Rows whose |x| could overflow a half partial sum are scaled down by 2^e in place (x and sum(x)).
    bool any = false;
#pragma unroll
    for (int m = 0; m < kM; ++m)
      any |= half_row_exponent(__uint_as_float(amax_bits[m]), half_safe_abs_x<kBits>()) > 0;
    if (any) {  // block-uniform
      for (int item = threadIdx.x; item < kM * kc; item += blockDim.x) {
        const int m = item / kc, c = item - m * kc;
        const int e = half_row_exponent(__uint_as_float(amax_bits[m]), half_safe_abs_x<kBits>());
        if (e == 0) continue;
        const float inv = pow2f(-e);
        __half2 inv2 = __float2half2_rn(inv);  // 2^-e, e <= 11: a normal half, exact
        const uint32_t f2 = *reinterpret_cast<uint32_t*>(&inv2);
#pragma unroll
        for (int j = 0; j < kVecs; ++j) {
          uint4& v = xs[m * chunks_per_split * kVecs + x_slot<kVecs>(c, j)];
          v = make_uint4(scale_half2(v.x, f2), scale_half2(v.y, f2), scale_half2(v.z, f2), scale_half2(v.w, f2));
        }
        xsum[m * chunks_per_split + c] *= inv;
      }
      __syncthreads();
    }
  }

  // ---- main loop ----
  float acc[kR][kM];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[r][m] = 0.0f;

  // One trip: issue the next trip's loads into (wn, sn), do this trip's math on (wc, sc), and write
  // the row group's results after its last trip. Returns whether another trip follows.
  auto trip = [&](const uint4 (&wc)[kR], const uint32_t (&sc)[kR], uint4 (&wn)[kR], uint32_t (&sn)[kR]) -> bool {
    int rg_next = rg, c0_next = c0 + 32;
    if (c0_next >= c_end) {
      rg_next = rg + rg_stride;
      c0_next = c_begin;
    }
    if (rg_next < row_groups) issue(wn, sn, rg_next, c0_next + lane);

    const int c = c0 + lane;
    if (c < c_end) {
      const int cl = c - c_begin;
      uint32_t dot[kR][kM];
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int m = 0; m < kM; ++m) dot[r][m] = 0u;  // +0 in half and bf16
#pragma unroll
      for (int j = 0; j < kVecs; ++j) {
        uint4 xv[kM];
#pragma unroll
        for (int m = 0; m < kM; ++m) xv[m] = xs[m * chunks_per_split * kVecs + x_slot<kVecs>(cl, j)];
#pragma unroll
        for (int x = 0; x < kWordsPerVec; ++x) {
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            uint32_t q[kPairs];
            WeightWord<T, kBits>::to_pairs(word_of(wc[r], j * kWordsPerVec + x), q);
#pragma unroll
            for (int p = 0; p < kPairs; ++p)
#pragma unroll
              for (int m = 0; m < kM; ++m) dot[r][m] = fma_pair<T>(q[p], word_of(xv[m], x * kPairs + p), dot[r][m]);
          }
        }
      }
      float xsum_c[kM];
#pragma unroll
      for (int m = 0; m < kM; ++m) xsum_c[m] = xsum[m * chunks_per_split + cl];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const float2 sof = pair_to_float2<T>(sc[r]);  // (scale, offset) rounded to T
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          const float2 d = pair_to_float2<T>(dot[r][m]);
          acc[r][m] = fmaf(sof.x, d.x + d.y, fmaf(sof.y, xsum_c[m], acc[r][m]));
        }
      }
    }

    if (rg_next != rg) {
      // Row group done: reduce over the lanes, undo the activation scaling, write.
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          float v = acc[r][m];
#pragma unroll
          for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
          if (kHalf) v *= pow2f(half_row_exponent(__uint_as_float(amax_bits[m]), half_safe_abs_x<kBits>()));
          const int n = rg * kR + r;
          if (lane == ((r * kM + m) & 31) && n < N) {
            if (gridDim.y == 1) {
              store_output(D, static_cast<int64_t>(m) * N + n, v, bias, n, act);
            } else {
              workspace[(static_cast<int64_t>(blockIdx.y) * kM + m) * N + n] = v;
            }
          }
          acc[r][m] = 0.0f;
        }
    }
    rg = rg_next;
    c0 = c0_next;
    return rg < row_groups;
  };
  // Unrolled by two so that the register sets swap roles without copies.
  if (rg < row_groups) {
    while (trip(wq_a, so_a, wq_b, so_b) && trip(wq_b, so_b, wq_a, so_a)) {
    }
  }
}

}  // namespace gemv
}  // namespace cuops

using namespace cuops::gemv;

#if WO_ELEMENT != 2
// gemv_stream_m{M}: M activation rows (1..8), half / bf16, any arch (bf16 pairs are emulated before
// sm_80). Dynamic shared memory: M * chunks_per_split * (2 * chunk elements + 4) bytes.
#define GEMV_STREAM_ENTRY(M_)                                                                                  \
  extern "C" __global__ void __launch_bounds__(kStreamThreads, kStreamMinBlocks) gemv_stream_m##M_( \
      const element_t* A, const uint8_t* B, const uint32_t* scale_offset, const element_t* bias, element_t* D, \
      float* workspace, int N, int K, int G, int group_shift, int chunks_per_group, int chunks_per_split,      \
      int act) {                                                                                               \
    gemv_stream<element_t, WO_BITS, M_>(A, B, scale_offset, bias, D, workspace, N, K, G, group_shift,          \
                                        chunks_per_group, chunks_per_split, act);                              \
  }
GEMV_STREAM_ENTRY(1)
GEMV_STREAM_ENTRY(2)
GEMV_STREAM_ENTRY(3)
GEMV_STREAM_ENTRY(4)
GEMV_STREAM_ENTRY(5)
GEMV_STREAM_ENTRY(6)
GEMV_STREAM_ENTRY(7)
GEMV_STREAM_ENTRY(8)
#endif
