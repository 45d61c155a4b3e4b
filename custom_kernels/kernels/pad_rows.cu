// Zero-padded int8 rows for the int8 GEMMs, which read A 16 bytes of a row at a time:
// Y[m, k] = k < K ? X[m, k] : 0 for k < K_pad; X [M, K] with any K (its rows need not be aligned),
// Y [M, K_pad] 16-byte aligned, K_pad % 16 == 0 and K_pad >= K.
//
// One 16-byte vector of Y per thread and trip: sixteen byte loads (a warp reads 512 contiguous bytes of
// a row, so the loads coalesce), one 16-byte store. torch's F.pad does the same work in two kernels with a
// byte-wise strided copy (H200: 15.2 us for [1024, 4097] -> [1024, 4112]).
//
// On sm_90 it is launched as a programmatic dependent (X may be the previous kernel's output) and releases the
// GEMM after it, whose Sm90 kernels wait for this grid before their first load of A.
#include "pdl.cuh"

extern "C" __global__ void pad_rows_i8(const uint8_t* X, uint4* __restrict__ Y, int M, int K, int K_pad) {
  cuops::pdl_wait_then_release();
  const int vecs_per_row = K_pad / 16;
  const int64_t vecs = static_cast<int64_t>(M) * vecs_per_row;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < vecs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = idx / vecs_per_row;
    const int k0 = static_cast<int>(idx - m * vecs_per_row) * 16;
    const uint8_t* x = X + m * K;
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int k = k0 + 4 * j + b;
        if (k < K) w[j] |= static_cast<uint32_t>(cuops::load_u8_after_wait(x + k)) << (8 * b);
      }
    }
    Y[idx] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}
