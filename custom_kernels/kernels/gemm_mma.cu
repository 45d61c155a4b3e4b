// Weight-only (scheme 1) tensor-core GEMM (strategy "gemm_mma"): D[M, N] = act(A[M, K] @ dequant(W)^T + bias),
// any M.
//
// W is the QuantizedWeight format (int8 [N, K] or interleaved int4 uint8 [N, K/2]).
// Compile-time choice (NVRTC defines): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float; WO_BITS 4 or 8.
//
// Entry points:
//   gemm_mma_mt{4,8}  half / bf16, sm_80+. CTA tile 128 (N) x 16 MT (M) x 64 (K), 8 warps (4 along
//       N x 2 along M, warp tile 32 x 8 MT), a 4-stage cp.async pipeline carrying A, the packed
//       weights and the (scale, offset) words of the tile. The weights are dequantized in registers
//       straight into mma.m16n8k16 fragments (converters.cuh, then w = q * s + o in the element type,
//       scale and offset packed as two 16-bit halves of one word), fp32 accumulators, fused bias +
//       activation. Needs block_size % 16 == 0 and K % 32 (int4) / K % 16 (int8); M, N and K tails
//       are guarded.
#include "common.cuh"
#include "converters.cuh"
#include "cp_async.cuh"

#include "weight_only_types.cuh"

#include "gemm_common.cuh"
#include "mma_sync.cuh"

namespace cuops {
namespace gemm {

constexpr int kBN = 128;       // N per CTA
constexpr int kBK = 64;        // K per pipeline stage
constexpr int kStages = 4;     // cp.async stages in flight
constexpr int kThreads = 256;  // 8 warps
constexpr int kGroupM = 8;     // CTA raster: kGroupM M-tiles sweep all N-tiles together (L2 reuse)
constexpr int kScalesPerRow = kBK / 16;  // a 64-wide K tile meets at most 4 groups when block_size % 16 == 0

template <int kBMTile, int kBits>
struct TileShape {
  static constexpr int kBM = kBMTile;
  static constexpr int kABytes = kBM * kBK * 2;          // 16-bit A, rows of 8 16-byte chunks
  static constexpr int kBRowBytes = kBK * kBits / 8;      // 32 (int4) or 64 (int8)
  static constexpr int kBBytes = kBN * kBRowBytes;
  static constexpr int kSOBytes = kBN * kScalesPerRow * 4;
  static constexpr int kStageBytes = kABytes + kBBytes + kSOBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
};

// Swapped operands, D^T = W . A^T: the dequantized weights are the mma "A" operand (16 rows of N
// per n16 tile) and the activations the "B" operand (8 rows of M per m8 tile). A thread's
// weight fragment registers come straight out of the dequantization (each used by one mma
// step), and one 16-byte activation load yields the B fragments of two steps in place, so the
// main loop needs no register moves (activations as the A operand, measured on an H200, cost
// about 10 instructions per mma, mostly moves, and ran 1.2-1.3x slower).
//
// K permutation shared by both operands (the mma sums its 16 k positions in any order): within a
// 64-wide K tile, lane (g = lane/4, t = lane%4) owns K elements [16t, 16t + 16); in mma step s
// (0..3) its positions {2t, 2t+1} / {2t+8, 2t+9} carry K elements 16t + 4s + {0,1} / + {2,3}.
// So a thread reads whole 16-byte activation chunks (2t + s/2) and whole weight words.
//
// Shared memory per stage: A [BM][8 chunks], chunk c of row r stored at c ^ (r & 1) so that the
// 8 lanes of a quarter warp (rows 2q, 2q+1; chunks 2t+p) hit 8 distinct 16-byte bank groups;
// B [128][kBRowBytes] plain (a half warp reads 4 consecutive rows = 128 contiguous bytes);
// SO [128][4] (scale, offset) words of groups first_group .. first_group + 3 (clamped to G - 1).
template <typename T, int kBits, int kMT8>
__device__ __forceinline__ void gemm_mma(const T* __restrict__ A, const uint8_t* __restrict__ B,
                                         const uint32_t* __restrict__ scale_offset, const T* __restrict__ bias,
                                         T* __restrict__ D, int M, int N, int K, int G, int block_size,
                                         int block_shift, int act) {
  using Shape = TileShape<16 * kMT8, kBits>;
  constexpr int kBM = Shape::kBM;
  constexpr int kPairs = WeightWord<T, kBits>::kPairs;
  extern __shared__ uint4 smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int warp_n = warp & 3, warp_m = warp >> 2;

  const int tiles_m = UP_DIV(M, kBM), tiles_n = UP_DIV(N, kBN);
  const int per_group = kGroupM * tiles_n;
  const int group_id = blockIdx.x / per_group;
  const int first_m = group_id * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int tile_m = first_m + (blockIdx.x % per_group) % group_rows;
  const int tile_n = (blockIdx.x % per_group) / group_rows;
  const int m0 = tile_m * kBM, n0 = tile_n * kBN;

  const uint32_t smem_base = smem_addr(smem);
  const int64_t b_row_bytes = static_cast<int64_t>(K) * kBits / 8;
  const int k_tiles = UP_DIV(K, kBK);
  auto stage_a = [&](int s) { return smem_base + s * Shape::kStageBytes; };
  auto stage_b = [&](int s) { return stage_a(s) + Shape::kABytes; };
  auto stage_so = [&](int s) { return stage_b(s) + Shape::kBBytes; };

  auto load_stage = [&](int s, int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < kBM * 8 / kThreads; ++i) {
      const int id = tid + i * kThreads, r = id >> 3, c = id & 7;
      const int m = m0 + r, k = k0 + 8 * c;
      const bool valid = m < M && k < K;
      const T* src = valid ? A + static_cast<int64_t>(m) * K + k : A;
      cp_async_16(stage_a(s) + r * 128 + ((c ^ (r & 1)) << 4), src, valid ? 16 : 0);
    }
    constexpr int kChunksPerRow = Shape::kBRowBytes / 16;
    constexpr int kChunkElems = 128 / kBits;
#pragma unroll
    for (int i = 0; i < kBN * kChunksPerRow / kThreads; ++i) {
      const int id = tid + i * kThreads, r = id / kChunksPerRow, c = id % kChunksPerRow;
      const int n = n0 + r, k = k0 + kChunkElems * c;
      const bool valid = n < N && k < K;
      const uint8_t* src = valid ? B + n * b_row_bytes + k * kBits / 8 : B;
      cp_async_16(stage_b(s) + r * Shape::kBRowBytes + c * 16, src, valid ? 16 : 0);
    }
    const int first_group = group_of(k0, block_size, block_shift);
#pragma unroll
    for (int i = 0; i < kBN * kScalesPerRow / kThreads; ++i) {
      const int id = tid + i * kThreads, r = id / kScalesPerRow, j = id % kScalesPerRow;
      const int n = min(n0 + r, N - 1), group = min(first_group + j, G - 1);
      cp_async_4(stage_so(s) + 4 * id, scale_offset + static_cast<int64_t>(n) * G + group);
    }
  };

  float acc[2][kMT8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < kMT8; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) acc[i][j][x] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(next % kStages, next);
    cp_async_commit();

    const int s = kt % kStages;
    const int j_group = min(group_of(kt * kBK + 16 * t, block_size, block_shift) -
                                group_of(kt * kBK, block_size, block_shift), kScalesPerRow - 1);

    // Weight fragments: w[nt][h][pair] for rows g + 8h of n16 tile nt; pairs 2s, 2s+1 feed step s.
    uint32_t w[2][2][8];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_n * 32 + nt * 16 + 8 * h + g;
        const uint32_t so = lds32(stage_so(s) + 4 * (row * kScalesPerRow + j_group));
        const uint32_t s2 = low_half_x2(so), o2 = high_half_x2(so);
        uint32_t words[4];
        if constexpr (kBits == 4) {
          const uint2 v = lds64(stage_b(s) + row * Shape::kBRowBytes + 8 * t);
          words[0] = v.x; words[1] = v.y;
        } else {
          const uint4 v = lds128(stage_b(s) + row * Shape::kBRowBytes + 16 * t);
          words[0] = v.x; words[1] = v.y; words[2] = v.z; words[3] = v.w;
        }
#pragma unroll
        for (int x = 0; x < 16 / (32 / kBits); ++x) {
          uint32_t q[kPairs];
          WeightWord<T, kBits>::to_pairs(words[x], q);
#pragma unroll
          for (int p = 0; p < kPairs; ++p) w[nt][h][x * kPairs + p] = fma_pair<T>(q[p], s2, o2);
        }
      }

#pragma unroll
    for (int half = 0; half < 2; ++half) {  // activation chunk 2t + half feeds steps 2 half, 2 half + 1
#pragma unroll
      for (int mt = 0; mt < kMT8; ++mt) {
        const int r = warp_m * 8 * kMT8 + mt * 8 + g;
        const uint4 a = lds128(stage_a(s) + r * 128 + (((2 * t + half) ^ (r & 1)) << 4));
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int step = 2 * half + e;
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const uint32_t frag[4] = {w[nt][0][2 * step], w[nt][1][2 * step], w[nt][0][2 * step + 1],
                                      w[nt][1][2 * step + 1]};
            mma_16816<T>(acc[nt][mt], frag, e == 0 ? a.x : a.z, e == 0 ? a.y : a.w);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // Accumulator j of (nt, mt): weight row g + 8 (j >> 1) of the n16 tile, activation row 2t + (j & 1).
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int mt = 0; mt < kMT8; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + warp_n * 32 + nt * 16 + g + 8 * (j >> 1);
        const int m = m0 + warp_m * 8 * kMT8 + mt * 8 + 2 * t + (j & 1);
        if (m < M && n < N) {
          D[static_cast<int64_t>(m) * N + n] = from_float<T>(epilogue_value(acc[nt][mt][j], bias, n, act));
        }
      }
}

}  // namespace gemm
}  // namespace cuops

using namespace cuops::gemm;

#if WO_ELEMENT != 2
// gemm_mma_mt{MT8}: CTA tile 128 (N) x 16 MT8 (M).
#define GEMM_MMA_ENTRY(MT8)                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, 1) gemm_mma_mt##MT8(                                  \
      const element_t* A, const uint8_t* B, const uint32_t* scale_offset, const element_t* bias, element_t* D,  \
      int M, int N, int K, int G, int block_size, int block_shift, int act) {                                  \
    gemm_mma<element_t, WO_BITS, MT8>(A, B, scale_offset, bias, D, M, N, K, G, block_size, block_shift, act);  \
  }
GEMM_MMA_ENTRY(4)
GEMM_MMA_ENTRY(8)
#endif
