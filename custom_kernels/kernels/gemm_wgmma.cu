// Weight-only (scheme 1) GEMM for small and medium M on Hopper's wgmma (strategy "gemm_wgmma", sm_90a):
// D[M, N] = act(A[M, K] @ dequant(W)^T + bias), M <= 8 MT.
//
// W is the QuantizedWeight format, as gemv_mma.cu and gemm_small_m.cu read it: int8 [N, K], or int4 u = q + 8
// packed in the interleaved order, uint8 [N, K/2]; K % (32 int4 | 16 int8) == 0 and block_size = that chunk x
// 2^j or one group per row.
//
// Why wgmma: gemm_small_m runs mma.sync, whose issue rate (~1,340 multiply-adds per clock and SM on an H100)
// bounds it at M = 32..64 before the weight stream does; wgmma runs at ~2,048 and is issued once per
// warpgroup and 64 x 8 MT x 16 tile, so the warps' issue slots are left to the dequantization.
//
// The formulation is gemv_mma's with the operands swapped, D^T[N, M] = W[N, K] . A^T[K, M]:
//   - wgmma's A operand is W, from REGISTERS: warp w of a warpgroup dequantizes weight rows 16 w .. 16 w + 15
//     of the warpgroup's 64 into the mma.m16n8k16 A layout, exactly as gemv_mma does (lop3 / prmt converters,
//     w = q * s + o in T with the packed (scale, offset) word), each lane from its OWN 16-byte chunk: lane
//     (g, t) takes chunk t of rows g and g + 8 of each 4-chunk "trip", so within a k16 step the positions
//     {2t, 2t+1} / {2t+8, 2t+9} carry K elements 4s + {0,1} / 4s + {2,3} of activation vector v of chunk t
//     (step 2v + s of the trip);
//   - wgmma's B operand is the activation tile [8 MT rows, 16 K] from SHARED memory, K-major in the 128-byte
//     swizzle. Because of that K permutation it is staged permuted: step j's 32-byte row slice holds, at byte
//     4t, the pair {4s, 4s+1} of vector v of chunk t and, at byte 16 + 4t, the pair {4s+2, 4s+3}. cp.async
//     moves the 4-byte pairs (zeros for rows >= M and K past the split), consecutive lanes reading
//     consecutive pairs of a row (whole 128-byte lines).
// The weights stream from global memory straight into a register ring kPrefetch trips deep (16-byte
// L1-bypassing loads), as in gemm_small_m; every warpgroup of the block shares the staged activations.
//
// A stage is 128 K elements (two 64-element swizzle regions: 1 trip of int4, 2 of int8), kStages stages in
// flight (one cp.async group each, one barrier per stage). Per trip a warpgroup issues its 8 (int4) or 4
// (int8) wgmmas back to back as one commit group and waits for it before the fragment registers they read are
// rewritten; the other warpgroups of the SM dequantize meanwhile. With GEMM_WGMMA_OVERLAP the next trip is
// dequantized into a second fragment set while this trip's wgmmas run (wait for all but the newest group);
// measured slower (255 registers: one block per SM), kept as a variant.
//
// gridDim.x walks N in tiles of 64 kWarpgroups rows; gridDim.y > 1 splits K across blocks into an fp32
// workspace [splits, M, N] that splitk_reduce.cu sums (the host makes chunks_per_split a whole number of
// stages, so only the last split has a partial stage). Accumulators are wgmma's m64nNk16 f32 fragment, which is
// mma.m16n8k16's per 8-column tile: the store is gemv_store.cuh's.
//
// Compile-time choice (NVRTC defines; the host mirrors them in cutlass_ops/weight_only/variants.py,
// GemmWgmmaConfig): WO_ELEMENT 0 = half, 1 = bfloat16, WO_BITS 4 or 8, GEMM_WGMMA_WARPGROUPS 1 | 2 | 4 (64-row
// tiles of N per block), GEMM_WGMMA_STAGES 2..6 (3..6 with the overlap), GEMM_WGMMA_PREFETCH 2 | 4 | 8 (weight
// trips in flight per lane), GEMM_WGMMA_MIN_BLOCKS (__launch_bounds__ blocks per SM), GEMM_WGMMA_OVERLAP 0 | 1,
// GEMM_WGMMA_CLUSTER 0 | 1 (K splits summed in a cluster, cluster_sum_store; the host launches the K splits as one
// cluster of gridDim.y <= 8 blocks and passes no workspace).
//
// Entry points: gemm_wgmma_mt{1,2,4,8,16}: M <= 8 MT (wgmma n = 8 MT). Dynamic shared memory kStages x 256 x
// 8 MT bytes + 1024 (the swizzle's 1024-byte alignment), with GEMM_WGMMA_CLUSTER at least the accumulators'
// 2048 x kWarpgroups x MT bytes: variants.gemm_wgmma_smem.
#include "common.cuh"
#include "converters.cuh"
#include "cp_async.cuh"
#include "sm90_wgmma.cuh"
#include "stream_loads.cuh"

#include "gemv_store.cuh"
#include "weight_chunks.cuh"
#include "weight_only_types.cuh"

#ifndef GEMM_WGMMA_WARPGROUPS
#define GEMM_WGMMA_WARPGROUPS 2
#endif
#ifndef GEMM_WGMMA_STAGES
#define GEMM_WGMMA_STAGES 4
#endif
#ifndef GEMM_WGMMA_PREFETCH
#define GEMM_WGMMA_PREFETCH 2
#endif
#ifndef GEMM_WGMMA_OVERLAP
#define GEMM_WGMMA_OVERLAP 0
#endif
#ifndef GEMM_WGMMA_MIN_BLOCKS
#define GEMM_WGMMA_MIN_BLOCKS 1
#endif
#ifndef GEMM_WGMMA_CLUSTER
#define GEMM_WGMMA_CLUSTER 0
#endif

#if CUOPS_HAS_SM90A
namespace cuops {
namespace wo_wgmma {

constexpr int kWarpgroups = GEMM_WGMMA_WARPGROUPS;  // 64-row tiles of N per block, one per warpgroup
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kStages = GEMM_WGMMA_STAGES;          // activation stages in shared memory (kStages - 1 in flight)
constexpr int kPrefetch = GEMM_WGMMA_PREFETCH;      // weight trips in flight per lane (register ring)
constexpr int kStageElems = 128;                    // K elements per stage: two 128-byte swizzle rows of 64
// Trip i + 1 is dequantized while trip i's wgmmas run (two fragment sets; one more stage buffer kept unwritten).
constexpr bool kOverlap = GEMM_WGMMA_OVERLAP != 0;
constexpr int kLookahead = kStages - 1 - (kOverlap ? 1 : 0);  // stages in flight ahead of the one being read
// The K splits of a block of rows are one thread-block cluster (gridDim.y <= 8 blocks) that sums its partial
// accumulators through distributed shared memory, instead of the fp32 workspace and splitk_reduce's launch.
constexpr bool kClusterSum = GEMM_WGMMA_CLUSTER != 0;
constexpr int kMaxClusterSplits = 8;  // the portable cluster size (variants.WGMMA_MAX_CLUSTER)

static_assert(kWarpgroups == 1 || kWarpgroups == 2 || kWarpgroups == 4, "GEMM_WGMMA_WARPGROUPS must be 1, 2 or 4");
static_assert(kStages >= 2 && kStages <= 6, "GEMM_WGMMA_STAGES must be 2..6");
static_assert(kLookahead >= 1, "the overlap needs GEMM_WGMMA_STAGES >= 3");
static_assert(kPrefetch == 2 || kPrefetch == 4 || kPrefetch == 8, "GEMM_WGMMA_PREFETCH must be 2, 4 or 8");

template <int kBits>
struct Geometry {
  static constexpr int kChunkElems = 128 / kBits;                  // K elements per 16-byte weight chunk: 32 | 16
  static constexpr int kVecsPerChunk = kChunkElems / 8;             // activation vectors per chunk: 4 | 2
  static constexpr int kTripElems = 4 * kChunkElems;                // K elements per trip: 128 | 64
  static constexpr int kTripsPerStage = kStageElems / kTripElems;  // 1 | 2
  static constexpr int kStepsPerTrip = kTripElems / 16;             // k16 wgmma steps per trip: 8 | 4
  static_assert(kPrefetch % kTripsPerStage == 0, "the unrolled trip loop covers whole stages");
};

template <int kMTiles>
struct Tile {
  static constexpr int kRows = 8 * kMTiles;          // activation rows staged: the wgmma N
  static constexpr int kRegionBytes = kRows * 128;   // 64 K elements of every row, 128-byte swizzled
  static constexpr int kStageBytes = 2 * kRegionBytes;
};

// The block's copies of one stage: activation rows 0 .. 8 kMTiles - 1, K elements [k0, k0 + 128) in the
// permuted, swizzled order described at the top (zeros for rows >= M and K >= k_end). Thread x copies pair
// p = x % 64 of rows x / 64 + kRowsPerPass i: where a pair goes within its row depends on p only, and the row's
// swizzle XOR splits into the thread's bits (m0 < kRowsPerPass) and the pass's, so the addresses are set up
// once per thread (Stager) and each copy costs a few instructions.
template <typename T, int kBits, int kMTiles>
struct Stager {
  static constexpr int kPairsPerRow = kStageElems / 2;                  // 4-byte pairs of 2 elements
  static constexpr int kRowsPerPass = kThreads / kPairsPerRow;          // 2 | 4 | 8
  static constexpr int kPasses = Tile<kMTiles>::kRows / kRowsPerPass;
  static_assert(Tile<kMTiles>::kRows % kRowsPerPass == 0 && 8 % kRowsPerPass == 0, "whole passes, disjoint XOR bits");
  static_assert(kPasses >= 1, "every thread copies");

  const T* src;         // row m0, K element 2p (add k0 and the pass's rows)
  int64_t pass_bytes;   // kRowsPerPass rows of A, in bytes (the copies walk a byte pointer: one 64-bit add each)
  uint32_t dst;       // row m0's byte of pair p within a stage, before the row's swizzle
  uint32_t unit_x;    // the 16-byte unit of pair p, XORed with m0's swizzle bits, << 4
  int m0, two_p;

  __device__ __forceinline__ Stager(const T* A, int K) {
    using Geo = Geometry<kBits>;
    constexpr int kHalfChunk = Geo::kChunkElems / 2;  // pairs per chunk
    const int p = static_cast<int>(threadIdx.x) % kPairsPerRow;
    m0 = static_cast<int>(threadIdx.x) / kPairsPerRow;
    two_p = 2 * p;
    // Pair p of the stage = trip tr, chunk t, vector v, step half s, pair h of the step's 4 elements.
    const int tr = p / (4 * kHalfChunk), r = p % (4 * kHalfChunk);
    const int t = r / kHalfChunk, e = r % kHalfChunk;
    const int v = e >> 2, s = (e >> 1) & 1, h = e & 1;
    const int step = tr * Geo::kStepsPerTrip + 2 * v + s;
    const int unit = 2 * (step & 3) + h;  // 16-byte unit of the 128-byte row
    dst = (step >> 2) * Tile<kMTiles>::kRegionBytes + m0 * 128 + 4 * t;
    unit_x = static_cast<uint32_t>(unit ^ m0) << 4;
    src = A + static_cast<int64_t>(m0) * K + two_p;
    pass_bytes = static_cast<int64_t>(kRowsPerPass) * K * static_cast<int64_t>(sizeof(T));
  }

  // Zeros in rows M .. kRows - 1 of every stage buffer, written once: copy() never writes those rows.
  __device__ __forceinline__ void zero_tail_rows(uint32_t smem, int M) const {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      if (m0 + kRowsPerPass * i >= M) {
        for (int b = 0; b < kStages; ++b) {
          const uint32_t addr = smem + b * Tile<kMTiles>::kStageBytes + dst + i * kRowsPerPass * 128 +
                                (unit_x ^ (static_cast<uint32_t>((kRowsPerPass * i) & 7) << 4));
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(0u));
        }
      }
    }
  }

  // Rows < M of one stage (K past k_end as zeros, without reading).
  __device__ __forceinline__ void copy(uint32_t stage, int M, int k0, int k_end) const {
    const bool k_ok = k0 + two_p < k_end;
    const char* from = reinterpret_cast<const char*>(k_ok ? src + k0 : src - two_p);  // src - two_p: the row's start
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      if (m0 + kRowsPerPass * i < M) {
        const uint32_t addr =
            stage + dst + i * kRowsPerPass * 128 + (unit_x ^ (static_cast<uint32_t>((kRowsPerPass * i) & 7) << 4));
        cp_async_4(addr, from, k_ok ? 4 : 0);
      }
      from += pass_bytes;
    }
  }
};

// GEMM_WGMMA_CLUSTER with gridDim.y = S > 1 K splits, the cluster (1, S, 1): every block puts its warps'
// accumulators into its shared memory (the stage buffers, free after the main loop), float4 e = (w kMTiles + i)
// 32 + l holding accumulators 0..3 of M tile i of lane l of warp w; then the S blocks share the sum: block r takes
// e = r kThreads + x, + S kThreads, ..., adds the S blocks' float4 e in split order (as splitk_reduce:
// deterministic) and stores its four outputs. The second cluster barrier keeps every block's shared memory alive
// until the others have read it.
template <typename T, int kMTiles>
__device__ __forceinline__ void cluster_sum_store(const float (&acc)[1][kMTiles][4], uint32_t red, int warp, int lane,
                                                  int n_block, const T* bias, T* D, int M, int N, int act) {
  constexpr int kElems = kThreads * kMTiles;  // float4s of the block's accumulators
  __syncthreads();  // every warpgroup's wgmmas, the last readers of the stage buffers, are done
  float4* mine = reinterpret_cast<float4*>(__cvta_shared_to_generic(red));
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
    mine[(warp * kMTiles + i) * 32 + lane] = make_float4(acc[0][i][0], acc[0][i][1], acc[0][i][2], acc[0][i][3]);
  sm90::cluster_sync();
  // The remote loads below are plain asm (so that the S loads of an element are issued together); their address
  // comes through this volatile asm, which keeps them below the barrier.
  asm volatile("" : "+r"(red));
  const int splits = static_cast<int>(gridDim.y);
  for (int e = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x); e < kElems;
       e += splits * kThreads) {
    float4 x[kMaxClusterSplits];
#pragma unroll
    for (int b = 0; b < kMaxClusterSplits; ++b)
      if (b < splits) x[b] = sm90::ld_cluster_f4(red + 16u * static_cast<uint32_t>(e), b);
    float v[4] = {x[0].x, x[0].y, x[0].z, x[0].w};
#pragma unroll
    for (int b = 1; b < kMaxClusterSplits; ++b)
      if (b < splits) {
        v[0] += x[b].x;
        v[1] += x[b].y;
        v[2] += x[b].z;
        v[3] += x[b].w;
      }
    // Float4 e holds the accumulators of lane l of warp w, M tile i (as stored above).
    const int l = e & 31, i = (e >> 5) % kMTiles, w = (e >> 5) / kMTiles;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = cuops::gemv::accumulator_n(n_block + 16 * w, l >> 2, j);
      const int m = cuops::gemv::accumulator_m(8 * i, l & 3, j);
      if (n < N && m < M) cuops::gemv::store_output(D, static_cast<int64_t>(m) * N + n, v[j], bias, n, act);
    }
  }
  sm90::cluster_sync();
}

// One trip of a warpgroup, part 1: dequantize this lane's chunk of rows g and g + 8 into the A fragments of the
// trip's k16 steps. keep = 0 for a chunk past the split's end: its (scale, offset) is then 0, so its weights are
// exactly 0 (and its staged activations are zeros).
template <typename T, int kBits>
__device__ __forceinline__ void dequant_trip(uint32_t (&a)[Geometry<kBits>::kStepsPerTrip][4], const uint4 (&wq)[1][2],
                                             const uint32_t (&so)[1][2], uint32_t keep) {
#pragma unroll
  for (int v = 0; v < Geometry<kBits>::kVecsPerChunk; ++v) {
    uint32_t w[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t so_kept = so[0][h] & keep;
      dequant_vector<T, kBits>(wq[0][h], v, low_half_x2(so_kept), high_half_x2(so_kept), w[h]);
    }
    // Step 2v takes pairs 0 and 1 (K 0..3 of the vector), step 2v + 1 pairs 2 and 3: gemv_mma's mapping.
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      a[2 * v + s][0] = w[0][2 * s];
      a[2 * v + s][1] = w[1][2 * s];
      a[2 * v + s][2] = w[0][2 * s + 1];
      a[2 * v + s][3] = w[1][2 * s + 1];
    }
  }
}

// Part 2: issue the trip's wgmmas against the staged activations (stage_addr: the stage buffer, first_step: the
// trip's first k16 step in it) as one commit group.
template <typename T, int kBits, int kMTiles>
__device__ __forceinline__ void issue_trip(float* acc, const uint32_t (&a)[Geometry<kBits>::kStepsPerTrip][4],
                                           uint32_t stage_addr, int first_step) {
  sm90::wgmma_fence();  // the fragments (and the accumulators) are written before the wgmmas read them
  const uint64_t stage_desc = sm90::sw128_desc(stage_addr);
#pragma unroll
  for (int j = 0; j < Geometry<kBits>::kStepsPerTrip; ++j) {
    const int step = first_step + j;
    const uint32_t offset = (step >> 2) * Tile<kMTiles>::kRegionBytes + (step & 3) * 32;
    sm90::wgmma_rs<T, 8 * kMTiles>(acc, a[j], sm90::desc_advance(stage_desc, offset), 1);
  }
  sm90::wgmma_commit();
}

template <typename T, int kBits, int kMTiles>
__device__ __forceinline__ void gemm_wgmma(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                           const uint32_t* __restrict__ scale_offset, const T* __restrict__ bias,
                                           T* __restrict__ D, float* __restrict__ workspace, int M, int N, int K, int G,
                                           int group_shift, int chunks_per_split, int act) {
  using Geo = Geometry<kBits>;
  constexpr int kStageBytes = Tile<kMTiles>::kStageBytes;
  extern __shared__ uint4 smem[];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_group = blockIdx.x * (64 * kWarpgroups) + 64 * (warp >> 2);
  const int n_warp = n_group + 16 * (warp & 3);
  const int c_begin = blockIdx.y * chunks_per_split;
  const int c_end = min(K / Geo::kChunkElems, c_begin + chunks_per_split);
  const int n_trips = UP_DIV(c_end - c_begin, 4);
  const int n_stages = UP_DIV(n_trips, Geo::kTripsPerStage);
  const int k_begin = c_begin * Geo::kChunkElems, k_end = c_end * Geo::kChunkElems;
  const WeightRows<kBits, 1> rows(B, scale_offset, N, K, G, n_warp, g);  // one 16-row tile per warp
  const Stager<T, kBits, kMTiles> stager(A, K);
  // The 128-byte swizzle repeats every 1024 bytes: stages start on that boundary.
  const uint32_t smem_base = (smem_addr(smem) + 1023u) & ~1023u;

  // Rows >= M stay zero in every buffer (copy() skips them); the first barrier below publishes the zeros.
  stager.zero_tail_rows(smem_base, M);
  // Prologue: stages 0 .. kLookahead - 1, one commit group each (empty past the end, so that the group count
  // stays "stage index + kLookahead" for the waits below) ...
#pragma unroll
  for (int s = 0; s < kLookahead; ++s) {
    if (s < n_stages) stager.copy(smem_base + s * kStageBytes, M, k_begin + s * kStageElems, k_end);
    cp_async_commit();
  }
  // ... and the weight loads of the first kPrefetch trips.
  uint4 wq[kPrefetch][1][2];
  uint32_t so[kPrefetch][1][2];
#pragma unroll
  for (int u = 0; u < kPrefetch; ++u)
    if (u < n_trips) rows.load(wq[u], so[u], min(c_begin + 4 * u + t, c_end - 1), group_shift);

  float acc[1][kMTiles][4];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[0][i][j] = 0.0f;
  // The trips' A fragments: two sets with the overlap (trip i's wgmmas read set i % 2 while trip i + 1 is
  // dequantized into the other).
  uint32_t a[kOverlap ? 2 : 1][Geo::kStepsPerTrip][4];

  int read_buf = 0;  // stage buffer of the current trip: (trip / kTripsPerStage) % kStages
  // The ring slot of trip i is i % kPrefetch: unrolled by kPrefetch so that every slot index is static.
  for (int i0 = 0; i0 < n_trips; i0 += kPrefetch) {
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int i = i0 + u;
      if (i < n_trips) {  // block-uniform
        if (u % Geo::kTripsPerStage == 0) {
          // Stage i / kTripsPerStage has landed once at most kLookahead - 1 younger groups are pending; the
          // proxy fence makes this thread's copies visible to wgmma's reads, the barrier publishes them to every
          // warp. The buffer then refilled (kLookahead stages ahead) was last read by trips whose wgmmas every
          // warpgroup has waited for: the previous stage's without the overlap, the one before it with it.
          cp_async_wait<kLookahead - 1>();
          sm90::fence_proxy_async();
          __syncthreads();
          if (i != 0) read_buf = read_buf + 1 == kStages ? 0 : read_buf + 1;
          const int next = i / Geo::kTripsPerStage + kLookahead;
          if (next < n_stages) {
            const int write_buf = read_buf + kLookahead >= kStages ? read_buf + kLookahead - kStages
                                                                   : read_buf + kLookahead;
            stager.copy(smem_base + write_buf * kStageBytes, M, k_begin + next * kStageElems, k_end);
          }
          cp_async_commit();
        }
        // Every warpgroup runs every trip, also one whose rows lie past N (clamped rows, results discarded): a
        // wgmma in a branch ptxas cannot prove block-uniform is serialized.
        const int c = c_begin + 4 * i + t;
        auto& frag = a[kOverlap ? u % 2 : 0];
        dequant_trip<T, kBits>(frag, wq[u], so[u], c < c_end ? 0xffffffffu : 0u);
        // Refill the slot just dequantized with the trip kPrefetch ahead.
        if (i + kPrefetch < n_trips) rows.load(wq[u], so[u], min(c + 4 * kPrefetch, c_end - 1), group_shift);
        issue_trip<T, kBits, kMTiles>(&acc[0][0][0], frag, smem_base + read_buf * kStageBytes,
                                      (u % Geo::kTripsPerStage) * Geo::kStepsPerTrip);
        // Without the overlap wait for this trip's wgmmas; with it for the previous trip's (whose fragment set the
        // next trip rewrites).
        sm90::wgmma_wait<kOverlap ? 1 : 0>();
      }
    }
  }
  sm90::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sm90::fence_reg(acc[0][i][j]);
  cp_async_wait<0>();  // only empty groups remain; leave none behind
  if (kClusterSum && gridDim.y > 1) {  // every thread takes part in the cluster barriers, rows past N too
    cluster_sum_store<T, kMTiles>(acc, smem_base, warp, lane, static_cast<int>(blockIdx.x) * (64 * kWarpgroups), bias,
                                  D, M, N, act);
    return;
  }
  if (n_group >= N) return;  // a warpgroup whose rows all lie past N (the last block of a ragged N)

  cuops::gemv::store_accumulators<T, 1, kMTiles>(acc, n_warp, g, t, bias, D, workspace, M, N, act);
}

}  // namespace wo_wgmma
}  // namespace cuops
#endif  // CUOPS_HAS_SM90A

#if WO_ELEMENT != 2
#if CUOPS_HAS_SM90A
#define GEMM_WGMMA_BODY(MT)                                                                                     \
  cuops::wo_wgmma::gemm_wgmma<element_t, WO_BITS, MT>(A, B, scale_offset, bias, D, workspace, M, N, K, G,       \
                                                      group_shift, chunks_per_split, act);
#else
#define GEMM_WGMMA_BODY(MT) __trap();  // wgmma needs sm_90a; the host selects these kernels only there
#endif
// gemm_wgmma_mt{MT}: M <= 8 MT.
#define GEMM_WGMMA_ENTRY(MT)                                                                                    \
  extern "C" __global__ void __launch_bounds__(128 * GEMM_WGMMA_WARPGROUPS, GEMM_WGMMA_MIN_BLOCKS)              \
      gemm_wgmma_mt##MT(const element_t* A, const uint8_t* B, const uint32_t* scale_offset,                    \
                        const element_t* bias, element_t* D, float* workspace, int M, int N, int K, int G,       \
                        int group_shift, int chunks_per_split, int act) {                                      \
    GEMM_WGMMA_BODY(MT)                                                                                          \
  }
GEMM_WGMMA_ENTRY(1)
GEMM_WGMMA_ENTRY(2)
GEMM_WGMMA_ENTRY(4)
GEMM_WGMMA_ENTRY(8)
GEMM_WGMMA_ENTRY(16)
#endif
