// Hopper (sm_90a) building blocks shared by the W8A8 and weight-only wgmma kernels and the benchmark probe
// scripts/kernels/wgmma_overlap.cu: mbarriers, bulk / TMA copies, wgmma descriptors, the int8
// wgmma shapes, register fences and named barriers. Everything is inside CUOPS_HAS_SM90A: only
// sm_90a has wgmma, setmaxnreg and the bulk copy engine.
#pragma once
#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUOPS_HAS_SM90A 1
#else
#define CUOPS_HAS_SM90A 0
#endif

#if CUOPS_HAS_SM90A
namespace cuops {
namespace sm90 {

// cp.async writes through the generic proxy and wgmma reads shared memory through the async
// proxy: the writer orders the two with this fence before it signals the stage full.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Spin until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle: rows of 128 bytes,
// 8-row atoms of 1024 bytes (stride byte offset), start address in 16-byte units; the leading
// byte offset is unused for swizzled K-major layouts. Advancing k by 32 bytes inside the atom
// only moves the start address: the hardware applies the XOR swizzle to the final address.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// The descriptor of the tile `bytes` (a multiple of 16) past `desc`'s: why an add is enough: the start address
// field holds shared address >> 4 in 14 bits, shared addresses stay below 2^18 (228 KB), so no carry leaves the
// field, and the other fields are unchanged (one uniform add instead of the mask, shift and OR of sw128_desc).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  // A 32-bit add on the low word (a 64-bit one costs a carry chain of uniform instructions per wgmma).
  return (desc & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + (bytes >> 4));
}

// Orders this thread's earlier register accesses before later wgmma reads/writes of them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Keeps the compiler from moving accesses of r across the asynchronous wgmma boundaries.
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Eight accumulator operands d[i..i+7] of a wgmma asm statement (read and written).
#define SM90_D8(i)                                                                              \
  "+r"(d[(i)]), "+r"(d[(i) + 1]), "+r"(d[(i) + 2]), "+r"(d[(i) + 3]), "+r"(d[(i) + 4]), "+r"(d[(i) + 5]), \
      "+r"(d[(i) + 6]), "+r"(d[(i) + 7])

// D(64x128, s32) (+)= A(64x32, s8, smem) * B(128x32, s8, smem)^T; scale_d = 0 starts from zero.
__device__ __forceinline__ void wgmma_m64n128k32(uint32_t* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
      "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p;\n}\n"
      : SM90_D8(0), SM90_D8(8), SM90_D8(16), SM90_D8(24), SM90_D8(32), SM90_D8(40),
        SM90_D8(48), SM90_D8(56)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D(64x64, s32) (+)= A(64x32, s8, smem) * B(64x32, s8, smem)^T; scale_d = 0 starts from zero.
__device__ __forceinline__ void wgmma_m64n64k32(uint32_t* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p;\n}\n"
      : SM90_D8(0), SM90_D8(8), SM90_D8(16), SM90_D8(24)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D(64x192, s32) (+)= A(64x32, s8, smem) * B(192x32, s8, smem)^T; scale_d = 0 starts from zero.
__device__ __forceinline__ void wgmma_m64n192k32(uint32_t* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "
      "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, "
      "%88, %89, %90, %91, %92, %93, %94, %95}, "
      "%96, %97, p;\n}\n"
      : SM90_D8(0), SM90_D8(8), SM90_D8(16), SM90_D8(24), SM90_D8(32), SM90_D8(40),
        SM90_D8(48), SM90_D8(56), SM90_D8(64), SM90_D8(72), SM90_D8(80), SM90_D8(88)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}


// D(64 x kN, f32) += A(64 x 16, T, registers) * B(kN x 16, T, shared memory, K-major)^T: the weight-only
// GEMM's step (gemm_wgmma.cu), A a warpgroup's dequantized weight fragments (each warp's 16 rows in the
// mma.m16n8k16 A layout), B the staged activation tile behind desc_b; scale_d = 0 ignores d's old values.
template <typename T, int kN>
__device__ __forceinline__ void wgmma_rs(float* d, const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

// Four / eight accumulator operands d[i..] of a wgmma asm statement (read and written).
#define SM90_F4(i) "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define SM90_F8(i) SM90_F4(i), SM90_F4((i) + 4)

// wgmma_rs<T, N> for T = __half and __nv_bfloat16, whose PTX differs only in the type name: D_REGS the
// accumulators' operand list, A_REGS / DESC / PRED the operand numbers of a, desc_b and scale_d, and the
// variadic rest the accumulators' constraints.
#define SM90_WGMMA_RS_TYPED(T, TYPE, N, D_REGS, A_REGS, DESC, PRED, ...)                                     \
  template <>                                                                                                 \
  __device__ __forceinline__ void wgmma_rs<T, N>(float* d, const uint32_t(&a)[4], uint64_t desc_b, int scale_d) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n"                                          \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " D_REGS ", " A_REGS ", " \
                 DESC ", p, 1, 1, 0;\n}\n"                                                                     \
                 : __VA_ARGS__                                                                                \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));                    \
  }
#define SM90_WGMMA_RS(N, D_REGS, A_REGS, DESC, PRED, ...)                                 \
  SM90_WGMMA_RS_TYPED(__half, "f16", N, D_REGS, A_REGS, DESC, PRED, __VA_ARGS__)          \
  SM90_WGMMA_RS_TYPED(__nv_bfloat16, "bf16", N, D_REGS, A_REGS, DESC, PRED, __VA_ARGS__)

SM90_WGMMA_RS(8, "{%0, %1, %2, %3}", "{%4, %5, %6, %7}", "%8", "%9", SM90_F4(0))
SM90_WGMMA_RS(16, "{%0, %1, %2, %3, %4, %5, %6, %7}", "{%8, %9, %10, %11}", "%12", "%13", SM90_F8(0))
SM90_WGMMA_RS(32, "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}",
              "{%16, %17, %18, %19}", "%20", "%21", SM90_F8(0), SM90_F8(8))
SM90_WGMMA_RS(64,
              "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
              "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}",
              "{%32, %33, %34, %35}", "%36", "%37", SM90_F8(0), SM90_F8(8), SM90_F8(16), SM90_F8(24))
SM90_WGMMA_RS(128,
              "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
              "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
              "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
              "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}",
              "{%64, %65, %66, %67}", "%68", "%69", SM90_F8(0), SM90_F8(8), SM90_F8(16), SM90_F8(24),
              SM90_F8(32), SM90_F8(40), SM90_F8(48), SM90_F8(56))
#undef SM90_WGMMA_RS
#undef SM90_WGMMA_RS_TYPED

// Thread-block cluster (sm_90): every thread of every block of the cluster arrives, then waits for all; release /
// acquire order the shared-memory writes before the barrier with the other blocks' reads after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The 16 bytes at this block's shared address `addr`, read from the same address in cluster block `rank` (DSMEM).
// Not volatile and no memory clobber, so that independent loads are issued together: the caller orders it after
// the barrier that published the data through `addr` (a value passed through a volatile asm after it).
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  float4 v;
  asm("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "r"(remote));
  return v;
}

// Named barrier `id` over `count` threads (ids 1.., 0 is __syncthreads): bar.sync waits for the
// count, bar.arrive adds this warp without waiting.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Arrive once and expect `bytes` more to land (counted down by the copies' complete_tx).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Box (c0 = K byte, c1 = row) of a 2-D tensor map into shared memory, in the map's swizzle;
// out-of-bounds bytes are written as zeros and count towards the barrier's bytes.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// Contiguous global -> shared copy (16-byte aligned, a multiple of 16 bytes) counted on the barrier.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

}  // namespace sm90
}  // namespace cuops
#endif  // CUOPS_HAS_SM90A
