// Benchmark-only kernel (scripts/sweep_gemv.py): the time a fresh kernel needs to stream `bytes`
// from global memory, read once, as the GEMV reads its weights - the floor for a GEMV of that size.
//
// Each thread keeps UNROLL 16-byte loads in flight per trip (grid-stride over 16-byte words) and
// folds them with XOR; one word per thread is written only if the fold hits a value that random
// data never gives, so the loads stay live and nothing is written in practice.
#include "common.cuh"        // fixed-width integer types under NVRTC
#include "stream_loads.cuh"  // the GEMV's own 16-byte weight load (read-only path, no L1 allocation)

#ifndef UNROLL
#define UNROLL 8
#endif

using cuops::load_stream_16B;

extern "C" __global__ void read_bandwidth(const uint4* __restrict__ src, long long words, uint32_t* sink) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  uint32_t fold = 0;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < words; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = load_stream_16B(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) fold ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = load_stream_16B(src + i);
    fold ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (fold == 0x9e3779b9u) sink[blockIdx.x * blockDim.x + threadIdx.x] = fold;
}
