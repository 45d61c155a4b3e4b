// Shared by the two fused scheme-2 W8A8 kernels (w8a8_kblock_fused.cu: mma.sync,
// w8a8_kblock_wgmma.cu: Hopper wgmma): their argument struct, the grouped tile order and the
// cp.async copies of their shared-memory rings.
#pragma once
#include "common.cuh"

namespace cuops {
namespace w8a8 {

// CTAs in groups of kGroupM tile rows walk across N together, so the A and B tiles a wave
// touches stay in L2 (Triton's grouped ordering).
constexpr int kGroupM = 8;

struct Params {
  const int8_t* A;
  const float* sA;
  const float* oA;
  const int32_t* sumA;
  const int8_t* B;
  const float4* bvec;
  const float* bias;
  void* D;
  int M, N, K, G, act, out_kind;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy that bypasses L1 (.cg: tiles are used once per CTA); with
// src_bytes = 0 nothing is read and the 16 bytes are zero-filled (ragged M/N/K edges).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Tile coordinates of this CTA in the grouped order (1-D grid of tiles_m * tiles_n CTAs).
template <int BM, int BN>
__device__ __forceinline__ void tile_coords(const Params& p, int& m0, int& n0) {
  const int tiles_m = UP_DIV(p.M, BM), tiles_n = UP_DIV(p.N, BN);
  const int pid = blockIdx.x;
  const int per_group = kGroupM * tiles_n;
  const int first_m = (pid / per_group) * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int in_group = pid - (pid / per_group) * per_group;
  m0 = (first_m + in_group % group_m) * BM;
  n0 = (in_group / group_m) * BN;
}

}  // namespace w8a8
}  // namespace cuops
