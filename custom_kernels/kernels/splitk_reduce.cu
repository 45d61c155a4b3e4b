// Split-K reduction of the weight-only GEMVs (gemv_mma.cu, gemv_stream.cu, gemm_small_m.cu, gemm_wgmma.cu):
// with gridDim.y > 1 they write an fp32 workspace [splits, M, N]; this kernel sums it in split order
// (deterministic), adds the bias and applies the activation.
//
// Compile-time choice (NVRTC define): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float (bias / D type).
#include "common.cuh"

#include "gemv_store.cuh"
#include "weight_only_types.cuh"

using namespace cuops;
using namespace cuops::gemv;

namespace {

constexpr int kVec = 4;  // outputs per thread on the vector path: one 16-byte load per workspace slice
constexpr int kLoadsInFlight = 4;  // workspace slices a vector-path thread loads before it adds them

// Four consecutive outputs rounded to T (each to nearest, as from_float) in one store: 8 bytes of half /
// bfloat16, 16 of float.
template <typename T> struct Vec4;
template <> struct Vec4<__half> {
  typedef uint2 type;
  static __device__ __forceinline__ type pack(const float (&v)[kVec]) {
    const __half2 lo = __floats2half2_rn(v[0], v[1]), hi = __floats2half2_rn(v[2], v[3]);
    return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
};
template <> struct Vec4<__nv_bfloat16> {
  typedef uint2 type;
  static __device__ __forceinline__ type pack(const float (&v)[kVec]) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
    return make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
};
template <> struct Vec4<float> {
  typedef float4 type;
  static __device__ __forceinline__ type pack(const float (&v)[kVec]) { return make_float4(v[0], v[1], v[2], v[3]); }
};

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uint64_t>(p) & static_cast<uint64_t>(bytes - 1)) == 0;
}

}  // namespace

// D[m, n] = act(sum over splits of workspace[split, m, n] + bias[n]), summed in split order.
// Rows of N % 4 == 0 with the workspace, D and the bias aligned to four elements take the vector path: each thread
// sums four consecutive outputs with one 16-byte load per slice, up to four slices' loads in flight (H200, 64 x 14336
// over 2 splits: 3.3 us against 5.3 us for one scalar output a thread). The grid strides over either path, so the
// host may size it for the vector path (M N / 4 threads) and a misaligned D still gets every output.
extern "C" __global__ void splitk_reduce(const float* workspace, const element_t* bias, element_t* D, int M, int N,
                                         int splits, int act) {
  const int64_t total = static_cast<int64_t>(M) * N;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  constexpr int kVecBytes = kVec * sizeof(element_t);
  if (N % kVec == 0 && aligned(workspace, 16) && aligned(D, kVecBytes) &&
      (bias == nullptr || aligned(bias, kVecBytes))) {
    const float4* slices = reinterpret_cast<const float4*>(workspace);
    const int64_t vectors = total / kVec;
    for (int64_t i = first; i < vectors; i += stride) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int s0 = 0; s0 < splits; s0 += kLoadsInFlight) {
        // Predicated loads of up to kLoadsInFlight slices, all issued before the first add (a runtime-count loop
        // left a remainder loop that waited on each load in turn: 4 splits took 0.88x the scalar kernel's speed).
        float4 w[kLoadsInFlight];
#pragma unroll
        for (int j = 0; j < kLoadsInFlight; ++j)
          if (s0 + j < splits) w[j] = __ldcs(slices + (s0 + j) * vectors + i);  // read once: evict first
#pragma unroll
        for (int j = 0; j < kLoadsInFlight; ++j)
          if (s0 + j < splits) { v.x += w[j].x; v.y += w[j].y; v.z += w[j].z; v.w += w[j].w; }
      }
      const int n = static_cast<int>((i * kVec) % N);
      float out[kVec] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (bias != nullptr) out[j] += to_float(bias[n + j]);
        out[j] = apply_activation(out[j], act);
      }
      reinterpret_cast<typename Vec4<element_t>::type*>(D)[i] = Vec4<element_t>::pack(out);
    }
    return;
  }
  for (int64_t i = first; i < total; i += stride) {
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += workspace[s * total + i];
    store_output(D, i, v, bias, static_cast<int>(i % N), act);
  }
}
