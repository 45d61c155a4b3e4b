// Probe (scripts/probe_mma_sync.py): the throughput of mma.sync.m16n8k16 (fp16 in, fp32 accumulators) on
// one SM, the instruction every weight-only tensor-core kernel here issues (gemv_mma, gemm_small_m,
// gemm_mma). Each warp runs ITERS rounds of CHAINS independent accumulator tiles (CHAINS mmas per round,
// no loads, operands in registers), so the tensor pipe is the only limit once enough warps and chains
// are in flight. Operand values do not matter; the sums are stored so the work is not removed.
// Defines: CHAINS (independent accumulators per warp: 1..16).
typedef unsigned int uint32_t;  // NVRTC without the standard headers

#ifndef CHAINS
#define CHAINS 8
#endif

extern "C" __global__ void mma_sync_peak(float* out, int iters, long long* clk) {
  float acc[CHAINS][4];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[c][j] = 0.0f;
  // Operands from the thread index: not known at compile time, so the mmas cannot be folded away.
  const uint32_t a0 = threadIdx.x * 0x00010001u, a1 = a0 ^ 0x3c003c00u, b0 = a0 + 1u, b1 = a1 + 1u;
  __syncthreads();
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
          : "r"(a0), "r"(a1), "r"(a1), "r"(a0), "r"(b0), "r"(b1));
  }
  __syncthreads();
  const long long t1 = clock64();
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}
