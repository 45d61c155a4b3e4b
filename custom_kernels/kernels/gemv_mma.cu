// Weight-only (scheme 1) tensor-core GEMV for small M (strategy "gemv_mma"):
// D[M, N] = act(A[M, K] @ dequant(W)^T + bias).
//
// W is the QuantizedWeight format: int8 [N, K], or int4 u = q + 8 packed in the interleaved
// order, uint8 [N, K/2]. Every weight byte is read once, with 16-byte loads ("chunks" of 32 int4 or
// 16 int8 K elements of one row) that bypass L1, where the re-read activations live.
//
// Compile-time choice (NVRTC defines): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float (the
// activation / output type), WO_BITS 4 or 8, WO_PDL_WAIT 1 = launched as a programmatic dependent (sm_90+):
// of the previous kernel in the stream, or of the act-order gather (gather_k.cu, which writes A). Each
// warp issues its first weight loads (the weights are no kernel's output), then waits for that kernel
// (griddepcontrol.wait) before it reads A or writes anything, so the weight stream starts while the
// previous kernel drains; after its wait each warp lets the next kernel launch (launch_dependents), so a
// following GEMV's first weight loads fill this grid's tail.
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
//   (splitk_reduce.cu sums that workspace.)
#include "common.cuh"
#include "converters.cuh"
#include "mma_sync.cuh"
#include "stream_loads.cuh"

#include "gemv_store.cuh"
#include "weight_chunks.cuh"
#include "weight_only_types.cuh"

namespace cuops {
namespace gemv {

// Tunables (NVRTC defines; the host mirrors them in cutlass_ops/weight_only/variants.py).
#ifndef GEMV_MMA_ROW_TILES
#define GEMV_MMA_ROW_TILES 2
#endif
#ifndef GEMV_MMA_UNROLL
#define GEMV_MMA_UNROLL 4
#endif
#ifndef GEMV_MMA_MIN_BLOCKS
#define GEMV_MMA_MIN_BLOCKS 2
#endif
#ifndef GEMV_MMA_CHAINS
#define GEMV_MMA_CHAINS 1
#endif
#ifndef GEMV_MMA_FULL_BATCHES
#define GEMV_MMA_FULL_BATCHES 0
#endif
#ifndef WO_PDL_WAIT
#define WO_PDL_WAIT 0
#endif
constexpr int kMaxWarps = 8;       // warps per block splitting K (a power of two, chosen at launch)
constexpr int kGemvRowTiles = GEMV_MMA_ROW_TILES;  // 16-row tiles of N per warp: each activation fragment feeds them all
constexpr int kGemvUnroll = GEMV_MMA_UNROLL;       // warp trips whose weight loads are issued before any use
// Independent accumulator sets: trip u adds into set u % kGemvChains, so consecutive trips' mma chains overlap
// instead of each mma waiting for the previous one's accumulator; summed once before the block reduction.
constexpr int kGemvChains = GEMV_MMA_CHAINS;

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

#if WO_PDL_WAIT
// A after griddepcontrol.wait: a coherent ld.global (the non-coherent __ldg path returned the previous
// kernel's stale activations on an H100 even with its address computed below the wait). The asm is not
// volatile, so the loads of a trip can still be batched and scheduled freely; its address comes through
// the volatile asm after the wait, which keeps it below the wait (a volatile load per vector cost
// 0.4-0.6 us on a 7 us GEMV).
__device__ __forceinline__ uint4 load_after_wait(const uint4* p) {
  uint4 v;
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
#endif

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
#pragma unroll
  for (int v = 0; v < kActVecs; ++v) {
    // Dequantized weight pairs for the 8 K elements of activation vector v: w[r][h][pair].
    uint32_t w[kRowTiles][2][4];
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t so_kept = so[r][h] & keep;
        dequant_vector<T, kBits>(wq[r][h], v, low_half_x2(so_kept), high_half_x2(so_kept), w[r][h]);
      }
#pragma unroll
    for (int i = 0; i < kMTiles; ++i) {
#if WO_PDL_WAIT
      uint4 a = load_after_wait(rows.a_row[i] + chunk * kActVecs + v);
#else
      uint4 a = __ldg(rows.a_row[i] + chunk * kActVecs + v);
#endif
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

#if WO_PDL_WAIT && __CUDA_ARCH__ >= 900
  // Warp 0 has waited in its first trip; again here so no path writes D before the previous kernel ends.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  store_accumulators<T, kRowTiles, kMTiles>(acc, n_block, g, t, bias, D, workspace, M, N, act);
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

// One batch of a warp: the weight loads of kUnroll trips into registers, then their compute. kFull: every
// chunk of the batch lies below c_end (the common case), so no chunk is clamped and no lane's contribution
// masked: the compiler drops the keep masks of gemv_trip (about a tenth of a trip's instructions).
template <typename T, int kBits, int kMTiles, int kRowTiles, int kUnroll, int kChains, bool kFull>
__device__ __forceinline__ void gemv_batch(float (&acc)[kChains][kRowTiles][kMTiles][4],
                                           GemvRows<T, kBits, kMTiles, kRowTiles>& rows, int c0, int stride,
                                           int c_end, int t, int group_shift, bool first) {
  uint4 wq[kUnroll][kRowTiles][2];
  uint32_t so[kUnroll][kRowTiles][2];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    // Past the end: re-read the last chunk (no branch); gemv_trip zeroes its contribution.
    const int chunk = kFull ? c0 + stride * u + t : min(c0 + stride * u + t, c_end - 1);
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wq[u][r][h] = load_stream_16B(rows.b_row[r][h] + chunk);
        so[u][r][h] = __ldg(rows.so_row[r][h] + (chunk >> group_shift));
      }
  }
#if WO_PDL_WAIT && __CUDA_ARCH__ >= 900
  // A is written by the kernel this one depends on: wait for it once, after the first weight loads
  // are in flight (a no-op when not launched as a programmatic dependent).
  if (first) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    // Only now may the next kernel launch (a trigger before the wait chained every GEMV of a CUDA graph
    // into waiting blocks that held the SMs: 4096 x 14336 W4 M = 1 25.0 us vs 18.7 without PDL).
    asm volatile("griddepcontrol.launch_dependents;");
  }
#endif
#if WO_PDL_WAIT
  // A is read through pointers passed through an empty volatile asm below the wait, so no load of A is
  // hoisted above it (load_after_wait).
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) asm volatile("" : "+l"(rows.a_row[i]));
#endif
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int c = c0 + stride * u + t;
    gemv_trip<T, kBits, kMTiles, kRowTiles>(acc[u % kChains], wq[u], so[u],
                                            kFull || c < c_end ? 0xffffffffu : 0u, kFull ? c : min(c, c_end - 1),
                                            rows);
  }
}

template <typename T, int kBits, int kMTiles, int kRowTiles, int kUnroll, int kChains>
__device__ __forceinline__ void gemv_mma(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                         const uint32_t* __restrict__ scale_offset, const T* __restrict__ bias,
                                         T* __restrict__ D, float* __restrict__ workspace, int M, int N, int K,
                                         int G, int group_shift, int chunks_per_split, int act) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_block = blockIdx.x * (16 * kRowTiles);
  const int c_begin = blockIdx.y * chunks_per_split;
  const int c_end = min(K / (128 / kBits), c_begin + chunks_per_split);
  GemvRows<T, kBits, kMTiles, kRowTiles> rows(A, B, scale_offset, M, N, K, G, n_block, g);
  float acc[kChains][kRowTiles][kMTiles][4];
#pragma unroll
  for (int c = 0; c < kChains; ++c) zero(acc[c]);

  const int stride = 4 * warps;  // chunks per warp trip across the block
  for (int c0 = c_begin + 4 * warp; c0 < c_end; c0 += stride * kUnroll) {
    const bool first = c0 == c_begin + 4 * warp;
#if GEMV_MMA_FULL_BATCHES
    if (c0 + stride * (kUnroll - 1) + 3 < c_end)
      gemv_batch<T, kBits, kMTiles, kRowTiles, kUnroll, kChains, true>(acc, rows, c0, stride, c_end, t, group_shift,
                                                                       first);
    else
#endif
      gemv_batch<T, kBits, kMTiles, kRowTiles, kUnroll, kChains, false>(acc, rows, c0, stride, c_end, t,
                                                                        group_shift, first);
  }
#pragma unroll
  for (int c = 1; c < kChains; ++c)
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[0][r][i][j] += acc[c][r][i][j];
  gemv_finish<T, kMTiles, kRowTiles>(acc[0], bias, D, workspace, M, N, n_block, act);
}
}  // namespace gemv
}  // namespace cuops

using namespace cuops::gemv;

#if WO_ELEMENT != 2
// gemv_mma_mt{MT}: M <= 8 MT. Two 16-row tiles per warp, four trips of loads in flight (the best of
// 2 x 2, 2 x 4 and cp.async rings of 4 to 8 trips measured on an H200). Two blocks of 256 threads
// per SM (<= 128 registers) where the accumulators allow it.
#define GEMV_MMA_ENTRY(MT)                                                                                     \
  extern "C" __global__ void __launch_bounds__(256, (MT <= 2 ? GEMV_MMA_MIN_BLOCKS : 1)) gemv_mma_mt##MT(                       \
      const element_t* A, const uint8_t* B, const uint32_t* scale_offset, const element_t* bias, element_t* D, \
      float* workspace, int M, int N, int K, int G, int group_shift, int chunks_per_split, int act) {         \
    gemv_mma<element_t, WO_BITS, MT, kGemvRowTiles, kGemvUnroll, kGemvChains>(A, B, scale_offset, bias, D, \
        workspace, M, N, K, G, group_shift, chunks_per_split, act);                                            \
  }
GEMV_MMA_ENTRY(1)
GEMV_MMA_ENTRY(2)
GEMV_MMA_ENTRY(4)
GEMV_MMA_ENTRY(8)
#endif
