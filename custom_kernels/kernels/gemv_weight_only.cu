// Weight-only (scheme 1) GEMV for small M: D[M, N] = act(A[M, K] @ dequant(W)^T + bias).
//
// W is the QuantizedWeight format: int8 [N, K], or int4 u = q + 8 packed in the interleaved
// order, uint8 [N, K/2]. Every weight byte is read once, with 16-byte loads ("chunks" of 32 int4 or
// 16 int8 K elements of one row) that bypass L1, where the re-read activations live.
//
// Compile-time choice (NVRTC defines): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float (the
// activation / output type), WO_BITS 4 or 8.
//
// Entry points:
//   gemv_mma_mt{1,2,4,8}  half / bf16 only, sm_80+: tensor cores with the operands swapped,
//       D^T[N, M] = W[N, K] . A^T[K, M]: W is the 16 x 16 "A" operand (16 rows of N per tile),
//       the activations the 16 x 8 "B" operand (8 rows of M per tile; kMTiles tiles -> M <= 8 kMTiles).
//       W is dequantized in registers (converters.cuh, then w = q * s + o in the element type with
//       the (scale, offset) pair pre-packed as two 16-bit halves of one word), accumulation is fp32.
//       The warps of a block split K among themselves (deterministic tree reduction in shared
//       memory); gridDim.y > 1 splits K across blocks into an fp32 workspace [splits, M, N] that
//       splitk_reduce sums in a fixed order.
//   gemv_simt_m{1..8}  any element type and arch: one warp per output row, fp32 arithmetic with
//       the fp32 scale/offset applied per chunk: acc += s * sum(a q) + o * sum(a).
//   gemv_stream_m{1..8}  half / bf16, any arch: CUDA cores, built for memory-level parallelism (every
//       lane keeps two trips of 16-byte weight loads in flight), activations staged in shared memory,
//       dot products in T pairs per 16-byte chunk, fp32 across chunks; split-K through the same
//       workspace as gemv_mma. See the section below.
//   splitk_reduce      sums the split-K workspace, adds bias, applies the activation.
#include "common.cuh"
#include "converters.cuh"
#include "mma_sync.cuh"
#include "stream_loads.cuh"

#include "weight_only_types.cuh"

namespace cuops {
namespace gemv {

// Tunables (NVRTC defines; the host mirrors them in cutlass_ops/ops/weight_only.py).
// GEMV_FAMILY: 0 = every entry point; 1 = gemv_mma only, 2 = gemv_stream only (plus splitk_reduce):
// tuned variants compile in a third of the time.
#ifndef GEMV_FAMILY
#define GEMV_FAMILY 0
#endif
#ifndef GEMV_MMA_ROW_TILES
#define GEMV_MMA_ROW_TILES 2
#endif
#ifndef GEMV_MMA_UNROLL
#define GEMV_MMA_UNROLL 4
#endif
#ifndef GEMV_MMA_MIN_BLOCKS
#define GEMV_MMA_MIN_BLOCKS 2
#endif
constexpr int kMaxWarps = 8;       // warps per block splitting K (a power of two, chosen at launch)
constexpr int kGemvRowTiles = GEMV_MMA_ROW_TILES;  // 16-row tiles of N per warp: each activation fragment feeds them all
constexpr int kGemvUnroll = GEMV_MMA_UNROLL;       // warp trips whose weight loads are issued before any use

// 16-byte weight load: read-only path, no L1 allocation (each byte is used exactly once).
// volatile keeps a trip's loads ahead of its (volatile) mma in the PTX; ptxas may still interleave.
__device__ __forceinline__ uint4 load_stream_16B(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <typename T>
__device__ __forceinline__ void store_output(T* D, int64_t index, float v, const T* bias, int n, int act) {
  if (bias != nullptr) v += to_float(bias[n]);
  D[index] = from_float<T>(apply_activation(v, act));
}

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMV (swap AB)
// ---------------------------------------------------------------------------------------------
//
// K permutation: the mma sums over its 16 k positions in any order, so each thread feeds its OWN
// chunk. Lane (g = lane/4, t = lane%4) takes chunk c0 + t of weight rows g and g + 8 and of
// activation row g; in mma step s the positions {2t, 2t+1} / {2t+8, 2t+9} carry K elements
// 4s + {0,1} / 4s + {2,3} of that chunk, for the weights (A operand) and activations (B) alike.
// A warp iteration ("trip") covers 4 consecutive chunks of 16 kRowTiles rows; the warps of a
// block interleave their trips over the block's K range.

// Where a thread's rows and activation rows start (rows beyond N / M clamped: valid memory,
// results discarded).
template <typename T, int kBits, int kMTiles, int kRowTiles>
struct GemvRows {
  const uint4* b_row[kRowTiles][2];
  const uint32_t* so_row[kRowTiles][2];
  const uint4* a_row[kMTiles];

  __device__ __forceinline__ GemvRows(const T* A, const uint8_t* B, const uint32_t* scale_offset, int M, int N,
                                      int K, int G, int n_block, int g) {
    const int64_t row_bytes = static_cast<int64_t>(K) * kBits / 8;
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = min(n_block + 16 * r + 8 * h + g, N - 1);
        b_row[r][h] = reinterpret_cast<const uint4*>(B + n * row_bytes);
        so_row[r][h] = scale_offset + static_cast<int64_t>(n) * G;
      }
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
      a_row[i] = reinterpret_cast<const uint4*>(A + static_cast<int64_t>(min(8 * i + g, M - 1)) * K);
  }
};

// One trip: dequantize this thread's chunk of each weight row (w = q * s + o in T) and run the
// mma against the activations. keep = 0 for a chunk past the end: its (scale, offset) is then 0,
// so its weights are exactly 0, and its activations are zeroed too (no 0 * inf).
template <typename T, int kBits, int kMTiles, int kRowTiles>
__device__ __forceinline__ void gemv_trip(float (&acc)[kRowTiles][kMTiles][4], const uint4 (&wq)[kRowTiles][2],
                                          const uint32_t (&so)[kRowTiles][2], uint32_t keep, int chunk,
                                          const GemvRows<T, kBits, kMTiles, kRowTiles>& rows) {
  constexpr int kChunkElems = 128 / kBits;       // K elements per 16-byte weight chunk: 32 or 16
  constexpr int kActVecs = kChunkElems / 8;      // 16-byte activation vectors (8 elements) per chunk: 4 or 2
  constexpr int kWordsPerVec = 8 * kBits / 32;   // weight words covering one activation vector: 1 or 2
  constexpr int kPairs = WeightWord<T, kBits>::kPairs;
#pragma unroll
  for (int v = 0; v < kActVecs; ++v) {
    // Dequantized weight pairs for the 8 K elements of activation vector v: w[r][h][pair].
    uint32_t w[kRowTiles][2][4];
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t so_kept = so[r][h] & keep;
        const uint32_t s2 = low_half_x2(so_kept), o2 = high_half_x2(so_kept);
#pragma unroll
        for (int x = 0; x < kWordsPerVec; ++x) {
          uint32_t q[kPairs];
          WeightWord<T, kBits>::to_pairs(word_of(wq[r][h], v * kWordsPerVec + x), q);
#pragma unroll
          for (int p = 0; p < kPairs; ++p) w[r][h][x * kPairs + p] = fma_pair<T>(q[p], s2, o2);
        }
      }
#pragma unroll
    for (int i = 0; i < kMTiles; ++i) {
      uint4 a = __ldg(rows.a_row[i] + chunk * kActVecs + v);
      a.x &= keep; a.y &= keep; a.z &= keep; a.w &= keep;
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
        // Step 0 takes pairs 0 and 1 (K 0..3 of the vector), step 1 pairs 2 and 3 (K 4..7).
        const uint32_t frag0[4] = {w[r][0][0], w[r][1][0], w[r][0][1], w[r][1][1]};
        mma_16816<T>(acc[r][i], frag0, a.x, a.y);
        const uint32_t frag1[4] = {w[r][0][2], w[r][1][2], w[r][0][3], w[r][1][3]};
        mma_16816<T>(acc[r][i], frag1, a.z, a.w);
      }
    }
  }
}

// Tree reduction over the block's warps (fixed order: deterministic), then warp 0 writes
// D (one split) or its split's slice of the fp32 workspace.
template <typename T, int kMTiles, int kRowTiles>
__device__ __forceinline__ void gemv_finish(float (&acc)[kRowTiles][kMTiles][4], const T* bias, T* D,
                                            float* workspace, int M, int N, int n_block, int act) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  constexpr int kRegs = kRowTiles * kMTiles * 4;
  __shared__ float red[kMaxWarps / 2][kRegs][32];
  for (int half = warps >> 1; half >= 1; half >>= 1) {
    if (warp >= half && warp < 2 * half) {
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
        for (int i = 0; i < kMTiles; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) red[warp - half][(r * kMTiles + i) * 4 + j][lane] = acc[r][i][j];
    }
    __syncthreads();
    if (warp < half) {
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
        for (int i = 0; i < kMTiles; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[r][i][j] += red[warp][(r * kMTiles + i) * 4 + j][lane];
    }
    __syncthreads();
  }
  if (warp != 0) return;

  // Accumulator j of tile (r, i): weight row g + 8 (j >> 1), activation row 2t + (j & 1).
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n_block + 16 * r + g + 8 * (j >> 1);
        const int m = 8 * i + 2 * t + (j & 1);
        if (n < N && m < M) {
          if (gridDim.y == 1) {
            store_output(D, static_cast<int64_t>(m) * N + n, acc[r][i][j], bias, n, act);
          } else {
            workspace[(static_cast<int64_t>(blockIdx.y) * M + m) * N + n] = acc[r][i][j];
          }
        }
      }
}

template <int kRowTiles, int kMTiles>
__device__ __forceinline__ void zero(float (&acc)[kRowTiles][kMTiles][4]) {
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[r][i][j] = 0.0f;
}

// Each warp issues the weight loads of kUnroll trips into registers, then computes them.
template <typename T, int kBits, int kMTiles, int kRowTiles, int kUnroll>
__device__ __forceinline__ void gemv_mma(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                         const uint32_t* __restrict__ scale_offset, const T* __restrict__ bias,
                                         T* __restrict__ D, float* __restrict__ workspace, int M, int N, int K,
                                         int G, int group_shift, int chunks_per_split, int act) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_block = blockIdx.x * (16 * kRowTiles);
  const int c_begin = blockIdx.y * chunks_per_split;
  const int c_end = min(K / (128 / kBits), c_begin + chunks_per_split);
  const GemvRows<T, kBits, kMTiles, kRowTiles> rows(A, B, scale_offset, M, N, K, G, n_block, g);
  float acc[kRowTiles][kMTiles][4];
  zero(acc);

  const int stride = 4 * warps;  // chunks per warp trip across the block
  for (int c0 = c_begin + 4 * warp; c0 < c_end; c0 += stride * kUnroll) {
    uint4 wq[kUnroll][kRowTiles][2];
    uint32_t so[kUnroll][kRowTiles][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      // Past the end: re-read the last chunk (no branch); gemv_trip zeroes its contribution.
      const int chunk = min(c0 + stride * u + t, c_end - 1);
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wq[u][r][h] = load_stream_16B(rows.b_row[r][h] + chunk);
          so[u][r][h] = __ldg(rows.so_row[r][h] + (chunk >> group_shift));
        }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + stride * u + t;
      gemv_trip<T, kBits, kMTiles, kRowTiles>(acc, wq[u], so[u], c < c_end ? 0xffffffffu : 0u, min(c, c_end - 1),
                                              rows);
    }
  }
  gemv_finish<T, kMTiles, kRowTiles>(acc, bias, D, workspace, M, N, n_block, act);
}

// ---------------------------------------------------------------------------------------------
// CUDA-core GEMV (any element type, any arch)
// ---------------------------------------------------------------------------------------------

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
// weight_only._STREAM_MIN_BLOCKS): 16 warps x 32 lanes x 2 trips x 64 bytes = 64 KiB of weight loads
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

#if WO_ELEMENT != 2 && (GEMV_FAMILY == 0 || GEMV_FAMILY == 1)
// gemv_mma_mt{MT}: M <= 8 MT. Two 16-row tiles per warp, four trips of loads in flight (the best of
// 2 x 2, 2 x 4 and cp.async rings of 4 to 8 trips measured on an H200). Two blocks of 256 threads
// per SM (<= 128 registers) where the accumulators allow it.
#define GEMV_MMA_ENTRY(MT)                                                                                     \
  extern "C" __global__ void __launch_bounds__(256, (MT <= 2 ? GEMV_MMA_MIN_BLOCKS : 1)) gemv_mma_mt##MT(                       \
      const element_t* A, const uint8_t* B, const uint32_t* scale_offset, const element_t* bias, element_t* D, \
      float* workspace, int M, int N, int K, int G, int group_shift, int chunks_per_split, int act) {         \
    gemv_mma<element_t, WO_BITS, MT, kGemvRowTiles, kGemvUnroll>(A, B, scale_offset, bias, D, workspace, M, N, \
                                                                 K, G, group_shift, chunks_per_split, act);   \
  }
GEMV_MMA_ENTRY(1)
GEMV_MMA_ENTRY(2)
GEMV_MMA_ENTRY(4)
GEMV_MMA_ENTRY(8)
#endif

#if GEMV_FAMILY == 0
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
#endif

#if WO_ELEMENT != 2 && (GEMV_FAMILY == 0 || GEMV_FAMILY == 2)
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

// D[m, n] = act(sum over splits of workspace[split, m, n] + bias[n]), summed in split order.
extern "C" __global__ void splitk_reduce(const float* workspace, const element_t* bias, element_t* D, int M, int N,
                                         int splits, int act) {
  const int64_t total = static_cast<int64_t>(M) * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += workspace[s * total + i];
    store_output(D, i, v, bias, static_cast<int>(i % N), act);
  }
}
