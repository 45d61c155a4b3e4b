// Per-token symmetric int8 quantization of activations: the CUDA body of
// cutlass_ops.torch_ops.quantize_per_token (QuantLinear mode "w8a8_channel"). For each row m of
// x [M, K] (fp32/fp16/bf16):
//   s[m]      = amax_k |x[m, k]| / 127               float32; a row whose s is 0 gets s = 1
//   A_q[m, k] = clamp(rint(x[m, k] / s[m]), -127, 127)   rint: half to even, as torch.round; int8
// Bit for bit the torch ops of quantize_per_token_reference on the CPU: x widens to float32 exactly,
// |x| and the max are exact (so the reduction order does not matter), and each division is one IEEE
// __fdiv_rn. (torch's CUDA `amax / 127.0` multiplies by float(1/127) instead - ATen's CPU-scalar
// shortcut - and so differs from the CPU, and from this kernel, by 1 ulp of s on a few % of rows.)
// NaN / Inf as torch: the max is taken on the bit patterns of |x| (for non-negative floats unsigned
// order is float order, and every NaN lies above +Inf), so it propagates NaN as torch.amax does: a row
// holding a NaN gets s = NaN, one holding an Inf (no NaN) s = +Inf. x / s is then NaN or 0, and a NaN
// converts to int through cvt.rzi.s32.f32, the instruction torch's float -> int8 cast compiles to
// (0 on NVIDIA GPUs), after a clamp that, like torch's, lets it through.
//
// Launch: blockDim = 256 (8 warps); W = warps_per_row in {1, 2, 4, 8} warps share a row, a block takes
// 8 / W rows at a time and strides over row groups (grid = min(ceil(M / (8 / W)), a per-device cap)).
// x rows start lda elements apart (last dimension contiguous); A_q is [M, K] contiguous; s is [M].
// A row is read twice (its max, then its quantization; the second read mostly hits L1). Loads are
// 16 bytes where the row allows: a scalar head up to the row's first 16-byte boundary, whole vectors,
// a scalar tail (under 2 * 8 scalars, one per thread); a vector's int8 results go out as one 4- or
// 8-byte store where A_q's address allows (always for a contiguous x with K a multiple of 8).
#include "common.cuh"

namespace cuops {
namespace quant_token {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The 16 bytes of one vector load as the floats of its N elements (each widening is exact).
template <typename T> struct Vec16;
template <> struct Vec16<float> {
  static constexpr int N = 4;
  static __device__ __forceinline__ void unpack(const uint4& u, float (&f)[N]) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  }
};
template <> struct Vec16<__half> {
  static constexpr int N = 8;
  static __device__ __forceinline__ void unpack(const uint4& u, float (&f)[N]) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // element 2i is the low half of word i (little endian)
      f[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xffffu)));
      f[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
    }
  }
};
template <> struct Vec16<__nv_bfloat16> {
  static constexpr int N = 8;
  static __device__ __forceinline__ void unpack(const uint4& u, float (&f)[N]) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(w[i] & 0xffffu)));
      f[2 * i + 1] = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(w[i] >> 16)));
    }
  }
};

// |v| as its bit pattern: an unsigned max of these is the exact amax, NaN-propagating (fmaxf would drop NaN).
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// torch's A_q of one element: round(x / s), clamp to [-127, 127], cast to int8. __float2int_rz is
// cvt.rzi.s32.f32, torch's cast: exact on the integer rint gives, saturating past int32 and 0 for NaN,
// so clamping the int afterwards is torch's float clamp (which passes NaN) before its cast.
__device__ __forceinline__ int quantize(float v, float s) {
  return min(max(__float2int_rz(rintf(__fdiv_rn(v, s))), -127), 127);
}

// A row of K elements at p: scalars [0, head) up to p's first 16-byte boundary, nvec whole vectors
// from head, scalars [tail, K). Fewer than 2 N scalars in all: thread t of the row takes scalar(t).
template <typename T>
struct RowSplit {
  static constexpr int N = Vec16<T>::N;
  int head, nvec, tail;

  __device__ __forceinline__ RowSplit(const T* p, int K) {
    const int misaligned = static_cast<int>((reinterpret_cast<unsigned long long>(p) & 15ull) / sizeof(T));
    head = misaligned ? min(K, N - misaligned) : 0;
    nvec = (K - head) / N;
    tail = head + nvec * N;
  }
  // the scalar element of thread t of the row, or -1
  __device__ __forceinline__ int scalar(int t, int K) const {
    if (t < head) return t;
    const int k = tail + (t - head);
    return k < K ? k : -1;
  }
};

// The vector's N int8 results, packed little endian in N / 4 words, stored at q: whole words when
// packed (q N-byte aligned), else byte by byte.
template <int N>
__device__ __forceinline__ void store_q(int8_t* q, const unsigned (&word)[N / 4], bool packed) {
  if (packed) {
    if constexpr (N == 4) {
      *reinterpret_cast<unsigned*>(q) = word[0];
    } else {
      *reinterpret_cast<uint2*>(q) = make_uint2(word[0], word[1]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) q[j] = static_cast<int8_t>(word[j / 4] >> (8 * (j % 4)));
  }
}

template <typename T>
__device__ __forceinline__ void quant_token(const T* __restrict__ x, long long lda, int8_t* __restrict__ A_q,
                                            float* __restrict__ s_out, int M, int K, int warps_per_row) {
  constexpr int N = Vec16<T>::N;
  // per-warp maxima, two buffers by the parity of the row group: a warp writes one group's while a
  // slower warp may still read the previous group's (it cannot be two groups behind: the barrier)
  __shared__ unsigned s_amax[2][kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows_per_block = kWarps / warps_per_row;
  const int slot = warp / warps_per_row;                    // this warp's row of the group
  const int t = (warp - slot * warps_per_row) * 32 + lane;  // this thread's index in the row
  const int row_threads = warps_per_row * 32;
  const long long groups = (static_cast<long long>(M) + rows_per_block - 1) / rows_per_block;
  int parity = 0;
  // uniform per block: every warp runs every group (the last one's idle warps still meet the barrier)
  for (long long group = blockIdx.x; group < groups; group += gridDim.x, parity ^= 1) {
    const long long m = group * rows_per_block + slot;
    const bool active = m < M;  // uniform per warp
    const T* xr = x + (active ? m : 0) * lda;
    int8_t* qr = A_q + (active ? m : 0) * K;
    const RowSplit<T> split(xr, K);
    const int ks = active ? split.scalar(t, K) : -1;
    const int nvec = active ? split.nvec : 0;
    const uint4* xv = reinterpret_cast<const uint4*>(xr + split.head);

    unsigned amax = ks >= 0 ? abs_bits(to_float<T>(xr[ks])) : 0u;
    for (int i = t; i < nvec; i += row_threads) {
      float f[N];
      Vec16<T>::unpack(xv[i], f);
#pragma unroll
      for (int j = 0; j < N; ++j) amax = max(amax, abs_bits(f[j]));
    }
    amax = warp_max(amax);
    if (warps_per_row > 1) {  // a kernel argument: uniform over the block
      if (lane == 0) s_amax[parity][warp] = amax;
      __syncthreads();
      for (int w = slot * warps_per_row; w < (slot + 1) * warps_per_row; ++w) amax = max(amax, s_amax[parity][w]);
    }
    if (!active) continue;

    float s = __fdiv_rn(__uint_as_float(amax), 127.0f);
    if (s == 0.0f) s = 1.0f;  // an all-zero row (or an amax / 127 that underflows)
    if (t == 0) s_out[m] = s;

    if (ks >= 0) qr[ks] = static_cast<int8_t>(quantize(to_float<T>(xr[ks]), s));
    int8_t* qv = qr + split.head;
    const bool packed = (reinterpret_cast<unsigned long long>(qv) & (N - 1)) == 0;
    for (int i = t; i < nvec; i += row_threads) {
      float f[N];
      Vec16<T>::unpack(xv[i], f);
      unsigned word[N / 4] = {};
#pragma unroll
      for (int j = 0; j < N; ++j) word[j / 4] |= (static_cast<unsigned>(quantize(f[j], s)) & 0xffu) << (8 * (j % 4));
      store_q<N>(qv + i * N, word, packed);
    }
  }
}

}  // namespace quant_token
}  // namespace cuops

#define CUOPS_DEFINE_QUANT_TOKEN(NAME, T)                                                               \
  extern "C" __global__ void __launch_bounds__(256)                                                     \
      NAME(const T* x, long long lda, int8_t* A_q, float* s, int M, int K, int warps_per_row) {         \
    cuops::quant_token::quant_token<T>(x, lda, A_q, s, M, K, warps_per_row);                            \
  }

CUOPS_DEFINE_QUANT_TOKEN(quant_token_f32, float)
CUOPS_DEFINE_QUANT_TOKEN(quant_token_f16, __half)
CUOPS_DEFINE_QUANT_TOKEN(quant_token_bf16, __nv_bfloat16)
