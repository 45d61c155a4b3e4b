// Split-K reduction of the weight-only GEMVs (gemv_mma.cu, gemv_stream.cu): with gridDim.y > 1
// they write an fp32 workspace [splits, M, N]; this kernel sums it in split order (deterministic),
// adds the bias and applies the activation.
//
// Compile-time choice (NVRTC define): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float (bias / D type).
#include "common.cuh"

#include "gemv_store.cuh"
#include "weight_only_types.cuh"

using namespace cuops::gemv;

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
