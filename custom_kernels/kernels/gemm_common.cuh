// Helpers shared by the weight-only GEMMs (gemm_mma.cu, gemm_simt.cu): the quantization group of a
// K index and the fused bias + activation epilogue.
#pragma once

#include "common.cuh"

namespace cuops {
namespace gemm {

// Quantization group of K index k: a shift when block_size is a power of two (block_shift >= 0;
// per-channel passes 30, k < 2^30), else a division.
__device__ __forceinline__ int group_of(int k, int block_size, int block_shift) {
  return block_shift >= 0 ? k >> block_shift : k / block_size;
}

template <typename T>
__device__ __forceinline__ float epilogue_value(float v, const T* bias, int n, int act) {
  if (bias != nullptr) v += to_float(bias[n]);
  return apply_activation(v, act);
}

}  // namespace gemm
}  // namespace cuops
