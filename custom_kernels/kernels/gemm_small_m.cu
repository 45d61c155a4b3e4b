// Weight-only (scheme 1) tensor-core GEMM for small M with the activations shared by the warps of a
// block (strategy "gemm_small_m"): D[M, N] = act(A[M, K] @ dequant(W)^T + bias), M <= 64.
//
// W is the QuantizedWeight format: int8 [N, K], or int4 u = q + 8 packed in the interleaved order,
// uint8 [N, K/2]. Needs K % (32 int4 | 16 int8) == 0 and block_size = that chunk x 2^j or one group
// per row, like gemv_mma.
//
// The mma formulation, the converters and the (scale, offset) words are gemv_mma.cu's:
// D^T[N, M] = W[N, K] . A^T[K, M] on mma.m16n8k16, W the 16-row "A" operand dequantized in registers,
// 8 activation rows the n8 "B" operand, fp32 accumulators, and each lane feeding the mma its OWN
// 16-byte weight chunk (the K permutation described in gemv_mma.cu). What differs is who shares what:
// in gemv_mma the warps of a block split K, so every block (16 x row_tiles rows of N) re-reads all of
// A [M, K] through L1/L2 (64 MB of activation traffic against an 8 MB weight at M = 64, N = K = 4096).
// Here the warps split N (warp w owns rows 16 kRowTiles w .. + 16 kRowTiles of the block's tile) and
// all of them walk the same K range, so the block stages its activation tile [8 kMTiles, K stage]
// ONCE in shared memory (cp.async, kStages stages in flight) and every warp reads its activation
// fragments from there; the weights stream from global memory into registers with 16-byte
// L1-bypassing loads issued kPrefetch trips ahead (256 bytes per thread in flight).
//
// A "trip" is 4 consecutive 16-byte chunks of K (128 int4 / 64 int8 elements): lane (g, t) takes chunk
// t of weight rows g and g + 8 of each of its row tiles. A pipeline stage is kStageTrips trips.
// gridDim.x walks N in tiles of 16 kRowTiles kWarps rows; gridDim.y > 1 splits K across blocks into an
// fp32 workspace [splits, M, N] that splitk_reduce.cu sums in a fixed order (chunks_per_split is a
// multiple of the stage's 4 kStageTrips chunks, so only the last split has a partial stage).
//
// Compile-time choice (NVRTC defines; the host mirrors them in cutlass_ops/weight_only/variants.py,
// GemmSmallMConfig): WO_ELEMENT 0 = half, 1 = bfloat16 (the activation / output type), WO_BITS 4 or 8,
// GEMM_SMALL_M_ROW_TILES 1 | 2 | 4 (16-row tiles of N per warp), GEMM_SMALL_M_WARPS 4 | 8 (warps per
// block), GEMM_SMALL_M_STAGES 2 | 3 | 4 (cp.async stages of the activation tile).
//
// Entry points: gemm_small_m_mt{1,2,4,8}: M <= 8 x MT (mt8 only with ROW_TILES <= 2: with 4 row tiles
// its 128 accumulators would not fit in registers next to the weight ring).
#include "common.cuh"
#include "converters.cuh"
#include "cp_async.cuh"
#include "mma_sync.cuh"
#include "stream_loads.cuh"

#include "gemv_store.cuh"
#include "weight_chunks.cuh"
#include "weight_only_types.cuh"

#ifndef GEMM_SMALL_M_ROW_TILES
#define GEMM_SMALL_M_ROW_TILES 2
#endif
#ifndef GEMM_SMALL_M_WARPS
#define GEMM_SMALL_M_WARPS 8
#endif
#ifndef GEMM_SMALL_M_STAGES
#define GEMM_SMALL_M_STAGES 3
#endif

namespace cuops {
namespace small_m {

constexpr int kRowTiles = GEMM_SMALL_M_ROW_TILES;  // 16-row tiles of N per warp (one activation fragment feeds all)
constexpr int kWarps = GEMM_SMALL_M_WARPS;         // warps per block, splitting N
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = GEMM_SMALL_M_STAGES;       // activation stages in shared memory (kStages - 1 in flight)
constexpr int kStageTrips = 2;                     // trips per stage
// Trips of weight loads in flight per warp: kRowTiles x 2 rows x 16 bytes x kPrefetch = 256 bytes per
// thread (64 registers), whatever the row tiles.
constexpr int kPrefetch = 8 / kRowTiles;

static_assert(kRowTiles == 1 || kRowTiles == 2 || kRowTiles == 4, "GEMM_SMALL_M_ROW_TILES must be 1, 2 or 4");
static_assert(kWarps == 4 || kWarps == 8, "GEMM_SMALL_M_WARPS must be 4 or 8");
static_assert(kStages >= 2 && kStages <= 4, "GEMM_SMALL_M_STAGES must be 2, 3 or 4");
static_assert(kPrefetch % kStageTrips == 0, "the unrolled trip loop covers whole stages");

// Shared-memory geometry of one stage: rows of 8 kMTiles activation rows, each holding the stage's
// 16-byte activation vectors (8 K elements) in the slot order of act_slot, plus 16 bytes of padding.
template <int kBits>
struct Geometry {
  static constexpr int kChunkElems = 128 / kBits;                  // K elements per 16-byte weight chunk: 32 | 16
  static constexpr int kVecsPerChunk = kChunkElems / 8;             // activation vectors per chunk: 4 | 2
  static constexpr int kTripVecs = 4 * kVecsPerChunk;               // vectors per row and trip: 16 | 8
  static constexpr int kStageVecs = kStageTrips * kTripVecs;        // vectors per row and stage
  static constexpr int kStageChunks = 4 * kStageTrips;              // chunks per stage (the host mirrors it)
  // The data (a multiple of 128 bytes) plus 16: rows 2q and 2q + 1, read by one quarter warp, start one
  // 16-byte bank group apart (see act_slot).
  static constexpr int kRowBytes = kStageVecs * 16 + 16;
  static_assert((kStageVecs * 16) % 128 == 0, "the padding argument needs rows of whole 128-byte lines");
};

// Slot (16-byte unit) of activation vector v of chunk t within a trip's row segment. A 16-byte shared
// load is served per quarter warp: lanes 8q .. 8q + 7 = rows 2q, 2q + 1 (g) x chunks t = 0..3, all at the
// same v. Slots 2t + (v & 1) (+ 8 for v >= 2) put the 4 chunks of a row in bank groups {c, c+2, c+4, c+6}
// and, with the 16-byte row padding, the other row in {c+1, c+3, c+5, c+7}: conflict-free. (The natural
// order, slot 4t + v for int4, would put chunks t and t + 2 in one bank group.) For int8 (v < 2) it is the
// natural order.
__device__ __forceinline__ constexpr int act_slot(int t, int v) { return 8 * (v >> 1) + 2 * t + (v & 1); }
// Its inverse: the chunk t and vector v that slot s of a trip holds.
__device__ __forceinline__ constexpr int slot_chunk(int s) { return (s >> 1) & 3; }
__device__ __forceinline__ constexpr int slot_vector(int s) { return ((s >> 3) << 1) | (s & 1); }

// The block's copies of one stage: activation rows 0 .. 8 kMTiles - 1, K elements [k0, k0 + 8 kStageVecs),
// zeros for rows >= M and K >= k_end. Consecutive threads fill consecutive slots of a row (conflict-free
// shared stores); their sources are the same trip's 16-byte vectors in another order (whole sectors).
template <typename T, int kBits, int kMTiles>
__device__ __forceinline__ void stage_activations(uint32_t dst, const T* __restrict__ A, int M, int K, int k0,
                                                  int k_end) {
  using Geo = Geometry<kBits>;
  constexpr int kVecs = 8 * kMTiles * Geo::kStageVecs;
#pragma unroll
  for (int i = 0; i < UP_DIV(kVecs, kThreads); ++i) {
    const int id = static_cast<int>(threadIdx.x) + i * kThreads;
    if (kVecs % kThreads == 0 || id < kVecs) {
      const int row = id / Geo::kStageVecs, slot = id % Geo::kStageVecs;
      const int trip = slot / Geo::kTripVecs, s = slot % Geo::kTripVecs;
      // K elements of (chunk, vector) = (slot_chunk(s), slot_vector(s)) of this trip.
      const int k = k0 + 8 * (trip * Geo::kTripVecs + slot_chunk(s) * Geo::kVecsPerChunk + slot_vector(s));
      const bool valid = row < M && k < k_end;
      const T* src = valid ? A + static_cast<int64_t>(row) * K + k : A;
      cp_async_16(dst + row * Geo::kRowBytes + slot * 16, src, valid ? 16 : 0);
    }
  }
}

// One trip: dequantize this lane's chunk of each weight row (w = q * s + o in T) and run the mmas against
// the activation vectors of the same K elements, read from shared memory at act (row g of the stage,
// this trip's segment, slot 2t). keep = 0 for a chunk past the split's end: its (scale, offset) is then 0,
// so its weights are exactly 0 (and its staged activations are zeros).
template <typename T, int kBits, int kMTiles>
__device__ __forceinline__ void trip_mma(float (&acc)[kRowTiles][kMTiles][4], const uint4 (&wq)[kRowTiles][2],
                                         const uint32_t (&so)[kRowTiles][2], uint32_t keep, uint32_t act) {
  using Geo = Geometry<kBits>;
  uint32_t s2[kRowTiles][2], o2[kRowTiles][2];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t so_kept = so[r][h] & keep;
      s2[r][h] = low_half_x2(so_kept);
      o2[r][h] = high_half_x2(so_kept);
    }
#pragma unroll
  for (int v = 0; v < Geo::kVecsPerChunk; ++v) {
    // Dequantized weight pairs for the 8 K elements of activation vector v: w[r][h][pair].
    uint32_t w[kRowTiles][2][4];
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) dequant_vector<T, kBits>(wq[r][h], v, s2[r][h], o2[r][h], w[r][h]);
    // All activation vectors first (independent shared loads in flight together), then the mmas.
    uint4 a[kMTiles];
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
      a[i] = lds128(act + i * 8 * Geo::kRowBytes + (act_slot(0, v) * 16));
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
        // Step 0 takes pairs 0 and 1 (K 0..3 of the vector), step 1 pairs 2 and 3 (K 4..7): gemv_mma's mapping.
        const uint32_t frag0[4] = {w[r][0][0], w[r][1][0], w[r][0][1], w[r][1][1]};
        mma_16816<T>(acc[r][i], frag0, a[i].x, a[i].y);
        const uint32_t frag1[4] = {w[r][0][2], w[r][1][2], w[r][0][3], w[r][1][3]};
        mma_16816<T>(acc[r][i], frag1, a[i].z, a[i].w);
      }
  }
}

template <typename T, int kBits, int kMTiles>
__device__ __forceinline__ void gemm_small_m(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                             const uint32_t* __restrict__ scale_offset, const T* __restrict__ bias,
                                             T* __restrict__ D, float* __restrict__ workspace, int M, int N, int K,
                                             int G, int group_shift, int chunks_per_split, int act) {
  using Geo = Geometry<kBits>;
  constexpr int kStageBytes = 8 * kMTiles * Geo::kRowBytes;
  extern __shared__ uint4 smem[];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_warp = blockIdx.x * (16 * kRowTiles * kWarps) + warp * (16 * kRowTiles);
  const int c_begin = blockIdx.y * chunks_per_split;
  const int c_end = min(K / Geo::kChunkElems, c_begin + chunks_per_split);
  const int n_trips = UP_DIV(c_end - c_begin, 4);
  const int n_stages = UP_DIV(n_trips, kStageTrips);
  const int k_begin = c_begin * Geo::kChunkElems, k_end = c_end * Geo::kChunkElems;
  // Warp-uniform: a warp whose rows all lie past N (the last block of a ragged N) only helps stage.
  const bool active = n_warp < N;
  const WeightRows<kBits, kRowTiles> rows(B, scale_offset, N, K, G, n_warp, g);
  const uint32_t smem_base = smem_addr(smem);

  // Prologue: activation stages 0 .. kStages - 2, one commit group each (empty past the end, so that the
  // group count stays "stage index + kStages - 1" for the waits below).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_stages) {
      stage_activations<T, kBits, kMTiles>(smem_base + s * kStageBytes, A, M, K,
                                           k_begin + s * Geo::kStageVecs * 8, k_end);
    }
    cp_async_commit();
  }
  // ... and the weight loads of the first kPrefetch trips.
  uint4 wq[kPrefetch][kRowTiles][2];
  uint32_t so[kPrefetch][kRowTiles][2];
  if (active) {
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u)
      if (u < n_trips) rows.load(wq[u], so[u], min(c_begin + 4 * u + t, c_end - 1), group_shift);
  }

  float acc[kRowTiles][kMTiles][4];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[r][i][j] = 0.0f;

  // This lane's activation row g and slot 2t within a stage (act_slot(t, v) = act_slot(0, v) + 2t).
  const uint32_t lane_act = smem_base + g * Geo::kRowBytes + act_slot(t, 0) * 16;
  int read_buf = 0;  // stage buffer of the current trip: (trip / kStageTrips) % kStages
  // The ring slot of trip i is i % kPrefetch: unrolled by kPrefetch so that every slot index is static.
  for (int i0 = 0; i0 < n_trips; i0 += kPrefetch) {
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int i = i0 + u;
      if (i < n_trips) {  // block-uniform
        if (u % kStageTrips == 0) {
          // Stage i / kStageTrips has landed once at most kStages - 2 younger groups are pending; the
          // barrier publishes it to every warp and retires the buffer read last (it receives the next stage).
          cp_async_wait<kStages - 2>();
          __syncthreads();
          if (i != 0) read_buf = read_buf + 1 == kStages ? 0 : read_buf + 1;
          const int next = i / kStageTrips + kStages - 1;
          if (next < n_stages) {
            const int write_buf = read_buf == 0 ? kStages - 1 : read_buf - 1;
            stage_activations<T, kBits, kMTiles>(smem_base + write_buf * kStageBytes, A, M, K,
                                                 k_begin + next * Geo::kStageVecs * 8, k_end);
          }
          cp_async_commit();
        }
        if (active) {
          const int c = c_begin + 4 * i + t;
          trip_mma<T, kBits, kMTiles>(acc, wq[u], so[u], c < c_end ? 0xffffffffu : 0u,
                                      lane_act + read_buf * kStageBytes + (u % kStageTrips) * Geo::kTripVecs * 16);
          // Refill the slot just used with the trip kPrefetch ahead.
          if (i + kPrefetch < n_trips) rows.load(wq[u], so[u], min(c + 4 * kPrefetch, c_end - 1), group_shift);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind
  if (!active) return;

  cuops::gemv::store_accumulators<T, kRowTiles, kMTiles>(acc, n_warp, g, t, bias, D, workspace, M, N, act);
}

}  // namespace small_m
}  // namespace cuops

using namespace cuops::small_m;

#if WO_ELEMENT != 2
// gemm_small_m_mt{MT}: M <= 8 MT; dynamic shared memory kStages x 8 MT x Geometry::kRowBytes (host:
// variants.gemm_small_m_smem). One block of kThreads per SM guaranteed its registers (<= 255 each).
#define GEMM_SMALL_M_ENTRY(MT)                                                                                   \
  extern "C" __global__ void __launch_bounds__(kThreads, 1) gemm_small_m_mt##MT(                                 \
      const element_t* A, const uint8_t* B, const uint32_t* scale_offset, const element_t* bias, element_t* D,   \
      float* workspace, int M, int N, int K, int G, int group_shift, int chunks_per_split, int act) {           \
    gemm_small_m<element_t, WO_BITS, MT>(A, B, scale_offset, bias, D, workspace, M, N, K, G, group_shift,       \
                                         chunks_per_split, act);                                                \
  }
GEMM_SMALL_M_ENTRY(1)
GEMM_SMALL_M_ENTRY(2)
GEMM_SMALL_M_ENTRY(4)
#if GEMM_SMALL_M_ROW_TILES <= 2
GEMM_SMALL_M_ENTRY(8)
#endif
#endif
