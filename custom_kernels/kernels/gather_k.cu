// Act-order (GPTQ desc_act) for the weight-only GEMV: Y[m, k] = X[m, perm[k]] for 16-bit X
// (half / bfloat16: the bits are copied), perm int32 [K], K % 8 == 0, Y 16-byte aligned [M, K].
//
// Launched right before gemv_mma built with WO_PDL_WAIT=1, which is launched as this kernel's
// programmatic dependent: the GEMV's blocks start streaming weights while this runs and wait for
// its completion only before reading Y.
#include "common.cuh"

extern "C" __global__ void gather_k(const uint16_t* __restrict__ X, const int* __restrict__ perm,
                                    uint4* __restrict__ Y, int M, int K) {
#if __CUDA_ARCH__ >= 900
  // Let the dependent GEMV launch now: it waits for this grid's completion before reading Y.
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int vecs_per_row = K / 8;
  const int64_t vecs = static_cast<int64_t>(M) * vecs_per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < vecs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = idx / vecs_per_row;
    const int kv = static_cast<int>(idx - m * vecs_per_row);
    // Two 16-byte loads of perm, eight independent 2-byte gathers, one 16-byte store.
    const int4* p = reinterpret_cast<const int4*>(perm) + 2 * kv;
    const int4 p0 = __ldg(p), p1 = __ldg(p + 1);
    const uint16_t* x = X + m * K;
    uint4 v;
    v.x = static_cast<uint32_t>(__ldg(x + p0.x)) | static_cast<uint32_t>(__ldg(x + p0.y)) << 16;
    v.y = static_cast<uint32_t>(__ldg(x + p0.z)) | static_cast<uint32_t>(__ldg(x + p0.w)) << 16;
    v.z = static_cast<uint32_t>(__ldg(x + p1.x)) | static_cast<uint32_t>(__ldg(x + p1.y)) << 16;
    v.w = static_cast<uint32_t>(__ldg(x + p1.z)) | static_cast<uint32_t>(__ldg(x + p1.w)) << 16;
    Y[idx] = v;
  }
}
