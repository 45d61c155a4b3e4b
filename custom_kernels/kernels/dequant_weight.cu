// Full dequantization of a QuantizedWeight to a dense W[N, K] of the activation type, for the
// large-M path "dequant_cublas" (dequantize, then one cuBLAS GEMM; llama.cpp / TensorRT-LLM prefill):
//   W[n, k] = q[n, k] * scale[n, g] + offset[n, g],   g = k / block_size,
// computed in fp32 (one fma) and rounded once to the element type.
//
// The weight is streamed as one flat array: W [N, K], qweight and scale/offset [N, G] are all
// contiguous and K = G * block_size, so flat element e = n * K + k belongs to flat group
// e / block_size = n * G + k / block_size. Rows need no special treatment, and a 16-byte chunk may
// straddle two rows when the row length is no multiple of 16 bytes.
//
// Bandwidth-bound: every weight byte is read once with a 16-byte load (L1 bypassed, L2 evict-first
// so that W, which the GEMM reads next, keeps the L2), every output byte written once with
// 16-byte stores. A warp converts 512 bytes of weights (one "tile": 16 bytes per lane) into
// 32 * kVecs 16-byte output vectors; lane l owns the consecutive vectors kVecs*l .. kVecs*l + kVecs-1,
// so the vectors go through shared memory to make each warp store instruction write 512
// contiguous bytes.
//
// Compile-time choice (NVRTC defines): WO_ELEMENT 0 = half, 1 = bfloat16, 2 = float (W's type),
// WO_BITS 4 (interleaved int4, u = q + 8) or 8 (int8).
//
// Entry point: dequant_weight(B, scale, offset, W, total_words, block_size, block_shift, chunk_uniform)
//   total_words  = N * K * WO_BITS / 32 (32-bit words of qweight)
//   block_shift  = log2(block_size) when block_size is a power of two, else -1 (integer division)
//   chunk_uniform = 1 when block_size is a multiple of a 16-byte chunk's element count (32 int4,
//                   16 int8): one (scale, offset) per chunk; else one per 32-bit word (block_size
//                   must then be a multiple of the word's element count, 8 int4 or 4 int8).
#include "common.cuh"
#include "converters.cuh"
#include "stream_loads.cuh"

#include "weight_only_types.cuh"

namespace cuops {
namespace dequant {

constexpr int kWarps = 8;           // warps per block (the host launches 32 * kWarps threads)
constexpr int kMinBlocks = 2;       // blocks per SM the launch bounds promise (<= 128 registers; the host
                                    // launches kMinBlocks blocks per SM: weight_only.dequant_cublas.BLOCKS_PER_SM)
constexpr int kTilesInFlight = 4;   // 16-byte weight loads per thread issued before any conversion
constexpr int kWordsPerTile = 128;  // 32 lanes x one 16-byte chunk (4 words)


// Flat group index of flat element e: a shift for power-of-two block sizes, else a division.
__device__ __forceinline__ int64_t group_of(int64_t e, int block_size, int block_shift) {
  return block_shift >= 0 ? (e >> block_shift) : e / block_size;
}

// Two floats rounded (to nearest even) into one 32-bit word of the output type; float takes one word each.
template <typename T> struct OutWords;
template <> struct OutWords<__half> {
  static constexpr int kPerElement2 = 1;  // 32-bit output words per 2 elements
  static __device__ __forceinline__ void put(uint32_t* out, float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    out[0] = *reinterpret_cast<uint32_t*>(&h);
  }
};
template <> struct OutWords<__nv_bfloat16> {
  static constexpr int kPerElement2 = 1;
  static __device__ __forceinline__ void put(uint32_t* out, float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    out[0] = *reinterpret_cast<uint32_t*>(&h);
  }
};
template <> struct OutWords<float> {
  static constexpr int kPerElement2 = 2;
  static __device__ __forceinline__ void put(uint32_t* out, float a, float b) {
    out[0] = __float_as_uint(a);
    out[1] = __float_as_uint(b);
  }
};

// Shared-memory slot of logical vector v of a warp's staging buffer. Lanes write v = kVecs*lane + j
// and read v = 32*j + lane; XOR-ing the low 3 bits (the 16-byte slot within a 128-byte row of the 32
// banks) with bits 3..5 puts the 8 lanes of each quarter-warp on 8 different slots for both
// patterns (kVecs = 2, 4, 8), i.e. no bank conflicts. It permutes within aligned groups of 8.
__device__ __forceinline__ int stage_slot(int v) { return v ^ ((v >> 3) & 7); }

// Full tiles: each warp takes kTilesInFlight tiles per trip, spaced a grid's worth of warps apart.
// kUniform: one (scale, offset) per 16-byte chunk, else one per 32-bit word.
template <typename T, int kBits, bool kUniform, int kVecs>
__device__ __forceinline__ void dequant_tiles(const uint4* __restrict__ B16, const float* __restrict__ scale,
                                              const float* __restrict__ offset, uint4* __restrict__ W16,
                                              int full_tiles, int block_size, int block_shift,
                                              uint4 (&stage)[kWarps][32 * kVecs]) {
  constexpr int kWordElems = 32 / kBits;                                // K elements per 32-bit weight word: 8 or 4
  constexpr int kWordOut = kWordElems / 2 * OutWords<T>::kPerElement2;  // output 32-bit words per weight word
  static_assert(kVecs == kWordOut, "16-byte output vectors per lane per tile: 4 weight words -> 4 * kWordOut / 4");
  constexpr int kGroups = kUniform ? 1 : 4;  // (scale, offset) pairs per chunk

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps_total = gridDim.x * kWarps;
  const uint64_t policy = evict_first_policy();  // the freshly written W (read by the GEMM next) stays in L2

  for (int t0 = blockIdx.x * kWarps + warp; t0 < full_tiles; t0 += warps_total * kTilesInFlight) {
    uint4 wq[kTilesInFlight];
    float s[kTilesInFlight][kGroups], o[kTilesInFlight][kGroups];
    // All loads of this trip first (weights and their scales/offsets), then the conversions.
#pragma unroll
    for (int u = 0; u < kTilesInFlight; ++u) {
      const int tile = t0 + u * warps_total;
      if (tile < full_tiles) {
        const int chunk = tile * 32 + lane;
        wq[u] = load_stream_16B_hint(B16 + chunk, policy);
        const int64_t e0 = static_cast<int64_t>(chunk) * (4 * kWordElems);  // first flat element of the chunk
#pragma unroll
        for (int w = 0; w < kGroups; ++w) {
          const int64_t g = group_of(e0 + w * kWordElems, block_size, block_shift);
          s[u][w] = __ldg(scale + g);
          o[u][w] = __ldg(offset + g);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kTilesInFlight; ++u) {
      const int tile = t0 + u * warps_total;
      if (tile >= full_tiles) break;  // warp-uniform
      uint32_t out[4 * kWordOut];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float sw = s[u][kUniform ? 0 : w], ow = o[u][kUniform ? 0 : w];
        float q[kWordElems];
        word_to_floats<kBits>(word_of(wq[u], w), q);
#pragma unroll
        for (int p = 0; p < kWordElems / 2; ++p)
          OutWords<T>::put(out + w * kWordOut + p * OutWords<T>::kPerElement2, fmaf(q[2 * p], sw, ow),
                           fmaf(q[2 * p + 1], sw, ow));
      }
#pragma unroll
      for (int j = 0; j < kVecs; ++j)
        stage[warp][stage_slot(kVecs * lane + j)] =
            make_uint4(out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3]);
      __syncwarp();
      // The tile's output is 32 * kVecs consecutive vectors: instruction j writes 512 contiguous bytes.
      uint4* dst = W16 + static_cast<int64_t>(tile) * (32 * kVecs);
#pragma unroll
      for (int j = 0; j < kVecs; ++j) dst[32 * j + lane] = stage[warp][stage_slot(32 * j + lane)];
      __syncwarp();  // the next tile overwrites the buffer
    }
  }
}

// The last total_words % 128 words: one word per thread, scalar stores.
template <typename T, int kBits>
__device__ __forceinline__ void dequant_tail(const uint32_t* __restrict__ B32, const float* __restrict__ scale,
                                             const float* __restrict__ offset, T* __restrict__ W, int64_t begin,
                                             int64_t total_words, int block_size, int block_shift) {
  constexpr int kWordElems = 32 / kBits;
  for (int64_t word = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; word < total_words;
       word += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e0 = word * kWordElems;
    const int64_t g = group_of(e0, block_size, block_shift);
    const float sw = __ldg(scale + g), ow = __ldg(offset + g);
    float q[kWordElems];
    word_to_floats<kBits>(__ldg(B32 + word), q);
#pragma unroll
    for (int i = 0; i < kWordElems; ++i) W[e0 + i] = from_float<T>(fmaf(q[i], sw, ow));
  }
}

}  // namespace dequant
}  // namespace cuops

using namespace cuops::dequant;

// The staging buffer takes 8 to 32 KiB of shared memory per block.
// total_words / 128 * 32 (the chunk count) must fit an int (the host checks).
extern "C" __global__ void __launch_bounds__(32 * kWarps, kMinBlocks)
    dequant_weight(const uint8_t* B, const float* scale, const float* offset, element_t* W, int64_t total_words,
                   int block_size, int block_shift, int chunk_uniform) {
  constexpr int kVecs = (32 / WO_BITS) / 2 * OutWords<element_t>::kPerElement2;  // see dequant_tiles
  __shared__ uint4 stage[kWarps][32 * kVecs];
  const int full_tiles = static_cast<int>(total_words / kWordsPerTile);
  const uint4* B16 = reinterpret_cast<const uint4*>(B);
  uint4* W16 = reinterpret_cast<uint4*>(W);
  if (chunk_uniform) {
    dequant_tiles<element_t, WO_BITS, true, kVecs>(B16, scale, offset, W16, full_tiles, block_size, block_shift,
                                                   stage);
  } else {
    dequant_tiles<element_t, WO_BITS, false, kVecs>(B16, scale, offset, W16, full_tiles, block_size, block_shift,
                                                    stage);
  }
  dequant_tail<element_t, WO_BITS>(reinterpret_cast<const uint32_t*>(B), scale, offset, W,
                                   static_cast<int64_t>(full_tiles) * kWordsPerTile, total_words, block_size,
                                   block_shift);
}
