// The output store shared by the weight-only GEMVs and their split-K reduction: bias, activation,
// one rounding to the element type.
#pragma once

#include "common.cuh"

namespace cuops {
namespace gemv {

template <typename T>
__device__ __forceinline__ void store_output(T* D, int64_t index, float v, const T* bias, int n, int act) {
  if (bias != nullptr) v += to_float(bias[n]);
  D[index] = from_float<T>(apply_activation(v, act));
}

}  // namespace gemv
}  // namespace cuops
