// Depthwise convolution (the conv strategy "depthwise"): groups == Ci, one input channel per output
// channel (Cg = 1), a channel multiplier m = Co / Ci allowed (output channel co reads input channel
// co / m), any Kh x Kw, stride, padding and dilation; fp32 / fp16 / bf16, int4 / int8 weight rows of
// K = Kh*Kw taps, fp32 accumulation. Weight layout and argument order: conv_common.cuh (no extra
// argument: the launch shape carries the rest). Each NVRTC build takes one (dtype, bits) slice.
//
// Why not conv_direct.cu: a depthwise layer reads x once and writes y once, about 2 bytes (fp16) per
// Kh*Kw FMAs, so it is bound by memory and by instruction issue; the direct kernel dequantizes every
// tap of every output (byte load, nibble decode, scale / offset loads) and reads x per tap.
//
// Design:
// - Each block dequantizes its channel slice's weights into shared memory once, as floats (then loops
//   over several output tiles, grid-stride, so that staging is paid once per resident block):
//   NHWC [taps][CB channels] (a thread reads its V channels of one tap as one vector), NCHW
//   [TY planes][taps] (a warp reads one address: a broadcast).
// - NHWC (channels_last): threadIdx.x walks channel vectors of V = 4 / 2 / 1 channels (coalesced
//   8- or 16-byte loads), threadIdx.y walks strips of TW = 4 consecutive outputs along Ow of one
//   output row. Generic path: per (kh, kw) one weight vector from shared memory feeds the TW outputs,
//   x comes from L1 (the Kh / Kw reuse). Window path (stride 1, dilation 1 along W, Kw = 3, 5, 7 at
//   compile time): per kh the TW + Kw - 1 input columns are loaded and converted once into registers
//   and the Kw weight vectors once, then TW * Kw FMAs per channel run from registers.
// - NCHW: threadIdx.x walks output pixels of one (image, channel) plane (flattened oy * Ow + ox, so
//   lanes read consecutive x along W, and tiny planes do not leave lanes idle per row), TW pixels per
//   thread, blockDim.x apart; threadIdx.y walks planes. Weights of the plane are broadcast from
//   shared memory.
// - 32-bit index math throughout: the host refuses x and y of 2^31 elements or more
//   (cutlass_ops.conv.depthwise.depthwise_unsupported), so every element offset fits an int.
// - Shared memory: NHWC CB * Kh*Kw * 4 bytes (CB = blockDim.x * V), NCHW blockDim.y * Kh*Kw * 4; the
//   host keeps both within 48 KiB (no opt-in needed).
#include "conv_common.cuh"

namespace cuops {
namespace conv {
namespace depthwise {

constexpr int TW = 4;  // outputs per thread: a strip along Ow (NHWC) or pixels blockDim.x apart (NCHW)

// V elements in one aligned aggregate: a load or store of it is one 2/4/8/16-byte instruction.
template <typename E, int V>
struct alignas(sizeof(E) * V) Vec {
  E v[V];
};

// V consecutive activations at p (aligned to V elements) as floats.
template <typename T, int V>
__device__ __forceinline__ void load_floats(float (&f)[V], const T* __restrict__ p) {
  const Vec<T, V> r = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) f[i] = to_float<T>(r.v[i]);
}

// V consecutive staged weights (shared memory, aligned to V floats).
template <int V>
__device__ __forceinline__ void load_weights(float (&w)[V], const float* p) {
  const Vec<float, V> r = *reinterpret_cast<const Vec<float, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) w[i] = r.v[i];
}

// The block's staged weights. 16-byte alignment: the NHWC path reads 4 floats per instruction.
__device__ __forceinline__ float* staged_weights() {
  extern __shared__ __align__(16) float cuops_depthwise_smem[];
  return cuops_depthwise_smem;
}

// w = q * scale + offset of tap k (of K = Kh*Kw) of output channel co: a depthwise row holds exactly
// one channel's taps in (kh, kw) order, so the row element is the tap. Traced for int4, K = 9: rows of
// (9 + 7) / 8 * 4 = 8 bytes; tap 5 -> word 0, j = 5, nibble 2 | 4 = 6, byte 3, low half (nibble 6 holds
// element [0,2,4,6,1,3,5,7][6] = 5); tap 8 -> word 1, j = 0, nibble 0, byte 4, low half.
template <int BITS>
__device__ __forceinline__ float dequantized_tap(const uint8_t* __restrict__ qweight, const float* __restrict__ scale,
                                                 const float* __restrict__ offset, int co, int k, int K,
                                                 int block_size) {
  const uint8_t* row = qweight + static_cast<size_t>(co) * row_bytes<BITS>(K);
  const int g = co * (K / block_size) + k / block_size;  // < Co * K: the scale tensor's size
  return fmaf(static_cast<float>(load_q<BITS>(row, k)), scale[g], offset[g]);
}

// ---------------------------------------------------------------------------------------------
// NHWC: thread = V channels x TW outputs along Ow; block = (CT channel vectors, ST strips).
// grid.y = channel slices of CB = CT * V channels, grid.x = strip blocks (grid-stride).
// V > 1 needs m == 1, Ci % V == 0 and x / out aligned to V elements (the host's choice).
// KW > 0: the register-window path, only for Kw == KW, sw == 1, dw == 1 (the host's choice).
// ---------------------------------------------------------------------------------------------
template <typename T, int BITS, int V, int KW>
__device__ __forceinline__ void depthwise_nhwc(const T* __restrict__ x, const uint8_t* __restrict__ qweight,
                                               const float* __restrict__ scale, const float* __restrict__ offset,
                                               const T* __restrict__ bias, T* __restrict__ out, const ConvDims d) {
  float* w_s = staged_weights();
  const int taps = d.Kh * d.Kw;  // = K (Cg = 1)
  const int CB = blockDim.x * V;
  const int co_lo = blockIdx.y * CB;
  {
    // Consecutive threads take consecutive channels of one tap: the shared stores hit consecutive banks
    // (the tap-major order would put a warp's stores CB floats apart, all in one bank when CB % 32 == 0).
    const int n = CB * taps;
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < n; i += blockDim.x * blockDim.y) {
      const int k = i / CB, c = i - k * CB;
      const int co = co_lo + c;
      w_s[i] = co < d.Co ? dequantized_tap<BITS>(qweight, scale, offset, co, k, taps, d.block_size) : 0.0f;
    }
  }
  __syncthreads();  // the last barrier: threads past Co may leave now
  const int co0 = co_lo + threadIdx.x * V;
  if (co0 >= d.Co) return;
  const int ci0 = co0 / (d.Co / d.groups);  // input channel of co0 (V > 1 only with m = 1: ci0 = co0)
  const float* wt = w_s + threadIdx.x * V;  // this thread's channels of tap 0; tap k at wt + k * CB

  float bv[V];
#pragma unroll
  for (int v = 0; v < V; ++v) bv[v] = bias != nullptr ? to_float<T>(bias[co0 + v]) : 0.0f;

  const int row = d.W * d.Ci;  // elements of one input row
  const int spr = UP_DIV(d.Ow, TW);  // strips per output row
  const int strips = d.batch * d.Oh * spr;
  for (int s = blockIdx.x * blockDim.y + threadIdx.y; s < strips; s += gridDim.x * blockDim.y) {
    const int r = s / spr;
    const int ox0 = (s - r * spr) * TW;
    const int oy = r % d.Oh, b = r / d.Oh;
    const int nt = min(TW, d.Ow - ox0);  // outputs of this strip (the row's last one may be short)
    const T* xb = x + b * d.H * row + ci0;
    float acc[TW][V];
#pragma unroll
    for (int t = 0; t < TW; ++t)
#pragma unroll
      for (int v = 0; v < V; ++v) acc[t][v] = 0.0f;

    for (int kh = 0; kh < d.Kh; ++kh) {
      const int iy = oy * d.sh - d.ph + kh * d.dh;
      // One unsigned compare tests 0 <= iy < H (a negative iy wraps past H).
      if (static_cast<unsigned>(iy) >= static_cast<unsigned>(d.H)) continue;
      const T* xr = xb + iy * row;
      if constexpr (KW > 0) {
        // Output ox0 + t, tap kw reads column ox0 - pw + t + kw: the strip's TW * KW taps read only
        // TW + KW - 1 columns, each loaded and converted once. Out-of-image columns are the zero padding.
        const int ix0 = ox0 - d.pw;
        float xw[TW + KW - 1][V];
#pragma unroll
        for (int c = 0; c < TW + KW - 1; ++c) {
          const int ix = ix0 + c;
          if (c < nt + KW - 1 && static_cast<unsigned>(ix) < static_cast<unsigned>(d.W)) {
            load_floats<T, V>(xw[c], xr + ix * d.Ci);
          } else {
#pragma unroll
            for (int v = 0; v < V; ++v) xw[c][v] = 0.0f;
          }
        }
        const float* wk = wt + kh * KW * CB;
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          float w[V];
          load_weights<V>(w, wk + kw * CB);
#pragma unroll
          for (int t = 0; t < TW; ++t)
#pragma unroll
            for (int v = 0; v < V; ++v) acc[t][v] = fmaf(xw[t + kw][v], w[v], acc[t][v]);
        }
      } else {
        const float* wk = wt + kh * d.Kw * CB;
        for (int kw = 0; kw < d.Kw; ++kw) {
          float w[V];
          load_weights<V>(w, wk + kw * CB);  // one weight vector feeds the strip's TW outputs
          const int ixk = ox0 * d.sw - d.pw + kw * d.dw;
#pragma unroll
          for (int t = 0; t < TW; ++t) {
            const int ix = ixk + t * d.sw;
            if (t < nt && static_cast<unsigned>(ix) < static_cast<unsigned>(d.W)) {
              float xv[V];
              load_floats<T, V>(xv, xr + ix * d.Ci);
#pragma unroll
              for (int v = 0; v < V; ++v) acc[t][v] = fmaf(xv[v], w[v], acc[t][v]);
            }
          }
        }
      }
    }

    T* yp = out + ((b * d.Oh + oy) * d.Ow + ox0) * d.Co + co0;
#pragma unroll
    for (int t = 0; t < TW; ++t) {
      if (t < nt) {
        Vec<T, V> y;
#pragma unroll
        for (int v = 0; v < V; ++v) y.v[v] = from_float<T>(apply_activation(acc[t][v] + bv[v], d.act));
        *reinterpret_cast<Vec<T, V>*>(yp + t * d.Co) = y;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// NCHW: thread = TW output pixels of one plane, blockDim.x apart; block = (TX pixels, TY planes).
// grid.x = plane groups of TY planes (plane = b * Co + co), grid.y = pixel chunks (grid-stride).
// ---------------------------------------------------------------------------------------------
template <typename T, int BITS>
__device__ __forceinline__ void depthwise_nchw(const T* __restrict__ x, const uint8_t* __restrict__ qweight,
                                               const float* __restrict__ scale, const float* __restrict__ offset,
                                               const T* __restrict__ bias, T* __restrict__ out, const ConvDims d) {
  float* w_s = staged_weights();
  const int taps = d.Kh * d.Kw;
  const int planes = d.batch * d.Co;
  const int pl0 = blockIdx.x * blockDim.y;
  {
    const int n = blockDim.y * taps;
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < n; i += blockDim.x * blockDim.y) {
      const int c = i / taps, k = i - c * taps;
      const int pl = pl0 + c;
      w_s[i] = pl < planes ? dequantized_tap<BITS>(qweight, scale, offset, pl % d.Co, k, taps, d.block_size) : 0.0f;
    }
  }
  __syncthreads();  // the last barrier: threads past the last plane may leave now
  const int pl = pl0 + threadIdx.y;
  if (pl >= planes) return;
  const int co = pl % d.Co, b = pl / d.Co;
  const int ci = co / (d.Co / d.groups);
  const T* xp = x + (b * d.Ci + ci) * d.H * d.W;
  T* yp = out + pl * d.Oh * d.Ow;  // plane b * Co + co of the output
  const float* wp = w_s + threadIdx.y * taps;
  const float bv = bias != nullptr ? to_float<T>(bias[co]) : 0.0f;

  const int P = d.Oh * d.Ow;
  const int chunk = blockDim.x * TW;
  const int chunks = UP_DIV(P, chunk);
  for (int ch = blockIdx.y; ch < chunks; ch += gridDim.y) {
    const int p0 = ch * chunk + threadIdx.x;
    int iy0[TW], ix0[TW];
    bool ok[TW];
#pragma unroll
    for (int t = 0; t < TW; ++t) {
      const int p = p0 + t * blockDim.x;
      ok[t] = p < P;
      const int oy = p / d.Ow;
      iy0[t] = oy * d.sh - d.ph;
      ix0[t] = (p - oy * d.Ow) * d.sw - d.pw;
    }
    float acc[TW];
#pragma unroll
    for (int t = 0; t < TW; ++t) acc[t] = 0.0f;
    for (int kh = 0; kh < d.Kh; ++kh) {
      // Per kh, each pixel's row test and row offset, so the kw loop only adds a column.
      int roff[TW];
      bool rok[TW];
#pragma unroll
      for (int t = 0; t < TW; ++t) {
        const int iy = iy0[t] + kh * d.dh;
        rok[t] = ok[t] && static_cast<unsigned>(iy) < static_cast<unsigned>(d.H);  // unsigned: 0 <= iy < H
        roff[t] = iy * d.W + ix0[t];
      }
      const float* wk = wp + kh * d.Kw;
      for (int kw = 0; kw < d.Kw; ++kw) {
        const float w = wk[kw];  // the same address in every lane: a shared-memory broadcast
        const int kx = kw * d.dw;
#pragma unroll
        for (int t = 0; t < TW; ++t) {
          if (rok[t] && static_cast<unsigned>(ix0[t] + kx) < static_cast<unsigned>(d.W)) {
            acc[t] = fmaf(to_float<T>(xp[roff[t] + kx]), w, acc[t]);
          }
        }
      }
    }
#pragma unroll
    for (int t = 0; t < TW; ++t) {
      if (ok[t]) yp[p0 + t * blockDim.x] = from_float<T>(apply_activation(acc[t] + bv, d.act));
    }
  }
}

}  // namespace depthwise
}  // namespace conv
}  // namespace cuops

#define CUOPS_DEPTHWISE_PARAMS(T)                                                                         \
  const T* __restrict__ x, const uint8_t* __restrict__ qweight, const float* __restrict__ scale,          \
      const float* __restrict__ offset, const T* __restrict__ bias, T* __restrict__ out, CUOPS_CONV_INT_ARGS

#define CUOPS_DEFINE_DEPTHWISE_NHWC(NAME, T, BITS, V, KW)                                                 \
  extern "C" __global__ void __launch_bounds__(256) NAME(CUOPS_DEPTHWISE_PARAMS(T)) {                    \
    cuops::conv::depthwise::depthwise_nhwc<T, BITS, V, KW>(x, qweight, scale, offset, bias, out,          \
                                                           CUOPS_CONV_DIMS);                               \
  }
#define CUOPS_DEFINE_DEPTHWISE_NCHW(NAME, T, BITS)                                                        \
  extern "C" __global__ void __launch_bounds__(256) NAME(CUOPS_DEPTHWISE_PARAMS(T)) {                    \
    cuops::conv::depthwise::depthwise_nchw<T, BITS>(x, qweight, scale, offset, bias, out, CUOPS_CONV_DIMS); \
  }

// Entry points of one (dtype, bits): conv_depthwise_<t>_w<b>_nchw, conv_depthwise_<t>_w<b>_nhwc_v<V>
// (V = 1, 2, 4 channels per thread; any Kw, stride, dilation) and conv_depthwise_<t>_w<b>_nhwc_v4_k<KW>
// (the register window: Kw = KW, stride and dilation 1 along W).
#define CUOPS_DEFINE_DEPTHWISE(TAG, T, BITS)                                     \
  CUOPS_DEFINE_DEPTHWISE_NCHW(conv_depthwise_##TAG##_w##BITS##_nchw, T, BITS)     \
  CUOPS_DEFINE_DEPTHWISE_NHWC(conv_depthwise_##TAG##_w##BITS##_nhwc_v1, T, BITS, 1, 0) \
  CUOPS_DEFINE_DEPTHWISE_NHWC(conv_depthwise_##TAG##_w##BITS##_nhwc_v2, T, BITS, 2, 0) \
  CUOPS_DEFINE_DEPTHWISE_NHWC(conv_depthwise_##TAG##_w##BITS##_nhwc_v4, T, BITS, 4, 0) \
  CUOPS_DEFINE_DEPTHWISE_NHWC(conv_depthwise_##TAG##_w##BITS##_nhwc_v4_k3, T, BITS, 4, 3) \
  CUOPS_DEFINE_DEPTHWISE_NHWC(conv_depthwise_##TAG##_w##BITS##_nhwc_v4_k5, T, BITS, 4, 5) \
  CUOPS_DEFINE_DEPTHWISE_NHWC(conv_depthwise_##TAG##_w##BITS##_nhwc_v4_k7, T, BITS, 4, 7)

#if CUOPS_CONV_WANT(1, 4)
CUOPS_DEFINE_DEPTHWISE(f32, float, 4)
#endif
#if CUOPS_CONV_WANT(1, 8)
CUOPS_DEFINE_DEPTHWISE(f32, float, 8)
#endif
#if CUOPS_CONV_WANT(2, 4)
CUOPS_DEFINE_DEPTHWISE(f16, __half, 4)
#endif
#if CUOPS_CONV_WANT(2, 8)
CUOPS_DEFINE_DEPTHWISE(f16, __half, 8)
#endif
#if CUOPS_CONV_WANT(3, 4)
CUOPS_DEFINE_DEPTHWISE(bf16, __nv_bfloat16, 4)
#endif
#if CUOPS_CONV_WANT(3, 8)
CUOPS_DEFINE_DEPTHWISE(bf16, __nv_bfloat16, 8)
#endif
