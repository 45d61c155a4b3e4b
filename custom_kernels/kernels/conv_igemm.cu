// Implicit GEMM convolution (the conv strategy "igemm") for NHWC fp16/bf16 on sm_80+:
// D[M = B*Oh*Ow, N = Co] = im2col(x)[M, K] @ W^T. 64x64x32 tiles, 4 warps of mma.sync m16n8k16 side
// by side along N, a 4-stage cp.async ring for the activation patch, the raw quantized weight and
// its scale/offset; weights are dequantized straight into mma B fragments. Optional split-K: each
// z-slice writes fp32 partials ([splits, M, Co] for an NHWC output, [splits, Co, M] for NCHW),
// conv_splitk_reduce_* adds them, the bias and the activation. Needs Cg = Ci / groups % 32 == 0 and
// block_size % 32 == 0 (one quantization group per 32-wide K tile), and for groups > 1
// (Co / groups) % 64 == 0 (each CTA's 64 columns in one group). The output may be NHWC or NCHW
// (the latter for NCHW callers, whose input conv_nchw_to_nhwc_b16 transposes first).
// Weight layout and argument order: conv_common.cuh.
// Each NVRTC build takes one (dtype, bits) slice of the file (CUOPS_CONV_T / CUOPS_CONV_BITS).
#include "conv_common.cuh"

namespace cuops {
namespace conv {

// ---------------------------------------------------------------------------------------------
// Implicit GEMM (sm_80+): PTX helpers.
// ---------------------------------------------------------------------------------------------
constexpr int BM = 64, BN = 64, BK = 32, STAGES = 4, THREADS = 128;
// A rows padded to 40 halves (80 bytes): ldmatrix's 8 row addresses then hit 8 distinct
// 16-byte bank groups (80 / 16 = 5 is odd), so the loads are conflict-free.
constexpr int A_LD = BK + 8;
// Raw weight row bytes per K tile: int4 16 bytes (8 rows x 16 B cover all 32 banks once);
// int8 32 data bytes padded to 48 so that rows r and r + 4 do not share banks.
template <int BITS> struct WTile { static constexpr int kBytes = BITS == 4 ? 16 : 48; };

// The tensor-core path (cp.async, m16n8k16, bf16x2 arithmetic) exists from sm_80 on; below that
// only the direct kernels do work and the igemm entry points trap.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define CUOPS_CONV_TENSOR_CORES 1

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 zero-fills (padding / out-of-range rows).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 4-byte async copy (scale/offset entries are strided by G in global memory).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices: lanes 0-15 address rows 0-15 of k 0-7, lanes 16-31 rows 0-15 of
// k 8-15, which yields exactly the a0..a3 registers of an m16n8k16 A fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint32_t h2_bits(__half2 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ uint32_t h2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __half2 bits_h2(uint32_t v) { return *reinterpret_cast<__half2*>(&v); }
__device__ __forceinline__ __nv_bfloat162 bits_b2(uint32_t v) { return *reinterpret_cast<__nv_bfloat162*>(&v); }

// Per-thread dequantizer of B-fragment pairs. A lane with c = lane % 4 needs weight elements
// (2c, 2c+1) of each 8-element group along K, packed low half first (mma's k order).
template <typename T, int BITS> struct Dequant;

// fp16 x int4: the interleaved layout puts elements 2c and 2c+1 in nibbles c and c+4.
template <> struct Dequant<__half, 4> {
  int shift;
  __device__ __forceinline__ explicit Dequant(int c) : shift(4 * c) {}
  __device__ __forceinline__ uint32_t operator()(uint32_t word, __half2 s, __half2 o) const {
    // Nibbles c and c+4 land in bits 0-3 of each half; 0x6400 is fp16 1024.0, whose ulp is 1,
    // so the OR (one lop3) builds 1024 + u exactly in both halves.
    const uint32_t v = ((word >> shift) & 0x000f000fu) | 0x64006400u;
    // 0x6408 is fp16 1032 = 1024 + 8: removes the magic and the +8 storage bias, q exact.
    const __half2 q = __hsub2(bits_h2(v), bits_h2(0x64086408u));
    return h2_bits(__hfma2(q, s, o));
  }
};
// bf16 x int4: same extraction with bf16 128.0 (0x4300, ulp 1); 0x4308 = 136 = 128 + 8.
template <> struct Dequant<__nv_bfloat16, 4> {
  int shift;
  __device__ __forceinline__ explicit Dequant(int c) : shift(4 * c) {}
  __device__ __forceinline__ uint32_t operator()(uint32_t word, __nv_bfloat162 s, __nv_bfloat162 o) const {
    const uint32_t v = ((word >> shift) & 0x000f000fu) | 0x43004300u;
    const __nv_bfloat162 q = __hsub2(bits_b2(v), bits_b2(0x43084308u));
    return h2_bits(__hfma2(q, s, o));
  }
};
// fp16 x int8: a word holds 4 consecutive K elements; the pair is bytes 2h, 2h+1 (h = c & 1).
template <> struct Dequant<__half, 8> {
  uint32_t selector;
  // prmt selector: result bytes (b_2h, 0x64, b_2h+1, 0x64) -- 4 indexes the 0x64 filler word.
  __device__ __forceinline__ explicit Dequant(int c) : selector((c & 1) ? 0x4342u : 0x4140u) {}
  __device__ __forceinline__ uint32_t operator()(uint32_t word, __half2 s, __half2 o) const {
    // XOR 0x80 maps signed q to u = q + 128 in [0, 255]; under the exponent byte 0x64 each
    // half reads 1024 + u exactly (fp16 has 10 mantissa bits).
    const uint32_t v = __byte_perm(word ^ 0x80808080u, 0x64646464u, selector);
    // 0x6480 is fp16 1152 = 1024 + 128.
    const __half2 q = __hsub2(bits_h2(v), bits_h2(0x64806480u));
    return h2_bits(__hfma2(q, s, o));
  }
};
// bf16 x int8: bf16 has only 7 mantissa bits, too few for u in [0, 255]; go through fp32.
template <> struct Dequant<__nv_bfloat16, 8> {
  uint32_t sel0, sel1;
  // prmt selectors: byte b of u into the low mantissa byte of 0x4B000000 (float 2^23);
  // index 4 reads a 0x00 byte and 7 the 0x4B exponent byte of the second operand.
  __device__ __forceinline__ explicit Dequant(int c)
      : sel0(0x7440u | (2u * (c & 1))), sel1(0x7440u | (2u * (c & 1) + 1u)) {}
  __device__ __forceinline__ uint32_t operator()(uint32_t word, float s, float o) const {
    const uint32_t u = word ^ 0x80808080u;  // q + 128
    // 2^23 + u exactly; subtracting 2^23 + 128 = 8388736 leaves q.
    const float q0 = __int_as_float(static_cast<int>(__byte_perm(u, 0x4B000000u, sel0))) - 8388736.0f;
    const float q1 = __int_as_float(static_cast<int>(__byte_perm(u, 0x4B000000u, sel1))) - 8388736.0f;
    return h2_bits(__floats2bfloat162_rn(fmaf(q0, s, o), fmaf(q1, s, o)));
  }
};

// The scale/offset operand type each dequantizer takes.
template <typename T, int BITS> struct DqParam;
template <> struct DqParam<__half, 4> {
  using type = __half2;
  static __device__ __forceinline__ type make(float v) { return __float2half2_rn(v); }
};
template <> struct DqParam<__half, 8> {
  using type = __half2;
  static __device__ __forceinline__ type make(float v) { return __float2half2_rn(v); }
};
template <> struct DqParam<__nv_bfloat16, 4> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float v) { return __float2bfloat162_rn(v); }
};
template <> struct DqParam<__nv_bfloat16, 8> {
  using type = float;
  static __device__ __forceinline__ type make(float v) { return v; }
};

template <typename T> struct Vec2;
template <> struct Vec2<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct Vec2<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// Stores two adjacent output channels (col, col + 1) of output pixel m.
template <typename T, bool OUT_NCHW>
__device__ __forceinline__ void store_pair(T* __restrict__ out, int m, int col, float v0, float v1, int Co, int OhOw) {
  if (OUT_NCHW) {
    const int b = m / OhOw, pix = m - b * OhOw;
    T* p = out + (static_cast<size_t>(b) * Co + col) * OhOw + pix;
    if (col < Co) p[0] = from_float<T>(v0);
    if (col + 1 < Co) p[OhOw] = from_float<T>(v1);
  } else {
    T* p = out + static_cast<size_t>(m) * Co + col;
    if (col + 1 < Co && (Co & 1) == 0) {
      *reinterpret_cast<typename Vec2<T>::type*>(p) = Vec2<T>::make(v0, v1);
    } else {
      if (col < Co) p[0] = from_float<T>(v0);
      if (col + 1 < Co) p[1] = from_float<T>(v1);
    }
  }
}

#endif  // sm_80+

template <typename T, int BITS, bool OUT_NCHW>
__device__ __forceinline__ void conv_igemm(const T* __restrict__ x, const uint8_t* __restrict__ qweight,
                                           const float* __restrict__ scale, const float* __restrict__ offset,
                                           const T* __restrict__ bias, T* __restrict__ out,
                                           float* __restrict__ workspace, const ConvDims d, int kt_per_split) {
#ifdef CUOPS_CONV_TENSOR_CORES
  constexpr int W_LD = WTile<BITS>::kBytes;
  __shared__ __align__(128) uint16_t sA[STAGES][BM][A_LD];
  __shared__ __align__(128) uint8_t sW[STAGES][BN][W_LD];
  __shared__ float sScale[STAGES][BN];
  __shared__ float sOffset[STAGES][BN];

  const int tid = threadIdx.x, lane = tid & 31;
  // The 4 warps sit side by side along N: warp wn computes all 64 rows x columns 16wn..16wn+15,
  // so every weight fragment is dequantized by exactly one warp (A fragments are re-read instead,
  // which ldmatrix does cheaply).
  const int wn = tid >> 5;
  const int M = d.batch * d.Oh * d.Ow;
  const int Cg = d.Ci / d.groups;  // input channels per group = the weight's Ci
  const int K = d.Kh * d.Kw * Cg;
  const int KT = K / BK;
  const int G = K / d.block_size;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int kt_begin = blockIdx.z * kt_per_split;
  const int nk = min(KT, kt_begin + kt_per_split) - kt_begin;
  const size_t w_row_bytes = row_bytes<BITS>(K);
  // The host keeps a CTA's BN columns inside one group, so its im2col rows read that group's
  // Cg channels, starting at channel c0 of each pixel's Ci.
  const int c0 = (n0 / (d.Co / d.groups)) * Cg;

  // Activation loader: thread covers tile rows tid/4 and tid/4 + 32, 16-byte chunk tid % 4 of
  // the 64-byte (32-channel) slice; the output pixel of each row is decoded once.
  const int a_chunk = tid & 3;
  int a_iy0[2], a_ix0[2];
  const T* a_base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int m = m0 + (tid >> 2) + 32 * i;
    const int mm = m < M ? m : 0;
    const int ox = mm % d.Ow, t = mm / d.Ow;
    const int oy = t % d.Oh, b = t / d.Oh;
    // A row past M gets a far-negative origin so every tap reads as padding (zero-filled).
    a_iy0[i] = m < M ? oy * d.sh - d.ph : -(1 << 29);
    a_ix0[i] = ox * d.sw - d.pw;
    a_base[i] = x + static_cast<size_t>(b) * d.H * d.W * d.Ci + c0 + a_chunk * 8;
  }
  // Per-thread weight / scale sources: int4 rows take one 16-byte chunk (threads 0..63), int8
  // rows two (all threads); threads 0..63 fetch scales, 64..127 offsets.
  const int w_row = BITS == 4 ? (tid & (BN - 1)) : (tid >> 1);
  const int w_part = BITS == 4 ? 0 : (tid & 1);
  const bool w_ok = (BITS == 8 || tid < BN) && n0 + w_row < d.Co;
  const uint8_t* w_src = w_ok ? qweight + (n0 + w_row) * w_row_bytes + w_part * 16 : qweight;
  const int p_row = tid & (BN - 1);
  const bool p_ok = n0 + p_row < d.Co;
  const float* p_src = p_ok ? (tid < BN ? scale : offset) + static_cast<size_t>(n0 + p_row) * G : scale;
  float* p_dst = tid < BN ? &sScale[0][p_row] : &sOffset[0][p_row];

  // K-tile coordinates of the next tile to load, advanced incrementally (tiles are loaded in
  // order) so the main loop does no integer division: k0 = (kh * Kw + kw) * Cg + ci0.
  int ld_k0 = kt_begin * BK;
  int ld_ci0, ld_kh, ld_kw;
  {
    const int khw = ld_k0 / Cg;
    ld_ci0 = ld_k0 - khw * Cg;
    ld_kh = khw / d.Kw;
    ld_kw = khw - ld_kh * d.Kw;
  }
  // block_size % BK == 0: the whole K tile lies in quantization group k0 / block_size.
  int ld_g = ld_k0 / d.block_size, ld_in_group = ld_k0 - ld_g * d.block_size;

  auto load_next = [&](int stage) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int iy = a_iy0[i] + ld_kh * d.dh, ix = a_ix0[i] + ld_kw * d.dw;
      const bool ok = static_cast<unsigned>(iy) < static_cast<unsigned>(d.H) &&
                      static_cast<unsigned>(ix) < static_cast<unsigned>(d.W);
      const T* src = ok ? a_base[i] + (static_cast<size_t>(iy) * d.W + ix) * d.Ci + ld_ci0 : x;
      cp_async16(smem_addr(&sA[stage][(tid >> 2) + 32 * i][a_chunk * 8]), src, ok ? 16 : 0);
    }
    if (BITS == 8 || tid < BN) {
      cp_async16(smem_addr(&sW[stage][w_row][w_part * 16]), w_ok ? w_src + ld_k0 * BITS / 8 : qweight,
                 w_ok ? 16 : 0);
    }
    cp_async4(smem_addr(p_dst + stage * BN), p_ok ? p_src + ld_g : scale, p_ok ? 4 : 0);
    // advance to the next K tile
    ld_k0 += BK;
    ld_ci0 += BK;
    if (ld_ci0 == Cg) {
      ld_ci0 = 0;
      if (++ld_kw == d.Kw) {
        ld_kw = 0;
        ++ld_kh;
      }
    }
    ld_in_group += BK;
    if (ld_in_group == d.block_size) {
      ld_in_group = 0;
      ++ld_g;
    }
  };

  float acc[4][2][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

  const int c = lane & 3, nr = lane >> 2;
  const Dequant<T, BITS> dequant(c);
  using P = DqParam<T, BITS>;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nk) load_next(s);
    cp_async_commit();
  }

  for (int kt = 0; kt < nk; ++kt) {
    // Groups committed so far: STAGES - 1 + kt; allowing STAGES - 2 pending leaves tile kt landed.
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile kt visible to all; everyone is done with the stage refilled below
    if (kt + STAGES - 1 < nk) load_next((kt + STAGES - 1) % STAGES);
    cp_async_commit();

    const int st = kt % STAGES;
    uint32_t a[2][4][4];  // [k16 step][m16 fragment][register]
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        ldmatrix_x4(a[ks][i], smem_addr(&sA[st][i * 16 + (lane & 15)][ks * 16 + (lane >> 4) * 8]));
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int nl = wn * 16 + j * 8 + nr;
      const uint8_t* wrow = &sW[st][nl][0];
      const typename P::type sv = P::make(sScale[st][nl]);
      const typename P::type ov = P::make(sOffset[st][nl]);
      uint32_t w[4];  // the words holding k = 2c, 2c+1 (+8, +16, +24) of this column
      if (BITS == 4) {  // 16 bytes = the row's 32 K elements, 8 per word
        const uint4 v = *reinterpret_cast<const uint4*>(wrow);
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
      } else {  // 4 elements per word: the word at k = 8q + 4 * (c >> 1), q = 0..3
#pragma unroll
        for (int q = 0; q < 4; ++q) w[q] = *reinterpret_cast<const uint32_t*>(wrow + 8 * q + 4 * (c >> 1));
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint32_t b0 = dequant(w[2 * ks], sv, ov);
        const uint32_t b1 = dequant(w[2 * ks + 1], sv, ov);
#pragma unroll
        for (int i = 0; i < 4; ++i) Mma<T>::run(acc[i][j], a[ks][i], b0, b1);
      }
    }
  }
  cp_async_wait<0>();

  // Epilogue. Accumulator fragment: rows nr and nr + 8, columns 2c and 2c + 1.
  const int OhOw = d.Oh * d.Ow;
  const bool split = gridDim.z > 1;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int col = n0 + wn * 16 + j * 8 + 2 * c;
    if (col >= d.Co) continue;
    float b0v = 0.0f, b1v = 0.0f;
    if (!split && bias != nullptr) {
      b0v = to_float<T>(bias[col]);
      if (col + 1 < d.Co) b1v = to_float<T>(bias[col + 1]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + i * 16 + nr + 8 * h;
        if (m >= M) continue;
        const float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if (split && OUT_NCHW) {  // partials [splits, Co, M]: the NCHW reduce then reads along m
          float* p = workspace + (static_cast<size_t>(blockIdx.z) * d.Co + col) * M + m;
          p[0] = v0;
          if (col + 1 < d.Co) p[M] = v1;
        } else if (split) {  // partials [splits, M, Co]
          float* p = workspace + (static_cast<size_t>(blockIdx.z) * M + m) * d.Co + col;
          if (col + 1 < d.Co && (d.Co & 1) == 0) {
            *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
          } else {
            p[0] = v0;
            if (col + 1 < d.Co) p[1] = v1;
          }
        } else {
          store_pair<T, OUT_NCHW>(out, m, col, apply_activation(v0 + b0v, d.act),
                                  apply_activation(v1 + b1v, d.act), d.Co, OhOw);
        }
      }
    }
  }
#else
  __trap();  // the host never launches the tensor-core path below sm_80
#endif
}

// Sums the split-K partials, adds the bias, applies the activation and writes the output in its
// memory order (NHWC [M, Co] or NCHW).
template <typename T, bool OUT_NCHW>
__device__ __forceinline__ void conv_splitk_reduce(const float* __restrict__ workspace, const T* __restrict__ bias,
                                                   T* __restrict__ out, int M, int Co, int OhOw, int splits, int act) {
  const long long total = static_cast<long long>(M) * Co;
  for (long long idx = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long long>(gridDim.x) * blockDim.x) {
    int m, n;
    if (OUT_NCHW) {
      const long long per_image = static_cast<long long>(Co) * OhOw;
      const int b = static_cast<int>(idx / per_image);
      const int rem = static_cast<int>(idx - b * per_image);
      n = rem / OhOw;
      m = b * OhOw + (rem - n * OhOw);
    } else {
      m = static_cast<int>(idx / Co);
      n = static_cast<int>(idx - static_cast<long long>(m) * Co);
    }
    float v = bias != nullptr ? to_float<T>(bias[n]) : 0.0f;
    // Partials are [splits, Co, M] for an NCHW output and [splits, M, Co] for NHWC: either way
    // consecutive threads read consecutive addresses.
    for (int s = 0; s < splits; ++s) {
      v += OUT_NCHW ? workspace[(static_cast<size_t>(s) * Co + n) * M + m]
                    : workspace[(static_cast<size_t>(s) * M + m) * Co + n];
    }
    out[idx] = from_float<T>(apply_activation(v, act));
  }
}

// NCHW -> NHWC copy of 16-bit elements (fp16/bf16 as raw bits) for the igemm path of NCHW
// callers: x viewed as [B, C, P = H*W] -> [B, P, C]. A 32 x 32 tile goes through shared memory
// so that both the reads (along P) and the writes (along C) are coalesced; the +1 column of
// padding keeps the transposed shared-memory reads free of bank conflicts.
__device__ __forceinline__ void transpose_nchw_to_nhwc(const uint16_t* __restrict__ in, uint16_t* __restrict__ out,
                                                       int C, int P) {
  __shared__ uint16_t tile[32][33];
  const int b = blockIdx.z;
  const int p0 = blockIdx.x * 32, c0 = blockIdx.y * 32;
  const uint16_t* src = in + static_cast<size_t>(b) * C * P;
  uint16_t* dst = out + static_cast<size_t>(b) * C * P;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int c = c0 + r, p = p0 + threadIdx.x;
    if (c < C && p < P) tile[r][threadIdx.x] = src[static_cast<size_t>(c) * P + p];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int p = p0 + r, c = c0 + threadIdx.x;
    if (c < C && p < P) dst[static_cast<size_t>(p) * C + c] = tile[threadIdx.x][r];
  }
}

}  // namespace conv
}  // namespace cuops

#define CUOPS_DEFINE_CONV_IGEMM(NAME, T, BITS, OUT_NCHW)                                                    \
  extern "C" __global__ void __launch_bounds__(cuops::conv::THREADS)                                        \
      NAME(const T* x, const uint8_t* qweight, const float* scale, const float* offset, const T* bias, T* out, \
           float* workspace, CUOPS_CONV_INT_ARGS, int kt_per_split) {                                       \
    cuops::conv::conv_igemm<T, BITS, OUT_NCHW>(x, qweight, scale, offset, bias, out, workspace,             \
                                               CUOPS_CONV_DIMS, kt_per_split);                              \
  }

#define CUOPS_DEFINE_SPLITK_REDUCE(NAME, T, OUT_NCHW)                                                 \
  extern "C" __global__ void __launch_bounds__(256)                                                   \
      NAME(const float* workspace, const T* bias, T* out, int M, int Co, int OhOw, int splits, int act) { \
    cuops::conv::conv_splitk_reduce<T, OUT_NCHW>(workspace, bias, out, M, Co, OhOw, splits, act);     \
  }

#if CUOPS_CONV_WANT(2, 4)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_f16_w4_nhwc, __half, 4, false)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_f16_w4_nchw, __half, 4, true)
#endif
#if CUOPS_CONV_WANT(2, 8)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_f16_w8_nhwc, __half, 8, false)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_f16_w8_nchw, __half, 8, true)
#endif
#if CUOPS_CONV_WANT(3, 4)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_bf16_w4_nhwc, __nv_bfloat16, 4, false)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_bf16_w4_nchw, __nv_bfloat16, 4, true)
#endif
#if CUOPS_CONV_WANT(3, 8)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_bf16_w8_nhwc, __nv_bfloat16, 8, false)
CUOPS_DEFINE_CONV_IGEMM(conv_igemm_bf16_w8_nchw, __nv_bfloat16, 8, true)
#endif
#if CUOPS_CONV_T != 1
// Grid (ceil(P / 32), ceil(C / 32), B), block (32, 8).
extern "C" __global__ void __launch_bounds__(256)
    conv_nchw_to_nhwc_b16(const uint16_t* x, uint16_t* x_nhwc, int C, int P) {
  cuops::conv::transpose_nchw_to_nhwc(x, x_nhwc, C, P);
}
#endif
#if CUOPS_CONV_WANT(2, 4) || CUOPS_CONV_WANT(2, 8)
CUOPS_DEFINE_SPLITK_REDUCE(conv_splitk_reduce_f16_nhwc, __half, false)
CUOPS_DEFINE_SPLITK_REDUCE(conv_splitk_reduce_f16_nchw, __half, true)
#endif
#if CUOPS_CONV_WANT(3, 4) || CUOPS_CONV_WANT(3, 8)
CUOPS_DEFINE_SPLITK_REDUCE(conv_splitk_reduce_bf16_nhwc, __nv_bfloat16, false)
CUOPS_DEFINE_SPLITK_REDUCE(conv_splitk_reduce_bf16_nchw, __nv_bfloat16, true)
#endif
