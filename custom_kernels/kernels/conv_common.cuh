// Shared by the conv strategies (conv_direct.cu, conv_igemm.cu): the weight layout, the problem
// dimensions, the kernels' common argument list and the per-module (dtype, bits) selection.
//
// FP x INT4 / FP x INT8 2-D convolution with a block-quantized weight (the documents'
// CONV_FpAInt4B, generalized). Grouped as torch.nn.functional.conv2d: x has Ci channels, the
// weight Cg = Ci / groups per output channel, and output channel co reads input channels
// [g * Cg, (g + 1) * Cg) with g = co / (Co / groups). Weight as stored by cutlass_ops.formats:
// [Co, Kh, Kw, Cg] flattened to [N = Co, K = Kh*Kw*Cg]; int8 rows of K bytes, or int4 rows of
// ceil(K/8)*4 bytes (padded to whole words with q = 0, never read) in the interleaved nibble order
// (per 32-bit word of 8 K elements, nibble i holds element [0,2,4,6,1,3,5,7][i], stored u = q + 8);
// scale/offset float32 [Co, K/block_size], blocks along K; w = q * scale + offset.
#pragma once

#include "common.cuh"

namespace cuops {
namespace conv {

struct ConvDims {
  int batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, sh, sw, ph, pw, dh, dw, block_size, act, groups;
};

// Bytes of one stored weight row of K elements: int4 rows are padded to whole 32-bit words.
template <int BITS>
__device__ __forceinline__ size_t row_bytes(int K) {
  return BITS == 8 ? static_cast<size_t>(K) : static_cast<size_t>((K + 7) / 8) * 4;
}

// q of weight element k of one output channel's row (bytes of that row in `row`).
template <int BITS>
__device__ __forceinline__ int load_q(const uint8_t* __restrict__ row, int k) {
  if (BITS == 8) return static_cast<int>(reinterpret_cast<const int8_t*>(row)[k]);
  // Interleaved int4: element j of a word sits in nibble (j >> 1) | ((j & 1) << 2)
  // (the inverse of [0,2,4,6,1,3,5,7]); nibble n is in byte n / 2, high half when n is odd.
  const int j = k & 7;
  const int nib = (j >> 1) | ((j & 1) << 2);
  const uint8_t byte = row[((k >> 3) << 2) + (nib >> 1)];
  const int u = (nib & 1) ? (byte >> 4) : (byte & 15);
  return u - 8;
}

}  // namespace conv
}  // namespace cuops

// ---------------------------------------------------------------------------------------------
// extern "C" entry points. Argument order (all strategies):
//   pointers x, qweight, scale, offset, bias (nullable), out
//   ints batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
//        block_size, act, groups   (Ci: all input channels of x; the weight has Ci / groups)
// conv_igemm_* add `workspace` after `out` and `kt_per_split` at the end.
// ---------------------------------------------------------------------------------------------
#define CUOPS_CONV_INT_ARGS                                                                       \
  int batch, int H, int W, int Ci, int Oh, int Ow, int Co, int Kh, int Kw, int sh, int sw, int ph, \
      int pw, int dh, int dw, int block_size, int act, int groups
#define CUOPS_CONV_DIMS \
  cuops::conv::ConvDims { batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, sh, sw, ph, pw, dh, dw, block_size, act, groups }

// One module per (element type, weight bits) keeps each NVRTC build small: the host passes
// CUOPS_CONV_T (1 = fp32, 2 = fp16, 3 = bf16) and CUOPS_CONV_BITS (4 or 8); without them
// (plain nvcc, the compile tests) every combination is built.
#ifndef CUOPS_CONV_T
#define CUOPS_CONV_T 0  // 0: all element types
#endif
#ifndef CUOPS_CONV_BITS
#define CUOPS_CONV_BITS 0  // 0: both weight widths
#endif
#define CUOPS_CONV_WANT(T_CODE, BITS) \
  ((CUOPS_CONV_T == 0 || CUOPS_CONV_T == (T_CODE)) && (CUOPS_CONV_BITS == 0 || CUOPS_CONV_BITS == (BITS)))

