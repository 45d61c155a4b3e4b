// Benchmark-only kernel (scripts/probe_wgmma_overlap.py): how much FP32 work per accumulator element
// can run beside Hopper's int8 tensor cores. It is the W8A8 WP kernel's skeleton (two consumer
// warpgroups of 64 x 192 int32 accumulators, m64n192k32 int8 wgmma, four k-steps per 128-wide K
// block, a producer warpgroup) with the promotion reduced to a chosen instruction mix, and reports
// SM clocks per block. One CTA per SM; operand values do not matter (wrong results by design).
//
// MODE 0 ping-pong: the warpgroups take turns to issue their block (named barriers 1 and 2, as WP);
//        each promotes its block while the other's runs.
//      1 free-running: the same without the turns.
//      2 split: warpgroup 0 only issues wgmma blocks, warpgroup 1 only runs PROMO FFMAs per element
//        and block on registers that no wgmma touches.
//      3 alone: warpgroup 1's FFMAs of mode 2, warpgroup 0 idle.
// PROMO per element and block (modes 0/1): 1 FADD; 2 FMUL + FFMA; 3 I2FP + FMUL + FFMA (WP without
//        its offset terms); 5 the WP kernel's five (I2FP, FMUL, three FFMA); 6 two FADDs; 7 I2FP + FADD.
// PARAMS 0 scales in registers; 1 read from shared memory per block as WP reads them.
// LOADS  0 operands fixed in shared memory; 1 one producer thread bulk-copies each block's A and B
//        tiles (40 KB) from global memory into a 4-stage ring (full / empty mbarriers), as WP's TMA.
#include "sm90_wgmma.cuh"  // the W8A8 kernel's mbarriers, bulk copies, descriptors and wgmma

#ifndef MODE
#define MODE 0
#endif
#ifndef PROMO
#define PROMO 3
#endif
#ifndef PARAMS
#define PARAMS 0
#endif
#ifndef LOADS
#define LOADS 0
#endif

namespace probe {

constexpr int kStages = 4, BM = 128, BN = 192, BK = 128;
constexpr int kTileA = BM * BK, kTileB = BN * BK, kParamBytes = 4096;
constexpr int kStageBytes = kTileA + kTileB + kParamBytes;
constexpr int kAcc = BN / 2;  // int32 (and fp32) accumulators per thread of one m64n192 set

#if CUOPS_HAS_SM90A
using namespace ::cuops::sm90;

// Keeps the compiler from moving accesses of the accumulators across the wgmma boundaries.
__device__ __forceinline__ void fence_acc(uint32_t (&acc)[kAcc]) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) fence_reg(acc[i]);
}

// One K block (four k32 steps) of this warpgroup's 64 rows x 192 columns into d, as one commit group;
// the first step starts from zero unless `chain` (then no block's sums are dead: ptxas removes
// wgmmas whose results nothing reads).
__device__ __forceinline__ void issue_block(uint32_t (&d)[kAcc], uint32_t a, uint32_t b, bool chain = false) {
  fence_acc(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_m64n192k32(d, sw128_desc(a + kk * 32), sw128_desc(b + kk * 32), chain ? 1 : kk);
  wgmma_commit();
}

__device__ __forceinline__ void wait_block(uint32_t (&d)[kAcc]) {
  wgmma_wait<0>();
  fence_acc(d);
}

struct Scales {
  float row_s[2], row_o[2], row_q[2];  // the thread's two rows
  float col_s[2], col_o[2], col_q[2];  // a pair of columns
};

#if MODE < 2
// The promotion's instruction mix on one block's int32 sums (PROMO above).
__device__ __forceinline__ void promote(const uint32_t (&acc)[kAcc], float (&acc_f)[kAcc], Scales& s, uint32_t par,
                                        int row0, int lane) {
#if PARAMS
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // row planes after three 192-column planes, 128 rows each
    const uint32_t at = par + 3 * BN * 4 + 4 * (row0 + 8 * h);
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(s.row_s[h]) : "r"(at));
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(s.row_o[h]) : "r"(at + BM * 4));
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(s.row_q[h]) : "r"(at + 2 * BM * 4));
  }
#endif
#pragma unroll
  for (int i = 0; i < kAcc / 4; ++i) {
#if PARAMS
    const uint32_t c = par + 4 * (8 * i + 2 * (lane & 3));
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(s.col_s[0]), "=f"(s.col_s[1]) : "r"(c));
#if PROMO == 5
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(s.col_o[0]), "=f"(s.col_o[1]) : "r"(c + BN * 4));
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(s.col_q[0]), "=f"(s.col_q[1]) : "r"(c + 2 * BN * 4));
#endif
#endif
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1, x = 4 * i + e;
      const float bits = __int_as_float(static_cast<int>(acc[x]));
      const float cq = static_cast<float>(static_cast<int>(acc[x]));  // I2FP
#if PROMO == 1
      acc_f[x] += bits;
#elif PROMO == 2
      acc_f[x] = fmaf(s.row_s[h], bits * s.col_s[e & 1], acc_f[x]);
#elif PROMO == 3
      acc_f[x] = fmaf(s.row_s[h], cq * s.col_s[e & 1], acc_f[x]);
#elif PROMO == 5
      float v = cq * s.col_s[e & 1];
      v = fmaf(s.row_q[h], s.col_o[e & 1], v);
      acc_f[x] = fmaf(s.row_s[h], v, acc_f[x]);
      acc_f[x] = fmaf(s.row_o[h], s.col_q[e & 1], acc_f[x]);
#elif PROMO == 6
      acc_f[x] += bits;
      acc_f[x] += s.col_s[e & 1];
#elif PROMO == 7
      acc_f[x] += cq;
#else
#error "PROMO must be 1, 2, 3, 5, 6 or 7"
#endif
      (void)bits;
      (void)cq;
    }
  }
  (void)par;
  (void)row0;
  (void)lane;
}
#endif

#endif  // sm_90a

}  // namespace probe

// src: global bytes the producer streams from (wrap bytes, L2-resident when small); scale: 256
// finite floats; out: one float per consumer thread (keeps the results live); clk: per CTA and
// warpgroup, SM clocks from the start to the end of that warpgroup's loop; G: K blocks.
extern "C" __global__ void __launch_bounds__(384, 1)
    wgmma_overlap(const uint8_t* __restrict__ src, long long wrap, const float* __restrict__ scale,
                  float* __restrict__ out, long long* __restrict__ clk, int G) {
#if CUOPS_HAS_SM90A
  using namespace probe;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
  const uint32_t bars = base + kStages * kStageBytes;  // full[4] then empty[4]
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bars + 8 * s, 1);
      mbar_init(bars + 8 * (kStages + s), 8);
    }
  }
  for (int i = threadIdx.x; i < kStages * kParamBytes / 4; i += blockDim.x) {  // finite parameters
    const uint32_t at = base + (i / (kParamBytes / 4)) * kStageBytes + kTileA + kTileB + 4 * (i % (kParamBytes / 4));
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(scale[i & 255]) : "memory");
  }
  __syncthreads();
  const long long t0 = clock64();
  const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31;
  if (wg == 2) {
    setmaxnreg_dec<24>();
#if LOADS
    if (threadIdx.x == 256) {
      for (int t = 0; t < G; ++t) {
        const int st = t % kStages;
        if (t >= kStages) mbar_wait(bars + 8 * (kStages + st), ((t / kStages) + 1) & 1);
        mbar_arrive_expect_tx(bars + 8 * st, kTileA + kTileB);
        const long long off = ((static_cast<long long>(blockIdx.x) * G + t) * (kTileA + kTileB)) % wrap;
        bulk_load(base + st * kStageBytes, src + off, kTileA, bars + 8 * st);
        bulk_load(base + st * kStageBytes + kTileA, src + off + kTileA, kTileB, bars + 8 * st);
      }
    }
#endif
    return;
  }
  setmaxnreg_inc<240>();
  const int row0 = 64 * wg + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);
  uint32_t acc[kAcc];
  float acc_f[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    acc[i] = 0u;
    acc_f[i] = 0.0f;
  }
  Scales s;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    s.row_s[h] = scale[lane + h];
    s.row_o[h] = scale[lane + 2 + h];
    s.row_q[h] = scale[lane + 4 + h];
    s.col_s[h] = scale[64 + lane + h];
    s.col_o[h] = scale[66 + lane + h];
    s.col_q[h] = scale[68 + lane + h];
  }
#if MODE >= 2
  if (wg == 1) {
    for (int j = 0; j < G; ++j) {
#pragma unroll
      for (int r = 0; r < PROMO; ++r)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc_f[i] = fmaf(acc_f[i], s.col_s[0], s.col_o[1]);
    }
  } else if (MODE == 2) {
    for (int j = 0; j < G; ++j) {
      issue_block(acc, base + wg * 64 * BK, base + kTileA, true);
      wait_block(acc);
    }
  }
#else
  if (MODE == 0 && wg == 1) named_arrive(1, 256);  // warpgroup 0 goes first
  for (int j = 0; j < G; ++j) {
    const int st = LOADS ? j % kStages : 0;
    if (MODE == 0) named_sync(1 + wg, 256);
#if LOADS
    mbar_wait(bars + 8 * st, (j / kStages) & 1);
#endif
    const uint32_t a = base + st * kStageBytes;
    issue_block(acc, a + wg * 64 * BK, a + kTileA);
    if (MODE == 0) named_arrive(2 - wg, 256);
    wait_block(acc);
    promote(acc, acc_f, s, a + kTileA + kTileB, row0, lane);
#if LOADS
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + 8 * (kStages + st));
#endif
  }
  if (MODE == 0 && wg == 0) named_sync(1, 256);  // warpgroup 1's arrive after its last block
#endif
  if ((threadIdx.x & 127) == 0) clk[3 * blockIdx.x + wg] = clock64() - t0;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) sum += acc_f[i] + static_cast<float>(acc[i] & 1u);
  out[blockIdx.x * 256 + threadIdx.x] = sum;
#endif
}
