// Direct convolution for few input channels per group (the conv strategy "small_ci"): CNN stems
// (x [B, 3, 224, 224] * w [64, 3, 7, 7], stride 2, pad 3: K = Kh*Kw*Cg = 147) and the other convs whose
// K is too short or too oddly sized for the tensor-core igemm (Cg % 32 == 0). Any stride, padding,
// dilation, kernel size, groups and block size; int4 / int8 weights; fp32 / fp16 / bf16; NCHW / NHWC.
// Weight layout and argument order: conv_common.cuh.
//
// Design (one block of 128 threads = 4 warps):
// - A block owns COT = 64 output channels of one group (blockIdx.y) and walks pixel tiles of
//   TH = 2 output rows x TW = 64 output columns of one image (blockIdx.x, grid-stride: the host
//   launches about one wave, so the weights are staged once per block, not once per tile).
// - Once per block: the channel tile's weights, dequantized exactly as conv_direct does
//   (fmaf(q, scale, offset)), go to shared memory as float ws[K][COT] (zero past the group's last
//   channel), and koff[k] = where tap k = (kh, kw, c) starts in the staged input.
// - Per tile: the input patch the tile reads (halo included, zero outside the image, as float) is
//   staged "phase split" along x: patch column lx goes to phase lx % sw, slot lx / sw. Output
//   column ox then reads slot ox + (kw*dw) / sw of phase (kw*dw) % sw for every stride and
//   dilation, so the pixels of one thread, 16 columns apart, are 16 slots apart: immediate offsets
//   of one address per tap instead of stride-dependent arithmetic per pixel.
// - Warp (wy, wc) computes output row oy0 + wy x channels [32 wc, 32 wc + 32) of the tile; lane
//   (p, q) = (lane % 16, lane / 16) accumulates PX = 4 pixels (ox = p + 16 j) x CH = 16 channels
//   (16 h + 8 q + e) in 64 fp32 registers. Per k a thread loads 4 input words (16 consecutive
//   words per half warp, the halves broadcast: conflict-free), 4 weight float4s (two addresses per
//   warp) and issues 64 FMAs: about 8 shared-memory wavefronts per 16 FMA-pipe cycles of a warp.
// - Stores: NHWC writes the 8 consecutive channels of (pixel, h) as one 16-byte vector (two for
//   fp32) where aligned, lanes q = 0 / 1 filling 32 contiguous bytes (fp16); NCHW writes 16
//   consecutive columns per channel per half warp.
// - Why not the suggested per-thread run of consecutive pixels or an im2col tile: consecutive pixels of
//   a strided conv are sw words apart (bank conflicts, no immediate offsets), and an explicit im2col
//   tile of 64 pixels x K floats would double the shared memory for the stem.
// Shared memory (dynamic only): 4 * (K * COT + ceil4(K) + 4 + Cg * PH * sw * Lp) bytes with
// PH = (TH-1)*sh + (Kh-1)*dh + 1 patch rows and Lp = TW + (Kw-1)*dw / sw slots per phase: 52,712 bytes
// for the stem (4 blocks = 16 warps per sm_90 SM, which __launch_bounds__(128, 4) keeps registers
// for). The host refuses more than 99 KiB (the sm_86/89 opt-in limit; 64 KiB on sm_75), which bounds
// K: 7x7 stride 2 up to Cg = 5 (K = 245), 3x3 stride 1 up to Cg = 29 (K = 261), 1x1 up to Cg = 131.
// 32-bit index math: the host refuses x or out of 2^31 elements or more.
#include "conv_common.cuh"

namespace cuops {
namespace conv {
namespace small_ci {

// The tile; cutlass_ops/conv/small_ci.py mirrors these (its tests compare them with this file).
constexpr int TH = 2;        // output rows per tile: one per pixel warp
constexpr int TW = 64;       // output columns per tile: 16 lanes x PX pixels
constexpr int COT = 64;      // output channels per block: two channel warps of 32
constexpr int THREADS = 128;
constexpr int PX = 4;        // pixels per thread, 16 columns apart
constexpr int CH = 16;       // channels per thread: 2 runs (h) of 8
constexpr int PIXEL_LANES = 16;
constexpr int STAGE_BATCH = 8;  // global loads a thread keeps in flight while staging
static_assert(THREADS == 32 * TH * (COT / 32) && TW == PIXEL_LANES * PX && CH == 2 * 8, "tile / warp mismatch");

// n / d for 0 <= n < 2^31 by a multiply and a shift (Granlund-Montgomery, as CUTLASS's FastDivmod):
// the staging loops decompose a flat index per element, and an integer division by a runtime value
// is a ~20 instruction software routine. m = ceil(2^(31+l) / d) with l = ceil(log2 d) fits 32 bits
// (m = 2^31 for d = 1), and floor(n * m / 2^(31+l)) = floor(n / d) for every n < 2^31.
struct FastDiv {
  unsigned mul, shift;
  __device__ explicit FastDiv(int d) {
    unsigned l = 0;
    while ((1u << l) < static_cast<unsigned>(d)) ++l;
    mul = static_cast<unsigned>(((1ull << (31 + l)) + static_cast<unsigned>(d) - 1) / static_cast<unsigned>(d));
    shift = 31 + l;
  }
  __device__ __forceinline__ int operator()(int n) const {  // one IMAD.WIDE.U32, one 64-bit shift
    return static_cast<int>((static_cast<unsigned long long>(static_cast<unsigned>(n)) * mul) >> shift);
  }
};

// Input patch of one pixel tile, phase split along x: float xs[Cg][PH][sw][Lp].
struct Patch {
  int PH;  // rows: (TH - 1) * sh + (Kh - 1) * dh + 1
  int Lp;  // slots per phase: TW + (Kw - 1) * dw / sw (the last column read is (TW-1)*sw + (Kw-1)*dw)
  int LX;  // columns staged per row: sw * Lp (those past the last one read are staged, never read)
  __device__ Patch(const ConvDims& d)
      : PH((TH - 1) * d.sh + (d.Kh - 1) * d.dh + 1), Lp(TW + (d.Kw - 1) * d.dw / d.sw), LX(d.sw * Lp) {}
};

// ws[k][col] = weight k of output channel co_begin + col (0 past the tile's co_count channels).
template <int BITS>
__device__ __forceinline__ void stage_weights(float* ws, const uint8_t* __restrict__ qweight,
                                              const float* __restrict__ scale, const float* __restrict__ offset,
                                              int co_begin, int co_count, int K, int block_size) {
  const size_t w_row_bytes = row_bytes<BITS>(K);
  const int G = K / block_size;
  const FastDiv div_block(block_size);
  const int total = K * COT;
  for (int e0 = threadIdx.x; e0 < total; e0 += THREADS * STAGE_BATCH) {
    int qv[STAGE_BATCH];
    float sv[STAGE_BATCH], ov[STAGE_BATCH];
#pragma unroll
    for (int u = 0; u < STAGE_BATCH; ++u) {  // predicated loads only: all of them in flight at once
      const int e = e0 + u * THREADS;
      const int k = e / COT, col = e % COT;  // consecutive threads: consecutive channels (conflict-free stores)
      const bool live = e < total && col < co_count;
      const int co = co_begin + (live ? col : 0);
      const int gi = co * G + div_block(live ? k : 0);
      qv[u] = 0;
      sv[u] = 0.0f;
      ov[u] = 0.0f;
      if (live) {
        qv[u] = load_q<BITS>(qweight + co * w_row_bytes, k);
        sv[u] = scale[gi];
        ov[u] = offset[gi];
      }
    }
#pragma unroll
    for (int u = 0; u < STAGE_BATCH; ++u) {
      const int e = e0 + u * THREADS;
      if (e < total) ws[e] = fmaf(static_cast<float>(qv[u]), sv[u], ov[u]);
    }
  }
}

// xs = the patch of image b, input channels [c0, c0 + Cg), rows iy0 + [0, PH), columns ix0 + [0, LX).
// The flat index runs along x (NCHW) or along the channels (NHWC), so that consecutive threads read
// consecutive global addresses.
template <typename T, bool NCHW>
__device__ __forceinline__ void stage_patch(float* xs, const T* __restrict__ x, const ConvDims& d, const Patch& pt,
                                            int Cg, int b, int c0, int iy0, int ix0, const FastDiv& div_lx,
                                            const FastDiv& div_inner, const FastDiv& div_sw) {
  const int total = Cg * pt.PH * pt.LX;
  for (int e0 = threadIdx.x; e0 < total; e0 += THREADS * STAGE_BATCH) {
    T raw[STAGE_BATCH];
    int slot[STAGE_BATCH];
#pragma unroll
    for (int u = 0; u < STAGE_BATCH; ++u) {  // predicated loads only, converted below: all in flight at once
      const int e = e0 + u * THREADS;
      const int ec = e < total ? e : 0;
      int c, row, lx;
      if (NCHW) {  // ec = (c * PH + row) * LX + lx; div_inner divides by PH
        const int cr = div_lx(ec);
        lx = ec - cr * pt.LX;
        c = div_inner(cr);
        row = cr - c * pt.PH;
      } else {     // ec = (row * LX + lx) * Cg + c; div_inner divides by Cg
        const int rl = div_inner(ec);
        c = ec - rl * Cg;
        row = div_lx(rl);
        lx = rl - row * pt.LX;
      }
      const int m = div_sw(lx);
      slot[u] = e < total ? ((c * pt.PH + row) * d.sw + (lx - m * d.sw)) * pt.Lp + m : -1;
      const int iy = iy0 + row, ix = ix0 + lx;
      raw[u] = from_float<T>(0.0f);  // the zero padding
      // unsigned compares: a negative coordinate (the top / left padding) wraps above H / W
      if (e < total && static_cast<unsigned>(iy) < static_cast<unsigned>(d.H) &&
          static_cast<unsigned>(ix) < static_cast<unsigned>(d.W)) {
        raw[u] = x[NCHW ? ((b * d.Ci + c0 + c) * d.H + iy) * d.W + ix : ((b * d.H + iy) * d.W + ix) * d.Ci + c0 + c];
      }
    }
#pragma unroll
    for (int u = 0; u < STAGE_BATCH; ++u)
      if (slot[u] >= 0) xs[slot[u]] = to_float<T>(raw[u]);
  }
}

// acc += the tap's 4 input values x its 16 weights. xp: this thread's first pixel in the tap's
// patch row / phase; wp: its first channel in the tap's ws row.
__device__ __forceinline__ void fma_tap(float (&acc)[PX][CH], const float* xp, const float* wp) {
  float xv[PX];
#pragma unroll
  for (int j = 0; j < PX; ++j) xv[j] = xp[PIXEL_LANES * j];
  float wv[CH];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int v = 0; v < 2; ++v) {  // float4: all lanes of a half warp read the same 16 bytes (broadcast)
      const float4 w4 = *reinterpret_cast<const float4*>(wp + 16 * h + 4 * v);
      wv[8 * h + 4 * v + 0] = w4.x;
      wv[8 * h + 4 * v + 1] = w4.y;
      wv[8 * h + 4 * v + 2] = w4.z;
      wv[8 * h + 4 * v + 3] = w4.w;
    }
  }
#pragma unroll
  for (int j = 0; j < PX; ++j) {
#pragma unroll
    for (int i = 0; i < CH; ++i) acc[j][i] = fmaf(xv[j], wv[i], acc[j][i]);
  }
}

__device__ __forceinline__ unsigned bits16(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned bits16(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

// 8 consecutive outputs at a 16-byte aligned dst: one 128-bit store (two for fp32).
__device__ __forceinline__ void store8(float* dst, const float (&v)[8]) {
  reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T>
__device__ __forceinline__ void store8(T* dst, const float (&v)[8]) {
  uint4 u;  // element 2i in the low half of word i (little endian)
  u.x = bits16(from_float<T>(v[0])) | (bits16(from_float<T>(v[1])) << 16);
  u.y = bits16(from_float<T>(v[2])) | (bits16(from_float<T>(v[3])) << 16);
  u.z = bits16(from_float<T>(v[4])) | (bits16(from_float<T>(v[5])) << 16);
  u.w = bits16(from_float<T>(v[6])) | (bits16(from_float<T>(v[7])) << 16);
  *reinterpret_cast<uint4*>(dst) = u;
}

// VEC8 (NHWC only): the caller has checked that every run of 8 channels a thread stores is whole and
// 16-byte aligned (vector_stores_ok).
template <typename T, int BITS, bool NCHW, bool VEC8>
__device__ __forceinline__ void conv_small_ci(const T* __restrict__ x, const uint8_t* __restrict__ qweight,
                                              const float* __restrict__ scale, const float* __restrict__ offset,
                                              const T* __restrict__ bias, T* __restrict__ out, const ConvDims d) {
  extern __shared__ __align__(16) unsigned char conv_small_ci_smem[];
  const int Cg = d.Ci / d.groups;  // input channels per group = the weight's Ci
  const int Cog = d.Co / d.groups;
  const int K = d.Kh * d.Kw * Cg;
  const int K4 = (K + 3) & ~3;
  const Patch pt(d);
  float* ws = reinterpret_cast<float*>(conv_small_ci_smem);  // [K][COT]
  int* koff = reinterpret_cast<int*>(ws + K * COT);          // [K4 + 4]: int4 reads, one prefetched past K
  float* xs = reinterpret_cast<float*>(koff + K4 + 4);       // [Cg][PH][sw][Lp]

  // This block's channels: tile blockIdx.y of the groups' tiles, inside group g.
  const int tiles_per_group = UP_DIV(Cog, COT);
  const int g = blockIdx.y / tiles_per_group;
  const int co_begin = g * Cog + (blockIdx.y - g * tiles_per_group) * COT;
  const int co_count = min(COT, (g + 1) * Cog - co_begin);

  stage_weights<BITS>(ws, qweight, scale, offset, co_begin, co_count, K, d.block_size);
  for (int k = threadIdx.x; k < K4 + 4; k += THREADS) {
    int off = 0;  // the padding entries point at slot 0: read (prefetch), never used
    if (k < K) {
      const int tap = k / Cg, c = k - tap * Cg;
      const int kh = tap / d.Kw, kw = tap - kh * d.Kw;
      const int col = kw * d.dw;  // patch column of output column 0
      off = ((c * pt.PH + kh * d.dh) * d.sw + col % d.sw) * pt.Lp + col / d.sw;
    }
    koff[k] = off;
  }

  const FastDiv div_lx(pt.LX), div_inner(NCHW ? pt.PH : Cg), div_sw(d.sw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wy = warp % TH, wc = warp / TH;            // output row of the tile, channel half
  const int p = lane % PIXEL_LANES, q = lane / PIXEL_LANES;
  const int cl0 = wc * 32 + 8 * q;                     // this thread's first channel in the tile (h = 0)
  const bool has_channels = wc * 32 < co_count;        // warp-uniform: Co < 64 leaves warps idle
  const float* xb = xs + wy * d.sh * pt.LX + p;        // output row wy reads patch rows wy * sh + kh * dh
  const float* wb = ws + cl0;
  const int4* koff4 = reinterpret_cast<const int4*>(koff);

  const int tiles_x = UP_DIV(d.Ow, TW), tiles_y = UP_DIV(d.Oh, TH);
  const int tiles = d.batch * tiles_y * tiles_x;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int tx = t % tiles_x, tyb = t / tiles_x;
    const int ty = tyb % tiles_y, b = tyb / tiles_y;
    const int oy0 = ty * TH, ox0 = tx * TW;
    __syncthreads();  // every warp is done reading the previous tile's patch
    stage_patch<T, NCHW>(xs, x, d, pt, Cg, b, g * Cg, oy0 * d.sh - d.ph, ox0 * d.sw - d.pw,
                         div_lx, div_inner, div_sw);
    __syncthreads();  // the patch (and, the first time, ws and koff) is visible to every warp
    const int oy = oy0 + wy;
    if (!has_channels || oy >= d.Oh) continue;  // warp-uniform; no barrier before the next tile's first

    float acc[PX][CH];
#pragma unroll
    for (int j = 0; j < PX; ++j) {
#pragma unroll
      for (int i = 0; i < CH; ++i) acc[j][i] = 0.0f;
    }
    int k = 0;
    int4 o_next = koff4[0];
#pragma unroll 1
    for (; k + 4 <= K; k += 4) {
      const int4 o = o_next;
      o_next = koff4[(k >> 2) + 1];  // next group's offsets ahead of this group's FMAs (koff has 4 spare)
      fma_tap(acc, xb + o.x, wb + (k + 0) * COT);
      fma_tap(acc, xb + o.y, wb + (k + 1) * COT);
      fma_tap(acc, xb + o.z, wb + (k + 2) * COT);
      fma_tap(acc, xb + o.w, wb + (k + 3) * COT);
    }
    for (; k < K; ++k) fma_tap(acc, xb + koff[k], wb + k * COT);

    // Epilogue: + bias, activation, store (pixels past Ow, channels past co_count skipped).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int cl = cl0 + 16 * h;  // tile channel of element (h, e = 0)
      if (cl >= co_count) continue;
      const int co = co_begin + cl;
      float bv[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) bv[e] = (bias != nullptr && cl + e < co_count) ? to_float<T>(bias[co + e]) : 0.0f;
#pragma unroll
      for (int j = 0; j < PX; ++j) {
        const int ox = ox0 + p + PIXEL_LANES * j;
        if (ox >= d.Ow) continue;
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = apply_activation(acc[j][8 * h + e] + bv[e], d.act);
        if (NCHW) {
          T* dst = out + ((b * d.Co + co) * d.Oh + oy) * d.Ow + ox;
          const int plane = d.Oh * d.Ow;
#pragma unroll
          for (int e = 0; e < 8; ++e)
            if (cl + e < co_count) dst[e * plane] = from_float<T>(v[e]);
        } else {
          T* dst = out + ((b * d.Oh + oy) * d.Ow + ox) * d.Co + co;
          if (VEC8) {
            store8(dst, v);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
              if (cl + e < co_count) dst[e] = from_float<T>(v[e]);
          }
        }
      }
    }
  }
}

// NHWC: a thread's runs of 8 channels (co_begin + 16 h + 8 q + [0, 8)) are whole and 16-byte aligned
// when each group's channels come in eights (then so do co_begin and the tile's co_count) and out is.
template <typename T>
__device__ __forceinline__ bool vector_stores_ok(const T* out, int Co, int groups) {
  return (Co / groups) % 8 == 0 && reinterpret_cast<size_t>(out) % 16 == 0;
}

// The kernel body instantiated per store path, chosen once per launch: a branch inside it, between a
// vector and 8 scalar stores per pixel, made NVVM unswitch the whole tile loop (minutes of compile).
template <typename T, int BITS, bool NCHW>
__device__ __forceinline__ void conv_small_ci_entry(const T* __restrict__ x, const uint8_t* __restrict__ qweight,
                                                    const float* __restrict__ scale, const float* __restrict__ offset,
                                                    const T* __restrict__ bias, T* __restrict__ out, const ConvDims d) {
  if (!NCHW && vector_stores_ok(out, d.Co, d.groups)) {
    conv_small_ci<T, BITS, false, true>(x, qweight, scale, offset, bias, out, d);
  } else {
    conv_small_ci<T, BITS, NCHW, false>(x, qweight, scale, offset, bias, out, d);
  }
}

}  // namespace small_ci
}  // namespace conv
}  // namespace cuops

// __launch_bounds__(THREADS, 4): four 52.7 KB blocks share an sm_90 SM's shared memory (the stem),
// so registers are capped at 128 per thread to let them all stay resident.
#define CUOPS_DEFINE_CONV_SMALL_CI(NAME, T, BITS, NCHW)                                                     \
  extern "C" __global__ void __launch_bounds__(128, 4)                                                    \
      NAME(const T* x, const uint8_t* qweight, const float* scale, const float* offset, const T* bias, T* out, \
           CUOPS_CONV_INT_ARGS) {                                                                         \
    cuops::conv::small_ci::conv_small_ci_entry<T, BITS, NCHW>(x, qweight, scale, offset, bias, out, CUOPS_CONV_DIMS); \
  }

#if CUOPS_CONV_WANT(1, 4)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f32_w4_nchw, float, 4, true)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f32_w4_nhwc, float, 4, false)
#endif
#if CUOPS_CONV_WANT(1, 8)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f32_w8_nchw, float, 8, true)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f32_w8_nhwc, float, 8, false)
#endif
#if CUOPS_CONV_WANT(2, 4)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f16_w4_nchw, __half, 4, true)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f16_w4_nhwc, __half, 4, false)
#endif
#if CUOPS_CONV_WANT(2, 8)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f16_w8_nchw, __half, 8, true)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_f16_w8_nhwc, __half, 8, false)
#endif
#if CUOPS_CONV_WANT(3, 4)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_bf16_w4_nchw, __nv_bfloat16, 4, true)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_bf16_w4_nhwc, __nv_bfloat16, 4, false)
#endif
#if CUOPS_CONV_WANT(3, 8)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_bf16_w8_nchw, __nv_bfloat16, 8, true)
CUOPS_DEFINE_CONV_SMALL_CI(conv_small_ci_bf16_w8_nhwc, __nv_bfloat16, 8, false)
#endif
