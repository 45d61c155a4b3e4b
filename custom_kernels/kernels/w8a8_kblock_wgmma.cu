// Scheme 2 (W8A8, per K block) in ONE kernel on Hopper: wgmma int8 tensor cores with per-K-block
// promotion into fp32 (the DeepGEMM scheme, here for int8 with offsets). Same inputs, formula and
// result as w8a8_kblock_fused.cu (its header has the derivation):
//
//   D[m, n] = act( sum_i [ sA*(sB*Cq_i + sumA_i*oB) + oA*q_i ] + bias[n] ),   q_i = sB*sumB_i + bs*oB
//
// Inputs: A_q int8 [M, K]; sA, oA float32 [M, G]; sumA int32 [M, G]; B_q int8 [N, K];
//         bvec float4 [G, N] = {sB, oB, q, 0}; bias float32 [N] or null; D [M, N] f32/f16/bf16.
// K % block_size == 0 and K % 16 == 0 (checked in Python); M, N arbitrary.
//
// Structure (sm_90a only): a 128 x 128 (or 128 x 192) output tile per CTA. Warps 0-7 are two consumer
// warpgroups (64 rows each, or with the N split 64 columns each), warps 8-11 the producer
// warpgroup. The producer fills a STAGES-deep ring of 128-wide K tiles of A and B (cp.async, 16 B
// per thread, or TMA from one thread, written in the 128-byte swizzle that wgmma descriptors read)
// plus each block's parameters, and signals "full" on an mbarrier; the consumers signal "empty"
// when a stage is consumed. Each consumer issues block j+1's wgmmas into one int32 accumulator
// set and, while the tensor cores run them, promotes block j's set into the fp32 accumulators
// (two int32 sets); or, with W8A8W_PINGPONG, the two consumer warpgroups hold one set each and
// take turns on the tensor cores. On an H100 the promotion (per element and block: I2FP, FMUL,
// three FFMA) does not overlap the tensor work in either form and bounds the kernel; the defaults
// are TMA + N split (WN) and, from M = 2048, the ping-pong with 128 x 192 tiles (WP).
// No atomics, no int32 matrix in memory.
//
// Compile-time configuration: W8A8_BLOCK_SIZE (32/64/128/256), W8A8W_STAGES (>= 4; default 4),
// W8A8W_TMA (1: one producer thread loads the tiles with TMA from two tensor maps, the kernel's
// last two parameters; 0: the producer warpgroup copies them with cp.async), W8A8W_NSPLIT (1, with
// TMA: each consumer warpgroup takes 64 columns of all 128 rows, two m64n64 wgmmas, and bvec holds
// the column parameters as three planes [G][3][N rounded up to 4] = sB, oB, q; 0: 64 rows of all
// 128 columns, one m64n128 wgmma, bvec float4 [G][N]). With the N split, sA holds the row
// parameters as planes [G][3][M rounded up to 4] = sA, oA, sumA's int32 bits (oA and sumA unused).
// W8A8W_PLANES (default W8A8W_NSPLIT; 1 needs TMA, the N split needs it): the parameters as those
// planes, staged per block by TMA, also without the N split (the M split's one m64n128 wgmma per
// k-step reads less shared memory than the N split's two m64n64). W8A8W_PINGPONG (1, planes and the
// M split): one int32 set per consumer warpgroup, the two take turns on the tensor cores (see
// consumer_pingpong); W8A8W_BN (128, or 192 with the ping-pong: one m64n192 wgmma per k-step).
// W8A8W_BLOCK_SCALED (1, with the planes; block_size 64, 128 or 256): the block-scaled symmetric scheme
// of cutlass_ops/w8a8/block_scaled.py (DeepSeek-V3's recipe in int8), no offsets:
//
//   D[m, n] = act( sum_j sA[m, j] * sW[n / bs, j] * Cq_j + bias[n] )
//
// with one weight scale per bs x bs tile. Then sA holds the row scales as ONE plane [G][M rounded up
// to 4] and bvec holds float4 [G][ceil(N / BN)]: for K block j and CTA tile t the weight scale of each
// 64-column slice of the tile, {sW[(t BN + 64 s) / bs, j] for s = 0..3} (0 past N or BN); oA and sumA
// are unused. A slice lies in one weight block (bs >= 64), so the promotion is per row and slice one
// factor sA * sW, and per element and block one I2FP and one FFMA. Only there: W8A8W_BM = 64 with the
// N split (small M: a 64 x 128 tile, each warpgroup one m64n64 wgmma per k-step on the same 64 rows,
// half the tensor work and A tile of BM = 128 where most rows are empty), and split-K over gridDim.y:
// split s sums its own slice of whole K blocks (k_slice; the per-block scales are applied in the
// mainloop, so a partial sum is exact fp32 work) and, with more than one split, writes the fp32 partials
// to a workspace [splits, M, N] that w8a8_kblock_wgmma_splitk_reduce (this file) adds in split order
// with the bias, activation and conversion. Small M at N = 8192 otherwise leaves half the SMs idle.
// Dynamic shared memory: STAGES * (BM*128 + BN*128 + max(1, 128/block_size)*kColBytes) + 1024 (alignment)
// (kColBytes: 16 * BN, planes 4096, block-scaled 1024)
// + 16 * STAGES (barriers); cutlass_ops/ops/w8a8_fused.py computes the same number.
#include "sm90_wgmma.cuh"
#include "w8a8_kblock_common.cuh"

#ifndef W8A8_BLOCK_SIZE
#define W8A8_BLOCK_SIZE 128
#endif
#ifndef W8A8W_STAGES
#define W8A8W_STAGES 4
#endif
#ifndef W8A8W_TMA
#define W8A8W_TMA 0
#endif
#ifndef W8A8W_NSPLIT
#define W8A8W_NSPLIT 0
#endif
#ifndef W8A8W_PLANES
#define W8A8W_PLANES W8A8W_NSPLIT
#endif
#ifndef W8A8W_BN
#define W8A8W_BN 128
#endif
#ifndef W8A8W_PINGPONG
#define W8A8W_PINGPONG 0
#endif
#ifndef W8A8W_BLOCK_SCALED
#define W8A8W_BLOCK_SCALED 0
#endif
#ifndef W8A8W_BM
#define W8A8W_BM 128
#endif


#define W8A8W_HAS_WGMMA CUOPS_HAS_SM90A

namespace cuops {
namespace w8a8w {

using w8a8::Params;
using w8a8::cp_async16;
using w8a8::cp_async_commit;
using w8a8::cp_async_wait;
using w8a8::smem_addr;

constexpr int BS = W8A8_BLOCK_SIZE;
constexpr int STAGES = W8A8W_STAGES;
static_assert(BS == 32 || BS == 64 || BS == 128 || BS == 256, "block_size must be 32, 64, 128 or 256");
static_assert(STAGES >= 4, "the ping-pong needs the stages of two blocks plus the producer's lead");
// Tiles whose copies a producer thread keeps in flight before it signals the oldest one full.
// A consumer frees a block's stages only after the next block's tiles are full: the producer,
// waiting to refill the stage of tile t - STAGES, must already have signalled tile
// t - STAGES + 2 * tiles_per_block - 1, so it may lag by at most STAGES - 2 * tiles_per_block
// tiles (0 for block 256 with 4 stages) without a deadlock. One tile of lag measured faster than
// two on an H100 (M = 4096, N = K = 8192, block 128: 1352-1434 vs 1600 us).
constexpr int kMaxLag = STAGES - 2 * (BS > 128 ? BS / 128 : 1);  // 128: the K tile (BK below)
static_assert(kMaxLag >= 0, "block 256 spans two K tiles: it needs at least 4 stages");
constexpr int kLag = kMaxLag < 1 ? kMaxLag : 1;

constexpr int BM = W8A8W_BM, BN = W8A8W_BN, BK = 128;  // CTA tile; BK bytes = one 128-byte swizzle row
static_assert(BM == 128 || (BM == 64 && W8A8W_NSPLIT && W8A8W_BLOCK_SCALED),
              "BM = 64 (both warpgroups on the same 64 rows, 64 columns each) is the block-scaled N split");
static_assert(BN == 128 || (BN == 192 && W8A8W_PLANES && !W8A8W_NSPLIT),
              "BN = 192 (one m64n192 wgmma per warpgroup) needs the planes and the M split");
static_assert(!W8A8W_PINGPONG || (W8A8W_PLANES && !W8A8W_NSPLIT), "the ping-pong consumer is the M split with planes");
static_assert(BN == 128 || W8A8W_PINGPONG, "two int32 sets of 96 and the fp32 set do not fit in 240 registers");
static_assert(!W8A8W_BLOCK_SCALED || W8A8W_PLANES,
              "the block-scaled variant's scales are staged per block by TMA (planes)");
static_assert(!W8A8W_BLOCK_SCALED || BS >= 64,
              "block-scaled: a 64-column slice must lie in one weight block (bs >= 64)");
static_assert(!W8A8W_BLOCK_SCALED || BN <= 4 * 64,
              "block-scaled: one float4 holds the scales of a tile's 64-column slices");
constexpr int kConsumerWarps = 8;                // two warpgroups of 64 rows
constexpr int kThreads = 32 * kConsumerWarps + 128;  // + the producer warpgroup
// Register split (setmaxnreg): 2 x 128 consumer threads at 240 and 128 producer threads at 24
// fill the 64K-register file; the launch bound alone would cap every thread at 168 and spill.
constexpr int kConsumerRegs = 240, kProducerRegs = 24;
constexpr int kStepsPerBlock = BS / 32;          // wgmma k32 steps per K block
constexpr int kSlots = BK / BS > 0 ? BK / BS : 1;  // blocks whose column parameters a stage holds
constexpr int kTilesPerBlock = BS > BK ? BS / BK : 1;
constexpr int kTileBytes = BM * BK;              // A tile
constexpr int kTileBytesB = BN * BK;             // B tile
// One block's parameters: float4 per column; planes: three column planes (sB, oB, q) of the
// tile's BN columns, then three row planes (sA, oA, sumA) of its 128 rows, in 4096 bytes;
// block-scaled: the float4 of the weight scales of the tile's 64-column slices, then its 128 row
// scales, in 1024 bytes (a multiple of 1024 keeps every stage on the swizzle-atom alignment).
constexpr int kColBytes = W8A8W_BLOCK_SCALED ? 1024 : W8A8W_PLANES ? 4096 : BN * 16;
[[maybe_unused]] constexpr int kPlaneBytes = BN * 4;          // planes: one column plane
[[maybe_unused]] constexpr int kRowPlaneBytes = BM * 4;       // planes: one row plane
[[maybe_unused]] constexpr int kRowPlanes = 3 * kPlaneBytes;  // planes: offset of the row planes
static_assert(!W8A8W_PLANES || W8A8W_BLOCK_SCALED || 3 * (kPlaneBytes + kRowPlaneBytes) <= kColBytes,
              "the planes overflow their slot");
#if W8A8W_BLOCK_SCALED
// (defined only here: every namespace-scope constant is a symbol of the cubin, and the other variants'
// cubins stay byte-identical without it)
constexpr int kRowScales = 16;  // block-scaled: offset of the row scales in a slot
static_assert(kRowScales + kRowPlaneBytes <= kColBytes, "the scales overflow their slot");
#endif
constexpr int kStageBytes = kTileBytes + kTileBytesB + kSlots * kColBytes;
static_assert(kStageBytes % 1024 == 0, "stages must keep the 1024-byte swizzle-atom alignment");
constexpr int kSmemBytes = STAGES * kStageBytes + 1024 + 16 * STAGES;
// Per consumer warpgroup: kMB m64 slabs of kWN columns. Each thread holds 2 * kMB rows x kWN / 4
// columns of the tile: the N split halves the columns, so each thread reads half the column
// parameters from shared memory per block (their reads, not the tensor cores, bounded the M split).
static_assert(!W8A8W_PLANES || W8A8W_TMA, "the planar parameters are loaded by TMA");
static_assert(W8A8W_PLANES || !W8A8W_NSPLIT, "the N split reads its parameters as planes");
constexpr int kMB = W8A8W_NSPLIT ? BM / 64 : 1;
constexpr int kWN = W8A8W_NSPLIT ? 64 : BN;
constexpr int kAcc = kMB * kWN / 2;  // registers per thread of one accumulator set (int32 or fp32)

// A CUtensorMap: 128 opaque bytes made by cuTensorMapEncodeTiled, passed by value.
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

#if W8A8W_BLOCK_SCALED
// Split-K's K slice of split s of S: K is cut into units of max(BS, BK) columns (whole K blocks and whole
// K tiles, so a slice's stages and parameter slots line up as in the unsplit kernel) and split s takes
// units [U s / S, U (s + 1) / S), U = ceil(K / unit) (the host keeps S <= U, so none is empty).
struct KSlice {
  int k0;  // first K column
  int g0;  // first K block
  int G;   // K blocks
  int T;   // K tiles
};

__device__ __forceinline__ KSlice k_slice(int K, int s, int S) {
  constexpr int kUnit = BS > BK ? BS : BK;
  const int units = UP_DIV(K, kUnit);
  const int u0 = static_cast<int>(static_cast<long long>(units) * s / S);
  const int u1 = static_cast<int>(static_cast<long long>(units) * (s + 1) / S);
  const int k1 = min(u1 * kUnit, K);
  KSlice r;
  r.k0 = u0 * kUnit;
  r.g0 = r.k0 / BS;
  r.G = k1 / BS - r.g0;  // K % BS == 0
  r.T = UP_DIV(k1 - r.k0, BK);
  return r;
}
#endif


#if W8A8W_HAS_WGMMA

using namespace ::cuops::sm90;  // mbarriers, copies, descriptors, wgmma (sm90_wgmma.cuh)

struct Ring {
  uint32_t base;  // shared address of stage 0 (1024-aligned)
  uint32_t bars;  // full[STAGES] then empty[STAGES], 8 bytes each
  __device__ __forceinline__ uint32_t a(int st) const { return base + st * kStageBytes; }
  __device__ __forceinline__ uint32_t b(int st) const { return base + st * kStageBytes + kTileBytes; }
  __device__ __forceinline__ uint32_t cols(int st, int slot) const {
    return base + st * kStageBytes + kTileBytes + kTileBytesB + slot * kColBytes;
  }
  __device__ __forceinline__ uint32_t full(int st) const { return bars + 8 * st; }
  __device__ __forceinline__ uint32_t empty(int st) const { return bars + 8 * (STAGES + st); }
};

// The producer warpgroup (128 threads): loads K tile t of A and B (swizzled) and the column
// parameters of the blocks starting in it. Thread i always copies 16-byte chunk i % 8 of rows
// i / 8 + 16 r, so its addresses advance by constants. Each thread signals "full" for tile
// t - kLag once its own copies of it have landed (kLag + 1 tiles of copies in flight).
__device__ __forceinline__ void producer(const Params& p, const Ring& ring, int m0, int n0, int T) {
  const int tid = threadIdx.x - 32 * kConsumerWarps;
  const int ch = tid & 7, row0 = tid >> 3;                 // rows row0 + 16 r, r = 0..7
  // Swizzle<3,4,3>: chunk ^= row % 8, the same for rows row0 + 16 r
  const uint32_t dst0 = row0 * BK + ((ch ^ (row0 & 7)) << 4);
  const int rows_a = p.M - m0 - row0, rows_b = p.N - n0 - row0;  // row r is valid iff 16 r < rows_*
  const long long step = 16LL * p.K;
  const int8_t* a_base = p.A + static_cast<long long>(m0 + row0) * p.K + ch * 16;
  const int8_t* b_base = p.B + static_cast<long long>(n0 + row0) * p.K + ch * 16;
  for (int t = 0; t < T; ++t) {
    const int st = t % STAGES;
    if (t >= STAGES) mbar_wait(ring.empty(st), ((t / STAGES) + 1) & 1);
    const int k0 = t * BK;
    const bool k_ok = k0 + ch * 16 < p.K;
    const int8_t* a = a_base + k0;
    const int8_t* b = b_base + k0;
    const uint32_t sa = ring.a(st), sb = ring.b(st);
#pragma unroll
    for (int r = 0; r < BM / 16; ++r) {
      const uint32_t off = dst0 + r * 16 * BK;
      const bool okA = k_ok && 16 * r < rows_a, okB = k_ok && 16 * r < rows_b;
      cp_async16(sa + off, okA ? a + r * step : p.A, okA ? 16 : 0);
      cp_async16(sb + off, okB ? b + r * step : p.B, okB ? 16 : 0);
    }
    if (t % kTilesPerBlock == 0) {
#pragma unroll
      for (int slot = 0; slot < kSlots; ++slot) {  // one float4 per column: 128 threads, 128 columns
        const int g = t / kTilesPerBlock * kSlots + slot;
        const bool ok = g < p.G && n0 + tid < p.N;
        cp_async16(ring.cols(st, slot) + tid * 16, p.bvec + (ok ? static_cast<long long>(g) * p.N + n0 + tid : 0),
                   ok ? 16 : 0);
      }
    }
    cp_async_commit();
    if (t >= kLag) {
      cp_async_wait<kLag>();
      fence_proxy_async();
      mbar_arrive(ring.full((t - kLag) % STAGES));
    }
  }
  cp_async_wait<0>();
  fence_proxy_async();
  for (int t = T > kLag ? T - kLag : 0; t < T; ++t) mbar_arrive(ring.full(t % STAGES));
}

#if W8A8W_TMA
// TMA producer: one thread issues every copy of K tile t (A and B boxes, plus the column
// parameters of the blocks starting in it) on stage t % STAGES once the consumers freed it. The
// copy engine writes the 128-byte swizzle and zero-fills the ragged M/N/K edges. k0: the K column of
// tile 0 (a split-K slice's first column; 0 otherwise).
__device__ __forceinline__ void producer_tma(const Params& p, const Ring& ring, int m0, int n0, int T, int k0,
                                             const TensorMap* map_a, const TensorMap* map_b) {
  if (threadIdx.x != 32 * kConsumerWarps) return;
#if W8A8W_BLOCK_SCALED
  // per block: the float4 of the weight scales of this tile's 64-column slices, then its row scales
  // rounded up to 4 floats (16-byte copies; the plane's blocks are Mp = M rounded up to 4 apart)
  const uint32_t row_bytes = static_cast<uint32_t>((min(BM, p.M - m0) + 3) & ~3) * 4u;
  const uint32_t col_bytes = 16u + row_bytes;
  const long long Mp = (p.M + 3) & ~3, tiles_n = UP_DIV(p.N, BN);
#elif W8A8W_PLANES
  // three column and three row planes per block, each the tile's columns (rows) rounded up to 4
  // floats (16-byte copies)
  const uint32_t plane_bytes = static_cast<uint32_t>((min(BN, p.N - n0) + 3) & ~3) * 4u;
  const uint32_t row_bytes = static_cast<uint32_t>((min(BM, p.M - m0) + 3) & ~3) * 4u;
  const uint32_t col_bytes = 3u * (plane_bytes + row_bytes);
  const long long Np = (p.N + 3) & ~3, Mp = (p.M + 3) & ~3;
  const float* planes = reinterpret_cast<const float*>(p.bvec);
#else
  const uint32_t col_bytes = static_cast<uint32_t>(min(BN, p.N - n0)) * 16u;
#endif
  for (int t = 0; t < T; ++t) {
    const int st = t % STAGES;
    if (t >= STAGES) mbar_wait(ring.empty(st), ((t / STAGES) + 1) & 1);
    const int g0 = t / kTilesPerBlock * kSlots;  // first block whose column parameters this tile brings
    const bool cols = t % kTilesPerBlock == 0;
    const int slots = cols ? min(kSlots, p.G - g0) : 0;
    mbar_arrive_expect_tx(ring.full(st), static_cast<uint32_t>(kTileBytes + kTileBytesB) + slots * col_bytes);
    tma_load_2d(ring.a(st), map_a, k0 + t * BK, m0, ring.full(st));
    tma_load_2d(ring.b(st), map_b, k0 + t * BK, n0, ring.full(st));
    for (int slot = 0; slot < slots; ++slot) {
#if W8A8W_BLOCK_SCALED
      bulk_load(ring.cols(st, slot), p.bvec + (g0 + slot) * tiles_n + n0 / BN, 16u, ring.full(st));
      bulk_load(ring.cols(st, slot) + kRowScales, p.sA + (g0 + slot) * Mp + m0, row_bytes, ring.full(st));
#elif W8A8W_PLANES
      for (int pl = 0; pl < 3; ++pl) {
        bulk_load(ring.cols(st, slot) + pl * kPlaneBytes, planes + (3LL * (g0 + slot) + pl) * Np + n0, plane_bytes,
                  ring.full(st));
        bulk_load(ring.cols(st, slot) + kRowPlanes + pl * kRowPlaneBytes, p.sA + (3LL * (g0 + slot) + pl) * Mp + m0,
                  row_bytes, ring.full(st));
      }
#else
      bulk_load(ring.cols(st, slot), p.bvec + static_cast<long long>(g0 + slot) * p.N + n0, col_bytes, ring.full(st));
#endif
    }
  }
}
#endif

// Issue block j's wgmmas (its bs/32 k-steps) into acc; one commit group per block.
__device__ __forceinline__ void issue_block(uint32_t (&acc)[kAcc], const Ring& ring, int wg, int j) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) fence_reg(acc[i]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kStepsPerBlock; ++kk) {
    const int s = j * kStepsPerBlock + kk;
    const int t = s >> 2, sub = s & 3, st = t % STAGES;
    if (kk == 0 || sub == 0) mbar_wait(ring.full(st), (t / STAGES) & 1);
#if W8A8W_NSPLIT
    const uint64_t db = sw128_desc(ring.b(st) + wg * 64 * BK + sub * 32);  // this warpgroup's 64 columns
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb)
      wgmma_m64n64k32(acc + 32 * mb, sw128_desc(ring.a(st) + mb * 64 * BK + sub * 32), db, kk);
#else
    const uint64_t da = sw128_desc(ring.a(st) + wg * 64 * BK + sub * 32);
    const uint64_t db = sw128_desc(ring.b(st) + sub * 32);
    if constexpr (BN == 192)
      wgmma_m64n192k32(acc, da, db, kk);
    else
      wgmma_m64n128k32(acc, da, db, kk);
#endif
  }
  wgmma_commit();
}

struct RowParams {
  float sA[2 * kMB], oA[2 * kMB], sumA[2 * kMB];  // rows r0 + 64 * mb + 8 * h at index 2 * mb + h
};

__device__ __forceinline__ RowParams load_rows(const Params& p, int r0, int j) {
  RowParams r;
#pragma unroll
  for (int h = 0; h < 2 * kMB; ++h) {
    const int m = r0 + 64 * (h >> 1) + 8 * (h & 1);
    const bool ok = m < p.M;
    const long long idx = static_cast<long long>(ok ? m : 0) * p.G + j;
    r.sA[h] = ok ? __ldg(p.sA + idx) : 0.0f;
    r.oA[h] = ok ? __ldg(p.oA + idx) : 0.0f;
    r.sumA[h] = ok ? static_cast<float>(__ldg(p.sumA + idx)) : 0.0f;
  }
  return r;
}

#if W8A8W_BLOCK_SCALED
// Block-scaled: acc_f += (sA * sW) * Cq for block j, whose int32 sums acc holds (wgmma done). The
// fragments are those of the offset form below: element x = (kWN / 2) mb + 4 i + e is row
// row0 + 64 mb + 8 (e >> 1) and column (64 wg with the N split) + 8 i + 2 (lane & 3) + (e & 1), so
// its 64-column slice is (N split: wg) + i / 8 and its factor f[h][i / 8], h = 2 mb + (e >> 1).
__device__ __forceinline__ void promote(const uint32_t (&acc)[kAcc], float (&acc_f)[kAcc], const RowParams& rows,
                                        const Ring& ring, int j, int wg, int lane) {
  constexpr int kSlices = kWN / 64;  // 64-column slices of this thread's columns (1, 2 or 3)
  const int t = (j * BS) / BK;
  const uint32_t slot = ring.cols(t % STAGES, BS <= BK ? j % kSlots : 0);
  const int warp = (threadIdx.x >> 5) & 3;
  const int row0 = (W8A8W_NSPLIT ? 0 : 64 * wg) + 16 * warp + (lane >> 2);
  const int s0 = W8A8W_NSPLIT ? wg : 0;  // the first slice of this warpgroup's columns
  float sW[kSlices];
#pragma unroll
  for (int s = 0; s < kSlices; ++s)  // asm loads: ptxas hoists plain shared loads (slower, docs/design.md)
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(sW[s]) : "r"(slot + 4 * (s0 + s)));
  float f[2 * kMB][kSlices];
#pragma unroll
  for (int h = 0; h < 2 * kMB; ++h) {
    float sA;
    asm volatile("ld.shared.f32 %0, [%1];\n"
                 : "=f"(sA) : "r"(slot + kRowScales + 4 * (row0 + 64 * (h >> 1) + 8 * (h & 1))));
#pragma unroll
    for (int s = 0; s < kSlices; ++s) f[h][s] = __fmul_rn(sA, sW[s]);  // _rn: one rounding, never fused
  }
  (void)rows;
#pragma unroll
  for (int i = 0; i < kWN / 8; ++i) {
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int x = (kWN / 2) * mb + 4 * i + e;
        // exact (|Cq| <= 256 * 127 * 127 < 2^24); I2FP, then the one FFMA
        acc_f[x] = fmaf(f[2 * mb + (e >> 1)][i / 8], static_cast<float>(static_cast<int>(acc[x])), acc_f[x]);
      }
    }
  }
}
#else
// acc_f += sA*(sB*Cq + sumA*oB) + oA*q for block j, whose int32 sums acc holds (wgmma done).
__device__ __forceinline__ void promote(const uint32_t (&acc)[kAcc], float (&acc_f)[kAcc], const RowParams& rows,
                                        const Ring& ring, int j, int wg, int lane) {
  const int t = (j * BS) / BK;
  const uint32_t cols = ring.cols(t % STAGES, BS <= BK ? j % kSlots : 0);
#if W8A8W_PLANES
  // this thread's rows (64 wg without the N split) + 16 warp + lane / 4 + 64 mb + 8 h of the tile,
  // from the staged row planes
  RowParams r;
  const int warp = (threadIdx.x >> 5) & 3;
  const int row0 = (W8A8W_NSPLIT ? 0 : 64 * wg) + 16 * warp + (lane >> 2);
#pragma unroll
  for (int h = 0; h < 2 * kMB; ++h) {
    const uint32_t at = cols + kRowPlanes + 4 * (row0 + 64 * (h >> 1) + 8 * (h & 1));
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r.sA[h]) : "r"(at));
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r.oA[h]) : "r"(at + kRowPlaneBytes));
    int sum;  // the third plane holds sumA's int32 bits
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(sum) : "r"(at + 2 * kRowPlaneBytes));
    r.sumA[h] = static_cast<float>(sum);  // exact: |sumA| <= 128 * 256 < 2^24
  }
  (void)rows;
#else
  const RowParams& r = rows;
#endif
#pragma unroll
  for (int i = 0; i < kWN / 8; ++i) {
#if W8A8W_PLANES
    // columns c, c + 1 of the three planes (the N split: this warpgroup's 64)
    const int c = (W8A8W_NSPLIT ? 64 * wg : 0) + 8 * i + 2 * (lane & 3);
    float2 sB, oB, q;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(sB.x), "=f"(sB.y) : "r"(cols + c * 4));
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(oB.x), "=f"(oB.y) : "r"(cols + kPlaneBytes + c * 4));
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(q.x), "=f"(q.y) : "r"(cols + 2 * kPlaneBytes + c * 4));
    const float col_sB[2] = {sB.x, sB.y}, col_oB[2] = {oB.x, oB.y}, col_q[2] = {q.x, q.y};
#else
    const int c = 8 * i + 2 * (lane & 3);
    float4 b0, b1;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(b0.x), "=f"(b0.y), "=f"(b0.z), "=f"(b0.w) : "r"(cols + c * 16));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(b1.x), "=f"(b1.y), "=f"(b1.z), "=f"(b1.w) : "r"(cols + c * 16 + 16));
    const float col_sB[2] = {b0.x, b1.x}, col_oB[2] = {b0.y, b1.y}, col_q[2] = {b0.z, b1.z};
#endif
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = 2 * mb + (e >> 1);  // fragment: e = 0,1 row r0 (cols c, c+1); e = 2,3 row r0 + 8
        const int x = (kWN / 2) * mb + 4 * i + e;
        // exact (|Cq| <= 2^22 < 2^24); sm_90 converts with I2FP on the ALU pipe, one instruction
        const float cq = static_cast<float>(static_cast<int>(acc[x]));
        float v = cq * col_sB[e & 1];
        v = fmaf(r.sumA[h], col_oB[e & 1], v);
        acc_f[x] = fmaf(r.sA[h], v, acc_f[x]);
        acc_f[x] = fmaf(r.oA[h], col_q[e & 1], acc_f[x]);
      }
    }
  }
}
#endif  // W8A8W_BLOCK_SCALED

// Stages whose every read is done once block j is promoted: signal them empty (one arrive per warp).
__device__ __forceinline__ void release(const Ring& ring, int j, int G, int lane) {
  const int end = (j + 1) * BS;  // K elements consumed
  if (end % BK != 0 && j != G - 1) return;
  __syncwarp();
  if (lane == 0) {
    const int t_last = (end - 1) / BK, t_first = (j * BS) / BK;
    for (int t = t_first; t <= t_last; ++t) mbar_arrive(ring.empty(t % STAGES));
  }
}

template <typename T>
__device__ __forceinline__ void store_pair(const Params& p, int m, int n, float v0, float v1) {
  if (m >= p.M || n >= p.N) return;
  T* row = static_cast<T*>(p.D) + static_cast<long long>(m) * p.N;
  if (n + 1 < p.N && (p.N & 1) == 0) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(row + n) = make_float2(v0, v1);
    } else {
      T pair[2] = {from_float<T>(v0), from_float<T>(v1)};
      *reinterpret_cast<uint32_t*>(row + n) = *reinterpret_cast<uint32_t*>(pair);
    }
  } else {
    row[n] = from_float<T>(v0);
    if (n + 1 < p.N) row[n + 1] = from_float<T>(v1);
  }
}

// Rows r0 + 64 * mb + 8 * h, columns c0 + 8 * i + 2 * (lane & 3) + {0, 1} of this thread.
template <typename T>
__device__ __forceinline__ void epilogue(const Params& p, const float (&acc_f)[kAcc], int r0, int c0, int lane) {
#pragma unroll
  for (int i = 0; i < kWN / 8; ++i) {
    const int n = c0 + 8 * i + 2 * (lane & 3);
    const float b0 = p.bias != nullptr && n < p.N ? p.bias[n] : 0.0f;
    const float b1 = p.bias != nullptr && n + 1 < p.N ? p.bias[n + 1] : 0.0f;
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int x = (kWN / 2) * mb + 4 * i + 2 * h;
        store_pair<T>(p, r0 + 64 * mb + 8 * h, n, apply_activation(acc_f[x] + b0, p.act),
                      apply_activation(acc_f[x + 1] + b1, p.act));
      }
    }
  }
}

// The epilogue in the output type the launch asked for (out_kind 0 f32, 1 f16, 2 bf16).
__device__ __forceinline__ void store_output(const Params& p, const float (&acc_f)[kAcc], int r0, int c0, int lane) {
  if (p.out_kind == 1)
    epilogue<__half>(p, acc_f, r0, c0, lane);
  else if (p.out_kind == 2)
    epilogue<__nv_bfloat16>(p, acc_f, r0, c0, lane);
  else
    epilogue<float>(p, acc_f, r0, c0, lane);
}

__device__ __forceinline__ void consumer(const Params& p, const Ring& ring, int m0, int n0) {
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  // M split: warpgroup wg has rows 64 wg.. of every column; N split: columns 64 wg.. of every row
  const int r0 = m0 + (W8A8W_NSPLIT ? 0 : 64 * wg) + 16 * warp + (lane >> 2);
  const int c0 = n0 + (W8A8W_NSPLIT ? 64 * wg : 0);
  uint32_t acc0[kAcc], acc1[kAcc];
  float acc_f[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    acc0[i] = acc1[i] = 0u;
    acc_f[i] = 0.0f;
  }
  const int G = p.G;
  // Ping-pong: block j+1 runs on the tensor cores while block j is promoted. Every loop
  // iteration ends with nothing in flight, so no accumulator that a wgmma is still writing is
  // loop-carried (ptxas would otherwise serialize every wgmma).
  issue_block(acc0, ring, wg, 0);
  wgmma_wait<0>();
  // Row parameters are loaded one block ahead of their promotion (their latency hides behind it).
#if W8A8W_PLANES
  const RowParams r_even{}, r_odd{};  // read from shared memory in promote()
  for (int j = 0; j < G; j += 2) {
#else
  RowParams r_even = load_rows(p, r0, 0);
  for (int j = 0; j < G; j += 2) {
    const RowParams r_odd = load_rows(p, r0, min(j + 1, G - 1));
#endif
    if (j + 1 < G) issue_block(acc1, ring, wg, j + 1);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) fence_reg(acc0[i]);
    promote(acc0, acc_f, r_even, ring, j, wg, lane);
    release(ring, j, G, lane);
    wgmma_wait<0>();
    if (j + 1 >= G) break;
#if !W8A8W_PLANES
    r_even = load_rows(p, r0, min(j + 2, G - 1));
#endif
    if (j + 2 < G) issue_block(acc0, ring, wg, j + 2);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) fence_reg(acc1[i]);
    promote(acc1, acc_f, r_odd, ring, j + 1, wg, lane);
    release(ring, j + 1, G, lane);
    wgmma_wait<0>();
  }
  store_output(p, acc_f, r0, c0, lane);
}

// Ping-pong between the two warpgroups (W8A8W_PINGPONG): each holds ONE int32 set and takes
// turns with the other to issue its block's wgmmas (named barriers 1 and 2), so the tensor cores
// queue the two warpgroups' blocks in turn and each promotes while the other's block runs; the
// freed second int32 set pays for BN = 192 (one m64n192 wgmma per k-step, 48 KB of wgmma reads
// per 192 columns where the M split reads 48 KB per 128). On an H100 (M = 4096, N = K = 8192,
// block 128) passing the turn at issue measured faster than after wait_group 1 or 2 (977 vs 1018
// and 1001 us).
__device__ __forceinline__ void consumer_pingpong(const Params& p, const Ring& ring, int m0, int n0) {
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int r0 = m0 + 64 * wg + 16 * warp + (lane >> 2);
  uint32_t acc[kAcc];
  float acc_f[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    acc[i] = 0u;
    acc_f[i] = 0.0f;
  }
  const RowParams rows{};  // read from the staged planes in promote()
  constexpr int kTurnThreads = 2 * 128;  // one warpgroup arrives, the other waits
  const int my_turn = 1 + wg, other_turn = 2 - wg;  // barrier ids
  const int G = p.G;
  // Each issues once the other has issued its previous block; warpgroup 1's arrive ahead lets
  // warpgroup 0 go first. The loop has no warpgroup-dependent branch (ptxas would serialize the
  // wgmmas behind a warpgroup arrive in a divergent path, C7520).
  if (wg == 1) named_arrive(other_turn, kTurnThreads);
  for (int j = 0; j < G; ++j) {
    named_sync(my_turn, kTurnThreads);
    issue_block(acc, ring, wg, j);
    named_arrive(other_turn, kTurnThreads);
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) fence_reg(acc[i]);
    promote(acc, acc_f, rows, ring, j, wg, lane);
    release(ring, j, G, lane);
  }
  if (wg == 0) named_sync(my_turn, kTurnThreads);  // warpgroup 1's arrive after its last block
  store_output(p, acc_f, r0, n0, lane);
}

#endif  // W8A8W_HAS_WGMMA

}  // namespace w8a8w
}  // namespace cuops

extern "C" __global__ void __launch_bounds__(cuops::w8a8w::kThreads, 1)
    w8a8_kblock_wgmma(const int8_t* __restrict__ A, const float* __restrict__ sA, const float* __restrict__ oA,
                      const int32_t* __restrict__ sumA, const int8_t* __restrict__ B,
                      const float4* __restrict__ bvec, const float* __restrict__ bias, void* __restrict__ D, int M,
                      int N, int K, int G, int act, int out_kind
#if W8A8W_TMA
                      , const __grid_constant__ cuops::w8a8w::TensorMap map_a,
                      const __grid_constant__ cuops::w8a8w::TensorMap map_b
#endif
                      ) {
#if W8A8W_HAS_WGMMA
  using namespace cuops::w8a8w;
  extern __shared__ __align__(1024) uint8_t w8a8w_smem[];
  // A launch with less dynamic shared memory than the ring needs is a host bug: stop loudly.
  uint32_t dyn_smem;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
  if (dyn_smem < static_cast<uint32_t>(kSmemBytes) || blockDim.x != kThreads) __trap();
#if W8A8W_BLOCK_SCALED
  // Split-K (gridDim.y splits): this CTA runs on its K slice as on a problem of its own (the slice's
  // scales start at row g0 of the planes) and, with several splits, writes its fp32 partial sums to
  // D = the workspace [splits, M, N] (the host then passes out_kind 0, no bias, act 0, and
  // w8a8_kblock_wgmma_splitk_reduce finishes D). One split: the whole K, D itself.
  const KSlice ks = k_slice(K, blockIdx.y, gridDim.y);
  if (ks.G < 1 || ks.g0 + ks.G > G) __trap();  // the host keeps splits <= K units: every split gets one
  const long long Mp = (M + 3) & ~3;
  void* const D_split = static_cast<float*>(D) + static_cast<long long>(blockIdx.y) * M * N;
  const Params p{A, sA + ks.g0 * Mp, oA, sumA, B, bvec + static_cast<long long>(ks.g0) * UP_DIV(N, BN), bias,
                 D_split, M, N, K, ks.G, act, out_kind};
#else
  const Params p{A, sA, oA, sumA, B, bvec, bias, D, M, N, K, G, act, out_kind};
#endif

  Ring ring;
  ring.base = (smem_addr(w8a8w_smem) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  ring.bars = ring.base + STAGES * kStageBytes;

  int m0, n0;
  cuops::w8a8::tile_coords<BM, BN>(p, m0, n0);

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(ring.full(s), W8A8W_TMA ? 1 : 128);  // the TMA thread / every cp.async thread arrives
      mbar_init(ring.empty(s), kConsumerWarps);  // one arrive per consumer warp
    }
  }
  __syncthreads();
#if W8A8W_BLOCK_SCALED
  const int T = ks.T, k0 = ks.k0;
#else
  [[maybe_unused]] const int T = UP_DIV(K, BK), k0 = 0;
#endif
  if (threadIdx.x >= 32 * kConsumerWarps) {
    setmaxnreg_dec<kProducerRegs>();
#if W8A8W_TMA
    producer_tma(p, ring, m0, n0, T, k0, &map_a, &map_b);
#else
    producer(p, ring, m0, n0, T);
#endif
  } else {
    setmaxnreg_inc<kConsumerRegs>();
#if W8A8W_PINGPONG
    consumer_pingpong(p, ring, m0, n0);
#else
    consumer(p, ring, m0, n0);
#endif
  }
#else
  // Only sm_90a has wgmma; Python launches this kernel on compute capability 9.0 only.
  __trap();
#endif
}

#if W8A8W_BLOCK_SCALED
// Split-K's second launch: D[m, n] = act(sum_s workspace[s, m, n] + bias[n]) in the output type (out_kind
// 0 f32, 1 f16, 2 bf16), the slices added in split order (deterministic, no atomics), then the bias,
// activation and conversion of the GEMM's own epilogue. One thread per element, grid-stride.
extern "C" __global__ void w8a8_kblock_wgmma_splitk_reduce(const float* __restrict__ workspace,
                                                           const float* __restrict__ bias, void* __restrict__ D,
                                                           int M, int N, int splits, int act, int out_kind) {
  const long long total = static_cast<long long>(M) * N;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float v = workspace[i];
    for (int s = 1; s < splits; ++s) v += workspace[s * total + i];
    const float b = bias != nullptr ? bias[i % N] : 0.0f;
    v = cuops::apply_activation(v + b, act);
    if (out_kind == 1)
      static_cast<__half*>(D)[i] = cuops::from_float<__half>(v);
    else if (out_kind == 2)
      static_cast<__nv_bfloat16*>(D)[i] = cuops::from_float<__nv_bfloat16>(v);
    else
      static_cast<float*>(D)[i] = v;
  }
}
#endif

// The planar variants' row parameters as planes [G][3][Mp] = sA, oA, sumA's int32 bits, Mp = M rounded up
// to 4 (16-byte copies per block), from pre-quantized [M][G] inputs (QuantA inside the call writes
// the planes itself): one thread per (g, m), consecutive threads on consecutive m, so the plane
// rows are written coalesced.
extern "C" __global__ void w8a8_row_planes(const float* __restrict__ sA, const float* __restrict__ oA,
                                           const int32_t* __restrict__ sumA, float* __restrict__ planes, int M,
                                           int G, int Mp) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long long>(G) * M) return;
  const int g = static_cast<int>(i / M), m = static_cast<int>(i % M);
  const long long src = static_cast<long long>(m) * G + g;
  float* dst = planes + 3LL * g * Mp + m;
  dst[0] = sA[src];
  dst[Mp] = oA[src];
  reinterpret_cast<int32_t*>(dst)[2LL * Mp] = sumA[src];
}
