// The output store shared by the weight-only GEMVs and their split-K reduction: bias, activation,
// one rounding to the element type; and the store of the swap-AB mma accumulators (gemv_mma, gemm_small_m).
#pragma once

#include "common.cuh"

namespace cuops {
namespace gemv {

template <typename T>
__device__ __forceinline__ void store_output(T* D, int64_t index, float v, const T* bias, int n, int act) {
  if (bias != nullptr) v += to_float(bias[n]);
  D[index] = from_float<T>(apply_activation(v, act));
}

// A warp's swap-AB mma accumulators (kRowTiles 16-row tiles of N from n0, kMTiles 8-row tiles of M; lane
// g = lane / 4, t = lane % 4): accumulator j of tile (r, i) is weight row g + 8 (j >> 1), activation row
// 2t + (j & 1). One K split (gridDim.y == 1) stores D; several write their slice of the fp32 workspace
// [splits, M, N] that splitk_reduce sums.
template <typename T, int kRowTiles, int kMTiles>
__device__ __forceinline__ void store_accumulators(const float (&acc)[kRowTiles][kMTiles][4], int n0, int g, int t,
                                                   const T* bias, T* D, float* workspace, int M, int N, int act) {
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + 16 * r + g + 8 * (j >> 1);
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

}  // namespace gemv
}  // namespace cuops
