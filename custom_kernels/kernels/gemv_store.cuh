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

// Where accumulator j (0..3) of lane (g = lane / 4, t = lane % 4) of a swap-AB mma.m16n8 tile lies, given the
// tile's first weight row n_tile (N) and activation row m_tile (M): weight row n_tile + g + 8 (j >> 1), activation
// row m_tile + 2 t + (j & 1). gemm_wgmma's accumulators of a warp's 16 rows follow the same mapping.
__device__ __forceinline__ int accumulator_n(int n_tile, int g, int j) { return n_tile + g + 8 * (j >> 1); }
__device__ __forceinline__ int accumulator_m(int m_tile, int t, int j) { return m_tile + 2 * t + (j & 1); }

// A warp's swap-AB mma accumulators (kRowTiles 16-row tiles of N from n0, kMTiles 8-row tiles of M) at
// accumulator_n / accumulator_m. One K split (gridDim.y == 1) stores D; several write their slice of the fp32
// workspace [splits, M, N] that splitk_reduce sums.
template <typename T, int kRowTiles, int kMTiles>
__device__ __forceinline__ void store_accumulators(const float (&acc)[kRowTiles][kMTiles][4], int n0, int g, int t,
                                                   const T* bias, T* D, float* workspace, int M, int N, int act) {
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = accumulator_n(n0 + 16 * r, g, j);
        const int m = accumulator_m(8 * i, t, j);
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
