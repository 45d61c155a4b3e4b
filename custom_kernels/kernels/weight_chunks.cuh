// A lane's 16-byte weight chunks in the swap-AB tensor-core kernels (gemv_mma.cu, gemm_small_m.cu, gemm_wgmma.cu),
// where lane (g, t) of a warp feeds rows g and g + 8 of each 16-row tile of N from its OWN chunk: where those rows
// and their (scale, offset) words start, their loads, and the dequantized pairs of one activation vector.
#pragma once

#include "common.cuh"
#include "converters.cuh"
#include "stream_loads.cuh"

namespace cuops {

// The dequantized pairs w = q * s + o (in T) of activation vector v (8 K elements) of a 16-byte weight chunk:
// w[0..3] = K elements (0,1), (2,3), (4,5), (6,7) of the vector; s2 / o2 the scale / offset broadcast to pairs.
template <typename T, int kBits>
__device__ __forceinline__ void dequant_vector(const uint4& chunk, int v, uint32_t s2, uint32_t o2, uint32_t (&w)[4]) {
  constexpr int kWordsPerVec = 8 * kBits / 32;  // weight words covering one activation vector: 1 | 2
  constexpr int kPairs = WeightWord<T, kBits>::kPairs;
#pragma unroll
  for (int x = 0; x < kWordsPerVec; ++x) {
    uint32_t q[kPairs];
    WeightWord<T, kBits>::to_pairs(word_of(chunk, v * kWordsPerVec + x), q);
#pragma unroll
    for (int p = 0; p < kPairs; ++p) w[x * kPairs + p] = fma_pair<T>(q[p], s2, o2);
  }
}

// Where this lane's weight rows (g and g + 8 of each of kRowTiles 16-row tiles from n_warp) and their (scale,
// offset) words start; rows past N are clamped (valid memory, results discarded).
template <int kBits, int kRowTiles>
struct WeightRows {
  const uint4* b_row[kRowTiles][2];
  const uint32_t* so_row[kRowTiles][2];

  __device__ __forceinline__ WeightRows(const uint8_t* B, const uint32_t* scale_offset, int N, int K, int G,
                                        int n_warp, int g) {
    const int64_t row_bytes = static_cast<int64_t>(K) * kBits / 8;
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = min(n_warp + 16 * r + 8 * h + g, N - 1);
        b_row[r][h] = reinterpret_cast<const uint4*>(B + n * row_bytes);
        so_row[r][h] = scale_offset + static_cast<int64_t>(n) * G;
      }
  }

  // Issue this lane's loads of one trip: its chunk of each row and the chunk's (scale, offset) word.
  __device__ __forceinline__ void load(uint4 (&wq)[kRowTiles][2], uint32_t (&so)[kRowTiles][2], int chunk,
                                       int group_shift) const {
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        wq[r][h] = load_stream_16B(b_row[r][h] + chunk);
        so[r][h] = __ldg(so_row[r][h] + (chunk >> group_shift));
      }
  }
};

}  // namespace cuops
