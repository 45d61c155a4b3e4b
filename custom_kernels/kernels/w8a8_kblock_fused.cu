// Scheme 2 (W8A8, per K block) in ONE kernel: int8 tensor-core GEMM with per-K-block promotion.
//
//   D[m, n] = act( sum_i [ sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs*oA*oB ] + bias[n] )
//
// per row m / column n / K block i of block_size (bs) elements; Cq_i = int32 dot product of block
// i of A_q row m and B_q row n. Rewritten per block as
//   acc += (sA*sB) * Cq_i + (sA*sumA_i) * oB + oA * q_i,     q_i = sB*sumB_i + bs*oB
// where q (and sB, oB) come precomputed per weight as bvec[g][n] = {sB, oB, q, 0} (float4).
//
// Inputs: A_q int8 [M, K] row-major; sA, oA float32 [M, G]; sumA int32 [M, G] (QuantA);
//         B_q int8 [N, K] row-major (K-major "column" operand); bvec float4 [G, N];
//         bias float32 [N] or null; D [M, N] float32 / float16 / bfloat16 (out_kind 0 / 1 / 2).
// K % 32 == 0 and K % block_size == 0 (checked in Python); M, N arbitrary.
//
// Structure (sm_80+): BM x BN tile per CTA, WARPS_M x WARPS_N warps; a STAGES-deep cp.async
// ring of BK-wide A/B tiles (XOR-swizzled, read with ldmatrix) plus the per-block parameters of
// the blocks promoted in the tile; mma.sync m16n8k32 s8 into int32 accumulators. Each block is
// promoted into fp32 accumulators during the first k-steps of the next one (the tensor and FP32
// pipes overlap), the int32 sum restarting from a magic constant. No atomics, no int32 matrix in
// memory. sm_75 builds get a plain dp4a loop with the same arithmetic.
//
// Compile-time configuration (NVRTC/nvcc -D): W8A8_BLOCK_SIZE (32/64/128/256), W8A8_BM, W8A8_BN,
// W8A8_BK (64/128), W8A8_WARPS_M, W8A8_WARPS_N, W8A8_STAGES, W8A8_OFFSET_LAG (0/1),
// W8A8_MIN_BLOCKS. The dynamic shared memory a launch needs is
//   STAGES * (BM*BK + BN*BK + 16*(BM+BN)*max(1, BK/block_size)) + 16*(BM+BN) bytes
// (cutlass_ops/ops/w8a8_fused.py computes the same number; the kernel traps if given less).
#include "w8a8_kblock_common.cuh"

#ifndef W8A8_BLOCK_SIZE
#define W8A8_BLOCK_SIZE 128
#endif
#ifndef W8A8_BM
#define W8A8_BM 128
#endif
#ifndef W8A8_BN
#define W8A8_BN 128
#endif
#ifndef W8A8_BK
#define W8A8_BK 64
#endif
#ifndef W8A8_WARPS_M
#define W8A8_WARPS_M 2
#endif
#ifndef W8A8_WARPS_N
#define W8A8_WARPS_N 4
#endif
#ifndef W8A8_STAGES
#define W8A8_STAGES 4
#endif
#ifndef W8A8_OFFSET_LAG
#define W8A8_OFFSET_LAG 1
#endif
#ifndef W8A8_MIN_BLOCKS
#define W8A8_MIN_BLOCKS 1
#endif

namespace cuops {
namespace w8a8 {

// Float 1.5 * 2^23 (bits 0x4B400000): its mantissa's low 22 bits are zero, so adding an int32
// x with |x| <= 2^22 to the BITS yields exactly the float 1.5*2^23 + x. Starting the int32
// accumulators at these bits turns int->float conversion into one exact FADD (no I2F, which
// runs at quarter rate). |Cq| <= 256 * 128 * 128 = 2^22 for block_size <= 256.
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.0f;

// 4-byte copy (.ca: the only mode for 4 bytes) for the strided per-row parameters; zero-fills.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

// Four 8x8 b16 matrices = four 8-row x 16-byte int8 slices; lanes 8j..8j+7 give matrix j's rows.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                            uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D = A(16x32, row) * B(32x8, col) + D on int8 tensor cores with an int32 accumulator.
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Same, but the accumulator input is the magic bits (restart of a K block's int32 sum).
__device__ __forceinline__ void mma_s8_restart(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kMagicBits));
}

// Byte offset of 16-byte chunk `chunk` of tile row `row` (BK bytes per row). The chunk index is
// XORed with bits of the row so that the 8 rows one ldmatrix phase reads (same logical chunk)
// land on 8 different 16-byte bank groups: BK=128 rows are one 128-byte line each (XOR row&7);
// BK=64 rows pair up into a line, so the pair index (row>>1)&3 picks among the 4 chunks.
template <int BK>
__device__ __forceinline__ int swizzle_bits(int row) {
  static_assert(BK == 64 || BK == 128, "BK must be 64 or 128");
  return BK == 128 ? (row & 7) : ((row >> 1) & 3);
}
template <int BK>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return row * BK + ((chunk ^ swizzle_bits<BK>(row)) << 4);
}

// Two adjacent outputs (m, n), (m, n+1): one vector store when both exist and the pair is
// aligned (N even), else guarded scalar stores.
template <typename T>
__device__ __forceinline__ void store_pair(T* D, long long idx, float v0, float v1, bool has1, bool paired);
template <>
__device__ __forceinline__ void store_pair<float>(float* D, long long idx, float v0, float v1, bool has1,
                                                  bool paired) {
  if (paired) {
    *reinterpret_cast<float2*>(D + idx) = make_float2(v0, v1);
  } else {
    D[idx] = v0;
    if (has1) D[idx + 1] = v1;
  }
}
template <>
__device__ __forceinline__ void store_pair<__half>(__half* D, long long idx, float v0, float v1, bool has1,
                                                   bool paired) {
  if (paired) {
    *reinterpret_cast<__half2*>(D + idx) = __floats2half2_rn(v0, v1);
  } else {
    D[idx] = __float2half_rn(v0);
    if (has1) D[idx + 1] = __float2half_rn(v1);
  }
}
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* D, long long idx, float v0, float v1,
                                                          bool has1, bool paired) {
  if (paired) {
    *reinterpret_cast<__nv_bfloat162*>(D + idx) = __floats2bfloat162_rn(v0, v1);
  } else {
    D[idx] = __float2bfloat16_rn(v0);
    if (has1) D[idx + 1] = __float2bfloat16_rn(v1);
  }
}

template <int BS, int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES, int OFFSET_LAG>
struct KBlockGemm {
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
  static constexpr int MI = WM / 16, NI = WN / 8;             // mma tiles per warp
  static constexpr int kSteps = BK / 32;                      // mma k-steps per K tile
  static constexpr int kChunks = BK / 16;                     // 16-byte chunks per tile row
  static constexpr int kSlots = BK > BS ? BK / BS : 1;        // parameter slots per stage
  static constexpr int kTilesPerBlock = BS >= BK ? BS / BK : 1;
  static constexpr int kStepsPerBlock = BS / 32;
  // The offset terms of a block go one k-step after its int32 -> fp32 step when the block has
  // two k-steps or more, so that the FP work of a promotion is spread over two k-steps.
  static constexpr int kLag = (OFFSET_LAG != 0 && kStepsPerBlock >= 2) ? 1 : 0;
  static constexpr int kABytes = BM * BK, kBBytes = BN * BK;
  static constexpr int kSlotBytes = (BM + BN) * 16;  // {sA, oA, sumA, -} per row, {sB, oB, q, 0} per column
  static constexpr int kStageBytes = kABytes + kBBytes + kSlots * kSlotBytes;
  static constexpr int kFinalOffset = STAGES * kStageBytes;  // slot of the block promoted after the loop
  static constexpr int kSmemBytes = kFinalOffset + kSlotBytes;

  static_assert(BS == 32 || BS == 64 || BS == 128 || BS == 256, "block_size must be 32, 64, 128 or 256");
  static_assert(BS % BK == 0 || BK % BS == 0, "block_size and BK must divide one another");
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must be a multiple of 16 x 16");
  static_assert(STAGES >= 2, "need at least two pipeline stages");

  uint8_t* smem;
  const Params& p;
  int m0, n0, tid, lane, warp_m, warp_n;

  __device__ __forceinline__ KBlockGemm(uint8_t* smem_, const Params& p_, int m0_, int n0_)
      : smem(smem_), p(p_), m0(m0_), n0(n0_) {
    tid = threadIdx.x;
    lane = tid & 31;
    const int warp = tid >> 5;
    warp_m = warp / WARPS_N;
    warp_n = warp - warp_m * WARPS_N;
  }

  // Parameters of K block g into the slot at shared address `slot`; g outside [0, G) (the
  // block before the first, blocks past a ragged K end) zero-fills the slot, which makes its
  // promotion add exactly 0.
  __device__ __forceinline__ void load_params(uint32_t slot, int g) {
    const bool valid = g >= 0 && g < p.G;
    const int gg = valid ? g : 0;
#pragma unroll
    for (int it = 0; it < UP_DIV(BM, kThreads); ++it) {
      const int r = tid + it * kThreads;
      if (r < BM) {
        const int gm = m0 + r;
        const bool ok = valid && gm < p.M;
        const long long off = ok ? static_cast<long long>(gm) * p.G + gg : 0;
        const uint32_t dst = slot + r * 16;
        cp_async4(dst, p.sA + off, ok ? 4 : 0);
        cp_async4(dst + 4, p.oA + off, ok ? 4 : 0);
        cp_async4(dst + 8, p.sumA + off, ok ? 4 : 0);
      }
    }
#pragma unroll
    for (int it = 0; it < UP_DIV(BN, kThreads); ++it) {
      // columns start at the last thread so that the row and column copies spread over threads
      const int c = kThreads - 1 - tid + it * kThreads;
      if (c < BN) {
        const int gn = n0 + c;
        const bool ok = valid && gn < p.N;
        cp_async16(slot + BM * 16 + c * 16, p.bvec + (ok ? static_cast<long long>(gg) * p.N + gn : 0), ok ? 16 : 0);
      }
    }
  }

  // Issue the copies of K tile kt into `stage`: A, B, and the parameters of the blocks whose
  // promotion happens in this tile (each block is promoted at the first k-step of the next).
  __device__ __forceinline__ void load_tile(int stage, int kt) {
    const uint32_t base = smem_addr(smem) + stage * kStageBytes;
    const int k0 = kt * BK;
#pragma unroll
    for (int it = 0; it < UP_DIV(BM * kChunks, kThreads); ++it) {
      const int idx = tid + it * kThreads;
      if ((BM * kChunks) % kThreads == 0 || idx < BM * kChunks) {
        const int r = idx / kChunks, c = idx % kChunks;
        const int gm = m0 + r, gk = k0 + c * 16;
        const bool ok = gm < p.M && gk < p.K;
        const int8_t* src = p.A + (ok ? static_cast<long long>(gm) * p.K + gk : 0);
        cp_async16(base + tile_offset<BK>(r, c), src, ok ? 16 : 0);
      }
    }
#pragma unroll
    for (int it = 0; it < UP_DIV(BN * kChunks, kThreads); ++it) {
      const int idx = tid + it * kThreads;
      if ((BN * kChunks) % kThreads == 0 || idx < BN * kChunks) {
        const int r = idx / kChunks, c = idx % kChunks;
        const int gn = n0 + r, gk = k0 + c * 16;
        const bool ok = gn < p.N && gk < p.K;
        const int8_t* src = p.B + (ok ? static_cast<long long>(gn) * p.K + gk : 0);
        cp_async16(base + kABytes + tile_offset<BK>(r, c), src, ok ? 16 : 0);
      }
    }
    const uint32_t slots = base + kABytes + kBBytes;
    if (BS >= BK) {
      if (kt % kTilesPerBlock == 0) load_params(slots, kt / kTilesPerBlock - 1);
    } else {
#pragma unroll
      for (int j = 0; j < kSlots; ++j) load_params(slots + j * kSlotBytes, kt * kSlots + j - 1);
    }
  }

  // One k-step of mma over the warp tile, fused with the promotion of the previous block:
  //   convert: (first k-step of a block) Cq = int32 accumulator read as float minus the magic,
  //            acc_f += (sA*sB) * Cq, and the mma restarts from the magic bits instead of
  //            accumulating (so no separate reset);
  //   offsets: acc_f += (sA*sumA) * oB + oA * q.
  // `slot` holds the previous block's parameters. Interleaving the FP work with the mma of the
  // next block lets the tensor and FP32 pipes overlap.
  __device__ __forceinline__ void mma_step(const uint32_t (&a)[MI][4], const uint32_t (&b)[NI][2], bool convert,
                                           bool offsets, const uint8_t* slot, int (&acc_i)[MI][NI][4],
                                           float (&acc_f)[MI][NI][4]) {
    if (!convert && !offsets) {
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_s8(acc_i[mi][ni], a[mi], b[ni][0], b[ni][1]);
      return;
    }
    const float4* rows = reinterpret_cast<const float4*>(slot) + warp_m * WM + (lane >> 2);
    const float4* cols = reinterpret_cast<const float4*>(slot + BM * 16) + warp_n * WN + (lane & 3) * 2;
    float sB[NI][2], oB[NI][2], qB[NI][2];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float4 v = cols[ni * 8 + j];
        sB[ni][j] = v.x;
        oB[ni][j] = v.y;
        qB[ni][j] = v.z;
      }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      float sA[2], oA[2], u[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 r = rows[mi * 16 + h * 8];
        sA[h] = r.x;
        oA[h] = r.y;
        u[h] = r.x * static_cast<float>(__float_as_int(r.z));  // sA * sumA
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        if (convert) {
          float cq[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) cq[e] = __int_as_float(acc_i[mi][ni][e]) - kMagic;  // exact
          mma_s8_restart(acc_i[mi][ni], a[mi], b[ni][0], b[ni][1]);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_f[mi][ni][e] = fmaf(sA[e >> 1] * sB[ni][e & 1], cq[e], acc_f[mi][ni][e]);
        } else {
          mma_s8(acc_i[mi][ni], a[mi], b[ni][0], b[ni][1]);
        }
        if (offsets) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float f = fmaf(u[e >> 1], oB[ni][e & 1], acc_f[mi][ni][e]);
            acc_f[mi][ni][e] = fmaf(oA[e >> 1], qB[ni][e & 1], f);
          }
        }
      }
    }
  }

  // Promotion of the last block the loop walked over (no mma to fuse with).
  __device__ __forceinline__ void promote_final(const uint8_t* slot, const int (&acc_i)[MI][NI][4],
                                                float (&acc_f)[MI][NI][4]) {
    const float4* rows = reinterpret_cast<const float4*>(slot) + warp_m * WM + (lane >> 2);
    const float4* cols = reinterpret_cast<const float4*>(slot + BM * 16) + warp_n * WN + (lane & 3) * 2;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float4 r = rows[mi * 16 + (e >> 1) * 8];
          const float4 c = cols[ni * 8 + (e & 1)];
          const float cq = __int_as_float(acc_i[mi][ni][e]) - kMagic;
          float f = fmaf(r.x * c.x, cq, acc_f[mi][ni][e]);
          f = fmaf(r.x * static_cast<float>(__float_as_int(r.z)), c.y, f);
          acc_f[mi][ni][e] = fmaf(r.y, c.z, f);
        }
  }

  template <typename T>
  __device__ __forceinline__ void epilogue(const float (&acc_f)[MI][NI][4]) {
    T* D = static_cast<T*>(p.D);
    const bool even_n = (p.N & 1) == 0;
    float bias[NI][2];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = n0 + warp_n * WN + ni * 8 + (lane & 3) * 2 + j;
        bias[ni][j] = (p.bias != nullptr && col < p.N) ? p.bias[col] : 0.0f;
      }
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + warp_m * WM + mi * 16 + (lane >> 2) + h * 8;
        if (row >= p.M) continue;
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const int col = n0 + warp_n * WN + ni * 8 + (lane & 3) * 2;
          if (col >= p.N) continue;
          const float v0 = apply_activation(acc_f[mi][ni][h * 2] + bias[ni][0], p.act);
          const float v1 = apply_activation(acc_f[mi][ni][h * 2 + 1] + bias[ni][1], p.act);
          const bool has1 = col + 1 < p.N;
          store_pair<T>(D, static_cast<long long>(row) * p.N + col, v0, v1, has1, has1 && even_n);
        }
      }
    }
  }

  __device__ __forceinline__ void run() {
    int acc_i[MI][NI][4];
    float acc_f[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < NI; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc_i[mi][ni][e] = kMagicBits;  // the first "promotion" (of no block) then adds 0
          acc_f[mi][ni][e] = 0.0f;
        }

    const int KT = UP_DIV(p.K, BK);  // BS >= BK: KT is a multiple of kTilesPerBlock
    const uint32_t smem_base = smem_addr(smem);
    // The last block the loop walks over: G - 1, or a zero-filled one past a ragged K end.
    load_params(smem_base + kFinalOffset, BS >= BK ? p.G - 1 : KT * kSlots - 1);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < KT) load_tile(s, s);
      cp_async_commit();  // empty groups keep the group count uniform
    }

    // Lane-constant parts of the ldmatrix addresses. A: rows lane & 15, chunk half lane >> 4 give
    // the four 8x16-byte slices a0..a3 of m16n8k32. B: rows (lane & 7) + 8 * (lane >> 4), chunk
    // half (lane >> 3) & 1 give b0, b1 of two adjacent n8 tiles. Rows 16 apart share the
    // swizzle bits, so per k-step only the XOR-ed chunk changes.
    const int a_row = warp_m * WM + (lane & 15);
    const int b_row = warp_n * WN + (lane & 7) + ((lane >> 4) << 3);
    const uint32_t a_lane = a_row * BK, b_lane = kABytes + b_row * BK;
    const int a_x = (lane >> 4) ^ swizzle_bits<BK>(a_row), b_x = ((lane >> 3) & 1) ^ swizzle_bits<BK>(b_row);

    for (int kt0 = 0; kt0 < KT; kt0 += kTilesPerBlock) {
#pragma unroll
      for (int t = 0; t < kTilesPerBlock; ++t) {
        const int kt = kt0 + t;
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // tile kt visible to all; every warp is done with the stage reloaded next
        {
          const int next = kt + STAGES - 1;
          if (next < KT) load_tile(next % STAGES, next);
          cp_async_commit();
        }
        const int stage = kt % STAGES;
        const uint32_t stage_base = smem_base + stage * kStageBytes;
        const uint8_t* slots = smem + stage * kStageBytes + kABytes + kBBytes;
#pragma unroll
        for (int ks = 0; ks < kSteps; ++ks) {
          uint32_t a[MI][4], b[NI][2];
          const uint32_t a_addr = stage_base + a_lane + ((a_x ^ (2 * ks)) << 4);
          const uint32_t b_addr = stage_base + b_lane + ((b_x ^ (2 * ks)) << 4);
#pragma unroll
          for (int mi = 0; mi < MI; ++mi)
            ldmatrix_x4(a_addr + mi * 16 * BK, a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
#pragma unroll
          for (int nj = 0; nj < NI / 2; ++nj)
            ldmatrix_x4(b_addr + nj * 16 * BK, b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1]);
          // Compile-time after unrolling: block starts and the k-step of its offset terms.
          const bool convert = t == 0 && ks % kStepsPerBlock == 0;
          const bool offsets = t == 0 && ks % kStepsPerBlock == kLag;
          mma_step(a, b, convert, offsets, slots + (ks / kStepsPerBlock) * kSlotBytes, acc_i, acc_f);
        }
      }
    }
    promote_final(smem + kFinalOffset, acc_i, acc_f);

    if (p.out_kind == 1)
      epilogue<__half>(acc_f);
    else if (p.out_kind == 2)
      epilogue<__nv_bfloat16>(acc_f);
    else
      epilogue<float>(acc_f);
  }
};

// Pre-sm_80 fallback (no cp.async, no m16n8k32): one output per thread iteration, dp4a dot
// products per block, the same fp32 promotion arithmetic.
template <int BS, int BM, int BN>
__device__ __forceinline__ void kblock_gemm_simple(const Params& p, int m0, int n0) {
  for (int idx = threadIdx.x; idx < BM * BN; idx += blockDim.x) {
    const int m = m0 + idx / BN, n = n0 + idx % BN;
    if (m >= p.M || n >= p.N) continue;
    const int* a = reinterpret_cast<const int*>(p.A + static_cast<long long>(m) * p.K);
    const int* b = reinterpret_cast<const int*>(p.B + static_cast<long long>(n) * p.K);
    float acc = 0.0f;
    for (int g = 0; g < p.G; ++g) {
      int cq = 0;
      for (int w = 0; w < BS / 4; ++w) cq = __dp4a(a[g * (BS / 4) + w], b[g * (BS / 4) + w], cq);
      const float4 bv = p.bvec[static_cast<long long>(g) * p.N + n];
      const long long ag = static_cast<long long>(m) * p.G + g;
      const float sA = p.sA[ag], oA = p.oA[ag];
      const float u = sA * static_cast<float>(p.sumA[ag]);
      acc = fmaf(sA * bv.x, static_cast<float>(cq), acc);
      acc = fmaf(u, bv.y, acc);
      acc = fmaf(oA, bv.z, acc);
    }
    const float v = apply_activation(acc + (p.bias != nullptr ? p.bias[n] : 0.0f), p.act);
    const long long o = static_cast<long long>(m) * p.N + n;
    if (p.out_kind == 1)
      static_cast<__half*>(p.D)[o] = __float2half_rn(v);
    else if (p.out_kind == 2)
      static_cast<__nv_bfloat16*>(p.D)[o] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p.D)[o] = v;
  }
}

}  // namespace w8a8
}  // namespace cuops

using W8A8Config = cuops::w8a8::KBlockGemm<W8A8_BLOCK_SIZE, W8A8_BM, W8A8_BN, W8A8_BK, W8A8_WARPS_M, W8A8_WARPS_N,
                                           W8A8_STAGES, W8A8_OFFSET_LAG>;

extern "C" __global__ void __launch_bounds__(W8A8Config::kThreads, W8A8_MIN_BLOCKS)
    w8a8_kblock_gemm(const int8_t* __restrict__ A, const float* __restrict__ sA, const float* __restrict__ oA,
                     const int32_t* __restrict__ sumA, const int8_t* __restrict__ B,
                     const float4* __restrict__ bvec, const float* __restrict__ bias, void* __restrict__ D, int M,
                     int N, int K, int G, int act, int out_kind) {
  extern __shared__ __align__(128) uint8_t w8a8_smem[];
  const cuops::w8a8::Params p{A, sA, oA, sumA, B, bvec, bias, D, M, N, K, G, act, out_kind};
  int m0, n0;
  cuops::w8a8::tile_coords<W8A8_BM, W8A8_BN>(p, m0, n0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  cuops::w8a8::kblock_gemm_simple<W8A8_BLOCK_SIZE, W8A8_BM, W8A8_BN>(p, m0, n0);
#else
  // A launch with less dynamic shared memory than the tile ring needs is a host bug: stop loudly.
  uint32_t dyn_smem;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
  if (dyn_smem < static_cast<uint32_t>(W8A8Config::kSmemBytes)) __trap();
  W8A8Config(w8a8_smem, p, m0, n0).run();
#endif
}
